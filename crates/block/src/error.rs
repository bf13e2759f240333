//! What the block layer reports as damage, as a kind of
//! [`foliofs_vfs::Error::Corrupt`].

/// Damage the block layer sees: a structure points past the end of the
/// image. Formats pass it on unchanged when a read they asked for runs off
/// the end.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    /// `len` bytes at `offset` do not fit the `size`-byte image.
    #[error("{len} bytes at {offset:#x} lie beyond the end of the {size}-byte image")]
    ReadPastEnd {
        /// Byte offset in the image where the read starts.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The image size in bytes.
        size: u64,
    },
}
