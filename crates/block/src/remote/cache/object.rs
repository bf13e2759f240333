//! One object's files in this process: reading a chunk (every piece read
//! checked against its sum), storing one, and the read-ahead hint.
//!
//! A chunk is stored in `data` at once and read from there by this
//! process at once; it enters the map only once it is durable (see
//! `commit.rs`). Adding a chunk needs no lock: every process writes the
//! same bytes for one version, and a miss reads the map entry again to
//! find what another one stored.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, Weak};

use super::map::{entry_at, now_stamp, piece_sums, sum_at, PENDING, PIECE};
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
    /// A crc32c per [`PIECE`] of `data`.
    pub(super) sums: File,
    /// Holds this process's read lock on the object.
    pub(super) map: File,
    /// Per chunk: 0 not held, [`PENDING`], or the last use as in the map.
    pub(super) stamps: Vec<AtomicU32>,
    /// Readers and writers of `data` share it; freeing chunks takes it
    /// alone, so no reader of this process meets a hole.
    pub(super) gate: RwLock<()>,
    /// Set while one eviction of this process frees chunks of it.
    pub(super) freeing: AtomicBool,
    /// Whether the cache's file system punches holes: cleared at the
    /// first `EOPNOTSUPP`, and then evictions free whole objects.
    pub(super) can_punch: AtomicBool,
}

/// What a look in the cache found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The bytes, checked against their sums.
    Hit,
    /// Not held (or freed by another process since this one looked).
    Miss,
    /// Held, but the bytes do not match their sums: forgotten, to be
    /// fetched again.
    Damaged,
}

/// What checking a read against its sums found.
enum Check {
    Good,
    /// A piece of zeros that should not be: a hole, which is what another
    /// process's eviction leaves (it may punch a chunk this process has
    /// just stored again, before its entry is back in the map).
    Hole,
    Bad,
}

impl Check {
    fn mismatch(piece: &[u8]) -> Check {
        if piece.iter().all(|&b| b == 0) {
            Check::Hole
        } else {
            Check::Bad
        }
    }
}

/// Sums read at once: a 1 MiB read's worth on the stack.
const SUM_GROUP: u64 = 256;

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

    /// Fills `out` from `start` of the object (within one chunk) and checks
    /// every piece it touches against its sum; false when one does not
    /// match. The pieces wholly inside `out` are read straight into it,
    /// the (at most two) it covers in part through a buffer of one piece.
    fn read_checked(&self, start: u64, out: &mut [u8]) -> io::Result<Check> {
        let end = start + out.len() as u64;
        // Where the pieces read straight into `out` may end: the object's
        // last piece may be short, and ends with it.
        let body_limit = if end >= self.size {
            end
        } else {
            end / PIECE * PIECE
        };
        let mut sums = [0u8; SUM_GROUP as usize * 4];
        let mut edge = [0u8; PIECE as usize];
        let mut p = start / PIECE * PIECE;
        while p < end {
            let group_end = (p + SUM_GROUP * PIECE).min(end.div_ceil(PIECE) * PIECE);
            let n = (group_end - p).div_ceil(PIECE) as usize;
            self.sums.read_exact_at(&mut sums[..n * 4], sum_at(p))?;
            let want = |q: u64| {
                let i = ((q - p) / PIECE) as usize * 4;
                u32::from_le_bytes(sums[i..i + 4].try_into().unwrap())
            };
            let body = p.max(start.next_multiple_of(PIECE))..group_end.min(body_limit);
            if body.start < body.end {
                let into = &mut out[(body.start - start) as usize..(body.end - start) as usize];
                self.data.read_exact_at(into, body.start)?;
                for (k, piece) in into.chunks(PIECE as usize).enumerate() {
                    if crc32c::crc32c(piece) != want(body.start + k as u64 * PIECE) {
                        return Ok(Check::mismatch(piece));
                    }
                }
            }
            let mut q = p;
            while q < group_end && q < end {
                if !body.contains(&q) {
                    let qe = (q + PIECE).min(self.size);
                    let piece = &mut edge[..(qe - q) as usize];
                    self.data.read_exact_at(piece, q)?;
                    if crc32c::crc32c(piece) != want(q) {
                        return Ok(Check::mismatch(piece));
                    }
                    let (from, to) = (q.max(start), qe.min(end));
                    out[(from - start) as usize..(to - start) as usize]
                        .copy_from_slice(&piece[(from - q) as usize..(to - q) as usize]);
                }
                q += PIECE;
            }
            p = group_end;
        }
        Ok(Check::Good)
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

    /// Drops chunk `index`, whose bytes failed a check of the reader's
    /// own: fetched again at its next read.
    pub fn forget(&self, index: u64) {
        let o = &*self.obj;
        let _shared = o.gate.read().unwrap();
        if o.stamps[index as usize].load(Ordering::Relaxed) != 0 {
            o.forget(index);
        }
    }

    /// [`DiskCache::lookup`], as a yes or no.
    #[cfg(test)]
    pub fn read(&self, index: u64, within: usize, out: &mut [u8]) -> bool {
        self.lookup(index, within, out) == Found::Hit
    }

    /// Copies `out.len()` bytes from `within` of chunk `index` into `out`,
    /// each piece checked against its sum. A chunk the cache cannot read
    /// whole, or whose bytes do not match, is forgotten.
    pub fn lookup(&self, index: u64, within: usize, out: &mut [u8]) -> Found {
        let o = &*self.obj;
        if !o.held(index) {
            return Found::Miss;
        }
        let _shared = o.gate.read().unwrap();
        let slot = &o.stamps[index as usize];
        let stamp = slot.load(Ordering::Relaxed);
        if stamp == 0 {
            // Freed by this process between the look and the gate.
            return Found::Miss;
        }
        match o.read_checked(index * o.chunk + within as u64, out) {
            Ok(Check::Good) => {}
            Ok(Check::Bad) if !(stamp > PENDING && o.stamp_on_disk(index) == 0) => {
                log::warn!(
                    "{}: cached chunk {index} (bytes from {}) does not match its checksums: dropped, fetched again",
                    o.dir.display(),
                    index * o.chunk
                );
                o.forget(index);
                return Found::Damaged;
            }
            Ok(_) => {
                // Freed by another process since this one looked: its
                // hole reads as zeros, which the sums tell from the data.
                let _ = slot.compare_exchange(stamp, 0, Ordering::Relaxed, Ordering::Relaxed);
                if o.stamp_on_disk(index) != 0 {
                    o.forget(index);
                }
                return Found::Miss;
            }
            Err(_) => {
                o.forget(index);
                return Found::Miss;
            }
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
        Found::Hit
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
            let at = index * o.chunk;
            let stored = o
                .sums
                .write_all_at(&piece_sums(bytes), sum_at(at))
                .and_then(|()| o.data.write_all_at(bytes, at));
            if let Err(e) = stored {
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
