//! The disk cache of remote chunks.
//!
//! Layout: `ROOT/<object>/<version>/<chunk index in hex>`, where `<object>`
//! hashes the URL without its query string and `<version>` hashes the
//! object's ETag (or Last-Modified) with the chunk size. Opening a version
//! removes the other versions of the same object, so a replaced object
//! never serves its old bytes.
//!
//! A chunk file holds the chunk's bytes and nothing else. It is written
//! under a temporary name, which this process reads it by at once; a
//! thread of its own then makes it durable (`fdatasync`) and only then
//! renames it into place, so a file under a chunk's name is whole even
//! after a crash or a power loss: what a crash interrupts is a temporary
//! file, removed at the next open. A file under a chunk's name is trusted
//! once its length matches, as a local image file is: checking each
//! chunk's bytes again at every mount cost a warm read a checksum and a
//! second pass over the data, and even a header costs a read of the disk
//! at each chunk's first use. The version directory's name hashes the
//! layout too, so the files of another layout are another version.

//! The whole directory is bounded by a byte limit, shared by every object
//! and every process using it: the least recently used chunks (by mtime,
//! touched on use) go first.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io::{self, Write};
use std::num::NonZeroUsize;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::Digest;

/// The layout of chunk files, part of each version directory's name: 1
/// had a checksummed header and no sync.
const LAYOUT: u32 = 2;
const TEMP_PREFIX: &str = ".tmp-";
/// Open chunk files kept per object.
const OPEN_FILES: usize = 128;
/// A chunk in use gets its mtime renewed at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(30);
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

struct Open {
    file: Arc<File>,
    touched: Instant,
}

/// Chunks written under their temporary names, not yet durable and named.
#[derive(Default)]
struct Pending {
    files: HashMap<u64, (PathBuf, Arc<File>)>,
    /// Bytes of `files`: the directory's, though no scan sees them yet.
    bytes: u64,
    /// Oldest first; a chunk leaves it when a committer takes it, and
    /// `files` when it is named.
    order: VecDeque<u64>,
}

/// One object's chunks in the cache directory.
pub(crate) struct DiskCache {
    root: PathBuf,
    dir: PathBuf,
    limit: u64,
    /// Bytes in the whole directory, as last counted plus what this
    /// process added since.
    used: AtomicU64,
    /// Bytes this process stored since it last counted the directory:
    /// another process fills it too, so it is counted again every
    /// eighth of the limit.
    since_scan: AtomicU64,
    files: Mutex<lru::LruCache<u64, Open>>,
    evicting: Mutex<()>,
    temp_seq: AtomicU64,
    pending: Mutex<Pending>,
    /// Signals a new pending chunk, and a named one.
    pending_changed: Condvar,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.dir)
            .field("limit", &self.limit)
            .finish()
    }
}

impl DiskCache {
    /// Opens (creating it 0700 if needed) the cache under `root` for the
    /// object `identity` at `version` in chunks of `chunk` bytes, removing
    /// the object's other versions and stray temporary files. Returns the
    /// cache and the chunks it already holds (files of the right length;
    /// other files are removed).
    pub fn open(
        root: &Path,
        identity: &str,
        version: &str,
        chunk: u32,
        chunk_len: &dyn Fn(u64) -> Option<u64>,
        limit: Option<u64>,
    ) -> io::Result<(DiskCache, Vec<u64>)> {
        let object = root.join(hex_digest(identity));
        let dir = object.join(hex_digest(&format!("{version}\n{chunk}\n{LAYOUT}")));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for entry in fs::read_dir(&object)?.flatten() {
            if entry.path() != dir {
                // Another version: whatever it held is stale.
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        let mut present = Vec::new();
        for entry in fs::read_dir(&dir)?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(rest) = name.strip_prefix(TEMP_PREFIX) {
                if stray(rest, &entry) {
                    let _ = fs::remove_file(entry.path());
                }
                continue;
            }
            let Ok(index) = u64::from_str_radix(&name, 16) else {
                continue;
            };
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if chunk_len(index).is_some_and(|want| want == len) {
                present.push(index);
            } else {
                let _ = fs::remove_file(entry.path());
            }
        }
        let limit = match limit {
            Some(l) => l,
            None => {
                let held = scan(root).iter().map(|f| f.size).sum::<u64>();
                DEFAULT_LIMIT.min((free_space(root).unwrap_or(u64::MAX / 2) + held) / 4)
            }
        }
        .max(u64::from(chunk));
        let cache = DiskCache {
            root: root.to_owned(),
            dir,
            limit,
            used: AtomicU64::new(0),
            since_scan: AtomicU64::new(0),
            files: Mutex::new(lru::LruCache::new(NonZeroUsize::new(OPEN_FILES).unwrap())),
            evicting: Mutex::new(()),
            temp_seq: AtomicU64::new(0),
            pending: Mutex::new(Pending::default()),
            pending_changed: Condvar::new(),
        };
        let gone: HashSet<u64> = cache.evict().into_iter().collect();
        present.retain(|i| !gone.contains(i));
        Ok((cache, present))
    }

    /// The byte limit of the directory.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{index:x}"))
    }

    /// Copies `out.len()` bytes from `within` of chunk `index` (which holds
    /// `len` bytes) into `out`; false when the cache does not hold it
    /// intact (a damaged file is removed).
    pub fn read(&self, index: u64, len: usize, within: usize, out: &mut [u8]) -> bool {
        let open = {
            let mut files = self.files.lock().unwrap();
            files.get_mut(&index).map(|open| {
                if open.touched.elapsed() >= TOUCH_EVERY {
                    open.touched = Instant::now();
                    let _ = open.file.set_modified(SystemTime::now());
                }
                open.file.clone()
            })
        };
        // Read outside the lock: other readers' chunks need not wait for
        // this one's disk.
        if let Some(file) = open {
            if file.read_exact_at(out, within as u64).is_ok() {
                return true;
            }
            self.files.lock().unwrap().pop(&index);
            return false;
        }
        match self.open_file(index, len) {
            Some(file) => file.read_exact_at(out, within as u64).is_ok(),
            None => false,
        }
    }

    /// Whether chunk `index` is open already.
    pub fn is_open(&self, index: u64) -> bool {
        self.files.lock().unwrap().contains(&index)
    }

    /// Opens chunk `index` (of `len` bytes) ahead of its reads, which has
    /// the kernel read it in: a sequential reader then finds it open and in
    /// the page cache rather than waiting for the disk at each new chunk.
    /// False when the cache does not hold it intact (a damaged file is
    /// removed).
    pub fn preload(&self, index: u64, len: usize) -> bool {
        if self.is_open(index) {
            return true;
        }
        let Some(file) = self.open_file(index, len) else {
            return false;
        };
        // The whole chunk in one request to the disk, started now: left to
        // itself, the kernel's read-ahead would begin small in each new
        // chunk file. Only ahead of a sequential reader: a reader that
        // hops about reads what it needs and no more, as from a local file.
        // SAFETY: posix_fadvise only reads the descriptor, which `file`
        // keeps open for the call; it touches no memory of this process.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                0,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
        true
    }

    /// Opens chunk file `index` and checks its length; keeps it open (and
    /// touched) when intact, and removes it when not.
    fn open_file(&self, index: u64, len: usize) -> Option<Arc<File>> {
        if let Some((_, file)) = self.pending.lock().unwrap().files.get(&index) {
            return Some(file.clone());
        }
        let path = self.path(index);
        let file = File::open(&path).ok()?;
        let intact = file.metadata().is_ok_and(|m| m.len() == len as u64);
        if !intact {
            log::debug!("{}: damaged cache file removed", path.display());
            let _ = fs::remove_file(&path);
            return None;
        }
        let _ = file.set_modified(SystemTime::now());
        let file = Arc::new(file);
        self.files.lock().unwrap().put(
            index,
            Open {
                file: file.clone(),
                touched: Instant::now(),
            },
        );
        Some(file)
    }

    /// Writes chunk `index` under a temporary name, readable by this
    /// process at once; [`DiskCache::commit_next`] names it. Returns the
    /// chunks of this object that eviction removed to make room. A failure
    /// to write only costs a later fetch, so it is logged, not returned.
    pub fn store(&self, index: u64, data: &[u8]) -> Vec<u64> {
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp = self.dir.join(format!(
            "{TEMP_PREFIX}{}-{index:x}-{seq}",
            std::process::id()
        ));
        let write = || -> io::Result<File> {
            let mut f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&temp)?;
            f.write_all(data)?;
            Ok(f)
        };
        let file = match write() {
            Ok(f) => Arc::new(f),
            Err(e) => {
                let _ = fs::remove_file(&temp);
                log::debug!("{}: chunk not cached: {e}", self.dir.display());
                return Vec::new();
            }
        };
        let mut pending = self.pending.lock().unwrap();
        if let Some((old, _)) = pending.files.insert(index, (temp, file)) {
            // Fetched again while its first copy waited (that copy failed
            // to read back): this one replaces it and is named in its own
            // turn, also if a committer holds the first one now.
            let _ = fs::remove_file(old);
        } else {
            pending.bytes += data.len() as u64;
        }
        pending.order.push_back(index);
        drop(pending);
        self.pending_changed.notify_all();
        let n = data.len() as u64;
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        let since = self.since_scan.fetch_add(n, Ordering::Relaxed) + n;
        if used > self.limit || since >= self.limit / 8 {
            self.evict()
        } else {
            Vec::new()
        }
    }

    /// Makes the oldest pending chunk durable and only then gives it its
    /// name, so a file under a chunk's name is never half written, whatever
    /// the crash, then evicts if the directory is over its limit. Waits up
    /// to `wait` for one; returns this object's chunks that eviction
    /// removed, or None when none came.
    pub fn commit_next(&self, wait: Duration) -> Option<Vec<u64>> {
        let (index, temp, file) = {
            let mut p = self.pending.lock().unwrap();
            if p.order.is_empty() && !wait.is_zero() {
                p = self.pending_changed.wait_timeout(p, wait).unwrap().0;
            }
            loop {
                let index = p.order.pop_front()?;
                // A chunk stored twice is listed twice: the first turn
                // names it.
                if let Some((temp, file)) = p.files.get(&index) {
                    break (index, temp.clone(), file.clone());
                }
            }
        };
        if let Err(e) = file
            .sync_data()
            .and_then(|()| fs::rename(&temp, self.path(index)))
        {
            // This process still reads it by its open file; the next one
            // fetches it again.
            log::debug!("{}: chunk not cached: {e}", temp.display());
            let _ = fs::remove_file(&temp);
        }
        let mut p = self.pending.lock().unwrap();
        // Unless a newer copy replaced it meanwhile, which is still to name.
        if p.files.get(&index).is_some_and(|(t, _)| *t == temp) {
            p.files.remove(&index);
            let n = file.metadata().map_or(0, |m| m.len());
            p.bytes = p.bytes.saturating_sub(n);
        }
        drop(p);
        self.pending_changed.notify_all();
        // Bytes stored while these were unnamed could not be evicted then.
        Some(if self.used.load(Ordering::Relaxed) > self.limit {
            self.evict()
        } else {
            Vec::new()
        })
    }

    /// Names every pending chunk (this thread helps), waiting at most
    /// `within`; true when none is left.
    pub fn settle(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && self.commit_next(Duration::ZERO).is_some() {}
        let mut p = self.pending.lock().unwrap();
        while !p.files.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = self.pending_changed.wait_timeout(p, left).unwrap().0;
        }
        true
    }

    /// Counts the whole directory and, when it holds more than the limit,
    /// removes the least recently used chunks (of any object) down to 90%
    /// of it. Returns this object's chunks that went.
    fn evict(&self) -> Vec<u64> {
        let _one = self.evicting.lock().unwrap();
        self.since_scan.store(0, Ordering::Relaxed);
        let mut files = scan(&self.root);
        // Chunks not yet named count, though only named ones can go.
        let pending = self.pending.lock().unwrap().bytes;
        let mut total: u64 = files.iter().map(|f| f.size).sum::<u64>() + pending;
        let mut gone = Vec::new();
        if total > self.limit {
            let target = self.limit / 10 * 9;
            files.sort_by_key(|f| f.mtime);
            for f in files {
                if total <= target {
                    break;
                }
                if fs::remove_file(&f.path).is_ok() || !f.path.exists() {
                    total -= f.size;
                    if f.path.parent() == Some(&self.dir) {
                        if let Some(i) = f
                            .path
                            .file_name()
                            .and_then(|n| u64::from_str_radix(&n.to_string_lossy(), 16).ok())
                        {
                            self.files.lock().unwrap().pop(&i);
                            gone.push(i);
                        }
                    }
                }
            }
        }
        self.used.store(total, Ordering::Relaxed);
        gone
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        if !self.settle(Duration::from_secs(10)) {
            log::warn!(
                "{}: chunks left unnamed (fetched again next time)",
                self.dir.display()
            );
        }
    }
}

/// A temporary file left by a process that is gone (its pid is in the
/// name), or older than an hour.
fn stray(rest: &str, entry: &fs::DirEntry) -> bool {
    let old = entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age > Duration::from_secs(3600));
    let dead = match rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) {
        // SAFETY: kill with signal 0 only checks that the process exists.
        Some(pid) if pid > 0 => unsafe {
            libc::kill(pid, 0) != 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        },
        _ => true,
    };
    old || dead
}

struct CachedFile {
    path: PathBuf,
    size: u64,
    mtime: SystemTime,
}

/// Every chunk file under `root` (`root/<object>/<version>/<chunk>`).
fn scan(root: &Path) -> Vec<CachedFile> {
    let mut out = Vec::new();
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
            for e in fs::read_dir(&version).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    continue;
                }
                if let Ok(m) = e.metadata() {
                    if m.is_file() {
                        out.push(CachedFile {
                            path: e.path(),
                            size: m.len(),
                            mtime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        });
                    }
                }
            }
        }
    }
    out
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

    fn full(len: u64) -> impl Fn(u64) -> Option<u64> {
        move |_| Some(len)
    }

    /// Stores a chunk and names it, as the committer does soon after.
    fn put(c: &DiskCache, index: u64, data: &[u8]) -> Vec<u64> {
        let gone = c.store(index, data);
        assert!(c.settle(Duration::from_secs(10)));
        gone
    }

    #[test]
    fn chunks_round_trip_and_survive_reopen() {
        let root = tempfile::tempdir().unwrap();
        let (c, present) =
            DiskCache::open(root.path(), "obj", "v1", 4096, &full(100), Some(1 << 20)).unwrap();
        assert!(present.is_empty());
        let data: Vec<u8> = (0..100u8).collect();
        put(&c, 3, &data);
        let mut out = [0u8; 10];
        assert!(c.read(3, 100, 5, &mut out));
        assert_eq!(out[..], data[5..15]);
        assert!(!c.read(4, 100, 0, &mut out));
        drop(c);
        let (c, present) =
            DiskCache::open(root.path(), "obj", "v1", 4096, &full(100), Some(1 << 20)).unwrap();
        assert_eq!(present, vec![3]);
        assert!(c.read(3, 100, 90, &mut out));
        assert_eq!(out[..], data[90..100]);
    }

    #[test]
    fn a_stored_chunk_is_read_at_once_and_named_only_when_committed() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = DiskCache::open(root.path(), "o", "v", 4096, &full(100), None).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        c.store(2, &data);
        assert!(!c.path(2).exists(), "named before it is durable");
        let mut out = [0u8; 10];
        assert!(c.read(2, 100, 40, &mut out));
        assert_eq!(out[..], data[40..50]);
        assert_eq!(c.commit_next(Duration::ZERO), Some(Vec::new()));
        assert!(c.path(2).exists());
        assert_eq!(c.commit_next(Duration::ZERO), None);
        assert!(c.read(2, 100, 90, &mut out));
        assert_eq!(out[..], data[90..100]);
        // Nothing temporary is left behind.
        assert_eq!(fs::read_dir(&c.dir).unwrap().count(), 1);
    }

    #[test]
    fn a_chunk_stored_twice_while_pending_is_named_once_with_the_newer_bytes() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = DiskCache::open(root.path(), "o", "v", 4096, &full(8), None).unwrap();
        c.store(1, &[1; 8]);
        c.store(1, &[2; 8]);
        assert!(c.settle(Duration::from_secs(10)));
        assert_eq!(fs::read(c.path(1)).unwrap(), [2; 8]);
        assert_eq!(c.commit_next(Duration::ZERO), None);
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(&c.dir).unwrap().count(), 1);
    }

    #[test]
    fn files_of_another_layout_are_another_version() {
        let root = tempfile::tempdir().unwrap();
        let object = root.path().join(hex_digest("o"));
        let old = object.join(hex_digest("v\n4096"));
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("0"), [1u8; 16 + 64]).unwrap();
        let (c, present) = DiskCache::open(root.path(), "o", "v", 4096, &full(64), None).unwrap();
        assert!(present.is_empty());
        assert!(!old.exists());
        assert!(!c.read(0, 64, 0, &mut [0; 4]));
    }

    #[test]
    fn a_new_version_removes_the_old_one() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = DiskCache::open(root.path(), "obj", "v1", 4096, &full(10), None).unwrap();
        put(&c, 0, &[1; 10]);
        let old_dir = c.dir.clone();
        let (c2, present) =
            DiskCache::open(root.path(), "obj", "v2", 4096, &full(10), None).unwrap();
        assert!(present.is_empty());
        assert!(!old_dir.exists());
        assert!(!c2.read(0, 10, 0, &mut [0; 10]));
        // Another chunk size is another version too.
        let (c3, _) = DiskCache::open(root.path(), "obj", "v2", 8192, &full(10), None).unwrap();
        assert_ne!(c3.dir, c2.dir);
    }

    #[test]
    fn damaged_files_are_not_served() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = DiskCache::open(root.path(), "o", "v", 4096, &full(64), None).unwrap();
        let data = [7u8; 64];
        put(&c, 0, &data);
        put(&c, 1, &data);
        // Cut short after this process found it: not served.
        let p = c.path(0);
        fs::write(&p, &data[..63]).unwrap();
        assert!(!c.read(0, 64, 0, &mut [0; 4]));
        assert!(!p.exists(), "a damaged file is removed");
        // A file of the wrong length is dropped at open already.
        let p1 = c.path(1);
        fs::write(&p1, [7u8; 65]).unwrap();
        drop(c);
        let (c, present) = DiskCache::open(root.path(), "o", "v", 4096, &full(64), None).unwrap();
        assert!(present.is_empty());
        assert!(!c.read(1, 64, 0, &mut [0; 4]));
    }

    #[test]
    fn stray_temp_files_are_removed_at_open() {
        let root = tempfile::tempdir().unwrap();
        let (c, _) = DiskCache::open(root.path(), "o", "v", 4096, &full(8), None).unwrap();
        // No process has this pid (above the kernel's maximum).
        let dead = c.dir.join(format!("{TEMP_PREFIX}2147483647-0-0"));
        let live = c
            .dir
            .join(format!("{TEMP_PREFIX}{}-1-0", std::process::id()));
        fs::write(&dead, b"partial").unwrap();
        fs::write(&live, b"being written").unwrap();
        let dir = c.dir.clone();
        drop(c);
        let _ = DiskCache::open(root.path(), "o", "v", 4096, &full(8), None).unwrap();
        assert!(!dead.exists());
        assert!(live.exists(), "a live writer's temp file stays");
        assert!(dir.exists());
    }

    #[test]
    fn the_limit_evicts_least_recently_used_across_objects() {
        let root = tempfile::tempdir().unwrap();
        let chunk = 1000usize;
        let file = chunk as u64;
        let limit = 10 * file;
        let (a, _) = DiskCache::open(
            root.path(),
            "a",
            "v",
            4096,
            &full(chunk as u64),
            Some(limit),
        )
        .unwrap();
        let (b, _) = DiskCache::open(
            root.path(),
            "b",
            "v",
            4096,
            &full(chunk as u64),
            Some(limit),
        )
        .unwrap();
        let old = SystemTime::now() - Duration::from_secs(1000);
        for i in 0..5 {
            put(&a, i, &vec![i as u8; chunk]);
            put(&b, i, &vec![i as u8; chunk]);
            // Chunk i was last used i seconds after `old`; a's before b's.
            for (c, t) in [(&a, 2 * i), (&b, 2 * i + 1)] {
                File::open(c.path(i))
                    .unwrap()
                    .set_modified(old + Duration::from_secs(t))
                    .unwrap();
            }
        }
        // a's chunk 0 is used now: it is the most recent.
        assert!(a.read(0, chunk, 0, &mut [0; 1]));
        let mut gone = put(&a, 9, &vec![9; chunk]);
        // However recently this process counted, counting now finds the
        // other object's chunks.
        gone.extend(a.evict());
        let total: u64 = scan(root.path()).iter().map(|f| f.size).sum();
        assert!(total <= limit / 10 * 9, "{total}");
        // 11 files, at most 9 fit: b's 0 and a's 1 were the oldest.
        assert_eq!(gone, vec![1]);
        assert!(!b.path(0).exists() && !a.path(1).exists());
        assert!(a.path(0).exists() && b.path(1).exists() && a.path(9).exists());
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
