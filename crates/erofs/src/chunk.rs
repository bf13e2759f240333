//! Chunk-based files: a table of per-chunk addresses after the inode, either
//! 4-byte block map entries or 8-byte indexes naming a device.

use foliofs_vfs::{Error, Result};

use crate::inode::Inode;
use crate::{Corrupt, Incompatible};

/// `EROFS_NULL_ADDR`: a chunk with no blocks (a hole).
pub const NULL_ADDR: u32 = 0xFFFF_FFFF;
/// Chunk format bit: 8-byte indexes instead of the 4-byte block map.
pub const FORMAT_INDEXES: u16 = 0x20;
/// Chunk format bits giving `chunkbits - blkszbits`.
pub const FORMAT_BLKBITS_MASK: u16 = 0x1F;

/// The chunk format of a chunk-based inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkFormat {
    /// log2 of the chunk size in bytes.
    pub chunkbits: u32,
    /// 8-byte indexes (with a device id) rather than 4-byte block addresses.
    pub indexes: bool,
}

impl ChunkFormat {
    /// Decodes the format word in `i_u` of `inode`.
    pub fn of(inode: &Inode, blkszbits: u8) -> Result<ChunkFormat> {
        let fmt = inode.i_u as u16;
        if fmt & !(FORMAT_INDEXES | FORMAT_BLKBITS_MASK) != 0 {
            return Err(Error::incompatible(Incompatible::ChunkFormat {
                nid: inode.nid,
                format: fmt,
            }));
        }
        let chunkbits = u32::from(blkszbits) + u32::from(fmt & FORMAT_BLKBITS_MASK);
        if chunkbits > 47 {
            return Err(Error::corrupt(
                inode.pos + 16,
                Corrupt::ChunkSize {
                    nid: inode.nid,
                    chunkbits,
                },
            ));
        }
        Ok(ChunkFormat {
            chunkbits,
            indexes: fmt & FORMAT_INDEXES != 0,
        })
    }

    /// Bytes per table entry.
    pub fn entry_size(&self) -> u64 {
        if self.indexes {
            8
        } else {
            4
        }
    }

    /// Image position of the table entry for chunk `n` of `inode`.
    pub fn entry_pos(&self, inode: &Inode, n: u64) -> Option<u64> {
        let unit = self.entry_size();
        let start = inode.trailer_pos().checked_add(unit - 1)? / unit * unit;
        start.checked_add(n.checked_mul(unit)?)
    }

    /// Number of chunks a file of `size` bytes has.
    pub fn count(&self, size: u64) -> u64 {
        size.div_ceil(1u64 << self.chunkbits)
    }
}

/// One decoded table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    /// 0 = the primary device, n = extra device n.
    pub device_id: u16,
    /// First block, or [`NULL_ADDR`] for a hole.
    pub blkaddr: u32,
}

impl ChunkEntry {
    /// Decodes an entry (`raw` is 4 or 8 bytes, matching the format).
    pub fn parse(raw: &[u8], device_id_mask: u16) -> ChunkEntry {
        if raw.len() == 8 {
            ChunkEntry {
                device_id: u16::from_le_bytes([raw[2], raw[3]]) & device_id_mask,
                blkaddr: u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes")),
            }
        } else {
            ChunkEntry {
                device_id: 0,
                blkaddr: u32::from_le_bytes(raw[..4].try_into().expect("4 bytes")),
            }
        }
    }

    /// True for a chunk with no blocks (reads as zeros).
    pub fn is_hole(&self) -> bool {
        self.blkaddr == NULL_ADDR
    }
}
