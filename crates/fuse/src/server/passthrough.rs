//! FUSE passthrough: opens of a file whose bytes live in a backing file
//! ([`FileSystem::backing_file`]) are answered with that file registered
//! with the kernel, which then reads, writes, splices and maps it itself;
//! no READ or WRITE reaches the server.
//!
//! The kernel's rules (Linux 6.9 to 6.18, `fs/fuse/passthrough.c`,
//! `backing.c`, `iomode.c`):
//! - INIT must carry `FUSE_PASSTHROUGH` with a stack depth of 1 or 2, and
//!   no `FUSE_WRITEBACK_CACHE`;
//! - registering a file (`FUSE_DEV_IOC_BACKING_OPEN`) needs
//!   `CAP_SYS_ADMIN` in the initial user namespace;
//! - an open reply may carry only `PASSTHROUGH`, `DIRECT_IO`,
//!   `PARALLEL_DIRECT_WRITES` and `NOFLUSH` (`KEEP_CACHE` fails the open);
//! - every open of one inode must name the same backing file while any is
//!   open, and a passthrough open excludes cached opens of the inode.
//!
//! So this table holds one registration per inode while it has opens, and
//! gives it back with the inode's last release.
//!
//! [`FileSystem::backing_file`]: foliofs_vfs::FileSystem::backing_file

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use foliofs_vfs::Ino;

use crate::kernel::Dev;

/// A backing file registered with the kernel; dropping it gives the
/// registration back (the kernel's open files keep the file until they
/// close).
#[derive(Debug)]
pub struct BackingId {
    dev: Arc<Dev>,
    id: u32,
}

impl BackingId {
    /// Registers `file` on the connection `dev`.
    pub(crate) fn open(dev: &Arc<Dev>, file: &std::fs::File) -> std::io::Result<BackingId> {
        let id = dev.backing_open(std::os::fd::AsFd::as_fd(file))?;
        Ok(BackingId {
            dev: dev.clone(),
            id,
        })
    }
}

impl Drop for BackingId {
    fn drop(&mut self) {
        if let Err(e) = self.dev.backing_close(self.id) {
            log::warn!("cannot give back backing file {}: {e}", self.id);
        }
    }
}

/// The passthrough state of one mount.
#[derive(Debug, Default)]
pub struct Passthrough {
    /// INIT gave passthrough: opens of backed files are passed through.
    granted: AtomicBool,
    /// Registering a file failed once (no privilege after all): no open is
    /// passed through after that, so none mixes with a cached one.
    refused: AtomicBool,
    /// Inode → its registration and the opens using it.
    open: Mutex<HashMap<Ino, (BackingId, u64)>>,
}

impl Passthrough {
    /// Whether the kernel took passthrough at INIT (and no registration
    /// has failed since).
    pub fn active(&self) -> bool {
        self.granted.load(Ordering::Relaxed) && !self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn grant(&self) {
        self.granted.store(true, Ordering::Relaxed);
    }

    /// Takes over the registrations an earlier server of this connection
    /// made (`(inode, registration, opens)`): the kernel holds each inode's
    /// opens to the one it named first.
    pub(crate) fn seed(&self, dev: &Arc<Dev>, held: Vec<(Ino, u32, u64)>) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for (ino, id, n) in held {
            open.insert(
                ino,
                (
                    BackingId {
                        dev: dev.clone(),
                        id,
                    },
                    n,
                ),
            );
        }
    }

    /// Counts one more open of `ino` against its registration, making it
    /// with `register` for the inode's first open; `None` where the open
    /// must be an ordinary one (`!allowed` keeps a file that has none
    /// yet out).
    /// `counted`: false for a resent open an earlier server had answered,
    /// whose open the registration's count already holds.
    pub(crate) fn open<R>(
        &self,
        ino: Ino,
        allowed: bool,
        counted: bool,
        register: R,
    ) -> Option<PassedOpen<'_>>
    where
        R: FnOnce() -> std::io::Result<BackingId>,
    {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh = false;
        if let Some((_, n)) = open.get_mut(&ino) {
            // Even after a refusal elsewhere: a cached open beside these
            // would fail in the kernel.
            if counted {
                *n += 1;
            }
        } else if !allowed || !self.active() {
            return None;
        } else {
            match register() {
                Ok(id) => {
                    open.insert(ino, (id, 1));
                    fresh = true;
                }
                Err(e) => {
                    log::warn!(
                        "FUSE passthrough refused ({e}): files are served by the server from now on"
                    );
                    self.refused.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        Some(PassedOpen { ino, open, fresh })
    }

    /// One open of `ino` released; the last's registration is returned,
    /// for the caller to drop (which gives it back: the kernel's files
    /// keep the backing file until they close) once it has said so.
    pub(crate) fn release(&self, ino: Ino) -> Option<BackingId> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (_, n) = open.get_mut(&ino)?;
        *n = n.saturating_sub(1);
        if *n == 0 {
            return open.remove(&ino).map(|(id, _)| id);
        }
        None
    }

    /// Inodes with a registration now.
    pub fn registered(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// An open counted against a registration, held while the reply is sent.
pub(crate) struct PassedOpen<'a> {
    ino: Ino,
    open: std::sync::MutexGuard<'a, HashMap<Ino, (BackingId, u64)>>,
    /// Registered for this open (the inode's first).
    fresh: bool,
}

impl PassedOpen<'_> {
    pub(crate) fn id(&self) -> u32 {
        self.open[&self.ino].0.id
    }

    /// Whether this open made the registration.
    pub(crate) fn fresh(&self) -> bool {
        self.fresh
    }
}
