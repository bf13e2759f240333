//! Keeping what the file system holds under the memory limits its server
//! runs under (see `limits.rs`), so that a write past them fails with
//! `ENOSPC` instead of the kernel killing the server and every file in it.
//!
//! Failing allocations are not enough: with overcommit an allocation
//! succeeds and the page fault that later fills it is what meets a cgroup's
//! limit, and the kernel's answer to that is the OOM killer. So memory is
//! taken from a grant: at each reading of the limits, the room left under
//! the tightest of them, less a reserve for the server's own working
//! memory, capped at [`STEP`]. Everything charged adds to what the grant
//! has used; frees do not give any back until the next reading, which sees
//! them in the usage itself (after the allocator has returned its free
//! pages). The limits are read again whenever a grant runs out, so at
//! least every [`STEP`] bytes: a limit lowered while mounted is seen
//! within that.
//!
//! Every charge must cost at least the memory it stands for once filled:
//! a data block its capacity and bookkeeping (blocks are faulted in whole
//! when made, `block.rs`), an inode [`INODE_CHARGE`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::limits::{self, Kind, Limit};

/// The most granted at one reading of the limits.
pub(crate) const STEP: u64 = 64 << 20;
/// An inode's share of the server's memory: the node, its table slot, its
/// directory entry and name, rounded up.
pub(crate) const INODE_CHARGE: u64 = 1024;

/// Room kept under each limit for what the server allocates besides file
/// contents (request buffers and scratch space its threads take on their
/// first requests, the allocator's slack): 32 MiB, or a sixteenth of the
/// limit where that is more. Measured under `ulimit -v`, the server's
/// address space grew by 15 MiB past its last reading while refused
/// writes were answered.
pub(crate) fn reserve(limit: u64) -> u64 {
    (32u64 << 20).max(limit / 16)
}

/// Which memory a charge takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Charge {
    /// The server's own memory: counted by its cgroup and its address space.
    Memory,
    /// Pages of the passthrough pool the server writes itself: charged to
    /// its cgroup, but mapped nowhere in it.
    PageCache,
}

#[derive(Debug)]
pub(crate) struct Budget {
    /// Bytes charged since the limits were last read.
    since: AtomicU64,
    /// What `since` may reach for each kind of charge.
    grant_memory: AtomicU64,
    grant_cache: AtomicU64,
    /// Something was freed since the last reading (the allocator then has
    /// pages to give back first).
    freed: AtomicBool,
    /// One reading at a time.
    reading: Mutex<()>,
}

impl Budget {
    pub fn new() -> Budget {
        Budget {
            since: AtomicU64::new(0),
            // Zero: the first charge reads the limits.
            grant_memory: AtomicU64::new(0),
            grant_cache: AtomicU64::new(0),
            freed: AtomicBool::new(false),
            reading: Mutex::new(()),
        }
    }

    fn grant(&self, kind: Charge) -> u64 {
        match kind {
            Charge::Memory => self.grant_memory.load(Ordering::Acquire),
            Charge::PageCache => self.grant_cache.load(Ordering::Acquire),
        }
    }

    fn take_granted(&self, n: u64, kind: Charge) -> bool {
        let grant = self.grant(kind);
        self.since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                s.checked_add(n).filter(|&v| v <= grant)
            })
            .is_ok()
    }

    /// Takes `n` bytes of `kind`; false when the limits leave no room.
    pub fn take(&self, n: u64, kind: Charge) -> bool {
        if n == 0 || self.take_granted(n, kind) {
            return true;
        }
        let _one = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread may have read them while this one waited.
        if self.take_granted(n, kind) {
            return true;
        }
        self.read_limits(n);
        self.take_granted(n, kind)
    }

    /// Notes that memory was freed.
    pub fn freed(&self) {
        self.freed.store(true, Ordering::Relaxed);
    }

    /// Reads the limits and grants what they leave, up to a step (or `need`
    /// where that is more, so one large allocation is not refused for its
    /// size alone).
    fn read_limits(&self, need: u64) {
        if self.freed.swap(false, Ordering::Relaxed) {
            trim_heap();
        }
        // Reset before reading: a charge that lands meanwhile is then
        // counted twice (in the usage and in `since`), never not at all.
        self.since.store(0, Ordering::Release);
        let limits = limits::current();
        crate::block::set_limited(!limits.is_empty());
        if limits.iter().any(|l| l.kind == Kind::AddressSpace) {
            // A limit set after the mount (prlimit): from now on.
            crate::block::set_map_all(true);
        }
        let (memory, cache) = room(&limits);
        log::debug!("memory limits: {limits:?}; room {memory} (page cache {cache})");
        let step = STEP.max(need);
        self.grant_memory.store(memory.min(step), Ordering::Release);
        self.grant_cache.store(cache.min(step), Ordering::Release);
    }
}

/// The room under `limits` for each kind of charge: the memory the server
/// itself holds (the tightest of all), and pool pages (cgroups only).
pub(crate) fn room(limits: &[Limit]) -> (u64, u64) {
    let mut memory = u64::MAX;
    let mut cache = u64::MAX;
    for l in limits {
        let left = l.left().saturating_sub(reserve(l.limit));
        if l.kind == Kind::AddressSpace {
            memory = memory.min(left);
        } else {
            memory = memory.min(left);
            cache = cache.min(left);
        }
    }
    (memory, cache)
}

/// Readies the allocator for the limits in force when the file system is
/// made, before the server's threads start. Under `RLIMIT_AS`, glibc's
/// per-thread arenas would each reserve address space 64 MiB at a time
/// (128 MiB while aligning a new one), far past what one block costs, so
/// every thread shares the main arena, which grows by what it uses; and
/// blocks are mappings of their own (`block::set_map_all`).
pub(crate) fn prepare() {
    let under_as = limits::current()
        .iter()
        .any(|l| l.kind == Kind::AddressSpace);
    #[cfg(target_env = "gnu")]
    if under_as {
        // SAFETY: mallopt only sets the allocator's own tunable.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
    crate::block::set_map_all(under_as);
}

/// Gives the allocator's free pages back to the kernel, so the cgroup's
/// usage shows what freeing files gave back.
fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The limits below `size` bytes, for the mount to name; `backed`: the
/// data is in the passthrough pool, which no address space holds.
pub(crate) fn below(size: u64, backed: bool) -> Vec<Limit> {
    limits::current()
        .into_iter()
        .filter(|l| l.limit < size && !(backed && l.kind == Kind::AddressSpace))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(kind: Kind, limit: u64, used: u64) -> Limit {
        Limit {
            name: "x".into(),
            kind,
            limit,
            used,
        }
    }

    #[test]
    fn room_is_the_tightest_limit_less_its_reserve() {
        const M: u64 = 1 << 20;
        assert_eq!(room(&[]), (u64::MAX, u64::MAX));
        let cg = limit(Kind::Cgroup, 256 * M, 100 * M);
        assert_eq!(room(std::slice::from_ref(&cg)), (124 * M, 124 * M));
        // A large limit keeps a sixteenth of itself.
        let big = limit(Kind::Cgroup, 4096 * M, 1000 * M);
        assert_eq!(room(&[big]).0, 4096 * M - 1000 * M - 256 * M);
        // The address space leaves page cache alone.
        let asp = limit(Kind::AddressSpace, 200 * M, 150 * M);
        assert_eq!(room(&[cg, asp.clone()]), (18 * M, 124 * M));
        // Used past the limit: no room, no wrap.
        let full = limit(Kind::Cgroup, 64 * M, 70 * M);
        assert_eq!(room(&[full, asp]), (0, 0));
    }

    #[test]
    fn a_grant_is_used_up_then_read_again() {
        let b = Budget::new();
        // With no limit in force the grant is a step; charging past it reads
        // the limits again and grants another.
        if limits::current().is_empty() {
            assert!(b.take(STEP, Charge::Memory));
            assert!(b.take(1, Charge::Memory));
            assert_eq!(b.since.load(Ordering::Relaxed), 1);
        }
        if limits::current().is_empty() {
            assert!(
                b.take(3 * STEP, Charge::Memory),
                "a large charge is granted whole"
            );
        }
    }
}
