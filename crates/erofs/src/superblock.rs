//! The EROFS superblock (128 bytes at byte 1024, and 16 more per extension
//! slot), its checksum and the device table. The compression configuration
//! records that follow it are read in `decompress`, beside the decoders
//! they configure.

use std::mem::offset_of;

use foliofs_vfs::{Error, Result};
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::format::{erofs_deviceslot, erofs_super_block, Algorithm};
use crate::{Corrupt, Incompatible};

// The superblock's constants are the format's; they stay reachable here,
// where the command line and the tests find them.
pub use crate::format::{
    algorithm_name, compat_name, incompat_name, COMPAT_ISHARE_XATTRS, COMPAT_MTIME,
    COMPAT_PLAIN_XATTR_PFX, COMPAT_SB_CHKSUM, COMPAT_SHARED_EA_IN_METABOX, COMPAT_XATTR_FILTER,
    DEVT_SLOT_SIZE, INCOMPAT_48BIT, INCOMPAT_CHUNKED_FILE, INCOMPAT_COMPR_CFGS,
    INCOMPAT_DEVICE_TABLE, INCOMPAT_FRAGMENTS, INCOMPAT_LZ4_0PADDING, INCOMPAT_METABOX,
    INCOMPAT_XATTR_PREFIXES, INCOMPAT_ZTAILPACKING, MAGIC, NID_METABOX, SUPER_MAX_SIZE,
    SUPER_OFFSET, SUPER_SIZE, SUPER_SIZE_EXT,
};

/// Incompat bits this reader implements.
pub const SUPPORTED_INCOMPAT: u32 = INCOMPAT_LZ4_0PADDING
    | INCOMPAT_COMPR_CFGS
    | INCOMPAT_CHUNKED_FILE
    | INCOMPAT_DEVICE_TABLE
    | INCOMPAT_ZTAILPACKING
    | INCOMPAT_FRAGMENTS
    | INCOMPAT_XATTR_PREFIXES
    | INCOMPAT_48BIT
    | INCOMPAT_METABOX;

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
    /// The root directory's nid (the 8-byte field with 48BIT when it is
    /// set, else the 2-byte one).
    pub root_nid: u64,
    /// Number of inodes.
    pub inos: u64,
    /// Base seconds for compact inodes' mtime (`build_time` in 1.5 tools).
    pub epoch: u64,
    /// Nanoseconds of every compact inode's mtime.
    pub fixed_nsec: u32,
    /// Seconds after `epoch` the image was built at (0 in images whose
    /// epoch is the build time).
    pub build_time: u32,
    /// Blocks of the primary device (with 48BIT, the high 16 bits come from
    /// the field that otherwise holds the 2-byte root nid).
    pub blocks: u64,
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
    /// The metabox inode's nid (0 = none; only with METABOX).
    pub metabox_nid: u64,
}

impl Superblock {
    /// The UUID as 32 lower-case hex digits, as a merged image's device
    /// table tags its layers (and mkfs.erofs's rebuild mode tags them).
    pub fn uuid_hex(&self) -> String {
        uuid_hex(&self.uuid)
    }

    /// Parses and validates the superblock `raw` (read from byte 1024): at
    /// least its 128 fixed bytes, and [`Superblock::read_size`] bytes for
    /// the fields of its extension slots.
    pub fn parse(raw: &[u8]) -> Result<Superblock> {
        let bad = |at: usize, kind: Corrupt| Error::corrupt(SUPER_OFFSET + at as u64, kind);
        if raw.len() < SUPER_SIZE {
            return Err(bad(0, Corrupt::SuperblockTruncated));
        }
        // The record is the fixed part and the first extension slot; what
        // `raw` lacks of the slot reads as zeros, and is only looked at
        // below once it is known to have been read.
        let mut d = erofs_super_block::new_zeroed();
        let n = raw.len().min(SUPER_SIZE_EXT);
        d.as_mut_bytes()[..n].copy_from_slice(&raw[..n]);
        let magic = d.magic.get();
        if magic != MAGIC {
            return Err(bad(0, Corrupt::BadMagic { found: magic }));
        }
        let blkszbits = d.blkszbits;
        if !(9..=16).contains(&blkszbits) {
            return Err(bad(
                offset_of!(erofs_super_block, blkszbits),
                Corrupt::BlockSize { blkszbits },
            ));
        }
        // What this reader cannot read is said before anything the feature
        // bits change the meaning of is looked at.
        let feature_incompat = d.feature_incompat.get();
        let unknown = feature_incompat & !SUPPORTED_INCOMPAT;
        if unknown != 0 {
            return Err(Error::incompatible(Incompatible::Features {
                bits: unknown,
            }));
        }
        let wide = feature_incompat & INCOMPAT_48BIT != 0;
        let rootnid_8b = d.rootnid_8b.get();
        // With 48BIT and a non-zero 8-byte root nid, the 2-byte root nid
        // field holds the high bits of the block count instead.
        let (root_nid, blocks_hi) = if wide && rootnid_8b != 0 {
            (rootnid_8b, u64::from(d.rb.get()))
        } else {
            (u64::from(d.rb.get()), 0)
        };
        let sb_extslots = d.sb_extslots;
        let at_extslots = offset_of!(erofs_super_block, sb_extslots);
        let size = SUPER_SIZE as u64 + 16 * u64::from(sb_extslots);
        if size > SUPER_MAX_SIZE {
            return Err(bad(
                at_extslots,
                Corrupt::SuperblockExtSlots { sb_extslots },
            ));
        }
        let metabox = feature_incompat & INCOMPAT_METABOX != 0;
        let metabox_nid = if metabox {
            // The nid sits in the first extension slot, which must exist
            // and have been read.
            if size < SUPER_SIZE_EXT as u64 {
                return Err(bad(
                    at_extslots,
                    Corrupt::MetaboxWithoutSlot { sb_extslots },
                ));
            }
            if raw.len() < SUPER_SIZE_EXT {
                return Err(bad(0, Corrupt::SuperblockTruncated));
            }
            d.metabox_nid.get()
        } else {
            0
        };
        let sb = Superblock {
            checksum: d.checksum.get(),
            feature_compat: d.feature_compat.get(),
            blkszbits,
            sb_extslots,
            root_nid,
            inos: d.inos.get(),
            epoch: d.epoch.get(),
            fixed_nsec: d.fixed_nsec.get(),
            build_time: d.build_time.get(),
            blocks: u64::from(d.blocks_lo.get()) | blocks_hi << 32,
            meta_blkaddr: d.meta_blkaddr.get(),
            xattr_blkaddr: d.xattr_blkaddr.get(),
            uuid: d.uuid,
            volume_name: d.volume_name.to_vec(),
            feature_incompat,
            compr_u16: d.u1.get(),
            extra_devices: d.extra_devices.get(),
            devt_slotoff: d.devt_slotoff.get(),
            dirblkbits: d.dirblkbits,
            xattr_prefix_count: d.xattr_prefix_count,
            xattr_prefix_start: d.xattr_prefix_start.get(),
            packed_nid: d.packed_nid.get(),
            metabox_nid,
        };
        if sb.dirblkbits != 0 {
            return Err(Error::incompatible(Incompatible::DirBlockBits {
                dirblkbits: sb.dirblkbits,
            }));
        }
        if !sb.volume_name.contains(&0) {
            return Err(bad(
                offset_of!(erofs_super_block, volume_name),
                Corrupt::VolumeNameNotTerminated,
            ));
        }
        // Bit 63 of a nid says "in the metabox": the packed inode may not
        // be there, and the metabox inode may not be inside itself.
        if sb.packed_nid & NID_METABOX != 0 {
            return Err(bad(
                offset_of!(erofs_super_block, packed_nid),
                Corrupt::PackedInMetabox { nid: sb.packed_nid },
            ));
        }
        if sb.metabox_nid & NID_METABOX != 0 {
            return Err(bad(
                offset_of!(erofs_super_block, metabox_nid),
                Corrupt::MetaboxInMetabox {
                    nid: sb.metabox_nid,
                },
            ));
        }
        Ok(sb)
    }

    /// How many bytes from byte 1024 [`Superblock::parse`] needs, given the
    /// fixed 128 (which say how many extension slots follow): the whole
    /// superblock, but no more than the fields this reader knows.
    pub fn read_size(fixed: &[u8]) -> usize {
        let slots = fixed
            .get(offset_of!(erofs_super_block, sb_extslots))
            .copied()
            .unwrap_or(0);
        (SUPER_SIZE + 16 * usize::from(slots)).min(SUPER_SIZE_EXT)
    }

    /// When the image was built, in seconds since 1970 (`epoch` plus
    /// `build_time`).
    pub fn build_time(&self) -> i64 {
        (self.epoch as i64).wrapping_add(i64::from(self.build_time))
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
            1 << Algorithm::Lz4.number()
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
    let at = offset_of!(erofs_super_block, checksum);
    data[at..at + 4].fill(0);
    // The on-disk value is the raw CRC register (seed ~0, no final xor),
    // which is the bitwise complement of the standard CRC-32C.
    let crc = !crc32c::crc32c(&data);
    if crc != sb.checksum {
        return Err(Error::corrupt(
            SUPER_OFFSET + offset_of!(erofs_super_block, checksum) as u64,
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
    pub blocks: u64,
    /// Where the device's blocks start in a flat address space (0 = not mapped).
    pub mapped_blkaddr: u64,
}

impl DeviceSlot {
    /// Parses one 128-byte slot; `wide` (48BIT) adds the high 16 bits of
    /// both block numbers, which older images leave as reserved zeros.
    pub fn parse(raw: &[u8], wide: bool) -> DeviceSlot {
        let (d, _) = erofs_deviceslot::read_from_prefix(raw).expect("callers pass a whole slot");
        let end = d.tag.iter().position(|&b| b == 0).unwrap_or(d.tag.len());
        let hi = |v: U16| {
            if wide {
                u64::from(v.get()) << 32
            } else {
                0
            }
        };
        DeviceSlot {
            tag: d.tag[..end].to_vec(),
            blocks: u64::from(d.blocks_lo.get()) | hi(d.blocks_hi),
            mapped_blkaddr: u64::from(d.uniaddr_lo.get()) | hi(d.uniaddr_hi),
        }
    }
}

/// A UUID's 16 bytes as 32 lower-case hex digits.
pub fn uuid_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> erofs_super_block {
        erofs_super_block {
            magic: MAGIC.into(),
            blkszbits: 12,
            ..Default::default()
        }
    }

    /// The fixed 128 bytes of `d`.
    fn fixed(d: &erofs_super_block) -> Vec<u8> {
        d.as_bytes()[..SUPER_SIZE].to_vec()
    }

    fn with_incompat(bits: u32) -> erofs_super_block {
        erofs_super_block {
            feature_incompat: bits.into(),
            ..minimal()
        }
    }

    #[test]
    fn parses_minimal_and_refuses_unknown_features() {
        let raw = fixed(&minimal());
        assert_eq!(Superblock::parse(&raw).unwrap().block_size(), 4096);
        // The first bit past every feature EROFS has defined.
        let next = fixed(&with_incompat(0x200 | INCOMPAT_LZ4_0PADDING));
        let e = Superblock::parse(&next).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Features { bits: 0x200 })
        );
        // The metabox nid needs an extension slot.
        let metabox = fixed(&with_incompat(INCOMPAT_METABOX));
        let e = Superblock::parse(&metabox).unwrap_err();
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::MetaboxWithoutSlot { sb_extslots: 0 })
        );
        let future = fixed(&with_incompat(0x8000));
        let e = Superblock::parse(&future).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Features { bits: 0x8000 })
        );
        let big = fixed(&erofs_super_block {
            blkszbits: 17,
            ..minimal()
        });
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

    #[test]
    fn the_48bit_fields_follow_the_kernel() {
        let mut d = erofs_super_block {
            rb: 0x0102.into(),
            blocks_lo: 7.into(),
            epoch: 100.into(),
            build_time: 1_700_000_000.into(),
            ..with_incompat(INCOMPAT_48BIT)
        };
        // Without the 8-byte root nid, the 2-byte field is the root.
        let sb = Superblock::parse(&fixed(&d)).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (0x0102, 7));
        assert_eq!(sb.build_time(), 1_700_000_100);
        // With it, the 2-byte field is the block count's high bits.
        d.rootnid_8b = (1u64 << 40).into();
        let sb = Superblock::parse(&fixed(&d)).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (1 << 40, 0x0102 << 32 | 7));
        // Without 48BIT the 8-byte field means nothing.
        d.feature_incompat = 0.into();
        let sb = Superblock::parse(&fixed(&d)).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (0x0102, 7));
    }

    #[test]
    fn hostile_superblock_fields_are_refused() {
        let raw = fixed(&erofs_super_block {
            sb_extslots: 250,
            ..minimal()
        });
        let e = Superblock::parse(&raw).unwrap_err();
        assert_eq!(e.offset(), Some(SUPER_OFFSET + 0x0D));
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::SuperblockExtSlots { sb_extslots: 250 })
        );
        let mut d = erofs_super_block {
            packed_nid: (NID_METABOX | 5).into(),
            ..minimal()
        };
        let e = Superblock::parse(&fixed(&d)).unwrap_err();
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::PackedInMetabox {
                nid: NID_METABOX | 5
            })
        );
        assert_eq!(Superblock::read_size(&fixed(&d)), SUPER_SIZE);
        d.sb_extslots = 3;
        assert_eq!(Superblock::read_size(&fixed(&d)), SUPER_SIZE_EXT);
    }

    #[test]
    fn device_slots_read_their_high_words_with_48bit() {
        let mut d = erofs_deviceslot {
            blocks_lo: 10.into(),
            uniaddr_lo: 20.into(),
            blocks_hi: 1.into(),
            uniaddr_hi: 2.into(),
            ..Default::default()
        };
        d.tag[..3].copy_from_slice(b"tag");
        let narrow = DeviceSlot::parse(d.as_bytes(), false);
        assert_eq!((narrow.blocks, narrow.mapped_blkaddr), (10, 20));
        assert_eq!(narrow.tag, b"tag");
        let wide = DeviceSlot::parse(d.as_bytes(), true);
        assert_eq!(
            (wide.blocks, wide.mapped_blkaddr),
            (1 << 32 | 10, 2 << 32 | 20)
        );
    }
}
