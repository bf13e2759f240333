//! On-disk inodes: the 32-byte compact and 64-byte extended forms, read
//! from the image and turned into attributes.

use foliofs_vfs::{Attr, Error, FileType, Rdev, Result, Timespec};

use crate::superblock::{le16, le32, le64, Superblock};
use crate::{Corrupt, Erofs, Incompatible};

/// How an inode's data is laid out (`i_format` bits 1..3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous blocks from `i_u` on.
    FlatPlain,
    /// Compressed, one 8-byte index per logical cluster.
    CompressedFull,
    /// Blocks from `i_u`, the tail inline after the inode.
    FlatInline,
    /// Compressed, packed ("compacted") indexes.
    CompressedCompact,
    /// A table of chunk addresses after the inode.
    ChunkBased,
}

impl Layout {
    /// True for the two compressed layouts.
    pub fn is_compressed(self) -> bool {
        matches!(self, Layout::CompressedFull | Layout::CompressedCompact)
    }

    /// A short name for listings.
    pub fn name(self) -> &'static str {
        match self {
            Layout::FlatPlain => "flat-plain",
            Layout::CompressedFull => "compressed-full",
            Layout::FlatInline => "flat-inline",
            Layout::CompressedCompact => "compressed-compact",
            Layout::ChunkBased => "chunk-based",
        }
    }
}

/// A parsed inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// The inode's number (its slot in the metadata area).
    pub nid: u64,
    /// Byte position of the inode in the image.
    pub pos: u64,
    /// The 64-byte form (else the 32-byte compact one).
    pub extended: bool,
    /// How the data is stored.
    pub layout: Layout,
    /// Size of the inline xattr body, in the on-disk count form.
    pub xattr_icount: u16,
    /// Type and permission bits.
    pub mode: u16,
    /// The type from `mode`.
    pub kind: FileType,
    /// Hard link count.
    pub nlink: u32,
    /// Size in bytes (of the data, or of the directory's blocks).
    pub size: u64,
    /// The `i_u` union: block address, compressed block count, rdev or chunk format.
    pub i_u: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (also atime and ctime, as the kernel shows).
    pub mtime: Timespec,
}

/// Largest number of bytes an inode occupies on disk.
pub const MAX_INODE_SIZE: usize = 64;

impl Inode {
    /// Where inode `nid` lives, or `None` when the address overflows.
    pub fn position(sb: &Superblock, nid: u64) -> Option<u64> {
        let base = u64::from(sb.meta_blkaddr) << sb.blkszbits;
        nid.checked_mul(32)?.checked_add(base)
    }

    /// Parses inode `nid` from `raw` (32 bytes, or 64 for an extended one;
    /// call with at least 32 and re-call with 64 when [`Inode::is_extended`]).
    pub fn parse(sb: &Superblock, nid: u64, pos: u64, raw: &[u8]) -> Result<Inode> {
        let format = le16(raw, 0);
        let bad = |kind: Corrupt| Error::corrupt(pos, kind);
        if format & !0x0F != 0 {
            return Err(bad(Corrupt::BadInodeFormat { nid, format }));
        }
        let extended = format & 1 != 0;
        if extended && raw.len() < 64 {
            return Err(bad(Corrupt::ExtendedInodeTruncated { nid }));
        }
        let layout = match (format >> 1) & 7 {
            0 => Layout::FlatPlain,
            1 => Layout::CompressedFull,
            2 => Layout::FlatInline,
            3 => Layout::CompressedCompact,
            4 => Layout::ChunkBased,
            layout => {
                return Err(Error::incompatible(Incompatible::DataLayout {
                    nid,
                    layout,
                }))
            }
        };
        let mode = le16(raw, 4);
        let kind = FileType::from_mode(u32::from(mode))
            .ok_or_else(|| bad(Corrupt::BadFileType { nid, mode }))?;
        let (nlink, size, i_u, uid, gid, mtime) = if extended {
            let nsec = le32(raw, 0x28);
            if nsec >= 1_000_000_000 {
                return Err(bad(Corrupt::BadNanoseconds { nid, nsec }));
            }
            (
                le32(raw, 0x2C),
                le64(raw, 0x08),
                le32(raw, 0x10),
                le32(raw, 0x18),
                le32(raw, 0x1C),
                Timespec::new(le64(raw, 0x20) as i64, nsec),
            )
        } else {
            let nsec = if sb.fixed_nsec < 1_000_000_000 {
                sb.fixed_nsec
            } else {
                0
            };
            (
                u32::from(le16(raw, 6)),
                u64::from(le32(raw, 0x08)),
                le32(raw, 0x10),
                u32::from(le16(raw, 0x18)),
                u32::from(le16(raw, 0x1A)),
                Timespec::new(
                    sb.epoch.wrapping_add(u64::from(le32(raw, 0x0C))) as i64,
                    nsec,
                ),
            )
        };
        if size > i64::MAX as u64 {
            return Err(bad(Corrupt::BadSize { nid, size }));
        }
        let data_kind = matches!(
            kind,
            FileType::RegularFile | FileType::Directory | FileType::Symlink
        );
        if !data_kind && size != 0 {
            return Err(bad(Corrupt::SizedSpecial { nid, kind, size }));
        }
        // Directories (mkfs --zD) and symlinks may be compressed: their data
        // is read like a file's. Device nodes, fifos and sockets have none.
        if layout.is_compressed() && !data_kind {
            return Err(Error::incompatible(Incompatible::CompressedNonRegular {
                nid,
                kind,
            }));
        }
        Ok(Inode {
            nid,
            pos,
            extended,
            layout,
            xattr_icount: le16(raw, 2),
            mode,
            kind,
            nlink,
            size,
            i_u,
            uid,
            gid,
            mtime,
        })
    }

    /// True when `raw`'s first bytes announce the 64-byte form.
    pub fn is_extended(raw: &[u8]) -> bool {
        raw[0] & 1 != 0
    }

    /// Bytes of the inode core.
    pub fn inode_size(&self) -> u64 {
        if self.extended {
            64
        } else {
            32
        }
    }

    /// Bytes of inline xattrs after the core.
    pub fn xattr_size(&self) -> u64 {
        if self.xattr_icount == 0 {
            0
        } else {
            12 + 4 * (u64::from(self.xattr_icount) - 1)
        }
    }

    /// Where the data after the inode and its xattrs begins (inline tail,
    /// chunk table, compression map header).
    pub fn trailer_pos(&self) -> u64 {
        self.pos + self.inode_size() + self.xattr_size()
    }

    /// Permission bits.
    pub fn perm(&self) -> u16 {
        self.mode & 0o7777
    }

    /// The device number of a device node.
    pub fn rdev(&self) -> Rdev {
        match self.kind {
            FileType::BlockDevice | FileType::CharDevice => Rdev::from_new_encoding(self.i_u),
            _ => Rdev::default(),
        }
    }
}

impl Erofs {
    /// Parses inode `nid`.
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        let pos = Inode::position(&self.sb, nid)
            .ok_or_else(|| Error::corrupt(0, Corrupt::NidOverflow { nid }))?;
        let mut raw = [0u8; MAX_INODE_SIZE];
        self.dev.check_range(pos, 32).map_err(|_| {
            Error::corrupt(
                pos,
                Corrupt::InodeOutOfImage {
                    nid,
                    size: self.dev.size(),
                },
            )
        })?;
        self.meta(pos, &mut raw[..32])?;
        if Inode::is_extended(&raw) {
            self.meta(pos + 32, &mut raw[32..])?;
        }
        Inode::parse(&self.sb, nid, pos, &raw)
    }

    pub(crate) fn attr(&self, inode: &Inode) -> Attr {
        let bs = u64::from(self.sb.block_size());
        let blocks = if inode.layout.is_compressed() {
            u64::from(inode.i_u) << (self.sb.blkszbits - 9)
        } else {
            (inode.size.div_ceil(bs) * bs) >> 9
        };
        Attr {
            ino: inode.nid,
            size: inode.size,
            blocks,
            kind: inode.kind,
            perm: inode.perm(),
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: inode.rdev(),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.mtime,
            blksize: self.sb.block_size(),
        }
    }
}
