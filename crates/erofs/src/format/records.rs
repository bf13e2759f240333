//! The on-disk records, each declared once as Linux's `erofs_fs.h`
//! declares it: the reader parses them and the builder writes them, so a
//! field cannot sit at one offset for one side and another for the other.
//!
//! Types and fields keep the kernel's names, so that a grep for a name in
//! `erofs_fs.h` finds it here. Every field is little-endian and every
//! record unaligned, as records sit at any byte of a block; the sizes are
//! checked at compile time. A union of the kernel's is one raw field with
//! accessors for its readings, as the kernel reads them.
#![allow(non_camel_case_types)]

use std::mem::size_of;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

// ---- the superblock

/// `struct erofs_super_block`: the fixed 128 bytes at byte 1024 and the
/// first 16-byte extension slot, which holds the metabox nid.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_super_block {
    /// `EROFS_SUPER_MAGIC_V1`.
    pub magic: U32,
    /// crc32c of the superblock's block, this field zeroed.
    pub checksum: U32,
    /// Compatible feature bits.
    pub feature_compat: U32,
    /// log2 of the block size.
    pub blkszbits: u8,
    /// Extension slots: the superblock is `128 + 16 * sb_extslots` bytes.
    pub sb_extslots: u8,
    /// The union `rb`: the root directory's nid (`rootnid_2b`), or with
    /// 48BIT and a non-zero `rootnid_8b`, the block count's high bits
    /// (`blocks_hi`).
    pub rb: U16,
    /// Number of inodes.
    pub inos: U64,
    /// Base seconds of compact inodes' mtime.
    pub epoch: U64,
    /// Nanoseconds of every compact inode's mtime.
    pub fixed_nsec: U32,
    /// Blocks of the primary device (low 32 bits).
    pub blocks_lo: U32,
    /// First block of the inode (metadata) area.
    pub meta_blkaddr: U32,
    /// First block of the shared xattr area.
    pub xattr_blkaddr: U32,
    /// Volume UUID.
    pub uuid: [u8; 16],
    /// Volume name, NUL-terminated.
    pub volume_name: [u8; 16],
    /// Incompatible feature bits.
    pub feature_incompat: U32,
    /// The union `u1`: with COMPR_CFGS the bitmap of algorithms
    /// (`available_compr_algs`), else LZ4's largest match distance
    /// (`lz4_max_distance`).
    pub u1: U16,
    /// Number of devices besides the primary one.
    pub extra_devices: U16,
    /// The device table's position, in 128-byte slots from byte 0.
    pub devt_slotoff: U16,
    /// Directory block size above the block size.
    pub dirblkbits: u8,
    /// Number of long xattr name prefixes.
    pub xattr_prefix_count: u8,
    /// The long prefix table's position, in 4-byte units.
    pub xattr_prefix_start: U32,
    /// The packed inode's nid (0 = none).
    pub packed_nid: U64,
    /// Reserved for the xattr name filter.
    pub xattr_filter_reserved: u8,
    /// Reserved.
    pub reserved: [u8; 3],
    /// Seconds after `epoch` the image was built at.
    pub build_time: U32,
    /// With 48BIT, the root directory's nid.
    pub rootnid_8b: U64,
    /// Reserved.
    pub reserved2: U64,
    /// With METABOX, the metabox inode's nid (extension slot 1).
    pub metabox_nid: U64,
    /// Reserved, to the end of extension slot 1.
    pub reserved3: U64,
}
const _: () = assert!(size_of::<erofs_super_block>() == 144);

/// `struct erofs_deviceslot`: one extra device in the device table.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_deviceslot {
    /// A path or digest the image was built with, NUL-padded.
    pub tag: [u8; 64],
    /// Size in blocks (low 32 bits).
    pub blocks_lo: U32,
    /// Where the device's blocks start in the unified block space (low
    /// 32 bits; 0 = not mapped).
    pub uniaddr_lo: U32,
    /// With 48BIT, the size's high 16 bits.
    pub blocks_hi: U16,
    /// With 48BIT, the unified address's high 16 bits.
    pub uniaddr_hi: U16,
    /// Reserved.
    pub reserved: [u8; 52],
}
const _: () = assert!(size_of::<erofs_deviceslot>() == 128);

impl Default for erofs_deviceslot {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

// ---- compression configuration records (after the superblock, each
// behind a 2-byte length)

/// `struct z_erofs_lz4_cfgs`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_lz4_cfgs {
    /// Longest match distance the compressor used.
    pub max_distance: U16,
    /// Largest physical cluster, in blocks.
    pub max_pclusterblks: U16,
    /// Reserved.
    pub reserved: [u8; 10],
}
const _: () = assert!(size_of::<z_erofs_lz4_cfgs>() == 14);

/// `struct z_erofs_lzma_cfgs`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_lzma_cfgs {
    /// Dictionary size in bytes.
    pub dict_size: U32,
    /// Format (0).
    pub format: U16,
    /// Reserved.
    pub reserved: [u8; 8],
}
const _: () = assert!(size_of::<z_erofs_lzma_cfgs>() == 14);

/// `struct z_erofs_deflate_cfgs`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_deflate_cfgs {
    /// log2 of the window.
    pub windowbits: u8,
    /// Reserved.
    pub reserved: [u8; 5],
}
const _: () = assert!(size_of::<z_erofs_deflate_cfgs>() == 6);

/// `struct z_erofs_zstd_cfgs`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_zstd_cfgs {
    /// Format (0).
    pub format: u8,
    /// log2 of the window above 1 KiB.
    pub windowlog: u8,
    /// Reserved.
    pub reserved: [u8; 4],
}
const _: () = assert!(size_of::<z_erofs_zstd_cfgs>() == 6);

// ---- inodes

/// `struct erofs_inode_compact`: the 32-byte inode.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_inode_compact {
    /// Form (bit 0), data layout (bits 1..3), NLINK_1 / DOT_OMITTED (bit 4).
    pub i_format: U16,
    /// Size of the inline xattr body, in its count form.
    pub i_xattr_icount: U16,
    /// Type and permission bits.
    pub i_mode: U16,
    /// The union `i_nb`: the link count (`i_nlink`), or with NLINK_1 the
    /// start block's high 16 bits (`startblk_hi`).
    pub i_nb: U16,
    /// Size in bytes.
    pub i_size: U32,
    /// Seconds after the superblock's epoch.
    pub i_mtime: U32,
    /// The union `i_u`: start block, compressed blocks, rdev or chunk
    /// format.
    pub i_u: U32,
    /// Inode number for 32-bit stat.
    pub i_ino: U32,
    /// Owner.
    pub i_uid: U16,
    /// Group.
    pub i_gid: U16,
    /// Reserved.
    pub i_reserved: U32,
}
const _: () = assert!(size_of::<erofs_inode_compact>() == 32);

/// `struct erofs_inode_extended`: the 64-byte inode.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_inode_extended {
    /// As the compact inode's.
    pub i_format: U16,
    /// As the compact inode's.
    pub i_xattr_icount: U16,
    /// As the compact inode's.
    pub i_mode: U16,
    /// The union `i_nb`: reserved, or the start block's high 16 bits
    /// (`startblk_hi`).
    pub i_nb: U16,
    /// Size in bytes.
    pub i_size: U64,
    /// As the compact inode's.
    pub i_u: U32,
    /// Inode number for 32-bit stat.
    pub i_ino: U32,
    /// Owner.
    pub i_uid: U32,
    /// Group.
    pub i_gid: U32,
    /// Modification seconds since 1970.
    pub i_mtime: U64,
    /// Modification nanoseconds.
    pub i_mtime_nsec: U32,
    /// Hard link count.
    pub i_nlink: U32,
    /// Reserved.
    pub i_reserved2: [u8; 16],
}
const _: () = assert!(size_of::<erofs_inode_extended>() == 64);

// ---- chunk-based files

/// `struct erofs_inode_chunk_index`: an 8-byte chunk table entry (the
/// 4-byte form is a bare little-endian block address).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_inode_chunk_index {
    /// With the 48BIT chunk format, the start block's high 16 bits.
    pub startblk_hi: U16,
    /// 0 = the primary device, n = extra device n.
    pub device_id: U16,
    /// The start block's low 32 bits.
    pub startblk_lo: U32,
}
const _: () = assert!(size_of::<erofs_inode_chunk_index>() == 8);

// ---- directories

/// `struct erofs_dirent`: one directory entry (names follow the entries).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_dirent {
    /// The inode named.
    pub nid: U64,
    /// Byte offset of the name in the block.
    pub nameoff: U16,
    /// `EROFS_FT_*`.
    pub file_type: u8,
    /// Reserved.
    pub reserved: u8,
}
const _: () = assert!(size_of::<erofs_dirent>() == 12);

// ---- extended attributes

/// `struct erofs_xattr_ibody_header`: the start of an inode's xattr body,
/// followed by `h_shared_count` 4-byte shared xattr ids.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_xattr_ibody_header {
    /// The name filter: a set bit means no name hashing to it is present.
    pub h_name_filter: U32,
    /// Number of shared xattr ids after the header.
    pub h_shared_count: u8,
    /// Reserved.
    pub h_reserved2: [u8; 7],
}
const _: () = assert!(size_of::<erofs_xattr_ibody_header>() == 12);

/// `struct erofs_xattr_entry`: an xattr's header, followed by the name
/// suffix and the value, padded to 4 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct erofs_xattr_entry {
    /// Bytes of the name after its prefix.
    pub e_name_len: u8,
    /// The prefix: a built-in index, or with bit 7 a long prefix.
    pub e_name_index: u8,
    /// Bytes of the value.
    pub e_value_size: U16,
}
const _: () = assert!(size_of::<erofs_xattr_entry>() == 4);

// ---- compressed files

/// `struct z_erofs_map_header`: 8 bytes at the first 8-byte boundary after
/// a compressed inode and its xattrs.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_map_header {
    /// The first union: the fragment's offset in the packed inode
    /// (`h_fragmentoff`), or `h_reserved1` then the inline tail's size
    /// (`h_idata_size`), or with extent records their count's low 32 bits
    /// (`h_extents_lo`).
    pub h_u: U32,
    /// `Z_EROFS_ADVISE_*` bits.
    pub h_advise: U16,
    /// Algorithms of HEAD1 (bits 0..3) and HEAD2 (bits 4..7) clusters; with
    /// long extent records, the low byte of `h_extents_hi`.
    pub h_algorithmtype: u8,
    /// lclusterbits above blkszbits (bits 0..3), the whole file in the
    /// packed inode (bit 7); with long extent records, the high byte of
    /// `h_extents_hi`.
    pub h_clusterbits: u8,
}
const _: () = assert!(size_of::<z_erofs_map_header>() == 8);

impl z_erofs_map_header {
    /// `h_idata_size`: the inline last cluster's size.
    pub fn h_idata_size(&self) -> u16 {
        (self.h_u.get() >> 16) as u16
    }

    /// `h_extents_hi`: the extent count's high 16 bits.
    pub fn h_extents_hi(&self) -> u16 {
        u16::from_le_bytes([self.h_algorithmtype, self.h_clusterbits])
    }

    /// The header as one little-endian word, as the kernel reads a whole
    /// file's fragment offset (bit 63 set) from it.
    pub fn word(&self) -> u64 {
        u64::from_le_bytes(self.as_bytes().try_into().expect("8 bytes"))
    }
}

/// `struct z_erofs_lcluster_index`: a full (8-byte) logical-cluster index.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_lcluster_index {
    /// The cluster type (bits 0..1) and `Z_EROFS_LI_PARTIAL_REF`.
    pub di_advise: U16,
    /// A head's extent offset within the lcluster.
    pub di_clusterofs: U16,
    /// The union `di_u`: a head's physical block (`blkaddr`), or a
    /// non-head's distances back and on (`delta[0]`, `delta[1]`).
    pub di_u: U32,
}
const _: () = assert!(size_of::<z_erofs_lcluster_index>() == 8);

impl z_erofs_lcluster_index {
    /// `di_u.blkaddr`.
    pub fn blkaddr(&self) -> u32 {
        self.di_u.get()
    }

    /// `di_u.delta`.
    pub fn delta(&self) -> [u16; 2] {
        let v = self.di_u.get();
        [v as u16, (v >> 16) as u16]
    }

    /// `di_u` holding `delta`.
    pub fn di_u_delta(delta: [u16; 2]) -> U32 {
        U32::new(u32::from(delta[0]) | u32::from(delta[1]) << 16)
    }
}

/// `struct z_erofs_extent`: an extent record. Records of 4, 8 and 16 bytes
/// are its prefixes; a reader that zero-fills the rest reads every size
/// as this one.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct z_erofs_extent {
    /// Encoded length, partial flag and format (`Z_EROFS_EXTENT_PLEN_*`).
    pub plen: U32,
    /// Physical byte address, low 32 bits.
    pub pstart_lo: U32,
    /// Physical byte address, high 32 bits.
    pub pstart_hi: U32,
    /// Logical start, low 32 bits.
    pub lstart_lo: U32,
    /// Logical start, high 32 bits.
    pub lstart_hi: U32,
    /// Reserved.
    pub reserved: [U32; 3],
}
const _: () = assert!(size_of::<z_erofs_extent>() == 32);

impl z_erofs_extent {
    /// The physical byte address.
    pub fn pstart(&self) -> u64 {
        u64::from(self.pstart_lo.get()) | u64::from(self.pstart_hi.get()) << 32
    }

    /// The logical start.
    pub fn lstart(&self) -> u64 {
        u64::from(self.lstart_lo.get()) | u64::from(self.lstart_hi.get()) << 32
    }
}

// ---- compact lcluster indexes: bit-packed, so no struct declares them

/// Bytes from the map header to the first full lcluster index: the header
/// and 8 reserved bytes (`Z_EROFS_FULL_INDEX_START`).
pub const FULL_INDEX_START: u64 = size_of::<z_erofs_map_header>() as u64 + 8;

/// Bits of a compact entry's `lo` (an offset in the lcluster or a
/// distance), below its 2 type bits: the lcluster bits, but room for
/// `Z_EROFS_LI_D0_CBLKCNT` at least.
pub fn compact_lobits(lclusterbits: u32) -> u32 {
    lclusterbits.max(super::LI_D0_CBLKCNT.trailing_zeros() + 1)
}

/// How `n` compact entries whose area starts `mpos` bytes from a 32-byte
/// boundary split: 4-byte entries up to the boundary, then (with
/// COMPACTED_2B) 2-byte ones in whole packs of 16, then 4-byte ones.
pub fn compact_split(n: u64, mpos: u64, two_byte: bool) -> (u64, u64, u64) {
    let ini = ((32 - mpos % 32) / 4) % 8;
    if ini > n {
        return (0, 0, n);
    }
    let two = if two_byte { (n - ini) / 16 * 16 } else { 0 };
    (ini, two, n - ini - two)
}

/// Bytes at the end of a compact pack holding its base block address.
const PACK_BASE: usize = 4;

/// Bits of each of the `vcnt` entries of `pack`: they share what the base
/// leaves of it, from its first byte on.
fn encodebits(pack: &[u8], vcnt: usize) -> usize {
    (pack.len() - PACK_BASE) * 8 / vcnt
}

/// Entry `i` of a compact pack of `vcnt` entries: its `lo` and its
/// lcluster type.
pub fn compact_entry(pack: &[u8], vcnt: usize, lobits: u32, i: usize) -> (u32, u8) {
    let bit = encodebits(pack, vcnt) * i;
    let entries = &pack[..pack.len() - PACK_BASE];
    let mut w = [0u8; 4];
    let src = &entries[bit / 8..];
    let n = src.len().min(4);
    w[..n].copy_from_slice(&src[..n]);
    let v = u32::from_le_bytes(w) >> (bit % 8);
    (v & ((1 << lobits) - 1), ((v >> lobits) & 3) as u8)
}

/// Sets entry `i` (still zero) of a compact pack of `vcnt` entries.
pub fn put_compact_entry(pack: &mut [u8], vcnt: usize, lobits: u32, i: usize, lo: u32, kind: u8) {
    let bit = encodebits(pack, vcnt) * i;
    let end = pack.len() - PACK_BASE;
    let v = (u32::from(kind) << lobits | lo) << (bit % 8);
    for (k, b) in v.to_le_bytes().into_iter().enumerate() {
        if bit / 8 + k < end {
            pack[bit / 8 + k] |= b;
        }
    }
}

/// A compact pack's base block address.
pub fn compact_base(pack: &[u8]) -> u32 {
    let at = pack.len() - PACK_BASE;
    u32::from_le_bytes(pack[at..].try_into().expect("4 bytes"))
}

/// Sets a compact pack's base block address.
pub fn put_compact_base(pack: &mut [u8], base: u32) {
    let at = pack.len() - PACK_BASE;
    pack[at..].copy_from_slice(&base.to_le_bytes());
}
