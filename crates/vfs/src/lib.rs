//! The one inode-level interface every foliofs format implements.
//!
//! A format crate (romfs, EROFS, ramfs) implements [`FileSystem`]; the FUSE
//! server and the command-line tools only ever talk to this trait. Inode
//! numbers are the format's own (a romfs header offset, an EROFS nid, a ramfs
//! counter): [`FileSystem::root`] names the root, and the FUSE layer maps it to
//! node id 1 so formats never have to renumber.
//!
//! Read-only formats implement the reading half and inherit the defaults for
//! every mutating call, which fail with [`Error::ReadOnly`] (`EROFS`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod aligned;
mod defect;
mod error;
pub mod options;
pub mod request;
mod types;

pub use aligned::AlignedBuf;
pub use defect::{CheckReport, Defect};
pub use error::{chain_line, Corruption, Error, Incompatibility, Result};
pub use types::*;

use std::ffi::OsStr;

/// Inode number, in the file system's own numbering.
pub type Ino = u64;

/// An inode-level file system.
///
/// Every method takes `&self`: implementations are shared between the FUSE
/// server's worker threads and do their own (fine-grained) locking.
pub trait FileSystem: Send + Sync {
    /// The root directory's inode number.
    fn root(&self) -> Ino;

    /// Static facts about this mount (block size, name limits, read-only).
    fn info(&self) -> FsInfo;

    /// Space and inode figures for `statfs(2)`.
    fn statfs(&self) -> Result<StatFs>;

    /// Attributes of `ino`.
    fn getattr(&self, ino: Ino) -> Result<Attr>;

    /// Looks `name` up in directory `parent`. `name` is never "." or ".."
    /// unless the caller passes them; implementations resolve those as the
    /// kernel would (the parent of the root is the root).
    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr>;

    /// Called when the kernel drops `nlookup` references to `ino` obtained
    /// through `lookup`/`create`/`mkdir`/... Formats that free inodes (ramfs)
    /// use this to know when an unlinked inode can go.
    fn forget(&self, _ino: Ino, _nlookup: u64) {}

    /// Lists directory `ino` starting at `offset` (0 = the beginning; after
    /// that, the `next` cookie of the last entry seen). Cookies are stable:
    /// resuming at a cookie never repeats or skips an entry that was present
    /// for the whole listing. "." and ".." are not listed; the FUSE layer adds
    /// them (see [`FileSystem::lists_dots`]). `sink` returns `true` when it
    /// is full; listing stops there.
    fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()>;

    /// True when [`FileSystem::readdir_with_dots`] lists "." and ".." where
    /// this format's own kernel driver lists them, which is not first (an
    /// EROFS directory keeps them in its sorted entries, after names such as
    /// `#a` or `-a`). False, the default, when that driver lists them
    /// first: the FUSE layer then does so itself, before `readdir`'s
    /// entries.
    fn lists_dots(&self) -> bool {
        false
    }

    /// As [`FileSystem::readdir`], with "." and ".." among the entries where
    /// this format's kernel driver lists them (their `ino` the directory's
    /// own and its parent's), for a format that [`lists_dots`]; cookies are
    /// this listing's own, 0 the start. The default lists what `readdir`
    /// lists.
    ///
    /// [`lists_dots`]: FileSystem::lists_dots
    fn readdir_with_dots(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.readdir(ino, offset, sink)
    }

    /// A hint that directory `ino` is being listed from `offset` by a
    /// READDIRPLUS, as walkers like `find` list before descending: its
    /// subdirectories are looked up, and with `every` all other entries
    /// too. A format may read ahead what those lookups, or the listings
    /// that follow, will need (EROFS hints the inode blocks of the entries
    /// looked up and the first blocks of the subdirectories; romfs reads
    /// its subdirectories' chains side by side), so the device serves many
    /// reads at once instead of one after another. Errors are left for the
    /// real calls to report.
    fn prefetch_dir(&self, _ino: Ino, _offset: u64, _every: bool) {}

    /// Reads up to `size` bytes of `ino` at `offset`. The data is returned as a
    /// slice that may point anywhere into `scratch` (a per-thread buffer the
    /// caller keeps between calls, so the hot path allocates nothing). Fewer
    /// bytes than asked means end of file.
    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]>;

    /// A symbolic link's target.
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;

    /// The file that holds `ino`'s bytes, where the format keeps a regular
    /// file's data in a file the kernel can read, write and map itself (the
    /// FUSE layer then passes opens of it through); `None` otherwise. Every
    /// open of one inode gets the same file.
    fn backing_file(&self, _ino: Ino) -> Option<std::sync::Arc<std::fs::File>> {
        None
    }

    /// The kernel's registration of `ino`'s backing file (`Some(id)`), or
    /// its end (`None`), for a file system whose state outlives its
    /// server: the kernel holds every open of an inode to one
    /// registration, so a restarted server must name the one the dead
    /// server made (see [`FileSystem::backings`]). Called before the open
    /// that uses it is answered, and before the registration is given
    /// back.
    fn note_backing(&self, _ino: Ino, _id: Option<u32>) {}

    /// The registrations an earlier server noted and did not end: each
    /// inode, its registration, and its open handles.
    fn backings(&self) -> Vec<(Ino, u32, u64)> {
        Vec::new()
    }

    /// Whether the call this thread just made was a resent request an
    /// earlier server had carried out, answered from its record (see
    /// [`request`]) rather than carried out again: the FUSE layer then
    /// keeps its own counts as they were.
    fn replayed(&self) -> bool {
        false
    }

    /// The value of extended attribute `name` (full name, e.g. `user.foo`).
    fn getxattr(&self, _ino: Ino, _name: &OsStr) -> Result<Vec<u8>> {
        Err(Error::NoSuchXattr)
    }

    /// Full names of every extended attribute of `ino`.
    fn listxattr(&self, _ino: Ino) -> Result<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }

    /// Opens `ino`; returns a handle passed back to `write`/`release`.
    /// `flags` are the `open(2)` flags.
    fn open(&self, _ino: Ino, flags: i32) -> Result<u64> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Error::ReadOnly);
        }
        Ok(0)
    }

    /// Closes a handle from `open` or `create`.
    fn release(&self, _ino: Ino, _fh: u64) -> Result<()> {
        Ok(())
    }

    // ---- mutation: read-only formats keep these defaults ----

    /// Changes attributes; returns the new attributes.
    fn setattr(&self, _ino: Ino, _set: &SetAttr, _ctx: &Ctx) -> Result<Attr> {
        Err(Error::ReadOnly)
    }

    /// Creates a non-directory, non-symlink node (regular, fifo, device, socket).
    fn mknod(
        &self,
        _parent: Ino,
        _name: &OsStr,
        _kind: FileType,
        _perm: u16,
        _rdev: u32,
        _ctx: &Ctx,
    ) -> Result<Attr> {
        Err(Error::ReadOnly)
    }

    /// Creates and opens a regular file (`O_CREAT`); returns its attributes and handle.
    fn create(
        &self,
        _parent: Ino,
        _name: &OsStr,
        _perm: u16,
        _flags: i32,
        _ctx: &Ctx,
    ) -> Result<(Attr, u64)> {
        Err(Error::ReadOnly)
    }

    /// Creates a directory.
    fn mkdir(&self, _parent: Ino, _name: &OsStr, _perm: u16, _ctx: &Ctx) -> Result<Attr> {
        Err(Error::ReadOnly)
    }

    /// Creates a symbolic link `name` in `parent` pointing at `target`.
    fn symlink(&self, _parent: Ino, _name: &OsStr, _target: &[u8], _ctx: &Ctx) -> Result<Attr> {
        Err(Error::ReadOnly)
    }

    /// Removes a non-directory.
    fn unlink(&self, _parent: Ino, _name: &OsStr, _ctx: &Ctx) -> Result<()> {
        Err(Error::ReadOnly)
    }

    /// Removes an empty directory.
    fn rmdir(&self, _parent: Ino, _name: &OsStr, _ctx: &Ctx) -> Result<()> {
        Err(Error::ReadOnly)
    }

    /// Renames; `flags` are `renameat2(2)` flags (NOREPLACE, EXCHANGE).
    fn rename(
        &self,
        _parent: Ino,
        _name: &OsStr,
        _newparent: Ino,
        _newname: &OsStr,
        _flags: u32,
        _ctx: &Ctx,
    ) -> Result<()> {
        Err(Error::ReadOnly)
    }

    /// Adds a hard link `newparent/newname` to `ino`.
    fn link(&self, _ino: Ino, _newparent: Ino, _newname: &OsStr, _ctx: &Ctx) -> Result<Attr> {
        Err(Error::ReadOnly)
    }

    /// Drops what an unprivileged write must drop before it lands: the
    /// set-user-ID bit, the set-group-ID bit where it means "run as the
    /// group" (with group execute), and file capabilities. The kernel does
    /// this itself before writes through the page cache; before direct
    /// writes it asks the server (`FUSE_WRITE_KILL_SUIDGID`). Formats
    /// without set-ID bits or capabilities keep the default, which does
    /// nothing.
    fn kill_suid(&self, _ino: Ino) -> Result<()> {
        Ok(())
    }

    /// Writes `data` at `offset` (ignored for handles opened with `O_APPEND`,
    /// which the caller resolves) through handle `fh`; returns the bytes
    /// written. `flags` are the handle's `open(2)` flags.
    fn write(&self, _ino: Ino, _fh: u64, _offset: u64, _data: &[u8], _flags: i32) -> Result<u32> {
        Err(Error::ReadOnly)
    }

    /// `fallocate(2)` with its `mode` flags.
    fn fallocate(&self, _ino: Ino, _offset: u64, _length: u64, _mode: i32) -> Result<()> {
        Err(Error::ReadOnly)
    }

    /// `lseek(2)` for `SEEK_DATA` / `SEEK_HOLE`; returns the new offset.
    /// The default treats the whole file as data.
    fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let size = self.getattr(ino)?.size;
        if offset >= size {
            return Err(Error::NoDataPastOffset);
        }
        match whence {
            libc::SEEK_DATA => Ok(offset),
            libc::SEEK_HOLE => Ok(size),
            _ => Err(Error::Invalid),
        }
    }

    /// Makes `ino`'s data durable. Nothing to do for in-memory or read-only formats.
    fn fsync(&self, _ino: Ino, _datasync: bool) -> Result<()> {
        Ok(())
    }

    /// Sets an extended attribute; `flags` are XATTR_CREATE / XATTR_REPLACE.
    fn setxattr(
        &self,
        _ino: Ino,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _ctx: &Ctx,
    ) -> Result<()> {
        Err(Error::ReadOnly)
    }

    /// Removes an extended attribute.
    fn removexattr(&self, _ino: Ino, _name: &OsStr, _ctx: &Ctx) -> Result<()> {
        Err(Error::ReadOnly)
    }
}
