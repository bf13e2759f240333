//! A writable in-memory file system whose file data lives in blocks of a
//! chosen size (4 KiB to 2 MiB), served through the [`FileSystem`] trait.
//!
//! [`RamFs`] keeps every inode in a sharded table and guards each inode with
//! its own lock, so reads and writes of different files never wait for each
//! other and reads of one file run in parallel. Changes to the name space
//! (create, link, unlink, rename, ...) are serialised by one mutex, which no
//! read or write ever takes: that keeps rename's multi-inode updates simple
//! and deadlock-free without slowing the data path.
//!
//! Permission checks are the kernel's (the FUSE mount uses
//! `default_permissions`); this crate keeps the POSIX bookkeeping: link
//! counts, timestamps, set-group-ID inheritance, the clearing of set-user-ID
//! bits on chown, and the `size=` / `nr_inodes=` limits.
//!
//! ```
//! use foliofs_ramfs::{Options, RamFs};
//! use foliofs_vfs::{Ctx, FileSystem, Scratch};
//!
//! let mut opts = Options::default();
//! opts.set("blocksize", Some("64K")).unwrap();
//! let fs = RamFs::new(&opts);
//! let ctx = Ctx::default();
//! let (attr, fh) = fs.create(fs.root(), "hello".as_ref(), 0o644, libc::O_RDWR, &ctx).unwrap();
//! fs.write(attr.ino, fh, 0, b"hi there", 0).unwrap();
//! let mut scratch = Scratch::new();
//! assert_eq!(fs.read(attr.ino, 3, 100, &mut scratch).unwrap(), b"there");
//! fs.release(attr.ino, fh).unwrap();
//! ```
//!
//! [`FileSystem`]: foliofs_vfs::FileSystem

#![warn(missing_docs)]

mod arena;
mod backing;
mod block;
mod budget;
mod data;
mod dir;
mod durable;
mod file;
mod fs;
mod ledger;
mod limits;
mod names;
mod node;
mod options;
mod rename;
mod space;
mod table;
#[cfg(test)]
mod tests;
mod xattr;

pub use arena::shared_huge_pages;
pub use durable::StateFiles;
pub use fs::{MemoryLimit, RamFs, NAME_MAX, ROOT_INO};
pub use ledger::LedgerError;
pub use options::{
    total_ram, Options, SizeLimit, DEFAULT_BLOCK_SIZE, DEFAULT_MODE, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};
