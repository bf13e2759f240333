//! Pushing file data into the kernel's page cache before it is asked for
//! (`FUSE_NOTIFY_STORE`), so a cold read of a small file costs its LOOKUP
//! and no READ.
//!
//! Request handlers only queue "the kernel now holds inode N" (never
//! blocking: a full queue drops the hint); one thread of its own reads the
//! data and sends the stores. That keeps a store out of any request's path:
//! a store waits on page locks a reader may hold while it waits for a READ
//! that only a free server thread can answer. A store for an inode the
//! kernel does not hold is dropped by the kernel (which says so: the rest
//! of that file is not sent), so a hint is queued only after the reply that gives the kernel
//! the inode (LOOKUP, READDIRPLUS) has been written.
//!
//! Pages stay only because an image mount answers `open` with `ENOSYS`,
//! which keeps each file's page cache across opens; writable mounts never
//! push.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use foliofs_vfs::{FileSystem, Ino, Scratch};

use super::ids::IdMap;
use super::profile::{Preload, Profile};
use crate::records::RequestCounts;

/// Largest file pushed whole without a profile: most of a program's files
/// (scripts, configuration, small libraries) are below it, and the kernel
/// reads a file up to 1 MiB in one READ anyway, so past this size a push
/// saves no more round trips than it did for a smaller file, only copies.
pub const PUSH_FILE_MAX: u64 = 128 << 10;

/// Default of `push=`: the bytes one mount may push into the kernel over
/// its life (whole pages counted).
pub const DEFAULT_PUSH_BUDGET: u64 = 256 << 20;

/// Most bytes one store carries: the kernel copies a store into its pages
/// in one go, and the pusher holds at most this much read and not sent.
const STORE_MAX: u64 = 1 << 20;

/// Hints waiting for the pusher; more are dropped (a READ then does the
/// work, as without pushing).
const QUEUE: usize = 4096;

/// How long after the reply a hint waits before its store goes out. The
/// reply wakes the requesting task, which only then makes the inode; a
/// store that overtakes it is dropped by the kernel.
const SETTLE: Duration = Duration::from_micros(50);

/// A page: what the kernel keeps per pushed piece, and what the budget counts.
const PAGE: u64 = 4096;

/// Bits of the "a reader asked for it already" filter.
const READ_BITS: usize = 1 << 16;

/// Which inodes the kernel has sent a READ for: the pusher skips those,
/// since the reader got there first, and moves on to files it has not
/// reached yet. A fixed set of bits indexed by a hash of the inode, shared
/// without a lock; a false hit only costs a push not made.
struct ReadFilter(Box<[AtomicU64]>);

impl ReadFilter {
    fn new() -> ReadFilter {
        ReadFilter((0..READ_BITS / 64).map(|_| AtomicU64::new(0)).collect())
    }

    fn bit(ino: Ino) -> (usize, u64) {
        let h = ino.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48;
        let i = h as usize % READ_BITS;
        (i / 64, 1 << (i % 64))
    }

    fn set(&self, ino: Ino) {
        let (w, b) = ReadFilter::bit(ino);
        if self.0[w].load(Ordering::Relaxed) & b == 0 {
            self.0[w].fetch_or(b, Ordering::Relaxed);
        }
    }

    fn get(&self, ino: Ino) -> bool {
        let (w, b) = ReadFilter::bit(ino);
        self.0[w].load(Ordering::Relaxed) & b != 0
    }
}

/// One inode the kernel has just been told of.
struct Known {
    ino: Ino,
    at: Instant,
}

/// How recent the last READ must be for a file the kernel was just given
/// to be pushed (see [`Pusher::offer`]).
const READING: Duration = Duration::from_secs(1);

/// The handlers' end: queues hints for the pusher thread.
pub(crate) struct Pusher {
    tx: SyncSender<Known>,
    /// Set once the budget is spent: handlers stop queueing.
    spent: Arc<AtomicBool>,
    profile: Option<Arc<Profile>>,
    read: Arc<ReadFilter>,
    /// When the kernel last sent a READ, in milliseconds after `epoch`
    /// (0: never).
    last_read: AtomicU64,
    epoch: Instant,
}

/// What the pusher thread works with.
pub(crate) struct PushSetup {
    pub fs: Arc<dyn FileSystem>,
    pub ids: IdMap,
    pub dev: Arc<OnceLock<Arc<crate::kernel::Dev>>>,
    pub budget: u64,
    pub profile: Option<Arc<Profile>>,
    pub counts: Arc<RequestCounts>,
    /// Files read at once (each by a pusher thread of its own). More than
    /// one pays where a read waits for the device (direct I/O), whose queue
    /// serves several while the reader waits for one: the pushers then keep
    /// ahead of it. A profile's preload stays on one thread.
    pub readers: usize,
}

impl Pusher {
    /// Starts the pusher thread (`None` if it cannot be started; the mount
    /// then works without pushing).
    pub(crate) fn start(setup: PushSetup) -> Option<Pusher> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let spent = Arc::new(AtomicBool::new(false));
        let profile = setup.profile.clone();
        let read = Arc::new(ReadFilter::new());
        let readers = if profile.is_some() {
            1
        } else {
            setup.readers.max(1)
        };
        let shared = Arc::new(Shared {
            read: read.clone(),
            state: Mutex::new(Budget {
                left: setup.budget,
                done: HashSet::new(),
            }),
            setup,
            spent: spent.clone(),
            rx: Mutex::new(rx),
        });
        for i in 0..readers {
            let worker = Worker {
                preload: (i == 0)
                    .then(|| profile.as_ref().map(|p| Preload::new(p.clone())))
                    .flatten(),
                shared: shared.clone(),
                scratch: Scratch::new(),
            };
            let started = std::thread::Builder::new()
                .name("foliofs-push".into())
                .spawn(move || worker.run())
                .map_err(|e| log::warn!("cannot start a pusher thread: {e}"));
            if started.is_err() && i == 0 {
                return None;
            }
        }
        Some(Pusher {
            tx,
            spent,
            profile,
            read,
            last_read: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// The kernel asked for data of `ino`: a reader is there already.
    pub(crate) fn reading(&self, ino: Ino) {
        self.read.set(ino);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        if self.last_read.load(Ordering::Relaxed) != now {
            self.last_read.store(now, Ordering::Relaxed);
        }
    }

    /// The reply giving the kernel `ino` (a LOOKUP's or a listing's) has
    /// been sent: queues it for the pusher while the mount is being read (a
    /// READ within [`READING`]), or when the profile says it will be read.
    /// A lookup or a listing alone says nothing of reading: `find -ls`,
    /// `du`, `ls -lR` and `git status` list or stat whole trees and read no
    /// file, and pushing at them read up to the budget of file data from
    /// the disk for nobody.
    pub(crate) fn offer(&self, ino: Ino) {
        let profiled = self.profile.as_ref().is_some_and(|p| p.contains(ino));
        let last = self.last_read.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let reading = last != 0 && now.saturating_sub(last) <= READING.as_millis() as u64;
        if profiled || reading {
            self.queue(ino);
        }
    }

    /// Whether a regular file of `size` bytes is worth a hint.
    pub(crate) fn wants(&self, ino: Ino, size: u64) -> bool {
        if self.spent.load(Ordering::Relaxed) || size == 0 {
            return false;
        }
        match &self.profile {
            Some(p) if p.contains(ino) => true,
            _ => size <= PUSH_FILE_MAX,
        }
    }

    fn queue(&self, ino: Ino) {
        let k = Known {
            ino,
            at: Instant::now(),
        };
        match self.tx.try_send(k) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => self.spent.store(true, Ordering::Relaxed),
        }
    }
}

/// What the pusher threads share.
struct Shared {
    setup: PushSetup,
    spent: Arc<AtomicBool>,
    read: Arc<ReadFilter>,
    state: Mutex<Budget>,
    rx: Mutex<Receiver<Known>>,
}

struct Budget {
    /// Bytes (whole pages) the mount may still push.
    left: u64,
    /// Inodes pushed already: the kernel keeps their pages.
    done: HashSet<Ino>,
}

impl Shared {
    /// Takes `cost` bytes from the budget; false, and the budget spent,
    /// when it does not hold them.
    fn take(&self, cost: u64) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if cost > st.left {
            st.left = 0;
            self.spent.store(true, Ordering::Relaxed);
            log::debug!("push budget spent");
            return false;
        }
        st.left -= cost;
        true
    }

    fn give_back(&self, bytes: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.left += bytes;
    }
}

struct Worker {
    shared: Arc<Shared>,
    preload: Option<Preload>,
    scratch: Scratch,
}

impl Worker {
    fn run(mut self) {
        loop {
            // Reading a profile's data ahead goes on only while no hint
            // waits: a hint means a reader is about to ask.
            let preloading = self.preload.as_ref().is_some_and(|p| !p.finished());
            let k = {
                // One thread waits on the queue at a time; the others wait
                // for their turn here.
                let rx = self.shared.rx.lock().unwrap_or_else(|e| e.into_inner());
                if preloading {
                    match rx.try_recv() {
                        Ok(k) => k,
                        Err(mpsc::TryRecvError::Empty) => {
                            drop(rx);
                            let fs = self.shared.setup.fs.clone();
                            if let Some(p) = self.preload.as_mut() {
                                p.step(&*fs, &mut self.scratch);
                            }
                            continue;
                        }
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                } else {
                    match rx.recv_timeout(Duration::from_secs(3600)) {
                        Ok(k) => k,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            };
            if self.shared.spent.load(Ordering::Relaxed) {
                continue;
            }
            let wait = SETTLE.saturating_sub(k.at.elapsed());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            self.push(k.ino);
        }
    }

    /// Pushes what is worth pushing of `ino`: the profile's ranges, or the
    /// whole file if it is small.
    fn push(&mut self, ino: Ino) {
        let sh = &*self.shared;
        if !sh
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .done
            .insert(ino)
        {
            return;
        }
        // The reader got here first: its READs are on their way, and the
        // files after this one are where a push still saves one.
        if sh.read.get(ino) {
            if let Some(p) = self.preload.as_mut() {
                p.forget(ino);
            }
            return;
        }
        let ranges = match sh.setup.profile.as_ref().and_then(|p| p.ranges(ino)) {
            Some(r) => r.to_vec(),
            None => match sh.setup.fs.getattr(ino) {
                Ok(a) if a.size > 0 && a.size <= PUSH_FILE_MAX => vec![(0, a.size)],
                _ => return,
            },
        };
        let Some(dev) = sh.setup.dev.get() else {
            return;
        };
        let node = sh.setup.ids.to_fuse(ino);
        for (start, len) in ranges {
            let mut off = start;
            let end = start + len;
            while off < end {
                let want = (end - off).min(STORE_MAX);
                let cost = want.div_ceil(PAGE) * PAGE;
                if !sh.take(cost) {
                    return;
                }
                let stashed = self.preload.as_mut().and_then(|p| p.take(ino, off, want));
                let data: &[u8] = match &stashed {
                    Some(d) => d,
                    None => match sh.setup.fs.read(ino, off, want as u32, &mut self.scratch) {
                        Ok(d) => d,
                        Err(e) => {
                            log::debug!("push of inode {ino} at {off}: {e}");
                            sh.give_back(cost);
                            return;
                        }
                    },
                };
                if data.is_empty() {
                    sh.give_back(cost);
                    break;
                }
                let n = data.len() as u64;
                match dev.notify_store(node, off, data) {
                    Ok(true) => {}
                    // The kernel holds no such inode (any more).
                    Ok(false) => {
                        sh.give_back(cost);
                        return;
                    }
                    Err(e) => {
                        log::debug!("store of inode {ino} at {off}: {e}");
                        sh.give_back(cost);
                        return;
                    }
                }
                let used = n.div_ceil(PAGE) * PAGE;
                sh.give_back(cost - used.min(cost));
                sh.setup.counts.pushed(used);
                off += n;
            }
        }
        if let Some(p) = self.preload.as_mut() {
            p.forget(ino);
        }
    }
}
