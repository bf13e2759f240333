//! One data block: `block_size` bytes of memory of which a prefix is
//! initialised; the rest reads as zeros.
//!
//! Blocks of 1 MiB and more are anonymous mappings of their own, populated
//! in one `madvise(MADV_POPULATE_WRITE)` call when made: the kernel fills
//! the whole block's page tables at once instead of taking a page fault per
//! 4 KiB page as the data is copied in (the userspace counterpart of the
//! large folios that make big blocks cheaper in the kernel's ramfs). Smaller
//! blocks come from the heap, where freed blocks are reused without faults.
//! Either way nothing is zero-filled in userspace before it is written: the
//! initialised prefix only grows by copying data in, or by zeroing a gap a
//! write leaves behind.
//!
//! Freed mapped blocks are not unmapped but kept in a pool of the mount's
//! (see [`set_pool_limit`]), lazily freed with `MADV_FREE`: a rewrite after
//! `rm` then finds its memory still mapped, with no fault or zeroing per
//! page (what malloc gives smaller blocks by reusing freed heap memory),
//! while the kernel may still take those pages back at any time under
//! memory pressure (a reclaimed page faults back in as zeros).
//!
//! With `huge=always` (see [`set_huge`]) a 2 MiB block is a 2 MiB-aligned
//! mapping advised `MADV_HUGEPAGE`, so it is one huge page, as tmpfs
//! `huge=always` makes its folios. Measured here, that made rewrites about
//! half as fast again (fewer TLB misses on every copy) and first writes
//! slower (clearing a fresh huge page in a VM that hands out memory lazily),
//! so it is an option, off by default.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::arena::Arena;

/// Block sizes from which a block is a mapping of its own. Below this the
/// mappings would be many (one VMA each once holes split them) and the
/// populate call costs about what the faults it saves do.
const MAPPED_FROM: usize = 1 << 20;
/// `MADV_POPULATE_WRITE` (Linux 5.14), not yet in every libc crate release.
const MADV_POPULATE_WRITE: libc::c_int = 23;

enum Mem {
    Heap(Box<[std::mem::MaybeUninit<u8>]>),
    Map(NonNull<u8>),
    /// Block `k` of a supervised mount's data file (see `arena.rs`): whole
    /// from the start (it reads as zeros where unwritten), and kept zero
    /// past what a truncate or a punch leaves, so a restarted server needs
    /// no record of an initialised prefix.
    Arena(NonNull<u8>, u64, Arc<Arena>),
}

/// A block of `cap` bytes, `len` of them initialised.
pub(crate) struct Block {
    mem: Mem,
    cap: usize,
    len: usize,
}

// SAFETY: a Block owns its memory exclusively (a private mapping or a boxed
// slice); the raw pointer is never shared, so moving or sharing the Block
// between threads is as safe as for a Box<[u8]>.
unsafe impl Send for Block {}
// SAFETY: as above; `&Block` only permits reads of the initialised prefix.
unsafe impl Sync for Block {}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("cap", &self.cap)
            .field("len", &self.len)
            .finish()
    }
}

/// Mapped blocks: the bytes in use, and freed mappings (by address and
/// size) waiting for reuse, the two together held to a limit. Only
/// bookkeeping: the callers map, advise and unmap.
#[derive(Default)]
struct Pool {
    limit: usize,
    live: usize,
    held: usize,
    maps: Vec<(usize, usize)>,
}

impl Pool {
    /// Counts a new block of `cap` bytes; returns a pooled mapping of
    /// exactly that size for it, if there is one.
    fn start(&mut self, cap: usize) -> Option<usize> {
        self.live += cap;
        let i = self.maps.iter().position(|&(_, c)| c == cap)?;
        self.held -= cap;
        Some(self.maps.swap_remove(i).0)
    }

    /// Uncounts a block of `cap` bytes that got no mapping after all.
    fn abandon(&mut self, cap: usize) {
        self.live -= cap;
    }

    /// Counts a block of `cap` bytes as freed. Returns whether its mapping
    /// may wait for reuse (room is then reserved: call [`Pool::put`]).
    fn finish(&mut self, cap: usize) -> bool {
        self.live -= cap;
        if self.held + self.live + cap > self.limit {
            return false;
        }
        self.held += cap;
        true
    }

    /// Adds a mapping [`Pool::finish`] reserved room for.
    fn put(&mut self, addr: usize, cap: usize) {
        self.maps.push((addr, cap));
    }

    /// Sets the limit; returns the pooled mappings that no longer fit.
    fn set_limit(&mut self, limit: usize) -> Vec<(usize, usize)> {
        self.limit = limit;
        let mut out = Vec::new();
        while self.held + self.live > self.limit {
            let Some((addr, cap)) = self.maps.pop() else {
                break;
            };
            self.held -= cap;
            out.push((addr, cap));
        }
        out
    }
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    limit: 0,
    live: 0,
    held: 0,
    maps: Vec::new(),
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lets freed mapped blocks wait for reuse instead of being unmapped, as
/// long as they and the mapped blocks in use come to at most `bytes`. A
/// ramfs sets its `size=` limit here, so the pool only ever holds memory
/// the mount was allowed to fill. (A server process serves one mount.)
pub fn set_pool_limit(bytes: u64) {
    POOL_LIMIT.store(bytes, Ordering::Relaxed);
    apply_pool_limit();
}

/// Every block a mapping of its own (see [`set_map_all`]).
static MAP_ALL: AtomicBool = AtomicBool::new(false);

/// Makes every new block a mapping of its own, whatever its size: under an
/// address-space limit. The heap keeps what is freed for reuse, but only
/// for allocations its free pieces fit, which the memory budget cannot
/// tell: measured, a heap left fragmented by deleted files grew by a block
/// for every block the budget let through on the strength of its free
/// bytes. A mapping costs exactly its size, and unmapping gives it back.
pub fn set_map_all(on: bool) {
    MAP_ALL.store(on, Ordering::Relaxed);
}

/// The limit [`set_pool_limit`] last set.
static POOL_LIMIT: AtomicU64 = AtomicU64::new(0);
/// Whether the server runs under memory limits (see [`set_limited`]).
static LIMITED: AtomicBool = AtomicBool::new(false);

/// Whether the server runs under memory limits now.
pub(crate) fn limited() -> bool {
    LIMITED.load(Ordering::Relaxed)
}

/// Keeps no freed mapping while the server runs under memory limits: the
/// kernel lists pages freed with `MADV_FREE` as reclaimable file pages
/// until it reclaims them, even after a new block reuses and fills them,
/// so the budget would count that data as memory it can have back.
pub fn set_limited(on: bool) {
    if LIMITED.swap(on, Ordering::Relaxed) != on {
        apply_pool_limit();
    }
}

fn apply_pool_limit() {
    let bytes = if LIMITED.load(Ordering::Relaxed) {
        0
    } else {
        POOL_LIMIT.load(Ordering::Relaxed)
    };
    let over = pool().set_limit(usize::try_from(bytes).unwrap_or(usize::MAX));
    for (addr, cap) in over {
        // SAFETY: pooled mappings belong to no block.
        unsafe { unmap(addr as *mut u8, cap) };
    }
}

/// The size of a huge page (a PMD) on x86-64: the one block size that can be
/// one.
const HUGE_PAGE: usize = 2 << 20;

static HUGE: AtomicBool = AtomicBool::new(false);

/// Makes new blocks of [`HUGE_PAGE`] bytes huge pages (`huge=always`).
pub fn set_huge(on: bool) {
    HUGE.store(on, Ordering::Relaxed);
}

/// A fresh anonymous mapping of `cap` bytes at an address aligned to `cap`
/// (over-allocated, then trimmed), advised to be one huge page.
fn map_huge(cap: usize) -> Option<*mut libc::c_void> {
    // SAFETY: an anonymous private mapping with no address hint touches no
    // existing memory; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * cap,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let aligned = start.next_multiple_of(cap);
    // SAFETY: the head `start..aligned` and the tail after `aligned + cap`
    // lie inside the mapping just made and are given back unused; the
    // advice only concerns the aligned part this block keeps.
    unsafe {
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        let tail = start + 2 * cap - (aligned + cap);
        if tail > 0 {
            libc::munmap((aligned + cap) as *mut libc::c_void, tail);
        }
        libc::madvise(aligned as *mut libc::c_void, cap, libc::MADV_HUGEPAGE);
    }
    Some(aligned as *mut libc::c_void)
}

/// A heap allocation of `cap` bytes with every page touched, or `None`
/// where the allocator has none (which `Box::new_uninit_slice` would turn
/// into an abort).
fn heap_block(cap: usize) -> Option<Box<[std::mem::MaybeUninit<u8>]>> {
    let layout = std::alloc::Layout::array::<u8>(cap).ok()?;
    if cap == 0 {
        return Some(Box::new_uninit_slice(0));
    }
    // SAFETY: the layout has a non-zero size (checked above).
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return None;
    }
    // Uninitialised bytes are free to overwrite: one per page brings the
    // page in, which the copy that fills it would do anyway.
    for at in (0..cap).step_by(4096).chain([cap - 1]) {
        // SAFETY: `at < cap`, inside the allocation just made.
        unsafe { p.add(at).write_volatile(0) };
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `[u8; cap]`, which is what a `Box<[MaybeUninit<u8>]>` of `cap`
    // elements frees with; the box owns it alone from here.
    Some(unsafe {
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            p.cast::<std::mem::MaybeUninit<u8>>(),
            cap,
        ))
    })
}

/// What a block of `cap` bytes costs in memory once filled: its bytes,
/// the allocator's rounding (a page for the heap's own mappings, which
/// glibc makes from 128 KiB), its page tables and its entry in the file's
/// map.
pub(crate) fn charge(cap: usize) -> u64 {
    let cap = cap as u64;
    let rounding = if (128 << 10..MAPPED_FROM as u64).contains(&cap) {
        4096
    } else {
        64
    };
    cap + rounding + cap / 512 + 128
}

/// # Safety
/// `p` must be a mapping of `cap` bytes made by `map` that nothing refers
/// to any more.
unsafe fn unmap(p: *mut u8, cap: usize) {
    // SAFETY: as the caller promises.
    unsafe {
        libc::munmap(p.cast(), cap);
    }
}

fn map(cap: usize) -> Option<NonNull<u8>> {
    let reused = pool().start(cap);
    let p = match reused {
        Some(addr) => addr as *mut libc::c_void,
        None if cap == HUGE_PAGE && HUGE.load(Ordering::Relaxed) => match map_huge(cap) {
            Some(p) => p,
            None => {
                pool().abandon(cap);
                return None;
            }
        },
        None => {
            // SAFETY: an anonymous private mapping with no address hint
            // touches no existing memory; the result is checked before use.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                pool().abandon(cap);
                return None;
            }
            p
        }
    };
    // SAFETY: `p..p+cap` is a mapping this block now owns alone. Populating
    // is only an optimisation: if the kernel refuses (older kernel, memory
    // short) the pages are faulted in on first write as usual. On a reused
    // mapping it only faults in what the kernel reclaimed.
    unsafe {
        libc::madvise(p, cap, MADV_POPULATE_WRITE);
    }
    NonNull::new(p.cast())
}

impl Block {
    /// An empty block of `cap` bytes (all zeros to a reader), or `None`
    /// when the memory cannot be had (an address-space limit reached).
    /// Its pages are faulted in now: the memory budget charges a block
    /// whole when it is made (`budget.rs`), so none may grow later.
    pub fn new(cap: usize) -> Option<Block> {
        let mem = if cap >= MAPPED_FROM || MAP_ALL.load(Ordering::Relaxed) {
            map(cap).map(Mem::Map)
        } else {
            None
        };
        let mem = match mem {
            Some(m) => m,
            None => Mem::Heap(heap_block(cap)?),
        };
        Some(Block { mem, cap, len: 0 })
    }

    /// A fresh block of `arena` (all zeros).
    pub fn in_arena(arena: &Arc<Arena>) -> Option<Block> {
        let (k, p) = arena.take()?;
        Some(Self::arena_block(arena, k, p))
    }

    /// Block `k` of `arena` as an earlier server left it.
    pub fn adopt(arena: &Arc<Arena>, k: u64) -> Option<Block> {
        let p = arena.adopt(k)?;
        Some(Self::arena_block(arena, k, p))
    }

    fn arena_block(arena: &Arc<Arena>, k: u64, p: NonNull<u8>) -> Block {
        let cap = arena.block_size() as usize;
        Block {
            mem: Mem::Arena(p, k, arena.clone()),
            cap,
            len: cap,
        }
    }

    /// Its index in the data file, for a block of a supervised mount.
    pub fn arena_index(&self) -> Option<u64> {
        match &self.mem {
            Mem::Arena(_, k, _) => Some(*k),
            _ => None,
        }
    }

    fn ptr(&self) -> *const u8 {
        match &self.mem {
            Mem::Heap(b) => b.as_ptr().cast(),
            Mem::Map(p) | Mem::Arena(p, ..) => p.as_ptr(),
        }
    }

    fn ptr_mut(&mut self) -> *mut u8 {
        match &mut self.mem {
            Mem::Heap(b) => b.as_mut_ptr().cast(),
            Mem::Map(p) | Mem::Arena(p, ..) => p.as_ptr(),
        }
    }

    /// Bytes initialised so far (everything after reads as zeros).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The initialised prefix.
    pub fn filled(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the allocation were written (by
        // `store` or `zero_to`) and `len <= cap`.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    fn filled_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        // SAFETY: as for `filled`, with exclusive access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr_mut(), len) }
    }

    /// Extends the initialised prefix with zeros up to `to`.
    fn zero_to(&mut self, to: usize) {
        assert!(to <= self.cap);
        if to > self.len {
            // SAFETY: `len..to` lies inside the allocation (`to <= cap`).
            unsafe { self.ptr_mut().add(self.len).write_bytes(0, to - self.len) };
            self.len = to;
        }
    }

    /// Stores `src` at `at`; `at + src.len()` must not pass the capacity.
    pub fn store(&mut self, at: usize, src: &[u8]) {
        let end = at + src.len();
        assert!(end <= self.cap, "write past the end of a block");
        self.zero_to(at);
        // SAFETY: `at..end` lies inside the allocation (checked above), and
        // `src` cannot overlap memory this block owns exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr_mut().add(at), src.len());
        }
        self.len = self.len.max(end);
    }

    /// Zeroes `lo..hi`, shortening the initialised prefix when the range
    /// reaches its end.
    pub fn zero(&mut self, lo: usize, hi: usize) {
        if lo >= self.len {
            return;
        }
        if matches!(self.mem, Mem::Arena(..)) {
            let hi = hi.min(self.len);
            self.filled_mut()[lo..hi].fill(0);
            return;
        }
        if hi >= self.len {
            self.len = lo;
        } else {
            self.filled_mut()[lo..hi].fill(0);
        }
    }

    /// Forgets everything from `n` on.
    pub fn truncate(&mut self, n: usize) {
        if matches!(self.mem, Mem::Arena(..)) {
            let len = self.len;
            self.zero(n.min(len), len);
            return;
        }
        self.len = self.len.min(n);
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Mem::Arena(_, k, arena) = &self.mem {
            // Reused only once the transaction that frees it is in.
            crate::ledger::hold_back(arena, *k);
            return;
        }
        let Mem::Map(p) = self.mem else { return };
        if !pool().finish(self.cap) {
            // SAFETY: `p` is the start of a mapping of `cap` bytes made in
            // `map` and owned by this block alone; nothing refers to it after.
            unsafe { unmap(p.as_ptr(), self.cap) };
            return;
        }
        // Advised before it is pooled: once in the pool another thread may
        // take it. Nothing reads it again before `map` hands it out as a
        // new, empty block, so lost contents do not matter.
        // SAFETY: `p..p+cap` is this block's own mapping.
        unsafe {
            libc::madvise(p.as_ptr().cast(), self.cap, libc::MADV_FREE);
        }
        pool().put(p.as_ptr() as usize, self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_and_mapped_blocks_behave_alike() {
        for cap in [4096, 65536, 1 << 20, 2 << 20] {
            let mut b = Block::new(cap).unwrap();
            assert_eq!(b.filled(), b"");
            b.store(10, b"abc");
            assert_eq!(b.filled(), b"\0\0\0\0\0\0\0\0\0\0abc");
            b.store(0, b"xy");
            assert_eq!(&b.filled()[..3], b"xy\0");
            b.zero(11, 12);
            assert_eq!(&b.filled()[10..], b"a\0c");
            b.zero(11, cap);
            assert_eq!(b.len(), 11);
            b.store(cap - 1, b"z");
            assert_eq!(b.len(), cap);
            assert!(b.filled()[11..cap - 1].iter().all(|&x| x == 0));
            b.truncate(5);
            assert_eq!(b.filled(), b"xy\0\0\0");
        }
    }

    #[test]
    fn the_pool_holds_freed_mappings_while_they_and_live_ones_fit_the_limit() {
        const M: usize = 1 << 20;
        let mut p = Pool::default();
        assert_eq!(p.start(M), None);
        assert!(!p.finish(M), "a pool with no limit keeps nothing");
        assert!(p.set_limit(4 * M).is_empty());
        // Three live blocks; freeing two keeps them (3 MiB in all).
        assert_eq!((p.start(2 * M), p.start(M), p.start(M)), (None, None, None));
        assert!(p.finish(M));
        p.put(0x1000, M);
        assert!(p.finish(2 * M));
        p.put(0x2000, 2 * M);
        assert_eq!((p.live, p.held), (M, 3 * M));
        // A new 2 MiB block reuses the pooled one of that size, not the 1 MiB.
        assert_eq!(p.start(2 * M), Some(0x2000));
        assert_eq!((p.live, p.held), (3 * M, M));
        assert_eq!(p.start(M), Some(0x1000));
        assert!(p.finish(M), "3 MiB live and 1 MiB pooled fit 4 MiB");
        p.put(0x3000, M);
        // A block that gets no mapping is not counted.
        assert_eq!(p.start(2 * M), None);
        p.abandon(2 * M);
        assert_eq!((p.live, p.held), (3 * M, M));
        // Over the limit, a freed block is unmapped, not pooled.
        assert_eq!(p.start(2 * M), None);
        assert!(!p.finish(M));
        assert_eq!((p.live, p.held), (4 * M, M));
        // A lower limit gives back what no longer fits.
        assert_eq!(p.set_limit(3 * M), vec![(0x3000, M)]);
        assert_eq!((p.live, p.held), (4 * M, 0));
    }

    #[test]
    fn a_block_on_a_reused_mapping_starts_empty() {
        let cap = 2 << 20;
        // The pool is the process's; other tests may set its limit too.
        set_pool_limit(1 << 30);
        let mut a = Block::new(cap).unwrap();
        a.store(0, &[7; 4096]);
        drop(a);
        let mut b = Block::new(cap).unwrap();
        assert_eq!(b.filled(), b"");
        b.store(4000, b"x");
        assert!(b.filled()[..4000].iter().all(|&x| x == 0));
    }

    #[test]
    #[should_panic(expected = "past the end")]
    fn store_past_the_end_panics() {
        Block::new(4096).unwrap().store(4000, &[0; 100]);
    }
}
