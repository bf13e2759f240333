//! The EROFS superblock (128 bytes at byte 1024, and 16 more per extension
//! slot), its checksum, the compression configuration records after it and
//! the device table.

use foliofs_vfs::{Error, Result};

use crate::error::ConfigProblem;
use crate::format::{bytes, le16, le32, le64, Algorithm};
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

/// Smallest MicroLZMA dictionary the kernel takes.
pub const LZMA_MIN_DICT: u32 = 4 << 10;
/// Largest MicroLZMA dictionary the kernel takes.
pub const LZMA_MAX_DICT: u32 = 8 << 20;
/// Largest DEFLATE window (log2) the kernel takes.
pub const DEFLATE_MAX_WINDOWBITS: u8 = 15;
/// Largest Zstd window log above 1 KiB the kernel takes (1 MiB windows).
pub const ZSTD_MAX_WINDOWLOG: u8 = 10;

/// LZ4's configuration record (or, without records, the superblock's
/// max distance).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lz4Config {
    /// Longest match distance the compressor used (0 = the LZ4 default).
    pub max_distance: u16,
    /// Largest physical cluster, in blocks (0 = not recorded).
    pub max_pclusterblks: u16,
}

/// MicroLZMA's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LzmaConfig {
    /// Dictionary size in bytes.
    pub dict_size: u32,
}

/// DEFLATE's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateConfig {
    /// log2 of the window the compressor used.
    pub windowbits: u8,
}

/// Zstd's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZstdConfig {
    /// The window is `1 << (windowlog + 10)` bytes.
    pub windowlog: u8,
}

impl ZstdConfig {
    /// Largest frame window the image's Zstd data may ask for.
    pub fn window_size(&self) -> u64 {
        1 << (u32::from(self.windowlog) + 10)
    }
}

/// The configuration of every algorithm the superblock lists (`None` for
/// the ones it does not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompressionConfigs {
    /// LZ4 (always present on an image that can hold compressed files).
    pub lz4: Option<Lz4Config>,
    /// MicroLZMA.
    pub lzma: Option<LzmaConfig>,
    /// DEFLATE.
    pub deflate: Option<DeflateConfig>,
    /// Zstd.
    pub zstd: Option<ZstdConfig>,
}

impl CompressionConfigs {
    /// Reads the configuration records that follow the superblock (with
    /// COMPR_CFGS; without it only LZ4 exists, configured by the
    /// superblock's u16), validated as the kernel validates them at mount.
    /// `read` reads image bytes at a position.
    pub fn load(
        sb: &Superblock,
        mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<CompressionConfigs> {
        let mut cfgs = CompressionConfigs::default();
        if !sb.has_incompat(INCOMPAT_COMPR_CFGS) {
            cfgs.lz4 = Some(Lz4Config {
                max_distance: sb.compr_u16,
                max_pclusterblks: 0,
            });
            return Ok(cfgs);
        }
        let algs = sb.compr_u16;
        let known = Algorithm::ALL
            .iter()
            .fold(0u16, |bits, a| bits | 1 << a.number());
        let unknown = algs & !known;
        if unknown != 0 {
            return Err(Error::incompatible(Incompatible::Algorithm {
                algorithm: unknown.trailing_zeros() as u8,
            }));
        }
        // Records follow in ascending algorithm order, each 4-byte aligned,
        // a u16 length and then that many bytes.
        let mut pos = SUPER_OFFSET + sb.size();
        for algorithm in Algorithm::ALL {
            let alg = algorithm.number();
            if algs & (1 << alg) == 0 {
                continue;
            }
            pos = pos.div_ceil(4) * 4;
            let at = pos;
            let mut len = [0u8; 2];
            read(pos, &mut len)?;
            let len = le16(&len, 0);
            let mut rec = vec![0u8; usize::from(len)];
            read(pos + 2, &mut rec)?;
            pos += 2 + u64::from(len);
            let bad = |problem: ConfigProblem| {
                Error::corrupt(
                    at,
                    Corrupt::CompressionConfig {
                        algorithm: alg,
                        problem,
                    },
                )
            };
            // The kernel takes a longer record than it knows for LZ4,
            // DEFLATE and Zstd (room for new fields), but MicroLZMA's only
            // at its exact size.
            let (expected, exact) = match algorithm {
                Algorithm::Lz4 => (14, false),
                Algorithm::MicroLzma => (14, true),
                Algorithm::Deflate | Algorithm::Zstd => (6, false),
            };
            if len < expected || (exact && len != expected) {
                return Err(bad(ConfigProblem::Size { len, expected }));
            }
            match algorithm {
                Algorithm::Lz4 => {
                    let c = Lz4Config {
                        max_distance: le16(&rec, 0),
                        max_pclusterblks: le16(&rec, 2),
                    };
                    let most = (1u32 << 20) >> sb.blkszbits;
                    if u32::from(c.max_pclusterblks) > most {
                        return Err(bad(ConfigProblem::Lz4PclusterBlocks {
                            blocks: c.max_pclusterblks,
                        }));
                    }
                    cfgs.lz4 = Some(c);
                }
                Algorithm::MicroLzma => {
                    let dict_size = le32(&rec, 0);
                    let format = le16(&rec, 4);
                    if format != 0 {
                        return Err(bad(ConfigProblem::LzmaFormat { format }));
                    }
                    if !(LZMA_MIN_DICT..=LZMA_MAX_DICT).contains(&dict_size) {
                        return Err(bad(ConfigProblem::LzmaDictSize { dict_size }));
                    }
                    cfgs.lzma = Some(LzmaConfig { dict_size });
                }
                Algorithm::Deflate => {
                    let windowbits = rec[0];
                    if windowbits > DEFLATE_MAX_WINDOWBITS {
                        return Err(bad(ConfigProblem::DeflateWindowBits { windowbits }));
                    }
                    cfgs.deflate = Some(DeflateConfig { windowbits });
                }
                Algorithm::Zstd => {
                    let (format, windowlog) = (rec[0], rec[1]);
                    if format != 0 {
                        return Err(bad(ConfigProblem::ZstdFormat { format }));
                    }
                    if windowlog > ZSTD_MAX_WINDOWLOG {
                        return Err(bad(ConfigProblem::ZstdWindowLog { windowlog }));
                    }
                    cfgs.zstd = Some(ZstdConfig { windowlog });
                }
            }
        }
        Ok(cfgs)
    }

    /// The algorithms configured, by number.
    pub fn algorithms(&self) -> Vec<u8> {
        [
            (self.lz4.is_some(), Algorithm::Lz4),
            (self.lzma.is_some(), Algorithm::MicroLzma),
            (self.deflate.is_some(), Algorithm::Deflate),
            (self.zstd.is_some(), Algorithm::Zstd),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, alg)| alg.number())
        .collect()
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
    /// Parses and validates the superblock `raw` (read from byte 1024): at
    /// least its 128 fixed bytes, and [`Superblock::read_size`] bytes for
    /// the fields of its extension slots.
    pub fn parse(raw: &[u8]) -> Result<Superblock> {
        let bad = |at: usize, kind: Corrupt| Error::corrupt(SUPER_OFFSET + at as u64, kind);
        if raw.len() < SUPER_SIZE {
            return Err(bad(0, Corrupt::SuperblockTruncated));
        }
        let magic = le32(raw, 0);
        if magic != MAGIC {
            return Err(bad(0, Corrupt::BadMagic { found: magic }));
        }
        let blkszbits = raw[0x0C];
        if !(9..=16).contains(&blkszbits) {
            return Err(bad(0x0C, Corrupt::BlockSize { blkszbits }));
        }
        // What this reader cannot read is said before anything the feature
        // bits change the meaning of is looked at.
        let feature_incompat = le32(raw, 0x50);
        let unknown = feature_incompat & !SUPPORTED_INCOMPAT;
        if unknown != 0 {
            return Err(Error::incompatible(Incompatible::Features {
                bits: unknown,
            }));
        }
        let wide = feature_incompat & INCOMPAT_48BIT != 0;
        let rootnid_8b = le64(raw, 0x70);
        // With 48BIT and a non-zero 8-byte root nid, the 2-byte root nid
        // field holds the high bits of the block count instead.
        let (root_nid, blocks_hi) = if wide && rootnid_8b != 0 {
            (rootnid_8b, u64::from(le16(raw, 0x0E)))
        } else {
            (u64::from(le16(raw, 0x0E)), 0)
        };
        let sb_extslots = raw[0x0D];
        let size = SUPER_SIZE as u64 + 16 * u64::from(sb_extslots);
        if size > SUPER_MAX_SIZE {
            return Err(bad(0x0D, Corrupt::SuperblockExtSlots { sb_extslots }));
        }
        let metabox = feature_incompat & INCOMPAT_METABOX != 0;
        let metabox_nid = if metabox {
            // The nid sits in the first extension slot, which must exist
            // and have been read.
            if size < SUPER_SIZE_EXT as u64 {
                return Err(bad(0x0D, Corrupt::MetaboxWithoutSlot { sb_extslots }));
            }
            if raw.len() < SUPER_SIZE_EXT {
                return Err(bad(0, Corrupt::SuperblockTruncated));
            }
            le64(raw, 0x80)
        } else {
            0
        };
        let sb = Superblock {
            checksum: le32(raw, 0x04),
            feature_compat: le32(raw, 0x08),
            blkszbits,
            sb_extslots,
            root_nid,
            inos: le64(raw, 0x10),
            epoch: le64(raw, 0x18),
            fixed_nsec: le32(raw, 0x20),
            build_time: le32(raw, 0x6C),
            blocks: u64::from(le32(raw, 0x24)) | blocks_hi << 32,
            meta_blkaddr: le32(raw, 0x28),
            xattr_blkaddr: le32(raw, 0x2C),
            uuid: bytes(raw, 0x30),
            volume_name: raw[0x40..0x50].to_vec(),
            feature_incompat,
            compr_u16: le16(raw, 0x54),
            extra_devices: le16(raw, 0x56),
            devt_slotoff: le16(raw, 0x58),
            dirblkbits: raw[0x5A],
            xattr_prefix_count: raw[0x5B],
            xattr_prefix_start: le32(raw, 0x5C),
            packed_nid: le64(raw, 0x60),
            metabox_nid,
        };
        if sb.dirblkbits != 0 {
            return Err(Error::incompatible(Incompatible::DirBlockBits {
                dirblkbits: sb.dirblkbits,
            }));
        }
        if !sb.volume_name.contains(&0) {
            return Err(bad(0x40, Corrupt::VolumeNameNotTerminated));
        }
        // Bit 63 of a nid says "in the metabox": the packed inode may not
        // be there, and the metabox inode may not be inside itself.
        if sb.packed_nid & NID_METABOX != 0 {
            return Err(bad(0x60, Corrupt::PackedInMetabox { nid: sb.packed_nid }));
        }
        if sb.metabox_nid & NID_METABOX != 0 {
            return Err(bad(
                0x80,
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
        let slots = fixed.get(0x0D).copied().unwrap_or(0);
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
    pub blocks: u64,
    /// Where the device's blocks start in a flat address space (0 = not mapped).
    pub mapped_blkaddr: u64,
}

impl DeviceSlot {
    /// Parses one 128-byte slot; `wide` (48BIT) adds the high 16 bits of
    /// both block numbers, which older images leave as reserved zeros.
    pub fn parse(raw: &[u8], wide: bool) -> DeviceSlot {
        let tag = &raw[..64];
        let end = tag.iter().position(|&b| b == 0).unwrap_or(64);
        let hi = |at: usize| {
            if wide {
                u64::from(le16(raw, at)) << 32
            } else {
                0
            }
        };
        DeviceSlot {
            tag: tag[..end].to_vec(),
            blocks: u64::from(le32(raw, 64)) | hi(72),
            mapped_blkaddr: u64::from(le32(raw, 68)) | hi(74),
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
        // The first bit past every feature EROFS has defined.
        let mut next = raw.clone();
        next[0x50..0x54].copy_from_slice(&(0x200 | INCOMPAT_LZ4_0PADDING).to_le_bytes());
        let e = Superblock::parse(&next).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Features { bits: 0x200 })
        );
        // The metabox nid needs an extension slot.
        let mut metabox = raw.clone();
        metabox[0x50..0x54].copy_from_slice(&INCOMPAT_METABOX.to_le_bytes());
        let e = Superblock::parse(&metabox).unwrap_err();
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::MetaboxWithoutSlot { sb_extslots: 0 })
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

    /// A superblock with COMPR_CFGS listing `algs`, followed by `records`
    /// (each as its payload; lengths and alignment are added here).
    fn with_configs(algs: u16, records: &[&[u8]]) -> (Superblock, Vec<u8>) {
        let mut raw = minimal();
        raw[0x50..0x54].copy_from_slice(&INCOMPAT_COMPR_CFGS.to_le_bytes());
        raw[0x54..0x56].copy_from_slice(&algs.to_le_bytes());
        let sb = Superblock::parse(&raw).unwrap();
        let mut image = vec![0u8; SUPER_OFFSET as usize];
        image.extend_from_slice(&raw);
        for rec in records {
            while image.len() & 3 != 0 {
                image.push(0);
            }
            image.extend_from_slice(&(rec.len() as u16).to_le_bytes());
            image.extend_from_slice(rec);
        }
        (sb, image)
    }

    fn load(algs: u16, records: &[&[u8]]) -> Result<CompressionConfigs> {
        let (sb, image) = with_configs(algs, records);
        CompressionConfigs::load(&sb, |pos, buf| {
            let pos = pos as usize;
            match image.get(pos..pos + buf.len()) {
                Some(b) => {
                    buf.copy_from_slice(b);
                    Ok(())
                }
                None => Err(Error::corrupt(pos as u64, Corrupt::SuperblockTruncated)),
            }
        })
    }

    fn config_problem(e: &Error) -> (u8, ConfigProblem) {
        match e.corruption::<Corrupt>() {
            Some(Corrupt::CompressionConfig { algorithm, problem }) => {
                (*algorithm, problem.clone())
            }
            other => panic!("not a config problem: {other:?} ({e})"),
        }
    }

    const LZ4: [u8; 14] = [0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    const LZMA: [u8; 14] = [0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    const DEFLATE: [u8; 6] = [15, 0, 0, 0, 0, 0];
    const ZSTD: [u8; 6] = [0, 5, 0, 0, 0, 0];

    #[test]
    fn every_config_record_is_read() {
        let c = load(0xF, &[&LZ4, &LZMA, &DEFLATE, &ZSTD]).unwrap();
        assert_eq!(
            c.lz4,
            Some(Lz4Config {
                max_distance: 0xffff,
                max_pclusterblks: 1
            })
        );
        assert_eq!(c.lzma, Some(LzmaConfig { dict_size: 0x8000 }));
        assert_eq!(c.deflate, Some(DeflateConfig { windowbits: 15 }));
        assert_eq!(c.zstd, Some(ZstdConfig { windowlog: 5 }));
        assert_eq!(c.zstd.unwrap().window_size(), 32 << 10);
        assert_eq!(c.algorithms(), vec![0, 1, 2, 3]);
        let only_zstd = load(1 << Algorithm::Zstd.number(), &[&ZSTD]).unwrap();
        assert_eq!(only_zstd.algorithms(), vec![Algorithm::Zstd.number()]);
    }

    #[test]
    fn config_records_are_validated_like_the_kernel() {
        let mut lzma = LZMA;
        lzma[..4].copy_from_slice(&(16u32 << 20).to_le_bytes());
        let e = load(2, &[&lzma]).unwrap_err();
        assert_eq!(e.offset(), Some(SUPER_OFFSET + SUPER_SIZE as u64));
        assert_eq!(
            config_problem(&e),
            (
                Algorithm::MicroLzma.number(),
                ConfigProblem::LzmaDictSize {
                    dict_size: 16 << 20
                }
            )
        );
        assert!(
            e.to_string().contains("MicroLZMA configuration record"),
            "{e}"
        );
        lzma[..4].copy_from_slice(&2048u32.to_le_bytes());
        let e = load(2, &[&lzma]).unwrap_err();
        assert_eq!(
            config_problem(&e).1,
            ConfigProblem::LzmaDictSize { dict_size: 2048 }
        );
        let mut lzma = LZMA;
        lzma[4] = 1;
        let e = load(2, &[&lzma]).unwrap_err();
        assert_eq!(
            config_problem(&e).1,
            ConfigProblem::LzmaFormat { format: 1 }
        );
        let e = load(2, &[&LZMA[..12]]).unwrap_err();
        assert_eq!(
            config_problem(&e).1,
            ConfigProblem::Size {
                len: 12,
                expected: 14
            }
        );
        let e = load(4, &[&[16, 0, 0, 0, 0, 0]]).unwrap_err();
        assert_eq!(
            config_problem(&e),
            (
                Algorithm::Deflate.number(),
                ConfigProblem::DeflateWindowBits { windowbits: 16 }
            )
        );
        let e = load(8, &[&[0, 11, 0, 0, 0, 0]]).unwrap_err();
        assert_eq!(
            config_problem(&e),
            (
                Algorithm::Zstd.number(),
                ConfigProblem::ZstdWindowLog { windowlog: 11 }
            )
        );
        let e = load(8, &[&[1, 5, 0, 0, 0, 0]]).unwrap_err();
        assert_eq!(
            config_problem(&e).1,
            ConfigProblem::ZstdFormat { format: 1 }
        );
        let e = load(1, &[&LZ4[..10]]).unwrap_err();
        assert_eq!(
            config_problem(&e),
            (
                Algorithm::Lz4.number(),
                ConfigProblem::Size {
                    len: 10,
                    expected: 14
                }
            )
        );
        // The second record is found past the first's alignment.
        let e = load(0b101, &[&LZ4, &[16, 0, 0, 0, 0, 0]]).unwrap_err();
        assert_eq!(e.offset(), Some(SUPER_OFFSET + SUPER_SIZE as u64 + 16));
    }

    #[test]
    fn an_unknown_algorithm_is_refused_by_name() {
        let e = load(1 | 1 << 4, &[&LZ4]).unwrap_err();
        assert_eq!(
            e.incompatibility::<Incompatible>(),
            Some(&Incompatible::Algorithm { algorithm: 4 })
        );
        assert!(
            e.to_string().contains("unknown algorithm 4 compression"),
            "{e}"
        );
    }

    #[test]
    fn without_records_only_lz4_exists() {
        let sb = Superblock::parse(&minimal()).unwrap();
        let c = CompressionConfigs::load(&sb, |_, _| panic!("no records to read")).unwrap();
        assert_eq!(c.algorithms(), vec![Algorithm::Lz4.number()]);
    }

    #[test]
    fn the_48bit_fields_follow_the_kernel() {
        let mut raw = minimal();
        raw[0x50..0x54].copy_from_slice(&INCOMPAT_48BIT.to_le_bytes());
        raw[0x0E..0x10].copy_from_slice(&0x0102u16.to_le_bytes());
        raw[0x24..0x28].copy_from_slice(&7u32.to_le_bytes());
        raw[0x18..0x20].copy_from_slice(&100u64.to_le_bytes());
        raw[0x6C..0x70].copy_from_slice(&1_700_000_000u32.to_le_bytes());
        // Without the 8-byte root nid, the 2-byte field is the root.
        let sb = Superblock::parse(&raw).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (0x0102, 7));
        assert_eq!(sb.build_time(), 1_700_000_100);
        // With it, the 2-byte field is the block count's high bits.
        raw[0x70..0x78].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let sb = Superblock::parse(&raw).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (1 << 40, 0x0102 << 32 | 7));
        // Without 48BIT the 8-byte field means nothing.
        raw[0x50..0x54].fill(0);
        let sb = Superblock::parse(&raw).unwrap();
        assert_eq!((sb.root_nid, sb.blocks), (0x0102, 7));
    }

    #[test]
    fn hostile_superblock_fields_are_refused() {
        let mut raw = minimal();
        raw[0x0D] = 250;
        let e = Superblock::parse(&raw).unwrap_err();
        assert_eq!(e.offset(), Some(SUPER_OFFSET + 0x0D));
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::SuperblockExtSlots { sb_extslots: 250 })
        );
        let mut raw = minimal();
        raw[0x60..0x68].copy_from_slice(&(NID_METABOX | 5).to_le_bytes());
        let e = Superblock::parse(&raw).unwrap_err();
        assert_eq!(
            e.corruption::<Corrupt>(),
            Some(&Corrupt::PackedInMetabox {
                nid: NID_METABOX | 5
            })
        );
        assert_eq!(Superblock::read_size(&raw), SUPER_SIZE);
        raw[0x0D] = 3;
        assert_eq!(Superblock::read_size(&raw), SUPER_SIZE_EXT);
    }

    #[test]
    fn device_slots_read_their_high_words_with_48bit() {
        let mut raw = vec![0u8; DEVT_SLOT_SIZE as usize];
        raw[..3].copy_from_slice(b"tag");
        raw[64..68].copy_from_slice(&10u32.to_le_bytes());
        raw[68..72].copy_from_slice(&20u32.to_le_bytes());
        raw[72..74].copy_from_slice(&1u16.to_le_bytes());
        raw[74..76].copy_from_slice(&2u16.to_le_bytes());
        let narrow = DeviceSlot::parse(&raw, false);
        assert_eq!((narrow.blocks, narrow.mapped_blkaddr), (10, 20));
        assert_eq!(narrow.tag, b"tag");
        let wide = DeviceSlot::parse(&raw, true);
        assert_eq!(
            (wide.blocks, wide.mapped_blkaddr),
            (1 << 32 | 10, 2 << 32 | 20)
        );
    }
}
