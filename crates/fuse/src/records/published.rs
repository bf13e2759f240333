//! A live mount's request counts, published for `foliofs mounts --stats`
//! and `foliofs bench` in `stats/<mount id>` of the mounting user's record
//! directory (`/run/foliofs` for root; see [`super`]). A mount
//! of an image in object storage adds its server's remote counters
//! (`foliofs_block::remote::stats`) as `remote.NAME=N` lines: one mount is
//! one process, so the process's counters are the mount's.
//!
//! The server rewrites the file (atomically) at most every
//! [`INTERVAL`] and only when a count changed, so an idle mount costs one
//! wake-up per interval and no I/O. A file rather than a signal or socket:
//! anyone allowed to read the mount records can read it with `cat`, the
//! server needs no request handling of its own, and a reader that wants
//! exact figures for a workload waits until two reads an interval apart
//! agree (requests the kernel sends late, FORGET and RELEASE, land by then).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super as mount_state;
use super::RequestCounts;
use crate::MountInfo;

/// How often the server looks for changed counts.
pub const INTERVAL: Duration = Duration::from_millis(100);

fn stats_dir(records: &Path) -> PathBuf {
    records.join("stats")
}

/// This user's stats directory, if its record directory exists.
fn own_dir() -> Option<PathBuf> {
    mount_state::own_dir().map(|d| stats_dir(&d))
}

/// Counts by opcode name, as the file lists them.
pub type Counts = BTreeMap<String, u64>;

/// Figures a mount publishes beside its request counts, under a group
/// name: `read` gives them, named, each time the file is brought up to
/// date.
pub struct Gauge {
    /// The group (`remote`, `ramfs`): a word, no dots.
    pub name: &'static str,
    /// The figures now.
    pub read: Box<dyn Fn() -> Vec<(&'static str, u64)> + Send>,
}

/// The requests, then each gauge's figures.
type Snapshot = (
    Vec<(&'static str, u64)>,
    Vec<(&'static str, Vec<(&'static str, u64)>)>,
);

fn write(mount_id: u64, (requests, groups): &Snapshot) -> io::Result<()> {
    let dir = stats_dir(&mount_state::state_dir()?);
    fs::create_dir_all(&dir)?;
    let mut text = String::new();
    for (name, n) in requests {
        text.push_str(&format!("{name}={n}\n"));
    }
    for (group, figures) in groups {
        for (name, n) in figures {
            text.push_str(&format!("{group}.{name}={n}\n"));
        }
    }
    let tmp = dir.join(format!(".{mount_id}.tmp"));
    fs::write(&tmp, text)?;
    fs::rename(tmp, dir.join(mount_id.to_string()))
}

/// The thread keeping a mount's file current; [`Publisher::finish`] stops
/// it and removes the file.
pub struct Publisher {
    mount_id: u64,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the thread that keeps mount `mount_id`'s file current until
/// [`Publisher::finish`], with the figures of `gauges` beside the counts.
pub fn publish(mount_id: u64, counts: Arc<RequestCounts>, gauges: Vec<Gauge>) -> Publisher {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("foliofs-stats".into())
        .spawn(move || {
            let mut last = None;
            while !stopped.load(Ordering::Relaxed) {
                let snap = (
                    counts.snapshot(),
                    gauges.iter().map(|g| (g.name, (g.read)())).collect(),
                );
                if last.as_ref() != Some(&snap) {
                    if let Err(e) = write(mount_id, &snap) {
                        log::warn!("cannot write request counts: {e}");
                        return;
                    }
                    last = Some(snap);
                }
                std::thread::park_timeout(INTERVAL);
            }
        });
    let thread = spawned
        .map_err(|e| log::warn!("cannot start the request counter thread: {e}"))
        .ok();
    Publisher {
        mount_id,
        stop,
        thread,
    }
}

impl Publisher {
    /// Stops the thread, then removes the file (the thread could otherwise
    /// write it again after the removal).
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        if let Some(dir) = own_dir() {
            let _ = fs::remove_file(dir.join(self.mount_id.to_string()));
        }
    }
}

/// Each group's figures, by group name.
pub type Groups = BTreeMap<String, Counts>;

/// Mount `m`'s request counts, if its server publishes them where this
/// user may read them, and the figures of its gauges by group.
pub fn read_all(m: &MountInfo) -> Option<(Counts, Groups)> {
    mount_state::dirs_for(m)
        .iter()
        .find_map(|d| read_file(&stats_dir(d), m.mount_id))
}

/// The counts of mount `mount_id`, one of this user's own.
fn read_own(mount_id: u64) -> Option<Counts> {
    read_from(&own_dir()?, mount_id)
}

fn read_from(dir: &Path, mount_id: u64) -> Option<Counts> {
    read_file(dir, mount_id).map(|(requests, _)| requests)
}

fn read_file(dir: &Path, mount_id: u64) -> Option<(Counts, Groups)> {
    let text = fs::read_to_string(dir.join(mount_id.to_string())).ok()?;
    Some(parse(&text))
}

/// The request counts of a file's text, and its groups' figures.
fn parse(text: &str) -> (Counts, Groups) {
    let mut requests = Counts::new();
    let mut groups = Groups::new();
    for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
        let Ok(v) = v.parse() else { continue };
        match k.split_once('.') {
            Some((group, k)) => groups
                .entry(group.to_owned())
                .or_default()
                .insert(k.to_owned(), v),
            None => requests.insert(k.to_owned(), v),
        };
    }
    (requests, groups)
}

/// The counts of mount `mount_id` (one of this user's own) once they have settled: two reads an interval
/// apart that agree (bounded at two seconds of waiting).
pub fn read_settled(mount_id: u64) -> Option<Counts> {
    let mut last = read_own(mount_id)?;
    for _ in 0..20 {
        std::thread::sleep(INTERVAL * 2);
        let now = read_own(mount_id)?;
        if now == last {
            return Some(now);
        }
        last = now;
    }
    Some(last)
}

/// The figures of group `group` of mount `mount_id` (one of this user's
/// own) once they have settled, as [`read_settled`] waits for them.
pub fn read_group_settled(mount_id: u64, group: &str) -> Option<Counts> {
    let read = || read_file(&own_dir()?, mount_id).and_then(|(_, mut g)| g.remove(group));
    let mut last = read()?;
    for _ in 0..20 {
        std::thread::sleep(INTERVAL * 2);
        let now = read()?;
        if now == last {
            return Some(now);
        }
        last = now;
    }
    Some(last)
}

/// `after - before`, per opcode, leaving out the ones that did not move.
pub fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, &v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|&(_, d)| d > 0)
        .collect()
}

/// Removes the files of mounts that are gone (`live` = ids of live mounts).
pub fn prune(live: &[u64]) {
    let Some(Ok(entries)) = own_dir().map(fs::read_dir) else {
        return;
    };
    for e in entries.flatten() {
        let id = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok());
        if id.is_some_and(|id| !live.contains(&id)) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// `name=N name=N ...` of the non-zero counts.
pub fn line(c: &Counts) -> String {
    c.iter()
        .filter(|&(_, &n)| n > 0)
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(v: &[(&str, u64)]) -> Counts {
        v.iter().map(|&(k, n)| (k.to_owned(), n)).collect()
    }

    #[test]
    fn deltas_keep_what_moved() {
        let a = counts(&[("lookup", 3), ("create", 1), ("read", 0)]);
        let b = counts(&[("lookup", 5), ("create", 1), ("read", 2)]);
        assert_eq!(delta(&a, &b), counts(&[("lookup", 2), ("read", 2)]));
        assert_eq!(line(&delta(&a, &b)), "lookup=2 read=2");
        assert_eq!(line(&counts(&[("x", 0)])), "");
    }

    #[test]
    fn groups_are_kept_apart() {
        let (requests, groups) = parse(
            "lookup=2\nread=5\nremote.bytes_read=10\nremote.cache_hits=0\nramfs.backing_bytes=7\n",
        );
        assert_eq!(requests, counts(&[("lookup", 2), ("read", 5)]));
        assert_eq!(
            groups.get("remote"),
            Some(&counts(&[("bytes_read", 10), ("cache_hits", 0)]))
        );
        assert_eq!(groups.get("ramfs"), Some(&counts(&[("backing_bytes", 7)])));
        assert!(parse("lookup=2\n").1.is_empty());
    }

    #[test]
    fn lines_list_what_is_not_zero() {
        let c = counts(&[("lookup", 2), ("read", 0), ("create", 1)]);
        assert_eq!(line(&c), "create=1 lookup=2");
    }
}
