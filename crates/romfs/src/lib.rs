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
//! [`foliofs_vfs::Error::Corrupt`] naming the offset, with a [`Corrupt`]
//! kind saying what is wrong, never a panic or a hang.
//!
//! [`mkfs::build`] writes images (reproducibly, optionally with aligned
//! data) and [`check::check`] verifies one completely.
//!
//! # Example
//!
//! Build an image, open it, walk it and read a file:
//!
//! ```
//! use std::ffi::OsStr;
//!
//! use foliofs_block::OpenOptions;
//! use foliofs_romfs::{mkfs, RomFs};
//! use foliofs_vfs::{FileSystem, FileType, Ino, Scratch};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let src = dir.path().join("src");
//! std::fs::create_dir_all(src.join("docs"))?;
//! std::fs::write(src.join("docs/hello.txt"), "hello, romfs\n")?;
//! std::os::unix::fs::symlink("docs/hello.txt", src.join("greeting"))?;
//! let image = dir.path().join("image.romfs");
//! mkfs::build(&src, &image, &mkfs::MkfsOptions::default(), &mut |_| {})?;
//!
//! let fs = RomFs::open(&image, &OpenOptions::default())?;
//!
//! // Walk the whole tree, depth first.
//! fn walk(fs: &RomFs, dir: Ino, path: &str, out: &mut Vec<String>) -> foliofs_vfs::Result<()> {
//!     let mut entries = Vec::new();
//!     fs.readdir(dir, 0, &mut |e| {
//!         entries.push((e.name.to_string_lossy().into_owned(), e.ino, e.kind));
//!         false // the sink is never full
//!     })?;
//!     for (name, ino, kind) in entries {
//!         let child = format!("{path}/{name}");
//!         out.push(format!("{child} {}", kind.short_name()));
//!         if kind == FileType::Directory {
//!             walk(fs, ino, &child, out)?;
//!         }
//!     }
//!     Ok(())
//! }
//! let mut listing = Vec::new();
//! walk(&fs, fs.root(), "", &mut listing)?;
//! assert_eq!(listing, ["/docs dir", "/docs/hello.txt reg", "/greeting lnk"]);
//!
//! // Read a file and a symlink.
//! let docs = fs.lookup(fs.root(), OsStr::new("docs"))?;
//! let hello = fs.lookup(docs.ino, OsStr::new("hello.txt"))?;
//! let mut scratch = Scratch::new();
//! assert_eq!(fs.read(hello.ino, 0, 4096, &mut scratch)?, b"hello, romfs\n");
//! let link = fs.lookup(fs.root(), OsStr::new("greeting"))?;
//! assert_eq!(fs.readlink(link.ino)?, b"docs/hello.txt");
//!
//! // Attributes are the kernel's: no owner, no times, one link.
//! assert_eq!((hello.uid, hello.nlink, hello.perm), (0, 1, 0o644));
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod checksum;
pub mod dir;
mod error;
mod fs;
pub mod header;
pub mod inode;
pub mod mkfs;
pub mod superblock;

pub use dir::{Dir, DirEnt};
pub use error::Corrupt;
pub use fs::{RomFs, MAX_SYMLINK, ROMFS_BLOCK_SIZE};
pub use header::{EntryType, Header};
pub use inode::Inode;
pub use superblock::{is_romfs, Superblock, MAGIC, MAX_NAME};
