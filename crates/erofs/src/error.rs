//! Kinds of EROFS damage and of features this reader does not implement, as
//! carried by [`foliofs_vfs::Error::Corrupt`] (which also holds the byte
//! offset) and [`foliofs_vfs::Error::Incompatible`].

use std::path::PathBuf;

use foliofs_vfs::FileType;

use crate::decompress::{Algorithm, MAX_DECODED};
use crate::superblock::{algorithm_name, incompat_name};
use crate::zmap::{MAX_EXTENT, MAX_PCLUSTER};

/// What is wrong with an EROFS image. Reading reports the first of these
/// it meets; [`Erofs::fsck`](crate::Erofs::fsck) reports every one it finds.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    // ---- the superblock and what it leads to
    /// Fewer bytes than a superblock after byte 1024.
    #[error("image too small to hold an EROFS superblock")]
    SuperblockTruncated,
    /// The file ends before the superblock does.
    #[error("{}: {size} bytes is too small for an EROFS image", path.display())]
    ImageTooSmall { path: PathBuf, size: u64 },
    /// Not the EROFS magic.
    #[error(
        "bad EROFS magic {found:#010x} (expected {:#010x})",
        crate::superblock::MAGIC
    )]
    BadMagic { found: u32 },
    /// A block size outside what EROFS allows.
    #[error("block size 2^{blkszbits} is outside the 512 B..64 KiB EROFS allows")]
    BlockSize { blkszbits: u8 },
    /// The volume name fills its field without a NUL.
    #[error("volume name is not NUL-terminated")]
    VolumeNameNotTerminated,
    /// More superblock extension slots than fit in its page.
    #[error("{sb_extslots} superblock extension slots do not fit before the first 4 KiB end")]
    SuperblockExtSlots { sb_extslots: u8 },
    /// METABOX without the extension slot holding the metabox nid.
    #[error(
        "metabox feature but {sb_extslots} superblock extension slots (the metabox nid needs one)"
    )]
    MetaboxWithoutSlot { sb_extslots: u8 },
    /// The packed inode's nid points into the metabox.
    #[error("packed inode nid {nid:#x} points into the metabox")]
    PackedInMetabox { nid: u64 },
    /// The metabox inode's nid points into the metabox itself.
    #[error("metabox inode nid {nid:#x} points into the metabox itself")]
    MetaboxInMetabox { nid: u64 },
    /// The superblock's crc32c does not match.
    #[error("superblock checksum {stored:#010x} does not match its contents ({computed:#010x})")]
    SuperblockChecksum { stored: u32, computed: u32 },
    /// A compression configuration record the kernel refuses.
    #[error("{} configuration record: {problem}", algorithm_name(*algorithm))]
    CompressionConfig {
        algorithm: u8,
        problem: ConfigProblem,
    },
    /// A long xattr name prefix of a size the kernel refuses.
    #[error("long xattr prefix {index} is {len} bytes (1 to 256 allowed)")]
    XattrPrefixLength { index: u8, len: usize },
    /// The long prefix table runs past the end of the packed (or metabox)
    /// inode holding it.
    #[error("long xattr prefix lies beyond the packed or metabox inode holding the table")]
    XattrPrefixOutOfPacked,

    // ---- the packed inode and its fragments
    /// A file keeps data in a fragment but the superblock names no packed
    /// inode.
    #[error("inode {nid}: data kept in a fragment but the image has no packed inode")]
    NoPackedInode { nid: u64 },
    /// The packed inode is not a regular file.
    #[error("packed inode {nid} is not a regular file")]
    PackedNotRegular { nid: u64 },
    /// The packed inode keeps its own data in fragments, i.e. in itself.
    #[error("packed inode {nid} keeps its own data in a fragment")]
    PackedInodeFragment { nid: u64 },
    /// A fragment that runs past the end of the packed inode.
    #[error(
        "inode {nid}: {len}-byte fragment at {offset} runs past the {packed_size}-byte packed inode"
    )]
    FragmentOutOfPacked {
        nid: u64,
        offset: u64,
        len: u64,
        packed_size: u64,
    },
    // ---- the metabox
    /// The metabox inode is not a regular file.
    #[error("metabox inode {nid} is not a regular file")]
    MetaboxNotRegular { nid: u64 },
    /// A nid in the metabox on an image without one.
    #[error("nid {nid:#x} is in the metabox but the image has none")]
    NoMetabox { nid: u64 },
    /// A nid whose inode would lie past the end of the metabox.
    #[error("inode {nid:#x} lies beyond the end of the {size}-byte metabox")]
    InodeOutOfMetabox { nid: u64, size: u64 },
    /// Metadata of an inode past the end of the metabox.
    #[error("inode {nid:#x}: {len} metadata bytes at {pos} run past the {size}-byte metabox")]
    OutOfMetabox {
        nid: u64,
        pos: u64,
        len: u64,
        size: u64,
    },
    /// The root is not a directory.
    #[error("root nid {nid} is not a directory")]
    RootNotDirectory { nid: u64 },

    // ---- inodes
    /// A nid whose position overflows.
    #[error("nid {nid} overflows the address space")]
    NidOverflow { nid: u64 },
    /// A nid whose inode would lie past the end of the image.
    #[error("inode {nid} lies beyond the end of the {size}-byte image")]
    InodeOutOfImage { nid: u64, size: u64 },
    /// `i_format` bits EROFS does not define.
    #[error("inode {nid}: unknown i_format bits {format:#06x}")]
    BadInodeFormat { nid: u64, format: u16 },
    /// An extended inode cut short.
    #[error("inode {nid}: extended inode truncated")]
    ExtendedInodeTruncated { nid: u64 },
    /// A mode whose type bits name no file type.
    #[error("inode {nid}: invalid file type in mode {mode:#o}")]
    BadFileType { nid: u64, mode: u16 },
    /// Nanoseconds of a second or more.
    #[error("inode {nid}: mtime nanoseconds {nsec} out of range")]
    BadNanoseconds { nid: u64, nsec: u32 },
    /// A size no file can have.
    #[error("inode {nid}: size {size} out of range")]
    BadSize { nid: u64, size: u64 },
    /// A device, fifo or socket with a size.
    #[error("inode {nid}: {} with size {size}", kind.short_name())]
    SizedSpecial { nid: u64, kind: FileType, size: u64 },
    /// A symlink target longer than the kernel follows.
    #[error("symlink {nid} is {size} bytes long")]
    SymlinkTooLong { nid: u64, size: u64 },
    /// A symlink whose data ends before its size.
    #[error("symlink {nid} is short")]
    SymlinkShort { nid: u64 },

    // ---- uncompressed data
    /// A block address that overflows a byte position.
    #[error("inode {nid}: block address overflows")]
    BlockAddressOverflow { nid: u64 },
    /// An inline tail that does not fit the rest of its block.
    #[error("inode {nid}: {len}-byte inline tail crosses a block boundary")]
    InlineTailCrossesBlock { nid: u64, len: u64 },
    /// A chunk size that cannot be.
    #[error("inode {nid}: chunk size 2^{chunkbits} is absurd")]
    ChunkSize { nid: u64, chunkbits: u32 },
    /// A chunk table that runs past the image (or whose position overflows).
    #[error("inode {nid}: the chunk table for {size} bytes runs past the image end")]
    ChunkTableOutOfImage { nid: u64, size: u64 },
    /// A chunk on a device the table does not have.
    #[error("chunk names device {device} of {devices}")]
    NoSuchDevice { device: u16, devices: usize },
    /// A block address on a flat extra device that overflows once the
    /// device's place in the image is added.
    #[error("device {device}: position {pos:#x} overflows where the device is mapped")]
    DeviceAddressOverflow { device: u16, pos: u64 },
    /// File data past the end of the device holding it.
    #[error("{len} data bytes at {pos:#x} run past the end of {} ({size} bytes)", device.display())]
    DataOutOfImage {
        len: usize,
        pos: u64,
        device: PathBuf,
        size: u64,
    },
    /// An offset of a file that no data run maps.
    #[error("inode {nid}: no data run covers offset {offset}")]
    NoDataRun { nid: u64, offset: u64 },

    // ---- compressed data: the map header and cluster indexes
    /// Big physical clusters without the superblock feature.
    #[error("inode {nid}: big pclusters without the superblock feature")]
    BigPclusterWithoutFeature { nid: u64 },
    /// Compact indexes whose two big-pcluster flags disagree.
    #[error("inode {nid}: compact indexes with inconsistent big pcluster flags")]
    CompactBigPclusterFlags { nid: u64 },
    /// A logical cluster larger than any physical cluster may be.
    #[error("inode {nid}: logical cluster size 2^{lclusterbits} is too large")]
    LclusterTooLarge { nid: u64, lclusterbits: u32 },
    /// A logical cluster too large for compact indexes.
    #[error("inode {nid}: logical cluster 2^{lclusterbits} too large for compact indexes")]
    CompactLclusterTooLarge { nid: u64, lclusterbits: u32 },
    /// A size needing more cluster indexes than the image holds.
    #[error("inode {nid}: size {size} needs {indexes} cluster indexes, more than the image holds")]
    IndexesOutOfImage { nid: u64, size: u64, indexes: u64 },
    /// A logical cluster past the end of the file.
    #[error("inode {nid}: logical cluster {lcn} beyond the {total} the file has")]
    LclusterBeyondFile { nid: u64, lcn: u64, total: u64 },
    /// A compressed block count without big physical clusters.
    #[error("inode {nid}: lcluster {lcn}: block count without big pclusters")]
    BlockCountWithoutBigPcluster { nid: u64, lcn: u64 },
    /// A head's offset at or past the end of its logical cluster.
    #[error("inode {nid}: lcluster {lcn}: cluster offset {clusterofs} too large")]
    ClusterOffset { nid: u64, lcn: u64, clusterofs: u32 },
    /// A plain delta of one inside a big-pcluster pack.
    #[error("inode {nid}: lcluster {lcn}: plain delta of 1 in a big-pcluster pack")]
    PlainDeltaInBigPack { nid: u64, lcn: u64 },
    /// The file's first logical cluster does not start an extent.
    #[error("inode {nid}: logical cluster 0 starts mid-cluster")]
    FirstLclusterMidCluster { nid: u64 },
    /// A lookback distance of zero or past the file's start.
    #[error("inode {nid}: lcluster {lcn} looks back {distance} clusters")]
    LookbackDistance { nid: u64, lcn: u64, distance: u32 },
    /// A big physical cluster whose block count is missing.
    #[error("inode {nid}: big pcluster at lcluster {lcn} has no block count")]
    MissingBlockCount { nid: u64, lcn: u64 },
    /// A physical cluster above the kernel's limit.
    #[error("inode {nid}: physical cluster of {bytes} bytes exceeds {MAX_PCLUSTER}")]
    PclusterTooLarge { nid: u64, bytes: u64 },

    // ---- compressed data: extent records
    /// An extent record table that runs past the image.
    #[error("inode {nid}: {count} extent records of {recsz} bytes run past the image")]
    ExtentRecordsOutOfImage { nid: u64, count: u64, recsz: u8 },
    /// Extent records not in increasing order of logical start.
    #[error("inode {nid}: extent record {index} starts at {lstart}, not after the one before")]
    ExtentOrder { nid: u64, index: u64, lstart: u64 },
    /// An extent record starting past the end of the file.
    #[error("inode {nid}: extent record starts at {lstart}, past the {size}-byte file")]
    ExtentPastEnd { nid: u64, lstart: u64, size: u64 },

    // ---- compressed data: extents
    /// An inline compressed tail that does not fit the rest of its block.
    #[error("inode {nid}: inline compressed tail crosses a block")]
    CompressedTailCrossesBlock { nid: u64 },
    /// An uncompressed extent longer than its physical cluster.
    #[error("inode {nid}: uncompressed extent of {llen} bytes in a {plen}-byte cluster")]
    PlainExtentOverrun { nid: u64, llen: u64, plen: u64 },
    /// An extent of an algorithm the superblock does not list.
    #[error(
        "inode {nid}: extent uses {} which the superblock does not list",
        algorithm_name(*algorithm)
    )]
    UnlistedAlgorithm { nid: u64, algorithm: u8 },
    /// An extent longer than its cluster could ever decompress to.
    #[error("inode {nid}: extent of {llen} bytes cannot come from a {plen}-byte LZ4 cluster")]
    Lz4Ratio { nid: u64, llen: u64, plen: u64 },
    /// A compressed extent longer than the kernel decodes from one cluster.
    #[error("inode {nid}: extent at {la} of {llen} bytes is above the {MAX_DECODED} one cluster may decode to")]
    DecodedTooLong { nid: u64, la: u64, llen: u64 },
    /// An extent longer than this reader materialises.
    #[error("inode {nid}: extent at {la} decompresses to more than {MAX_EXTENT} bytes")]
    ExtentTooLong { nid: u64, la: u64 },
    /// An extent whose end is not past its start.
    #[error("inode {nid}: extent at {la} has no length")]
    EmptyExtent { nid: u64, la: u64 },
    /// An offset of a compressed file that no extent maps.
    #[error("inode {nid}: no extent covers offset {offset}")]
    NoExtent { nid: u64, offset: u64 },
    /// A physical cluster that does not decode to its extent.
    #[error("extent at file offset {la}: {problem}")]
    Decompress { la: u64, problem: Decode },

    // ---- directories
    /// A directory whose data ends before its size.
    #[error("directory {nid} is short")]
    DirectoryShort { nid: u64 },
    /// A directory block too short for one entry.
    #[error("directory block: {len} bytes cannot hold an entry")]
    DirBlockTooSmall { len: usize },
    /// The first name offset, which counts the entries, is impossible.
    #[error(
        "directory block: first name offset {nameoff} is not a multiple of 12 inside the {len}-byte block"
    )]
    DirentFirstNameOffset { nameoff: usize, len: usize },
    /// Name offsets out of order or past the block.
    #[error("directory block: name offset {nameoff} of entry {entry} is out of order or beyond the block")]
    DirentNameOffset { entry: usize, nameoff: usize },
    /// A name no program can be handed (empty, or with '/' or NUL).
    #[error(
        "directory block: entry {entry} has an empty name or one holding '/' or NUL: {name:?}"
    )]
    DirentBadName { entry: usize, name: String },
    /// A name a full check refuses (empty, too long, or with '/').
    #[error("invalid name {name:?}")]
    InvalidName { name: String },
    /// Entries not in byte order (lookups bisect them).
    #[error("entry {name:?} is out of order")]
    DirentOrder { name: String },
    /// "." names another inode.
    #[error("\".\" names nid {target}, not {nid}")]
    BadDot { nid: u64, target: u64 },
    /// ".." names another inode than the parent.
    #[error("\"..\" names nid {target}, not {parent}")]
    BadDotDot { parent: u64, target: u64 },
    /// A directory without "." or "..".
    #[error("directory lacks \".\" or \"..\"")]
    NoDots,
    /// An entry's file type differs from its inode's.
    #[error("entry type {file_type} does not match the inode's {}", kind.short_name())]
    DirentType { file_type: u8, kind: FileType },
    /// A directory listed in two places.
    #[error("directory {nid} is reached twice")]
    DirectoryTwice { nid: u64 },
    /// More names for an inode than its link count.
    #[error("nid {nid} has {names} names but nlink {nlink}")]
    LinkCount { nid: u64, names: u32, nlink: u32 },

    // ---- extended attributes
    /// More shared xattr ids than the xattr body holds.
    #[error("inode {nid}: {shared} shared xattrs do not fit its {size}-byte xattr body")]
    SharedXattrOverrun { nid: u64, shared: u64, size: u64 },
    /// An xattr entry running past the xattr body.
    #[error("inode {nid}: xattr entry runs past the xattr body")]
    XattrOverrun { nid: u64 },
}

/// What is wrong with a compression configuration record.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A record shorter (or, for MicroLZMA, other) than its fields.
    #[error("{len} bytes (expected {expected})")]
    Size { len: u16, expected: u16 },
    /// LZ4 physical clusters above the 1 MiB the kernel takes.
    #[error("physical clusters of {blocks} blocks exceed 1 MiB")]
    Lz4PclusterBlocks { blocks: u16 },
    /// A MicroLZMA format other than 0.
    #[error("unknown format {format}")]
    LzmaFormat { format: u16 },
    /// A dictionary outside 4 KiB..8 MiB.
    #[error("dictionary of {dict_size} bytes is outside 4 KiB..8 MiB")]
    LzmaDictSize { dict_size: u32 },
    /// A DEFLATE window above 2^15.
    #[error("window of 2^{windowbits} bytes is above 2^15")]
    DeflateWindowBits { windowbits: u8 },
    /// A Zstd format other than 0.
    #[error("unknown format {format}")]
    ZstdFormat { format: u8 },
    /// A Zstd window above 1 MiB.
    #[error("window log {windowlog} (2^{} bytes) is above 2^20", *windowlog as u32 + 10)]
    ZstdWindowLog { windowlog: u8 },
}

/// Why a physical cluster does not decode to its extent.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Decode {
    /// An extent larger than the buffer it is decoded into.
    #[error("{llen}-byte extent for a {buffer}-byte buffer")]
    Buffer { llen: usize, buffer: usize },
    /// An uncompressed extent longer than its cluster.
    #[error("uncompressed extent longer than its cluster")]
    PlainOverrun,
    /// A cluster that is all zeros up to its first block's end, where its
    /// right-aligned data should have started.
    #[error("{algorithm} cluster starts with a block of zeros")]
    ZeroBlock { algorithm: Algorithm },
    /// The decoder refused the stream.
    #[error("{algorithm} data does not decode: {reason}")]
    Invalid {
        algorithm: Algorithm,
        reason: String,
    },
    /// The stream decodes to fewer bytes than the extent has.
    #[error("{algorithm} data decodes to {decoded} bytes, not {llen}")]
    Short {
        algorithm: Algorithm,
        decoded: usize,
        llen: usize,
    },
    /// More output than one physical cluster may decode to.
    #[error("{llen} bytes to decode, above the {most} one cluster may hold")]
    TooLong { llen: usize, most: usize },
    /// Data of an algorithm the superblock has no configuration for.
    #[error("{algorithm} data without a {algorithm} configuration record")]
    NoConfig { algorithm: Algorithm },
    /// No end of the (left-aligned) LZ4 stream decodes to the extent.
    #[error("LZ4 data does not decode to the extent length")]
    Lz4NoEnd,
    /// The extent is kept in a fragment of the packed inode, not in a
    /// physical cluster.
    #[error("extent is kept in a fragment, not in a cluster")]
    NotInCluster,
}

/// What an EROFS image uses that this reader does not implement, or extra
/// devices that do not match the image's device table.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    /// Incompat feature bits this reader does not implement (each named).
    #[error("EROFS image uses {}", incompat_names(*bits))]
    Features { bits: u32 },
    /// Directory blocks larger than the block size.
    #[error("EROFS directory block size 2^{dirblkbits} above the block size")]
    DirBlockBits { dirblkbits: u8 },
    /// The superblock lists a compression algorithm this reader does not
    /// know (the lowest such number).
    #[error("EROFS image uses {} compression", algorithm_name(*algorithm))]
    Algorithm { algorithm: u8 },
    /// An extent of inode `nid` uses a compression algorithm other than LZ4.
    #[error("inode {nid}: {} compression", algorithm_name(*algorithm))]
    ExtentAlgorithm { nid: u64, algorithm: u8 },
    /// A data layout number EROFS does not define yet.
    #[error("inode {nid}: data layout {layout}")]
    DataLayout { nid: u64, layout: u16 },
    /// A compressed inode that is neither a regular file, a directory nor a
    /// symlink.
    #[error("inode {nid}: compressed {}", kind.short_name())]
    CompressedNonRegular { nid: u64, kind: FileType },
    /// Chunk format bits this reader does not know.
    #[error("inode {nid}: chunk format {format:#x}")]
    ChunkFormat { nid: u64, format: u16 },
    /// 2-byte compact indexes with logical clusters above 4 KiB.
    #[error("inode {nid}: 2-byte compact indexes with 2^{lclusterbits} logical clusters")]
    CompactIndexes2B { nid: u64, lclusterbits: u32 },
    /// Extra devices given for an image without a device table.
    #[error(
        "{}: {given} extra device(s) given but the image has no device table",
        path.display()
    )]
    DevicesWithoutTable { path: PathBuf, given: usize },
    /// Extra devices the image needs but that were not given.
    #[error(
        "{}: the image keeps data on {count} extra device(s) (first: \"{first}\"); pass each with -o device=PATH",
        path.display()
    )]
    DevicesNeeded {
        path: PathBuf,
        count: usize,
        first: String,
    },
    /// A different number of extra devices than the table lists.
    #[error(
        "{}: the image has {count} extra device(s) but {given} were given",
        path.display()
    )]
    DeviceCount {
        path: PathBuf,
        count: usize,
        given: usize,
    },
}

fn incompat_names(bits: u32) -> String {
    let names: Vec<String> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|b| bits & b != 0)
        .map(incompat_name)
        .collect();
    names.join(", ")
}
