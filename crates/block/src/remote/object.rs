//! A remote object read in chunks through the disk cache.
//!
//! Readers never fetch themselves: a missing chunk becomes a *flight*
//! that a pool of fetch threads serves (`object/fetch.rs`), in three
//! queues by priority: chunks a reader waits for, then read-ahead
//! (sequential reads and [`RemoteObject::will_need`] hints), then
//! `prefetch_all`'s walk over the whole object.
//!
//! Read-ahead is earned: reads are followed as a few *streams* (a read
//! that starts near where one ended continues it), and a stream is read
//! ahead by at most half of what it has read in order. A metadata walk
//! that hops about a few chunks reads little and so earns little, and
//! whatever a stream fetched ahead and nobody read is at most half of
//! what it did read. Chunks already on disk are left to the kernel's
//! read-ahead of the cache file, as a local image's are.

mod fetch;
mod open;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

use foliofs_vfs::{Error, Result};

use super::cache::{DiskCache, Found};
use super::client::{Backend, Head, RetryPolicy};
use super::digest::Digest;
use super::scheme::Verify;
use super::stats::{Counters, RemoteStats, Stat};
use fetch::Flight;
pub(crate) use fetch::WORKERS;

/// Read-ahead hints waiting at most (more are dropped: they are hints).
const AHEAD_QUEUE: usize = 64;
/// Sequential streams followed at once: the reads of a tree's files must
/// stay one run while the metadata between them is read elsewhere.
const STREAMS: usize = 4;
/// How far from a stream's end a read may start and still continue it:
/// FUSE's threads and the kernel's own read-ahead deliver a sequential
/// read a little out of order, and small files lie a few blocks apart.
const STREAM_SLACK: u64 = 256 << 10;
/// The most a stream reads ahead.
const MAX_AHEAD: u64 = 8 << 20;
/// The most chunks an object may have: 16 TiB in chunks of 1 MiB (ext4's
/// largest file), 64 MiB of entries.
pub const MAX_CHUNKS: u64 = 1 << 24;

/// A run of reads in order.
#[derive(Clone, Copy, Default)]
struct Stream {
    /// Where its furthest read ended.
    end: u64,
    /// Bytes read in the run after its first read: what it earned.
    earned: u64,
    /// The first chunk past what it queued ahead already.
    queued: u64,
    /// When it was last continued (0: unused).
    used: u64,
}

struct State {
    inflight: HashMap<u64, Arc<Flight>>,
    demand: VecDeque<u64>,
    ahead: VecDeque<u64>,
    /// `prefetch_all`'s next chunk, while it has one.
    prefetch: Option<u64>,
    /// Threads busy with read-ahead or prefetch.
    background: usize,
    streams: [Stream; STREAMS],
    tick: u64,
    shutdown: bool,
}

struct Shared {
    backend: Box<dyn Backend>,
    head: Head,
    shown: String,
    chunk: u64,
    chunks: u64,
    max_window: u64,
    /// Most adjacent chunks one fetch takes (see `scheme::Opened`).
    max_run: AtomicU64,
    cache: DiskCache,
    /// What every fetched chunk is checked against, when asked for.
    digest: Option<Digest>,
    /// What a chunk read back from the disk cache is checked against, the
    /// first time this process reads it, when its source asks for that;
    /// with which chunks passed.
    verify: Option<(Box<dyn Verify>, Vec<AtomicBool>)>,
    policy: RetryPolicy,
    /// Set when a fetch gave up, cleared by the next that succeeds.
    down: AtomicBool,
    counters: Counters,
    state: Mutex<State>,
    work: Condvar,
}

/// An object in S3 or behind an HTTPS URL, read in chunks through a disk
/// cache. Shared by every open of the same source in the process.
pub struct RemoteObject {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RemoteObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteObject")
            .field("url", &self.shared.shown)
            .field("size", &self.shared.head.size)
            .field("chunk", &self.shared.chunk)
            .field("cache", &self.shared.cache)
            .finish()
    }
}

/// An error at open: one line naming the (redacted) source.
fn open_error(kind: io::ErrorKind, shown: &str, why: impl std::fmt::Display) -> Error {
    Error::Io {
        offset: 0,
        source: io::Error::new(kind, format!("{shown}: {why}")),
    }
}

/// The open objects of this process, by source and options: an image may
/// be opened more than once (a device table is read before the image it
/// belongs to is opened), and each open after the first must not cost
/// another HEAD. One nothing else holds any more is
/// released by [`release_unused`]: its threads end, its chunks are
/// committed and its cache files closed.
fn registry() -> &'static Mutex<HashMap<String, Arc<RemoteObject>>> {
    static R: OnceLock<Mutex<HashMap<String, Arc<RemoteObject>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Waits (at most `within` in all) until every object this process opened
/// has its fetched chunks in the disk cache: a process that ends right
/// after its last read would otherwise leave those chunks uncached. True
/// when they all are.
pub fn settle_all(within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    let objects: Vec<_> = registry().lock().unwrap().values().cloned().collect();
    objects
        .iter()
        .all(|o| o.settle(deadline.saturating_duration_since(std::time::Instant::now())))
}

/// Closes every object no open image uses any more (the registry's is the
/// only reference left); returns how many. Each new open does this too.
pub fn release_unused() -> usize {
    let unused: Vec<Arc<RemoteObject>> = {
        let mut reg = registry().lock().unwrap();
        let keys: Vec<String> = reg
            .iter()
            .filter(|(_, o)| Arc::strong_count(o) == 1)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter().filter_map(|k| reg.remove(k)).collect()
    };
    // Dropped outside the lock: each waits for its threads.
    unused.len()
}

impl RemoteObject {
    /// The object's size, from the HEAD at open.
    pub fn size(&self) -> u64 {
        self.shared.head.size
    }

    /// The URL as shown: no query string, no user info.
    pub fn shown(&self) -> &str {
        &self.shared.shown
    }

    /// Bytes per ranged GET and per cache entry.
    pub fn chunk_size(&self) -> u32 {
        self.shared.chunk as u32
    }

    /// Lets one fetch take up to `n` adjacent chunks that are queued one
    /// after another (1: each chunk its own request).
    pub(crate) fn set_max_run(&self, n: u32) {
        self.shared
            .max_run
            .store(u64::from(n.max(1)), Ordering::Relaxed);
    }

    /// Puts chunk bytes its source fetched and checked as it opened (at
    /// `start`, a chunk's start, the whole chunk) into the disk cache,
    /// unless the cache holds that chunk already.
    pub(crate) fn preload(&self, start: u64, bytes: &[u8]) {
        let s = &self.shared;
        if !start.is_multiple_of(s.chunk) {
            return;
        }
        let c = start / s.chunk;
        if c >= s.chunks || bytes.len() != s.chunk_len(c) || s.cache.holds(c) {
            return;
        }
        s.counters.add(Stat::BytesFetched, bytes.len() as u64);
        s.cache.arriving().store(c, bytes);
        if let Some((_, passed)) = &s.verify {
            passed[c as usize].store(true, Ordering::Relaxed);
        }
    }

    /// This object's counters (the process's are [`super::stats`]).
    pub fn stats(&self) -> RemoteStats {
        self.shared.counters.snapshot()
    }

    /// Whether every chunk is in the cache (as far as this process knows).
    pub fn fully_cached(&self) -> bool {
        (0..self.shared.chunks).all(|c| self.shared.cache.holds(c))
    }

    /// Fills `buf` from `offset`, up to the end of the object; returns the
    /// bytes read. A failure is EIO naming the URL and the cause.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let r = self.shared.read_at(buf, offset);
        if let Err(e) = &r {
            log::warn!("{e}");
        }
        r
    }

    /// Waits (at most `within`) until every chunk fetched so far is in the
    /// disk cache; true when it is.
    pub fn settle(&self, within: std::time::Duration) -> bool {
        self.shared.cache.settle(within)
    }

    /// Schedules read-ahead of `[offset, offset + len)`.
    pub fn will_need(&self, offset: u64, len: u64) {
        let s = &self.shared;
        if len == 0 || offset >= s.head.size {
            return;
        }
        let first = offset / s.chunk;
        let last = ((offset + len).min(s.head.size) - 1) / s.chunk;
        let mut st = s.state.lock().unwrap();
        let mut cached = Vec::new();
        for c in first..=last.min(first + AHEAD_QUEUE as u64) {
            if s.wanted(&st, c) {
                if st.ahead.len() < AHEAD_QUEUE && !st.ahead.contains(&c) {
                    st.ahead.push_back(c);
                }
            } else if s.cache.holds(c) {
                cached.push(c);
            }
        }
        drop(st);
        s.work.notify_all();
        let end = (offset + len).min(s.head.size);
        for c in cached {
            let from = offset.max(c * s.chunk);
            let to = end.min((c + 1) * s.chunk);
            s.cache.will_need(c, from, to - from);
        }
    }
}

impl Drop for RemoteObject {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Whether chunk `c` is neither in the cache nor on its way.
    fn wanted(&self, st: &State, c: u64) -> bool {
        !self.cache.holds(c) && !st.inflight.contains_key(&c)
    }

    fn chunk_len(&self, c: u64) -> usize {
        self.chunk.min(self.head.size - c * self.chunk) as usize
    }

    /// Reads from the cache, counting what it found; true on a hit.
    fn look(&self, c: u64, within: usize, out: &mut [u8]) -> bool {
        if let Some((v, passed)) = &self.verify {
            if !passed[c as usize].load(Ordering::Relaxed) {
                return self.look_verified(c, within, out, &**v, &passed[c as usize]);
            }
        }
        match self.cache.lookup(c, within, out) {
            Found::Hit => {
                self.counters.add(Stat::CacheHits, 1);
                true
            }
            Found::Damaged => {
                self.counters.add(Stat::CacheCorrupt, 1);
                false
            }
            Found::Miss => false,
        }
    }

    /// [`Shared::look`] of a chunk not yet verified in this process: the
    /// whole chunk read and verified first, and dropped from the cache
    /// (to be fetched, and checked, again) when it fails.
    fn look_verified(
        &self,
        c: u64,
        within: usize,
        out: &mut [u8],
        v: &dyn Verify,
        passed: &AtomicBool,
    ) -> bool {
        let mut whole = vec![0u8; self.chunk_len(c)];
        match self.cache.lookup(c, 0, &mut whole) {
            Found::Hit => {}
            Found::Damaged => {
                self.counters.add(Stat::CacheCorrupt, 1);
                return false;
            }
            Found::Miss => return false,
        }
        if let Err(why) = v.verify(c * self.chunk, &whole) {
            log::warn!(
                "{}: cached chunk {c} fails its verification ({why}): dropped, fetched again",
                self.shown
            );
            self.counters.add(Stat::CacheCorrupt, 1);
            self.cache.forget(c);
            return false;
        }
        passed.store(true, Ordering::Relaxed);
        self.counters.add(Stat::CacheHits, 1);
        out.copy_from_slice(&whole[within..within + out.len()]);
        true
    }

    /// The flight chunk `c` is fetched by, started if none is, and
    /// whether it was already under way.
    fn flight_for(&self, st: &mut State, c: u64) -> (Arc<Flight>, bool) {
        match st.inflight.get(&c) {
            Some(f) => (f.clone(), true),
            None => {
                let f = Flight::new();
                st.inflight.insert(c, f.clone());
                st.demand.push_back(c);
                self.work.notify_one();
                (f, false)
            }
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let size = self.head.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min((size - offset) as usize);
        let buf = &mut buf[..n];
        let first = offset / self.chunk;
        let last = (offset + n as u64 - 1) / self.chunk;
        // The part of `buf` chunk `c` fills, and where in the chunk it starts.
        let part = |c: u64| {
            let start = (c * self.chunk).max(offset);
            let end = ((c + 1) * self.chunk).min(offset + n as u64);
            (
                (start - offset) as usize..(end - offset) as usize,
                (start - c * self.chunk) as usize,
            )
        };
        let mut waits = Vec::new();
        for c in first..=last {
            let (range, within) = part(c);
            if self.look(c, within, &mut buf[range.clone()]) {
                continue;
            }
            let mut st = self.state.lock().unwrap();
            if self.cache.holds(c) && !st.inflight.contains_key(&c) {
                // Stored between the look above and the lock: one more
                // look (one found damaged is forgotten, and fetched).
                drop(st);
                if self.look(c, within, &mut buf[range.clone()]) {
                    continue;
                }
                st = self.state.lock().unwrap();
            }
            self.counters.add(Stat::CacheMisses, 1);
            let (flight, joined) = self.flight_for(&mut st, c);
            waits.push((c, flight, joined));
        }
        self.sequential(offset, n as u64);
        let deadline = std::time::Instant::now() + self.policy.total;
        for (c, mut flight, joined) in waits {
            let (range, within) = part(c);
            if joined {
                // A flight begun before this reader came may fail on what
                // the server did then (a stall it has since left): one new
                // flight of the reader's own, within its own deadline.
                if let Some(Err(_)) = flight.wait(deadline) {
                    let mut st = self.state.lock().unwrap();
                    flight = self.flight_for(&mut st, c).0;
                }
            }
            let outcome = flight.wait(deadline).unwrap_or_else(|| {
                let last = flight
                    .last_try()
                    .map(|why| format!(" (last try: {why})"))
                    .unwrap_or_default();
                Err(format!(
                    "bytes {}-{}: no answer within timeout={} s{last}",
                    c * self.chunk,
                    c * self.chunk + self.chunk_len(c) as u64 - 1,
                    self.policy.total.as_secs_f64()
                )
                .into())
            });
            match outcome {
                Ok(data) => buf[range.clone()].copy_from_slice(&data[within..within + range.len()]),
                Err(why) => {
                    return Err(Error::Io {
                        offset: c * self.chunk + within as u64,
                        source: io::Error::other(format!("{}: {why}", self.shown)),
                    })
                }
            }
        }
        self.counters.add(Stat::BytesRead, n as u64);
        Ok(n)
    }

    /// Notes a read of `n` bytes at `offset`: continues the stream it
    /// follows (or starts one in place of the least recently used) and
    /// queues the chunks to fetch within what the stream has earned ahead
    /// of it.
    fn sequential(&self, offset: u64, n: u64) {
        let mut st = self.state.lock().unwrap();
        st.tick += 1;
        let tick = st.tick;
        let near = |s: &Stream| {
            s.used != 0
                && offset.saturating_add(STREAM_SLACK) >= s.end
                && offset <= s.end + STREAM_SLACK
        };
        let s = match st.streams.iter().position(near) {
            Some(i) => {
                let s = &mut st.streams[i];
                s.end = s.end.max(offset + n);
                s.earned += n;
                s.used = tick;
                i
            }
            None => {
                // A read that follows nothing proves nothing yet.
                let i = (0..STREAMS).min_by_key(|&i| st.streams[i].used).unwrap();
                st.streams[i] = Stream {
                    end: offset + n,
                    earned: 0,
                    queued: 0,
                    used: tick,
                };
                return;
            }
        };
        let Stream {
            end,
            earned,
            queued,
            ..
        } = st.streams[s];
        let window = (earned / self.chunk / 2).min(self.max_window);
        let last = (end - 1) / self.chunk;
        let from = queued.max(last + 1);
        let to = (last + window + 1).min(self.chunks);
        if from >= to {
            return;
        }
        st.streams[s].queued = to;
        let mut fetch = false;
        for c in from..to {
            if self.wanted(&st, c) && !st.ahead.contains(&c) {
                if st.ahead.len() >= AHEAD_QUEUE {
                    st.ahead.pop_front();
                }
                st.ahead.push_back(c);
                fetch = true;
            }
        }
        drop(st);
        if fetch {
            self.work.notify_all();
        }
    }
}
