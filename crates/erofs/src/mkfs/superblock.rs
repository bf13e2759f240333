//! The superblock the builder writes last, over the zeros it left for it,
//! and its crc32c.

use crate::format::{
    Algorithm, COMPAT_MTIME, COMPAT_SB_CHKSUM, COMPAT_XATTR_FILTER, DEVT_SLOT_SIZE,
    INCOMPAT_COMPR_CFGS, INCOMPAT_DEVICE_TABLE, INCOMPAT_LZ4_0PADDING, MAGIC, SUPER_OFFSET,
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
    /// For an index image, the tar's 512-byte blocks: the one extra
    /// device, mapped right after the image so that the tar may also be
    /// appended to it.
    pub tar_blocks: Option<u64>,
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

/// Bytes of the superblock proper (no extension slots): the compression
/// records follow it.
const SB_SIZE: usize = 128;

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

/// The first block free for data.
pub(crate) fn first_free_block(blksz: u64) -> u64 {
    (SUPER_OFFSET + covered(blksz)).div_ceil(blksz)
}

/// The superblock's bytes (what [`covered`] says, checksum included), to
/// write at [`SUPER_OFFSET`].
pub(crate) fn encode(f: &Fields) -> Vec<u8> {
    let blksz = 1u64 << f.blkszbits;
    let mut b = vec![0u8; covered(blksz) as usize];
    let mut compat = COMPAT_SB_CHKSUM | COMPAT_MTIME;
    if f.xattr_filter {
        compat |= COMPAT_XATTR_FILTER;
    }
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[0x08..0x0C].copy_from_slice(&compat.to_le_bytes());
    b[0x0C] = f.blkszbits;
    b[0x0E..0x10].copy_from_slice(&(f.root_nid as u16).to_le_bytes());
    b[0x10..0x18].copy_from_slice(&f.inos.to_le_bytes());
    b[0x18..0x20].copy_from_slice(&(f.epoch as u64).to_le_bytes());
    b[0x20..0x24].copy_from_slice(&f.nsec.to_le_bytes());
    b[0x24..0x28].copy_from_slice(&(f.blocks as u32).to_le_bytes());
    b[0x28..0x2C].copy_from_slice(&(f.meta_blkaddr as u32).to_le_bytes());
    b[0x2C..0x30].copy_from_slice(&(f.xattr_blkaddr as u32).to_le_bytes());
    b[0x30..0x40].copy_from_slice(&f.uuid);
    let n = f.volume.len().min(VOLUME_NAME_SIZE - 1);
    b[0x40..0x40 + n].copy_from_slice(&f.volume[..n]);
    if let Some(c) = &f.compression {
        let mut incompat = INCOMPAT_LZ4_0PADDING;
        let rec = SB_SIZE;
        if let Some(log) = c.zstd_window_log {
            // Any algorithm but LZ4 needs the configuration records: the
            // field that held the LZ4 distance then holds the bitmap of
            // algorithms used, and each used one has a record, a 2-byte
            // size then the record, in the bitmap's order.
            incompat |= INCOMPAT_COMPR_CFGS;
            b[0x54..0x56].copy_from_slice(&(1u16 << Algorithm::Zstd as u16).to_le_bytes());
            b[rec..rec + 2].copy_from_slice(&6u16.to_le_bytes());
            // format 0, then the window's log above 1 KiB.
            b[rec + 3] = log - 10;
        } else if c.max_pclusterblks > 1 {
            // Big pclusters need the configuration records too.
            incompat |= INCOMPAT_COMPR_CFGS;
            b[0x54..0x56].copy_from_slice(&(1u16 << Algorithm::Lz4 as u16).to_le_bytes());
            b[rec..rec + 2].copy_from_slice(&14u16.to_le_bytes());
            b[rec + 2..rec + 4].copy_from_slice(&LZ4_MAX_DISTANCE.to_le_bytes());
            b[rec + 4] = c.max_pclusterblks;
        } else {
            b[0x54..0x56].copy_from_slice(&LZ4_MAX_DISTANCE.to_le_bytes());
        }
        b[0x50..0x54].copy_from_slice(&incompat.to_le_bytes());
    }
    if let Some(blocks) = f.tar_blocks {
        // One device slot, right after the superblock proper: a tag
        // (none), the device's blocks, and where it sits in the unified
        // block space.
        let slot = SB_SIZE;
        b[0x50..0x54].copy_from_slice(&INCOMPAT_DEVICE_TABLE.to_le_bytes());
        b[0x56..0x58].copy_from_slice(&1u16.to_le_bytes());
        let slotoff = (SUPER_OFFSET + slot as u64) / DEVT_SLOT_SIZE;
        b[0x58..0x5A].copy_from_slice(&(slotoff as u16).to_le_bytes());
        b[slot + 64..slot + 68].copy_from_slice(&(blocks as u32).to_le_bytes());
        b[slot + 68..slot + 72].copy_from_slice(&(f.blocks as u32).to_le_bytes());
    }
    // The stored value is the raw CRC register (seed ~0, no final xor),
    // the complement of the standard CRC-32C, as the reader checks it.
    let crc = !crc32c::crc32c(&b);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}
