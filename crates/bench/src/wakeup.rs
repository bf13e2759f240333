//! What waking a thread costs on this host: a pipe ping-pong between two
//! threads, both on one CPU and on two. A FUSE round trip over `/dev/fuse`
//! is two such wake-ups (the server's, then the caller's), and across CPUs
//! on a virtual machine each is an inter-processor interrupt and possibly
//! a halted virtual CPU the host must bring back; on one CPU it is a
//! context switch. The same machine kind has measured 5.5 µs on one CPU
//! and 118 µs across, so the bench records it beside the figures it
//! explains.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde::Serialize;

/// Round trips per measurement (after a warm-up of a tenth as many).
const TRIPS: u32 = 2000;

/// Microseconds per round trip.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Wakeup {
    /// Both threads on CPU 0.
    pub same_cpu_us: Option<f64>,
    /// The two threads on CPUs 0 and 1 (none with one CPU).
    pub cross_cpu_us: Option<f64>,
}

impl Wakeup {
    /// Measures both (a few tenths of a second at most).
    pub fn measure() -> Wakeup {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Wakeup {
            same_cpu_us: ping_pong(0, 0),
            cross_cpu_us: (cpus > 1).then(|| ping_pong(0, 1)).flatten(),
        }
    }

    /// One line for the notes.
    pub fn describe(&self) -> String {
        let f = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1} µs"));
        format!(
            "waking a thread on this host (a pipe ping-pong round trip): {} on one CPU, {} across two",
            f(self.same_cpu_us),
            f(self.cross_cpu_us)
        )
    }
}

fn pin(cpu: usize) -> bool {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

/// µs per round trip between a thread on `a` and one on `b` (both new
/// threads: the caller's own affinity stays as it was).
fn ping_pong(a: usize, b: usize) -> Option<f64> {
    let (mut left, mut right) = UnixStream::pair().ok()?;
    let echo = std::thread::spawn(move || -> Option<()> {
        if !pin(b) {
            return None;
        }
        let mut byte = [0u8; 1];
        for _ in 0..TRIPS + TRIPS / 10 {
            right.read_exact(&mut byte).ok()?;
            right.write_all(&byte).ok()?;
        }
        Some(())
    });
    let ping = std::thread::spawn(move || -> Option<f64> {
        let pinned = pin(a);
        let mut byte = [7u8; 1];
        let mut start = Instant::now();
        for i in 0..TRIPS + TRIPS / 10 {
            if i == TRIPS / 10 {
                start = Instant::now();
            }
            left.write_all(&byte).ok()?;
            left.read_exact(&mut byte).ok()?;
        }
        pinned.then(|| start.elapsed().as_secs_f64() * 1e6 / f64::from(TRIPS))
    });
    let result = ping.join().ok()?;
    echo.join().ok()??;
    result
}
