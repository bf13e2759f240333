//! On-disk inodes: the 32-byte compact and 64-byte extended forms, read
//! from the image and turned into attributes.

use foliofs_vfs::{Attr, Error, FileType, Rdev, Result, Timespec};

// The layout ids are the format's; they stay reachable here, beside the
// inodes they describe.
pub use crate::format::Layout;
use zerocopy::FromBytes;

use crate::format::{
    erofs_inode_compact, erofs_inode_extended, INODE_COMPACT_SIZE, I_FORMAT_ALL, I_FORMAT_BIT4,
    I_FORMAT_EXTENDED, MAX_INODE_SIZE, NID_METABOX, XATTR_IBODY_HEADER,
};
use crate::superblock::Superblock;
use crate::{Corrupt, Erofs, Incompatible};

/// A parsed inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    /// The inode's number (its slot in the metadata area, or with bit 63
    /// set, in the metabox).
    pub nid: u64,
    /// Byte position of the inode in the image, or in the metabox inode's
    /// data when `in_metabox`; its inline xattrs, tail, chunk table and
    /// compression map follow it there.
    pub pos: u64,
    /// The inode's metadata is in the metabox (nid bit 63).
    pub in_metabox: bool,
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
    /// High 16 bits of the start block or compressed block count: `i_nb`
    /// of an extended inode, or of a compact one marked NLINK_1 (0 in
    /// other compact inodes, whose `i_nb` is the link count).
    pub addr_hi: u16,
    /// Width of the start block (48 bits where `addr_hi` can be set, else
    /// 32): a flat-plain start block of all ones in it means no blocks.
    pub addr_bits: u8,
    /// A directory without a "." entry (`i_format` bit 4 on a directory).
    pub dot_omitted: bool,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time (also atime and ctime, as the kernel shows).
    pub mtime: Timespec,
}

impl Inode {
    /// Where inode `nid` lives in the image, or `None` when the address
    /// overflows or the inode is in the metabox.
    pub fn position(sb: &Superblock, nid: u64) -> Option<u64> {
        if nid & NID_METABOX != 0 {
            return None;
        }
        let base = u64::from(sb.meta_blkaddr) << sb.blkszbits;
        nid.checked_mul(INODE_COMPACT_SIZE as u64)?
            .checked_add(base)
    }

    /// Parses inode `nid` from `raw` (32 bytes, or 64 for an extended one;
    /// call with at least 32 and re-call with 64 when [`Inode::is_extended`]).
    pub fn parse(sb: &Superblock, nid: u64, pos: u64, raw: &[u8]) -> Result<Inode> {
        // The fields both forms share sit where the compact one has them,
        // and the kernel reads them from it.
        let (dic, _) = erofs_inode_compact::ref_from_prefix(raw).expect("32 bytes or more");
        let format = dic.i_format.get();
        let bad = |kind: Corrupt| Error::corrupt(pos, kind);
        if format & !I_FORMAT_ALL != 0 {
            return Err(bad(Corrupt::BadInodeFormat { nid, format }));
        }
        let extended = format & I_FORMAT_EXTENDED != 0;
        if extended && raw.len() < MAX_INODE_SIZE {
            return Err(bad(Corrupt::ExtendedInodeTruncated { nid }));
        }
        let layout_id = (format >> 1) & 7;
        let layout = Layout::from_id(layout_id).ok_or_else(|| {
            Error::incompatible(Incompatible::DataLayout {
                nid,
                layout: layout_id,
            })
        })?;
        let mode = dic.i_mode.get();
        let kind = FileType::from_mode(u32::from(mode))
            .ok_or_else(|| bad(Corrupt::BadFileType { nid, mode }))?;
        // Bit 4 is NLINK_1 on anything but a directory, DOT_OMITTED on one.
        let bit4 = format & I_FORMAT_BIT4 != 0;
        let is_dir = kind == FileType::Directory;
        let i_nb = dic.i_nb.get();
        let (nlink, size, i_u, uid, gid, mtime) = if extended {
            let (die, _) = erofs_inode_extended::ref_from_prefix(raw).expect("checked above");
            let nsec = die.i_mtime_nsec.get();
            if nsec >= 1_000_000_000 {
                return Err(bad(Corrupt::BadNanoseconds { nid, nsec }));
            }
            (
                die.i_nlink.get(),
                die.i_size.get(),
                die.i_u.get(),
                die.i_uid.get(),
                die.i_gid.get(),
                Timespec::new(die.i_mtime.get() as i64, nsec),
            )
        } else {
            let nsec = if sb.fixed_nsec < 1_000_000_000 {
                sb.fixed_nsec
            } else {
                0
            };
            (
                if bit4 && !is_dir { 1 } else { u32::from(i_nb) },
                u64::from(dic.i_size.get()),
                dic.i_u.get(),
                u32::from(dic.i_uid.get()),
                u32::from(dic.i_gid.get()),
                Timespec::new(
                    sb.epoch.wrapping_add(u64::from(dic.i_mtime.get())) as i64,
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
        let wide = extended || (bit4 && !is_dir);
        Ok(Inode {
            nid,
            pos,
            in_metabox: nid & NID_METABOX != 0,
            extended,
            layout,
            xattr_icount: dic.i_xattr_icount.get(),
            mode,
            kind,
            nlink,
            size,
            i_u,
            addr_hi: if wide { i_nb } else { 0 },
            addr_bits: if wide { 48 } else { 32 },
            dot_omitted: bit4 && is_dir,
            uid,
            gid,
            mtime,
        })
    }

    /// The start block of a flat or inline inode (`i_u` and `addr_hi`).
    pub fn start_block(&self) -> u64 {
        u64::from(self.i_u) | u64::from(self.addr_hi) << 32
    }

    /// A flat-plain inode with no blocks: its start block is all ones in
    /// its width, and it reads as zeros.
    pub fn no_blocks(&self) -> bool {
        let mask = (1u64 << self.addr_bits) - 1;
        self.layout == Layout::FlatPlain && self.start_block() & mask == mask
    }

    /// Blocks of compressed data (`i_u` and `addr_hi`).
    pub fn compressed_blocks(&self) -> u64 {
        self.start_block()
    }

    /// True when `raw`'s first bytes announce the 64-byte form.
    pub fn is_extended(raw: &[u8]) -> bool {
        let (dic, _) = erofs_inode_compact::ref_from_prefix(raw).expect("32 bytes or more");
        dic.i_format.get() & I_FORMAT_EXTENDED != 0
    }

    /// Bytes of the inode core.
    pub fn inode_size(&self) -> u64 {
        if self.extended {
            MAX_INODE_SIZE as u64
        } else {
            INODE_COMPACT_SIZE as u64
        }
    }

    /// Bytes of inline xattrs after the core.
    pub fn xattr_size(&self) -> u64 {
        if self.xattr_icount == 0 {
            0
        } else {
            XATTR_IBODY_HEADER + 4 * (u64::from(self.xattr_icount) - 1)
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
    /// Parses inode `nid` (from the metabox when its bit 63 is set).
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        if nid & NID_METABOX != 0 {
            return self.metabox_inode(nid);
        }
        let pos = Inode::position(&self.sb, nid)
            .ok_or_else(|| Error::corrupt(0, Corrupt::NidOverflow { nid }))?;
        let mut raw = [0u8; MAX_INODE_SIZE];
        self.dev
            .check_range(pos, INODE_COMPACT_SIZE as u64)
            .map_err(|_| {
                Error::corrupt(
                    pos,
                    Corrupt::InodeOutOfImage {
                        nid,
                        size: self.dev.size(),
                    },
                )
            })?;
        let compact = INODE_COMPACT_SIZE;
        self.meta(pos, &mut raw[..compact])?;
        if Inode::is_extended(&raw) {
            self.meta(pos + compact as u64, &mut raw[compact..])?;
        }
        Inode::parse(&self.sb, nid, pos, &raw)
    }

    pub(crate) fn attr(&self, inode: &Inode) -> Attr {
        let bs = u64::from(self.sb.block_size());
        let blocks = if inode.layout.is_compressed() {
            inode.compressed_blocks() << (self.sb.blkszbits - 9)
        } else {
            (inode.size.div_ceil(bs) * bs) >> 9
        };
        Attr {
            ino: self.ino_of(inode.nid),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        let d = crate::format::erofs_super_block {
            magic: crate::format::MAGIC.into(),
            blkszbits: 12,
            epoch: 1_000.into(),
            fixed_nsec: 5.into(),
            ..Default::default()
        };
        let raw = zerocopy::IntoBytes::as_bytes(&d);
        Superblock::parse(&raw[..crate::format::SUPER_SIZE]).unwrap()
    }

    /// A compact inode: format, mode, i_nb, size, mtime, i_u.
    fn compact(format: u16, mode: u16, i_nb: u16, size: u32, i_u: u32) -> Vec<u8> {
        let dic = erofs_inode_compact {
            i_format: format.into(),
            i_mode: mode.into(),
            i_nb: i_nb.into(),
            i_size: size.into(),
            i_mtime: 20.into(),
            i_u: i_u.into(),
            ..Default::default()
        };
        zerocopy::IntoBytes::as_bytes(&dic).to_vec()
    }

    #[test]
    fn i_nb_is_the_link_count_or_the_high_address_bits() {
        let sb = sb();
        let plain = Inode::parse(&sb, 1, 0, &compact(0, 0o100644, 3, 10, 7)).unwrap();
        assert_eq!((plain.nlink, plain.start_block()), (3, 7));
        assert_eq!(plain.mtime, Timespec::new(1_020, 5));
        // NLINK_1: one link, i_nb is the start block's high 16 bits.
        let wide = Inode::parse(&sb, 1, 0, &compact(0x10, 0o100644, 3, 10, 7)).unwrap();
        assert_eq!((wide.nlink, wide.start_block()), (1, 3 << 32 | 7));
        assert!(!wide.dot_omitted);
        // On a directory bit 4 is DOT_OMITTED and i_nb stays the link count.
        let dir = Inode::parse(&sb, 1, 0, &compact(0x10, 0o40755, 3, 10, 7)).unwrap();
        assert_eq!((dir.nlink, dir.start_block()), (3, 7));
        assert!(dir.dot_omitted);
        let e = Inode::parse(&sb, 1, 0, &compact(0x20, 0o100644, 1, 10, 7)).unwrap_err();
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::BadInodeFormat {
                nid: 1,
                format: 0x20
            })
        );
    }

    #[test]
    fn a_flat_plain_start_block_of_all_ones_means_no_blocks() {
        let sb = sb();
        let narrow = Inode::parse(&sb, 1, 0, &compact(0, 0o100644, 1, 10, u32::MAX)).unwrap();
        assert!(narrow.no_blocks());
        // 48 bits wide: all ones needs the high word too.
        let wide = compact(0x10, 0o100644, 0, 10, u32::MAX);
        assert!(!Inode::parse(&sb, 1, 0, &wide).unwrap().no_blocks());
        let wide = compact(0x10, 0o100644, u16::MAX, 10, u32::MAX);
        assert!(Inode::parse(&sb, 1, 0, &wide).unwrap().no_blocks());
        // Only the flat-plain layout has the rule (FLAT_INLINE is layout 2).
        let inline = compact(4, 0o100644, 1, 10, u32::MAX);
        assert!(!Inode::parse(&sb, 1, 0, &inline).unwrap().no_blocks());
    }
}
