//! The disk cache of remote chunks.
//!
//! Layout: `ROOT/<object>/<version>/` holds two files, where `<object>`
//! hashes the URL without its query string and `<version>` hashes the
//! object's ETag (or Last-Modified), the chunk size and this layout.
//! `data` is a sparse file as long as the object, each chunk at its own
//! offset; `map` is a header and then one 32-bit entry per chunk: 0 while
//! the cache does not hold the chunk, else when it was last used (seconds
//! since 1970). Opening a version removes the object's other versions, so
//! a replaced object never serves its old bytes.
//!
//! One file per object, not one per chunk: a file written in order lies
//! in one run on the disk, as a local image does, and a warm sequential
//! read streams it with the kernel's read-ahead. The files of many chunks
//! land wherever the allocator puts each new file (ext4 spreads them over
//! its groups by inode number), and a warm read of them seeks at every
//! chunk and opens a file at every chunk's first use.
//!
//! A stored chunk is written to `data` at once, and this process reads it
//! from there at once. A thread of its own then makes it durable
//! (`fdatasync`) and only after that writes its map entry: whatever a
//! crash or a power loss interrupts has no entry, is never served, and its
//! blocks are freed by the next open that has the object to itself.
//!
//! Processes share the directory, bounded by one byte limit: the least
//! recently used chunks of any object go first. Each process holds a read
//! lock (an open file description lock) on the map of every object it has
//! open. Freeing chunks (clear their entries, sync the map, punch holes in
//! `data`) takes the write lock, so no process ever reads a hole punched
//! under it; an object another process has open is skipped. Adding a chunk
//! needs no lock: every process writes the same bytes for one version,
//! and a miss reads the map entry again to find what another one stored.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use sha2::Digest;

/// The layout, part of each version directory's name: 1 and 2 were a
/// file per chunk (1 with a checksummed header, 2 synced and renamed).
const LAYOUT: u32 = 3;
const MAGIC: &[u8; 8] = b"foliofsC";
/// The map's header: magic, object size, chunk size, layout.
const HEADER: u64 = 24;
/// An entry held in memory only: written to `data`, not yet durable.
const PENDING: u32 = 1;
/// A chunk in use has its entry renewed at most this often (seconds).
const TOUCH_EVERY: u32 = 30;
/// How long an open waits for another process to finish freeing chunks
/// of the same object (it holds the write lock only for that).
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How soon an eviction that left the directory over its limit is tried
/// again, by an idle committer.
const RETRY_EVICT: Duration = Duration::from_secs(1);
/// A version directory without a valid map is removed once it is this
/// old: younger, a process may be creating it.
const STRAY_AGE: Duration = Duration::from_secs(60);
/// The cache when `cache_size` is not given: 4 GiB holds the working set of
/// most images several times over, yet is small beside today's disks; on
/// a fuller disk, a quarter of what the cache could take (free space plus
/// what it already holds).
pub(crate) const DEFAULT_LIMIT: u64 = 4 << 30;

/// Where the cache lives when `cache=` is not given:
/// `$XDG_CACHE_HOME/foliofs`, `$HOME/.cache/foliofs`, or
/// `/var/cache/foliofs` for root.
pub(crate) fn default_dir(env: &dyn Fn(&str) -> Option<String>, root: bool) -> Option<PathBuf> {
    if root {
        return Some(PathBuf::from("/var/cache/foliofs"));
    }
    let abs = |v: String| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    env("XDG_CACHE_HOME")
        .and_then(abs)
        .map(|p| p.join("foliofs"))
        .or_else(|| env("HOME").and_then(abs).map(|h| h.join(".cache/foliofs")))
}

fn hex_digest(text: &str) -> String {
    let d = sha2::Sha256::digest(text.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn now_stamp() -> u32 {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX).max(PENDING + 1)
}

/// Chunks stored but not yet durable and in the map.
#[derive(Default)]
struct Pending {
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

/// One object's files, shared with the process's other caches so that
/// their eviction can free its chunks too.
struct Object {
    dir: PathBuf,
    size: u64,
    chunk: u64,
    data: File,
    /// Holds this process's read lock on the object.
    map: File,
    /// Per chunk: 0 not held, [`PENDING`], or the last use as in the map.
    stamps: Vec<AtomicU32>,
    /// Readers and writers of `data` share it; freeing chunks takes it
    /// alone, so no reader of this process meets a hole.
    gate: RwLock<()>,
    /// Set while one eviction of this process holds the write lock.
    freeing: AtomicBool,
}

/// The objects this process has open, by version directory.
fn open_objects() -> &'static Mutex<HashMap<PathBuf, Weak<Object>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Object>>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// One object's chunks in the cache directory.
pub(crate) struct DiskCache {
    root: PathBuf,
    limit: u64,
    obj: Arc<Object>,
    /// Bytes in the whole directory, as last counted plus what this
    /// process added since.
    used: AtomicU64,
    /// Bytes this process stored since it last counted the directory:
    /// another process fills it too, so it is counted again every
    /// eighth of the limit.
    since_scan: AtomicU64,
    evicting: Mutex<()>,
    /// Set when the last eviction left the directory over its limit
    /// (what it would have freed was in use by another process), and when
    /// that eviction ran: the next one comes when this process is idle.
    over: Mutex<Option<Instant>>,
    pending: Mutex<Pending>,
    /// Signals a newly stored chunk, and a committed batch.
    pending_changed: Condvar,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.obj.dir)
            .field("limit", &self.limit)
            .finish()
    }
}

/// The map's header for an object of `size` bytes in chunks of `chunk`.
fn header(size: u64, chunk: u64) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&size.to_le_bytes());
    h[16..20].copy_from_slice(&(chunk as u32).to_le_bytes());
    h[20..24].copy_from_slice(&LAYOUT.to_le_bytes());
    h
}

/// A map's object size, chunk size and entries, when it is whole.
fn parse_map(bytes: &[u8]) -> Option<(u64, u64, Vec<u32>)> {
    let h = bytes.get(..HEADER as usize)?;
    if &h[..8] != MAGIC || h[20..24] != LAYOUT.to_le_bytes() {
        return None;
    }
    let size = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let chunk = u64::from(u32::from_le_bytes(h[16..20].try_into().ok()?));
    let entries = &bytes[HEADER as usize..];
    if chunk == 0 || entries.len() as u64 != size.div_ceil(chunk) * 4 {
        return None;
    }
    let stamps = entries
        .chunks_exact(4)
        .map(|e| u32::from_le_bytes(e.try_into().unwrap()))
        .collect();
    Some((size, chunk, stamps))
}

fn chunk_len(size: u64, chunk: u64, index: u64) -> u64 {
    chunk.min(size - index * chunk)
}

/// Takes (or converts this description's lock to) a read or write lock
/// on `file`, without waiting. An open file description lock: closing
/// the file drops it, it conflicts with other opens of the same file in
/// this process too, and converting it is atomic (a refused write lock
/// leaves the read lock held).
fn lock(file: &File, kind: libc::c_int) -> io::Result<()> {
    // SAFETY: struct flock is plain integers, for which zeroes are valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: fcntl reads `fl`, which outlives the call, on a descriptor
    // that `file` keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Frees `[offset, offset + len)` of `file`, keeping its size.
fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate takes an open descriptor and integers only.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn open_rw(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// Clears the entries of `gone` (chunks of `chunk` bytes in an object of
/// `size`), makes that durable, and only then punches their holes: a
/// crash in between leaves blocks no entry names, freed at the next open.
/// The caller holds the write lock on `map`.
fn free(map: &File, data: &File, size: u64, chunk: u64, gone: &[u64]) -> io::Result<()> {
    for &i in gone {
        map.write_all_at(&0u32.to_le_bytes(), HEADER + 4 * i)?;
    }
    map.sync_data()?;
    for (start, end) in runs(gone) {
        let off = start * chunk;
        let len = (end * chunk).min(size) - off;
        punch(data, off, len)?;
    }
    Ok(())
}

/// Sorted chunk indexes as half-open runs of consecutive ones.
fn runs(indexes: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = indexes.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        match out.last_mut() {
            Some((_, end)) if *end == i => *end = i + 1,
            Some((_, end)) if *end > i => {}
            _ => out.push((i, i + 1)),
        }
    }
    out
}

impl Object {
    /// The chunk's use as the map says now: another process may have
    /// stored it since this one looked.
    fn stamp_on_disk(&self, index: u64) -> u32 {
        let mut e = [0u8; 4];
        match self.map.read_exact_at(&mut e, HEADER + 4 * index) {
            Ok(()) => u32::from_le_bytes(e),
            Err(_) => 0,
        }
    }

    /// Forgets chunk `index`, found damaged; clearing an entry needs no
    /// lock (only punching does).
    fn forget(&self, index: u64) {
        self.stamps[index as usize].store(0, Ordering::Relaxed);
        let _ = self
            .map
            .write_all_at(&0u32.to_le_bytes(), HEADER + 4 * index);
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

    /// Takes the write lock for an eviction of this process; false when
    /// another process has the object open or another eviction has it.
    fn try_alone(&self) -> bool {
        if self.freeing.swap(true, Ordering::Acquire) {
            return false;
        }
        let ok = lock(&self.map, libc::F_WRLCK).is_ok();
        if !ok {
            self.freeing.store(false, Ordering::Release);
        }
        ok
    }

    /// Frees the `chunks` still committed (one forgotten and stored again
    /// since the scan is pending, and stays), then gives the write lock
    /// back.
    fn free_alone(&self, chunks: &[u64]) {
        {
            let _alone = self.gate.write().unwrap();
            let chunks: Vec<u64> = chunks
                .iter()
                .copied()
                .filter(|&i| {
                    let slot = &self.stamps[i as usize];
                    let s = slot.load(Ordering::Relaxed);
                    s > PENDING
                        && slot
                            .compare_exchange(s, 0, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                })
                .collect();
            if let Err(e) = free(&self.map, &self.data, self.size, self.chunk, &chunks) {
                log::warn!("{}: cached chunks not freed: {e}", self.dir.display());
            }
        }
        // Converting back to a read lock always succeeds.
        let _ = lock(&self.map, libc::F_RDLCK);
        self.freeing.store(false, Ordering::Release);
    }
}

/// A version directory an eviction frees chunks in, with its write lock.
enum Victim {
    /// Open in this process.
    Open(Arc<Object>),
    /// Open nowhere: its map, locked.
    Closed(File),
}

impl DiskCache {
    /// Opens (creating it 0700 if needed) the cache under `root` for the
    /// object `identity` of `size` bytes at `version`, in chunks of
    /// `chunk` bytes, removing the object's other versions.
    pub fn open(
        root: &Path,
        identity: &str,
        version: &str,
        chunk: u32,
        size: u64,
        limit: Option<u64>,
    ) -> io::Result<DiskCache> {
        let object = root.join(hex_digest(identity));
        let dir = object.join(hex_digest(&format!("{version}\n{chunk}\n{LAYOUT}")));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for entry in fs::read_dir(&object)?.flatten() {
            if entry.path() != dir {
                // Another version: whatever it held is stale. A process
                // still reading it keeps its open files.
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        let chunk = u64::from(chunk);
        let chunks = size.div_ceil(chunk);
        let map = open_rw(&dir.join("map"))?;
        let data = open_rw(&dir.join("data"))?;
        let alone = take_lock(&map, &dir)?;
        let stamps = match parse_map(&fs::read(dir.join("map"))?) {
            Some((s, c, stamps)) if s == size && c == chunk => {
                if alone {
                    reclaim(&map, &data, size, chunk, stamps)?
                } else {
                    stamps
                }
            }
            _ if alone => {
                // New, or left half made: start afresh.
                data.set_len(0)?;
                data.set_len(size)?;
                map.set_len(0)?;
                map.write_all_at(&header(size, chunk), 0)?;
                map.set_len(HEADER + 4 * chunks)?;
                vec![0; chunks as usize]
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: damaged, and another process has it open",
                        dir.join("map").display()
                    ),
                ))
            }
        };
        if alone {
            lock(&map, libc::F_RDLCK)?;
        }
        let limit = match limit {
            Some(l) => l,
            None => {
                let held = scan(root).1;
                DEFAULT_LIMIT.min((free_space(root).unwrap_or(u64::MAX / 2) + held) / 4)
            }
        }
        .max(chunk);
        let obj = Arc::new(Object {
            dir: dir.clone(),
            size,
            chunk,
            data,
            map,
            stamps: stamps
                .into_iter()
                .map(|s| AtomicU32::new(if s > PENDING { s } else { 0 }))
                .collect(),
            gate: RwLock::new(()),
            freeing: AtomicBool::new(false),
        });
        // A second open of the same version in this process (never two
        // mounts' worth: objects are shared) leaves the first one listed.
        let mut open = open_objects().lock().unwrap();
        if open.get(&dir).and_then(Weak::upgrade).is_none() {
            open.insert(dir, Arc::downgrade(&obj));
        }
        drop(open);
        let cache = DiskCache {
            root: root.to_owned(),
            limit,
            obj,
            used: AtomicU64::new(0),
            since_scan: AtomicU64::new(0),
            evicting: Mutex::new(()),
            over: Mutex::new(None),
            pending: Mutex::new(Pending::default()),
            pending_changed: Condvar::new(),
        };
        cache.evict();
        Ok(cache)
    }

    /// The byte limit of the directory.
    pub fn limit(&self) -> u64 {
        self.limit
    }

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
                let _ = o.map.write_all_at(&now.to_le_bytes(), HEADER + 4 * index);
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

    /// Announces a chunk that will be stored once its readers have it.
    pub fn arriving(&self) -> Arriving<'_> {
        self.pending.lock().unwrap().arriving += 1;
        Arriving(self)
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
        let n = bytes.len() as u64;
        let mut p = self.pending.lock().unwrap();
        if p.listed.insert(index) {
            p.queued.push_back(index);
        }
        drop(p);
        self.pending_changed.notify_all();
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        let since = self.since_scan.fetch_add(n, Ordering::Relaxed) + n;
        if used > self.limit || since >= self.limit / 8 {
            self.evict();
        }
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
        let synced = o.data.sync_data();
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
                let _ = o.map.write_all_at(&now.to_le_bytes(), HEADER + 4 * i);
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

    /// Counts the whole directory and, when it holds more than the limit,
    /// frees the least recently used chunks (of any object no other
    /// process has open) down to 90% of it.
    fn evict(&self) {
        let _one = self.evicting.lock().unwrap();
        self.since_scan.store(0, Ordering::Relaxed);
        // What the disk holds: chunks not yet committed (of any process)
        // count, though only committed ones can go, and so do the maps
        // and the file system's own blocks for the sparse files.
        let (mut held, mut total) = scan(&self.root);
        if total > self.limit {
            let target = self.limit / 10 * 9;
            held.sort_by_key(|f| f.stamp);
            // Per version directory: its write lock (None: another process
            // has it open) and the chunks picked to go.
            let mut picked: HashMap<PathBuf, Option<(Victim, Vec<u64>)>> = HashMap::new();
            let open = open_objects().lock().unwrap().clone();
            for f in &held {
                if total <= target {
                    break;
                }
                let slot = picked.entry(f.dir.clone()).or_insert_with(|| {
                    let victim = match open.get(&f.dir).and_then(Weak::upgrade) {
                        Some(obj) => obj.try_alone().then_some(Victim::Open(obj)),
                        None => fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(f.dir.join("map"))
                            .ok()
                            .filter(|m| lock(m, libc::F_WRLCK).is_ok())
                            .map(Victim::Closed),
                    };
                    victim.map(|v| (v, Vec::new()))
                });
                if let Some((_, chunks)) = slot {
                    chunks.push(f.index);
                    total = total.saturating_sub(f.size);
                }
            }
            for (dir, slot) in picked {
                match slot {
                    Some((Victim::Open(obj), chunks)) => obj.free_alone(&chunks),
                    Some((Victim::Closed(map), chunks)) => {
                        if let Err(e) = free_closed(&dir, &map, &chunks) {
                            log::warn!("{}: cached chunks not freed: {e}", dir.display());
                        }
                    }
                    None => {}
                }
            }
        }
        self.used.store(total, Ordering::Relaxed);
        *self.over.lock().unwrap() = (total > self.limit).then(Instant::now);
    }

    /// Evicts again if the last eviction left the directory over its limit
    /// and a while has passed (the process that held what it wanted may
    /// have closed it since).
    pub fn tidy(&self) {
        let due = self
            .over
            .lock()
            .unwrap()
            .is_some_and(|at| at.elapsed() >= RETRY_EVICT);
        if due {
            self.evict();
        }
    }
}

/// Frees `chunks` of an object no process has open, whose map's write
/// lock is held.
/// One whose map went bad or whose data went since the scan serves nothing
/// and is removed whole.
fn free_closed(dir: &Path, map: &File, chunks: &[u64]) -> io::Result<()> {
    let parsed = parse_map(&fs::read(dir.join("map"))?);
    let data = fs::OpenOptions::new().write(true).open(dir.join("data"));
    match (parsed, data) {
        (Some((size, chunk, _)), Ok(data)) => free(map, &data, size, chunk, chunks),
        (None, _) | (_, Err(_)) => {
            log::debug!("{}: damaged cache directory removed", dir.display());
            fs::remove_dir_all(dir)
        }
    }
}

/// Takes the lock of a version's map, waiting (up to [`LOCK_WAIT`]) while
/// another process frees chunks of it. True when this process has the
/// object to itself (a write lock, to be made a read lock when done).
fn take_lock(map: &File, dir: &Path) -> io::Result<bool> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        if lock(map, libc::F_WRLCK).is_ok() {
            return Ok(true);
        }
        match lock(map, libc::F_RDLCK) {
            Ok(()) => return Ok(false),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{}: locked by another process for {} s: {e}",
                        dir.display(),
                        LOCK_WAIT.as_secs()
                    ),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// With the object to itself: drops the entries of chunks beyond the end
/// of a `data` cut short, and punches out the blocks no entry names (what
/// a crash left half written). Returns the entries kept.
fn reclaim(
    map: &File,
    data: &File,
    size: u64,
    chunk: u64,
    mut stamps: Vec<u32>,
) -> io::Result<Vec<u32>> {
    let have = data.metadata()?.len();
    let mut cut = Vec::new();
    for (i, s) in stamps.iter_mut().enumerate() {
        let i = i as u64;
        if *s > PENDING && have < i * chunk + chunk_len(size, chunk, i) {
            *s = 0;
            cut.push(i);
        }
    }
    for &i in &cut {
        map.write_all_at(&0u32.to_le_bytes(), HEADER + 4 * i)?;
    }
    if have != size {
        data.set_len(size)?;
    }
    let absent: Vec<u64> = (0..stamps.len() as u64)
        .filter(|&i| stamps[i as usize] <= PENDING)
        .collect();
    for (start, end) in runs(&absent) {
        let off = start * chunk;
        let end = (end * chunk).min(size);
        // Most absent runs were never written: a look is cheaper than a
        // punch, which journals even over a hole.
        if next_data(data, off).is_some_and(|d| d < end) {
            punch(data, off, end - off)?;
        }
    }
    Ok(stamps)
}

/// Where the first data of `file` at or after `offset` is, if any.
fn next_data(file: &File, offset: u64) -> Option<u64> {
    // SAFETY: lseek takes an open descriptor and integers only.
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
    u64::try_from(at).ok()
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        if !self.settle(Duration::from_secs(10)) {
            log::warn!(
                "{}: chunks left uncommitted (fetched again next time)",
                self.obj.dir.display()
            );
        }
        let mut open = open_objects().lock().unwrap();
        if open
            .get(&self.obj.dir)
            .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.obj))
        {
            open.remove(&self.obj.dir);
        }
    }
}

/// One committed chunk somewhere under the root.
struct Held {
    dir: PathBuf,
    index: u64,
    size: u64,
    stamp: u32,
}

/// Every committed chunk under `root` (`root/<object>/<version>/map`), and
/// the bytes the version directories take on the disk. Removes version
/// directories left without a valid map (another layout, or a process
/// that died making them) once no process can be using them.
fn scan(root: &Path) -> (Vec<Held>, u64) {
    let mut out = Vec::new();
    let mut disk = 0;
    let dirs = |p: &Path| {
        fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect::<Vec<_>>()
    };
    for object in dirs(root) {
        for version in dirs(&object) {
            let map = fs::read(version.join("map")).ok();
            let Some((size, chunk, stamps)) = map.as_deref().and_then(parse_map) else {
                if !remove_stray(&version) {
                    disk += disk_bytes(&version);
                }
                continue;
            };
            disk += disk_bytes(&version);
            for (i, &stamp) in stamps.iter().enumerate() {
                if stamp > PENDING {
                    out.push(Held {
                        dir: version.clone(),
                        index: i as u64,
                        size: chunk_len(size, chunk, i as u64),
                        stamp,
                    });
                }
            }
        }
    }
    (out, disk)
}

/// Bytes the files of a version directory take on the disk.
fn disk_bytes(version: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(version)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Removes a version directory without a valid map, unless it is young or
/// a process holds its map's lock; true when it did.
fn remove_stray(version: &Path) -> bool {
    let young = fs::metadata(version)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age < STRAY_AGE);
    if young {
        return false;
    }
    let in_use = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(version.join("map"))
        .is_ok_and(|m| lock(&m, libc::F_WRLCK).is_err());
    if in_use {
        return false;
    }
    log::debug!("{}: stray cache directory removed", version.display());
    fs::remove_dir_all(version).is_ok()
}

/// Bytes free for an unprivileged user on the file system of `path`.
fn free_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain integers, for which zeroes are valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` is ours to write.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores a chunk and commits it, as the committer does soon after.
    fn put(c: &DiskCache, index: u64, data: &[u8]) {
        c.store(index, data);
        assert!(c.settle(Duration::from_secs(10)));
    }

    /// The chunks `c` holds.
    fn held(c: &DiskCache) -> Vec<u64> {
        (0..c.obj.stamps.len() as u64)
            .filter(|&i| c.holds(i))
            .collect()
    }

    fn entry(c: &DiskCache, index: u64) -> u32 {
        c.obj.stamp_on_disk(index)
    }

    /// Whether `offset` of `file` lies in a hole.
    fn hole(file: &File, offset: u64) -> bool {
        next_data(file, offset).is_none_or(|d| d > offset)
    }

    #[test]
    fn chunks_round_trip_and_survive_reopen() {
        let root = tempfile::tempdir().unwrap();
        let c = DiskCache::open(root.path(), "obj", "v1", 4096, 5 * 4096, Some(1 << 20)).unwrap();
        let present = held(&c);
        assert!(present.is_empty());
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        put(&c, 3, &data);
        // The last chunk is short.
        put(&c, 4, &data[..4096]);
        let mut out = [0u8; 10];
        assert!(c.read(3, 5, &mut out));
        assert_eq!(out[..], data[5..15]);
        assert!(!c.read(2, 0, &mut out));
        drop(c);
        let c = DiskCache::open(root.path(), "obj", "v1", 4096, 5 * 4096, Some(1 << 20)).unwrap();
        let present = held(&c);
        assert_eq!(present, vec![3, 4]);
        assert!(c.read(3, 4086, &mut out));
        assert_eq!(out[..], data[4086..]);
    }

    #[test]
    fn a_stored_chunk_is_read_at_once_and_entered_only_when_durable() {
        let root = tempfile::tempdir().unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
        let data = vec![9u8; 4096];
        c.store(2, &data);
        assert_eq!(entry(&c, 2), 0, "entered before it is durable");
        let mut out = [0u8; 10];
        assert!(c.read(2, 40, &mut out));
        assert_eq!(out, [9; 10]);
        assert!(c.commit_next(Duration::ZERO));
        assert!(entry(&c, 2) > PENDING);
        assert!(!c.commit_next(Duration::ZERO));
        // A chunk stored twice before its commit is committed once.
        c.store(1, &[1; 4096]);
        c.store(1, &[2; 4096]);
        assert!(c.commit_next(Duration::ZERO));
        assert!(!c.commit_next(Duration::ZERO));
        assert!(c.read(1, 0, &mut out));
        assert_eq!(out, [2; 10]);
    }

    #[test]
    fn what_a_crash_left_unentered_is_not_served_and_its_blocks_are_freed() {
        let root = tempfile::tempdir().unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 64 << 10, 4 << 20, None).unwrap();
        put(&c, 0, &[1; 64 << 10]);
        let dir = c.obj.dir.clone();
        drop(c);
        // Written and never entered, as a crash before the commit leaves it.
        let data = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("data"))
            .unwrap();
        data.write_all_at(&[7; 1 << 20], 2 << 20).unwrap();
        data.sync_all().unwrap();
        assert!(!hole(&data, 2 << 20));
        let c = DiskCache::open(root.path(), "o", "v", 64 << 10, 4 << 20, None).unwrap();
        let present = held(&c);
        assert_eq!(present, vec![0]);
        assert!(!c.read(32, 0, &mut [0; 4]));
        for off in (2 << 20..3 << 20).step_by(64 << 10) {
            assert!(hole(&data, off), "{off} still holds data");
        }
        assert!(!hole(&data, 0));
        let mut out = [0u8; 4];
        assert!(c.read(0, 100, &mut out));
        assert_eq!(out, [1; 4]);
    }

    #[test]
    fn another_layout_or_version_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let object = root.path().join(hex_digest("o"));
        // A file per chunk, as layout 2 kept them.
        let old = object.join(hex_digest("v\n4096\n2"));
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("0"), [1u8; 64]).unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 4096, 64, None).unwrap();
        let present = held(&c);
        assert!(present.is_empty());
        assert!(!old.exists());
        assert!(!c.read(0, 0, &mut [0; 4]));
        put(&c, 0, &[1; 64]);
        let c2 = DiskCache::open(root.path(), "o", "v2", 4096, 64, None).unwrap();
        let present = held(&c2);
        assert!(present.is_empty());
        assert!(!c.obj.dir.exists());
        assert!(!c2.read(0, 0, &mut [0; 10]));
        // Another chunk size is another version too.
        let c3 = DiskCache::open(root.path(), "o", "v2", 8192, 64, None).unwrap();
        assert_ne!(c3.obj.dir, c2.obj.dir);
    }

    #[test]
    fn damaged_files_are_not_served() {
        let root = tempfile::tempdir().unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
        for i in 0..3 {
            put(&c, i, &[7; 4096]);
        }
        let dir = c.obj.dir.clone();
        // Data cut short after this process found it: not served, and
        // forgotten.
        let data = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("data"))
            .unwrap();
        data.set_len(2 * 4096 + 100).unwrap();
        assert!(!c.read(2, 0, &mut [0; 4096]));
        assert_eq!(entry(&c, 2), 0);
        assert!(c.read(1, 0, &mut [0; 4096]));
        drop(c);
        // Cut again while closed: the next open drops what it lost.
        data.set_len(4096 + 1).unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
        let present = held(&c);
        assert_eq!(present, vec![0]);
        assert!(!c.read(1, 0, &mut [0; 4]));
        drop(c);
        // A damaged map starts the version afresh.
        fs::write(dir.join("map"), b"foliofsC garbage").unwrap();
        let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
        let present = held(&c);
        assert!(present.is_empty());
        assert!(!c.read(0, 0, &mut [0; 4]));
    }

    /// Opens `name`, 16 chunks of 4 KiB, with no limit to speak of until
    /// [`fit_ten`].
    fn small(root: &Path, name: &str) -> DiskCache {
        DiskCache::open(root, name, "v", 4096, 16 * 4096, Some(1 << 30)).unwrap()
    }

    /// Sets chunk `index`'s last use to `secs` after 1000 s before now.
    fn used_at(c: &DiskCache, index: u64, secs: u32) {
        let t = now_stamp() - 1000 + secs;
        c.obj.stamps[index as usize].store(t, Ordering::Relaxed);
        c.obj
            .map
            .write_all_at(&t.to_le_bytes(), HEADER + 4 * index)
            .unwrap();
    }

    /// [`small`] with chunks `0..n` of ones, chunk i last used i seconds
    /// after the start.
    fn filled(root: &Path, name: &str, n: u64) -> DiskCache {
        let c = small(root, name);
        for i in 0..n {
            put(&c, i, &[1; 4096]);
            used_at(&c, i, i as u32);
        }
        c
    }

    fn committed(root: &Path) -> u64 {
        scan(root).0.iter().map(|f| f.size).sum()
    }

    /// Evicts for `c` under a limit of ten chunks beside what the maps and
    /// the sparse files' own blocks take of the disk now (whatever the
    /// file system), which keeps nine chunks; returns `c`'s chunks that
    /// went.
    fn evict_to_nine(root: &Path, c: &mut DiskCache) -> Vec<u64> {
        let overhead = scan(root).1 - committed(root);
        c.limit = 10 * 4096 + overhead * 10 / 9 + 2048;
        let before = held(c);
        c.evict();
        c.limit = 1 << 30;
        let after = held(c);
        let gone: Vec<u64> = before.into_iter().filter(|i| !after.contains(i)).collect();
        assert_eq!(committed(root), 9 * 4096);
        gone
    }

    #[test]
    fn the_limit_evicts_least_recently_used_across_objects() {
        let root = tempfile::tempdir().unwrap();
        let mut a = small(root.path(), "a");
        let b = small(root.path(), "b");
        for i in 0..5 {
            put(&a, i, &[i as u8; 4096]);
            put(&b, i, &[i as u8; 4096]);
            // Chunk i was last used i seconds after the start; a's before b's.
            used_at(&a, i, 2 * i as u32);
            used_at(&b, i, 2 * i as u32 + 1);
        }
        // a's chunk 0 is used now: it is the most recent.
        used_at(&a, 0, 1000);
        put(&a, 9, &[9; 4096]);
        // 11 chunks, 9 stay: b's 0 and a's 1 were the oldest.
        assert_eq!(evict_to_nine(root.path(), &mut a), vec![1]);
        assert!(!a.read(1, 0, &mut [0; 1]) && !b.read(0, 0, &mut [0; 1]));
        assert!(
            a.read(0, 0, &mut [0; 1]) && b.read(1, 0, &mut [0; 1]) && a.read(9, 0, &mut [0; 1])
        );
        // Their blocks went too.
        assert!(hole(&a.obj.data, 4096) && hole(&b.obj.data, 0));
        assert!(!hole(&a.obj.data, 0) && !hole(&b.obj.data, 4096));
    }

    #[test]
    fn an_object_another_process_has_open_is_not_freed() {
        let root = tempfile::tempdir().unwrap();
        let a = filled(root.path(), "a", 6);
        // A second open of the same files: to the locks, another process.
        let other = DiskCache::open(root.path(), "a", "v", 4096, 16 * 4096, Some(1 << 30)).unwrap();
        let present = held(&other);
        assert_eq!(present.len(), 6);
        let mut b = small(root.path(), "b");
        for i in 0..5 {
            put(&b, i, &[2; 4096]);
            used_at(&b, i, 100 + i as u32);
        }
        // a's chunks are older, but in use elsewhere: b's own oldest go.
        assert_eq!(evict_to_nine(root.path(), &mut b), vec![0, 1]);
        // (Looked at without reading, which would make them recent.)
        for i in 0..6 {
            assert!(entry(&other, i) > PENDING, "chunk {i}");
            let mut out = [0; 4096];
            other.obj.data.read_exact_at(&mut out, i * 4096).unwrap();
            assert_eq!(out, [1; 4096], "chunk {i}");
        }
        drop(other);
        // Open here only, a's oldest go first.
        put(&b, 5, &[2; 4096]);
        put(&b, 6, &[2; 4096]);
        assert_eq!(evict_to_nine(root.path(), &mut b), vec![]);
        assert!(!a.read(0, 0, &mut [0; 1]) && !a.read(1, 0, &mut [0; 1]));
        assert!(a.read(2, 0, &mut [0; 1]) && b.read(6, 0, &mut [0; 1]));
    }

    #[test]
    fn an_object_no_process_has_open_is_freed_by_another() {
        let root = tempfile::tempdir().unwrap();
        let a = filled(root.path(), "a", 8);
        drop(a);
        let mut b = small(root.path(), "b");
        for i in 0..3 {
            put(&b, i, &[2; 4096]);
        }
        assert_eq!(evict_to_nine(root.path(), &mut b), vec![]);
        for i in 0..3 {
            assert!(b.read(i, 0, &mut [0; 1]));
        }
        let a = DiskCache::open(root.path(), "a", "v", 4096, 16 * 4096, Some(1 << 30)).unwrap();
        let present = held(&a);
        assert_eq!(present, (2..8).collect::<Vec<_>>());
    }

    #[test]
    fn an_object_whose_data_went_is_removed_by_an_eviction() {
        let root = tempfile::tempdir().unwrap();
        let a = filled(root.path(), "a", 8);
        let dir = a.obj.dir.clone();
        drop(a);
        fs::remove_file(dir.join("data")).unwrap();
        let mut b = small(root.path(), "b");
        put(&b, 0, &[2; 4096]);
        // The disk holds less than a's map says: its entries must not count
        // for more than what they free.
        b.limit = 4096;
        b.evict();
        assert!(!dir.exists());
        assert!(b.read(0, 0, &mut [0; 1]));
    }

    #[test]
    fn default_dirs() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(
            default_dir(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]), false),
            Some(PathBuf::from("/x/foliofs"))
        );
        assert_eq!(
            default_dir(&env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]), false),
            Some(PathBuf::from("/h/.cache/foliofs"))
        );
        assert_eq!(default_dir(&env(&[]), false), None);
        assert_eq!(
            default_dir(&env(&[("HOME", "/h")]), true),
            Some(PathBuf::from("/var/cache/foliofs"))
        );
    }
}
