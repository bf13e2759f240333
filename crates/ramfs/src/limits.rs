//! The memory limits this process runs under, and what it already uses of
//! each: its memory cgroup and every ancestor (v2 `memory.max` and
//! `memory.high`, v1 `memory.limit_in_bytes`), found through
//! `/proc/self/cgroup` and `/proc/self/mountinfo`, and `RLIMIT_AS`.
//!
//! Read again on every call: a limit can be changed, or the process moved
//! to another cgroup, while the file system is mounted.

use std::path::{Path, PathBuf};

/// Which kind of memory a limit holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Memory charged to a cgroup: anonymous memory and page cache
    /// (including the passthrough pool's tmpfs pages the server writes).
    Cgroup,
    /// Address space: mappings and heap, not page cache.
    AddressSpace,
}

/// One limit, with the bytes of it already in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limit {
    /// How to name it to a person: the file or resource it comes from.
    pub name: String,
    pub kind: Kind,
    pub limit: u64,
    /// What counts against it now and cannot be given back without our
    /// own memory going: for a cgroup, its usage less the page cache of
    /// files (which the kernel reclaims before it kills; tmpfs and shmem
    /// pages are swap-backed and stay), for the address space the mapped
    /// size.
    pub used: u64,
}

impl Limit {
    /// What is left of it.
    pub fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// v1 writes "no limit" as the largest page-aligned `i64`; anything of
/// that order is none.
const NO_LIMIT: u64 = 1 << 62;

/// Every limit in force now, for this process.
pub(crate) fn current() -> Vec<Limit> {
    let mut out = cgroup_limits();
    if let Some(l) = address_space() {
        out.push(l);
    }
    out
}

fn read_u64(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// The value of `key` in a `memory.stat`-style file ("key value" lines).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The memory cgroup directories of this process, innermost first, each
/// with whether it is v2: from the cgroup's own directory up to the root of
/// the mount it was found on.
fn cgroup_dirs(proc_cgroup: &str, mountinfo: &str) -> Vec<(PathBuf, bool)> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2_path = Some(path.to_owned());
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_owned());
        }
    }
    // The v1 memory controller, where mounted, is the one in force: a
    // controller is bound to one hierarchy only.
    let (path, v2) = match (v1_path, v2_path) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => return Vec::new(),
    };
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let rfields: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || rfields.len() < 3 {
            continue;
        }
        let (root, mount_point) = (fields[3], fields[4]);
        let matches = if v2 {
            rfields[0] == "cgroup2"
        } else {
            rfields[0] == "cgroup" && rfields[2].split(',').any(|o| o == "memory")
        };
        if !matches {
            continue;
        }
        // A cgroup namespace or a bind mount shows a subtree: the path is
        // then relative to that mount's root.
        let Some(rel) = path.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        let base = PathBuf::from(unescape(mount_point));
        let mut dir = base.join(rel.trim_start_matches('/'));
        let mut dirs = Vec::new();
        loop {
            dirs.push((dir.clone(), v2));
            if dir == base || !dir.pop() {
                break;
            }
        }
        return dirs;
    }
    Vec::new()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cgroup_limits() -> Vec<Limit> {
    let (Ok(cg), Ok(mi)) = (
        std::fs::read_to_string("/proc/self/cgroup"),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (dir, v2) in cgroup_dirs(&cg, &mi) {
        out.extend(if v2 { v2_limit(&dir) } else { v1_limit(&dir) });
    }
    out
}

/// Usage less the file page cache (`active_file` and `inactive_file`:
/// shmem sits on the anonymous lists, so it stays counted).
fn unreclaimable(usage: u64, stat: &str, prefix: &str) -> u64 {
    let file = stat_field(stat, &format!("{prefix}active_file")).unwrap_or(0)
        + stat_field(stat, &format!("{prefix}inactive_file")).unwrap_or(0);
    usage.saturating_sub(file)
}

fn v2_limit(dir: &Path) -> Option<Limit> {
    let max = read_u64(&dir.join("memory.max"));
    let high = read_u64(&dir.join("memory.high"));
    // The tighter of the two: past `memory.high` the kernel throttles the
    // server until reclaim catches up, which without swap it cannot.
    let (file, limit) = match (max, high) {
        (Some(m), Some(h)) if h < m => ("memory.high", h),
        (Some(m), _) => ("memory.max", m),
        (None, Some(h)) => ("memory.high", h),
        (None, None) => return None,
    };
    if limit >= NO_LIMIT {
        return None;
    }
    let usage = read_u64(&dir.join("memory.current"))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    Some(Limit {
        name: dir.join(file).display().to_string(),
        kind: Kind::Cgroup,
        limit,
        used: unreclaimable(usage, &stat, ""),
    })
}

fn v1_limit(dir: &Path) -> Option<Limit> {
    let limit = read_u64(&dir.join("memory.limit_in_bytes"))?;
    if limit >= NO_LIMIT {
        return None;
    }
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    Some(Limit {
        name: dir.join("memory.limit_in_bytes").display().to_string(),
        kind: Kind::Cgroup,
        limit,
        used: unreclaimable(usage, &stat, "total_"),
    })
}

fn address_space() -> Option<Limit> {
    let lim = rustix::process::getrlimit(rustix::process::Resource::As);
    let limit = lim.current?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split(' ').next()?.parse().ok()?;
    // A supervised mount's blocks are slots of mappings made ahead: those
    // no block uses are room, not use.
    let mapped = pages * rustix::param::page_size() as u64;
    Some(Limit {
        name: "RLIMIT_AS (ulimit -v)".to_owned(),
        kind: Kind::AddressSpace,
        limit,
        used: mapped.saturating_sub(crate::arena::reusable_address_space()),
    })
}

/// Whether this process runs under an address-space limit now.
pub(crate) fn address_space_limited() -> bool {
    rustix::process::getrlimit(rustix::process::Resource::As)
        .current
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_memory_hierarchy_is_walked_to_its_root() {
        let cg = "4:memory:/a/b\n1:cpu:/\n0::/\n";
        let dirs = cgroup_dirs(cg, MOUNTINFO);
        let want: Vec<(PathBuf, bool)> = [
            "/sys/fs/cgroup/memory/a/b",
            "/sys/fs/cgroup/memory/a",
            "/sys/fs/cgroup/memory",
        ]
        .iter()
        .map(|p| (PathBuf::from(p), false))
        .collect();
        assert_eq!(dirs, want);
    }

    #[test]
    fn v2_alone_and_a_namespaced_root() {
        let mi = "30 1 0:26 /x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let dirs = cgroup_dirs("0::/x/svc\n", mi);
        assert_eq!(
            dirs,
            vec![
                (PathBuf::from("/sys/fs/cgroup/svc"), true),
                (PathBuf::from("/sys/fs/cgroup"), true)
            ]
        );
        assert!(cgroup_dirs("0::/y\n", mi).is_empty(), "outside the mount");
    }

    #[test]
    fn escapes_and_stat_fields() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        let stat = "cache 5\ntotal_active_file 10\ntotal_inactive_file 20\n";
        assert_eq!(stat_field(stat, "cache"), Some(5));
        assert_eq!(unreclaimable(100, stat, "total_"), 70);
        assert_eq!(unreclaimable(10, stat, "total_"), 0);
    }

    #[test]
    fn the_address_space_limit_is_read_as_set() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let before = getrlimit(Resource::As);
        // Far above what any test process maps, so nothing else notices.
        let limit = 1u64 << 40;
        setrlimit(
            Resource::As,
            Rlimit {
                current: Some(limit),
                maximum: before.maximum,
            },
        )
        .unwrap();
        let l = address_space();
        setrlimit(Resource::As, before).unwrap();
        let l = l.expect("a limit was set");
        assert_eq!((l.kind, l.limit), (Kind::AddressSpace, limit));
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split(' ').next().unwrap().parse().unwrap();
        // Mapped size moves as other tests run; it is of the same order.
        let now = pages * 4096;
        assert!(
            l.used > 0 && l.used < now * 2 + (1 << 30),
            "{l:?} against {now}"
        );
    }
}
