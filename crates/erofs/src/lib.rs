//! Read and build EROFS images. Reading: the superblock, compact and extended inodes, flat,
//! inline, chunk-based and compressed data (LZ4, MicroLZMA, DEFLATE, Zstd;
//! dedupe's partial references and fragments in the packed inode included;
//! lcluster indexes or extent records), 48-bit block addresses, metadata
//! in a metabox inode,
//! directories (compressed ones too), symlinks, device nodes and extended
//! attributes, served through [`foliofs_vfs::FileSystem`].
//!
//! Inode numbers are what the kernel reports in `st_ino`: EROFS nids, or
//! on images with a metabox the kernel's 64-bit mapping of them
//! ([`Erofs::ino_of`], [`Erofs::nid_of`]); [`Erofs::inode`] takes nids.
//! Every structure is bounds-checked where it is read: a damaged image gives
//! [`Error::Corrupt`] naming the offset, with a [`Corrupt`] kind saying what
//! was wrong, for the file that touches the damage, and never a panic or an
//! allocation the image could not back. What the image uses but this reader
//! does not implement gives [`Error::Incompatible`] with an [`Incompatible`]
//! kind naming it.
//!
//! [`Error::Corrupt`]: foliofs_vfs::Error::Corrupt
//! [`Error::Incompatible`]: foliofs_vfs::Error::Incompatible

// Only the builder's binding of liblz4 (mkfs::compress::lz4) allows unsafe.
#![deny(unsafe_code)]
#![warn(missing_docs)]

// The on-disk format is one leaf module (`format`) that imports nothing
// else of the crate, so that every other module may use it without
// forming a cycle. It declares each on-disk record once, as a
// little-endian struct that the reader parses and the builder writes:
// a field the two placed differently would be a bug no test of one side
// alone could catch. The parsed forms of the records (superblock, inode,
// dirent, chunk, xattr) have a public module each. Reading an image is
// split by job, much as Linux splits its driver: opening the image and
// its devices (`mount`), mapping and reading plain data (`data`), reading
// compressed extents (`zdata`; `zmap` maps them, over lcluster indexes or
// extent records, `decompress` decodes them with one file per algorithm,
// `zcache` keeps them), fragments in the packed inode (`fragment`),
// metadata in the metabox inode (`metabox`), directories (`dir`), name
// lookup (`namei`), and the `FileSystem` trait on top of them (`fs`).
// Building is its own module tree (`mkfs`, named as romfs names its
// builder and as the command is), which shares the format and nothing
// else.

pub mod chunk;
mod data;
pub mod decompress;
mod dir;
pub mod dirent;
mod error;
pub mod extent;
pub mod format;
mod fragment;
mod fs;
pub mod fsck;
pub mod inode;
mod metabox;
pub mod mkfs;
mod mount;
mod namei;
pub mod superblock;
#[cfg(test)]
mod testimage;
pub mod xattr;
mod zcache;
mod zdata;
pub mod zmap;

pub use error::{ConfigProblem, Corrupt, Decode, Incompatible};
pub use extent::Extent;
pub use format::Layout;
pub use fsck::FsckReport;
pub use inode::Inode;
pub use metabox::{ino_to_nid, nid_to_ino};
pub use mount::Erofs;
