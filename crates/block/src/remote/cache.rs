//! The disk cache of remote chunks.
//!
//! One file per object, not one per chunk: a file written in order lies
//! in one run on the disk, as a local image does, and a warm sequential
//! read streams it with the kernel's read-ahead. The files of many chunks
//! land wherever the allocator puts each new file (ext4 spreads them over
//! its groups by inode number), and a warm read of them seeks at every
//! chunk and opens a file at every chunk's first use.
//!
//! By job: the on-disk format of a version's `map` and `data` (`map.rs`);
//! opening a version, with what a crash left behind, and closing it
//! (`open.rs`); one object's reads and stores (`object.rs`); making stored
//! chunks durable before the map names them (`commit.rs`); the byte limit
//! across processes (`evict.rs`); the system calls beneath (`sys.rs`).

mod commit;
mod evict;
mod map;
mod object;
mod open;
mod sys;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use commit::Pending;
pub use object::Found;
use object::Object;

/// Where the cache lives when `cache=` is not given:
/// `$XDG_CACHE_HOME/foliofs`, `$HOME/.cache/foliofs`, or
/// `/var/cache/foliofs` for root.
pub(crate) fn default_dir(env: &dyn Fn(&str) -> Option<String>, root: bool) -> Option<PathBuf> {
    if root {
        return Some(PathBuf::from("/var/cache/foliofs"));
    }
    let abs = |v: String| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    env("XDG_CACHE_HOME")
        .and_then(abs)
        .map(|p| p.join("foliofs"))
        .or_else(|| env("HOME").and_then(abs).map(|h| h.join(".cache/foliofs")))
}

/// One object's chunks in the cache directory.
pub(crate) struct DiskCache {
    root: PathBuf,
    limit: u64,
    obj: Arc<Object>,
    /// Bytes in the whole directory, as last counted plus what this
    /// process added since.
    used: AtomicU64,
    /// Bytes this process stored since it last counted the directory:
    /// another process fills it too, so it is counted again every
    /// eighth of the limit.
    since_scan: AtomicU64,
    evicting: Mutex<()>,
    /// Set when the last eviction left the directory over its limit
    /// (what it would have freed was in use by another process), and when
    /// that eviction ran: the next one comes when this process is idle.
    over: Mutex<Option<Instant>>,
    pending: Mutex<Pending>,
    /// Signals a newly stored chunk, and a committed batch.
    pending_changed: Condvar,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("dir", &self.obj.dir)
            .field("limit", &self.limit)
            .finish()
    }
}

impl DiskCache {
    /// The byte limit of the directory.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

#[cfg(test)]
mod tests;
