//! Opening one object's version of the cache, and closing it.
//!
//! Opening a version removes the object's other versions, so a replaced
//! object never serves its old bytes. The first process to open a
//! version alone checks it: it drops entries of chunks `data` no longer
//! holds and frees the blocks no entry names (what a crash left half
//! written), or starts afresh when the map is damaged.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use super::commit::Pending;
use super::evict::default_limit;
use super::map::{chunk_len, dirs, entry_at, header, parse_map, runs, HEADER, PENDING, PIECE};
use super::object::{open_objects, Object};
use super::sys::{lock, next_data, open_rw, punch};
use super::DiskCache;

/// How long an open waits for another process to finish freeing chunks
/// of the same object (it holds the write lock only for that).
const LOCK_WAIT: Duration = Duration::from_secs(10);

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
        let (object, dir) = dirs(root, identity, version, chunk);
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
        let sums = open_rw(&dir.join("sums"))?;
        let sums_len = size.div_ceil(PIECE) * 4;
        let alone = take_lock(&map, &dir)?;
        let stamps = match parse_map(&fs::read(dir.join("map"))?) {
            Some((s, c, stamps)) if s == size && c == chunk => {
                if alone {
                    if sums.metadata()?.len() != sums_len {
                        // A chunk whose sums went is caught at its first
                        // read: it fails to read them, and is fetched.
                        sums.set_len(sums_len)?;
                    }
                    reclaim(&map, &data, size, chunk, stamps)?
                } else {
                    stamps
                }
            }
            _ if alone => {
                // New, or left half made: start afresh.
                data.set_len(0)?;
                data.set_len(size)?;
                sums.set_len(0)?;
                sums.set_len(sums_len)?;
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
        let limit = limit.unwrap_or_else(|| default_limit(root)).max(chunk);
        let obj = Arc::new(Object {
            dir: dir.clone(),
            size,
            chunk,
            data,
            sums,
            map,
            stamps: stamps
                .into_iter()
                .map(|s| AtomicU32::new(if s > PENDING { s } else { 0 }))
                .collect(),
            gate: RwLock::new(()),
            freeing: AtomicBool::new(false),
            can_punch: AtomicBool::new(true),
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
        map.write_all_at(&0u32.to_le_bytes(), entry_at(i))?;
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
