//! Making stored chunks durable before the map names them.
//!
//! A stored chunk is written to `data` at once, and this process reads it
//! from there at once. A thread of its own then makes it durable
//! (`fdatasync` of `data` and `sums`) and only after that writes its map entry: whatever a
//! crash or a power loss interrupts has no entry, is never served, and its
//! blocks are freed by the next open that has the object to itself.

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::map::{entry_at, now_stamp, PENDING};
use super::DiskCache;

/// Chunks stored but not yet durable and in the map.
#[derive(Default)]
pub(super) struct Pending {
    /// Waiting for a committer, oldest first.
    queued: VecDeque<u64>,
    /// The chunks in `queued`: one stored twice waits once.
    listed: HashSet<u64>,
    /// Taken by a committer and not yet in the map.
    committing: usize,
    /// Fetched and already handed to readers, not yet stored: `settle`
    /// waits for these too, or a chunk a reader just got could miss it.
    arriving: usize,
}

/// A chunk on its way into the cache, counted by [`DiskCache::settle`]
/// from before its readers are answered until it is stored.
pub struct Arriving<'a>(&'a DiskCache);

impl Arriving<'_> {
    /// Stores the chunk (see [`DiskCache::store`]).
    pub fn store(self, index: u64, bytes: &[u8]) {
        self.0.store(index, bytes);
    }
}

impl Drop for Arriving<'_> {
    fn drop(&mut self) {
        self.0.pending.lock().unwrap().arriving -= 1;
        self.0.pending_changed.notify_all();
    }
}

impl DiskCache {
    /// Announces a chunk that will be stored once its readers have it.
    pub fn arriving(&self) -> Arriving<'_> {
        self.pending.lock().unwrap().arriving += 1;
        Arriving(self)
    }

    /// Queues stored chunk `index` for [`DiskCache::commit_next`].
    pub(super) fn queue_commit(&self, index: u64) {
        let mut p = self.pending.lock().unwrap();
        if p.listed.insert(index) {
            p.queued.push_back(index);
        }
        drop(p);
        self.pending_changed.notify_all();
    }

    /// Makes the stored chunks durable (one `fdatasync` for all that are
    /// waiting) and only then enters them in the map, so the map never
    /// names a half-written chunk, whatever the crash; then evicts if the
    /// directory is over its limit. Waits up to `wait` for a chunk; false
    /// when none came.
    pub fn commit_next(&self, wait: Duration) -> bool {
        let o = &*self.obj;
        let batch: Vec<u64> = {
            let mut p = self.pending.lock().unwrap();
            if p.queued.is_empty() && !wait.is_zero() {
                p = self.pending_changed.wait_timeout(p, wait).unwrap().0;
            }
            if p.queued.is_empty() {
                return false;
            }
            let batch: Vec<u64> = p.queued.drain(..).collect();
            for i in &batch {
                p.listed.remove(i);
            }
            p.committing += batch.len();
            batch
        };
        let synced = o.data.sync_data().and_then(|()| o.sums.sync_data());
        if let Err(e) = &synced {
            // This process still reads them from the page cache; the
            // next one fetches them again.
            log::debug!("{}: chunks not cached: {e}", o.dir.display());
        }
        let now = now_stamp();
        for &i in &batch {
            let entered = synced.is_ok()
                && o.stamps[i as usize]
                    .compare_exchange(PENDING, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok();
            if entered {
                let _ = o.map.write_all_at(&now.to_le_bytes(), entry_at(i));
            }
        }
        let mut p = self.pending.lock().unwrap();
        p.committing -= batch.len();
        drop(p);
        self.pending_changed.notify_all();
        // Bytes stored while these were pending could not be evicted then.
        if self.used.load(Ordering::Relaxed) > self.limit {
            self.evict();
        }
        true
    }

    /// Commits every stored chunk (this thread helps), waiting at most
    /// `within`; true when none is left.
    pub fn settle(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && self.commit_next(Duration::ZERO) {}
        let mut p = self.pending.lock().unwrap();
        while !p.queued.is_empty() || p.committing > 0 || p.arriving > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = self.pending_changed.wait_timeout(p, left).unwrap().0;
        }
        true
    }
}
