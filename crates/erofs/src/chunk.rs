//! Chunk-based files: a table of per-chunk addresses after the inode, either
//! 4-byte block map entries or 8-byte indexes naming a device.

use foliofs_vfs::{Error, Result};

use std::mem::offset_of;

use zerocopy::little_endian::U32;
use zerocopy::FromBytes;

use crate::format::{
    erofs_inode_chunk_index, erofs_inode_compact, CHUNK_FORMAT_48BIT, CHUNK_FORMAT_BLKBITS_MASK,
    CHUNK_FORMAT_INDEXES, NULL_ADDR,
};
use crate::inode::Inode;
use crate::{Corrupt, Incompatible};

/// The chunk format of a chunk-based inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkFormat {
    /// log2 of the chunk size in bytes.
    pub chunkbits: u32,
    /// 8-byte indexes (with a device id) rather than 4-byte block addresses.
    pub indexes: bool,
    /// Indexes keep 48-bit block addresses (else 32).
    pub wide: bool,
}

impl ChunkFormat {
    /// Decodes the format word in `i_u` of `inode`.
    pub fn of(inode: &Inode, blkszbits: u8) -> Result<ChunkFormat> {
        let fmt = inode.i_u as u16;
        if fmt & !(CHUNK_FORMAT_48BIT | CHUNK_FORMAT_INDEXES | CHUNK_FORMAT_BLKBITS_MASK) != 0 {
            return Err(Error::incompatible(Incompatible::ChunkFormat {
                nid: inode.nid,
                format: fmt,
            }));
        }
        let chunkbits = u32::from(blkszbits) + u32::from(fmt & CHUNK_FORMAT_BLKBITS_MASK);
        if chunkbits > 47 {
            return Err(Error::corrupt(
                // `i_u`, where both inode forms have it.
                inode.pos + offset_of!(erofs_inode_compact, i_u) as u64,
                Corrupt::ChunkSize {
                    nid: inode.nid,
                    chunkbits,
                },
            ));
        }
        Ok(ChunkFormat {
            chunkbits,
            indexes: fmt & CHUNK_FORMAT_INDEXES != 0,
            wide: fmt & CHUNK_FORMAT_48BIT != 0,
        })
    }

    /// Bytes per table entry.
    pub fn entry_size(&self) -> u64 {
        if self.indexes {
            size_of::<erofs_inode_chunk_index>() as u64
        } else {
            size_of::<U32>() as u64
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
    /// First block, or `None` for a hole (an address of all ones).
    pub blkaddr: Option<u64>,
}

impl ChunkEntry {
    /// Decodes an entry (`raw` is 4 or 8 bytes, matching the format; `wide`
    /// for the 48BIT chunk format, whose indexes keep the address's high
    /// 16 bits where older ones had an unused field).
    pub fn parse(raw: &[u8], device_id_mask: u16, wide: bool) -> ChunkEntry {
        let (device_id, addr, mask) =
            if let Ok(index) = erofs_inode_chunk_index::ref_from_bytes(raw) {
                let hi = u64::from(index.startblk_hi.get());
                let lo = u64::from(index.startblk_lo.get());
                let mask = if wide {
                    (1u64 << 48) - 1
                } else {
                    u64::from(NULL_ADDR)
                };
                (
                    index.device_id.get() & device_id_mask,
                    (hi << 32 | lo) & mask,
                    mask,
                )
            } else {
                let (addr, _) = U32::read_from_prefix(raw).expect("4 bytes or 8");
                (0, u64::from(addr.get()), u64::from(NULL_ADDR))
            };
        ChunkEntry {
            device_id,
            blkaddr: (addr != mask).then_some(addr),
        }
    }

    /// True for a chunk with no blocks (reads as zeros).
    pub fn is_hole(&self) -> bool {
        self.blkaddr.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_holes_in_every_format() {
        let map = 0x1234u32.to_le_bytes();
        assert_eq!(ChunkEntry::parse(&map, 0, false).blkaddr, Some(0x1234));
        assert!(ChunkEntry::parse(&u32::MAX.to_le_bytes(), 0, false).is_hole());
        // startblk_hi, device id, startblk_lo.
        let index = |hi: u16, dev: u16, lo: u32| {
            let mut v = hi.to_le_bytes().to_vec();
            v.extend(dev.to_le_bytes());
            v.extend(lo.to_le_bytes());
            v
        };
        // Without the 48BIT format the high word is ignored.
        let e = ChunkEntry::parse(&index(7, 3, 9), 1, false);
        assert_eq!((e.device_id, e.blkaddr), (1, Some(9)));
        let e = ChunkEntry::parse(&index(7, 3, 9), 3, true);
        assert_eq!((e.device_id, e.blkaddr), (3, Some(7 << 32 | 9)));
        assert!(ChunkEntry::parse(&index(7, 0, u32::MAX), 0, false).is_hole());
        assert!(!ChunkEntry::parse(&index(7, 0, u32::MAX), 0, true).is_hole());
        assert!(ChunkEntry::parse(&index(u16::MAX, 0, u32::MAX), 0, true).is_hole());
    }
}
