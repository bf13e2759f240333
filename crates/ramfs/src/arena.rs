//! File data in memory that outlives the server: the blocks of a
//! supervised ramfs live in a memfd that its supervisor holds, so a
//! server's death, whatever kills it, leaves every byte a write stored.
//!
//! Block `k` is the `k`th `block_size` bytes of the file. The file is
//! mapped in slabs of [`SLAB`] bytes (or one block, if larger), each
//! mapped once and never moved, so a block's address stays valid for the
//! life of the process; a slab costs address space only as it is used,
//! which keeps an address-space limit meaningful.
//!
//! A block handed out reads as zeros, which is what lets a block here be
//! taken whole (no initialised prefix to remember across a restart). A
//! freed block keeps its memory for a while, zeroed when it is handed out
//! again: a hole punched in the file is a system call on every unlink and
//! a page fault on every reuse, which together cost a supervised mount a
//! third of its unlinks' time and more than a tenth of an unpack's. Freed
//! blocks past [`KEEP`] are punched at once, and all of them once the
//! mount has freed nothing for [`IDLE`], so that memory goes back as it
//! does on tmpfs, only later; under memory limits none is kept (the
//! budget would count them as used). New blocks are faulted in
//! [`AHEAD`] at a time, by one system call.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Bytes mapped at a time (at least one block).
const SLAB: u64 = 64 << 20;
/// Under an address-space limit: the server's memory budget keeps a
/// reserve of 32 MiB or more under the limit, which a slab's mapping must
/// not use up at once.
const SLAB_UNDER_LIMIT: u64 = 2 << 20;
/// Freed bytes kept for reuse at most (see the module's notes).
const KEEP: u64 = 256 << 20;
/// How long a mount frees nothing before its kept blocks are punched.
const IDLE: Duration = Duration::from_secs(1);
/// Bytes of new blocks faulted in at a time (at least one block).
const AHEAD: u64 = 256 << 10;

/// Address space the arena has mapped and no block uses: the budget's
/// reading of the address space counts it as room (a block made there
/// takes no more). One mount per server process.
static REUSABLE: AtomicU64 = AtomicU64::new(0);

/// See [`REUSABLE`].
pub(crate) fn reusable_address_space() -> u64 {
    REUSABLE.load(Ordering::Relaxed)
}

/// The blocks of one mount in a memfd.
#[derive(Debug)]
pub(crate) struct Arena {
    file: File,
    block_size: u64,
    huge: bool,
    /// Bytes per slab: a whole number of blocks.
    slab: u64,
    /// Freed blocks kept at most.
    keep: usize,
    /// Times blocks were freed: the trimmer's sign of a busy mount.
    frees: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Slab `s`'s address, once mapped.
    slabs: Vec<Option<usize>>,
    /// Blocks below this index have been handed out at some time.
    high: u64,
    /// Blocks from `high` up to this one have been faulted in.
    ahead: u64,
    /// Free blocks below `high` that are holes (they read as zeros),
    /// reused lowest first before `high` grows.
    free: BTreeSet<u64>,
    /// Free blocks in this range have been faulted in (see `take`).
    free_ahead: std::ops::Range<u64>,
    /// Freed blocks still holding what they held, reused first (zeroed).
    kept: Vec<u64>,
    /// The file's size: every slab mapped so far lies below it.
    size: u64,
    /// Slabs mapped, and blocks handed out.
    mapped: u64,
    in_use: u64,
}

// SAFETY: the slab addresses are mappings this arena made and owns; every
// access to the bookkeeping goes through the mutex, and the bytes of a
// block are only touched by whoever holds its `Block`.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// An arena over `file` (a memfd, empty or as an earlier server left
    /// it) for blocks of `block_size` bytes; `huge`: its mappings are
    /// advised to be huge pages (`huge=always`). A thread gives kept
    /// blocks back once the mount is idle, for as long as the arena lives.
    pub fn new(file: File, block_size: u64, huge: bool) -> io::Result<Arc<Arena>> {
        let step = if crate::limits::address_space_limited() {
            SLAB_UNDER_LIMIT
        } else {
            SLAB
        };
        let slab = step.max(block_size) / block_size * block_size;
        let size = file.metadata()?.len();
        let arena = Arc::new(Arena {
            file,
            block_size,
            huge,
            slab,
            keep: usize::try_from(KEEP / block_size).unwrap_or(usize::MAX),
            frees: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                size,
                ..Inner::default()
            }),
        });
        let weak = Arc::downgrade(&arena);
        std::thread::Builder::new()
            .name("ramfs-trim".into())
            .spawn(move || trim_when_idle(weak))?;
        Ok(arena)
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, inner: &Inner) {
        let mapped = inner.mapped * self.slab;
        REUSABLE.store(
            mapped.saturating_sub(inner.in_use * self.block_size),
            Ordering::Relaxed,
        );
    }

    /// Block `k`'s address, its slab mapped (and the file grown) first.
    fn address(&self, inner: &mut Inner, k: u64) -> Option<NonNull<u8>> {
        let at = k.checked_mul(self.block_size)?;
        let s = usize::try_from(at / self.slab).ok()?;
        if inner.slabs.len() <= s {
            inner.slabs.resize(s + 1, None);
        }
        let base = match inner.slabs[s] {
            Some(b) => b,
            None => {
                let start = s as u64 * self.slab;
                let end = start + self.slab;
                if inner.size < end {
                    // Sparse: the file takes memory only as blocks are
                    // written.
                    self.file.set_len(end).ok()?;
                    inner.size = end;
                }
                // SAFETY: a new shared mapping of the arena's own file at
                // a slab boundary, with no address hint: it touches no
                // memory of this process; the result is checked.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        self.slab as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        self.file.as_raw_fd(),
                        start as libc::off_t,
                    )
                };
                if p == libc::MAP_FAILED {
                    return None;
                }
                if self.huge {
                    // SAFETY: advice on the mapping just made.
                    unsafe {
                        libc::madvise(p, self.slab as usize, libc::MADV_HUGEPAGE);
                    }
                }
                inner.slabs[s] = Some(p as usize);
                inner.mapped += 1;
                p as usize
            }
        };
        NonNull::new((base + (at % self.slab) as usize) as *mut u8)
    }

    /// A block nobody holds, zeroed: its index and address.
    pub fn take(&self) -> Option<(u64, NonNull<u8>)> {
        let mut inner = self.lock();
        // A kept block's slab is mapped already (it was in use): this
        // finds its address and maps nothing.
        let kept = inner.kept.pop();
        if let Some((k, p)) = kept.and_then(|k| Some((k, self.address(&mut inner, k)?))) {
            inner.in_use += 1;
            self.publish(&inner);
            drop(inner);
            // SAFETY: block `k` is `block_size` bytes of a live mapping,
            // now held by the caller alone.
            unsafe { p.as_ptr().write_bytes(0, self.block_size as usize) };
            return Some((k, p));
        }
        if let Some(k) = kept {
            // Not reachable: made a hole, it may go to the free ones.
            self.punch_run(k, 1);
            inner.free.insert(k);
        }
        let (k, fresh) = match inner.free.pop_first() {
            Some(k) => (k, false),
            None => (inner.high, true),
        };
        match self.address(&mut inner, k) {
            Some(p) => {
                let mut ahead = 0;
                if fresh {
                    inner.high += 1;
                    if inner.ahead < inner.high {
                        ahead = self.fault_ahead(&mut inner);
                    }
                } else if !inner.free_ahead.contains(&k) {
                    ahead = self.fault_free_run(&mut inner, k);
                }
                inner.in_use += 1;
                self.publish(&inner);
                drop(inner);
                // Outside the lock: it allocates pages, and other takes
                // need not wait for it (faulting in a block someone took
                // meanwhile changes none of its bytes).
                if ahead > 0 {
                    populate(p, ahead);
                }
                Some((k, p))
            }
            None => {
                if !fresh {
                    inner.free.insert(k);
                }
                None
            }
        }
    }

    /// As [`Arena::fault_ahead`], for the run of free blocks from `k` (just
    /// taken): they are taken next, lowest first, as a file written after
    /// a trim takes them.
    fn fault_free_run(&self, inner: &mut Inner, k: u64) -> u64 {
        let per_slab = self.slab / self.block_size;
        let limit = (k + (AHEAD / self.block_size).max(1)).min((k / per_slab + 1) * per_slab);
        let mut end = k + 1;
        for &f in inner.free.range(k + 1..limit) {
            if f != end {
                break;
            }
            end += 1;
        }
        // The last run's blocks still free hold memory now: kept, they are
        // reused first and punched when the mount is idle.
        let old = std::mem::replace(&mut inner.free_ahead, k..end);
        let left: Vec<u64> = inner.free.range(old).copied().collect();
        for f in left {
            inner.free.remove(&f);
            inner.kept.push(f);
        }
        (end - k) * self.block_size
    }

    /// The bytes from new block `high - 1` on to fault in, to the end of
    /// [`AHEAD`] or of the slab: one system call rather than a page fault
    /// each. Best effort (kernels before 5.14 lack the advice).
    fn fault_ahead(&self, inner: &mut Inner) -> u64 {
        let first = inner.high - 1;
        let per_slab = self.slab / self.block_size;
        let end = (first + (AHEAD / self.block_size).max(1)).min((first / per_slab + 1) * per_slab);
        inner.ahead = end;
        (end - first) * self.block_size
    }

    /// Block `k` as an earlier server left it (a restarted server taking
    /// its blocks back): its address.
    pub fn adopt(&self, k: u64) -> Option<NonNull<u8>> {
        let mut inner = self.lock();
        let p = self.address(&mut inner, k)?;
        inner.high = inner.high.max(k + 1);
        inner.in_use += 1;
        self.publish(&inner);
        Some(p)
    }

    /// After every block still in use was adopted: the others are free,
    /// and their memory (what a dead server wrote and never recorded) goes
    /// back.
    pub fn settle_free(&self, used: &std::collections::HashSet<u64>) {
        let mut inner = self.lock();
        let high = inner.high.max(inner.size / self.block_size);
        inner.high = high;
        inner.ahead = high;
        inner.kept.clear();
        inner.free = (0..high).filter(|k| !used.contains(k)).collect();
        let free: Vec<u64> = inner.free.iter().copied().collect();
        drop(inner);
        self.punch(&free);
    }

    /// Gives blocks `ks` back: kept for reuse while there is room (see
    /// the module's notes), their memory freed now otherwise.
    pub fn give_all(&self, mut ks: Vec<u64>) {
        self.frees.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.lock();
        inner.in_use = inner.in_use.saturating_sub(ks.len() as u64);
        if inner.kept.len() + ks.len() <= self.keep && !crate::block::limited() {
            inner.kept.extend(ks);
            self.publish(&inner);
            return;
        }
        self.publish(&inner);
        drop(inner);
        ks.sort_unstable();
        self.punch(&ks);
        self.lock().free.extend(ks);
    }

    /// Punches every kept block (the mount is idle).
    fn trim(&self) {
        let mut ks = std::mem::take(&mut self.lock().kept);
        if ks.is_empty() {
            return;
        }
        ks.sort_unstable();
        self.punch(&ks);
        self.lock().free.extend(ks);
    }

    /// Punches blocks `ks` (sorted) out of the file: one hole per run of
    /// adjacent ones (a file's blocks are mostly taken in a row, and freed
    /// together).
    fn punch(&self, ks: &[u64]) {
        for run in ks.chunk_by(|a, b| b == &(a + 1)) {
            self.punch_run(run[0], run.len() as u64);
        }
    }

    fn punch_run(&self, k: u64, n: u64) {
        let r = rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            k * self.block_size,
            n * self.block_size,
        );
        if let Err(e) = r {
            // They read as what they held until then; they are only reused.
            log::warn!("freeing blocks {k}.. ({n}) of the data file: {e}");
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        for p in inner.slabs.iter().flatten() {
            // SAFETY: each is a mapping of `slab` bytes made in `address`;
            // the arena is dropped after every block (they hold it by Arc).
            unsafe {
                libc::munmap(*p as *mut libc::c_void, self.slab as usize);
            }
        }
    }
}

/// Faults in `len` bytes from `p`, blocks of one slab (some may have been
/// taken since: faulting in changes no byte): one system call rather than
/// a page fault each (best
/// effort: kernels before 5.14 lack the advice, and then the pages fault
/// in as they are written).
fn populate(p: NonNull<u8>, len: u64) {
    // SAFETY: the caller's range lies in a live shared writable mapping of
    // the arena (slabs are never unmapped while it lives); the advice only
    // faults pages in, reading and writing no byte (a hole reads as zeros
    // before and after).
    unsafe {
        libc::madvise(p.as_ptr().cast(), len as usize, libc::MADV_POPULATE_WRITE);
    }
}

/// Punches an arena's kept blocks once it has freed nothing for [`IDLE`];
/// ends with the arena.
fn trim_when_idle(arena: Weak<Arena>) {
    let mut seen = u64::MAX;
    loop {
        std::thread::sleep(IDLE);
        let Some(a) = arena.upgrade() else { return };
        let now = a.frees.load(Ordering::Relaxed);
        if now == seen {
            a.trim();
        }
        seen = now;
    }
}

/// Whether the kernel gives shared memory (a memfd's pages) huge pages
/// where a mapping asks for them (`shmem_enabled` not `never` or `deny`).
pub fn shared_huge_pages() -> bool {
    let Ok(s) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled") else {
        return false;
    };
    let chosen = s
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'));
    matches!(chosen, Some("always" | "within_size" | "advise" | "force"))
}

/// A new, empty data file for an arena.
pub fn memfd(name: &str) -> io::Result<File> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zero_reused_and_survive_the_arena() {
        let f = memfd("t").unwrap();
        let a = Arena::new(f.try_clone().unwrap(), 4096, false).unwrap();
        let (k0, p0) = a.take().unwrap();
        let (k1, p1) = a.take().unwrap();
        assert_eq!((k0, k1), (0, 1));
        // SAFETY: both are 4096-byte blocks of the arena, held here alone.
        unsafe {
            assert_eq!(*p0.as_ptr().add(100), 0);
            p0.as_ptr().write_bytes(7, 4096);
            p1.as_ptr().write_bytes(9, 4096);
        }
        a.give_all(vec![k0]);
        let (k, p) = a.take().unwrap();
        assert_eq!(k, 0);
        // SAFETY: as above.
        let last = unsafe { *p.as_ptr().add(4095) };
        assert_eq!(last, 0, "a freed block reads as zeros");
        drop(a);
        // What block 1 held is in the file, for the next server.
        let b = Arena::new(f, 4096, false).unwrap();
        let p = b.adopt(1).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { *p.as_ptr().add(17) }, 9);
        b.settle_free(&[1].into_iter().collect());
        assert_eq!(b.take().unwrap().0, 0);
        assert_eq!(b.take().unwrap().0, 2);
    }

    /// Bytes of memory the file holds.
    fn held(f: &File) -> u64 {
        use std::os::unix::fs::MetadataExt;
        f.metadata().unwrap().blocks() * 512
    }

    #[test]
    fn freed_blocks_are_kept_zeroed_on_reuse_and_given_back_when_idle() {
        let f = memfd("t").unwrap();
        let a = Arena::new(f.try_clone().unwrap(), 4096, false).unwrap();
        let taken: Vec<_> = (0..8).map(|_| a.take().unwrap()).collect();
        for (_, p) in &taken {
            // SAFETY: each is a 4096-byte block of the arena, held here.
            unsafe { p.as_ptr().write_bytes(0xaa, 4096) };
        }
        // New blocks come faulted in ahead of use.
        assert!(held(&f) >= AHEAD, "{} bytes held", held(&f));
        let before = held(&f);
        a.give_all(vec![taken[2].0, taken[5].0]);
        assert_eq!(held(&f), before, "kept, not punched");
        let (k, p) = a.take().unwrap();
        assert!(k == taken[2].0 || k == taken[5].0);
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), 4096) };
        assert!(bytes.iter().all(|&b| b == 0), "a kept block is zeroed");
        // Idle: the other kept block becomes a hole.
        let other = if k == taken[2].0 { taken[5] } else { taken[2] };
        std::thread::sleep(IDLE * 3);
        assert_eq!(held(&f), before - 4096);
        // SAFETY: the block's mapping is live (the arena is); nobody holds
        // the block, and reading a hole of a shared mapping reads zeros.
        assert_eq!(unsafe { *other.1.as_ptr().add(9) }, 0);
        assert_eq!(a.take().unwrap().0, other.0, "holes are reused too");
    }
}
