//! Linux romfs images: read them, build them, check them.
//!
//! [`RomFs`] opens an image file or block device and serves it through the
//! [`foliofs_vfs::FileSystem`] trait with the attributes the Linux kernel's
//! romfs driver shows: inode numbers are header offsets (hard links share
//! their target's), modes come from the entry type and exec bit, every inode
//! has one link, uid, gid and times are zero.
//!
//! Every structure is bounds-checked as it is read and every pointer chain is
//! checked for loops, so a damaged or hostile image yields
//! [`foliofs_vfs::Error::Corrupt`] naming the offset, never a panic or a hang.

pub mod check;
pub mod checksum;
pub mod dir;
mod fs;
pub mod header;
pub mod inode;
pub mod mkfs;
pub mod superblock;

pub use dir::{Dir, DirEnt};
pub use fs::{RomFs, MAX_SYMLINK, ROMFS_BLOCK_SIZE};
pub use header::{EntryType, Header};
pub use inode::Inode;
pub use superblock::{is_romfs, Superblock, MAGIC, MAX_NAME};
