//! Directories: the chain of entries a directory's `spec` starts, read once
//! and kept as a list with a name index.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::FileType;

/// One visible entry of a directory ("." and ".." are left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEnt {
    /// The entry's name (no "/", not empty, not "." or "..").
    pub name: Box<[u8]>,
    /// The entry's own header (a hard link's, for a link).
    pub header: u64,
    /// The inode it names: the header offset after following hard links.
    pub ino: u64,
    /// The type of that inode.
    pub kind: FileType,
}

impl DirEnt {
    /// The name as an `OsStr`.
    pub fn name_os(&self) -> &OsStr {
        OsStr::from_bytes(&self.name)
    }
}

/// A directory's visible entries in on-disk order.
#[derive(Debug, Default)]
pub struct Dir {
    entries: Vec<DirEnt>,
    /// Entry indices sorted by (name, index): lookups find the first entry
    /// of a name, as the kernel's linear scan does.
    by_name: Vec<u32>,
    /// Where the image's own ".." entry points, if it has one.
    pub(crate) dotdot: Option<u64>,
}

impl Dir {
    pub(crate) fn new(entries: Vec<DirEnt>, dotdot: Option<u64>) -> Dir {
        let mut by_name: Vec<u32> = (0..entries.len() as u32).collect();
        by_name.sort_by(|&a, &b| {
            entries[a as usize]
                .name
                .cmp(&entries[b as usize].name)
                .then(a.cmp(&b))
        });
        Dir {
            entries,
            by_name,
            dotdot,
        }
    }

    /// The visible entries, in on-disk order. An entry's readdir cookie is
    /// its index plus one.
    pub fn entries(&self) -> &[DirEnt] {
        &self.entries
    }

    /// The first entry called `name`.
    pub fn find(&self, name: &[u8]) -> Option<&DirEnt> {
        let i = self
            .by_name
            .partition_point(|&i| &*self.entries[i as usize].name < name);
        let &idx = self.by_name.get(i)?;
        let e = &self.entries[idx as usize];
        (&*e.name == name).then_some(e)
    }
}

/// Detects a revisited offset in a chain of headers at a cost of nothing
/// while the chain only moves forward (as every writer lays chains out), and
/// of a set of offsets once it has gone backwards: a loop then shows within
/// one more lap.
#[derive(Default)]
pub(crate) struct LoopGuard {
    last: u64,
    seen: Option<HashSet<u64>>,
}

impl LoopGuard {
    /// False when `offset` was visited before (the chain loops).
    pub(crate) fn visit(&mut self, offset: u64) -> bool {
        if let Some(seen) = &mut self.seen {
            return seen.insert(offset);
        }
        if offset > self.last {
            self.last = offset;
            return true;
        }
        self.seen = Some(HashSet::from([offset]));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(name: &str, ino: u64) -> DirEnt {
        DirEnt {
            name: name.as_bytes().into(),
            header: ino,
            ino,
            kind: FileType::RegularFile,
        }
    }

    #[test]
    fn find_returns_the_first_of_duplicates() {
        let d = Dir::new(
            vec![ent("b", 1), ent("a", 2), ent("b", 3), ent("c", 4)],
            None,
        );
        assert_eq!(d.find(b"b").unwrap().ino, 1);
        assert_eq!(d.find(b"a").unwrap().ino, 2);
        assert!(d.find(b"bb").is_none());
        assert!(d.find(b"").is_none());
    }

    #[test]
    fn loop_guard_catches_loops_in_either_direction() {
        let mut g = LoopGuard::default();
        assert!([16, 32, 48].iter().all(|&o| g.visit(o)));
        // 48 -> 32 goes back; the loop 32 -> 48 -> 32 shows on the next lap.
        let lap: Vec<bool> = [32, 48, 32].iter().map(|&o| g.visit(o)).collect();
        assert_eq!(lap, [true, true, false]);
        let mut g = LoopGuard::default();
        assert!(g.visit(64));
        assert!(g.visit(64));
        assert!(!g.visit(64));
    }
}
