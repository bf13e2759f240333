//! The superblock the builder writes last, over the zeros it left for it,
//! and its crc32c.

use zerocopy::{FromBytes, IntoBytes};

use crate::format::{
    erofs_deviceslot, erofs_super_block, z_erofs_lz4_cfgs, z_erofs_zstd_cfgs, Algorithm,
    COMPAT_MTIME, COMPAT_SB_CHKSUM, COMPAT_XATTR_FILTER, DEVT_SLOT_SIZE, INCOMPAT_COMPR_CFGS,
    INCOMPAT_DEVICE_TABLE, INCOMPAT_LZ4_0PADDING, MAGIC, SUPER_OFFSET, SUPER_SIZE,
    VOLUME_NAME_SIZE,
};

/// What the superblock says.
pub(crate) struct Fields {
    pub blkszbits: u8,
    pub root_nid: u64,
    pub inos: u64,
    pub epoch: i64,
    pub nsec: u32,
    pub blocks: u64,
    pub meta_blkaddr: u64,
    pub xattr_blkaddr: u64,
    pub uuid: [u8; 16],
    pub volume: Vec<u8>,
    pub xattr_filter: bool,
    /// Set when some file is compressed.
    pub compression: Option<Compr>,
    /// The extra devices, in device id order (1 on).
    pub devices: Vec<Device>,
}

/// An extra device, as its slot in the device table describes it.
#[derive(Clone, Debug)]
pub(crate) struct Device {
    /// What the device is known by (a layer's UUID in hex), at most 64
    /// bytes; empty for none.
    pub tag: Vec<u8>,
    /// Its size in blocks.
    pub blocks: u64,
    /// Where its blocks start in the unified block space.
    pub uniaddr: u64,
}

/// What the superblock records of compression.
pub(crate) struct Compr {
    /// Blocks of the largest pcluster: above 1, the configuration records
    /// (and with them big pclusters) are needed.
    pub max_pclusterblks: u8,
    /// For Zstd (whose configuration record is always needed), log2 of
    /// its window; LZ4 otherwise.
    pub zstd_window_log: Option<u8>,
}

/// LZ4's largest match distance, which the kernel sizes its window by.
const LZ4_MAX_DISTANCE: u16 = u16::MAX;

/// Bytes from the superblock's offset that its checksum covers, and that
/// the builder therefore owns: the rest of the block, or the whole block
/// when blocks are no larger than the offset.
pub(crate) fn covered(blksz: u64) -> u64 {
    if blksz > SUPER_OFFSET {
        blksz - SUPER_OFFSET
    } else {
        blksz
    }
}

/// The first block free for data, with `devices` slots in the device
/// table after the superblock.
pub(crate) fn first_free_block(blksz: u64, devices: usize) -> u64 {
    (SUPER_OFFSET + written(blksz, devices)).div_ceil(blksz)
}

/// Bytes written from the superblock's offset: what the checksum covers,
/// or more when the device table runs past it.
fn written(blksz: u64, devices: usize) -> u64 {
    covered(blksz).max(SUPER_SIZE as u64 + devices as u64 * DEVT_SLOT_SIZE)
}

/// The superblock's bytes (what [`covered`] says, checksum included, and
/// the device table), to write at [`SUPER_OFFSET`].
pub(crate) fn encode(f: &Fields) -> Vec<u8> {
    let blksz = 1u64 << f.blkszbits;
    let mut b = vec![0u8; written(blksz, f.devices.len()) as usize];
    let mut compat = COMPAT_SB_CHKSUM | COMPAT_MTIME;
    if f.xattr_filter {
        compat |= COMPAT_XATTR_FILTER;
    }
    let mut sb = erofs_super_block {
        magic: MAGIC.into(),
        feature_compat: compat.into(),
        blkszbits: f.blkszbits,
        rb: (f.root_nid as u16).into(),
        inos: f.inos.into(),
        epoch: (f.epoch as u64).into(),
        fixed_nsec: f.nsec.into(),
        blocks_lo: (f.blocks as u32).into(),
        meta_blkaddr: (f.meta_blkaddr as u32).into(),
        xattr_blkaddr: (f.xattr_blkaddr as u32).into(),
        uuid: f.uuid,
        ..Default::default()
    };
    let n = f.volume.len().min(VOLUME_NAME_SIZE - 1);
    sb.volume_name[..n].copy_from_slice(&f.volume[..n]);
    // Without extension slots, what follows the superblock proper is the
    // compression records or the device slot.
    let rec = SUPER_SIZE;
    if let Some(c) = &f.compression {
        let mut incompat = INCOMPAT_LZ4_0PADDING;
        if let Some(log) = c.zstd_window_log {
            // Any algorithm but LZ4 needs the configuration records: the
            // field that held the LZ4 distance then holds the bitmap of
            // algorithms used, and each used one has a record, a 2-byte
            // size then the record, in the bitmap's order.
            incompat |= INCOMPAT_COMPR_CFGS;
            sb.u1 = (1u16 << Algorithm::Zstd as u16).into();
            let cfg = z_erofs_zstd_cfgs {
                windowlog: log - 10,
                ..Default::default()
            };
            put_record(&mut b[rec..], cfg.as_bytes());
        } else if c.max_pclusterblks > 1 {
            // Big pclusters need the configuration records too.
            incompat |= INCOMPAT_COMPR_CFGS;
            sb.u1 = (1u16 << Algorithm::Lz4 as u16).into();
            let cfg = z_erofs_lz4_cfgs {
                max_distance: LZ4_MAX_DISTANCE.into(),
                max_pclusterblks: u16::from(c.max_pclusterblks).into(),
                ..Default::default()
            };
            put_record(&mut b[rec..], cfg.as_bytes());
        } else {
            sb.u1 = LZ4_MAX_DISTANCE.into();
        }
        sb.feature_incompat = incompat.into();
    }
    if !f.devices.is_empty() {
        // The device table, right after the superblock proper (compression
        // records and devices are never both written): each slot a tag,
        // the device's blocks, and where it sits in the unified block
        // space.
        sb.feature_incompat = (sb.feature_incompat.get() | INCOMPAT_DEVICE_TABLE).into();
        sb.extra_devices = (f.devices.len() as u16).into();
        let slotoff = (SUPER_OFFSET + SUPER_SIZE as u64) / DEVT_SLOT_SIZE;
        sb.devt_slotoff = (slotoff as u16).into();
        for (i, d) in f.devices.iter().enumerate() {
            let mut dev = erofs_deviceslot {
                blocks_lo: (d.blocks as u32).into(),
                uniaddr_lo: (d.uniaddr as u32).into(),
                ..Default::default()
            };
            dev.tag[..d.tag.len()].copy_from_slice(&d.tag);
            let at = SUPER_SIZE + i * DEVT_SLOT_SIZE as usize;
            b[at..at + dev.as_bytes().len()].copy_from_slice(dev.as_bytes());
        }
    }
    b[..SUPER_SIZE].copy_from_slice(&sb.as_bytes()[..SUPER_SIZE]);
    // The stored value is the raw CRC register (seed ~0, no final xor),
    // the complement of the standard CRC-32C, as the reader checks it.
    let crc = !crc32c::crc32c(&b[..covered(blksz) as usize]);
    let (sb, _) = erofs_super_block::mut_from_prefix(&mut b).expect("a block holds it");
    sb.checksum = crc.into();
    b
}

/// Writes a compression configuration record at the start of `at`: its
/// 2-byte size, then its bytes.
fn put_record(at: &mut [u8], rec: &[u8]) {
    at[..2].copy_from_slice(&(rec.len() as u16).to_le_bytes());
    at[2..2 + rec.len()].copy_from_slice(rec);
}
