//! The superblock the builder writes last, over the zeros it left for it,
//! and its crc32c.

use crate::format::{
    COMPAT_MTIME, COMPAT_SB_CHKSUM, COMPAT_XATTR_FILTER, MAGIC, SUPER_OFFSET, VOLUME_NAME_SIZE,
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
}

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
    // The stored value is the raw CRC register (seed ~0, no final xor),
    // the complement of the standard CRC-32C, as the reader checks it.
    let crc = !crc32c::crc32c(&b);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}
