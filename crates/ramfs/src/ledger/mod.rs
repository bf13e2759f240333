//! The ledger: what a supervised ramfs's names, inodes and block maps are,
//! kept in a memfd its supervisor holds, so that a server killed at any
//! moment leaves everything it acknowledged for the next one.
//!
//! Each operation that changes something appends one transaction (see
//! `record.rs`) before it answers, while it still holds the locks that
//! order it against the operations it conflicts with. An append is a copy
//! into a shared mapping and one store of the new end: no system call, and
//! nothing a `kill -9` can tear (the end moves only once the bytes are
//! there, and each transaction carries its CRC-32C besides).
//!
//! The file holds a header page and two regions at fixed offsets, one
//! active. When the active one grows past a bound, the file system writes
//! a snapshot of everything into the other (`RamFs::rewrite_ledger`, with
//! every operation held back), which becomes active with one store; the
//! old one's memory is given back. A restarted server reads the active
//! region (`replay.rs`).
//!
//! Blocks an operation frees are reused only once its transaction is in
//! (the thread's `limbo`): otherwise a block could be handed to another
//! file, written and acknowledged while the ledger still gave it to the
//! first, and the first's resent operation would free it again.

pub(crate) mod record;
pub(crate) mod replay;

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::arena::Arena;

pub(crate) use record::{Image, Rec, Tx};

const MAGIC: u64 = u64::from_le_bytes(*b"foliolg1");
const HEADER: u64 = 4096;
/// Where each region starts in the file (sparse between).
const REGION: [u64; 2] = [HEADER, HEADER + (1 << 40)];
/// A region's mapping grows by at least this much.
const GROW: usize = 4 << 20;
/// Room kept free in the active region before each change (see
/// [`Ledger::headroom`]): more than any one change's transaction but the
/// rare truncate of a huge file.
const HEADROOM: usize = 256 << 10;
/// A frame: its length, its CRC-32C, then the transaction, padded to 8.
const FRAME: usize = 8;

/// The header page, as mapped.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    /// The block size (low 32 bits) and the format's version (high).
    shape: AtomicU64,
    /// Which region is active (0 or 1).
    active: AtomicU64,
    /// Each region's end: bytes of whole frames.
    tails: [AtomicU64; 2],
}

/// Why a ledger could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The file could not be read, mapped or grown.
    #[error("the state file: {0}")]
    Io(#[from] io::Error),
    /// Not a ledger, or another format's or another block size's.
    #[error("the state file is not this ramfs's: {0}")]
    Foreign(String),
    /// A transaction is damaged.
    #[error("the state file is damaged at byte {offset} of region {region}: {what}")]
    Damaged {
        /// The region (0 or 1).
        region: usize,
        /// Where in the region.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
}

struct Log {
    region: usize,
    map: NonNull<u8>,
    cap: usize,
    tail: usize,
    /// Bytes in the region when it was last rewritten.
    base: usize,
}

/// The ledger of one mount.
pub(crate) struct Ledger {
    file: File,
    header: NonNull<Header>,
    log: Mutex<Log>,
}

// SAFETY: the header is a shared mapping of atomics; the region mapping is
// only touched with the `log` mutex held.
unsafe impl Send for Ledger {}
// SAFETY: as above.
unsafe impl Sync for Ledger {}

thread_local! {
    /// Blocks this thread freed whose transaction is not in yet.
    static LIMBO: RefCell<Vec<(Arc<Arena>, u64)>> = const { RefCell::new(Vec::new()) };
}

/// Holds block `k` of `arena` back until this thread's next transaction
/// is in (see the module's notes).
pub(crate) fn hold_back(arena: &Arc<Arena>, k: u64) {
    LIMBO.with(|l| l.borrow_mut().push((arena.clone(), k)));
}

fn release_limbo() {
    let mut held = LIMBO.with(|l| std::mem::take(&mut *l.borrow_mut()));
    // A server has one arena; a test's process may have several.
    while let Some((arena, _)) = held.first() {
        let arena = arena.clone();
        let (mine, rest): (Vec<_>, Vec<_>) =
            held.into_iter().partition(|(a, _)| Arc::ptr_eq(a, &arena));
        arena.give_all(mine.into_iter().map(|(_, k)| k).collect());
        held = rest;
    }
}

fn map(file: &File, offset: u64, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of the ledger's own file, with no
    // address hint: it touches no memory of this process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

fn shape(block_size: u32) -> u64 {
    const VERSION: u64 = 1;
    (VERSION << 32) | u64::from(block_size)
}

impl Ledger {
    /// A new, empty ledger in `file` (a fresh memfd).
    pub fn create(file: File, block_size: u32) -> io::Result<Ledger> {
        file.set_len(REGION[0])?;
        let l = Self::open_mapped(file, 0, 0)?;
        let h = l.header();
        h.shape.store(shape(block_size), Ordering::Relaxed);
        h.active.store(0, Ordering::Relaxed);
        h.tails[0].store(0, Ordering::Relaxed);
        h.tails[1].store(0, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(l)
    }

    /// The block size the ledger in `file` was made for.
    pub fn block_size_of(file: &File) -> Result<u32, LedgerError> {
        let mut head = [0u8; 16];
        file.read_exact_at(&mut head, 0)?;
        if u64::from_le_bytes(head[..8].try_into().unwrap()) != MAGIC {
            return Err(LedgerError::Foreign("no ledger header".into()));
        }
        Ok(u64::from_le_bytes(head[8..].try_into().unwrap()) as u32)
    }

    /// The ledger an earlier server left in `file`, and its active
    /// region's bytes for replay.
    pub fn open(file: File, block_size: u32) -> Result<(Ledger, Vec<u8>, usize), LedgerError> {
        let mut head = [0u8; 40];
        file.read_exact_at(&mut head, 0)?;
        let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap());
        if word(0) != MAGIC {
            return Err(LedgerError::Foreign("no ledger header".into()));
        }
        if word(1) != shape(block_size) {
            return Err(LedgerError::Foreign(format!(
                "made for block size {} (format {}), mounted with {block_size}",
                word(1) & 0xffff_ffff,
                word(1) >> 32
            )));
        }
        let region = word(2) as usize;
        if region > 1 {
            return Err(LedgerError::Foreign(format!("active region {region}")));
        }
        let tail = word(3 + region);
        let len = file.metadata()?.len();
        if REGION[region].checked_add(tail).is_none_or(|e| e > len) {
            return Err(LedgerError::Damaged {
                region,
                offset: tail,
                what: format!("its end lies past the file's {len} bytes"),
            });
        }
        let tail = usize::try_from(tail).map_err(|_| io::Error::other("ledger too large"))?;
        let mut bytes = vec![0u8; tail];
        file.read_exact_at(&mut bytes, REGION[region])?;
        let l = Self::open_mapped(file, region, tail)?;
        Ok((l, bytes, region))
    }

    fn open_mapped(file: File, region: usize, tail: usize) -> io::Result<Ledger> {
        let header = map(&file, 0, HEADER as usize)?.cast::<Header>();
        let cap = (tail + GROW).next_multiple_of(GROW);
        let want = REGION[region] + cap as u64;
        if file.metadata()?.len() < want {
            file.set_len(want)?;
        }
        let m = map(&file, REGION[region], cap)?;
        Ok(Ledger {
            file,
            header,
            log: Mutex::new(Log {
                region,
                map: m,
                cap,
                tail,
                base: tail,
            }),
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: a live mapping of a whole page, which a Header fits, of
        // atomics only.
        unsafe { self.header.as_ref() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for `n` more bytes in the active region.
    fn room(&self, log: &mut Log, n: usize) -> io::Result<()> {
        if log.tail + n <= log.cap {
            return Ok(());
        }
        // By steps, not doubling: under an address-space limit the memory
        // budget keeps a reserve of some tens of MiB for such growth.
        let cap = (log.tail + n + GROW).next_multiple_of(GROW);
        let want = REGION[log.region] + cap as u64;
        if self.file.metadata()?.len() < want {
            self.file.set_len(want)?;
        }
        if log.cap == 0 {
            // No mapping yet (a rewrite could not make one).
            log.map = map(&self.file, REGION[log.region], cap)?;
            log.cap = cap;
            return Ok(());
        }
        // SAFETY: `log.map` is this region's mapping of `log.cap` bytes,
        // used only under the mutex held here; it may move.
        let p =
            unsafe { libc::mremap(log.map.as_ptr().cast(), log.cap, cap, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        log.map = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mremap: null"))?;
        log.cap = cap;
        Ok(())
    }

    fn put_frame(log: &mut Log, tx: &[u8]) {
        let len = tx.len();
        let padded = (FRAME + len).next_multiple_of(8);
        let crc = crc32c::crc32c(tx);
        let mut head = [0u8; FRAME];
        head[..4].copy_from_slice(&(len as u32).to_le_bytes());
        head[4..].copy_from_slice(&crc.to_le_bytes());
        // SAFETY: `room` made `tail + padded <= cap` bytes of the mapping
        // available; nothing else writes it (the mutex is held).
        unsafe {
            let at = log.map.as_ptr().add(log.tail);
            std::ptr::copy_nonoverlapping(head.as_ptr(), at, FRAME);
            std::ptr::copy_nonoverlapping(tx.as_ptr(), at.add(FRAME), len);
            at.add(FRAME + len).write_bytes(0, padded - FRAME - len);
        }
        log.tail += padded;
    }

    /// Appends one transaction: once this returns, a restarted server
    /// sees it. Blocks this thread freed become free for others then.
    pub fn append(&self, tx: &Tx) -> io::Result<()> {
        if tx.is_empty() {
            release_limbo();
            return Ok(());
        }
        let mut log = self.lock();
        self.room(&mut log, FRAME + tx.buf.len() + 8)?;
        Self::put_frame(&mut log, &tx.buf);
        self.header().tails[log.region].store(log.tail as u64, Ordering::Release);
        drop(log);
        release_limbo();
        Ok(())
    }

    /// Makes sure the next transactions find room without the region
    /// growing while a change is half made: grows it now where less than
    /// [`HEADROOM`] is left, once `charge` (the memory budget) grants the
    /// growth. False when it does not: the change must be refused
    /// (`ENOSPC`) before it is made.
    pub fn headroom(&self, charge: impl FnOnce(u64) -> bool) -> bool {
        let mut log = self.lock();
        if log.cap.saturating_sub(log.tail) >= HEADROOM {
            return true;
        }
        if !charge(GROW as u64) {
            return false;
        }
        match self.room(&mut log, HEADROOM) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("ramfs: the state file cannot grow: {e}");
                false
            }
        }
    }

    /// Whether the active region has grown enough past its last snapshot
    /// to be worth rewriting.
    pub fn wants_rewrite(&self) -> bool {
        let log = self.lock();
        log.tail > (16 << 20) && log.tail > 4 * log.base
    }

    /// Replaces everything with the transactions `snapshot` hands its
    /// callback (which together say what everything is): written to the
    /// other region as they come (with `pwrite`: no second mapping, no
    /// copy of the whole in memory), which then becomes the active one
    /// with one store. The caller holds every operation back. On failure
    /// the active region stays as it was, and no rewrite is tried again
    /// until it has grown as much again.
    pub fn rewrite(
        &self,
        snapshot: impl FnOnce(&mut dyn FnMut(&Tx) -> io::Result<()>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut log = self.lock();
        let next = 1 - log.region;
        let mut at = 0u64;
        let mut frame = Vec::new();
        let r = snapshot(&mut |t: &Tx| {
            if t.is_empty() {
                return Ok(());
            }
            frame.clear();
            frame.extend_from_slice(&(t.buf.len() as u32).to_le_bytes());
            frame.extend_from_slice(&crc32c::crc32c(&t.buf).to_le_bytes());
            frame.extend_from_slice(&t.buf);
            frame.resize(frame.len().next_multiple_of(8), 0);
            self.file.write_all_at(&frame, REGION[next] + at)?;
            at += frame.len() as u64;
            Ok(())
        });
        let tail = r.and_then(|()| {
            let tail = usize::try_from(at).map_err(|_| io::Error::other("ledger too large"))?;
            let want = REGION[next] + (tail + GROW).next_multiple_of(GROW) as u64;
            if self.file.metadata()?.len() < want {
                self.file.set_len(want)?;
            }
            Ok(tail)
        });
        let tail = match tail {
            Ok(t) => t,
            Err(e) => {
                log.base = log.tail;
                let _ = self.punch(next);
                return Err(e);
            }
        };
        let h = self.header();
        h.tails[next].store(tail as u64, Ordering::Release);
        h.active.store(next as u64, Ordering::Release);
        // The old mapping goes before the new one is made: under an
        // address-space limit the two together could be past it.
        // SAFETY: the old region's mapping, which nothing uses any more
        // (the mutex is held).
        unsafe {
            libc::munmap(log.map.as_ptr().cast(), log.cap);
        }
        let old = log.region;
        *log = Log {
            region: next,
            map: NonNull::dangling(),
            cap: 0,
            tail,
            base: tail,
        };
        let mapped = self.room(&mut log, GROW);
        drop(log);
        let _ = self.punch(old);
        h.tails[old].store(0, Ordering::Release);
        mapped
    }

    /// Gives region `r`'s memory back (it holds nothing in use).
    fn punch(&self, r: usize) -> io::Result<()> {
        let end = self.file.metadata()?.len();
        let len = end.saturating_sub(REGION[r]).min(1 << 40);
        if len > 0 {
            rustix::fs::fallocate(
                &self.file,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                REGION[r],
                len,
            )?;
        }
        Ok(())
    }

    /// Bytes of transactions in the active region.
    pub fn len(&self) -> usize {
        self.lock().tail
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let log = self.log.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: both mappings were made by this ledger and nothing uses
        // them once it is dropped (a region of no capacity has none).
        unsafe {
            if log.cap > 0 {
                libc::munmap(log.map.as_ptr().cast(), log.cap);
            }
            libc::munmap(self.header.as_ptr().cast(), HEADER as usize);
        }
    }
}

/// The frames of a region's bytes: each transaction, or where and why
/// one is damaged.
pub(crate) fn frames(
    bytes: &[u8],
    region: usize,
) -> impl Iterator<Item = Result<&[u8], LedgerError>> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let here = at;
        let damaged = move |what: String| {
            Some(Err(LedgerError::Damaged {
                region,
                offset: here as u64,
                what,
            }))
        };
        if bytes.len() - at < FRAME {
            at = bytes.len();
            return damaged("a frame's header is cut short".into());
        }
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        let end = at + FRAME + len;
        if end > bytes.len() {
            at = bytes.len();
            return damaged(format!("a transaction of {len} bytes runs past the end"));
        }
        let tx = &bytes[at + FRAME..end];
        if crc32c::crc32c(tx) != crc {
            at = bytes.len();
            return damaged("a transaction's CRC-32C does not match".into());
        }
        at += (FRAME + len).next_multiple_of(8);
        Some(Ok(tx))
    })
}

/// A new, empty file for a ledger.
pub fn memfd() -> io::Result<File> {
    crate::arena::memfd("foliofs-ramfs-ledger")
}
