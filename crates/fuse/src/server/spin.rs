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
//! The descriptor the first server thread reads on is switched to
//! non-blocking while requests keep coming: the thread's loop
//! (`kernel/conn.rs`) retries a read that finds no request
//! (`EAGAIN`) at once, so the thread polls. A controller thread switches it
//! back once no request has come for the window, and the thread sleeps in
//! its next read as before. Only the session's own descriptor changes; the
//! other threads read on cloned descriptors (separate open files) and keep
//! sleeping, so a mount polls with one thread at most, and only between
//! one window and two after its last request.
//!
//! A polling thread pays only while a CPU would otherwise sit idle. When
//! every CPU is wanted (a parallel build, several busy mounts), it takes
//! time from the programs whose requests it waits for: two fsx runs on two
//! ramfs mounts of a 2-core machine took twice as long with both polling.
//! So the controller watches the machine's CPU pressure
//! (`/proc/pressure/cpu`, the share of time some task waited for a CPU)
//! and stops polling for a while once that passes [`PRESSURE_LIMIT`].
//! Without pressure accounting the mount polls as asked.

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

/// [`DEFAULT_SPIN`] where a polling thread answers faster than a sleeping
/// one on this host now (see [`measure`]), else none; none on a machine
/// with one CPU, where a polling thread would take the CPU from the very
/// program whose request it waits for. With the reason, for the logs.
pub fn default_window() -> (Duration, String) {
    match thread::available_parallelism() {
        Ok(n) if n.get() > 1 => {}
        _ => return (Duration::ZERO, "one CPU".into()),
    }
    match measure() {
        Some(m) if m.polling_us < m.sleeping_us * POLL_GAIN => (
            DEFAULT_SPIN,
            format!(
                "a polling thread answered in {:.1} µs, a sleeping one in {:.1} µs",
                m.polling_us, m.sleeping_us
            ),
        ),
        Some(m) => (
            Duration::ZERO,
            format!(
                "a polling thread answered in {:.1} µs, a sleeping one in {:.1} µs: not worth a CPU",
                m.polling_us, m.sleeping_us
            ),
        ),
        None => (Duration::ZERO, "the wake-up could not be measured".into()),
    }
}

/// A polling thread must answer in this share of a sleeping one's time to
/// be worth the CPU it takes: on one host polling took a round trip from
/// 14 µs to 9 µs, on another of the same kind from 21 µs to 34 µs. The
/// ping-pong understates what a workload gains: on a host where it
/// measured 0.66-0.88, creates ran 23% and unlinks 20% faster polling
/// (four interleaved rounds of 20,000 each), so the bar sits above that.
const POLL_GAIN: f64 = 0.9;

/// Round trips per run of one way of answering in [`measure`], after a
/// warm-up.
const TRIPS: u32 = 200;

/// Runs of each way in [`measure`], taking turns: each way's median run
/// counts, not its best, so one lucky run decides nothing. (With the
/// better of two runs each, 4 of 12 mounts on one host chose differently
/// from the other 8.)
const RUNS: usize = 5;

/// What answering costs on this host: µs per round trip of a ping-pong
/// between two threads on different CPUs, with the answering thread
/// asleep in `read(2)` between pings, and with it polling a non-blocking
/// descriptor, as a server thread does between requests.
#[derive(Clone, Copy, Debug)]
pub struct Wakeups {
    /// The answering thread sleeps.
    pub sleeping_us: f64,
    /// The answering thread polls.
    pub polling_us: f64,
}

/// Measures [`Wakeups`] (tens of milliseconds); `None` where the threads
/// cannot be pinned apart or the pipe fails. The two ways take turns,
/// [`RUNS`] runs each, and each way's median run counts, so a passing
/// disturbance favours neither and one slow or fast run decides nothing.
pub fn measure() -> Option<Wakeups> {
    let mut runs: [Vec<f64>; 2] = Default::default();
    for _ in 0..RUNS {
        for (i, poll) in [false, true].into_iter().enumerate() {
            runs[i].push(ping_pong(0, 1, poll, TRIPS)?);
        }
    }
    let [sleeping_us, polling_us] = runs.map(median);
    Some(Wakeups {
        sleeping_us,
        polling_us,
    })
}

/// The middle value of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pin(cpu: usize) -> bool {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

/// µs per round trip of a ping-pong over a socket pair between a thread
/// pinned to CPU `asker` and one pinned to CPU `answerer` (the same CPU
/// or two), the answer polling a non-blocking socket or asleep in
/// `read(2)`: `trips` round trips after a warm-up of a tenth as many.
/// `None` where a thread cannot be pinned or the socket fails. Both
/// threads are new, so no caller's affinity changes. The bench measures
/// a host's wake-up with it too (`crates/bench/src/wakeup.rs`).
pub fn ping_pong(asker: usize, answerer: usize, poll: bool, trips: u32) -> Option<f64> {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let (mut ping, mut pong) = UnixStream::pair().ok()?;
    pong.set_nonblocking(poll).ok()?;
    let total = trips + trips / 10;
    let answer = thread::spawn(move || -> Option<()> {
        if !pin(answerer) {
            return None;
        }
        let mut b = [0u8; 1];
        let deadline = Instant::now() + Duration::from_secs(2);
        for _ in 0..total {
            loop {
                match pong.read(&mut b) {
                    Ok(1) => break,
                    Ok(_) => return None,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return None;
                        }
                        std::hint::spin_loop();
                    }
                    Err(_) => return None,
                }
            }
            pong.write_all(&b).ok()?;
        }
        Some(())
    });
    let asking = thread::spawn(move || -> Option<f64> {
        if !pin(asker) {
            return None;
        }
        ping.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut b = [1u8; 1];
        let mut start = Instant::now();
        for i in 0..total {
            if i == trips / 10 {
                start = Instant::now();
            }
            ping.write_all(&b).ok()?;
            ping.read_exact(&mut b).ok()?;
        }
        Some(start.elapsed().as_secs_f64() * 1e6 / f64::from(trips))
    });
    let r = asking.join().ok()?;
    answer.join().ok()??;
    r
}

/// CPU pressure (share of wall time in which some task was runnable but
/// not running) above which polling stops. One program and its poller on
/// two CPUs leave it near zero.
pub const PRESSURE_LIMIT: f64 = 0.2;

/// How often, at most, the controller reads the pressure while polling.
const PRESSURE_EVERY: Duration = Duration::from_millis(50);

/// How long polling stays off once the pressure stopped it: long enough
/// that a busy machine pays for a sample rarely, short enough that polling
/// comes back soon after the machine quietens.
const HOLD: Duration = Duration::from_secs(1);

/// Microseconds in which some task waited for a CPU, since boot (the
/// `some` line's `total=` of `/proc/pressure/cpu`); `None` without
/// pressure accounting.
pub fn cpu_stall_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    parse_stall_us(&text)
}

fn parse_stall_us(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split(' ')
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The share of wall time, since the last call that returned a share, in
/// which some task waited for a CPU; `None` until [`PRESSURE_EVERY`] has
/// passed (and always without pressure accounting).
struct Pressure {
    source: fn() -> Option<u64>,
    since: Option<(u64, Instant)>,
}

impl Pressure {
    fn new(source: fn() -> Option<u64>) -> Pressure {
        Pressure {
            source,
            since: source().map(|us| (us, Instant::now())),
        }
    }

    fn share(&mut self) -> Option<f64> {
        let (stalled, at) = self.since?;
        let elapsed = at.elapsed();
        if elapsed < PRESSURE_EVERY {
            return None;
        }
        let now = (self.source)();
        self.since = now.map(|us| (us, Instant::now()));
        Some(now?.saturating_sub(stalled) as f64 / elapsed.as_micros().max(1) as f64)
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
    /// Microseconds from `epoch` before which no request starts polling
    /// (set when CPU pressure stopped it).
    held_until: AtomicU64,
    controller: Thread,
}

impl Spin {
    /// Starts the controller for the session descriptor `fd` (a duplicate
    /// of it) with `window`; `None` when the controller thread cannot start,
    /// and the mount then simply does not poll.
    pub(crate) fn start(fd: OwnedFd, window: Duration) -> Option<Arc<Spin>> {
        Spin::start_with(fd, window, cpu_stall_us)
    }

    /// As [`Spin::start`], with the pressure read from `stall_us` (tests
    /// feed their own).
    fn start_with(
        fd: OwnedFd,
        window: Duration,
        stall_us: fn() -> Option<u64>,
    ) -> Option<Arc<Spin>> {
        let (tx, rx) = std::sync::mpsc::channel::<Weak<Spin>>();
        let handle = thread::Builder::new()
            .name("foliofs-spin".into())
            .spawn(move || {
                if let Ok(weak) = rx.recv() {
                    control(&weak, Pressure::new(stall_us));
                }
            })
            .ok()?;
        let spin = Arc::new(Spin {
            fd,
            window,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            held_until: AtomicU64::new(0),
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
        let now = self.now_us();
        self.last.store(now, Ordering::Relaxed);
        if !self.polling.load(Ordering::Relaxed)
            && now >= self.held_until.load(Ordering::Relaxed)
            && !self.polling.swap(true, Ordering::AcqRel)
        {
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

fn control(weak: &Weak<Spin>, mut pressure: Pressure) {
    loop {
        thread::park();
        loop {
            let Some(spin) = weak.upgrade() else {
                return;
            };
            if !spin.polling.load(Ordering::Acquire) {
                break;
            }
            // Measured across stretches of polling, which can be shorter
            // than a sample: the pressure is the machine's, not the mount's.
            let busy = pressure.share().is_some_and(|s| s > PRESSURE_LIMIT);
            if busy {
                let until = spin.now_us() + HOLD.as_micros() as u64;
                spin.held_until.store(until, Ordering::Relaxed);
                log::debug!("CPU pressure above {PRESSURE_LIMIT}: not polling for {HOLD:?}");
            }
            let window = spin.window;
            if busy || spin.idle_for() >= window {
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
        foliofs_testkit::wait_until(what, Duration::from_secs(5), cond);
    }

    #[test]
    fn a_request_makes_the_descriptor_poll_until_a_quiet_window() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let probe = r.try_clone().unwrap();
        // Without pressure accounting, as on a kernel without it.
        let spin = Spin::start_with(r, Duration::from_millis(20), || None).unwrap();
        assert!(!nonblocking(&probe), "blocking before any request");
        spin.touch();
        assert!(nonblocking(&probe), "polling right after a request");
        // Requests closer together than the window keep it polling. A
        // loaded host can stall this thread past the window, which rightly
        // ends the polling (and a request racing the switch back starts
        // nothing, by design): such a gap is no burst, so the check starts
        // over once the switch has settled.
        let (mut kept, mut tries) = (0, 0);
        let mut last = Instant::now();
        while kept < 10 {
            tries += 1;
            assert!(
                tries < 1000,
                "no 10 requests came within 15 ms of each other"
            );
            thread::sleep(Duration::from_millis(5));
            if last.elapsed() >= Duration::from_millis(15) {
                wait_until("the switch back to settle", || {
                    !spin.polling.load(Ordering::Acquire)
                });
                kept = 0;
            } else {
                kept += 1;
            }
            spin.touch();
            last = Instant::now();
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

    #[test]
    fn stall_time_is_the_some_lines_total() {
        let text = "some avg10=1.00 avg60=3.23 avg300=31.39 total=24877380433\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_stall_us(text), Some(24_877_380_433));
        assert_eq!(parse_stall_us("full avg10=0.00 total=5\n"), None);
        assert_eq!(parse_stall_us("some avg10=0.00 total=x\n"), None);
    }

    #[test]
    fn a_held_mount_does_not_start_polling() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let probe = r.try_clone().unwrap();
        let spin = Spin::start_with(r, Duration::from_millis(20), || None).unwrap();
        spin.held_until
            .store(spin.now_us() + 60_000_000, Ordering::Relaxed);
        spin.touch();
        assert!(!nonblocking(&probe), "polling while held");
        spin.held_until.store(0, Ordering::Relaxed);
        spin.touch();
        assert!(nonblocking(&probe), "not polling once the hold ended");
    }

    #[test]
    fn cpu_pressure_stops_polling_and_holds_it() {
        // Tasks waited twice over all the time: the stall clock runs
        // faster than the wall clock.
        fn saturated() -> Option<u64> {
            static START: OnceLock<Instant> = OnceLock::new();
            let us = START.get_or_init(Instant::now).elapsed().as_micros() as u64;
            Some(us * 2)
        }
        let (r, _w) = nix::unistd::pipe().unwrap();
        let probe = r.try_clone().unwrap();
        let spin = Spin::start_with(r, Duration::from_millis(10), saturated).unwrap();
        // Requests keep coming, yet polling stops once the pressure is read.
        let end = Instant::now() + Duration::from_secs(5);
        spin.touch();
        assert!(nonblocking(&probe), "polling right after the first request");
        while nonblocking(&probe) {
            assert!(
                Instant::now() < end,
                "still polling under pressure after 5 s"
            );
            spin.touch();
            thread::sleep(Duration::from_millis(2));
        }
        spin.touch();
        assert!(
            !nonblocking(&probe),
            "a request restarted polling during the hold"
        );
    }

    #[test]
    fn pressure_is_a_share_of_wall_time_once_a_sample_has_passed() {
        let mut p = Pressure::new(|| None);
        assert_eq!(p.share(), None, "no accounting, no share");
        fn none_waited() -> Option<u64> {
            Some(7)
        }
        let mut p = Pressure::new(none_waited);
        assert_eq!(p.share(), None, "too soon");
        thread::sleep(PRESSURE_EVERY);
        assert_eq!(p.share(), Some(0.0));
    }

    #[test]
    fn one_outlying_run_does_not_decide() {
        assert_eq!(median(vec![16.0, 9.0, 40.0, 15.0, 17.0]), 16.0);
        assert_eq!(median(vec![3.0]), 3.0);
    }

    #[test]
    fn waking_is_measured_both_ways() {
        // Needs two CPUs to pin the threads apart.
        if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        let m = measure().expect("a ping-pong between two CPUs");
        for us in [m.sleeping_us, m.polling_us] {
            assert!(us > 0.0 && us < 100_000.0, "{m:?}");
        }
        let (window, why) = default_window();
        assert!(window == DEFAULT_SPIN || window.is_zero(), "{window:?}");
        assert!(why.contains("µs"), "{why}");
    }
}
