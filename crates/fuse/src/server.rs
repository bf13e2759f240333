//! The `fuser::Filesystem` that forwards every request to a
//! [`foliofs_vfs::FileSystem`].

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use foliofs_vfs::{self as vfs, Attr, Error, FileSystem, Ino, Scratch, SetAttr};
use fuser::{
    AccessFlags, Errno, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::convert::{ctx, errno, file_attr, fuser_kind, time_set, Overrides};
use crate::ids::IdMap;
use crate::profile::{ImageKey, Profile, Recorder};
use crate::push::{PushSetup, Pusher};
use crate::spin::SpinSlot;
use crate::stats::{Op, RequestCounts};

thread_local! {
    /// One read buffer per server thread: reads reply with a slice of it, so
    /// the hot path allocates nothing after the first request.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// How the server treats the kernel's caches and requests.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Entry and attribute lifetime in the kernel's caches.
    pub ttl: Duration,
    /// Refuse every change with `EROFS`, and let the kernel keep file and
    /// directory pages across opens (the image cannot change under it).
    pub read_only: bool,
    /// Owner and permission overrides applied to every reported attribute.
    pub overrides: Overrides,
    /// Log every request to stderr.
    pub debug: bool,
    /// Ask for the kernel's writeback cache (writable file systems only).
    pub writeback: bool,
    /// Where the server counts its requests by opcode; the caller keeps a
    /// clone to publish them while the mount is live.
    pub requests: Arc<RequestCounts>,
    /// Bytes the mount may push into the kernel's page cache before they
    /// are asked for (`push=`); 0 pushes nothing. Only read-only mounts
    /// push (see [`crate::push`]).
    pub push_budget: u64,
    /// Pusher threads, each reading one file at a time (see
    /// [`crate::push::PushSetup::readers`]).
    pub push_readers: usize,
    /// `record=FILE`: the file the start-up profile is written to at
    /// unmount, and the key of the image it is recorded on.
    pub record: Option<(PathBuf, ImageKey)>,
    /// `prefetch=FILE`: a profile of this image to replay.
    pub profile: Option<Arc<Profile>>,
}

/// The adapter between fuser's callbacks and the file system.
pub(crate) struct Server {
    fs: Arc<dyn FileSystem>,
    ids: IdMap,
    cfg: ServerConfig,
    /// Whether write-only descriptors bypass the page cache (see
    /// [`Server::open_flags`]).
    direct_writes: bool,
    requests: Arc<RequestCounts>,
    /// The session's notifier, once the session exists (see
    /// [`Server::notifier_slot`]).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Pushes file data into the kernel (read-only mounts with a budget).
    pusher: Option<Pusher>,
    /// Records the start-up profile (`record=`).
    recorder: Option<Recorder>,
    /// Keeps a thread polling for the next request (`spin=`), once the
    /// session exists (see [`Server::spin_slot`]).
    spin: SpinSlot,
    /// The format can never change (`FsInfo::read_only`): it frees no
    /// inodes, so it keeps no lookup counts (see its `readdirplus`).
    immutable: bool,
    /// The format lists "." and ".." itself, where its kernel driver does
    /// (`FileSystem::lists_dots`); otherwise they are listed here, first.
    lists_dots: bool,
}

/// The attributes of a negative entry: node 0 tells the kernel the name is
/// missing; the rest is never looked at.
fn missing() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// Whether the running kernel's release is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, major, minor)
}

/// Whether a release string ("6.18.44-fc", "5.15.0-91-generic") names
/// `major.minor` or later; an unreadable one does not.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}

impl Server {
    pub(crate) fn new(fs: Arc<dyn FileSystem>, cfg: ServerConfig) -> Server {
        let ids = IdMap::new(fs.root());
        // Before Linux 6.6 a direct write left other descriptors' cached
        // pages of the range in place (stale reads, and dirty mmap pages
        // written back over the newer data later).
        let direct_writes = !cfg.read_only && !cfg.writeback && kernel_at_least(6, 6);
        let notifier = Arc::new(OnceLock::new());
        let recorder = cfg
            .record
            .clone()
            .map(|(path, key)| Recorder::new(path, key));
        // A recording run pushes nothing: a pushed page is read without a
        // READ, so the profile would miss it.
        let pusher = (cfg.read_only && cfg.push_budget > 0 && recorder.is_none())
            .then(|| {
                Pusher::start(PushSetup {
                    fs: fs.clone(),
                    ids,
                    notifier: notifier.clone(),
                    budget: cfg.push_budget,
                    profile: cfg.profile.clone(),
                    counts: cfg.requests.clone(),
                    readers: cfg.push_readers,
                })
            })
            .flatten();
        let immutable = fs.info().read_only;
        let lists_dots = fs.lists_dots();
        Server {
            immutable,
            lists_dots,
            fs,
            ids,
            requests: cfg.requests.clone(),
            cfg,
            direct_writes,
            notifier,
            pusher,
            recorder,
            spin: SpinSlot::default(),
        }
    }

    /// Where the session puts the polling state once its descriptor exists.
    pub(crate) fn spin_slot(&self) -> SpinSlot {
        self.spin.clone()
    }

    /// Every request starts here: it is counted, and it keeps the polling
    /// thread awake for the next one.
    fn begin(&self, op: Op) {
        self.requests.bump(op);
        if let Some(s) = self.spin.get() {
            s.touch();
        }
    }

    /// The reply giving the kernel inode `a` has been sent: a small file's
    /// data (or what the profile read of it) may follow it in.
    fn known(&self, a: &Attr) {
        if let Some(p) = &self.pusher {
            if a.kind == vfs::FileType::RegularFile && p.wants(a.ino, a.size) {
                p.offer(a.ino);
            }
        }
    }

    /// Where the session's notifier goes once the session is made: the
    /// server needs it to tell the kernel of attribute changes it makes on
    /// its own.
    pub(crate) fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Drops the kernel's cached attributes of `node` (not its pages).
    /// Sent from inside a request is safe for attributes: the kernel takes
    /// no page or inode lock for them.
    fn forget_cached_attrs(&self, node: INodeNo) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(node, -1, 0) {
                log::warn!("cannot invalidate the attributes of node {}: {e}", node.0);
            }
        }
    }

    fn ino(&self, node: INodeNo) -> Ino {
        self.ids.to_fs(node.0)
    }

    /// `a` as fuser wants it (see [`file_attr`]).
    fn attr_out(&self, a: Attr, st_ino: u64) -> fuser::FileAttr {
        file_attr(a, st_ino, &self.cfg.overrides)
    }

    /// The attributes of `dir`'s parent, for a ".." entry; a directory
    /// whose parent cannot be found stands for itself. The kernel takes no
    /// reference for "..": the lookup's is given back at once, or a writable
    /// file system could never free that directory.
    fn dotdot(&self, dir: Ino) -> vfs::Result<Attr> {
        let parent = self.fs.lookup(dir, OsStr::new(".."));
        if let Ok(p) = &parent {
            self.fs.forget(p.ino, 1);
        }
        parent.or_else(|_| self.fs.getattr(dir))
    }

    fn reply_entry(&self, r: vfs::Result<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                let node = self.ids.to_fuse(a.ino);
                reply.entry(&self.cfg.ttl, &self.attr_out(a, node), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn reply_empty(&self, r: vfs::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// With `debug`, one line per request on stderr (the foreground
    /// terminal, or the log file a background server was given), whatever
    /// the log filter says: asking for it is the filter.
    fn log(&self, what: std::fmt::Arguments<'_>) {
        if self.cfg.debug {
            eprintln!("foliofs: {what}");
        }
    }

    /// Flags for a file opened with open(2) flags `flags`.
    fn open_flags(&self, flags: i32) -> FopenFlags {
        if self.cfg.read_only {
            FopenFlags::FOPEN_KEEP_CACHE
        } else if flags & libc::O_ACCMODE == libc::O_WRONLY && self.direct_writes {
            // A descriptor that cannot read gains nothing from the page
            // cache, and without the writeback cache every write(2) comes
            // here at once anyway. Direct I/O hands the server the writer's
            // own pages instead of a page-cache copy of them: one copy and
            // all page-cache bookkeeping fewer, twice the bandwidth of `dd`.
            // The kernel (6.6 on) writes back other descriptors' dirty
            // pages of the range and drops their cached pages around the
            // write, so they stay coherent, and it leaves dropping
            // set-user-ID to the server (`FUSE_WRITE_KILL_SUIDGID`).
            // Readable descriptors keep the page cache: mmap needs it.
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    fn reply_xattr(&self, r: vfs::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() <= size as usize => reply.data(&v),
            Ok(_) => reply.error(Errno::ERANGE),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl fuser::Filesystem for Server {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES;
        if self.cfg.read_only {
            want |= InitFlags::FUSE_CACHE_SYMLINKS;
            // Every listing with attributes, not only its first reply (the
            // kernel's READDIRPLUS_AUTO rule: later replies are plain unless
            // a lookup in the directory came between two). Listers read a
            // whole directory before they stat it (find, ls, fts), so past
            // the first reply each stat then cost a LOOKUP round trip:
            // `find -ls` of 100,000 entries sent 99,798 of them and took
            // 6 to 10 times as long as the kernel's EROFS; with attributes
            // throughout it takes about as long. A plain `find` of such a
            // directory pays for attributes it does not use, the kernel
            // making an inode for every entry, but less than `-ls` saves.
        } else {
            // A writable file system's attributes change; keep the
            // kernel's rule there.
            want |= InitFlags::FUSE_READDIRPLUS_AUTO | InitFlags::FUSE_BIG_WRITES;
            // Without the writeback cache every write(2) reaches the file
            // system before it returns, so a full ramfs refuses the write
            // itself and nothing the caller was told is written can be lost.
            if self.cfg.writeback {
                want |= InitFlags::FUSE_WRITEBACK_CACHE;
            }
        }
        // Ask only for what this kernel offers; the rest is an optimisation.
        let _ = config.add_capabilities(want & caps);
        // The largest readahead the kernel offered (it may only be lowered
        // here; the mount's bdi is raised after mounting).
        let mut ra = u32::MAX;
        while let Err(max) = config.set_max_readahead(ra) {
            if max == ra {
                break;
            }
            ra = max;
        }
        let _ = config.set_max_background(128);
        let _ = config.set_congestion_threshold(96);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.begin(Op::Lookup);
        self.log(format_args!(
            "lookup({}, {name:?}) pid {}",
            parent.0,
            req.pid()
        ));
        match self.fs.lookup(self.ino(parent), name) {
            // A name that is not there stays cached as missing (node 0 with
            // a lifetime) like a found one: every way a name can appear goes
            // through this mount, and the kernel makes the entry positive
            // itself when it does. Saves a LOOKUP per repeated miss (stat
            // of a missing file, a create without O_EXCL after a check).
            Err(Error::NotFound) => reply.entry(&self.cfg.ttl, &missing(), Generation(0)),
            Ok(a) => {
                self.reply_entry(Ok(a), reply);
                if let Some(r) = &self.recorder {
                    r.lookup(a.ino);
                }
                self.known(&a);
            }
            r => self.reply_entry(r, reply),
        }
    }

    fn destroy(&mut self) {
        if let Some(r) = &self.recorder {
            r.save();
        }
        // What the mount cost in round trips, once, as it goes away.
        let summary = self.requests.summary();
        if self.cfg.debug {
            eprintln!("foliofs: requests: {summary}");
        } else {
            log::debug!("requests: {summary}");
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.begin(Op::Forget);
        self.fs.forget(self.ino(ino), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.begin(Op::Getattr);
        self.log(format_args!("getattr({})", ino.0));
        match self.fs.getattr(self.ino(ino)) {
            Ok(a) => reply.attr(&self.cfg.ttl, &self.attr_out(a, a.ino)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.begin(Op::Setattr);
        self.log(format_args!(
            "setattr({}, mode {mode:?}, uid {uid:?}, gid {gid:?}, size {size:?})",
            ino.0
        ));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(vfs::Timespec::from_system),
            fh: fh.map(|f| f.0),
        };
        match self.fs.setattr(self.ino(ino), &set, &ctx(req, 0)) {
            Ok(a) => reply.attr(&self.cfg.ttl, &self.attr_out(a, a.ino)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.begin(Op::Readlink);
        self.log(format_args!("readlink({})", ino.0));
        match self.fs.readlink(self.ino(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.begin(Op::Mknod);
        self.log(format_args!("mknod({}, {name:?}, {mode:o})", parent.0));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let Some(kind) = vfs::FileType::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let r = self.fs.mknod(
            self.ino(parent),
            name,
            kind,
            (mode & 0o7777) as u16,
            rdev,
            &ctx(req, umask),
        );
        self.reply_entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.begin(Op::Mkdir);
        self.log(format_args!("mkdir({}, {name:?}, {mode:o})", parent.0));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.mkdir(
            self.ino(parent),
            name,
            (mode & 0o7777) as u16,
            &ctx(req, umask),
        );
        self.reply_entry(r, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.begin(Op::Unlink);
        self.log(format_args!("unlink({}, {name:?})", parent.0));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.unlink(self.ino(parent), name, &ctx(req, 0));
        self.reply_empty(r, reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.begin(Op::Rmdir);
        self.log(format_args!("rmdir({}, {name:?})", parent.0));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.rmdir(self.ino(parent), name, &ctx(req, 0));
        self.reply_empty(r, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.begin(Op::Symlink);
        self.log(format_args!(
            "symlink({}, {link_name:?}, {target:?})",
            parent.0
        ));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.symlink(
            self.ino(parent),
            link_name,
            target.as_os_str().as_bytes(),
            &ctx(req, 0),
        );
        self.reply_entry(r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Rename);
        self.log(format_args!(
            "rename({}, {name:?}, {}, {newname:?}, {flags})",
            parent.0, newparent.0
        ));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.rename(
            self.ino(parent),
            name,
            self.ino(newparent),
            newname,
            flags.bits(),
            &ctx(req, 0),
        );
        self.reply_empty(r, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.begin(Op::Link);
        self.log(format_args!(
            "link({}, {}, {newname:?})",
            ino.0, newparent.0
        ));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self
            .fs
            .link(self.ino(ino), self.ino(newparent), newname, &ctx(req, 0));
        self.reply_entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.begin(Op::Open);
        self.log(format_args!("open({}, {:#x})", ino.0, flags.0));
        if self.cfg.read_only {
            // An image never changes under its mount, and the mount is
            // MS_RDONLY (the kernel refuses writable opens itself). ENOSYS
            // tells the kernel to stop sending opens and releases at all and
            // to keep every file's page cache: two round trips saved per
            // open(2), which is most of the cost of reading many small files.
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.open(self.ino(ino), flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), self.open_flags(flags.0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.begin(Op::Read);
        self.log(format_args!("read({}, {offset}, {size})", ino.0));
        let ino = self.ino(ino);
        if let Some(p) = &self.pusher {
            p.reading(ino);
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            match self.fs.read(ino, offset, size, &mut s) {
                Ok(data) => {
                    if let Some(r) = &self.recorder {
                        r.read(ino, offset, data.len() as u64);
                    }
                    reply.data(data)
                }
                Err(e) => {
                    log::warn!("read of inode {ino} at {offset}: {e}");
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.begin(Op::Write);
        self.log(format_args!("write({}, {offset}, {})", ino.0, data.len()));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let node = ino;
        let ino = self.ino(ino);
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            let before = self.fs.getattr(ino).map(|a| a.perm);
            if let Err(e) = self.fs.kill_suid(ino) {
                return reply.error(errno(&e));
            }
            // The kernel cannot know the mode changed: its cached mode
            // would keep set-user-ID for permission checks (exec) until the
            // attributes expire, which on a writable mount they do not soon.
            if before.is_ok_and(|p| self.fs.getattr(ino).is_ok_and(|a| a.perm != p)) {
                self.forget_cached_attrs(node);
            }
        }
        if !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            // A short count reaches the writer as the result of write(2).
            return match self.fs.write(ino, fh.0, offset, data, flags.0) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            };
        }
        // Writeback of cached pages: the kernel does not look at a short
        // count, so the bytes left over would be lost without an error.
        // Write on until everything is stored or the file system says why not.
        let mut done = 0usize;
        while done < data.len() {
            match self
                .fs
                .write(ino, fh.0, offset + done as u64, &data[done..], flags.0)
            {
                Ok(0) => return reply.error(Errno::EIO),
                Ok(n) => done += n as usize,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.written(done as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Flush);
        // Nothing is buffered here between write(2) and close(2), and the
        // kernel writes its own dirty pages back before it would ask. ENOSYS
        // makes it stop sending a FLUSH round trip on every close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Release);
        let r = self.fs.release(self.ino(ino), fh.0);
        self.reply_empty(r, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Fsync);
        let r = self.fs.fsync(self.ino(ino), datasync);
        self.reply_empty(r, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.begin(Op::Opendir);
        self.log(format_args!("opendir({})", ino.0));
        // No format keeps anything per directory handle (listings resume
        // at cookies), so ENOSYS: the kernel stops sending OPENDIR and
        // RELEASEDIR, two round trips per directory read (`rm -rf` and
        // `find` of a tree open each directory at least once). It caches
        // listings then (FOPEN_CACHE_DIR is its default without opendir).
        // On a writable mount that stays coherent: every change of a
        // directory goes through this kernel, which bumps the directory's
        // version, and a listing starting over at offset 0 drops a cache
        // of an older version. (A listing already under way may still
        // return a name removed since its opendir, which POSIX allows.)
        reply.error(Errno::ENOSYS)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.begin(Op::Readdir);
        self.log(format_args!("readdir({}, {offset})", ino.0));
        let dir = self.ino(ino);
        if self.lists_dots {
            let r = self.fs.readdir_with_dots(dir, offset, &mut |e| {
                reply.add(INodeNo(e.ino), e.next, fuser_kind(e.kind), e.name)
            });
            return match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            };
        }
        // Cookies 1 and 2 follow "." and ".."; the file system's own cookies
        // are shifted up by 2 so they never collide with those.
        let mut off = offset;
        if off == 0 {
            if reply.add(INodeNo(dir), 1, fuser::FileType::Directory, ".") {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let parent = self.dotdot(dir).map_or(dir, |a| a.ino);
            if reply.add(INodeNo(parent), 2, fuser::FileType::Directory, "..") {
                return reply.ok();
            }
            off = 2;
        }
        let r = self.fs.readdir(dir, off - 2, &mut |e| {
            reply.add(INodeNo(e.ino), e.next + 2, fuser_kind(e.kind), e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.begin(Op::Readdirplus);
        self.log(format_args!("readdirplus({}, {offset})", ino.0));
        let dir = self.ino(ino);
        let ttl = self.cfg.ttl;
        let mut off = offset;
        // The kernel links no inode for "." and "..": their attributes only
        // give d_ino, which is the file system's own number. A format that
        // lists them itself keeps cookies of its own; the others' are
        // shifted up by 2, past those of the dots listed here first.
        let shift = if self.lists_dots { 0 } else { 2 };
        if off == 0 && !self.lists_dots {
            let a = match self.fs.getattr(dir) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            if reply.add(
                INodeNo(a.ino),
                1,
                ".",
                &ttl,
                &self.attr_out(a, a.ino),
                Generation(0),
            ) {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 && !self.lists_dots {
            let a = match self.dotdot(dir) {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            if reply.add(
                INodeNo(a.ino),
                2,
                "..",
                &ttl,
                &self.attr_out(a, a.ino),
                Generation(0),
            ) {
                return reply.ok();
            }
            off = 2;
        }
        let from = off - shift;
        self.fs.prefetch_dir(dir, from);
        let mut failed = None;
        let mut added = 0usize;
        let mut known = Vec::new();
        let mut sink = |e: vfs::DirEntry<'_>| {
            if self.lists_dots && (e.name == "." || e.name == "..") {
                // As above: attributes for d_ino only, and no lookup, so
                // nothing the kernel must be sent to give back.
                return match self.fs.getattr(e.ino) {
                    Ok(a) => {
                        let attr = self.attr_out(a, a.ino);
                        reply.add(INodeNo(a.ino), e.next, e.name, &ttl, &attr, Generation(0))
                    }
                    Err(err) => {
                        failed = Some(err);
                        true
                    }
                };
            }
            // The kernel counts every entry of a readdirplus reply as a
            // lookup (and forgets it later), so the entry is looked up, which
            // a format that frees inodes counts too. A format that never
            // changes keeps no counts, and the listing already names the
            // inode: its attributes are all it takes, where a lookup would
            // search the directory for the name again (in a large EROFS
            // directory, a binary search over its blocks per entry). A
            // directory is still looked up: romfs learns its parent so.
            let found = if self.immutable && e.kind != vfs::FileType::Directory {
                self.fs.getattr(e.ino)
            } else {
                self.fs.lookup(dir, e.name)
            };
            let a = match found {
                Ok(a) => a,
                // Gone since the listing was taken: leave it out.
                Err(Error::NotFound) => return false,
                Err(err) => {
                    failed = Some(err);
                    return true;
                }
            };
            let node = self.ids.to_fuse(a.ino);
            let full = reply.add(
                INodeNo(node),
                e.next + shift,
                e.name,
                &ttl,
                &self.attr_out(a, node),
                Generation(0),
            );
            if full {
                // Not sent: the kernel will not forget it.
                self.fs.forget(a.ino, 1);
            } else {
                added += 1;
                if self.pusher.is_some() {
                    known.push(a);
                }
            }
            full
        };
        let r = if self.lists_dots {
            self.fs.readdir_with_dots(dir, from, &mut sink)
        } else {
            self.fs.readdir(dir, from, &mut sink)
        };
        match (r, failed) {
            (Err(e), _) | (Ok(()), Some(e)) => {
                log::warn!("readdir of inode {dir}: {e}");
                if added > 0 {
                    // The entries already added hold lookup references the
                    // kernel only returns if it receives them: send those;
                    // the next call resumes at the failing entry and reports.
                    reply.ok()
                } else {
                    reply.error(errno(&e))
                }
            }
            (Ok(()), None) => reply.ok(),
        }
        // The kernel makes an inode of every entry sent.
        for a in &known {
            self.known(a);
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Releasedir);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // As fuser's default: ENOSYS, so the kernel stops asking (nothing
        // of a directory is buffered between it and here).
        self.begin(Op::Fsyncdir);
        reply.error(Errno::ENOSYS);
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        // ENOSYS: the kernel keeps POSIX locks itself, local to this mount.
        self.begin(Op::Other);
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Other);
        reply.error(Errno::ENOSYS);
    }

    /// No file here has ioctls. Programs probe files with some on open
    /// (Python asks every file whether it is a terminal): answer at once,
    /// as a plain file does, without the library's per-call warning.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.begin(Op::Ioctl);
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.begin(Op::Statfs);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Setxattr);
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self
            .fs
            .setxattr(self.ino(ino), name, value, flags, &ctx(req, 0));
        self.reply_empty(r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.begin(Op::Getxattr);
        self.log(format_args!("getxattr({}, {name:?})", ino.0));
        let r = self.fs.getxattr(self.ino(ino), name);
        self.reply_xattr(r, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.begin(Op::Listxattr);
        let r = self.fs.listxattr(self.ino(ino)).map(|names| {
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(&n);
                out.push(0);
            }
            out
        });
        self.reply_xattr(r, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.begin(Op::Removexattr);
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.removexattr(self.ino(ino), name, &ctx(req, 0));
        self.reply_empty(r, reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.begin(Op::Access);
        // Only reached without default_permissions; check like the kernel's
        // generic_permission would, on the attributes the kernel sees.
        let a = match self.fs.getattr(self.ino(ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        let a = self.attr_out(a, a.ino);
        if mask.contains(AccessFlags::W_OK) && self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        if req.uid() == 0 {
            let x_ok = !mask.contains(AccessFlags::X_OK)
                || a.kind == fuser::FileType::Directory
                || a.perm & 0o111 != 0;
            return if x_ok {
                reply.ok()
            } else {
                reply.error(Errno::EACCES)
            };
        }
        let shift = if req.uid() == a.uid {
            6
        } else if req.gid() == a.gid {
            3
        } else {
            0
        };
        let have = (u32::from(a.perm) >> shift) & 7;
        let want = (mask.bits() as u32) & 7;
        if have & want == want {
            reply.ok()
        } else {
            reply.error(Errno::EACCES)
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.begin(Op::Create);
        self.log(format_args!("create({}, {name:?}, {mode:o})", parent.0));
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        match self.fs.create(
            self.ino(parent),
            name,
            (mode & 0o7777) as u16,
            flags,
            &ctx(req, umask),
        ) {
            Ok((a, fh)) => {
                let node = self.ids.to_fuse(a.ino);
                reply.created(
                    &self.cfg.ttl,
                    &self.attr_out(a, node),
                    Generation(0),
                    FileHandle(fh),
                    self.open_flags(flags),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.begin(Op::Fallocate);
        if self.cfg.read_only {
            return reply.error(Errno::EROFS);
        }
        let r = self.fs.fallocate(self.ino(ino), offset, length, mode);
        self.reply_empty(r, reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.begin(Op::Lseek);
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match self.fs.lseek(self.ino(ino), offset, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v595\n", 6, 6));
        assert!(release_at_least("6.6.0", 6, 6));
        assert!(release_at_least("7.0-rc1", 6, 6));
        assert!(!release_at_least("6.5.13-1-pve", 6, 6));
        assert!(!release_at_least("5.15.0-91-generic", 6, 6));
        assert!(!release_at_least("", 6, 6));
    }
}
