//! Hints for the listings of the subdirectories a listing sent, given off
//! the request path so a walker finds their blocks on the way. A READDIRPLUS hints
//! what its own lookups and the next listings need
//! (`FileSystem::prefetch_dir`), but a hint for a subdirectory's own
//! subdirectories needs that subdirectory's blocks first, so the request
//! that lists it would wait for them. Here one thread per mount gives that
//! hint for each subdirectory a listing sent, as soon as it is sent: by the
//! time a depth-first walker such as `find` lists it, what that listing
//! reads is already on its way.
//!
//! Images only: their directories never change, and a hint that comes too
//! late or is dropped costs nothing but the work done for it.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use foliofs_vfs::{FileSystem, Ino};

/// Subdirectories waiting for their hint at most; past that, new ones are
/// dropped (the walker is behind, and their own listings hint them).
const QUEUED: usize = 1024;

pub(super) struct SubdirHints {
    queue: SyncSender<(Ino, bool)>,
}

impl SubdirHints {
    /// Starts the thread; `None` if it could not be started (the hints
    /// are then left to the listings themselves).
    pub(super) fn start(fs: Arc<dyn FileSystem>) -> Option<SubdirHints> {
        let (queue, hints) = sync_channel::<(Ino, bool)>(QUEUED);
        let started = std::thread::Builder::new()
            .name("foliofs-hints".into())
            // Ends when the server, and with it the sender, is dropped.
            .spawn(move || {
                for (dir, every) in hints {
                    fs.prefetch_dir(dir, 0, every);
                }
            });
        match started {
            Ok(_) => Some(SubdirHints { queue }),
            Err(e) => {
                log::warn!("no thread to hint subdirectories' listings: {e}");
                None
            }
        }
    }

    /// Subdirectory `dir` was just listed to the kernel; `every` as the
    /// listing's own hint had it.
    pub(super) fn offer(&self, dir: Ino, every: bool) {
        // A full queue drops the hint: the walker is behind, and the
        // listing of `dir` hints it itself.
        if let Err(TrySendError::Disconnected(_)) = self.queue.try_send((dir, every)) {
            log::debug!("the thread hinting subdirectories' listings is gone");
        }
    }
}

impl std::fmt::Debug for SubdirHints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubdirHints")
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::mpsc::{channel, Sender};
    use std::sync::Mutex;
    use std::time::Duration;

    use foliofs_vfs::{Attr, DirEntry, Error, FsInfo, Result, Scratch, StatFs};

    use super::*;

    /// Answers nothing but reports every hint it is given.
    struct Hinted(Mutex<Sender<(Ino, u64, bool)>>);

    impl FileSystem for Hinted {
        fn root(&self) -> Ino {
            1
        }
        fn info(&self) -> FsInfo {
            FsInfo {
                fs_type: "test",
                block_size: 4096,
                name_max: 255,
                read_only: true,
            }
        }
        fn statfs(&self) -> Result<StatFs> {
            Err(Error::OperationNotSupported)
        }
        fn getattr(&self, _: Ino) -> Result<Attr> {
            Err(Error::OperationNotSupported)
        }
        fn lookup(&self, _: Ino, _: &OsStr) -> Result<Attr> {
            Err(Error::OperationNotSupported)
        }
        fn readdir(&self, _: Ino, _: u64, _: &mut dyn FnMut(DirEntry<'_>) -> bool) -> Result<()> {
            Err(Error::OperationNotSupported)
        }
        fn read<'a>(&self, _: Ino, _: u64, _: u32, _: &'a mut Scratch) -> Result<&'a [u8]> {
            Err(Error::OperationNotSupported)
        }
        fn readlink(&self, _: Ino) -> Result<Vec<u8>> {
            Err(Error::OperationNotSupported)
        }
        fn prefetch_dir(&self, ino: Ino, offset: u64, every: bool) {
            let _ = self.0.lock().unwrap().send((ino, offset, every));
        }
    }

    #[test]
    fn each_subdirectory_offered_is_hinted_from_its_start_off_the_callers_thread() {
        let (tx, rx) = channel();
        let hints = SubdirHints::start(Arc::new(Hinted(Mutex::new(tx)))).unwrap();
        hints.offer(7, false);
        hints.offer(9, true);
        let wait = Duration::from_secs(10);
        assert_eq!(rx.recv_timeout(wait).unwrap(), (7, 0, false));
        assert_eq!(rx.recv_timeout(wait).unwrap(), (9, 0, true));
        // The thread ends with the server: its hints stop, and nothing hangs.
        drop(hints);
        assert!(rx.recv_timeout(wait).is_err());
    }
}
