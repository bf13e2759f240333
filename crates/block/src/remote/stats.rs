//! Process-wide counters of remote reads (one mount is one process, so
//! these are the mount's).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What remote images have cost so far in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Bytes handed to readers.
    pub bytes_read: u64,
    /// Bytes received from the backend (chunk bodies).
    pub bytes_fetched: u64,
    /// Chunks read from the disk cache.
    pub cache_hits: u64,
    /// Chunks a reader needed that were not in the cache.
    pub cache_misses: u64,
    /// Cached chunks whose bytes did not match their checksums: dropped
    /// and fetched again.
    pub cache_corrupt: u64,
    /// Fetched ranges whose bytes did not match the object's digest:
    /// dropped and fetched again.
    pub fetch_corrupt: u64,
    /// Fetches that failed for good (after their retries).
    pub fetch_errors: u64,
    /// Requests sent again after a transient failure.
    pub retries: u64,
    /// Fetches asked of the backend (a run of chunks is one), retries
    /// included.
    pub requests: u64,
}

impl std::fmt::Display for RemoteStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "read {} B, fetched {} B, cache hits {}, misses {}, corrupt {}, fetch corrupt {}, fetch errors {}, retries {}, requests {}",
            self.bytes_read,
            self.bytes_fetched,
            self.cache_hits,
            self.cache_misses,
            self.cache_corrupt,
            self.fetch_corrupt,
            self.fetch_errors,
            self.retries,
            self.requests
        )
    }
}

/// One counter of [`RemoteStats`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stat {
    BytesRead,
    BytesFetched,
    CacheHits,
    CacheMisses,
    CacheCorrupt,
    FetchCorrupt,
    FetchErrors,
    Retries,
    Requests,
}

/// A set of counters: one per process ([`stats`]) and one per object
/// (what tests look at, since tests share the process).
#[derive(Debug, Default)]
pub(crate) struct Counters([AtomicU64; 9]);

impl Counters {
    pub(crate) const fn new() -> Counters {
        Counters([const { AtomicU64::new(0) }; 9])
    }

    /// Adds `n` to `stat` here and in the process's counters.
    pub(crate) fn add(&self, stat: Stat, n: u64) {
        self.0[stat as usize].fetch_add(n, Relaxed);
        if !std::ptr::eq(self, &GLOBAL) {
            GLOBAL.0[stat as usize].fetch_add(n, Relaxed);
        }
    }

    pub(crate) fn snapshot(&self) -> RemoteStats {
        let get = |s: Stat| self.0[s as usize].load(Relaxed);
        RemoteStats {
            bytes_read: get(Stat::BytesRead),
            bytes_fetched: get(Stat::BytesFetched),
            cache_hits: get(Stat::CacheHits),
            cache_misses: get(Stat::CacheMisses),
            cache_corrupt: get(Stat::CacheCorrupt),
            fetch_corrupt: get(Stat::FetchCorrupt),
            fetch_errors: get(Stat::FetchErrors),
            retries: get(Stat::Retries),
            requests: get(Stat::Requests),
        }
    }
}

static GLOBAL: Counters = Counters::new();

/// The counters of every remote image this process has read.
pub fn stats() -> RemoteStats {
    GLOBAL.snapshot()
}
