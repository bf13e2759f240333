//! Listings that link no inode: a READDIRPLUS entry with node id 0 gives
//! the kernel the name, its `d_ino` and `d_type`, and nothing to make an
//! inode and a dentry of (`fuse_direntplus_link` returns early, and no
//! FORGET follows). For a walker that only reads names (`find`, `ls`, a
//! shell glob) that is all the work there is; one that stats each entry
//! (`find -ls`, `ls -l`, `du`) would then pay a LOOKUP round trip per
//! entry, where a full entry had its attributes already.
//!
//! The protocol makes the server choose before it knows which reader it
//! has, so it chooses as the pusher does, by what the mount is doing:
//! - directories always get full entries (a walker descends into them,
//!   which would cost a LOOKUP each);
//! - other entries are lean, until a LOOKUP comes for a name in a
//!   directory whose listing just went out lean: someone stats what was
//!   listed, so for the next [`STAT_WINDOW`] every entry is full;
//! - a listing counted as lean is remembered for [`LISTED_WINDOW`].
//!
//! A walker that lists a large directory whole before it stats each entry
//! (`find -ls`, `ls -l` of one large directory) then sends a LOOKUP per
//! entry, and each would search the directory again (in a large EROFS
//! directory, a binary search over its blocks). Once [`INDEX_AFTER`]
//! lookups in one directory of an image have gone to the format, the
//! directory is listed once into an index of its names, and its later
//! lookups are answered from that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use foliofs_vfs::Ino;

/// How long after a LOOKUP of a lean-listed name every entry stays full.
pub(super) const STAT_WINDOW: Duration = Duration::from_secs(2);

/// How long a lean listing of a directory counts: a LOOKUP in it after
/// that is not a stat of what was listed.
pub(super) const LISTED_WINDOW: Duration = Duration::from_secs(1);

/// Directories remembered at most; older ones are dropped first.
const REMEMBERED: usize = 4096;

/// Bytes of names kept in indexes at most; past it every index is
/// dropped, and lookups go to the format again.
const NAME_BYTES: usize = 32 << 20;

/// Lookups in one directory of an image answered by the format before
/// the directory is indexed.
pub(super) const INDEX_AFTER: u32 = 64;

/// The policy's state for one mount.
#[derive(Debug)]
pub(super) struct Lean {
    epoch: Instant,
    /// Directories listed lean, and when (since `epoch`).
    listed: Mutex<HashMap<Ino, Duration>>,
    /// Until when every entry is full (nanoseconds since `epoch`).
    full_until: AtomicU64,
    /// Indexes of image directories looked up often (see the module's
    /// last paragraph).
    names: Mutex<Names>,
}

/// Lookups counted per directory, the indexes built, and the bytes of
/// their names.
#[derive(Debug, Default)]
struct Names {
    lookups: HashMap<Ino, u32>,
    indexes: HashMap<Ino, HashMap<Box<[u8]>, Ino>>,
    bytes: usize,
}

/// What an index says of a name.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Indexed {
    /// The directory has no index.
    Unknown,
    /// The name is not in the directory.
    Missing,
    /// The name is this inode.
    Found(Ino),
}

impl Lean {
    pub(super) fn new() -> Lean {
        Lean {
            epoch: Instant::now(),
            listed: Mutex::new(HashMap::new()),
            full_until: AtomicU64::new(0),
            names: Mutex::new(Names::default()),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Whether listings now carry attributes for every entry.
    pub(super) fn full(&self) -> bool {
        self.now().as_nanos() as u64 <= self.full_until.load(Ordering::Relaxed)
    }

    /// A listing of `dir` went out with lean entries.
    pub(super) fn listed(&self, dir: Ino) {
        let now = self.now();
        let mut l = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() >= REMEMBERED {
            l.retain(|_, t| now.saturating_sub(*t) < LISTED_WINDOW);
            if l.len() >= REMEMBERED {
                l.clear();
            }
        }
        l.insert(dir, now);
    }

    /// What the index of `dir`, if it has one, says of `name`.
    pub(super) fn indexed(&self, dir: Ino, name: &[u8]) -> Indexed {
        let n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        match n.indexes.get(&dir) {
            None => Indexed::Unknown,
            Some(index) => index
                .get(name)
                .map_or(Indexed::Missing, |&i| Indexed::Found(i)),
        }
    }

    /// A lookup in `dir` went to the format; true when `dir` should now
    /// be indexed (once: the count starts again).
    pub(super) fn looked_up_in_format(&self, dir: Ino) -> bool {
        let mut n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if n.lookups.len() >= REMEMBERED && !n.lookups.contains_key(&dir) {
            n.lookups.clear();
        }
        let count = n.lookups.entry(dir).or_default();
        *count += 1;
        if *count < INDEX_AFTER {
            return false;
        }
        n.lookups.remove(&dir);
        true
    }

    /// Keeps the index of `dir`: every name it holds, with its inode.
    pub(super) fn index(&self, dir: Ino, names: Vec<(Box<[u8]>, Ino)>) {
        let bytes: usize = names.iter().map(|(name, _)| name.len()).sum();
        let mut n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if bytes > NAME_BYTES {
            return;
        }
        if n.bytes + bytes > NAME_BYTES {
            n.indexes.clear();
            n.bytes = 0;
        }
        n.bytes += bytes;
        if let Some(old) = n.indexes.insert(dir, names.into_iter().collect()) {
            n.bytes -= old.keys().map(|k| k.len()).sum::<usize>();
        }
    }

    /// A LOOKUP in `parent`: if its listing just went out lean, someone is
    /// statting what it listed.
    pub(super) fn looked_up(&self, parent: Ino) {
        let now = self.now();
        let lean = {
            let l = self.listed.lock().unwrap_or_else(|e| e.into_inner());
            l.get(&parent)
                .is_some_and(|t| now.saturating_sub(*t) < LISTED_WINDOW)
        };
        if lean {
            self.full_until
                .store((now + STAT_WINDOW).as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_after_a_lean_listing_turns_attributes_on() {
        let l = Lean::new();
        assert!(!l.full());
        // A lookup in a directory never listed lean says nothing.
        l.looked_up(5);
        assert!(!l.full());
        l.listed(5);
        l.looked_up(7);
        assert!(!l.full());
        l.looked_up(5);
        assert!(l.full());
    }

    #[test]
    fn a_directory_looked_up_often_is_indexed_within_the_bound() {
        let l = Lean::new();
        assert_eq!(l.indexed(5, b"a"), Indexed::Unknown);
        for _ in 1..INDEX_AFTER {
            assert!(!l.looked_up_in_format(5));
        }
        assert!(!l.looked_up_in_format(6));
        assert!(l.looked_up_in_format(5));
        l.index(5, vec![(b"a"[..].into(), 10), (b"b"[..].into(), 11)]);
        assert_eq!(l.indexed(5, b"a"), Indexed::Found(10));
        assert_eq!(l.indexed(5, b"c"), Indexed::Missing);
        assert_eq!(l.indexed(6, b"a"), Indexed::Unknown);
        let name: Box<[u8]> = vec![b'x'; 255].into();
        for d in 0..(2 * NAME_BYTES / 255 / 1000) as u64 {
            l.index(100 + d, (0..1000).map(|i| (name.clone(), i)).collect());
        }
        assert!(l.names.lock().unwrap().bytes <= NAME_BYTES);
    }

    #[test]
    fn remembered_listings_stay_bounded() {
        let l = Lean::new();
        for d in 0..(3 * REMEMBERED as u64) {
            l.listed(d);
        }
        assert!(l.listed.lock().unwrap().len() <= REMEMBERED);
    }
}
