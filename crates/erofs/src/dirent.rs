//! Directory blocks: 12-byte entries at the front, names packed behind them.

use foliofs_vfs::{Error, FileType, Result};

use zerocopy::FromBytes;

use crate::format::{
    erofs_dirent, DIRENT_SIZE, FT_BLKDEV, FT_CHRDEV, FT_DIR, FT_FIFO, FT_REG_FILE, FT_SOCK,
    FT_SYMLINK,
};
use crate::Corrupt;

/// One entry of a directory block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dirent<'a> {
    /// The inode the entry names.
    pub nid: u64,
    /// The on-disk file type (1 reg .. 7 symlink).
    pub file_type: u8,
    /// The name, without a terminator.
    pub name: &'a [u8],
}

impl Dirent<'_> {
    /// The entry's file type, if it is one EROFS defines.
    pub fn kind(&self) -> Option<FileType> {
        Some(match self.file_type {
            FT_REG_FILE => FileType::RegularFile,
            FT_DIR => FileType::Directory,
            FT_CHRDEV => FileType::CharDevice,
            FT_BLKDEV => FileType::BlockDevice,
            FT_FIFO => FileType::Fifo,
            FT_SOCK => FileType::Socket,
            FT_SYMLINK => FileType::Symlink,
            _ => return None,
        })
    }
}

/// What checking a block found, for a view of a copy of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    count: usize,
    pos: u64,
}

/// A checked view of one directory block (`data` is the block's valid bytes;
/// the last block of a directory may be shorter than the block size).
#[derive(Clone, Copy, Debug)]
pub struct DirBlock<'a> {
    data: &'a [u8],
    count: usize,
    /// Image position of the block, for error messages.
    pos: u64,
}

impl<'a> DirBlock<'a> {
    /// Validates the entry table of a directory block.
    pub fn new(data: &'a [u8], pos: u64) -> Result<DirBlock<'a>> {
        let bad = |kind: Corrupt| Error::corrupt(pos, kind);
        if data.len() < DIRENT_SIZE {
            return Err(bad(Corrupt::DirBlockTooSmall { len: data.len() }));
        }
        let first = nameoff(data, 0);
        if first < DIRENT_SIZE || !first.is_multiple_of(DIRENT_SIZE) || first >= data.len() {
            return Err(bad(Corrupt::DirentFirstNameOffset {
                nameoff: first,
                len: data.len(),
            }));
        }
        let count = first / DIRENT_SIZE;
        let mut prev = first;
        for i in 1..count {
            let off = nameoff(data, i);
            if off <= prev || off > data.len() {
                return Err(bad(Corrupt::DirentNameOffset {
                    entry: i,
                    nameoff: off,
                }));
            }
            prev = off;
        }
        let block = DirBlock { data, count, pos };
        // A name the kernel cannot hand to a program (empty, or holding '/'
        // or NUL) would fail the whole listing later; refuse the block here
        // with its position instead.
        for i in 0..count {
            let name = block.get(i).name;
            if name.is_empty() || name.iter().any(|&c| c == b'/' || c == 0) {
                return Err(bad(Corrupt::DirentBadName {
                    entry: i,
                    name: String::from_utf8_lossy(name).into_owned(),
                }));
            }
        }
        Ok(block)
    }

    /// Copies the block's bytes into `buf` (emptied first), for a view of
    /// the copy ([`DirBlock::copied`]) that outlives the buffer the block
    /// was read into, without checking it again.
    pub(crate) fn copy_into(&self, buf: &mut Vec<u8>) -> Checked {
        buf.clear();
        buf.extend_from_slice(self.data);
        Checked {
            count: self.count,
            pos: self.pos,
        }
    }

    /// The view of a copy [`DirBlock::copy_into`] made.
    pub(crate) fn copied(data: &'a [u8], checked: Checked) -> DirBlock<'a> {
        DirBlock {
            data,
            count: checked.count,
            pos: checked.pos,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the block lists no entries (never, once validated).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Entry `i` (< `len()`).
    pub fn get(&self, i: usize) -> Dirent<'a> {
        let d = self.data;
        let start = nameoff(d, i);
        let end = if i + 1 < self.count {
            nameoff(d, i + 1)
        } else {
            // The last name runs to a NUL or to the end of the block.
            let tail = &d[start..];
            start + tail.iter().position(|&b| b == 0).unwrap_or(tail.len())
        };
        let de = record(d, i);
        Dirent {
            nid: de.nid.get(),
            file_type: de.file_type,
            name: &d[start..end],
        }
    }

    /// Image position of entry `i`'s record.
    pub fn entry_pos(&self, i: usize) -> u64 {
        self.pos + (i * DIRENT_SIZE) as u64
    }

    /// Binary search for `name` (entries are sorted by byte order).
    pub fn find(&self, name: &[u8]) -> std::result::Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.get(mid).name.cmp(name) {
                std::cmp::Ordering::Equal => return Ok(mid),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Err(lo)
    }
}

/// Entry `i`'s record (the block holds it: callers check the length).
fn record(data: &[u8], i: usize) -> &erofs_dirent {
    let (de, _) = erofs_dirent::ref_from_prefix(&data[i * DIRENT_SIZE..]).expect("checked length");
    de
}

fn nameoff(data: &[u8], i: usize) -> usize {
    usize::from(record(data, i).nameoff.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(names: &[&str]) -> Vec<u8> {
        let mut b = vec![0u8; 12 * names.len()];
        let mut off = b.len();
        for (i, n) in names.iter().enumerate() {
            b[i * 12..i * 12 + 8].copy_from_slice(&(i as u64 + 40).to_le_bytes());
            b[i * 12 + 8..i * 12 + 10].copy_from_slice(&(off as u16).to_le_bytes());
            b[i * 12 + 10] = 1;
            off += n.len();
        }
        for n in names {
            b.extend_from_slice(n.as_bytes());
        }
        b.resize(64.max(b.len()), 0);
        b
    }

    #[test]
    fn lists_and_searches() {
        let raw = block(&[".", "..", "abc", "b", "zz"]);
        let d = DirBlock::new(&raw, 0).unwrap();
        assert_eq!(d.len(), 5);
        assert_eq!(d.get(4).name, b"zz");
        assert_eq!(d.find(b"b"), Ok(3));
        assert_eq!(d.find(b"c"), Err(4));
        assert_eq!(d.get(2).kind(), Some(FileType::RegularFile));
    }

    fn kind(e: Error) -> Corrupt {
        e.corruption::<Corrupt>()
            .unwrap_or_else(|| panic!("not EROFS corruption: {e}"))
            .clone()
    }

    #[test]
    fn rejects_bad_offsets() {
        let mut raw = block(&["a", "b"]);
        raw[20] = 0xff;
        let e = DirBlock::new(&raw, 4096).unwrap_err();
        assert_eq!(e.offset(), Some(4096));
        assert!(matches!(
            kind(e),
            Corrupt::DirentNameOffset { entry: 1, .. }
        ));
        let e = DirBlock::new(&[0u8; 5], 0).unwrap_err();
        assert_eq!(kind(e), Corrupt::DirBlockTooSmall { len: 5 });
        let mut raw = block(&["a"]);
        raw[8] = 7;
        let e = DirBlock::new(&raw, 0).unwrap_err();
        assert!(matches!(
            kind(e),
            Corrupt::DirentFirstNameOffset { nameoff: 7, .. }
        ));
    }

    #[test]
    fn rejects_names_no_program_could_be_handed() {
        let raw = block(&["a", "b/c"]);
        let e = DirBlock::new(&raw, 0).unwrap_err();
        assert_eq!(
            kind(e),
            Corrupt::DirentBadName {
                entry: 1,
                name: "b/c".into()
            }
        );
    }
}
