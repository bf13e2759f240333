//! Directories: reading their blocks, listing them, and hinting the inodes
//! of their entries ahead of a READDIRPLUS.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::{DirEntry, Error, FileType, Ino, Result, Scratch};

use crate::data::{with_scratch, Phys};
use crate::dirent::DirBlock;
use crate::format::{Layout, DIRENT_SIZE, FT_DIR, MAX_INODE_SIZE};
use crate::inode::Inode;
use crate::{Corrupt, Erofs};

/// Directory blocks whose entries' inodes one READDIRPLUS prefetches (at
/// 4 KiB blocks, some ten thousand entries).
const PREFETCH_DIR_BLOCKS: u64 = 64;

/// A subdirectory's first blocks hinted by its parent's READDIRPLUS: the
/// whole of most directories, without reading far into a large one.
const SUBDIR_PREFETCH_BLOCKS: u64 = 4;

thread_local! {
    /// Buffer for directory blocks.
    static DIRBUF: RefCell<Scratch> = RefCell::new(Scratch::new());
}

impl Erofs {
    /// Runs `f` on directory block `index` of `dir`.
    pub(crate) fn with_dir_block<R>(
        &self,
        dir: &Inode,
        index: u64,
        f: impl FnOnce(&DirBlock<'_>) -> Result<R>,
    ) -> Result<R> {
        let bs = u64::from(self.sb.block_size());
        let start = index * bs;
        let len = (dir.size - start).min(bs) as u32;
        with_scratch(&DIRBUF, |scratch| {
            let data = self.read_inode(dir, start, len, scratch)?;
            if data.len() != len as usize {
                return Err(Error::corrupt(
                    dir.pos,
                    Corrupt::DirectoryShort { nid: dir.nid },
                ));
            }
            let block = DirBlock::new(data, self.dir_block_pos(dir, start))?;
            f(&block)
        })
    }

    /// Best-effort image position of a directory block, for messages (flat
    /// layouts map by arithmetic alone, so this costs no I/O).
    pub(crate) fn dir_block_pos(&self, dir: &Inode, start: u64) -> u64 {
        match dir.layout {
            Layout::FlatPlain | Layout::FlatInline => self
                .map_flat(dir, start, start + 1)
                .ok()
                .and_then(|r| match r.phys {
                    Phys::At(_, p) | Phys::Metabox(p) | Phys::Tail(p) => Some(p + (start - r.la)),
                    Phys::Hole => None,
                })
                .unwrap_or(dir.pos),
            _ => dir.pos,
        }
    }

    pub(crate) fn dir_inode(&self, ino: Ino) -> Result<Inode> {
        let dir = self.inode(self.nid_of(ino))?;
        if dir.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(dir)
    }

    /// Lists directory `ino` from byte position `offset` on, for
    /// [`FileSystem::readdir`](foliofs_vfs::FileSystem::readdir): each
    /// entry's `next` is where the entry after it starts. With `dots`, "."
    /// and ".." are listed as the kernel lists them: where they are among
    /// the sorted entries, and a "." the directory does not keep
    /// (DOT_OMITTED) after the last entry, at the position just past its
    /// blocks.
    pub(crate) fn readdir_inner(
        &self,
        ino: Ino,
        offset: u64,
        dots: bool,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let dir = self.dir_inode(ino)?;
        let bs = u64::from(self.sb.block_size());
        let nblocks = dir.size.div_ceil(bs);
        let end = nblocks * bs;
        let mut block = offset / bs;
        let mut first = ((offset % bs) as usize).div_ceil(DIRENT_SIZE);
        // Entries are handed over from a copy of each block, made once,
        // so a sink that calls back into this file system cannot collide
        // with the buffer the block was read into (and no name is copied
        // on its own).
        let mut copy = Vec::new();
        while block < nblocks {
            let checked = self.with_dir_block(&dir, block, |b| Ok(b.copy_into(&mut copy)))?;
            let b = DirBlock::copied(&copy, checked);
            for i in first..b.len() {
                let d = b.get(i);
                if !dots && (d.name == b"." || d.name == b"..") {
                    continue;
                }
                let next = if i + 1 < b.len() {
                    block * bs + ((i + 1) * DIRENT_SIZE) as u64
                } else {
                    (block + 1) * bs
                };
                let kind = match d.kind() {
                    Some(k) => k,
                    None => self.inode(d.nid)?.kind,
                };
                if sink(DirEntry {
                    ino: self.ino_of(d.nid),
                    next,
                    kind,
                    name: OsStr::from_bytes(d.name),
                }) {
                    return Ok(());
                }
            }
            block += 1;
            first = 0;
        }
        if dots && dir.dot_omitted && offset <= end {
            sink(DirEntry {
                ino: self.ino_of(dir.nid),
                next: end + 1,
                kind: FileType::Directory,
                name: OsStr::new("."),
            });
        }
        Ok(())
    }

    /// Hints what a READDIRPLUS of `ino` from `offset`, and the walk after
    /// it, will read, when the listing reaches the start of a window of
    /// [`PREFETCH_DIR_BLOCKS`] directory blocks: the inodes of the entries
    /// the server looks up (the subdirectories, and with `every` all of
    /// them), whose nids the directory blocks give before any is read, and
    /// then the first blocks of the subdirectories, which a walker lists
    /// next. The kernel's EROFS reads each of these one at a time as
    /// lookups and listings come, waiting for the device each time; hinted
    /// together, they are in flight together.
    pub(crate) fn prefetch_dir_inner(&self, ino: Ino, offset: u64, every: bool) {
        let bs = u64::from(self.sb.block_size());
        let window = PREFETCH_DIR_BLOCKS * bs;
        if !offset.is_multiple_of(window) {
            return;
        }
        let Ok(dir) = self.dir_inode(ino) else { return };
        let first = offset / bs;
        let last = dir.size.div_ceil(bs).min(first + PREFETCH_DIR_BLOCKS);
        let mut at = Vec::new();
        let mut subdirs = Vec::new();
        for block in first..last {
            let more = self.with_dir_block(&dir, block, |b| {
                for i in 0..b.len() {
                    let e = b.get(i);
                    let subdir = e.file_type == FT_DIR && e.name != b"." && e.name != b"..";
                    if !(every || subdir) {
                        continue;
                    }
                    if let Some(pos) = Inode::position(&self.sb, e.nid) {
                        // An extended inode may run into the next block.
                        at.extend([pos, pos.saturating_add(MAX_INODE_SIZE as u64 - 1)]);
                    }
                    if subdir {
                        subdirs.push(e.nid);
                    }
                }
                Ok(())
            });
            if more.is_err() {
                break;
            }
        }
        self.dev.prefetch(at);
        // The subdirectories' inodes were all asked for above, so reading
        // them here waits for the slowest, not for each in turn; the lookups
        // of this listing read them next anyway.
        let mut at = Vec::new();
        for nid in subdirs {
            let Ok(sub) = self.inode(nid) else { continue };
            // A compressed directory's blocks are found through its
            // extent map, which costs reads of its own: it is left to its
            // listing.
            if !matches!(
                sub.layout,
                Layout::FlatPlain | Layout::FlatInline | Layout::ChunkBased
            ) {
                continue;
            }
            let end = sub.size.min(SUBDIR_PREFETCH_BLOCKS * bs);
            let mut pos = 0;
            while pos < end {
                let Ok(run) = self.map_flat(&sub, pos, end) else {
                    break;
                };
                if let Phys::At(0, p) = run.phys {
                    let upto = (run.la + run.len).min(end);
                    at.extend((pos..upto).step_by(bs as usize).map(|o| p + (o - run.la)));
                }
                if run.la + run.len <= pos {
                    break;
                }
                pos = run.la + run.len;
            }
        }
        self.dev.prefetch(at);
    }
}

#[cfg(test)]
mod tests {
    use foliofs_vfs::FileSystem;

    use crate::format::{FT_DIR, FT_REG_FILE, I_FORMAT_BIT4};
    use crate::testimage::{TestImage, FLAT_INLINE, ROOT};
    use crate::Erofs;

    /// Every (name, cookie after it) of the root listed from `offset`, with
    /// the dots or without.
    fn listing(fs: &Erofs, offset: u64, dots: bool) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut sink = |e: foliofs_vfs::DirEntry<'_>| {
            out.push((e.name.to_string_lossy().into_owned(), e.next));
            false
        };
        if dots {
            fs.readdir_with_dots(fs.root(), offset, &mut sink).unwrap();
        } else {
            fs.readdir(fs.root(), offset, &mut sink).unwrap();
        }
        out
    }

    fn names(list: &[(String, u64)]) -> Vec<&str> {
        list.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn the_dots_are_listed_where_they_are_stored() {
        let mut t = TestImage::new(0, 0);
        t.root(&[("#hash", 2, FT_REG_FILE), ("z", 3, FT_REG_FILE)]);
        let (_d, fs) = t.open();
        assert_eq!(names(&listing(&fs, 0, false)), ["#hash", "z"]);
        let all = listing(&fs, 0, true);
        assert_eq!(names(&all), ["#hash", ".", "..", "z"]);
        // Each cookie resumes right after its entry.
        for (i, (_, next)) in all.iter().enumerate() {
            assert_eq!(listing(&fs, *next, true), all[i + 1..]);
        }
    }

    #[test]
    fn an_omitted_dot_comes_after_every_stored_entry() {
        let mut t = TestImage::new(0, 0);
        let block = TestImage::dirents(&mut [
            ("..", ROOT, FT_DIR),
            ("#hash", 2, FT_REG_FILE),
            ("z", 3, FT_REG_FILE),
        ]);
        t.inode(
            ROOT,
            FLAT_INLINE | I_FORMAT_BIT4,
            0o40755,
            block.len() as u32,
            0,
        );
        t.put(TestImage::inode_pos(ROOT) + 32, &block);
        let (_d, fs) = t.open();
        assert_eq!(names(&listing(&fs, 0, false)), ["#hash", "z"]);
        let all = listing(&fs, 0, true);
        assert_eq!(names(&all), ["#hash", "..", "z", "."]);
        for (i, (_, next)) in all.iter().enumerate() {
            assert_eq!(listing(&fs, *next, true), all[i + 1..]);
        }
        let mut dot = None;
        fs.readdir_with_dots(fs.root(), all[2].1, &mut |e| {
            dot = Some((e.ino, e.kind));
            true
        })
        .unwrap();
        assert_eq!(dot, Some((fs.root(), foliofs_vfs::FileType::Directory)));
    }
}

/// What a READDIRPLUS hints, seen in the page cache: the hint goes to the
/// kernel as `POSIX_FADV_WILLNEED`, so the only place it shows is there.
#[cfg(test)]
#[allow(unsafe_code)]
mod prefetch_tests {
    use std::os::unix::io::AsRawFd;
    use std::time::{Duration, Instant};

    use foliofs_block::OpenOptions;
    use foliofs_vfs::FileSystem;

    use crate::format::{FT_DIR, FT_REG_FILE};
    use crate::testimage::{TestImage, BS, FLAT_PLAIN, META_BLK, ROOT};
    use crate::Erofs;

    /// Blocks far enough apart that the kernel's read-ahead around one
    /// never reaches another.
    const SUB_INODE_BLK: u64 = 100;
    const FILE_INODE_BLK: u64 = 300;
    const SUB_DATA_BLK: u64 = 500;

    fn nid_at(block: u64) -> u64 {
        (block - META_BLK) * BS / 32
    }

    fn resident(f: &std::fs::File, len: usize) -> Vec<bool> {
        foliofs_testkit::folios::resident(f, len).unwrap()
    }

    fn arrives(f: &std::fs::File, len: usize, block: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if resident(f, len)[block as usize] {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn a_listing_hints_its_subdirectories_and_with_every_all_inodes() {
        let sub = nid_at(SUB_INODE_BLK);
        let file = nid_at(FILE_INODE_BLK);
        let mut t = TestImage::new(0, 0);
        t.root(&[("sub", sub, FT_DIR), ("file", file, FT_REG_FILE)]);
        let mut block = TestImage::dir_block(&[], sub, ROOT);
        let size = block.len() as u32;
        block.resize(BS as usize, 0);
        t.inode(sub, FLAT_PLAIN, 0o40755, size, SUB_DATA_BLK as u32);
        t.put(SUB_DATA_BLK * BS, &block);
        t.inode(file, FLAT_PLAIN, 0o100644, 0, 0);
        t.put((SUB_DATA_BLK + 200) * BS, &[0]);
        let len = t.bytes.len();
        // On a disk, whose pages can be dropped (a tmpfs /tmp keeps them):
        // the workspace's target directory where there is one.
        let target = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target"));
        let dir = if target.is_dir() {
            tempfile::tempdir_in(target)
        } else {
            tempfile::tempdir()
        }
        .unwrap();
        let path = dir.path().join("image.erofs");
        std::fs::write(&path, &t.bytes).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: posix_fadvise reads only its integer arguments.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if resident(&f, len).iter().any(|&r| r) {
            eprintln!("skipped: this file system keeps pages after POSIX_FADV_DONTNEED");
            return;
        }
        let fs = Erofs::open(&path, &OpenOptions::default(), &[]).unwrap();
        let r = resident(&f, len);
        assert!(
            !r[SUB_INODE_BLK as usize] && !r[SUB_DATA_BLK as usize],
            "opening the image read what the test expects the hint to read"
        );
        fs.prefetch_dir(fs.root(), 0, false);
        assert!(
            arrives(&f, len, SUB_INODE_BLK),
            "the subdirectory's inode was not read"
        );
        assert!(
            arrives(&f, len, SUB_DATA_BLK),
            "the subdirectory's first block was not hinted"
        );
        assert!(
            !resident(&f, len)[FILE_INODE_BLK as usize],
            "a lean listing hinted the inode of a file"
        );
        fs.prefetch_dir(fs.root(), 0, true);
        assert!(
            arrives(&f, len, FILE_INODE_BLK),
            "a full listing did not hint the inode of a file"
        );
    }
}
