//! File data in memory that outlives the server: the blocks of a
//! supervised ramfs live in a memfd that its supervisor holds, so a
//! server's death, whatever kills it, leaves every byte a write stored.
//!
//! Block `k` is the `k`th `block_size` bytes of the file. The file is
//! mapped in slabs of [`SLAB`] bytes (or one block, if larger), each
//! mapped once and never moved, so a block's address stays valid for the
//! life of the process; a slab costs address space only as it is used,
//! which keeps an address-space limit meaningful. A freed block is a hole
//! punched in the file: its memory goes back at once and it reads as
//! zeros when it is handed out again, which is what lets a block here be
//! taken whole (no initialised prefix to remember across a restart).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Bytes mapped at a time (at least one block).
const SLAB: u64 = 64 << 20;
/// Under an address-space limit: the server's memory budget keeps a
/// reserve of 32 MiB or more under the limit, which a slab's mapping must
/// not use up at once.
const SLAB_UNDER_LIMIT: u64 = 2 << 20;

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
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Slab `s`'s address, once mapped.
    slabs: Vec<Option<usize>>,
    /// Blocks below this index have been handed out at some time.
    high: u64,
    /// Freed blocks below `high`, reused before `high` grows.
    free: Vec<u64>,
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
    /// advised to be huge pages (`huge=always`).
    pub fn new(file: File, block_size: u64, huge: bool) -> io::Result<Arena> {
        let step = if crate::limits::address_space_limited() {
            SLAB_UNDER_LIMIT
        } else {
            SLAB
        };
        let slab = step.max(block_size) / block_size * block_size;
        let size = file.metadata()?.len();
        Ok(Arena {
            file,
            block_size,
            huge,
            slab,
            inner: Mutex::new(Inner {
                size,
                ..Inner::default()
            }),
        })
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
        let (k, fresh) = match inner.free.pop() {
            Some(k) => (k, false),
            None => (inner.high, true),
        };
        match self.address(&mut inner, k) {
            Some(p) => {
                if fresh {
                    inner.high += 1;
                }
                inner.in_use += 1;
                self.publish(&inner);
                Some((k, p))
            }
            None => {
                if !fresh {
                    inner.free.push(k);
                }
                None
            }
        }
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
        inner.free = (0..high).rev().filter(|k| !used.contains(k)).collect();
        let mut free = inner.free.clone();
        drop(inner);
        free.sort_unstable();
        self.punch(&free);
    }

    /// Gives blocks `ks` back: their memory is freed now.
    pub fn give_all(&self, mut ks: Vec<u64>) {
        ks.sort_unstable();
        self.punch(&ks);
        let mut inner = self.lock();
        inner.in_use = inner.in_use.saturating_sub(ks.len() as u64);
        inner.free.extend(ks);
        self.publish(&inner);
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
}
