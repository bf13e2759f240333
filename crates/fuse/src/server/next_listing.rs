//! Plain listings of an image directory built one reply ahead.
//!
//! A reader of a large directory (`find`, `ls`, `du`) sends READDIR after
//! READDIR, each for where the last reply stopped, and waits for each.
//! Between two of them the kernel and the reader work through the entries
//! of the last reply, and the server has nothing to do. So a READDIR whose
//! reply did not reach the directory's end hands the next one, for the
//! offset the kernel will ask from with the same size, to a thread of the
//! mount's own, which builds it and keeps it here; the READDIR that follows
//! is answered with it at once. Where it arrives while the reply is still
//! being built, it waits for that build rather than repeating it.
//!
//! A thread, not the worker after its reply: over io_uring a reply is only
//! committed when the handler returns, so work after it would delay it.
//!
//! Images only: their directories never change, so a reply built ahead is
//! the one built on demand. Plain READDIR only: a READDIRPLUS entry's
//! form depends on what the kernel asked since (see `lean.rs`).

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use foliofs_vfs::{self as vfs, FileSystem, Ino};

use crate::kernel::abi::dirent_type;
use crate::kernel::DirBuf;

/// Replies kept at most (a few readers of large directories at once).
const KEPT: usize = 4;

/// Which READDIR a reply answers: the directory's node, the offset it
/// resumes at, and the size the kernel asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub node: u64,
    pub offset: u64,
    pub size: u32,
}

/// A reply built ahead, and whether the listing goes on past it.
pub(super) struct Built {
    pub bytes: Vec<u8>,
    pub resumes_at: Option<u64>,
}

enum State {
    Building,
    Ready(Built),
}

struct Slot {
    key: Key,
    state: State,
    /// When it was claimed: the oldest ready reply goes first.
    since: Instant,
}

/// Adds `e` to a plain listing, its cookie shifted up by `shift` (the
/// server's own dots take cookies 1 and 2); false when it did not fit.
pub(super) fn push(b: &mut DirBuf, e: vfs::DirEntry<'_>, shift: u64) -> bool {
    b.push(
        e.ino,
        e.next + shift,
        dirent_type(e.kind.mode_bits()),
        std::os::unix::ffi::OsStrExt::as_bytes(e.name),
    )
}

/// Fills `b` with the plain listing of `dir` from `offset`, where no dot is
/// left for the server to list: the format lists its own (`lists_dots`),
/// or `offset` is past the two the server lists.
pub(super) fn list_from(
    fs: &dyn FileSystem,
    lists_dots: bool,
    dir: Ino,
    offset: u64,
    b: &mut DirBuf,
) -> vfs::Result<()> {
    if lists_dots {
        fs.readdir_with_dots(dir, offset, &mut |e| !push(b, e, 0))
    } else {
        debug_assert!(
            offset >= 2,
            "the server's own dots are listed by the caller"
        );
        fs.readdir(dir, offset.saturating_sub(2), &mut |e| !push(b, e, 2))
    }
}

/// A reply to build: the directory, and the READDIR it will answer.
struct Job {
    dir: Ino,
    key: Key,
}

/// The replies built ahead of one mount, and the thread that builds them.
pub(super) struct NextListings {
    built: Arc<Replies>,
    jobs: Option<SyncSender<Job>>,
}

impl NextListings {
    /// Starts the builder for `fs`. Where no thread can be started, no
    /// reply is built ahead.
    pub fn start(fs: Arc<dyn FileSystem>, lists_dots: bool) -> NextListings {
        let built = Arc::new(Replies::default());
        let (jobs, queue) = sync_channel::<Job>(KEPT);
        let b = built.clone();
        let started = std::thread::Builder::new()
            .name("foliofs-nextls".into())
            // Ends when the server, and with it the sender, is dropped.
            .spawn(move || {
                let mut buf = DirBuf::default();
                for job in queue {
                    buf.start(job.key.size);
                    let reply = list_from(&*fs, lists_dots, job.dir, job.key.offset, &mut buf)
                        .ok()
                        .map(|()| Built {
                            resumes_at: buf.resumes_at(),
                            bytes: buf.take_bytes(),
                        });
                    b.finish(job.key, reply);
                }
            });
        let jobs = match started {
            Ok(_) => Some(jobs),
            Err(e) => {
                log::warn!("no thread to build listings ahead: {e}");
                None
            }
        };
        NextListings { built, jobs }
    }

    /// The reply to the READDIR that will follow one for `key`'s directory
    /// which ended at `key.offset`, to be built now.
    pub fn offer(&self, dir: Ino, key: Key) {
        let Some(jobs) = &self.jobs else { return };
        if !self.built.claim(key) {
            return;
        }
        if jobs.try_send(Job { dir, key }).is_err() {
            self.built.finish(key, None);
        }
    }

    /// The reply for `key`, if it was built ahead (see [`Replies::take`]).
    pub fn take(&self, key: Key, wait: Duration) -> Option<Built> {
        self.built.take(key, wait)
    }
}

/// The replies themselves.
#[derive(Default)]
struct Replies {
    slots: Mutex<Vec<Slot>>,
    ready: Condvar,
}

impl Replies {
    fn lock(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the reply for `key` if one was built ahead, waiting up to
    /// `wait` for one being built. `None`: build it now.
    pub fn take(&self, key: Key, wait: Duration) -> Option<Built> {
        let deadline = Instant::now() + wait;
        let mut slots = self.lock();
        loop {
            let at = slots.iter().position(|s| s.key == key)?;
            if let State::Ready(_) = slots[at].state {
                return match slots.swap_remove(at).state {
                    State::Ready(b) => Some(b),
                    State::Building => None,
                };
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            slots = self
                .ready
                .wait_timeout(slots, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Claims the building of `key`'s reply: false where it is built or
    /// being built already, or where every slot holds a reply being built.
    pub fn claim(&self, key: Key) -> bool {
        let mut slots = self.lock();
        if slots.iter().any(|s| s.key == key) {
            return false;
        }
        if slots.len() >= KEPT {
            // A reply nobody asked for (the reader stopped, or read with
            // another size) makes room.
            let oldest = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s.state, State::Ready(_)))
                .min_by_key(|(_, s)| s.since)
                .map(|(i, _)| i);
            match oldest {
                Some(i) => {
                    slots.swap_remove(i);
                }
                None => return false,
            }
        }
        slots.push(Slot {
            key,
            state: State::Building,
            since: Instant::now(),
        });
        true
    }

    /// The reply claimed for `key`, built; `None`: it failed, and the
    /// READDIR is left to build it (and report the error) itself.
    pub fn finish(&self, key: Key, built: Option<Built>) {
        let mut slots = self.lock();
        if let Some(at) = slots.iter().position(|s| s.key == key) {
            match built {
                Some(b) => slots[at].state = State::Ready(b),
                None => {
                    slots.swap_remove(at);
                }
            }
        }
        drop(slots);
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(offset: u64) -> Key {
        Key {
            node: 5,
            offset,
            size: 4096,
        }
    }

    fn built(tag: u8) -> Option<Built> {
        Some(Built {
            bytes: vec![tag],
            resumes_at: Some(u64::from(tag)),
        })
    }

    #[test]
    fn a_reply_is_taken_once_and_only_for_its_own_request() {
        let l = Replies::default();
        assert!(l.take(key(1), Duration::ZERO).is_none(), "nothing built");
        assert!(l.claim(key(1)));
        assert!(!l.claim(key(1)), "claimed twice");
        l.finish(key(1), built(7));
        let other = Key {
            size: 8192,
            ..key(1)
        };
        assert!(l.take(other, Duration::ZERO).is_none(), "another size");
        let b = l.take(key(1), Duration::ZERO).unwrap();
        assert_eq!((b.bytes, b.resumes_at), (vec![7], Some(7)));
        assert!(l.take(key(1), Duration::ZERO).is_none(), "taken once");
        // A failed build leaves the request to build itself.
        assert!(l.claim(key(2)));
        l.finish(key(2), None);
        assert!(l.take(key(2), Duration::ZERO).is_none());
    }

    #[test]
    fn a_request_waits_for_the_reply_being_built() {
        let l = Arc::new(Replies::default());
        assert!(l.claim(key(3)));
        let builder = {
            let l = l.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                l.finish(key(3), built(3));
            })
        };
        let b = l.take(key(3), Duration::from_secs(10)).expect("the build");
        assert_eq!(b.bytes, vec![3]);
        builder.join().unwrap();
        // A build that never ends is waited for only so long.
        assert!(l.claim(key(4)));
        let t = Instant::now();
        assert!(l.take(key(4), Duration::from_millis(30)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn the_oldest_ready_reply_makes_room_and_builds_in_flight_are_kept() {
        let l = Replies::default();
        for i in 0..KEPT as u64 {
            assert!(l.claim(key(i)));
        }
        assert!(!l.claim(key(99)), "every slot is being built");
        l.finish(key(0), built(0));
        l.finish(key(1), built(1));
        assert!(l.claim(key(99)));
        assert!(l.take(key(0), Duration::ZERO).is_none(), "the oldest went");
        assert!(l.take(key(1), Duration::ZERO).is_some());
    }
}
