//! Hand-made images for unit tests of layouts mkfs.erofs writes only in
//! large trees or never (hostile values): 4 KiB blocks, the superblock in
//! block 0, inodes from block 1 on, data from block 8 on.

use std::path::PathBuf;

use foliofs_block::OpenOptions;

use zerocopy::IntoBytes;

use crate::format::{erofs_dirent, erofs_inode_compact, MAGIC, SUPER_OFFSET};
use crate::Erofs;

/// Block size of every test image.
pub(crate) const BS: u64 = 4096;
/// The block the inodes start at (`meta_blkaddr`).
pub(crate) const META_BLK: u64 = 1;
/// The first block free for data.
pub(crate) const DATA_BLK: u64 = 8;
/// The root directory's nid.
pub(crate) const ROOT: u64 = 0;

/// An image being put together.
pub(crate) struct TestImage {
    pub(crate) bytes: Vec<u8>,
}

/// Layout numbers of `i_format` (bits 1..3).
pub(crate) const FLAT_PLAIN: u16 = 0;
pub(crate) const COMPRESSED_FULL: u16 = 1 << 1;
pub(crate) const FLAT_INLINE: u16 = 2 << 1;

impl TestImage {
    /// 16 blocks, the superblock (with `incompat`, `sb_extslots` slots)
    /// and an empty root directory.
    pub(crate) fn new(incompat: u32, sb_extslots: u8) -> TestImage {
        let mut t = TestImage {
            bytes: vec![0; 16 * BS as usize],
        };
        let sb = SUPER_OFFSET;
        t.put(sb, &MAGIC.to_le_bytes());
        t.bytes[sb as usize + 0x0C] = 12;
        t.bytes[sb as usize + 0x0D] = sb_extslots;
        t.put(sb + 0x0E, &(ROOT as u16).to_le_bytes());
        t.put(sb + 0x24, &16u32.to_le_bytes());
        t.put(sb + 0x28, &(META_BLK as u32).to_le_bytes());
        t.put(sb + 0x50, &incompat.to_le_bytes());
        t.root(&[]);
        t
    }

    /// Writes `data` at byte `pos`, growing the image if needed.
    pub(crate) fn put(&mut self, pos: u64, data: &[u8]) {
        let end = pos as usize + data.len();
        if self.bytes.len() < end {
            self.bytes
                .resize(end.div_ceil(BS as usize) * BS as usize, 0);
        }
        self.bytes[pos as usize..end].copy_from_slice(data);
    }

    /// Sets a superblock field.
    pub(crate) fn sb(&mut self, at: u64, data: &[u8]) {
        self.put(SUPER_OFFSET + at, data);
    }

    /// Where inode `nid` goes.
    pub(crate) fn inode_pos(nid: u64) -> u64 {
        META_BLK * BS + nid * 32
    }

    /// A compact inode: `format` (layout bits), `mode`, size, `i_u`, one
    /// link, mtime 0.
    pub(crate) fn inode_bytes(format: u16, mode: u16, size: u32, i_u: u32) -> [u8; 32] {
        let dic = erofs_inode_compact {
            i_format: format.into(),
            i_mode: mode.into(),
            i_nb: 1.into(),
            i_size: size.into(),
            i_u: i_u.into(),
            ..Default::default()
        };
        zerocopy::transmute!(dic)
    }

    /// [`TestImage::inode_bytes`] written at `nid`'s place in the image.
    pub(crate) fn inode(&mut self, nid: u64, format: u16, mode: u16, size: u32, i_u: u32) {
        let raw = Self::inode_bytes(format, mode, size, i_u);
        self.put(Self::inode_pos(nid), &raw);
    }

    /// Directory entries `entries` (name, nid, EROFS file type) with "."
    /// and "..", as one inline block after inode `nid`.
    pub(crate) fn dir_block(entries: &[(&str, u64, u8)], nid: u64, parent: u64) -> Vec<u8> {
        let mut all: Vec<(&str, u64, u8)> = vec![(".", nid, 2), ("..", parent, 2)];
        all.extend_from_slice(entries);
        Self::dirents(&mut all)
    }

    /// One directory block of exactly `all` (name, nid, EROFS file type),
    /// sorted as mkfs.erofs sorts them.
    pub(crate) fn dirents(all: &mut [(&str, u64, u8)]) -> Vec<u8> {
        all.sort_by(|a, b| a.0.cmp(b.0));
        let mut block = Vec::new();
        let mut nameoff = 12 * all.len();
        for (name, nid, ft) in all.iter() {
            let d = erofs_dirent {
                nid: (*nid).into(),
                nameoff: (nameoff as u16).into(),
                file_type: *ft,
                reserved: 0,
            };
            block.extend_from_slice(d.as_bytes());
            nameoff += name.len();
        }
        for (name, _, _) in all.iter() {
            block.extend_from_slice(name.as_bytes());
        }
        block
    }

    /// Makes the root a directory (inline) holding `entries`.
    pub(crate) fn root(&mut self, entries: &[(&str, u64, u8)]) {
        let block = Self::dir_block(entries, ROOT, ROOT);
        self.inode(ROOT, FLAT_INLINE, 0o40755, block.len() as u32, 0);
        self.put(Self::inode_pos(ROOT) + 32, &block);
    }

    /// Writes the image to a temporary file and opens it.
    pub(crate) fn open(&self) -> (tempfile::TempDir, Erofs) {
        let dir = tempfile::tempdir().unwrap();
        let path: PathBuf = dir.path().join("image.erofs");
        std::fs::write(&path, &self.bytes).unwrap();
        let fs = Erofs::open(&path, &OpenOptions::default(), &[]).unwrap();
        (dir, fs)
    }

    /// Writes the image to a temporary file and tries to open it.
    pub(crate) fn try_open(&self) -> foliofs_vfs::Result<Erofs> {
        let dir = tempfile::tempdir().unwrap();
        let path: PathBuf = dir.path().join("image.erofs");
        std::fs::write(&path, &self.bytes).unwrap();
        Erofs::open(&path, &OpenOptions::default(), &[])
    }
}
