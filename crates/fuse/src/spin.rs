//! One server thread keeps polling `/dev/fuse` for a moment after each
//! request (`spin=`), so that the next request of a burst finds it awake.
//!
//! A program that creates, stats or reads many small files sends one
//! request after another, a few microseconds apart. A server thread that
//! sleeps between them must be woken for each: on a virtual machine that
//! wake-up is an inter-processor interrupt and a halted virtual CPU brought
//! back by the host, which costs more than the request's own work. A thread
//! that is still polling takes the request without either.
//!
//! The descriptor fuser reads on is switched to non-blocking while requests
//! keep coming: fuser's loop retries a read that finds no request
//! (`EAGAIN`) at once, so the thread polls. A controller thread switches it
//! back once no request has come for the window, and the thread sleeps in
//! its next read as before. Only the session's own descriptor changes; the
//! other threads read on cloned descriptors (separate open files) and keep
//! sleeping, so a mount polls with one thread at most, and only between
//! one window and two after its last request.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Polling after the last request where a mount polls by default: it
/// spans the gaps between the requests of a program working through many
/// files (tens of microseconds) with room to spare, and the controller
/// wakes at most once per window to check.
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// Longest `spin=`, in microseconds.
pub const MAX_SPIN_US: u64 = 10_000;

/// [`DEFAULT_SPIN`], or none on a machine with one CPU, where a polling
/// thread would take the CPU from the very program whose request it waits
/// for.
pub fn default_window() -> Duration {
    match thread::available_parallelism() {
        Ok(n) if n.get() > 1 => DEFAULT_SPIN,
        _ => Duration::ZERO,
    }
}

/// The polling state of one mount.
pub(crate) struct Spin {
    /// A duplicate of the session's descriptor: it shares the open file,
    /// and with it the `O_NONBLOCK` flag of the thread that reads on it.
    fd: OwnedFd,
    window: Duration,
    epoch: Instant,
    /// Microseconds from `epoch` to the latest request.
    last: AtomicU64,
    /// Whether the descriptor is non-blocking (or about to be).
    polling: AtomicBool,
    controller: Thread,
}

impl Spin {
    /// Starts the controller for the session descriptor `fd` (a duplicate
    /// of it) with `window`; `None` when the controller thread cannot start,
    /// and the mount then simply does not poll.
    pub(crate) fn start(fd: OwnedFd, window: Duration) -> Option<Arc<Spin>> {
        let (tx, rx) = std::sync::mpsc::channel::<Weak<Spin>>();
        let handle = thread::Builder::new()
            .name("foliofs-spin".into())
            .spawn(move || {
                if let Ok(weak) = rx.recv() {
                    control(&weak);
                }
            })
            .ok()?;
        let spin = Arc::new(Spin {
            fd,
            window,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            controller: handle.thread().clone(),
        });
        tx.send(Arc::downgrade(&spin)).ok()?;
        Some(spin)
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// A request has come: poll until a window passes without another.
    pub(crate) fn touch(&self) {
        self.last.store(self.now_us(), Ordering::Relaxed);
        if !self.polling.load(Ordering::Relaxed) && !self.polling.swap(true, Ordering::AcqRel) {
            self.set_polling(true);
            self.controller.unpark();
        }
    }

    fn set_polling(&self, on: bool) {
        // A failed fcntl leaves the descriptor as it was: the thread either
        // keeps sleeping between requests (no gain) or keeps polling until
        // the next switch succeeds or the session ends.
        let Ok(bits) = fcntl(&self.fd, FcntlArg::F_GETFL) else {
            return;
        };
        let mut flags = OFlag::from_bits_truncate(bits);
        flags.set(OFlag::O_NONBLOCK, on);
        let _ = fcntl(&self.fd, FcntlArg::F_SETFL(flags));
    }

    fn idle_for(&self) -> Duration {
        Duration::from_micros(
            self.now_us()
                .saturating_sub(self.last.load(Ordering::Relaxed)),
        )
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        // The controller holds no strong reference: woken, it finds the
        // mount gone and ends.
        self.controller.unpark();
    }
}

fn control(weak: &Weak<Spin>) {
    loop {
        thread::park();
        loop {
            let Some(spin) = weak.upgrade() else {
                return;
            };
            if !spin.polling.load(Ordering::Acquire) {
                break;
            }
            let window = spin.window;
            if spin.idle_for() >= window {
                // Blocking first, then the flag: a request that comes in
                // between finds the flag still set and starts nothing, so
                // its burst polls only from the next request on; the other
                // order could leave the flag set on a blocking descriptor,
                // and no request would ever start polling again.
                spin.set_polling(false);
                spin.polling.store(false, Ordering::Release);
                break;
            }
            drop(spin);
            thread::sleep(window);
        }
    }
}

/// Shared between the server, which touches it on every request, and the
/// session, which fills it once the session's descriptor exists.
pub(crate) type SpinSlot = Arc<OnceLock<Arc<Spin>>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn nonblocking(fd: impl AsFd) -> bool {
        let bits = fcntl(fd, FcntlArg::F_GETFL).unwrap();
        OFlag::from_bits_truncate(bits).contains(OFlag::O_NONBLOCK)
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < end, "{what} within 5 s");
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_request_makes_the_descriptor_poll_until_a_quiet_window() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let probe = r.try_clone().unwrap();
        let spin = Spin::start(r, Duration::from_millis(20)).unwrap();
        assert!(!nonblocking(&probe), "blocking before any request");
        spin.touch();
        assert!(nonblocking(&probe), "polling right after a request");
        // Requests closer together than the window keep it polling.
        for _ in 0..10 {
            thread::sleep(Duration::from_millis(5));
            spin.touch();
            assert!(nonblocking(&probe), "still polling while requests come");
        }
        wait_until("blocking again after a quiet window", || {
            !nonblocking(&probe)
        });
        // And a later request starts it again.
        spin.touch();
        assert!(nonblocking(&probe));
        wait_until("blocking again", || !nonblocking(&probe));
    }
}
