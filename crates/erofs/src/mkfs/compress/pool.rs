//! The compression workers and the queue that feeds them: segments go
//! in as they are read and come out in the same order.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{Compression, Engine, Outcome, SEGMENT};

pub(crate) type Reply = Result<Outcome, String>;

struct Job {
    src: Vec<u8>,
    whole: bool,
    reply: Sender<Reply>,
}

/// A segment on its way: compressed by a worker, or kept as read.
enum Pending {
    Working(Receiver<Reply>),
    Ready(Outcome),
}

impl Pending {
    /// The outcome, waiting for its worker.
    pub fn wait(self) -> Reply {
        match self {
            Pending::Ready(o) => Ok(o),
            Pending::Working(rx) => rx
                .recv()
                .unwrap_or_else(|_| Err("a compression worker died".into())),
        }
    }
}

/// The workers, fed through one queue.
struct Pool {
    tx: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    pub workers: usize,
}

impl Pool {
    /// Starts `workers` threads compressing as `c` says.
    pub fn new(c: Compression, blksz: usize, workers: usize) -> Result<Pool, String> {
        let workers = workers.max(1);
        let (tx, rx) = mpsc::sync_channel::<Job>(workers);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let mut engine = Engine::new(c, blksz)?;
            let rx = Arc::clone(&rx);
            let t = std::thread::Builder::new()
                .name(format!("compress-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let out = engine.segment(job.src, job.whole);
                    // The builder may have stopped on an error meanwhile.
                    let _ = job.reply.send(out);
                })
                .map_err(|e| format!("starting a compression worker: {e}"))?;
            threads.push(t);
        }
        Ok(Pool {
            tx: Some(tx),
            threads,
            workers,
        })
    }

    /// Hands a segment to the next free worker.
    pub fn submit(&self, src: Vec<u8>, whole: bool) -> Pending {
        let (reply, rx) = mpsc::channel();
        let tx = self.tx.as_ref().expect("the pool is open until dropped");
        if let Err(mpsc::SendError(job)) = tx.send(Job { src, whole, reply }) {
            let _ = job
                .reply
                .send(Err("the compression workers stopped".into()));
        }
        Pending::Working(rx)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Segments in the order they were read, on their way through the
/// workers: at most a few segments per worker, so that memory stays
/// bounded whatever the input, and taken out in the order they went in,
/// so that the image does not depend on which worker is faster.
pub(crate) struct Queue {
    pool: Pool,
    /// (the file's slot, the segment's number in it, the segment, its
    /// bytes read).
    items: VecDeque<(usize, u32, Pending, usize)>,
    bytes: usize,
}

impl Queue {
    /// A queue with `workers` threads compressing as `c` says.
    pub fn new(c: Compression, blksz: usize, workers: usize) -> Result<Queue, String> {
        Ok(Queue {
            pool: Pool::new(c, blksz, workers)?,
            items: VecDeque::new(),
            bytes: 0,
        })
    }

    /// Hands segment `seg` of the file in `slot` to the workers.
    pub fn submit(&mut self, slot: usize, seg: u32, src: Vec<u8>, whole: bool) {
        let n = src.len();
        let p = self.pool.submit(src, whole);
        self.items.push_back((slot, seg, p, n));
        self.bytes += n;
    }

    /// Queues a whole file as it was read: stored as it is, but written
    /// in its turn.
    pub fn plain(&mut self, slot: usize, v: Vec<u8>) {
        let n = v.len();
        self.items
            .push_back((slot, 0, Pending::Ready(Outcome::Plain(v)), n));
        self.bytes += n;
    }

    /// True while the queue holds more than it should before its oldest
    /// segment is written.
    pub fn full(&self) -> bool {
        let workers = self.pool.workers;
        self.bytes > (2 * workers + 2) * SEGMENT || self.items.len() > 64 * workers
    }

    /// The oldest segment, (slot, segment number, what its worker made of
    /// it), waiting for the worker; `None` when the queue is empty.
    pub fn pop(&mut self) -> Option<(usize, u32, Reply)> {
        let (slot, seg, p, n) = self.items.pop_front()?;
        self.bytes -= n;
        Some((slot, seg, p.wait()))
    }
}
