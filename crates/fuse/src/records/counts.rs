//! Requests counted by operation: what a workload costs in round trips,
//! which is what decides small-file speed over FUSE. Which operation counts
//! under which name is the operations' table's to say (`kernel/op.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::kernel::{Op, COUNTER_NAMES};

/// One counter per counted operation (see [`Op::counter`]), bumped once
/// per request as it is dispatched. `forget` counts inodes forgotten (a
/// BATCH_FORGET counts each of its inodes); `other` gathers the lock
/// requests, which are refused. INIT, DESTROY, INTERRUPT and what the
/// protocol layer refuses for good (bmap, poll, copy_file_range: ENOSYS)
/// are not counted.
///
/// Relaxed atomic adds: a few nanoseconds beside a round trip of tens of
/// microseconds, so they stay on in every mount. Share it (`Arc`) with
/// whatever publishes the counts while the mount is live.
///
/// Beside the requests it counts what the server sent unasked: data pushed
/// into the kernel's page cache (`FUSE_NOTIFY_STORE`), as stores and as
/// bytes in whole pages (what the kernel holds for them).
#[derive(Debug)]
pub struct RequestCounts {
    counts: [AtomicU64; COUNTER_NAMES.len()],
    pushes: AtomicU64,
    pushed_bytes: AtomicU64,
    resent: AtomicU64,
    next_listings: AtomicU64,
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            pushes: AtomicU64::new(0),
            pushed_bytes: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            next_listings: AtomicU64::new(0),
        }
    }
}

/// The names [`RequestCounts::snapshot`] gives what it counts beside the
/// opcodes: the stores pushed and their bytes, and the requests that came
/// marked as resent (after a server died with them; each is counted by
/// its opcode too), and the READDIR replies sent from a listing built ahead
/// (counted as READDIRs too).
pub const EXTRA_NAMES: [&str; 4] = ["push", "push_bytes", "resent", "listed_ahead"];

impl RequestCounts {
    /// Counts one request of `op` (nothing for an operation not counted).
    pub fn bump(&self, op: Op) {
        self.bump_by(op, 1);
    }

    /// Counts `n` requests of `op` at once (a BATCH_FORGET's inodes).
    pub fn bump_by(&self, op: Op, n: u64) {
        if let Some(i) = op.counter() {
            self.counts[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Requests counted under `op`'s counter so far (0 for an operation
    /// not counted).
    pub fn get(&self, op: Op) -> u64 {
        op.counter()
            .map_or(0, |i| self.counts[i].load(Ordering::Relaxed))
    }

    /// Counts one store of `bytes` (whole pages) pushed into the kernel.
    pub fn pushed(&self, bytes: u64) {
        self.pushes.fetch_add(1, Ordering::Relaxed);
        self.pushed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts one request that came marked as resent.
    pub fn resent(&self) {
        self.resent.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one READDIR answered with a reply built ahead.
    pub fn sent_next_listing(&self) {
        self.next_listings.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores pushed so far, and their bytes in whole pages.
    pub fn pushes(&self) -> (u64, u64) {
        (
            self.pushes.load(Ordering::Relaxed),
            self.pushed_bytes.load(Ordering::Relaxed),
        )
    }

    /// Every counter so far, in [`COUNTER_NAMES`] order (zeros included),
    /// then the counts named [`EXTRA_NAMES`].
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let (n, bytes) = self.pushes();
        let resent = self.resent.load(Ordering::Relaxed);
        COUNTER_NAMES
            .iter()
            .zip(&self.counts)
            .map(|(&name, n)| (name, n.load(Ordering::Relaxed)))
            .chain([
                (EXTRA_NAMES[0], n),
                (EXTRA_NAMES[1], bytes),
                (EXTRA_NAMES[2], resent),
                (EXTRA_NAMES[3], self.next_listings.load(Ordering::Relaxed)),
            ])
            .collect()
    }

    /// All requests so far (pushes are not requests).
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }

    /// The non-zero counts as `name=N name=N ...` (empty when none).
    pub fn summary(&self) -> String {
        self.snapshot()
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(name, n)| format!("{name}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_opcode_apart() {
        let c = RequestCounts::default();
        c.bump(Op::Lookup);
        c.bump(Op::Lookup);
        c.bump(Op::Create);
        c.bump(Op::Setlk);
        c.bump(Op::Init);
        c.bump_by(Op::BatchForget, 0);
        assert_eq!(c.get(Op::Lookup), 2);
        assert_eq!(c.get(Op::Create), 1);
        assert_eq!(c.get(Op::Write), 0);
        assert_eq!(c.total(), 4);
        assert_eq!(c.summary(), "lookup=2 create=1 other=1");
        c.pushed(8192);
        assert_eq!(c.total(), 4);
        assert_eq!(
            c.summary(),
            "lookup=2 create=1 other=1 push=1 push_bytes=8192"
        );
        let snap = c.snapshot();
        assert_eq!(snap.len(), COUNTER_NAMES.len() + EXTRA_NAMES.len());
        assert_eq!(snap[0], ("lookup", 2));
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = COUNTER_NAMES.into_iter().chain(EXTRA_NAMES).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COUNTER_NAMES.len() + EXTRA_NAMES.len());
    }
}
