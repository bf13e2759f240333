//! The contents of a regular file: a sparse map of fixed-size blocks.
//!
//! Each present block owns exactly `block_size` bytes of capacity, taken
//! (and accounted) when the block is created; only a prefix of it is
//! initialised and the rest reads as zeros (see [`Block`]). Missing blocks
//! are holes and take no memory.

use std::collections::BTreeMap;
use std::ops::Range;

use crate::block::Block;
use crate::space::Space;

/// A sparse file body.
#[derive(Debug, Default)]
pub(crate) struct FileData {
    pub size: u64,
    blocks: BTreeMap<u64, Block>,
}

/// The largest file size: the kernel's `MAX_LFS_FILESIZE` on 64-bit.
pub(crate) const MAX_FILE_SIZE: u64 = i64::MAX as u64;

impl FileData {
    /// Number of blocks that hold memory.
    pub fn allocated(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// The data-file index of every block at or after file block `from`
    /// and before `to` (a supervised mount's blocks).
    pub fn arena_blocks(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks
            .range(from..to.max(from))
            .filter_map(|(&i, b)| Some((i, b.arena_index()?)))
    }

    /// Puts a block a restarted server took back at file block `idx`.
    pub fn adopt(&mut self, idx: u64, block: Block) {
        self.blocks.insert(idx, block);
    }

    /// Copies `buf.len()` bytes at `offset` into `buf` (holes read as zeros).
    /// The caller keeps the range inside the file.
    pub fn read_into(&self, offset: u64, buf: &mut [u8], bs: u64) {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let idx = pos / bs;
            let within = (pos % bs) as usize;
            let n = (buf.len() - done).min(bs as usize - within);
            let out = &mut buf[done..done + n];
            match self.blocks.get(&idx) {
                Some(b) if within < b.len() => {
                    let have = (b.len() - within).min(n);
                    out[..have].copy_from_slice(&b.filled()[within..within + have]);
                    out[have..].fill(0);
                }
                _ => out.fill(0),
            }
            done += n;
        }
    }

    /// Writes `data` at `offset`, taking new blocks from `space`. Stops early
    /// when `space` runs out and returns how many bytes were stored (every one
    /// of them durable in memory); the size grows to cover them.
    pub fn write(&mut self, offset: u64, data: &[u8], bs: u64, space: &Space) -> usize {
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let idx = pos / bs;
            let within = (pos % bs) as usize;
            let n = (data.len() - done).min(bs as usize - within);
            let src = &data[done..done + n];
            let block = match self.blocks.get_mut(&idx) {
                Some(b) => b,
                None => {
                    if !space.take_blocks(1) {
                        break;
                    }
                    let Some(new) = space.new_block(bs as usize) else {
                        space.give_blocks(1);
                        break;
                    };
                    self.blocks.entry(idx).or_insert(new)
                }
            };
            block.store(within, src);
            done += n;
        }
        let end = offset + done as u64;
        if end > self.size {
            self.size = end;
        }
        done
    }

    /// Sets the size. Shrinking frees the blocks past the end and forgets the
    /// bytes past it in the last block, so growing again reads zeros.
    pub fn truncate(&mut self, new_size: u64, bs: u64, space: &Space) {
        // Truncating to the current size or below also drops blocks kept past
        // the end by fallocate(KEEP_SIZE), as ext4 and tmpfs do.
        if new_size <= self.size {
            let first_gone = new_size.div_ceil(bs);
            let gone = self.blocks.split_off(&first_gone);
            space.give_blocks(gone.len() as u64);
            drop(gone);
            if !new_size.is_multiple_of(bs) {
                if let Some(b) = self.blocks.get_mut(&(new_size / bs)) {
                    b.truncate((new_size % bs) as usize);
                }
            }
        }
        self.size = new_size;
    }

    /// Frees every block.
    pub fn clear(&mut self, space: &Space) {
        space.give_blocks(self.blocks.len() as u64);
        self.blocks = BTreeMap::new();
        self.size = 0;
    }

    /// The block indexes `range` touches.
    fn block_span(range: &Range<u64>, bs: u64) -> Range<u64> {
        range.start / bs..range.end.div_ceil(bs)
    }

    /// Makes every block under `range` present (zeros where new). All or
    /// nothing: returns false, changing nothing, when `space` is short.
    pub fn allocate(&mut self, range: Range<u64>, bs: u64, space: &Space) -> bool {
        let span = Self::block_span(&range, bs);
        let missing = (span.end - span.start) - self.blocks.range(span.clone()).count() as u64;
        if !space.take_blocks(missing) {
            return false;
        }
        // Every block is had before any is added, so a failure changes
        // nothing.
        let mut new = Vec::new();
        for _ in 0..missing {
            match space.new_block(bs as usize) {
                Some(b) => new.push(b),
                None => {
                    drop(new);
                    space.give_blocks(missing);
                    return false;
                }
            }
        }
        for idx in span {
            if let std::collections::btree_map::Entry::Vacant(e) = self.blocks.entry(idx) {
                e.insert(new.pop().expect("one made per missing block"));
            }
        }
        true
    }

    /// Zeroes `range`, freeing the blocks it covers whole.
    pub fn punch(&mut self, range: Range<u64>, bs: u64, space: &Space) {
        // Only present blocks are visited: a hole punched over a terabyte of
        // mostly holes costs what the file holds, not what the range spans.
        let present: Vec<u64> = self
            .blocks
            .range(Self::block_span(&range, bs))
            .map(|(&i, _)| i)
            .collect();
        let mut freed = 0;
        for idx in present {
            let start = idx * bs;
            let lo = range.start.max(start) - start;
            let hi = range.end.min(start + bs) - start;
            if lo == 0 && hi == bs {
                if self.blocks.remove(&idx).is_some() {
                    freed += 1;
                }
            } else if let Some(b) = self.blocks.get_mut(&idx) {
                b.zero(lo as usize, hi as usize);
            }
        }
        space.give_blocks(freed);
    }

    /// Zeroes `range` keeping (or making) its blocks present; all or nothing
    /// like [`FileData::allocate`].
    pub fn zero_range(&mut self, range: Range<u64>, bs: u64, space: &Space) -> bool {
        if !self.allocate(range.clone(), bs, space) {
            return false;
        }
        for idx in Self::block_span(&range, bs) {
            let start = idx * bs;
            let lo = range.start.max(start) - start;
            let hi = range.end.min(start + bs) - start;
            if let Some(b) = self.blocks.get_mut(&idx) {
                b.zero(lo as usize, hi as usize);
            }
        }
        true
    }

    /// `SEEK_DATA`: the first offset at or after `offset` inside a present
    /// block, if any lies before the end of the file.
    pub fn next_data(&self, offset: u64, bs: u64) -> Option<u64> {
        let (&idx, _) = self.blocks.range(offset / bs..).next()?;
        let at = offset.max(idx * bs);
        (at < self.size).then_some(at)
    }

    /// `SEEK_HOLE`: the first offset at or after `offset` inside a hole, or
    /// the size (the implicit hole at the end of every file).
    pub fn next_hole(&self, offset: u64, bs: u64) -> u64 {
        let mut idx = offset / bs;
        for (&i, _) in self.blocks.range(idx..) {
            if i != idx {
                break;
            }
            idx += 1;
        }
        offset.max(idx * bs).min(self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u64 = 4096;

    fn read(f: &FileData, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0xAA; len];
        f.read_into(off, &mut v, BS);
        v
    }

    #[test]
    fn writes_reads_and_holes() {
        let space = Space::new(BS, Some(100 * BS), None);
        let mut f = FileData::default();
        assert_eq!(f.write(10_000, b"hello", BS, &space), 5);
        assert_eq!(f.size, 10_005);
        assert_eq!(f.allocated(), 1);
        assert_eq!(read(&f, 9_998, 9), b"\0\0hello\0\0");
        assert_eq!(read(&f, 0, 8192), vec![0; 8192]);
        // A write spanning a block boundary.
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(f.write(3000, &data, BS, &space), 9000);
        assert_eq!(read(&f, 3000, 9000), data);
        assert_eq!(f.allocated(), 3);
        assert_eq!(space.used_blocks(), 3);
    }

    #[test]
    fn truncate_forgets_the_tail() {
        let space = Space::new(BS, None, None);
        let mut f = FileData::default();
        f.write(0, &[7u8; 10_000], BS, &space);
        f.truncate(5000, BS, &space);
        assert_eq!(f.allocated(), 2);
        f.truncate(10_000, BS, &space);
        assert_eq!(read(&f, 4990, 20)[..10], [7u8; 10]);
        assert_eq!(read(&f, 5000, 5000), vec![0; 5000]);
        f.truncate(0, BS, &space);
        assert_eq!(space.used_blocks(), 0);
    }

    #[test]
    fn space_runs_out_mid_write() {
        let space = Space::new(BS, Some(2 * BS), None);
        let mut f = FileData::default();
        assert_eq!(
            f.write(100, &[1u8; 3 * BS as usize], BS, &space),
            2 * BS as usize - 100
        );
        assert_eq!(f.size, 2 * BS);
        assert_eq!(f.write(f.size, b"x", BS, &space), 0);
        // Rewriting present blocks needs no space.
        assert_eq!(f.write(0, &[2u8; 50], BS, &space), 50);
        assert!(!f.allocate(0..3 * BS, BS, &space));
        assert_eq!(f.allocated(), 2);
    }

    #[test]
    fn punch_and_seek() {
        let space = Space::new(BS, None, None);
        let mut f = FileData::default();
        f.write(0, &[9u8; 5 * BS as usize], BS, &space);
        f.punch(BS + 10..3 * BS, BS, &space);
        assert_eq!(f.allocated(), 4);
        assert_eq!(read(&f, BS + 5, 10), [9, 9, 9, 9, 9, 0, 0, 0, 0, 0]);
        assert_eq!(read(&f, 2 * BS, BS as usize), vec![0; BS as usize]);
        assert_eq!(f.next_hole(0, BS), 2 * BS);
        assert_eq!(f.next_data(2 * BS, BS), Some(3 * BS));
        assert_eq!(f.next_hole(3 * BS, BS), 5 * BS);
        assert_eq!(f.next_data(5 * BS - 1, BS), Some(5 * BS - 1));
        // A huge punch over holes is quick and frees what is there.
        f.punch(4 * BS..1 << 50, BS, &space);
        assert_eq!(f.allocated(), 3);
        assert!(f.zero_range(0..BS * 5, BS, &space));
        assert_eq!(f.allocated(), 5);
        assert_eq!(read(&f, 0, 5 * BS as usize), vec![0; 5 * BS as usize]);
    }
}
