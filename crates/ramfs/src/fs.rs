//! [`RamFs`] itself: what it is made of, its limits as a whole, and the
//! [`FileSystem`] entry points, each handed to the file that does that job
//! (`table.rs`, `names.rs`, `rename.rs`, `file.rs`, `xattr.rs`).

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use foliofs_vfs::{
    Attr, Ctx, DirEntry, FileSystem, FileType, FsInfo, Ino, Rdev, Result, Scratch, SetAttr, StatFs,
};

use crate::backing::{Folios, Pool};
use crate::block;
use crate::data::FileData;
use crate::dir::Dir;
use crate::node::{Body, Node, State};
use crate::options::{total_ram, Options};
use crate::space::Space;
use crate::table::Table;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;
/// Longest name a directory entry may have.
pub const NAME_MAX: u32 = 255;

/// A memory limit the server runs under (see [`RamFs::limits_below_size`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Where it comes from: the cgroup file, or `RLIMIT_AS`.
    pub name: String,
    /// The limit in bytes.
    pub limit: u64,
    /// What of it is not in use yet (less the page cache the kernel can
    /// reclaim).
    pub left: u64,
}

/// A writable in-memory file system.
pub struct RamFs {
    opts: Options,
    pub(crate) block_size: u32,
    pub(crate) table: Table,
    pub(crate) next_ino: AtomicU64,
    pub(crate) next_fh: AtomicU64,
    pub(crate) space: Space,
    /// Serialises changes to the name space (never taken by reads or writes).
    names: Mutex<()>,
    /// Where file bodies live when the kernel reads and writes them itself
    /// (see [`RamFs::new_backed`]); `None` keeps them in this process.
    pub(crate) pool: Option<Pool>,
    /// Descriptors of files just created, for the open that follows at
    /// once (passthrough registers them): that open then costs no path
    /// walk. A few only; one nobody took is closed at the file's release
    /// or when pushed out.
    fresh: Mutex<VecDeque<(Ino, std::fs::File)>>,
    /// Where a supervised mount's state lives (see `durable.rs`).
    pub(crate) ledger: Option<crate::ledger::Ledger>,
    /// Requests an earlier server carried out, by id (`durable.rs`).
    pub(crate) done: Mutex<crate::durable::DoneMap>,
    /// Taken shared by every change of a supervised mount, and whole by a
    /// rewrite of its ledger.
    pub(crate) quiet: std::sync::RwLock<()>,
}

/// The size limit and folios of the tmpfs a backed ramfs with `opts`
/// keeps its files on.
pub(crate) fn pool_shape(opts: &Options) -> (Option<u64>, Folios) {
    let folios = if opts.huge {
        Folios::Huge
    } else if opts.block_size > crate::options::MIN_BLOCK_SIZE {
        Folios::ByWrite
    } else {
        Folios::Pages
    };
    (opts.size_limit(total_ram()), folios)
}

/// Fresh descriptors kept at most (a create takes its own back within the
/// same request; more are kept only while creates run side by side).
const FRESH_KEPT: usize = 8;

impl std::fmt::Debug for RamFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamFs")
            .field("opts", &self.opts)
            .field("used_blocks", &self.space.used_blocks())
            .field("used_inodes", &self.space.used_inodes())
            .finish()
    }
}

impl RamFs {
    /// An empty file system with these options, its limits resolved against
    /// this machine's memory.
    pub fn new(opts: &Options) -> Self {
        Self::build(opts, None)
    }

    /// An empty file system whose file bodies are files of a tmpfs of its
    /// own, mounted nowhere, which the FUSE layer can hand to the kernel
    /// (passthrough: reads, writes and mmap then never reach the server).
    /// Its `size=` is the tmpfs's, so the kernel refuses a write past it at
    /// `write(2)`; its folios are a page each at the 4 KiB block size, as
    /// large as each write allows above it (`huge=within_size`), and huge
    /// pages with `huge=always`. Needs `CAP_SYS_ADMIN` to mount the tmpfs.
    pub fn new_backed(opts: &Options) -> std::io::Result<Self> {
        let (limit, folios) = pool_shape(opts);
        Ok(Self::build(opts, Some(Pool::new(limit, folios)?)))
    }

    pub(crate) fn build(opts: &Options, pool: Option<Pool>) -> Self {
        let fs = Self::build_empty(opts, pool);
        // The root takes an inode slot like any other; a limit of 0 inodes is
        // "unlimited", so this always succeeds.
        let _ = fs.space.take_inode();
        let mut st = State::new(
            (opts.mode & 0o7777) as u16,
            opts.uid,
            opts.gid,
            Rdev::default(),
            Body::Dir(Dir::new(ROOT_INO)),
        );
        st.lookups = 1;
        fs.table
            .insert(Arc::new(Node::new(ROOT_INO, FileType::Directory, st)));
        fs
    }

    /// A file system with no inode at all, not even its root.
    pub(crate) fn build_empty(opts: &Options, pool: Option<Pool>) -> Self {
        let ram = total_ram();
        let bs = u64::from(opts.block_size);
        // `size=0` lifts the limit, but memory still bounds what can be
        // stored: cap it there so no single call can promise more blocks
        // than the machine has.
        let max_bytes = opts.size_limit(ram).unwrap_or(ram);
        block::set_pool_limit(max_bytes);
        block::set_huge(opts.huge);
        crate::budget::prepare();
        let space = Space::new(bs, Some(max_bytes), opts.inode_limit(ram));
        RamFs {
            opts: opts.clone(),
            block_size: opts.block_size,
            table: Table::new(),
            next_ino: AtomicU64::new(ROOT_INO + 1),
            next_fh: AtomicU64::new(1),
            space,
            names: Mutex::new(()),
            pool,
            fresh: Mutex::new(VecDeque::new()),
            ledger: None,
            done: Mutex::new(Default::default()),
            quiet: std::sync::RwLock::new(()),
        }
    }

    /// The options this file system was made with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    pub(crate) fn names(&self) -> MutexGuard<'_, ()> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn bs(&self) -> u64 {
        u64::from(self.block_size)
    }

    pub(crate) fn attr_of(&self, node: &Node, st: &State) -> Attr {
        st.attr(node.ino, node.kind, self.block_size)
    }

    /// Blocks and inodes in use (for tests and `statfs`).
    pub fn usage(&self) -> (u64, u64) {
        (self.space.used_blocks(), self.space.used_inodes())
    }

    /// Inodes this file system holds in memory: those with a name or an
    /// open handle, and those the kernel has not forgotten. A listing that
    /// counted lookups the kernel never got would show here as inodes
    /// that outlive their names.
    pub fn inodes_held(&self) -> usize {
        self.table.len()
    }

    /// Bytes of extended attribute names and values held.
    pub fn xattr_bytes(&self) -> u64 {
        self.space.used_xattr()
    }

    /// Whether file bodies live in backing files ([`RamFs::new_backed`]).
    pub fn is_backed(&self) -> bool {
        self.pool.is_some()
    }

    /// The memory limits this process runs under that are below `size=`,
    /// now: its memory cgroup's and its ancestors' (v2 `memory.max` and
    /// `memory.high`, v1 `memory.limit_in_bytes`) and, unless file bodies
    /// live in backing files (page cache, which no address space holds),
    /// `RLIMIT_AS`. Writes past what they leave fail with `ENOSPC`.
    pub fn limits_below_size(&self) -> Vec<MemoryLimit> {
        let size = self.space.max_blocks().saturating_mul(self.bs());
        crate::budget::below(size, self.is_backed())
            .into_iter()
            .map(|l| MemoryLimit {
                left: l.left(),
                name: l.name,
                limit: l.limit,
            })
            .collect()
    }

    /// Bytes the backing files hold, where file bodies live in them.
    pub fn backing_bytes(&self) -> Option<u64> {
        self.pool
            .as_ref()
            .and_then(|p| p.usage().ok())
            .map(|(used, _)| used)
    }

    /// A new regular file's body: empty, here or in the pool (with a
    /// descriptor of the new backing file, see [`RamFs::keep_fresh`]).
    pub(crate) fn new_file_body(&self) -> Result<(Body, Option<std::fs::File>)> {
        match &self.pool {
            None => Ok((Body::File(FileData::default()), None)),
            Some(p) => {
                let (body, file) = p.create().map_err(crate::file::io_error)?;
                Ok((Body::Backed(body), Some(file)))
            }
        }
    }

    /// Keeps the descriptor of `ino`'s new backing file for the open that
    /// follows its create.
    pub(crate) fn keep_fresh(&self, ino: Ino, file: std::fs::File) {
        let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        if fresh.len() >= FRESH_KEPT {
            fresh.pop_front();
        }
        fresh.push_back((ino, file));
    }

    pub(crate) fn take_fresh(&self, ino: Ino) -> Option<std::fs::File> {
        let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let at = fresh.iter().rposition(|(i, _)| *i == ino)?;
        fresh.remove(at).map(|(_, f)| f)
    }
}

impl RamFs {
    /// A call that changes something: on a supervised mount, held back
    /// while the ledger is rewritten, and answered with `redo` (from what
    /// the ledger recorded: the inode made, the handle opened) when it is
    /// a resent copy of a request an earlier server carried out.
    ///
    /// `grows`: the change takes memory (a name, an inode, data, an
    /// xattr), and is refused with `ENOSPC` where the memory limits leave
    /// the ledger no room for it; the rest (opens, closes, removals) never
    /// are, and log into the room kept ahead.
    fn change<T>(
        &self,
        grows: bool,
        redo: impl FnOnce((Ino, u64)) -> Result<T>,
        op: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if !self.logs() {
            return op();
        }
        let quiet = self.changing();
        if !self.ledger_room() && grows {
            return Err(foliofs_vfs::Error::NoSpace);
        }
        let done = self.already_done();
        crate::durable::set_replayed(done.is_some());
        let r = match done {
            Some(d) => redo(d),
            None => op(),
        };
        drop(quiet);
        self.changed();
        r
    }
}

impl FileSystem for RamFs {
    fn root(&self) -> Ino {
        ROOT_INO
    }

    fn info(&self) -> FsInfo {
        FsInfo {
            fs_type: "ramfs",
            block_size: self.block_size,
            name_max: NAME_MAX,
            read_only: false,
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        let mut blocks = self.space.max_blocks();
        // "Unlimited" inodes still need a figure: one per page of memory.
        let files = match self.space.max_inodes() {
            u64::MAX => total_ram() / 4096,
            n => n,
        };
        let mut used_b = self.space.used_blocks();
        if let Some(p) = &self.pool {
            // In blocks as each file counts them (see `Backed::blocks`),
            // against the pool's limit: the kernel allocates the pages.
            let (_, total) = p.usage().map_err(crate::file::io_error)?;
            let bs = self.bs();
            if total > 0 {
                blocks = total / bs;
            }
            self.table.for_each(|node| {
                let st = node.read();
                if let Some(b) = crate::backing::Backed::of(&st) {
                    if let Ok(s) = b.stat() {
                        used_b += b.blocks(&s, bs);
                    }
                }
            });
        }
        let used_i = self.space.used_inodes();
        let bfree = blocks.saturating_sub(used_b);
        Ok(StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree: files.saturating_sub(used_i),
            bsize: self.block_size,
            frsize: self.block_size,
            namelen: NAME_MAX,
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.do_getattr(ino)
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.do_lookup(parent, name)
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        self.do_forget(ino, nlookup)
    }

    fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.do_readdir(ino, offset, sink)
    }

    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        self.do_read(ino, offset, size, scratch)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.do_readlink(ino)
    }

    fn backing_file(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        self.pool.as_ref()?;
        let node = self.table.get(ino).ok()?;
        let st = node.read();
        let backed = crate::backing::Backed::of(&st)?;
        if let Some(f) = self.take_fresh(ino) {
            return Some(Arc::new(backed.hand_out(f)));
        }
        match backed.open() {
            Ok(f) => Some(Arc::new(f)),
            Err(e) => {
                // The open is then served by the server, from the same file.
                log::warn!("ramfs: cannot open the backing file of inode {ino}: {e}");
                None
            }
        }
    }

    fn note_backing(&self, ino: Ino, id: Option<u32>) {
        // Held back while the ledger is rewritten, as every change is (the
        // rewrite reads each inode while it holds the ledger).
        let _quiet = self.changing();
        self.do_note_backing(ino, id)
    }

    fn backings(&self) -> Vec<(Ino, u32, u64)> {
        self.do_backings()
    }

    fn replayed(&self) -> bool {
        crate::durable::replayed()
    }

    fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.do_getxattr(ino, name)
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.do_listxattr(ino)
    }

    fn open(&self, ino: Ino, flags: i32) -> Result<u64> {
        self.change(false, |_d| Ok(_d.1), || self.do_open(ino, flags))
    }

    fn release(&self, ino: Ino, fh: u64) -> Result<()> {
        self.change(false, |_d| Ok(()), || self.do_release(ino, fh))
    }

    fn setattr(&self, ino: Ino, set: &SetAttr, ctx: &Ctx) -> Result<Attr> {
        self.change(
            false,
            |_d| self.do_getattr(ino),
            || self.do_setattr(ino, set, ctx),
        )
    }

    fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileType,
        perm: u16,
        rdev: u32,
        ctx: &Ctx,
    ) -> Result<Attr> {
        self.change(
            true,
            |_d| self.do_getattr(_d.0),
            || self.do_mknod(parent, name, kind, perm, rdev, ctx),
        )
    }

    fn create(
        &self,
        parent: Ino,
        name: &OsStr,
        perm: u16,
        flags: i32,
        ctx: &Ctx,
    ) -> Result<(Attr, u64)> {
        self.change(
            true,
            |_d| Ok((self.do_getattr(_d.0)?, _d.1)),
            || self.do_create(parent, name, perm, flags, ctx),
        )
    }

    fn mkdir(&self, parent: Ino, name: &OsStr, perm: u16, ctx: &Ctx) -> Result<Attr> {
        self.change(
            true,
            |_d| self.do_getattr(_d.0),
            || self.do_mkdir(parent, name, perm, ctx),
        )
    }

    fn symlink(&self, parent: Ino, name: &OsStr, target: &[u8], ctx: &Ctx) -> Result<Attr> {
        self.change(
            true,
            |_d| self.do_getattr(_d.0),
            || self.do_symlink(parent, name, target, ctx),
        )
    }

    fn unlink(&self, parent: Ino, name: &OsStr, ctx: &Ctx) -> Result<()> {
        self.change(false, |_d| Ok(()), || self.do_unlink(parent, name, ctx))
    }

    fn rmdir(&self, parent: Ino, name: &OsStr, ctx: &Ctx) -> Result<()> {
        self.change(false, |_d| Ok(()), || self.do_rmdir(parent, name, ctx))
    }

    fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
        ctx: &Ctx,
    ) -> Result<()> {
        self.change(
            false,
            |_d| Ok(()),
            || self.do_rename(parent, name, newparent, newname, flags, ctx),
        )
    }

    fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr, ctx: &Ctx) -> Result<Attr> {
        self.change(
            true,
            |_d| self.do_getattr(_d.0),
            || self.do_link(ino, newparent, newname, ctx),
        )
    }

    fn kill_suid(&self, ino: Ino) -> Result<()> {
        self.change(false, |_d| Ok(()), || self.do_kill_suid(ino))
    }

    fn write(&self, ino: Ino, fh: u64, offset: u64, data: &[u8], flags: i32) -> Result<u32> {
        self.change(
            true,
            |_d| Ok(data.len() as u32),
            || self.do_write(ino, fh, offset, data, flags),
        )
    }

    fn fallocate(&self, ino: Ino, offset: u64, length: u64, mode: i32) -> Result<()> {
        self.change(
            true,
            |_d| Ok(()),
            || self.do_fallocate(ino, offset, length, mode),
        )
    }

    fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        self.do_lseek(ino, offset, whence)
    }

    fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32, ctx: &Ctx) -> Result<()> {
        self.change(
            true,
            |_d| Ok(()),
            || self.do_setxattr(ino, name, value, flags, ctx),
        )
    }

    fn removexattr(&self, ino: Ino, name: &OsStr, ctx: &Ctx) -> Result<()> {
        self.change(false, |_d| Ok(()), || self.do_removexattr(ino, name, ctx))
    }
}
