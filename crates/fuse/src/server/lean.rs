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
//! The LOOKUPs a lean listing brings in a large directory are answered
//! from the name index (`name_index.rs`).

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

/// The policy's state for one mount.
#[derive(Debug)]
pub(super) struct Lean {
    epoch: Instant,
    /// Directories listed lean, and when (since `epoch`).
    listed: Mutex<HashMap<Ino, Duration>>,
    /// Until when every entry is full (nanoseconds since `epoch`).
    full_until: AtomicU64,
}

impl Lean {
    pub(super) fn new() -> Lean {
        Lean {
            epoch: Instant::now(),
            listed: Mutex::new(HashMap::new()),
            full_until: AtomicU64::new(0),
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
    fn remembered_listings_stay_bounded() {
        let l = Lean::new();
        for d in 0..(3 * REMEMBERED as u64) {
            l.listed(d);
        }
        assert!(l.listed.lock().unwrap().len() <= REMEMBERED);
    }
}
