//! Container images for foliofs: OCI image layouts read and verified
//! ([`layout`]) or pulled from a registry ([`registry`]), and the store
//! that keeps each layer as an EROFS image and each image's layers merged
//! into one ([`store`]), with a record of the name each image was prepared
//! under ([`catalog`]); and images published as native EROFS layers
//! ([`publish`], with their [`chunk_index`] and [`verity`] tree, pushed by
//! the registry client).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod catalog;
pub mod chunk_index;
pub mod digest;
pub mod layout;
pub mod native;
pub mod publish;
pub mod registry;
pub mod store;
pub mod verity;

use std::path::PathBuf;

pub use digest::Digest;
pub use layout::{parse_reference, Image, Layout, Platform};
pub use store::{BlobSource, Prepared, Store};

/// What went wrong with an image.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A digest that is not `sha256:` and 64 hex digits.
    #[error("digest {digest:?}: {why}")]
    Digest {
        /// The digest as written (cut short).
        digest: String,
        /// What is wrong with it.
        why: String,
    },
    /// The layout is not what OCI's image layout says.
    #[error("{}: {why}", dir.display())]
    Layout {
        /// The layout directory.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A JSON document that does not parse as what it should be.
    #[error("{what}: {why}")]
    Json {
        /// Which document.
        what: String,
        /// What the parser said.
        why: String,
    },
    /// Bytes whose digest is not the one they are named by.
    #[error("{what}: digest {got}, not {want}")]
    Mismatch {
        /// Whose bytes.
        what: String,
        /// The digest expected.
        want: Digest,
        /// The digest found.
        got: Digest,
    },
    /// Reading or writing failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A registry refused a request or answered what it should not.
    #[error("{what}: {why}")]
    Registry {
        /// The image reference (and what of it was asked for).
        what: String,
        /// What went wrong.
        why: String,
    },
    /// A chunk index that is not one.
    #[error(transparent)]
    ChunkIndex(#[from] chunk_index::ChunkIndexError),
    /// Building a layer or the merged image failed.
    #[error("{what}: {source}")]
    Build {
        /// Which build.
        what: String,
        /// Why it failed.
        source: foliofs_erofs::mkfs::BuildError,
    },
}
