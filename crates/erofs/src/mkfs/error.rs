//! Why an image could not be built: each error names the entry (a path in
//! the source tree or an entry of the tar, with its header's offset) and
//! what was expected of it.

use std::path::PathBuf;

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Reading the source or writing the image failed.
    #[error("{what}: {source}")]
    Io {
        /// The file or entry involved.
        what: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A tar entry that is malformed or that the builder cannot take.
    #[error("tar entry {path:?} (header at byte {offset}): {why}")]
    Tar {
        /// The entry's path as the tar gives it.
        path: String,
        /// Byte offset of its header in the (decompressed) tar stream.
        offset: u64,
        /// What is wrong with it.
        why: String,
    },
    /// The tar stream itself is damaged (before any entry could be named).
    #[error("tar stream: {why}")]
    Stream {
        /// The last good header's position in the (decompressed) stream.
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// An entry of a source directory the builder cannot take.
    #[error("{path}: {why}")]
    Source {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The image would not fit the format (32-bit block addresses).
    #[error("the image would need {blocks} blocks of {block_size} bytes; EROFS without 48-bit addresses holds at most 2^32")]
    ImageTooBig {
        /// Blocks needed.
        blocks: u64,
        /// The block size.
        block_size: u32,
    },
    /// An option that cannot be honoured.
    #[error("{0}")]
    Option(String),
}

impl BuildError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BuildError {
        let what = what.into();
        move |source| BuildError::Io { what, source }
    }
}
