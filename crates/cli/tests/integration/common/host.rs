//! Machine-wide state a test changes: /etc/fuse.conf and the kernel's
//! caches, each behind a lock so tests that share them take turns.

use std::fs;
use std::process::Command;

/// Tests that change /etc/fuse.conf take this first, through [`FuseConf`].
static FUSE_CONF_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// /etc/fuse.conf set to a test's text, put back as it was when dropped
/// (also when the test panics); one test at a time holds it.
pub struct FuseConf {
    before: Option<Vec<u8>>,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl FuseConf {
    pub fn set(text: &str) -> FuseConf {
        let lock = FUSE_CONF_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let g = FuseConf {
            before: fs::read("/etc/fuse.conf").ok(),
            _lock: lock,
        };
        fs::write("/etc/fuse.conf", text).unwrap();
        g
    }
}

impl Drop for FuseConf {
    fn drop(&mut self) {
        match &self.before {
            Some(b) => {
                let _ = fs::write("/etc/fuse.conf", b);
            }
            None => {
                let _ = fs::remove_file("/etc/fuse.conf");
            }
        }
    }
}

/// Tests that count on the kernel keeping what was put in its caches
/// (pages pushed by a server) hold this shared; whatever drops the caches
/// of the whole machine holds it alone, so one test's drop cannot empty
/// another's pages halfway through.
static PAGE_CACHE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Shared hold on the kernel's caches (see [`PAGE_CACHE`]).
pub fn keeping_caches() -> std::sync::RwLockReadGuard<'static, ()> {
    PAGE_CACHE.read().unwrap_or_else(|e| e.into_inner())
}

/// Sole hold on the kernel's caches, for a test whose child drops them
/// (the bench); it must not call [`drop_caches`] while holding it.
pub fn dropping_caches() -> std::sync::RwLockWriteGuard<'static, ()> {
    PAGE_CACHE.write().unwrap_or_else(|e| e.into_inner())
}

/// Who may switch FUSE over io_uring (`enable_uring`) on and off: a test
/// that needs it on, and a bench run as root, which switches it on for
/// its own run and back after. Taken before [`PAGE_CACHE`] by whoever
/// holds both.
static URING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sole hold on `enable_uring` (see [`URING`]).
pub fn owning_uring() -> std::sync::MutexGuard<'static, ()> {
    URING.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a bench run as root needs to itself: `enable_uring`, which it
/// switches, and the caches, which it drops; taken in that order.
pub fn benching() -> (
    std::sync::MutexGuard<'static, ()>,
    std::sync::RwLockWriteGuard<'static, ()>,
) {
    let uring = owning_uring();
    (uring, dropping_caches())
}

/// Drops the page cache (root only); returns false when it could not.
pub fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    let _alone = dropping_caches();
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}
