//! `RemoteObject` against an in-memory backend that fails, stalls and lies
//! on demand.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Backend, FetchError, Head};
use super::object::{RemoteObject, WORKERS};
use super::RemoteOptions;

#[derive(Default)]
struct Mem {
    data: Mutex<Vec<u8>>,
    etag: Mutex<String>,
    heads: AtomicU32,
    gets: AtomicU32,
    /// Transient failures still to give.
    fail_next: AtomicU32,
    /// Every request fails with a 503 while set.
    down: AtomicBool,
    /// Each GET hangs this long (then times out if that is past its limit).
    stall: Mutex<Duration>,
    /// Each GET takes this long.
    delay: Mutex<Duration>,
    /// GETs send half the body.
    short: AtomicBool,
    /// GETs still to send with one byte flipped (right length).
    flip: AtomicU32,
    /// The size the HEAD claims, when not the data's.
    claimed_size: Mutex<Option<u64>>,
    /// Chunk starts in the order their GETs began.
    started: Mutex<Vec<u64>>,
    running: AtomicU32,
    most_running: AtomicU32,
}

struct MemBackend(Arc<Mem>);

impl Backend for MemBackend {
    fn head(&self, _: Duration) -> Result<Head, FetchError> {
        self.0.heads.fetch_add(1, SeqCst);
        if self.0.down.load(SeqCst) {
            return Err(FetchError::transient("503 Service Unavailable"));
        }
        let claimed = *self.0.claimed_size.lock().unwrap();
        Ok(Head {
            size: claimed.unwrap_or(self.0.data.lock().unwrap().len() as u64),
            etag: Some(self.0.etag.lock().unwrap().clone()),
            last_modified: None,
        })
    }

    fn get(
        &self,
        head: &Head,
        start: u64,
        len: u64,
        limit: Duration,
    ) -> Result<Vec<u8>, FetchError> {
        let m = &self.0;
        m.gets.fetch_add(1, SeqCst);
        m.started.lock().unwrap().push(start);
        let now = m.running.fetch_add(1, SeqCst) + 1;
        m.most_running.fetch_max(now, SeqCst);
        let r = (|| {
            std::thread::sleep(*m.delay.lock().unwrap());
            let stall = *m.stall.lock().unwrap();
            if stall > Duration::ZERO {
                std::thread::sleep(stall.min(limit));
                if stall > limit {
                    return Err(FetchError::transient("timed out after the request's limit"));
                }
            }
            if m.down.load(SeqCst) {
                return Err(FetchError::transient("503 Service Unavailable"));
            }
            if m.fail_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(FetchError::transient("connection reset"));
            }
            if head.etag.as_deref() != Some(m.etag.lock().unwrap().as_str()) {
                return Err(FetchError::fatal(
                    "412 Precondition Failed (the object changed since it was opened)",
                ));
            }
            let data = m.data.lock().unwrap();
            let end = (start + len).min(data.len() as u64);
            let mut body = data[start as usize..end as usize].to_vec();
            if m.short.load(SeqCst) {
                body.truncate(body.len() / 2);
            }
            if !body.is_empty()
                && m.flip
                    .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                let i = body.len() / 3;
                body[i] ^= 0x20;
            }
            Ok(body)
        })();
        m.running.fetch_sub(1, SeqCst);
        r
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 7 + i / 251) % 253) as u8 ^ seed)
        .collect()
}

const CHUNK: u32 = 64 << 10;

fn mem(size: usize) -> Arc<Mem> {
    let m = Mem::default();
    *m.data.lock().unwrap() = pattern(size, 0);
    *m.etag.lock().unwrap() = "\"v1\"".into();
    Arc::new(m)
}

fn opts() -> RemoteOptions {
    RemoteOptions {
        chunk: CHUNK,
        timeout: Duration::from_secs(5),
        ..RemoteOptions::default()
    }
}

fn open(m: &Arc<Mem>, dir: &std::path::Path, o: &RemoteOptions) -> RemoteObject {
    RemoteObject::open_with(
        Box::new(MemBackend(m.clone())),
        "mem://obj",
        "mem://obj",
        dir,
        o,
        None,
    )
    .unwrap()
}

fn read(obj: &RemoteObject, off: u64, len: usize) -> foliofs_vfs::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    let n = obj.read_at(&mut b, off)?;
    b.truncate(n);
    Ok(b)
}

fn wait_until(what: &str, f: impl FnMut() -> bool) {
    foliofs_testkit::wait_until(what, Duration::from_secs(20), f);
}

#[test]
fn random_reads_from_eight_threads_match_the_object() {
    let size = 3 * (1 << 20) + 12345;
    let m = mem(size);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let data = m.data.lock().unwrap().clone();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (obj, data) = (&obj, &data);
            s.spawn(move || {
                let mut x = t * 7919 + 1;
                for _ in 0..200 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 20) % (size as u64 + 10);
                    let len = ((x >> 8) % 300_000) as usize;
                    let got = read(obj, off, len).unwrap();
                    let end = (off as usize + len).min(size).max(off as usize).min(size);
                    let want = data.get(off as usize..end).unwrap_or(&[]);
                    assert_eq!(got, want, "off {off} len {len}");
                }
            });
        }
    });
    // No chunk was fetched twice.
    let mut started = m.started.lock().unwrap().clone();
    let n = started.len();
    started.sort_unstable();
    started.dedup();
    assert_eq!(started.len(), n);
    assert!(obj.stats().bytes_fetched <= size as u64);
    assert_eq!(m.heads.load(SeqCst), 1);
}

#[test]
fn eight_readers_of_one_chunk_cause_one_fetch() {
    let m = mem(1 << 20);
    *m.delay.lock().unwrap() = Duration::from_millis(200);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let data = m.data.lock().unwrap().clone();
    let off = 5 * CHUNK as u64 + 100;
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                assert_eq!(
                    read(&obj, off, 1000).unwrap(),
                    &data[off as usize..][..1000]
                )
            });
        }
    });
    assert_eq!(m.gets.load(SeqCst), 1);
    assert_eq!(obj.stats().bytes_fetched, CHUNK as u64);
    // Now it is cached: no more fetches.
    read(&obj, off, 10).unwrap();
    assert_eq!(m.gets.load(SeqCst), 1);
}

#[test]
fn a_read_over_several_chunks_fetches_them_in_parallel() {
    let m = mem(1 << 20);
    *m.delay.lock().unwrap() = Duration::from_millis(100);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let data = m.data.lock().unwrap().clone();
    let got = read(&obj, 1000, 6 * CHUNK as usize).unwrap();
    assert_eq!(got, &data[1000..1000 + 6 * CHUNK as usize]);
    assert_eq!(m.most_running.load(SeqCst), WORKERS as u32);
}

#[test]
fn sequential_reads_fetch_ahead() {
    let m = mem(2 << 20);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let c = CHUNK as u64;
    // Six chunks in order, 16 KiB at a time: it earns two chunks ahead.
    for off in (0..6 * c).step_by(16 << 10) {
        read(&obj, off, 16 << 10).unwrap();
    }
    // Nobody asked for chunks 6 and 7, and they arrive.
    wait_until("read-ahead of chunks 6 and 7", || {
        let s = m.started.lock().unwrap();
        s.contains(&(6 * c)) && s.contains(&(7 * c))
    });
    wait_until("chunks 6 and 7 cached", || m.running.load(SeqCst) == 0);
    read(&obj, 6 * c, 8192).unwrap();
    let s = m.started.lock().unwrap().clone();
    assert_eq!(
        s.iter().filter(|&&x| x == 6 * c).count(),
        1,
        "chunk 6 came from the cache"
    );
    // A random read does not start read-ahead.
    let m2 = mem(2 << 20);
    let dir2 = tempfile::tempdir().unwrap();
    let obj2 = open(&m2, dir2.path(), &opts());
    for chunk in [9, 2, 20, 14] {
        read(&obj2, chunk * c, 10).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(m2.gets.load(SeqCst), 4);
}

/// Waits for the fetch threads to go idle; returns (fetched, read).
fn settled(m: &Mem, obj: &RemoteObject) -> (u64, u64) {
    let mut last = u32::MAX;
    wait_until("the fetch threads idle", || {
        std::thread::sleep(Duration::from_millis(30));
        let gets = m.gets.load(SeqCst);
        let idle = m.running.load(SeqCst) == 0 && gets == last;
        last = gets;
        idle
    });
    let s = obj.stats();
    (s.bytes_fetched, s.bytes_read)
}

#[test]
fn a_metadata_walk_earns_little_read_ahead() {
    // Blocks of a 1 MiB region read once each, hopping about within
    // 128 KiB, as an inode and directory walk does.
    let m = mem(64 * CHUNK as usize);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let block = 4096u64;
    for group in 0..8u64 {
        for j in 0..32u64 {
            let b = group * 32 + (j * 13) % 32;
            read(&obj, b * block, block as usize).unwrap();
        }
    }
    let (fetched, read) = settled(&m, &obj);
    assert_eq!(read, 1 << 20);
    assert!(fetched * 2 <= read * 3, "fetched {fetched} for {read} read");
}

#[test]
fn file_reads_between_metadata_reads_stay_one_stream() {
    // A tree read: small files one after another in a data area, with a
    // metadata block read elsewhere before each file.
    let c = CHUNK as u64;
    let m = mem(128 * CHUNK as usize);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    let (meta, data, file) = (0u64, 8 * c, 12u64 << 10);
    let files = 200u64;
    for i in 0..files {
        if i < 64 {
            read(&obj, meta + (i * 7 % 64) * 4096, 4096).unwrap();
        }
        read(&obj, data + i * file, file as usize).unwrap();
    }
    let end = (data + files * file - 1) / c;
    // The data stream earned read-ahead past where it stopped...
    wait_until("read-ahead past the last file", || {
        m.started.lock().unwrap().contains(&((end + 1) * c))
    });
    // ...and what nobody read stays within half of what was.
    let (fetched, read) = settled(&m, &obj);
    assert!(fetched * 2 <= read * 3, "fetched {fetched} for {read} read");
}

#[test]
fn cached_data_cut_short_after_the_open_is_fetched_again() {
    let c = CHUNK as u64;
    let m = mem(16 * CHUNK as usize);
    let dir = tempfile::tempdir().unwrap();
    drop(read(&open(&m, dir.path(), &opts()), 0, 16 * CHUNK as usize).unwrap());
    let obj = open(&m, dir.path(), &opts());
    // Cut inside chunk 7 after the open counted it.
    cache_file(dir.path(), "data").set_len(8 * c - 1).unwrap();
    let gets = m.gets.load(SeqCst);
    let data = m.data.lock().unwrap().clone();
    assert_eq!(
        read(&obj, 6 * c, 2 * CHUNK as usize).unwrap(),
        &data[6 * c as usize..8 * c as usize]
    );
    assert_eq!(m.gets.load(SeqCst), gets + 1, "chunk 7 fetched again");
    assert_ne!(map_entry(dir.path(), 6), 0);
    obj.settle(Duration::from_secs(10));
    assert_ne!(map_entry(dir.path(), 7), 0, "chunk 7 cached again");
}

/// The cache's file `name` (`data` or `map`) of the one object under `root`.
fn cache_file(root: &std::path::Path, name: &str) -> std::fs::File {
    let path = walk(root)
        .into_iter()
        .find(|p| p.file_name().unwrap() == name)
        .unwrap();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Chunk `index`'s entry in the map of the one object under `root`.
fn map_entry(root: &std::path::Path, index: u64) -> u32 {
    use std::os::unix::fs::FileExt;
    let mut e = [0u8; 4];
    cache_file(root, "map")
        .read_exact_at(&mut e, 24 + 4 * index)
        .unwrap();
    u32::from_le_bytes(e)
}

#[test]
fn will_need_fetches_in_the_background() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    obj.will_need(5 * CHUNK as u64, 2 * CHUNK as u64);
    wait_until("hinted chunks fetched", || {
        m.gets.load(SeqCst) == 2 && m.running.load(SeqCst) == 0
    });
    wait_until("hinted chunks cached", || {
        read(&obj, 5 * CHUNK as u64, 2 * CHUNK as usize).is_ok()
    });
    assert_eq!(m.gets.load(SeqCst), 2);
}

#[test]
fn prefetch_yields_to_a_reader_and_fetches_everything_once() {
    let size = 64 * CHUNK as usize + 777;
    let m = mem(size);
    *m.delay.lock().unwrap() = Duration::from_millis(20);
    let dir = tempfile::tempdir().unwrap();
    let o = RemoteOptions {
        prefetch_all: true,
        ..opts()
    };
    let obj = open(&m, dir.path(), &o);
    wait_until("prefetch under way", || m.gets.load(SeqCst) >= 4);
    // Background work leaves one thread free.
    assert!(m.most_running.load(SeqCst) < WORKERS as u32);
    let before = m.started.lock().unwrap().len();
    let last = 64 * CHUNK as u64;
    let got = read(&obj, last, 777).unwrap();
    assert_eq!(got, &m.data.lock().unwrap()[last as usize..]);
    let started = m.started.lock().unwrap().clone();
    let pos = started.iter().position(|&s| s == last).unwrap();
    // Its fetch began at once, not after the prefetch queue.
    assert!(
        pos <= before + 1,
        "demanded chunk was fetch {pos}, reader came at {before}"
    );
    wait_until("everything prefetched", || obj.fully_cached());
    assert_eq!(m.gets.load(SeqCst), 65);
    let data = m.data.lock().unwrap().clone();
    assert_eq!(read(&obj, 0, size).unwrap(), data);
    assert_eq!(m.gets.load(SeqCst), 65, "nothing fetched twice");
}

#[test]
fn a_reopened_object_reads_from_the_cache() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let data = m.data.lock().unwrap().clone();
    {
        let obj = open(&m, dir.path(), &opts());
        assert_eq!(read(&obj, 0, 1 << 20).unwrap(), data);
    }
    let m2 = mem(1 << 20);
    let obj = open(&m2, dir.path(), &opts());
    assert_eq!(read(&obj, 0, 1 << 20).unwrap(), data);
    assert_eq!(m2.gets.load(SeqCst), 0);
    assert_eq!(obj.stats().cache_hits, 16);
    assert!(obj.fully_cached());
}

#[test]
fn a_replaced_object_is_noticed_and_its_old_bytes_dropped() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    read(&obj, 0, 10).unwrap();
    *m.data.lock().unwrap() = pattern(1 << 20, 0x55);
    *m.etag.lock().unwrap() = "\"v2\"".into();
    let e = read(&obj, CHUNK as u64, 10).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    let text = e.to_string();
    assert!(
        text.contains("mem://obj") && text.contains("changed"),
        "{text}"
    );
    // Chunk 0 is still the old version's, for this open.
    assert_eq!(read(&obj, 0, 10).unwrap(), pattern(10, 0));
    drop(obj);
    let obj = open(&m, dir.path(), &opts());
    assert_eq!(read(&obj, 0, 10).unwrap(), pattern(10, 0x55));
}

#[test]
fn a_damaged_cache_file_is_fetched_again() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let data = m.data.lock().unwrap().clone();
    let three = 3 * CHUNK as usize;
    drop(read(&open(&m, dir.path(), &opts()), 0, three).unwrap());
    // Cut short inside chunk 1.
    cache_file(dir.path(), "data")
        .set_len(CHUNK as u64 + 10)
        .unwrap();
    let gets = m.gets.load(SeqCst);
    let obj = open(&m, dir.path(), &opts());
    assert_eq!(read(&obj, 0, three).unwrap(), &data[..three]);
    assert_eq!(
        m.gets.load(SeqCst),
        gets + 2,
        "chunks 1 and 2 again, 0 from the cache"
    );
    drop(obj);
    // A damaged map: everything again, nothing wrong.
    use std::os::unix::fs::FileExt;
    cache_file(dir.path(), "map")
        .write_all_at(b"garbage!", 0)
        .unwrap();
    let gets = m.gets.load(SeqCst);
    let obj = open(&m, dir.path(), &opts());
    assert_eq!(read(&obj, 0, three).unwrap(), &data[..three]);
    assert_eq!(m.gets.load(SeqCst), gets + 3);
}

fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn the_cache_stays_within_its_size() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let limit = 4 * CHUNK as u64;
    let o = RemoteOptions {
        cache_size: Some(limit),
        ..opts()
    };
    let obj = open(&m, dir.path(), &o);
    let data = m.data.lock().unwrap().clone();
    for c in 0..16u64 {
        let off = c * CHUNK as u64;
        assert_eq!(read(&obj, off, 100).unwrap(), &data[off as usize..][..100]);
    }
    // Readers are answered before their chunks are stored, and each store
    // trims the cache after it: the last ones settle just after.
    wait_until("the cache within its size", || {
        use std::os::unix::fs::MetadataExt;
        let data = cache_file(dir.path(), "data").metadata().unwrap();
        data.blocks() * 512 <= limit
    });
    // The most recent chunk is still there.
    let gets = m.gets.load(SeqCst);
    read(&obj, 15 * CHUNK as u64, 100).unwrap();
    assert_eq!(m.gets.load(SeqCst), gets);
}

#[test]
fn transient_failures_are_retried_and_counted() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    m.fail_next.store(3, SeqCst);
    assert_eq!(read(&obj, 0, 10).unwrap(), pattern(10, 0));
    assert_eq!(obj.stats().retries, 3);
    assert_eq!(m.gets.load(SeqCst), 4);
}

#[test]
fn a_dead_backend_fails_within_the_timeout_and_later_reads_recover() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let o = RemoteOptions {
        timeout: Duration::from_secs(1),
        ..opts()
    };
    let obj = open(&m, dir.path(), &o);
    m.down.store(true, SeqCst);
    let t = Instant::now();
    let e = read(&obj, 0, 10).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(e.errno(), libc::EIO);
    let text = e.to_string();
    assert!(text.contains("mem://obj") && text.contains("503"), "{text}");
    assert!(obj.stats().fetch_errors >= 1);
    // A stalled backend: the request's own limit ends it.
    m.down.store(false, SeqCst);
    *m.stall.lock().unwrap() = Duration::from_secs(30);
    let t = Instant::now();
    let e = read(&obj, 0, 10).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    // The request's own limit or the reader's deadline, whichever ends
    // first: both are `timeout=`.
    let text = e.to_string();
    assert!(
        text.contains("timed out") || text.contains("no answer within timeout=1 s"),
        "{text}"
    );
    // Back up: the next read works.
    *m.stall.lock().unwrap() = Duration::ZERO;
    assert_eq!(read(&obj, 0, 10).unwrap(), pattern(10, 0));
}

#[test]
fn short_bodies_are_errors() {
    let m = mem(1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    m.short.store(true, SeqCst);
    let e = read(&obj, 0, 10).unwrap_err();
    assert!(e.to_string().contains("sent 32768 bytes for 65536"), "{e}");
    m.short.store(false, SeqCst);
    assert_eq!(read(&obj, 0, 10).unwrap(), pattern(10, 0));
}

#[test]
fn open_failures_are_one_line_naming_the_url() {
    let m = mem(100);
    m.down.store(true, SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let o = RemoteOptions {
        timeout: Duration::from_millis(300),
        ..opts()
    };
    let e = RemoteObject::open_with(
        Box::new(MemBackend(m.clone())),
        "i",
        "mem://obj",
        dir.path(),
        &o,
        None,
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("mem://obj: 503 Service Unavailable (gave up after"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    let bad = RemoteOptions {
        chunk: 3 << 16,
        ..opts()
    };
    m.down.store(false, SeqCst);
    let e = RemoteObject::open_with(
        Box::new(MemBackend(m)),
        "i",
        "mem://obj",
        dir.path(),
        &bad,
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("power of two"), "{e}");
}

#[test]
fn the_end_of_the_object_clips_reads() {
    let m = mem(100_000);
    let dir = tempfile::tempdir().unwrap();
    let obj = open(&m, dir.path(), &opts());
    assert_eq!(
        read(&obj, 99_990, 100).unwrap(),
        &pattern(100_000, 0)[99_990..]
    );
    assert_eq!(read(&obj, 100_000, 100).unwrap(), b"");
    assert_eq!(read(&obj, u64::MAX, 100).unwrap(), b"");
}

#[test]
fn a_size_too_large_to_cache_is_refused_at_open() {
    let m = mem(1000);
    *m.claimed_size.lock().unwrap() = Some(u64::MAX);
    let dir = tempfile::tempdir().unwrap();
    let e = RemoteObject::open_with(
        Box::new(MemBackend(m.clone())),
        "mem://obj",
        "mem://obj",
        dir.path(),
        &opts(),
        None,
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("mem://obj") && text.contains("18446744073709551615 bytes"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A backend serving a fixed digest object.
struct DigestBackend(Vec<u8>);

impl Backend for DigestBackend {
    fn head(&self, _: Duration) -> Result<Head, FetchError> {
        Ok(Head {
            size: self.0.len() as u64,
            etag: Some("\"d\"".into()),
            last_modified: None,
        })
    }
    fn get(&self, _: &Head, start: u64, len: u64, _: Duration) -> Result<Vec<u8>, FetchError> {
        Ok(self.0[start as usize..(start + len) as usize].to_vec())
    }
}

fn digest_of(data: &[u8]) -> Vec<u8> {
    super::digest::Digest::of_reader(data, super::digest::PIECE)
        .unwrap()
        .to_bytes()
}

fn open_digested(
    m: &Arc<Mem>,
    dir: &std::path::Path,
    o: &RemoteOptions,
    digest: Vec<u8>,
) -> foliofs_vfs::Result<RemoteObject> {
    RemoteObject::open_with(
        Box::new(MemBackend(m.clone())),
        "mem://obj",
        "mem://obj",
        dir,
        o,
        Some((Box::new(DigestBackend(digest)), "mem://obj.digest".into())),
    )
}

#[test]
fn flipped_bytes_are_fetched_again_never_served_or_cached() {
    let m = mem(300_000);
    let truth = m.data.lock().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let o = opts();
    let r = open_digested(&m, dir.path(), &o, digest_of(&truth)).unwrap();
    // Two bad bodies in a row: the third try is right.
    m.flip.store(2, SeqCst);
    let mut buf = vec![0u8; truth.len()];
    assert_eq!(r.read_at(&mut buf, 0).unwrap(), truth.len());
    assert!(buf == truth, "wrong bytes served");
    let s = r.stats();
    assert_eq!(s.fetch_corrupt, 2, "{s:?}");
    assert!(r.settle(Duration::from_secs(5)));
    drop(r);
    // What the cache kept is right: read back with the backend now lying
    // on every GET, and no GET needed.
    m.flip.store(u32::MAX, SeqCst);
    let gets = m.gets.load(SeqCst);
    let r = open_digested(&m, dir.path(), &o, digest_of(&truth)).unwrap();
    let mut again = vec![0u8; truth.len()];
    r.read_at(&mut again, 0).unwrap();
    assert!(again == truth);
    assert_eq!(m.gets.load(SeqCst), gets);
}

#[test]
fn flipped_bytes_that_persist_are_eio() {
    let m = mem(200_000);
    let truth = m.data.lock().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let o = RemoteOptions {
        timeout: Duration::from_secs(1),
        ..opts()
    };
    let r = open_digested(&m, dir.path(), &o, digest_of(&truth)).unwrap();
    m.flip.store(u32::MAX, SeqCst);
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let e = r.read_at(&mut buf, 70_000).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(e.contains("do not match the digest"), "{e}");
    assert!(r.stats().fetch_corrupt > 0);
    // Healed when the fault stops.
    m.flip.store(0, SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match r.read_at(&mut buf, 70_000) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "not healed: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(buf[..] == truth[70_000..74_096]);
}

#[test]
fn a_wrong_digest_fails_the_open_by_name() {
    let m = mem(200_000);
    let truth = m.data.lock().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let mut damaged = digest_of(&truth);
    damaged[50] ^= 1;
    let other = digest_of(&truth[..150_000]);
    for (digest, why) in [
        (damaged, "damaged"),
        (other, "an object of 150000 bytes"),
        (b"not a digest".to_vec(), "bad magic"),
    ] {
        let e = open_digested(&m, dir.path(), &opts(), digest)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("digest mem://obj.digest") && e.contains(why),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}

/// Accepts a chunk only when it is the truth (or, with `refuse_all`,
/// never).
struct Truth {
    data: Vec<u8>,
    refuse_all: bool,
    asked: AtomicU32,
}

impl super::scheme::Verify for Arc<Truth> {
    fn verify(&self, start: u64, chunk: &[u8]) -> Result<(), String> {
        self.asked.fetch_add(1, SeqCst);
        let s = start as usize;
        if self.refuse_all || self.data.get(s..s + chunk.len()) != Some(chunk) {
            return Err("not the truth".into());
        }
        Ok(())
    }
}

fn open_verified(m: &Arc<Mem>, dir: &std::path::Path, v: &Arc<Truth>) -> RemoteObject {
    RemoteObject::open_checked(
        Box::new(MemBackend(m.clone())),
        "mem://obj",
        "mem://obj",
        dir,
        &opts(),
        None,
        Some(Box::new(v.clone())),
    )
    .unwrap()
}

#[test]
fn a_cached_chunk_is_verified_once_per_process_before_it_is_served() {
    let m = mem(200_000);
    let truth = m.data.lock().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let v = Arc::new(Truth {
        data: truth.clone(),
        refuse_all: false,
        asked: AtomicU32::new(0),
    });
    let mut buf = vec![0u8; truth.len()];
    {
        // Fetched: checked by the backend as it came, not again.
        let r = open_verified(&m, dir.path(), &v);
        assert_eq!(r.read_at(&mut buf, 0).unwrap(), truth.len());
        assert!(buf == truth);
        assert_eq!(v.asked.load(SeqCst), 0);
        assert!(r.settle(Duration::from_secs(10)));
    }
    let gets = m.gets.load(SeqCst);
    {
        // Another process: each cached chunk verified at its first read,
        // whole, and not at the next.
        let r = open_verified(&m, dir.path(), &v);
        for _ in 0..2 {
            buf.fill(0);
            assert_eq!(r.read_at(&mut buf[..1000], 70_000).unwrap(), 1000);
            assert!(buf[..1000] == truth[70_000..71_000]);
        }
        assert_eq!(v.asked.load(SeqCst), 1);
        assert_eq!(m.gets.load(SeqCst), gets);
    }
    // A verification that fails drops the chunk and fetches it again,
    // never serving what failed.
    let refuse = Arc::new(Truth {
        data: truth.clone(),
        refuse_all: true,
        asked: AtomicU32::new(0),
    });
    let r = open_verified(&m, dir.path(), &refuse);
    buf.fill(0);
    assert_eq!(r.read_at(&mut buf[..1000], 70_000).unwrap(), 1000);
    assert!(buf[..1000] == truth[70_000..71_000]);
    assert_eq!(refuse.asked.load(SeqCst), 1);
    assert_eq!(m.gets.load(SeqCst), gets + 1);
    assert_eq!(r.stats().cache_corrupt, 1);
}
