//! The EROFS superblock (128 bytes at byte 1024), its checksum, the
//! compression configuration records after it and the device table.

use foliofs_vfs::{Error, Result};

use crate::{Corrupt, Incompatible};

/// Byte offset of the superblock in the image.
pub const SUPER_OFFSET: u64 = 1024;
/// Size of the fixed part of the on-disk superblock.
pub const SUPER_SIZE: usize = 128;
/// `EROFS_SUPER_MAGIC_V1`.
pub const MAGIC: u32 = 0xE0F5_E1E2;

/// Compat: the superblock carries a crc32c.
pub const COMPAT_SB_CHKSUM: u32 = 0x1;
/// Compat: inodes carry their own mtime.
pub const COMPAT_MTIME: u32 = 0x2;
/// Compat: xattr bloom filters (a hint; safe to ignore).
pub const COMPAT_XATTR_FILTER: u32 = 0x4;

/// Incompat: LZ4 data right-aligned in its physical cluster.
pub const INCOMPAT_LZ4_0PADDING: u32 = 0x1;
/// Incompat: compression configuration records and big physical clusters.
pub const INCOMPAT_COMPR_CFGS: u32 = 0x2;
/// Incompat: chunk-based files.
pub const INCOMPAT_CHUNKED_FILE: u32 = 0x4;
/// Incompat: a device table for extra devices.
pub const INCOMPAT_DEVICE_TABLE: u32 = 0x8;
/// Incompat: the last physical cluster of a file inline with its inode.
pub const INCOMPAT_ZTAILPACKING: u32 = 0x10;
/// Incompat: fragments packed into a special inode (and deduplication).
pub const INCOMPAT_FRAGMENTS: u32 = 0x20;
/// Incompat: long xattr name prefixes.
pub const INCOMPAT_XATTR_PREFIXES: u32 = 0x40;
/// Incompat: 48-bit block addresses.
pub const INCOMPAT_48BIT: u32 = 0x80;
/// Incompat: metadata kept in a separate "metabox" inode.
pub const INCOMPAT_METABOX: u32 = 0x100;

/// Incompat bits this reader implements.
pub const SUPPORTED_INCOMPAT: u32 = INCOMPAT_LZ4_0PADDING
    | INCOMPAT_COMPR_CFGS
    | INCOMPAT_CHUNKED_FILE
    | INCOMPAT_DEVICE_TABLE
    | INCOMPAT_ZTAILPACKING
    | INCOMPAT_FRAGMENTS
    | INCOMPAT_XATTR_PREFIXES;

/// Compression algorithm numbers (bit positions in the algorithm bitmap).
pub const ALG_LZ4: u8 = 0;

/// The name of an incompat feature bit, for refusal messages.
pub fn incompat_name(bit: u32) -> String {
    match bit {
        INCOMPAT_LZ4_0PADDING => "lz4_0padding".into(),
        INCOMPAT_COMPR_CFGS => "compr_cfgs (big pclusters)".into(),
        INCOMPAT_CHUNKED_FILE => "chunked_file".into(),
        INCOMPAT_DEVICE_TABLE => "device_table".into(),
        INCOMPAT_ZTAILPACKING => "ztailpacking".into(),
        INCOMPAT_FRAGMENTS => "fragments/dedupe".into(),
        INCOMPAT_XATTR_PREFIXES => "xattr_prefixes".into(),
        INCOMPAT_48BIT => "48bit block addresses".into(),
        INCOMPAT_METABOX => "metabox".into(),
        other => format!("unknown incompat feature bit {other:#x}"),
    }
}

/// The name of a compression algorithm number.
pub fn algorithm_name(alg: u8) -> String {
    match alg {
        0 => "LZ4".into(),
        1 => "MicroLZMA".into(),
        2 => "DEFLATE".into(),
        3 => "Zstd".into(),
        n => format!("compression algorithm {n}"),
    }
}

/// The parsed superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The stored crc32c (with SB_CHKSUM).
    pub checksum: u32,
    /// Compatible feature bits.
    pub feature_compat: u32,
    /// Incompatible feature bits.
    pub feature_incompat: u32,
    /// log2 of the block size.
    pub blkszbits: u8,
    /// 16-byte extension slots after the fixed superblock.
    pub sb_extslots: u8,
    /// The root directory's nid.
    pub root_nid: u64,
    /// Number of inodes.
    pub inos: u64,
    /// Base seconds for compact inodes' mtime (`build_time` in 1.5 tools).
    pub epoch: u64,
    /// Nanoseconds of every compact inode's mtime.
    pub fixed_nsec: u32,
    /// Blocks of the primary device.
    pub blocks: u32,
    /// First block of the inode (metadata) area.
    pub meta_blkaddr: u32,
    /// First block of the shared xattr area.
    pub xattr_blkaddr: u32,
    /// Volume UUID.
    pub uuid: [u8; 16],
    /// The raw 16-byte volume name field.
    pub volume_name: Vec<u8>,
    /// Algorithm bitmap with COMPR_CFGS, else the LZ4 max distance.
    pub compr_u16: u16,
    /// Number of extra devices in the device table.
    pub extra_devices: u16,
    /// Device table position, in 128-byte slots.
    pub devt_slotoff: u16,
    /// Directory block size above the block size (0 here).
    pub dirblkbits: u8,
    /// Number of long xattr name prefixes.
    pub xattr_prefix_count: u8,
    /// Position of the long prefix table, in 4-byte units.
    pub xattr_prefix_start: u32,
    /// The packed inode's nid (0 = none).
    pub packed_nid: u64,
}

/// Little-endian fields at byte `at` of `b` (callers check the length).
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Superblock {
    /// Parses and validates the 128-byte superblock `raw` (read from byte 1024).
    pub fn parse(raw: &[u8]) -> Result<Superblock> {
        let bad = |at: usize, kind: Corrupt| Error::corrupt(SUPER_OFFSET + at as u64, kind);
        if raw.len() < SUPER_SIZE {
            return Err(bad(0, Corrupt::SuperblockTruncated));
        }
        let magic = le32(raw, 0);
        if magic != MAGIC {
            return Err(bad(0, Corrupt::BadMagic { found: magic }));
        }
        let sb = Superblock {
            checksum: le32(raw, 0x04),
            feature_compat: le32(raw, 0x08),
            blkszbits: raw[0x0C],
            sb_extslots: raw[0x0D],
            root_nid: u64::from(le16(raw, 0x0E)),
            inos: le64(raw, 0x10),
            epoch: le64(raw, 0x18),
            fixed_nsec: le32(raw, 0x20),
            blocks: le32(raw, 0x24),
            meta_blkaddr: le32(raw, 0x28),
            xattr_blkaddr: le32(raw, 0x2C),
            uuid: raw[0x30..0x40].try_into().expect("16 bytes"),
            volume_name: raw[0x40..0x50].to_vec(),
            feature_incompat: le32(raw, 0x50),
            compr_u16: le16(raw, 0x54),
            extra_devices: le16(raw, 0x56),
            devt_slotoff: le16(raw, 0x58),
            dirblkbits: raw[0x5A],
            xattr_prefix_count: raw[0x5B],
            xattr_prefix_start: le32(raw, 0x5C),
            packed_nid: le64(raw, 0x60),
        };
        if !(9..=16).contains(&sb.blkszbits) {
            return Err(bad(
                0x0C,
                Corrupt::BlockSize {
                    blkszbits: sb.blkszbits,
                },
            ));
        }
        let unknown = sb.feature_incompat & !SUPPORTED_INCOMPAT;
        if unknown != 0 {
            return Err(Error::incompatible(Incompatible::Features {
                bits: unknown,
            }));
        }
        if sb.dirblkbits != 0 {
            return Err(Error::incompatible(Incompatible::DirBlockBits {
                dirblkbits: sb.dirblkbits,
            }));
        }
        if !sb.volume_name.contains(&0) {
            return Err(bad(0x40, Corrupt::VolumeNameNotTerminated));
        }
        Ok(sb)
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1 << self.blkszbits
    }

    /// True if compat feature `bit` is set.
    pub fn has_compat(&self, bit: u32) -> bool {
        self.feature_compat & bit != 0
    }

    /// True if incompat feature `bit` is set.
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.feature_incompat & bit != 0
    }

    /// On-disk size of the superblock including its extension slots.
    pub fn size(&self) -> u64 {
        SUPER_SIZE as u64 + 16 * u64::from(self.sb_extslots)
    }

    /// Bitmap of compression algorithms the image may use.
    pub fn available_algorithms(&self) -> u16 {
        if self.has_incompat(INCOMPAT_COMPR_CFGS) {
            self.compr_u16
        } else {
            1 << ALG_LZ4
        }
    }

    /// The volume name up to its NUL.
    pub fn volume_name(&self) -> &[u8] {
        let end = self
            .volume_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.volume_name.len());
        &self.volume_name[..end]
    }
}

/// Verifies the crc32c of the superblock block: `block` holds the bytes from
/// the superblock to the end of its block (at least 128 bytes), as read.
pub fn verify_checksum(sb: &Superblock, block: &[u8]) -> Result<()> {
    let mut data = block.to_vec();
    data[4..8].fill(0);
    // The on-disk value is the raw CRC register (seed ~0, no final xor),
    // which is the bitwise complement of the standard CRC-32C.
    let crc = !crc32c::crc32c(&data);
    if crc != sb.checksum {
        return Err(Error::corrupt(
            SUPER_OFFSET + 4,
            Corrupt::SuperblockChecksum {
                stored: sb.checksum,
                computed: crc,
            },
        ));
    }
    Ok(())
}

/// Number of superblock bytes covered by the checksum.
pub fn checksum_len(sb: &Superblock) -> usize {
    let bs = sb.block_size() as usize;
    if bs > SUPER_OFFSET as usize {
        bs - SUPER_OFFSET as usize
    } else {
        bs
    }
}

/// One extra device from the device table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSlot {
    /// The slot's tag (a path or digest the image was built with).
    pub tag: Vec<u8>,
    /// Size in blocks.
    pub blocks: u32,
    /// Where the device's blocks start in a flat address space (0 = not mapped).
    pub mapped_blkaddr: u32,
}

/// Size of one device table slot.
pub const DEVT_SLOT_SIZE: u64 = 128;

impl DeviceSlot {
    /// Parses one 128-byte slot.
    pub fn parse(raw: &[u8]) -> DeviceSlot {
        let tag = &raw[..64];
        let end = tag.iter().position(|&b| b == 0).unwrap_or(64);
        DeviceSlot {
            tag: tag[..end].to_vec(),
            blocks: le32(raw, 64),
            mapped_blkaddr: le32(raw, 68),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> Vec<u8> {
        let mut raw = vec![0u8; SUPER_SIZE];
        raw[..4].copy_from_slice(&MAGIC.to_le_bytes());
        raw[0x0C] = 12;
        raw
    }

    #[test]
    fn parses_minimal_and_refuses_unknown_features() {
        let raw = minimal();
        assert_eq!(Superblock::parse(&raw).unwrap().block_size(), 4096);
        let mut metabox = raw.clone();
        metabox[0x50..0x54]
            .copy_from_slice(&(INCOMPAT_METABOX | INCOMPAT_LZ4_0PADDING).to_le_bytes());
        let e = Superblock::parse(&metabox).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Features {
                bits: INCOMPAT_METABOX
            })
        );
        let mut future = raw.clone();
        future[0x50..0x54].copy_from_slice(&0x8000u32.to_le_bytes());
        let e = Superblock::parse(&future).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Features { bits: 0x8000 })
        );
        let mut big = raw;
        big[0x0C] = 17;
        let e = Superblock::parse(&big).unwrap_err();
        assert_eq!(e.offset(), Some(SUPER_OFFSET + 0x0C));
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::BlockSize { blkszbits: 17 })
        );
    }

    #[test]
    fn refusals_name_the_feature_bits() {
        let e = Error::incompatible(Incompatible::Features {
            bits: INCOMPAT_FRAGMENTS | 0x8000,
        });
        assert_eq!(
            e.to_string(),
            "unsupported feature: EROFS image uses fragments/dedupe, \
             unknown incompat feature bit 0x8000"
        );
    }
}
