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

use std::sync::{Arc, Condvar, Mutex};

use super::super::client::{retrying, FetchError};
use super::super::stats::Stat;
use super::{Shared, State};

/// Fetch threads per object: enough to keep several ranged GETs in flight.
pub(crate) const WORKERS: usize = 4;

type Outcome = std::result::Result<Arc<Vec<u8>>, Arc<str>>;

/// One fetch of one chunk, which any number of readers wait on.
pub(super) struct Flight {
    result: Mutex<Option<Outcome>>,
    done: Condvar,
}

impl Flight {
    pub(super) fn new() -> Arc<Flight> {
        Arc::new(Flight {
            result: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    pub(super) fn wait(&self) -> Outcome {
        let mut r = self.result.lock().unwrap();
        loop {
            if let Some(o) = &*r {
                return o.clone();
            }
            r = self.done.wait(r).unwrap();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Priority {
    Demand,
    Ahead,
    Prefetch,
}

/// Work for a fetch thread: a chunk to fetch.
type Job = (u64, Priority, Arc<Flight>);

impl Shared {
    /// The next job, by priority; background work only while another
    /// thread stays free for readers.
    fn next_job(&self, st: &mut State) -> Option<Job> {
        if let Some(c) = st.demand.pop_front() {
            let f = st.inflight.get(&c).cloned().unwrap_or_else(Flight::new);
            return Some((c, Priority::Demand, f));
        }
        if st.background + 1 >= WORKERS {
            return None;
        }
        while let Some(c) = st.ahead.pop_front() {
            if self.wanted(st, c) {
                let f = Flight::new();
                st.inflight.insert(c, f.clone());
                return Some((c, Priority::Ahead, f));
            }
        }
        while let Some(c) = st.prefetch {
            st.prefetch = (c + 1 < self.chunks).then_some(c + 1);
            if self.wanted(st, c) {
                let f = Flight::new();
                st.inflight.insert(c, f.clone());
                return Some((c, Priority::Prefetch, f));
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
            let Some((c, prio, flight)) = self.next_job(&mut st) else {
                st = self.work.wait(st).unwrap();
                continue;
            };
            if prio != Priority::Demand {
                st.background += 1;
            }
            drop(st);
            let outcome = self.fetch(c);
            if let Ok(data) = &outcome {
                // Readers first (the disk write can wait), but counted
                // from now on, so that settling waits for it.
                let arriving = self.cache.arriving();
                *flight.result.lock().unwrap() = Some(outcome.clone());
                flight.done.notify_all();
                arriving.store(c, data);
            }
            st = self.state.lock().unwrap();
            st.inflight.remove(&c);
            if let Err(e) = outcome {
                // Answered only once it is unlisted: a reader's next try
                // must make a new flight, not find this failed one.
                *flight.result.lock().unwrap() = Some(Err(e));
                flight.done.notify_all();
            }
            if prio != Priority::Demand {
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
                return;
            }
            self.cache.tidy();
        }
    }

    /// Fetches chunk `c` (with retries) and checks its length.
    fn fetch(&self, c: u64) -> Outcome {
        let start = c * self.chunk;
        let len = self.chunk_len(c) as u64;
        let got = retrying(&self.policy, &self.counters, |t| {
            let body = self.backend.get(&self.head, start, len, t)?;
            if body.len() as u64 != len {
                return Err(FetchError::fatal(format!(
                    "bytes {start}-{}: the server sent {} bytes for {len} (the object is shorter than when it was opened?)",
                    start + len - 1,
                    body.len()
                )));
            }
            Ok(body)
        });
        match got {
            Ok(body) => {
                self.counters.add(Stat::BytesFetched, len);
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
