//! The layout's place phase: where each inode goes in the metadata area.
//! It is apart from the other phases as it knows only how many bytes an
//! inode takes, nothing of what it holds.

use crate::format::INODE_COMPACT_SIZE;

/// Where inodes go in the metadata area. An inode with its xattrs and
/// inline tail must sit in one block, so placing them one after another
/// would leave the end of a block empty whenever the next one does not
/// fit; instead each goes into the fullest block that still has room for
/// it (best fit, as blocks are kept by free space), and only a block that
/// has room for none of them is left with a gap. Inodes that span blocks
/// anyway (compressed files' long indexes, large xattrs) go at the end.
pub(super) struct Packer {
    blksz: u64,
    /// Bytes used in each block of the area.
    used: Vec<u64>,
    /// Blocks with free space, by that space in 32-byte slots: the
    /// latest block last, so a fit stays near its neighbours. An entry
    /// may be stale (see `fit`).
    by_free: Vec<Vec<u64>>,
}

impl Packer {
    pub(super) fn new(blksz: u64) -> Self {
        let slot = INODE_COMPACT_SIZE as u64;
        // Slot 0 stays empty: a directory entry naming inode 0 is
        // skipped by some readers of getdents.
        let mut p = Packer {
            blksz,
            used: vec![slot],
            by_free: vec![Vec::new(); (blksz / slot) as usize + 1],
        };
        p.file(0);
        p
    }

    fn slots_free(&self, b: u64) -> usize {
        ((self.blksz - self.used[b as usize]) / INODE_COMPACT_SIZE as u64) as usize
    }

    /// Files block `b` under its free space.
    fn file(&mut self, b: u64) {
        let f = self.slots_free(b);
        if f > 0 {
            self.by_free[f].push(b);
        }
    }

    /// A block with room for `slots` slots, the fullest such. A block an
    /// inode across blocks has taken from since it was filed is still
    /// listed under its old space; such entries are dropped here, as
    /// they come up, rather than searched for when the space changes.
    fn fit(&mut self, slots: usize) -> Option<u64> {
        for f in slots..self.by_free.len() {
            while let Some(&b) = self.by_free[f].last() {
                self.by_free[f].pop();
                if self.slots_free(b) == f {
                    return Some(b);
                }
            }
        }
        None
    }

    /// The byte offset in the area of `need` bytes placed.
    pub(super) fn place(&mut self, need: u64) -> u64 {
        let slot = INODE_COMPACT_SIZE as u64;
        let need = need.next_multiple_of(slot);
        if need <= self.blksz {
            let want = (need / slot) as usize;
            let b = match self.fit(want) {
                Some(b) => b,
                None => {
                    self.used.push(0);
                    self.used.len() as u64 - 1
                }
            };
            let at = b * self.blksz + self.used[b as usize];
            self.used[b as usize] += need;
            self.file(b);
            return at;
        }
        // Across blocks: from the end of the last block on.
        let last = self.used.len() as u64 - 1;
        let at = last * self.blksz + self.used[last as usize];
        let end = at + need;
        self.used[last as usize] = self.blksz;
        while (self.used.len() as u64) * self.blksz < end {
            self.used.push(self.blksz);
        }
        let tail = end - (self.used.len() as u64 - 1) * self.blksz;
        *self.used.last_mut().expect("a block") = tail;
        self.file(self.used.len() as u64 - 1);
        at
    }

    /// Bytes the area takes, whole blocks.
    pub(super) fn len(&self) -> u64 {
        self.used.len() as u64 * self.blksz
    }
}
