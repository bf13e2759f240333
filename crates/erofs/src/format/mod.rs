//! The EROFS on-disk format, as Linux's `erofs_fs.h` states it: magic
//! numbers, sizes, feature bits and their names, compression algorithm and
//! data layout ids, the bits inside the records, and the records
//! themselves ([`records`]), which the reader parses and the builder
//! writes, so that both place every field from one declaration.
//!
//! This module imports nothing from the rest of the crate, as `erofs_fs.h`
//! includes nothing of the driver: every other module may use it without
//! forming a cycle.

use std::mem::size_of;

mod records;

pub use records::*;

// ---- the superblock

/// Byte offset of the superblock in the image.
pub const SUPER_OFFSET: u64 = 1024;
/// Size of the fixed part of the on-disk superblock.
pub const SUPER_SIZE: usize = 128;
/// Size of the superblock with its first extension slot, which holds the
/// metabox nid: the most of it this reader has fields for.
pub const SUPER_SIZE_EXT: usize = size_of::<erofs_super_block>();
/// Largest superblock (with its extension slots) the kernel takes: the
/// rest of a 4 KiB page after byte 1024.
pub const SUPER_MAX_SIZE: u64 = 4096 - SUPER_OFFSET;
/// Bytes of the superblock's volume name (NUL-terminated within them).
pub const VOLUME_NAME_SIZE: usize = 16;
/// `EROFS_SUPER_MAGIC_V1`.
pub const MAGIC: u32 = 0xE0F5_E1E2;
/// Size of one device table slot.
pub const DEVT_SLOT_SIZE: u64 = size_of::<erofs_deviceslot>() as u64;

/// Compat: the superblock carries a crc32c.
pub const COMPAT_SB_CHKSUM: u32 = 0x1;
/// Compat: inodes carry their own mtime.
pub const COMPAT_MTIME: u32 = 0x2;
/// Compat: xattr bloom filters (a hint; safe to ignore).
pub const COMPAT_XATTR_FILTER: u32 = 0x4;
/// Compat: shared xattrs live in the metabox inode's data, not the image.
pub const COMPAT_SHARED_EA_IN_METABOX: u32 = 0x8;
/// Compat: the long xattr prefix table is in the image even when the image
/// has a packed inode or a metabox.
pub const COMPAT_PLAIN_XATTR_PFX: u32 = 0x10;
/// Compat: inodes carry a content digest xattr for page-cache sharing (a
/// hint; safe to ignore).
pub const COMPAT_ISHARE_XATTRS: u32 = 0x20;

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

/// The name of a compat feature bit, for listings (`None` for bits EROFS
/// does not define).
pub fn compat_name(bit: u32) -> Option<&'static str> {
    Some(match bit {
        COMPAT_SB_CHKSUM => "sb_csum",
        COMPAT_MTIME => "mtime",
        COMPAT_XATTR_FILTER => "xattr_filter",
        COMPAT_SHARED_EA_IN_METABOX => "shared_ea_in_metabox",
        COMPAT_PLAIN_XATTR_PFX => "plain_xattr_pfx",
        COMPAT_ISHARE_XATTRS => "ishare_xattrs",
        _ => return None,
    })
}

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

// ---- compression algorithms

/// A compression algorithm, by the number EROFS gives it (its bit in the
/// superblock's algorithm bitmap, its place among the configuration
/// records, and the id in map headers and extent records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// LZ4 block format (0).
    Lz4 = 0,
    /// MicroLZMA (1): LZMA1 without a header or end marker.
    MicroLzma = 1,
    /// Raw DEFLATE (2).
    Deflate = 2,
    /// A Zstandard frame (3).
    Zstd = 3,
}

impl Algorithm {
    /// Every algorithm EROFS defines, in number order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Lz4,
        Algorithm::MicroLzma,
        Algorithm::Deflate,
        Algorithm::Zstd,
    ];

    /// The algorithm numbered `n` on disk, if EROFS defines it.
    pub fn from_number(n: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.number() == n)
    }

    /// The on-disk number.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The algorithm's name, as refusals and listings show it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "LZ4",
            Algorithm::MicroLzma => "MicroLZMA",
            Algorithm::Deflate => "DEFLATE",
            Algorithm::Zstd => "Zstd",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of a compression algorithm number, known or not.
pub fn algorithm_name(alg: u8) -> String {
    match Algorithm::from_number(alg) {
        Some(a) => a.name().into(),
        None => format!("unknown algorithm {alg}"),
    }
}

/// Largest physical cluster the kernel accepts
/// (`Z_EROFS_PCLUSTER_MAX_SIZE`).
pub const MAX_PCLUSTER: u64 = 1 << 20;
/// Largest extent the kernel decodes from one physical cluster
/// (`Z_EROFS_PCLUSTER_MAX_DSIZE`).
pub const MAX_DECODED: usize = 12 << 20;
/// Largest decompressed extent this reader materialises: not the format's
/// limit but this reader's, kept beside the format's so that the messages
/// which quote it need nothing else.
pub const MAX_EXTENT: u64 = 16 << 20;

// ---- inodes

/// Bytes of a compact inode.
pub const INODE_COMPACT_SIZE: usize = size_of::<erofs_inode_compact>();
/// Bytes of an extended inode: the most an inode occupies on disk.
pub const MAX_INODE_SIZE: usize = size_of::<erofs_inode_extended>();
/// `i_format` bit 0: the 64-byte extended form.
pub const I_FORMAT_EXTENDED: u16 = 0x1;
/// `i_format` bit 4: NLINK_1 (compact non-directories: the link count is
/// 1 and `i_nb` holds high address bits) or DOT_OMITTED (directories).
pub const I_FORMAT_BIT4: u16 = 0x10;
/// Every `i_format` bit EROFS defines.
pub const I_FORMAT_ALL: u16 = 0x1F;
/// Bit 63 of a nid: the inode lives in the metabox inode's data.
pub const NID_METABOX: u64 = 1 << 63;

/// How an inode's data is laid out (`i_format` bits 1..3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Contiguous blocks from `i_u` on.
    FlatPlain = 0,
    /// Compressed, one 8-byte index per logical cluster.
    CompressedFull = 1,
    /// Blocks from `i_u`, the tail inline after the inode.
    FlatInline = 2,
    /// Compressed, packed ("compacted") indexes.
    CompressedCompact = 3,
    /// A table of chunk addresses after the inode.
    ChunkBased = 4,
}

impl Layout {
    /// The layout numbered `id` in `i_format`, if EROFS defines it.
    pub fn from_id(id: u16) -> Option<Layout> {
        Some(match id {
            0 => Layout::FlatPlain,
            1 => Layout::CompressedFull,
            2 => Layout::FlatInline,
            3 => Layout::CompressedCompact,
            4 => Layout::ChunkBased,
            _ => return None,
        })
    }

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

// ---- chunk-based files

/// `EROFS_NULL_ADDR`: a chunk with no blocks (a hole).
pub const NULL_ADDR: u32 = 0xFFFF_FFFF;
/// Chunk format bit: 8-byte indexes instead of the 4-byte block map.
pub const CHUNK_FORMAT_INDEXES: u16 = 0x20;
/// Chunk format bits giving `chunkbits - blkszbits`.
pub const CHUNK_FORMAT_BLKBITS_MASK: u16 = 0x1F;
/// Chunk format bit: 8-byte indexes carry 48-bit block addresses.
pub const CHUNK_FORMAT_48BIT: u16 = 0x40;

// ---- compressed files: the map header and logical-cluster indexes

/// Map header advice: 2-byte compact indexes are used.
pub const ADVISE_COMPACTED_2B: u16 = 0x1;
/// Map header advice (full layout): extent records instead of lcluster
/// indexes (the same bit as [`ADVISE_COMPACTED_2B`]).
pub const ADVISE_EXTENTS: u16 = 0x1;
/// Map header advice: HEAD1 clusters may span several blocks.
pub const ADVISE_BIG_PCLUSTER_1: u16 = 0x2;
/// Map header advice: HEAD2 clusters may span several blocks.
pub const ADVISE_BIG_PCLUSTER_2: u16 = 0x4;
/// Map header advice: the last cluster is inline (ztailpacking).
pub const ADVISE_INLINE_PCLUSTER: u16 = 0x8;
/// Map header advice: uncompressed clusters are rotated.
pub const ADVISE_INTERLACED_PCLUSTER: u16 = 0x10;
/// Map header advice: the tail lives in a fragment.
pub const ADVISE_FRAGMENT_PCLUSTER: u16 = 0x20;
/// Map header bit 63: the whole file is one fragment of the packed inode.
pub const MAP_FRAGMENT_INODE: u64 = 1 << 63;

/// Logical cluster type: starts an uncompressed extent.
pub const LCLUSTER_PLAIN: u8 = 0;
/// Logical cluster type: starts an extent of the first algorithm.
pub const LCLUSTER_HEAD1: u8 = 1;
/// Logical cluster type: continues an extent.
pub const LCLUSTER_NONHEAD: u8 = 2;
/// Logical cluster type: starts an extent of the second algorithm.
pub const LCLUSTER_HEAD2: u8 = 3;
/// `Z_EROFS_LI_D0_CBLKCNT`: `delta[0]` holds a compressed block count.
pub const LI_D0_CBLKCNT: u32 = 1 << 11;
/// `Z_EROFS_LI_PARTIAL_REF` (full indexes, head types): the extent is a
/// prefix of its physical cluster's output (dedupe).
pub const LI_PARTIAL_REF: u16 = 1 << 15;

// ---- compressed files: extent records

/// Record bits 0..20: the encoded length in bytes.
pub const PLEN_MASK: u32 = 0x1F_FFFF;
/// Record bit 27: the extent is a prefix of its cluster's output (dedupe).
pub const PLEN_PARTIAL: u32 = 1 << 27;
/// Record bits 28..31: 0 = stored, n = algorithm n - 1.
pub const PLEN_FMT_SHIFT: u32 = 28;

// ---- directories

/// Size of one on-disk directory entry.
pub const DIRENT_SIZE: usize = size_of::<erofs_dirent>();
/// Longest file name a directory entry holds.
pub const NAME_LEN_MAX: usize = 255;
/// Directory entry file types (`EROFS_FT_*`).
pub const FT_REG_FILE: u8 = 1;
/// A directory.
pub const FT_DIR: u8 = 2;
/// A character device.
pub const FT_CHRDEV: u8 = 3;
/// A block device.
pub const FT_BLKDEV: u8 = 4;
/// A fifo.
pub const FT_FIFO: u8 = 5;
/// A socket.
pub const FT_SOCK: u8 = 6;
/// A symbolic link.
pub const FT_SYMLINK: u8 = 7;

// ---- extended attributes

/// Size of the in-inode xattr header.
pub const XATTR_IBODY_HEADER: u64 = size_of::<erofs_xattr_ibody_header>() as u64;
/// Bit of `e_name_index` selecting a long prefix.
pub const XATTR_LONG_PREFIX: u8 = 0x80;
/// Size of an xattr entry's header (`e_name_len`, `e_name_index`,
/// `e_value_size`).
pub const XATTR_ENTRY_HEADER: usize = size_of::<erofs_xattr_entry>();
/// Bits of the in-inode name filter (`h_name_filter`).
pub const XATTR_FILTER_BITS: u32 = 32;
/// The xxh32 seed of the name filter, to which the name index is added.
pub const XATTR_FILTER_SEED: u32 = 0x25BB_E08F;
/// Largest name suffix an entry holds (`e_name_len` is a byte).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest value an entry holds (`e_value_size` is 16 bits).
pub const XATTR_VALUE_MAX: usize = 65535;

/// The name prefix of a built-in xattr name index, as the kernel lists it.
/// Index 5 (Lustre) has no handler in Linux and is neither listed nor
/// found. Indexes 2 and 3 are whole names (the POSIX ACLs), the others
/// prefixes ending in '.'.
pub fn xattr_prefix(index: u8) -> Option<&'static [u8]> {
    Some(match index {
        1 => b"user.",
        2 => b"system.posix_acl_access",
        3 => b"system.posix_acl_default",
        4 => b"trusted.",
        6 => b"security.",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_numbers_and_names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_number(a.number()), Some(a));
            assert_eq!(algorithm_name(a.number()), a.to_string());
        }
        assert_eq!(Algorithm::from_number(4), None);
        assert_eq!(algorithm_name(4), "unknown algorithm 4");
    }

    #[test]
    fn compact_entries_read_back_as_written() {
        for (len, vcnt) in [(8, 2), (32, 16)] {
            let lobits = compact_lobits(9);
            let mut pack = vec![0u8; len];
            for i in 0..vcnt {
                let lo = (i as u32 * 37) & ((1 << lobits) - 1);
                put_compact_entry(&mut pack, vcnt, lobits, i, lo, (i % 4) as u8);
            }
            put_compact_base(&mut pack, 0xDEAD_BEEF);
            for i in 0..vcnt {
                let lo = (i as u32 * 37) & ((1 << lobits) - 1);
                assert_eq!(compact_entry(&pack, vcnt, lobits, i), (lo, (i % 4) as u8));
            }
            assert_eq!(compact_base(&pack), 0xDEAD_BEEF);
        }
    }
}
