//! What the block layer reports as damage or as a setup it cannot serve,
//! as kinds of [`foliofs_vfs::Error::Corrupt`] and
//! [`foliofs_vfs::Error::Incompatible`].

use std::path::PathBuf;

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

/// A block size the store cannot serve.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    /// Direct I/O on `path` needs blocks of at least `align` bytes.
    #[error(
        "{}: block size {block_size} is smaller than the {align} bytes direct I/O needs here",
        path.display()
    )]
    BlockSizeBelowDirectIo {
        /// The image or device opened for direct I/O.
        path: PathBuf,
        /// The block size asked for, in bytes.
        block_size: u32,
        /// The offset and memory alignment direct I/O needs on `path`, in
        /// bytes.
        align: u32,
    },
}
