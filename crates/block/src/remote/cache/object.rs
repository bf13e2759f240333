//! One object's files in this process: reading a chunk, storing one, and
//! the read-ahead hint.
//!
//! A chunk is stored in `data` at once and read from there by this
//! process at once; it enters the map only once it is durable (see
//! `commit.rs`). Adding a chunk needs no lock: every process writes the
//! same bytes for one version, and a miss reads the map entry again to
//! find what another one stored.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, Weak};

use super::map::{entry_at, now_stamp, PENDING};
use super::DiskCache;

/// A chunk in use has its entry renewed at most this often (seconds).
const TOUCH_EVERY: u32 = 30;

/// One object's files, shared with the process's other caches so that
/// their eviction can free its chunks too.
pub(super) struct Object {
    pub(super) dir: PathBuf,
    pub(super) size: u64,
    pub(super) chunk: u64,
    pub(super) data: File,
    /// Holds this process's read lock on the object.
    pub(super) map: File,
    /// Per chunk: 0 not held, [`PENDING`], or the last use as in the map.
    pub(super) stamps: Vec<AtomicU32>,
    /// Readers and writers of `data` share it; freeing chunks takes it
    /// alone, so no reader of this process meets a hole.
    pub(super) gate: RwLock<()>,
    /// Set while one eviction of this process holds the write lock.
    pub(super) freeing: AtomicBool,
}

/// The objects this process has open, by version directory.
pub(super) fn open_objects() -> &'static Mutex<HashMap<PathBuf, Weak<Object>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Object>>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

impl Object {
    /// The chunk's use as the map says now: another process may have
    /// stored it since this one looked.
    pub(super) fn stamp_on_disk(&self, index: u64) -> u32 {
        let mut e = [0u8; 4];
        match self.map.read_exact_at(&mut e, entry_at(index)) {
            Ok(()) => u32::from_le_bytes(e),
            Err(_) => 0,
        }
    }

    /// Forgets chunk `index`, found damaged; clearing an entry needs no
    /// lock (only punching does).
    fn forget(&self, index: u64) {
        self.stamps[index as usize].store(0, Ordering::Relaxed);
        let _ = self.map.write_all_at(&0u32.to_le_bytes(), entry_at(index));
        log::debug!(
            "{}: chunk {index} damaged in the cache, fetched again",
            self.dir.display()
        );
    }

    /// Whether the cache holds chunk `index` for reading, adopting what
    /// another process stored.
    fn held(&self, index: u64) -> bool {
        let slot = &self.stamps[index as usize];
        if slot.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let on_disk = self.stamp_on_disk(index);
        on_disk > PENDING && {
            let _ = slot.compare_exchange(0, on_disk, Ordering::Relaxed, Ordering::Relaxed);
            true
        }
    }
}

impl DiskCache {
    /// Whether this process holds chunk `index`: read from the disk, or
    /// stored and readable here (another process's chunks are found by
    /// [`DiskCache::read`]).
    pub fn holds(&self, index: u64) -> bool {
        self.obj.stamps[index as usize].load(Ordering::Relaxed) != 0
    }

    /// Copies `out.len()` bytes from `within` of chunk `index` into `out`;
    /// false when the cache does not hold it whole (then it is forgotten).
    pub fn read(&self, index: u64, within: usize, out: &mut [u8]) -> bool {
        let o = &*self.obj;
        if !o.held(index) {
            return false;
        }
        let _shared = o.gate.read().unwrap();
        let slot = &o.stamps[index as usize];
        let stamp = slot.load(Ordering::Relaxed);
        if stamp == 0 {
            // Freed by this process between the look and the gate.
            return false;
        }
        if o.data
            .read_exact_at(out, index * o.chunk + within as u64)
            .is_err()
        {
            o.forget(index);
            return false;
        }
        if stamp > PENDING {
            let now = now_stamp();
            if now.saturating_sub(stamp) >= TOUCH_EVERY
                && slot
                    .compare_exchange(stamp, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                let _ = o.map.write_all_at(&now.to_le_bytes(), entry_at(index));
            }
        }
        true
    }

    /// Has the kernel start reading `[offset, offset + len)` of the object
    /// in, which lies in chunk `index`, if the cache holds it (a read-ahead
    /// hint, as on a local image: no more than was asked).
    pub fn will_need(&self, index: u64, offset: u64, len: u64) {
        let o = &*self.obj;
        if !o.held(index) {
            return;
        }
        // SAFETY: posix_fadvise only reads the descriptor, which `data`
        // keeps open for the call; it touches no memory of this process.
        unsafe {
            libc::posix_fadvise(
                o.data.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    /// Writes chunk `index`, readable by this process at once;
    /// [`DiskCache::commit_next`] makes it durable and enters it in the
    /// map, and evicts to make room. A failure to write only costs a later
    /// fetch, so it is logged, not returned.
    pub fn store(&self, index: u64, bytes: &[u8]) {
        let o = &*self.obj;
        {
            let _shared = o.gate.read().unwrap();
            if let Err(e) = o.data.write_all_at(bytes, index * o.chunk) {
                log::debug!("{}: chunk {index} not cached: {e}", o.dir.display());
                return;
            }
            let _ = o.stamps[index as usize].compare_exchange(
                0,
                PENDING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        self.queue_commit(index);
        let n = bytes.len() as u64;
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        let since = self.since_scan.fetch_add(n, Ordering::Relaxed) + n;
        if used > self.limit || since >= self.limit / 8 {
            self.evict();
        }
    }
}
