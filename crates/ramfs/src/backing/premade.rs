//! Backing files made ahead of the creates that need them.
//!
//! Making a file on the pool (a name in a tmpfs directory, an inode, an
//! open file) costs more than the rest of a ramfs create together, and a
//! create waits on it. A thread of its own keeps a few files made and open,
//! so a create takes one and hands its descriptor straight to the kernel
//! (passthrough), with no syscall of its own. The thread runs under
//! `SCHED_IDLE`: it fills the queue in time a caller leaves idle (the CPU
//! of a caller waiting on its request), and any other thread preempts it.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rustix::fs::{Mode, OFlags};

/// Files kept made. Each holds a descriptor until it is taken, so the
/// queue is short; a burst past it makes files on the caller's thread.
const KEPT: usize = 64;
/// Below this many the thread is woken to make more.
const LOW: usize = KEPT / 2;

/// A file made on the pool: its name and its open descriptor.
pub(super) type Made = (String, File);

#[derive(Debug, Default)]
struct Queue {
    files: VecDeque<Made>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    root: Arc<OwnedFd>,
    next: AtomicU64,
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new empty file, made and opened in one call (`O_CREAT|O_EXCL`).
    /// A name taken already (by a server before this one) is passed over.
    fn make(&self) -> io::Result<Made> {
        let mut tries = 0;
        loop {
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            let name = format!("{id:x}");
            match rustix::fs::openat(
                &*self.root,
                name.as_str(),
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => return Ok((name, File::from(fd))),
                Err(rustix::io::Errno::EXIST) if tries < 1000 => tries += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The queue of made files and the thread that fills it.
#[derive(Debug)]
pub(super) struct Premade {
    shared: Arc<Shared>,
    maker: Option<JoinHandle<()>>,
}

impl Premade {
    /// Starts the maker for files in `root`, named from `first` on. Where
    /// no thread can be started, every file is made on the caller's
    /// thread.
    pub fn new(root: Arc<OwnedFd>, first: u64) -> Premade {
        let shared = Arc::new(Shared {
            root,
            next: AtomicU64::new(first),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let maker = std::thread::Builder::new()
            .name("foliofs-ramfs-make".into())
            .spawn(move || fill(&s))
            .map_err(|e| log::warn!("ramfs: no thread to make backing files ahead: {e}"))
            .ok();
        Premade { shared, maker }
    }

    /// A made file: one from the queue, or one made now where it is empty.
    pub fn take(&self) -> io::Result<Made> {
        let taken = {
            let mut q = self.shared.lock();
            let f = q.files.pop_front();
            if q.files.len() < LOW {
                self.shared.wake.notify_one();
            }
            f
        };
        match taken {
            Some(f) => Ok(f),
            None => self.shared.make(),
        }
    }

    /// Files waiting in the queue now.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.shared.lock().files.len()
    }
}

impl Drop for Premade {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.maker.take() {
            let _ = t.join();
        }
        // The queued files' names go with the pool's detached mount.
    }
}

fn fill(s: &Shared) {
    idle_priority();
    let mut q = s.lock();
    loop {
        if q.stop {
            return;
        }
        if q.files.len() >= LOW {
            q = s.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        while q.files.len() < KEPT && !q.stop {
            drop(q);
            let made = s.make();
            q = s.lock();
            match made {
                Ok(f) => q.files.push_back(f),
                Err(e) => {
                    // A create then makes its own file and reports the
                    // error itself; try again when next woken.
                    log::debug!("ramfs: cannot make a backing file ahead: {e}");
                    break;
                }
            }
        }
        if !q.stop {
            q = s.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Puts the calling thread under `SCHED_IDLE`, so it only takes CPU time
/// no other thread wants.
fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0
    // names the calling thread, and the call changes nothing else.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        log::debug!(
            "ramfs: the backing-file maker keeps its priority: {}",
            io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foliofs_testkit::wait_until;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn files_are_made_ahead_refilled_after_takes_and_each_is_new_and_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = rustix::fs::open(
            dir.path(),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let premade = Premade::new(Arc::new(root), 0);
        wait_until("the queue to fill", WAIT, || premade.kept() == KEPT);
        // More than the queue holds: the rest are made on this thread or
        // by the refill.
        let mut names = std::collections::HashSet::new();
        for _ in 0..KEPT + 10 {
            let (name, file) = premade.take().unwrap();
            assert_eq!(file.metadata().unwrap().len(), 0);
            let on_disk = std::fs::metadata(dir.path().join(&name)).unwrap();
            assert_eq!(
                std::os::unix::fs::MetadataExt::ino(&on_disk),
                std::os::unix::fs::MetadataExt::ino(&file.metadata().unwrap()),
                "{name} is the file taken"
            );
            assert!(names.insert(name), "a name given twice");
        }
        wait_until("the refill", WAIT, || premade.kept() == KEPT);
        let on_disk = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(on_disk, KEPT + 10 + KEPT);
        // Dropping it stops the maker (the join returns).
        drop(premade);
    }
}
