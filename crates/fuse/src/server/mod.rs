//! The server: answers the kernel's FUSE requests from a
//! [`foliofs_vfs::FileSystem`]. This file holds its state and INIT;
//! `dispatch.rs` counts and logs each request and hands it to its handler:
//! the name space and attributes (`names.rs`), file data and listings
//! (`files.rs`).
//!
//! Beside the handlers sit what only the server uses, kept here rather
//! than at the crate's root so the root says what the crate does: how
//! node ids and attributes become the kernel's (`ids.rs`, `convert.rs`),
//! and what the server does beyond answering, each to spare the kernel a
//! round trip or a wake-up: [`push`]es data before it is asked for (from a
//! [`profile`] where one was recorded), hands opens to the kernel
//! ([`passthrough`]), keeps a thread polling for the next request
//! ([`spin`]), and works ahead of a walker on listings (`subdir_hints.rs`,
//! `next_listing.rs`, `lean.rs`, `name_index.rs`).

pub(crate) mod convert;
mod dispatch;
mod files;
mod ids;
mod lean;
mod name_index;
mod names;
mod next_listing;
pub mod passthrough;
pub mod profile;
pub mod push;
pub mod spin;
mod subdir_hints;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use foliofs_vfs::{self as vfs, Attr, FileSystem, Ino, Scratch};

use crate::kernel::abi::{self, init, InitIn};
use crate::kernel::{Dev, DirBuf, Handler, Init, Reply, Request};
use crate::records::RequestCounts;
use convert::{entry_out, fuse_attr, Overrides};
use ids::IdMap;
use passthrough::Passthrough;
use profile::{ImageKey, Profile, Recorder};
use push::{PushSetup, Pusher};
use spin::SpinSlot;

thread_local! {
    /// One read buffer per server thread: reads reply with a slice of it, so
    /// the hot path allocates nothing after the first request.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
    /// One listing buffer per server thread, for the same reason.
    static DIRBUF: RefCell<DirBuf> = RefCell::new(DirBuf::default());
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
    /// push (see [`push`]).
    pub push_budget: u64,
    /// Pusher threads, each reading one file at a time (see
    /// [`push::PushSetup::readers`]).
    pub push_readers: usize,
    /// `record=FILE`: the file the start-up profile is written to at
    /// unmount, and the key of the image it is recorded on.
    pub record: Option<(PathBuf, ImageKey)>,
    /// `prefetch=FILE`: a profile of this image to replay.
    pub profile: Option<Arc<Profile>>,
    /// Pass opens of backed files through to the kernel (see
    /// [`passthrough`]), if INIT allows it; `None` never does.
    pub passthrough: Option<Arc<Passthrough>>,
    /// Take FUSE over io_uring if the kernel offers it (see
    /// `kernel/uring.rs`).
    pub io_uring: bool,
}

impl Default for ServerConfig {
    /// A writable file system's server with nothing asked of it: the
    /// kernel's one-second cache lifetime, no pushing, no profiles, no
    /// passthrough, `/dev/fuse` only.
    fn default() -> ServerConfig {
        ServerConfig {
            ttl: Duration::from_secs(1),
            read_only: false,
            overrides: Overrides::default(),
            debug: false,
            writeback: false,
            requests: Arc::default(),
            push_budget: 0,
            push_readers: 1,
            record: None,
            profile: None,
            passthrough: None,
            io_uring: false,
        }
    }
}

/// The state behind every request.
pub(crate) struct Server {
    fs: Arc<dyn FileSystem>,
    ids: IdMap,
    cfg: ServerConfig,
    /// Whether write-only descriptors bypass the page cache (see
    /// [`Server::open_flags`]).
    direct_writes: bool,
    requests: Arc<RequestCounts>,
    /// The connection, once the session exists: the server tells the
    /// kernel of attribute changes it makes on its own, and the pusher and
    /// passthrough use it.
    dev: Arc<OnceLock<Arc<Dev>>>,
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
    /// The flags INIT settled on.
    agreed: OnceLock<u64>,
    /// Which listing entries link an inode (see `lean.rs`).
    lean: lean::Lean,
    /// The names of image directories looked up often (see
    /// `name_index.rs`).
    name_index: name_index::NameIndex,
    /// Hints listed subdirectories' own listings off the request path
    /// (images only; see `subdir_hints.rs`).
    subdir_hints: Option<subdir_hints::SubdirHints>,
    /// Plain listings' next replies, built while the kernel takes in the
    /// last (images only; see `next_listing.rs`).
    next_listings: Option<next_listing::NextListings>,
}

/// The longest request the server asks for, in pages: the kernel's own
/// limit (`fs.fuse.max_pages_limit`, 256 by default, which root may
/// raise), since a larger one only makes every thread's buffer larger.
fn max_pages() -> u16 {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(256, |n| n.clamp(1, u32::from(u16::MAX)) as u16)
}

impl Server {
    pub(crate) fn new(fs: Arc<dyn FileSystem>, cfg: ServerConfig) -> Server {
        let ids = IdMap::new(fs.root());
        // Before Linux 6.6 a direct write left other descriptors' cached
        // pages of the range in place (stale reads, and dirty mmap pages
        // written back over the newer data later).
        let direct_writes =
            !cfg.read_only && !cfg.writeback && crate::kernel::kernel_at_least(6, 6);
        let dev = Arc::new(OnceLock::new());
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
                    dev: dev.clone(),
                    budget: cfg.push_budget,
                    profile: cfg.profile.clone(),
                    counts: cfg.requests.clone(),
                    readers: cfg.push_readers,
                })
            })
            .flatten();
        let immutable = fs.info().read_only;
        let lists_dots = fs.lists_dots();
        let subdir_hints = immutable
            .then(|| subdir_hints::SubdirHints::start(fs.clone()))
            .flatten();
        let next_listings =
            immutable.then(|| next_listing::NextListings::start(fs.clone(), lists_dots));
        Server {
            subdir_hints,
            immutable,
            lists_dots,
            fs,
            ids,
            requests: cfg.requests.clone(),
            cfg,
            direct_writes,
            dev,
            pusher,
            recorder,
            spin: SpinSlot::default(),
            agreed: OnceLock::new(),
            lean: lean::Lean::new(),
            name_index: name_index::NameIndex::default(),
            next_listings,
        }
    }

    /// Where the session puts the polling state once its descriptor exists.
    pub(crate) fn spin_slot(&self) -> SpinSlot {
        self.spin.clone()
    }

    /// Where the session puts the connection once it exists.
    pub(crate) fn dev_slot(&self) -> Arc<OnceLock<Arc<Dev>>> {
        self.dev.clone()
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

    /// Drops the kernel's cached attributes of `node` (not its pages).
    /// Sent from inside a request is safe for attributes: the kernel takes
    /// no page or inode lock for them.
    fn forget_cached_attrs(&self, node: u64) {
        if let Some(d) = self.dev.get() {
            if let Err(e) = d.notify_inval_inode(node, -1, 0) {
                log::warn!("cannot invalidate the attributes of node {node}: {e}");
            }
        }
    }

    fn ino(&self, node: u64) -> Ino {
        self.ids.to_fs(node)
    }

    /// `a` as the kernel takes it; `st_ino` is what stat reports.
    fn attr(&self, a: Attr, st_ino: u64) -> abi::Attr {
        fuse_attr(a, st_ino, &self.cfg.overrides)
    }

    /// A LOOKUP-style reply for `a` (the kernel now holds it): the node id
    /// the kernel knows it by, and its own number for `st_ino`.
    fn entry(&self, a: Attr) -> abi::EntryOut {
        let node = self.ids.to_fuse(a.ino);
        entry_out(node, self.attr(a, a.ino), self.cfg.ttl)
    }

    fn reply_entry(&self, r: vfs::Result<Attr>, reply: Reply<'_>) {
        match r {
            Ok(a) => reply.record(&self.entry(a)),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn reply_empty(&self, r: vfs::Result<()>, reply: Reply<'_>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    /// Every change is refused on a read-only mount.
    fn writable<'r>(&self, reply: Reply<'r>) -> Option<Reply<'r>> {
        if self.cfg.read_only {
            reply.error(libc::EROFS);
            None
        } else {
            Some(reply)
        }
    }
}

impl Handler for Server {
    fn init(&self, offered: u64, _init: &InitIn) -> Init {
        // The kernel's READDIRPLUS_AUTO rule: a listing's first reply has
        // attributes, and a later one only if a lookup in the directory
        // came between the two. A lister that reads a whole directory
        // before it stats anything (find, ls, fts) then gets plain entries
        // past the first reply, a fifth of the bytes of READDIRPLUS ones,
        // so five times as many a reply. What it stats costs a LOOKUP
        // each either way: the listing cannot know it will, so it sends
        // such entries lean (see `lean.rs`).
        let mut want = init::ASYNC_READ
            | init::DO_READDIRPLUS
            | init::READDIRPLUS_AUTO
            | init::PARALLEL_DIROPS
            | init::MAX_PAGES;
        if self.cfg.read_only {
            want |= init::CACHE_SYMLINKS;
        } else {
            want |= init::BIG_WRITES;
            // Without the writeback cache every write(2) reaches the file
            // system before it returns, so a full ramfs refuses the write
            // itself and nothing the caller was told is written can be lost.
            if self.cfg.writeback {
                want |= init::WRITEBACK_CACHE;
            }
            // The server drops set-user-ID itself where the kernel says a
            // caller without CAP_FSETID wrote, truncated or chowned (the
            // KILL_SUIDGID bits of WRITE, SETATTR and OPEN). The kernel
            // then marks inodes it found no privilege on (S_NOSEC) and
            // stops asking for their security.capability before every
            // write (a GETXATTR round trip each) and for their mode
            // before a chown (a GETATTR).
            want |= init::HANDLE_KILLPRIV_V2;
        }
        // Passthrough needs the kernel to offer it, a stack depth, and no
        // writeback cache (the kernel would keep passthrough off).
        let passthrough = self
            .cfg
            .passthrough
            .as_ref()
            .filter(|_| !self.cfg.writeback && offered & init::PASSTHROUGH != 0);
        if passthrough.is_some() {
            want |= init::PASSTHROUGH;
        }
        if self.cfg.io_uring {
            want |= init::OVER_IO_URING;
        }
        let taken = want & offered;
        let _ = self.agreed.set(taken);
        if let Some(p) = passthrough {
            p.grant();
            // A restarted server's file system may hold registrations the
            // dead one made.
            if let Some(dev) = self.dev_slot().get() {
                p.seed(dev, self.fs.backings());
            }
        }
        Init {
            flags: want,
            // The largest readahead the kernel offered (it may only be
            // lowered here; the mount's bdi is raised after mounting).
            max_readahead: u32::MAX,
            max_pages: max_pages(),
            max_background: 128,
            congestion_threshold: 96,
            // 1: the backing files are on a tmpfs, which stacks on nothing.
            max_stack_depth: 1,
        }
    }

    fn handle(&self, req: Request<'_>, reply: Reply<'_>) {
        self.dispatch(req, reply);
    }

    fn destroy(&self) {
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
}
