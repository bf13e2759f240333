//! Node ids: the kernel names the root 1, formats name inodes their own way.

use foliofs_vfs::Ino;

/// A fuse node id no format uses; it stands in for inode 0 (an id the
/// kernel treats as "no entry") or for inode 1 when the root is 0.
const SPARE: u64 = u64::MAX;

/// The bijection between the file system's inode numbers and FUSE node
/// ids: the root is node 1, inode 1 (if it is not the root) takes the
/// root's number, inode 0 takes [`SPARE`]; every other number is itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdMap {
    root: Ino,
}

impl IdMap {
    pub(crate) fn new(root: Ino) -> IdMap {
        IdMap { root }
    }

    /// The node id the kernel uses for inode `ino`.
    pub(crate) fn to_fuse(self, ino: Ino) -> u64 {
        let r = self.root;
        if ino == r {
            1
        } else if ino == 1 {
            if r == 0 {
                SPARE
            } else {
                r
            }
        } else if ino == 0 {
            SPARE
        } else {
            ino
        }
    }

    /// The inode behind node id `node`.
    pub(crate) fn to_fs(self, node: u64) -> Ino {
        let r = self.root;
        if node == 1 {
            r
        } else if node == SPARE {
            if r == 0 {
                1
            } else {
                0
            }
        } else if node == r && r != 0 {
            1
        } else {
            node
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bijection_for_any_root() {
        for root in [0u64, 1, 2, 0x20, 0x60, 12345] {
            let m = IdMap::new(root);
            assert_eq!(m.to_fuse(root), 1);
            let mut seen = std::collections::HashSet::new();
            for ino in [0u64, 1, 2, 3, 0x20, 0x60, 12345, 99999] {
                let node = m.to_fuse(ino);
                assert_ne!(node, 0, "root {root} ino {ino}");
                assert!(seen.insert(node), "root {root}: node {node} reused");
                assert_eq!(m.to_fs(node), ino, "root {root} ino {ino}");
            }
        }
    }
}
