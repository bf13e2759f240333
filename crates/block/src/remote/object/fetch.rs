//! The fetch threads of one object.
//!
//! A missing chunk becomes one *flight*, which every reader of that chunk
//! waits on; a small pool of threads serves them by priority. Background
//! work (read-ahead, `prefetch_all`) never takes the last free thread, so
//! a reader that blocks finds one idle at once.
//!
//! A fetched chunk is given to its waiting readers first and written to
//! the disk cache after; its flight stays listed, answered, until the
//! chunk is there, so a reader that comes in between takes the bytes from
//! the flight rather than fetching them again. The cache makes chunks
//! durable on a thread of its own (`DiskCache::commit_next`), so a
//! fetch thread does not wait for the disk before its next GET.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::super::client::{retrying, FetchError, GaveUp};
use super::super::stats::Stat;
use super::{Shared, State};

/// Fetch threads per object: enough to keep several ranged GETs in flight.
pub(crate) const WORKERS: usize = 4;

type Outcome = std::result::Result<Arc<Vec<u8>>, Arc<str>>;

/// One fetch of one chunk, which any number of readers wait on.
pub(super) struct Flight {
    result: Mutex<Option<Outcome>>,
    done: Condvar,
    /// Why the last try failed, while the fetch still retries: a reader
    /// whose own deadline comes first says what the server was doing.
    last_try: Mutex<Option<String>>,
}

impl Flight {
    pub(super) fn new() -> Arc<Flight> {
        Arc::new(Flight {
            result: Mutex::new(None),
            done: Condvar::new(),
            last_try: Mutex::new(None),
        })
    }

    /// Why the last failed try of this fetch failed, if one did.
    pub(super) fn last_try(&self) -> Option<String> {
        self.last_try.lock().unwrap().clone()
    }

    /// The outcome, or `None` once `deadline` passes without one: a
    /// reader queued behind fetches that hang waits no longer than
    /// `timeout=` says, whatever they do.
    pub(super) fn wait(&self, deadline: Instant) -> Option<Outcome> {
        let mut r = self.result.lock().unwrap();
        loop {
            if let Some(o) = &*r {
                return Some(o.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            r = self.done.wait_timeout(r, left).unwrap().0;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Priority {
    Demand,
    Ahead,
    Prefetch,
}

/// Work for a fetch thread: a run of adjacent chunks from the first, each
/// with its flight.
struct Job {
    first: u64,
    prio: Priority,
    flights: Vec<Arc<Flight>>,
}

impl Shared {
    /// A new flight for chunk `c`, listed.
    fn claim(st: &mut State, c: u64) -> Arc<Flight> {
        let f = Flight::new();
        st.inflight.insert(c, f.clone());
        f
    }

    /// The next job, by priority; background work only while another
    /// thread stays free for readers. A job takes the chunks queued right
    /// after its first (as many as `max_run` allows), so that a source
    /// whose requests cost more than their bytes makes fewer of them.
    fn next_job(&self, st: &mut State) -> Option<Job> {
        let max_run = self.max_run.load(Ordering::Relaxed).max(1) as usize;
        if let Some(c) = st.demand.pop_front() {
            let mut flights = vec![st.inflight.get(&c).cloned().unwrap_or_else(Flight::new)];
            while flights.len() < max_run && st.demand.front() == Some(&(c + flights.len() as u64))
            {
                let d = st.demand.pop_front().unwrap_or(c);
                flights.push(st.inflight.get(&d).cloned().unwrap_or_else(Flight::new));
            }
            return Some(Job {
                first: c,
                prio: Priority::Demand,
                flights,
            });
        }
        if st.background + 1 >= WORKERS {
            return None;
        }
        while let Some(c) = st.ahead.pop_front() {
            if self.wanted(st, c) {
                let mut flights = vec![Self::claim(st, c)];
                while flights.len() < max_run {
                    let d = c + flights.len() as u64;
                    if st.ahead.front() != Some(&d) || !self.wanted(st, d) {
                        break;
                    }
                    st.ahead.pop_front();
                    flights.push(Self::claim(st, d));
                }
                return Some(Job {
                    first: c,
                    prio: Priority::Ahead,
                    flights,
                });
            }
        }
        while let Some(c) = st.prefetch {
            st.prefetch = (c + 1 < self.chunks).then_some(c + 1);
            if self.wanted(st, c) {
                let mut flights = vec![Self::claim(st, c)];
                while flights.len() < max_run {
                    let d = c + flights.len() as u64;
                    if st.prefetch != Some(d) || !self.wanted(st, d) {
                        break;
                    }
                    st.prefetch = (d + 1 < self.chunks).then_some(d + 1);
                    flights.push(Self::claim(st, d));
                }
                return Some(Job {
                    first: c,
                    prio: Priority::Prefetch,
                    flights,
                });
            }
        }
        None
    }

    pub(super) fn work_loop(&self) {
        let mut st = self.state.lock().unwrap();
        loop {
            if st.shutdown {
                return;
            }
            let Some(job) = self.next_job(&mut st) else {
                st = self.work.wait(st).unwrap();
                continue;
            };
            if job.prio != Priority::Demand {
                st.background += 1;
            }
            drop(st);
            let outcome = self.fetch(job.first, &job.flights);
            if let Ok(body) = &outcome {
                // Readers first (the disk write can wait), but counted
                // from now on, so that settling waits for it.
                let mut at = 0;
                for (k, flight) in job.flights.iter().enumerate() {
                    let c = job.first + k as u64;
                    let len = self.chunk_len(c);
                    let data = if job.flights.len() == 1 {
                        body.clone()
                    } else {
                        Arc::new(body[at..at + len].to_vec())
                    };
                    at += len;
                    let arriving = self.cache.arriving();
                    *flight.result.lock().unwrap() = Some(Ok(data.clone()));
                    flight.done.notify_all();
                    arriving.store(c, &data);
                }
            }
            st = self.state.lock().unwrap();
            for k in 0..job.flights.len() {
                st.inflight.remove(&(job.first + k as u64));
            }
            if let Err(e) = outcome {
                // Answered only once unlisted: a reader's next try must
                // make a new flight, not find this failed one.
                for flight in &job.flights {
                    *flight.result.lock().unwrap() = Some(Err(e.clone()));
                    flight.done.notify_all();
                }
            }
            if job.prio != Priority::Demand {
                st.background -= 1;
                // A thread held back for readers may take background work.
                self.work.notify_one();
            }
        }
    }

    /// Makes stored chunks durable and enters them, until the object is
    /// dropped and none is left; when idle, trims the cache again if an
    /// eviction found it shared and could not.
    pub(super) fn commit_loop(&self) {
        loop {
            if self
                .cache
                .commit_next(std::time::Duration::from_millis(100))
            {
                continue;
            }
            if self.state.lock().unwrap().shutdown {
                // The last stores may have taken the directory past its
                // limit with another process's: counted once more.
                self.cache.tidy_at_close();
                return;
            }
            self.cache.tidy();
        }
    }

    /// Fetches the chunks from `c` that `flights` stand for, in one
    /// request, and checks its length: with retries within `timeout=`,
    /// or, once a fetch gave up and until the server answers again, one
    /// try, so that readers fail fast rather than each wait out the whole
    /// timeout against a server that is down.
    fn fetch(&self, c: u64, flights: &[Arc<Flight>]) -> Outcome {
        let start = c * self.chunk;
        let len: u64 = (0..flights.len() as u64)
            .map(|k| self.chunk_len(c + k) as u64)
            .sum();
        let tried = |t| {
            self.counters.add(Stat::Requests, 1);
            let body = self.backend.get(&self.head, start, len, t)?;
            if body.len() as u64 != len {
                // Cut short on the way, or an object shorter than at
                // open (which the next try finds out from the status).
                return Err(FetchError::transient(format!(
                    "bytes {start}-{}: the server sent {} bytes for {len}",
                    start + len - 1,
                    body.len()
                )));
            }
            if let Some(d) = &self.digest {
                if let Err(why) = d.check(start, &body) {
                    // Damaged on the way (or by the server): never handed
                    // on, tried again as a transient fault.
                    self.counters.add(Stat::FetchCorrupt, 1);
                    return Err(FetchError::transient(why));
                }
            }
            Ok(body)
        };
        let attempt = |t| {
            tried(t).inspect_err(|e: &FetchError| {
                if e.corrupt {
                    // The backend's own check (a chunk index's checksum,
                    // a dm-verity tree) refused what came.
                    self.counters.add(Stat::FetchCorrupt, 1);
                }
                for flight in flights {
                    *flight.last_try.lock().unwrap() = Some(e.message.clone());
                }
            })
        };
        let got = if self.down.load(Ordering::Relaxed) {
            let t = Instant::now();
            attempt(self.policy.per_request).map_err(|last| GaveUp {
                last,
                tries: 1,
                elapsed: t.elapsed(),
            })
        } else {
            retrying(&self.policy, &self.counters, attempt)
        };
        let was_down = self.down.swap(got.is_err(), Ordering::Relaxed);
        if was_down != got.is_err() {
            log::info!(
                "{}: {}",
                self.shown,
                if was_down {
                    "the server answers again"
                } else {
                    "failing reads fast until the server answers again"
                }
            );
        }
        match got {
            Ok(body) => {
                self.counters.add(Stat::BytesFetched, len);
                if let Some((_, passed)) = &self.verify {
                    // Checked by the backend as it came.
                    for k in 0..flights.len() {
                        passed[c as usize + k].store(true, Ordering::Relaxed);
                    }
                }
                Ok(Arc::new(body))
            }
            Err(e) => {
                self.counters.add(Stat::FetchErrors, 1);
                let why = format!("bytes {start}-{}: {}", start + len - 1, e.describe());
                log::debug!("{}: {why}", self.shown);
                Err(why.into())
            }
        }
    }
}
