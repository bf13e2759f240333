//! Keeping the whole directory within its byte limit, across processes.
//!
//! Processes share the directory, bounded by one byte limit: the least
//! recently used chunks of any object go first, whichever process has it
//! open. Freeing chunks clears their entries, syncs the map, then punches
//! holes in `data`. That is safe under a process still reading them
//! because every read is checked against the sums: a hole reads as zeros,
//! which do not match (or are the chunk's bytes), so the reader finds its
//! entry cleared and fetches the chunk again. Each process still holds a
//! read lock (an open file description lock) on the map of every object
//! it has open, which tells the first opener it has the object to itself
//! (`open.rs`) and keeps stray-directory removal off it.
//!
//! Where the file system cannot punch holes (`EOPNOTSUPP`), an eviction
//! frees whole objects instead: every entry cleared, `data` cut to
//! nothing and grown back sparse.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::map::{chunk_len, entry_at, parse_map, runs, PENDING};
use super::object::{open_objects, Object};
use super::sys::{free_space, lock, punch};
use super::DiskCache;

/// The cache when `cache_size` is not given: 4 GiB holds the working set of
/// most images several times over, yet is small beside today's disks; on
/// a fuller disk, a quarter of what the cache could take (free space plus
/// what it already holds).
const DEFAULT_LIMIT: u64 = 4 << 30;
/// How soon an eviction that left the directory over its limit is tried
/// again, by an idle committer.
const RETRY_EVICT: Duration = Duration::from_secs(1);
/// A version directory without a valid map is removed once it is this
/// old: younger, a process may be creating it.
const STRAY_AGE: Duration = Duration::from_secs(60);

/// The limit of the directory at `root` when none is given.
pub(super) fn default_limit(root: &Path) -> u64 {
    let held = scan(root).1;
    DEFAULT_LIMIT.min((free_space(root).unwrap_or(u64::MAX / 2) + held) / 4)
}

impl Object {
    /// Starts an eviction of this process on the object; false when
    /// another one has it. Takes the write lock when no other process has
    /// the object open, but frees without it (see the module's note).
    fn begin_freeing(&self) -> bool {
        if self.freeing.swap(true, Ordering::Acquire) {
            return false;
        }
        let _ = lock(&self.map, libc::F_WRLCK);
        true
    }

    /// Has evictions free whole objects, as when punching is refused.
    #[cfg(test)]
    pub(super) fn refuse_punching(&self) {
        self.can_punch.store(false, Ordering::Relaxed);
    }

    /// Frees the `chunks` still committed (one forgotten and stored again
    /// since the scan is pending, and stays), or with `whole` (or when
    /// the file system cannot punch holes) every chunk, then gives the
    /// write lock back.
    fn free_alone(&self, chunks: &[u64], whole: bool) {
        {
            let _alone = self.gate.write().unwrap();
            let whole = whole || !self.can_punch.load(Ordering::Relaxed);
            let all: Vec<u64>;
            let chunks = if whole {
                all = (0..self.stamps.len() as u64).collect();
                &all[..]
            } else {
                chunks
            };
            let chunks: Vec<u64> = chunks
                .iter()
                .copied()
                .filter(|&i| {
                    let slot = &self.stamps[i as usize];
                    let s = slot.load(Ordering::Relaxed);
                    // Emptying `data` takes chunks not yet committed too;
                    // cleared, they are never entered.
                    (s > PENDING || (whole && s == PENDING))
                        && slot
                            .compare_exchange(s, 0, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                })
                .collect();
            match free(&self.map, &self.data, self.size, self.chunk, &chunks, whole) {
                Ok(Freed::Whole) if !whole => {
                    self.can_punch.store(false, Ordering::Relaxed);
                    // What the map still named went with the rest.
                    for s in &self.stamps {
                        let v = s.load(Ordering::Relaxed);
                        if v > PENDING {
                            let _ = s.compare_exchange(v, 0, Ordering::Relaxed, Ordering::Relaxed);
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => log::warn!("{}: cached chunks not freed: {e}", self.dir.display()),
            }
        }
        // Converting back to a read lock always succeeds.
        let _ = lock(&self.map, libc::F_RDLCK);
        self.freeing.store(false, Ordering::Release);
    }
}

/// A version directory an eviction frees chunks in.
enum Victim {
    /// Open in this process.
    Open(Arc<Object>),
    /// Not open in this process: its map.
    Closed(File),
}

/// What [`free`] freed.
#[derive(Debug, PartialEq, Eq)]
enum Freed {
    Chunks,
    /// The whole object: the file system cannot punch holes.
    Whole,
    /// A damaged directory, removed.
    Removed,
}

impl DiskCache {
    /// Counts the whole directory and, when it holds more than the limit,
    /// frees the least recently used chunks down to 90% of it (whole
    /// objects where the file system cannot punch holes).
    pub(super) fn evict(&self) {
        let _one = self.evicting.lock().unwrap();
        self.since_scan.store(0, Ordering::Relaxed);
        // What the disk holds: chunks not yet committed (of any process)
        // count, though only committed ones can go, and so do the maps,
        // the sums and the file system's own blocks for the sparse files.
        let (mut held, mut total) = scan(&self.root);
        if total > self.limit {
            let target = self.limit / 10 * 9;
            let whole = !self.obj.can_punch.load(Ordering::Relaxed);
            let mut per_dir: HashMap<PathBuf, u64> = HashMap::new();
            for f in &held {
                *per_dir.entry(f.dir.clone()).or_default() += f.size;
            }
            held.sort_by_key(|f| f.stamp);
            // Per version directory: how to free in it (None: an eviction
            // of this process has it) and the chunks picked to go.
            let mut picked: HashMap<PathBuf, Option<(Victim, Vec<u64>)>> = HashMap::new();
            let open = open_objects().lock().unwrap().clone();
            for f in &held {
                if total <= target {
                    break;
                }
                let new = !picked.contains_key(&f.dir);
                let slot = picked.entry(f.dir.clone()).or_insert_with(|| {
                    let victim = match open.get(&f.dir).and_then(Weak::upgrade) {
                        Some(obj) => obj.begin_freeing().then_some(Victim::Open(obj)),
                        None => fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(f.dir.join("map"))
                            .ok()
                            .inspect(|m| {
                                let _ = lock(m, libc::F_WRLCK);
                            })
                            .map(Victim::Closed),
                    };
                    victim.map(|v| (v, Vec::new()))
                });
                if let Some((_, chunks)) = slot {
                    chunks.push(f.index);
                    if !whole {
                        total = total.saturating_sub(f.size);
                    } else if new {
                        total = total.saturating_sub(per_dir[&f.dir]);
                    }
                }
            }
            for (dir, slot) in picked {
                match slot {
                    Some((Victim::Open(obj), chunks)) => obj.free_alone(&chunks, whole),
                    Some((Victim::Closed(map), chunks)) => {
                        match free_closed(&dir, &map, &chunks, whole) {
                            Ok(Freed::Whole) => self.obj.can_punch.store(false, Ordering::Relaxed),
                            Ok(Freed::Chunks | Freed::Removed) => {}
                            Err(e) => {
                                log::warn!("{}: cached chunks not freed: {e}", dir.display())
                            }
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
    /// have closed it since), or if chunks were stored since the last
    /// count: each process counts only its own stores between counts, so
    /// several filling one directory can take it past the limit together,
    /// which a count once they pause (or close) finds and undoes.
    pub fn tidy(&self) {
        let due = self
            .over
            .lock()
            .unwrap()
            .is_some_and(|at| at.elapsed() >= RETRY_EVICT)
            || self.since_scan.load(Ordering::Relaxed) > 0;
        if due {
            self.evict();
        }
    }

    /// As [`tidy`](Self::tidy), without waiting for a retry to be due: the
    /// object is being closed and its committer will not come back.
    pub fn tidy_at_close(&self) {
        if self.over.lock().unwrap().is_some() || self.since_scan.load(Ordering::Relaxed) > 0 {
            self.evict();
        }
    }
}

/// Clears the entries of `gone` (chunks of `chunk` bytes in an object of
/// `size`), makes that durable, and only then punches their holes: a
/// crash in between leaves blocks no entry names, freed at the next open.
/// With `whole`, or where punching is not supported, frees the whole
/// object: every entry cleared, `data` emptied.
fn free(
    map: &File,
    data: &File,
    size: u64,
    chunk: u64,
    gone: &[u64],
    whole: bool,
) -> io::Result<Freed> {
    for &i in gone {
        map.write_all_at(&0u32.to_le_bytes(), entry_at(i))?;
    }
    if !whole {
        map.sync_data()?;
        let mut punched = Ok(());
        for (start, end) in runs(gone) {
            let off = start * chunk;
            let len = (end * chunk).min(size) - off;
            punched = punch(data, off, len);
            if punched.is_err() {
                break;
            }
        }
        match punched {
            Ok(()) => return Ok(Freed::Chunks),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                log::info!("the cache's file system cannot punch holes: evicting whole objects");
            }
            Err(e) => return Err(e),
        }
    }
    let chunks = size.div_ceil(chunk);
    let zeros = vec![0u8; (4 * chunks) as usize];
    map.write_all_at(&zeros, entry_at(0))?;
    map.sync_data()?;
    data.set_len(0)?;
    data.set_len(size)?;
    Ok(Freed::Whole)
}

/// Frees `chunks` of an object this process does not have open.
/// One whose map went bad or whose data went since the scan serves nothing
/// and is removed whole.
fn free_closed(dir: &Path, map: &File, chunks: &[u64], whole: bool) -> io::Result<Freed> {
    let parsed = parse_map(&fs::read(dir.join("map"))?);
    let data = fs::OpenOptions::new().write(true).open(dir.join("data"));
    match (parsed, data) {
        (Some((size, chunk, _)), Ok(data)) => free(map, &data, size, chunk, chunks, whole),
        (None, _) | (_, Err(_)) => {
            log::debug!("{}: damaged cache directory removed", dir.display());
            fs::remove_dir_all(dir).map(|()| Freed::Removed)
        }
    }
}

/// One committed chunk somewhere under the root.
pub(super) struct Held {
    dir: PathBuf,
    index: u64,
    pub(super) size: u64,
    stamp: u32,
}

/// Every committed chunk under `root` (`root/<object>/<version>/map`), and
/// the bytes the version directories take on the disk. Removes version
/// directories left without a valid map (another layout, or a process
/// that died making them) once no process can be using them.
pub(super) fn scan(root: &Path) -> (Vec<Held>, u64) {
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
