//! What waking a thread costs on this host: a pipe ping-pong between two
//! threads, both on one CPU and on two. A FUSE round trip over `/dev/fuse`
//! is two such wake-ups (the server's, then the caller's), and across CPUs
//! on a virtual machine each is an inter-processor interrupt and possibly
//! a halted virtual CPU the host must bring back; on one CPU it is a
//! context switch. The same machine kind has measured 5.5 µs on one CPU
//! and 118 µs across, so the bench records it beside the figures it
//! explains.
//!
//! The ping-pong is the server's own (`foliofs_fuse::server::spin`, which
//! measures whether polling pays with it), asleep in `read(2)` as a
//! server thread is between requests.

use foliofs_fuse::server::spin::ping_pong;
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
            same_cpu_us: ping_pong(0, 0, false, TRIPS),
            cross_cpu_us: (cpus > 1).then(|| ping_pong(0, 1, false, TRIPS)).flatten(),
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
