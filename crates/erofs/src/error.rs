//! Kinds of EROFS damage and of features this reader does not implement, as
//! carried by [`foliofs_vfs::Error::Corrupt`] (which also holds the byte
//! offset) and [`foliofs_vfs::Error::Incompatible`].

use std::path::PathBuf;

use foliofs_vfs::FileType;

use crate::format::{
    algorithm_name, incompat_name, Algorithm, MAGIC, MAX_DECODED, MAX_EXTENT, MAX_PCLUSTER,
};

/// What is wrong with an EROFS image. Reading reports the first of these
/// it meets; [`Erofs::fsck`](crate::Erofs::fsck) reports every one it finds.
///
/// A `nid` field is the nid of the inode concerned, with the metabox bit
/// when the inode is in the metabox; sizes, lengths and positions are in
/// bytes unless a field says otherwise.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    // ---- the superblock and what it leads to
    /// Fewer bytes than a superblock after byte 1024.
    #[error("image too small to hold an EROFS superblock")]
    SuperblockTruncated,
    /// The file ends before the superblock does.
    #[error("{}: {size} bytes is too small for an EROFS image", path.display())]
    ImageTooSmall {
        /// The image file as it was opened.
        path: PathBuf,
        /// The file's size.
        size: u64,
    },
    /// Not the EROFS magic.
    #[error("bad EROFS magic {found:#010x} (expected {MAGIC:#010x})")]
    BadMagic {
        /// The 32-bit word where the magic belongs.
        found: u32,
    },
    /// A block size outside what EROFS allows.
    #[error("block size 2^{blkszbits} is outside the 512 B..64 KiB EROFS allows")]
    BlockSize {
        /// log2 of the block size, as stored.
        blkszbits: u8,
    },
    /// The volume name fills its field without a NUL.
    #[error("volume name is not NUL-terminated")]
    VolumeNameNotTerminated,
    /// More superblock extension slots than fit in its page.
    #[error("{sb_extslots} superblock extension slots do not fit before the first 4 KiB end")]
    SuperblockExtSlots {
        /// Number of 16-byte extension slots, as stored.
        sb_extslots: u8,
    },
    /// METABOX without the extension slot holding the metabox nid.
    #[error(
        "metabox feature but {sb_extslots} superblock extension slots (the metabox nid needs one)"
    )]
    MetaboxWithoutSlot {
        /// Number of extension slots, as stored.
        sb_extslots: u8,
    },
    /// The packed inode's nid points into the metabox.
    #[error("packed inode nid {nid:#x} points into the metabox")]
    PackedInMetabox {
        /// The packed inode's nid, as stored in the superblock.
        nid: u64,
    },
    /// The metabox inode's nid points into the metabox itself.
    #[error("metabox inode nid {nid:#x} points into the metabox itself")]
    MetaboxInMetabox {
        /// The metabox inode's nid, as stored in the superblock.
        nid: u64,
    },
    /// The superblock's crc32c does not match.
    #[error("superblock checksum {stored:#010x} does not match its contents ({computed:#010x})")]
    SuperblockChecksum {
        /// The checksum the superblock holds.
        stored: u32,
        /// The crc32c of the superblock's bytes as read.
        computed: u32,
    },
    /// A compression configuration record the kernel refuses.
    #[error("{} configuration record: {problem}", algorithm_name(*algorithm))]
    CompressionConfig {
        /// The record's algorithm number (0 LZ4, 1 MicroLZMA, 2 DEFLATE,
        /// 3 Zstd).
        algorithm: u8,
        /// What is wrong with the record.
        problem: ConfigProblem,
    },
    /// A long xattr name prefix of a size the kernel refuses.
    #[error("long xattr prefix {index} is {len} bytes (1 to 256 allowed)")]
    XattrPrefixLength {
        /// The prefix's index in the long prefix table, from 0.
        index: u8,
        /// The prefix's stored length (its base index byte included).
        len: usize,
    },
    /// The long prefix table runs past the end of the packed (or metabox)
    /// inode holding it.
    #[error("long xattr prefix lies beyond the packed or metabox inode holding the table")]
    XattrPrefixOutOfPacked,

    // ---- the packed inode and its fragments
    /// A file keeps data in a fragment but the superblock names no packed
    /// inode.
    #[error("inode {nid}: data kept in a fragment but the image has no packed inode")]
    NoPackedInode {
        /// The nid of the file with the fragment.
        nid: u64,
    },
    /// The packed inode is not a regular file.
    #[error("packed inode {nid} is not a regular file")]
    PackedNotRegular {
        /// The packed inode's nid.
        nid: u64,
    },
    /// The packed inode keeps its own data in fragments, i.e. in itself.
    #[error("packed inode {nid} keeps its own data in a fragment")]
    PackedInodeFragment {
        /// The packed inode's nid.
        nid: u64,
    },
    /// A fragment that runs past the end of the packed inode.
    #[error(
        "inode {nid}: {len}-byte fragment at {offset} runs past the {packed_size}-byte packed inode"
    )]
    FragmentOutOfPacked {
        /// The nid of the file whose fragment it is.
        nid: u64,
        /// Where the fragment starts in the packed inode's data.
        offset: u64,
        /// The fragment's length.
        len: u64,
        /// The packed inode's size.
        packed_size: u64,
    },
    // ---- the metabox
    /// The metabox inode is not a regular file.
    #[error("metabox inode {nid} is not a regular file")]
    MetaboxNotRegular {
        /// The metabox inode's nid.
        nid: u64,
    },
    /// A nid in the metabox on an image without one.
    #[error("nid {nid:#x} is in the metabox but the image has none")]
    NoMetabox {
        /// The nid with the metabox bit.
        nid: u64,
    },
    /// A nid whose inode would lie past the end of the metabox.
    #[error("inode {nid:#x} lies beyond the end of the {size}-byte metabox")]
    InodeOutOfMetabox {
        /// The nid, metabox bit included.
        nid: u64,
        /// The metabox inode's size.
        size: u64,
    },
    /// Metadata of an inode past the end of the metabox.
    #[error("inode {nid:#x}: {len} metadata bytes at {pos} run past the {size}-byte metabox")]
    OutOfMetabox {
        /// The nid of the inode whose metadata was read.
        nid: u64,
        /// Where the read starts in the metabox inode's data.
        pos: u64,
        /// The read's length.
        len: u64,
        /// The metabox inode's size.
        size: u64,
    },
    /// The root is not a directory.
    #[error("root nid {nid} is not a directory")]
    RootNotDirectory {
        /// The root nid from the superblock.
        nid: u64,
    },

    // ---- inodes
    /// A nid whose position overflows.
    #[error("nid {nid} overflows the address space")]
    NidOverflow {
        /// The nid asked for.
        nid: u64,
    },
    /// A nid whose inode would lie past the end of the image.
    #[error("inode {nid} lies beyond the end of the {size}-byte image")]
    InodeOutOfImage {
        /// The nid asked for.
        nid: u64,
        /// The image's size.
        size: u64,
    },
    /// `i_format` bits EROFS does not define.
    #[error("inode {nid}: unknown i_format bits {format:#06x}")]
    BadInodeFormat {
        /// The inode's nid.
        nid: u64,
        /// The whole `i_format` field, as stored.
        format: u16,
    },
    /// An extended inode cut short.
    #[error("inode {nid}: extended inode truncated")]
    ExtendedInodeTruncated {
        /// The inode's nid.
        nid: u64,
    },
    /// A mode whose type bits name no file type.
    #[error("inode {nid}: invalid file type in mode {mode:#o}")]
    BadFileType {
        /// The inode's nid.
        nid: u64,
        /// `i_mode`, as stored.
        mode: u16,
    },
    /// Nanoseconds of a second or more.
    #[error("inode {nid}: mtime nanoseconds {nsec} out of range")]
    BadNanoseconds {
        /// The inode's nid.
        nid: u64,
        /// The mtime's nanoseconds field, as stored.
        nsec: u32,
    },
    /// A size no file can have.
    #[error("inode {nid}: size {size} out of range")]
    BadSize {
        /// The inode's nid.
        nid: u64,
        /// `i_size`, as stored (above `i64::MAX`).
        size: u64,
    },
    /// A device, fifo or socket with a size.
    #[error("inode {nid}: {} with size {size}", kind.short_name())]
    SizedSpecial {
        /// The inode's nid.
        nid: u64,
        /// Its file type, from its mode.
        kind: FileType,
        /// `i_size`, as stored.
        size: u64,
    },
    /// A symlink target longer than the kernel follows.
    #[error("symlink {nid} is {size} bytes long")]
    SymlinkTooLong {
        /// The symlink's nid.
        nid: u64,
        /// Its size: the target's length.
        size: u64,
    },
    /// A symlink whose data ends before its size.
    #[error("symlink {nid} is short")]
    SymlinkShort {
        /// The symlink's nid.
        nid: u64,
    },

    // ---- uncompressed data
    /// A block address that overflows a byte position.
    #[error("inode {nid}: block address overflows")]
    BlockAddressOverflow {
        /// The nid of the file whose data it addresses.
        nid: u64,
    },
    /// An inline tail that does not fit the rest of its block.
    #[error("inode {nid}: {len}-byte inline tail crosses a block boundary")]
    InlineTailCrossesBlock {
        /// The file's nid.
        nid: u64,
        /// The tail's length.
        len: u64,
    },
    /// A chunk size that cannot be.
    #[error("inode {nid}: chunk size 2^{chunkbits} is absurd")]
    ChunkSize {
        /// The file's nid.
        nid: u64,
        /// log2 of the chunk size: the block size's plus the inode's
        /// chunk format bits.
        chunkbits: u32,
    },
    /// A chunk table that runs past the image (or whose position overflows).
    #[error("inode {nid}: the chunk table for {size} bytes runs past the image end")]
    ChunkTableOutOfImage {
        /// The file's nid.
        nid: u64,
        /// The file's size, which sets how many entries the table has.
        size: u64,
    },
    /// A chunk on a device the table does not have.
    #[error("chunk names device {device} of {devices}")]
    NoSuchDevice {
        /// The device id in the chunk entry (1 is the first extra device).
        device: u16,
        /// How many extra devices the device table lists.
        devices: usize,
    },
    /// A block address on a flat extra device that overflows once the
    /// device's place in the image is added.
    #[error("device {device}: position {pos:#x} overflows where the device is mapped")]
    DeviceAddressOverflow {
        /// The device id in the chunk entry.
        device: u16,
        /// The byte position on that device.
        pos: u64,
    },
    /// File data past the end of the device holding it.
    #[error("{len} data bytes at {pos:#x} run past the end of {} ({size} bytes)", device.display())]
    DataOutOfImage {
        /// The read's length.
        len: usize,
        /// Where the read starts on the device.
        pos: u64,
        /// The image or extra device file.
        device: PathBuf,
        /// That file's size.
        size: u64,
    },
    /// An offset of a file that no data run maps.
    #[error("inode {nid}: no data run covers offset {offset}")]
    NoDataRun {
        /// The file's nid.
        nid: u64,
        /// The offset in the file.
        offset: u64,
    },

    // ---- compressed data: the map header and cluster indexes
    /// Big physical clusters without the superblock feature.
    #[error("inode {nid}: big pclusters without the superblock feature")]
    BigPclusterWithoutFeature {
        /// The file's nid.
        nid: u64,
    },
    /// Compact indexes whose two big-pcluster flags disagree.
    #[error("inode {nid}: compact indexes with inconsistent big pcluster flags")]
    CompactBigPclusterFlags {
        /// The file's nid.
        nid: u64,
    },
    /// A logical cluster larger than any physical cluster may be.
    #[error("inode {nid}: logical cluster size 2^{lclusterbits} is too large")]
    LclusterTooLarge {
        /// The file's nid.
        nid: u64,
        /// log2 of the logical cluster size: the block size's plus the
        /// map header's.
        lclusterbits: u32,
    },
    /// A logical cluster too large for compact indexes.
    #[error("inode {nid}: logical cluster 2^{lclusterbits} too large for compact indexes")]
    CompactLclusterTooLarge {
        /// The file's nid.
        nid: u64,
        /// log2 of the logical cluster size.
        lclusterbits: u32,
    },
    /// A size needing more cluster indexes than the image holds.
    #[error("inode {nid}: size {size} needs {indexes} cluster indexes, more than the image holds")]
    IndexesOutOfImage {
        /// The file's nid.
        nid: u64,
        /// The file's size.
        size: u64,
        /// Logical clusters in that size: one index each.
        indexes: u64,
    },
    /// A logical cluster past the end of the file.
    #[error("inode {nid}: logical cluster {lcn} beyond the {total} the file has")]
    LclusterBeyondFile {
        /// The file's nid.
        nid: u64,
        /// The logical cluster number asked for.
        lcn: u64,
        /// Logical clusters in the file.
        total: u64,
    },
    /// A compressed block count without big physical clusters.
    #[error("inode {nid}: lcluster {lcn}: block count without big pclusters")]
    BlockCountWithoutBigPcluster {
        /// The file's nid.
        nid: u64,
        /// The logical cluster whose index holds the count.
        lcn: u64,
    },
    /// A head's offset at or past the end of its logical cluster.
    #[error("inode {nid}: lcluster {lcn}: cluster offset {clusterofs} too large")]
    ClusterOffset {
        /// The file's nid.
        nid: u64,
        /// The head's logical cluster number.
        lcn: u64,
        /// Where the extent starts inside that cluster, as stored.
        clusterofs: u32,
    },
    /// A plain delta of one inside a big-pcluster pack.
    #[error("inode {nid}: lcluster {lcn}: plain delta of 1 in a big-pcluster pack")]
    PlainDeltaInBigPack {
        /// The file's nid.
        nid: u64,
        /// The logical cluster being looked up.
        lcn: u64,
    },
    /// The file's first logical cluster does not start an extent.
    #[error("inode {nid}: logical cluster 0 starts mid-cluster")]
    FirstLclusterMidCluster {
        /// The file's nid.
        nid: u64,
    },
    /// A lookback distance of zero or past the file's start.
    #[error("inode {nid}: lcluster {lcn} looks back {distance} clusters")]
    LookbackDistance {
        /// The file's nid.
        nid: u64,
        /// The non-head logical cluster holding the distance.
        lcn: u64,
        /// Logical clusters back to its head, as stored.
        distance: u32,
    },
    /// A big physical cluster whose block count is missing.
    #[error("inode {nid}: big pcluster at lcluster {lcn} has no block count")]
    MissingBlockCount {
        /// The file's nid.
        nid: u64,
        /// The head's logical cluster number.
        lcn: u64,
    },
    /// A physical cluster above the kernel's limit.
    #[error("inode {nid}: physical cluster of {bytes} bytes exceeds {MAX_PCLUSTER}")]
    PclusterTooLarge {
        /// The file's nid.
        nid: u64,
        /// The physical cluster's size.
        bytes: u64,
    },

    // ---- compressed data: extent records
    /// An extent record table that runs past the image.
    #[error("inode {nid}: {count} extent records of {recsz} bytes run past the image")]
    ExtentRecordsOutOfImage {
        /// The file's nid.
        nid: u64,
        /// Records in the table.
        count: u64,
        /// Bytes per record.
        recsz: u8,
    },
    /// Extent records not in increasing order of logical start.
    #[error("inode {nid}: extent record {index} starts at {lstart}, not after the one before")]
    ExtentOrder {
        /// The file's nid.
        nid: u64,
        /// The record's index in the table, from 0.
        index: u64,
        /// Its logical start: the offset in the file.
        lstart: u64,
    },
    /// An extent record starting past the end of the file.
    #[error("inode {nid}: extent record starts at {lstart}, past the {size}-byte file")]
    ExtentPastEnd {
        /// The file's nid.
        nid: u64,
        /// The record's logical start: the offset in the file.
        lstart: u64,
        /// The file's size.
        size: u64,
    },

    // ---- compressed data: extents
    /// An inline compressed tail that does not fit the rest of its block.
    #[error("inode {nid}: inline compressed tail crosses a block")]
    CompressedTailCrossesBlock {
        /// The file's nid.
        nid: u64,
    },
    /// An uncompressed extent longer than its physical cluster.
    #[error("inode {nid}: uncompressed extent of {llen} bytes in a {plen}-byte cluster")]
    PlainExtentOverrun {
        /// The file's nid.
        nid: u64,
        /// The extent's length in the file.
        llen: u64,
        /// The physical cluster's length in the image.
        plen: u64,
    },
    /// An extent of an algorithm the superblock does not list.
    #[error(
        "inode {nid}: extent uses {} which the superblock does not list",
        algorithm_name(*algorithm)
    )]
    UnlistedAlgorithm {
        /// The file's nid.
        nid: u64,
        /// The algorithm number the extent names.
        algorithm: u8,
    },
    /// An extent longer than its cluster could ever decompress to.
    #[error("inode {nid}: extent of {llen} bytes cannot come from a {plen}-byte LZ4 cluster")]
    Lz4Ratio {
        /// The file's nid.
        nid: u64,
        /// The extent's length in the file.
        llen: u64,
        /// The physical cluster's length in the image.
        plen: u64,
    },
    /// A compressed extent longer than the kernel decodes from one cluster.
    #[error("inode {nid}: extent at {la} of {llen} bytes is above the {MAX_DECODED} one cluster may decode to")]
    DecodedTooLong {
        /// The file's nid.
        nid: u64,
        /// Where the extent starts in the file.
        la: u64,
        /// The extent's length in the file.
        llen: u64,
    },
    /// An extent longer than this reader materialises.
    #[error("inode {nid}: extent at {la} decompresses to more than {MAX_EXTENT} bytes")]
    ExtentTooLong {
        /// The file's nid.
        nid: u64,
        /// Where the extent starts in the file.
        la: u64,
    },
    /// An extent whose end is not past its start.
    #[error("inode {nid}: extent at {la} has no length")]
    EmptyExtent {
        /// The file's nid.
        nid: u64,
        /// Where the extent starts in the file.
        la: u64,
    },
    /// An offset of a compressed file that no extent maps.
    #[error("inode {nid}: no extent covers offset {offset}")]
    NoExtent {
        /// The file's nid.
        nid: u64,
        /// The offset in the file.
        offset: u64,
    },
    /// A physical cluster that does not decode to its extent.
    #[error("extent at file offset {la}: {problem}")]
    Decompress {
        /// Where the extent starts in the file.
        la: u64,
        /// Why it does not decode.
        problem: Decode,
    },

    // ---- directories
    /// A directory whose data ends before its size.
    #[error("directory {nid} is short")]
    DirectoryShort {
        /// The directory's nid.
        nid: u64,
    },
    /// A directory block too short for one entry.
    #[error("directory block: {len} bytes cannot hold an entry")]
    DirBlockTooSmall {
        /// The block's length (a directory's last block may be partial).
        len: usize,
    },
    /// The first name offset, which counts the entries, is impossible.
    #[error(
        "directory block: first name offset {nameoff} is not a multiple of 12 inside the {len}-byte block"
    )]
    DirentFirstNameOffset {
        /// The first entry's name offset, from the block's start.
        nameoff: usize,
        /// The block's length.
        len: usize,
    },
    /// Name offsets out of order or past the block.
    #[error("directory block: name offset {nameoff} of entry {entry} is out of order or beyond the block")]
    DirentNameOffset {
        /// The entry's index in the block, from 0.
        entry: usize,
        /// Its name offset, from the block's start.
        nameoff: usize,
    },
    /// A name no program can be handed (empty, or with '/' or NUL).
    #[error(
        "directory block: entry {entry} has an empty name or one holding '/' or NUL: {name:?}"
    )]
    DirentBadName {
        /// The entry's index in the block, from 0.
        entry: usize,
        /// The name, invalid UTF-8 replaced.
        name: String,
    },
    /// A name a full check refuses (empty, too long, or with '/').
    #[error("invalid name {name:?}")]
    InvalidName {
        /// The name, invalid UTF-8 replaced.
        name: String,
    },
    /// Entries not in byte order (lookups bisect them).
    #[error("entry {name:?} is out of order")]
    DirentOrder {
        /// The first name found not after the one before, invalid UTF-8
        /// replaced.
        name: String,
    },
    /// "." names another inode.
    #[error("\".\" names nid {target}, not {nid}")]
    BadDot {
        /// The directory's nid.
        nid: u64,
        /// The nid its "." names.
        target: u64,
    },
    /// ".." names another inode than the parent.
    #[error("\"..\" names nid {target}, not {parent}")]
    BadDotDot {
        /// The nid of the directory the walk reached this one from.
        parent: u64,
        /// The nid its ".." names.
        target: u64,
    },
    /// A directory without "." or "..".
    #[error("directory lacks \".\" or \"..\"")]
    NoDots,
    /// An entry's file type differs from its inode's.
    #[error("entry type {file_type} does not match the inode's {}", kind.short_name())]
    DirentType {
        /// The entry's file type number, as stored.
        file_type: u8,
        /// The type the inode's mode gives.
        kind: FileType,
    },
    /// A directory listed in two places.
    #[error("directory {nid} is reached twice")]
    DirectoryTwice {
        /// The directory's nid.
        nid: u64,
    },
    /// More names for an inode than its link count.
    #[error("nid {nid} has {names} names but nlink {nlink}")]
    LinkCount {
        /// The inode's nid.
        nid: u64,
        /// Directory entries found naming it.
        names: u32,
        /// Its link count, as stored.
        nlink: u32,
    },

    // ---- extended attributes
    /// More shared xattr ids than the xattr body holds.
    #[error("inode {nid}: {shared} shared xattrs do not fit its {size}-byte xattr body")]
    SharedXattrOverrun {
        /// The inode's nid.
        nid: u64,
        /// The shared xattr count in the body's header.
        shared: u64,
        /// The inline xattr body's size, from `i_xattr_icount`.
        size: u64,
    },
    /// An xattr entry running past the xattr body.
    #[error("inode {nid}: xattr entry runs past the xattr body")]
    XattrOverrun {
        /// The inode's nid.
        nid: u64,
    },
}

/// What is wrong with a compression configuration record.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A record shorter (or, for MicroLZMA, other) than its fields.
    #[error("{len} bytes (expected {expected})")]
    Size {
        /// The record's length, as stored.
        len: u16,
        /// The length its fields take.
        expected: u16,
    },
    /// LZ4 physical clusters above the 1 MiB the kernel takes.
    #[error("physical clusters of {blocks} blocks exceed 1 MiB")]
    Lz4PclusterBlocks {
        /// The largest physical cluster, in blocks, as stored.
        blocks: u16,
    },
    /// A MicroLZMA format other than 0.
    #[error("unknown format {format}")]
    LzmaFormat {
        /// The format field, as stored.
        format: u16,
    },
    /// A dictionary outside 4 KiB..8 MiB.
    #[error("dictionary of {dict_size} bytes is outside 4 KiB..8 MiB")]
    LzmaDictSize {
        /// The dictionary size in bytes, as stored.
        dict_size: u32,
    },
    /// A DEFLATE window above 2^15.
    #[error("window of 2^{windowbits} bytes is above 2^15")]
    DeflateWindowBits {
        /// log2 of the window size in bytes, as stored.
        windowbits: u8,
    },
    /// A Zstd format other than 0.
    #[error("unknown format {format}")]
    ZstdFormat {
        /// The format field, as stored.
        format: u8,
    },
    /// A Zstd window above 1 MiB.
    #[error("window log {windowlog} (2^{} bytes) is above 2^20", *windowlog as u32 + 10)]
    ZstdWindowLog {
        /// The window log as stored: the window is 2^(windowlog + 10)
        /// bytes.
        windowlog: u8,
    },
}

/// Why a physical cluster does not decode to its extent.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Decode {
    /// An extent larger than the buffer it is decoded into.
    #[error("{llen}-byte extent for a {buffer}-byte buffer")]
    Buffer {
        /// The extent's decoded length in bytes.
        llen: usize,
        /// The buffer's length in bytes.
        buffer: usize,
    },
    /// An uncompressed extent longer than its cluster.
    #[error("uncompressed extent longer than its cluster")]
    PlainOverrun,
    /// A cluster that is all zeros up to its first block's end, where its
    /// right-aligned data should have started.
    #[error("{algorithm} cluster starts with a block of zeros")]
    ZeroBlock {
        /// The extent's algorithm.
        algorithm: Algorithm,
    },
    /// The decoder refused the stream.
    #[error("{algorithm} data does not decode: {reason}")]
    Invalid {
        /// The extent's algorithm.
        algorithm: Algorithm,
        /// The decoder's own message.
        reason: String,
    },
    /// The stream decodes to fewer bytes than the extent has.
    #[error("{algorithm} data decodes to {decoded} bytes, not {llen}")]
    Short {
        /// The extent's algorithm.
        algorithm: Algorithm,
        /// Bytes the stream decodes to.
        decoded: usize,
        /// The extent's length in bytes.
        llen: usize,
    },
    /// More output than one physical cluster may decode to.
    #[error("{llen} bytes to decode, above the {most} one cluster may hold")]
    TooLong {
        /// Bytes asked for, or that the stream holds.
        llen: usize,
        /// The limit in bytes ([`MAX_DECODED`]).
        most: usize,
    },
    /// Data of an algorithm the superblock has no configuration for.
    #[error("{algorithm} data without a {algorithm} configuration record")]
    NoConfig {
        /// The extent's algorithm.
        algorithm: Algorithm,
    },
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
    Features {
        /// Those bits of `feature_incompat`; the rest are masked out.
        bits: u32,
    },
    /// Directory blocks larger than the block size.
    #[error("EROFS directory block size 2^{dirblkbits} above the block size")]
    DirBlockBits {
        /// `dirblkbits` as stored: log2 of directory block size over
        /// block size.
        dirblkbits: u8,
    },
    /// The superblock lists a compression algorithm this reader does not
    /// know (the lowest such number).
    #[error("EROFS image uses {} compression", algorithm_name(*algorithm))]
    Algorithm {
        /// The algorithm number.
        algorithm: u8,
    },
    /// An extent of inode `nid` names a compression algorithm this reader
    /// does not know.
    #[error("inode {nid}: {} compression", algorithm_name(*algorithm))]
    ExtentAlgorithm {
        /// The file's nid.
        nid: u64,
        /// The algorithm number the extent names.
        algorithm: u8,
    },
    /// A data layout number EROFS does not define yet.
    #[error("inode {nid}: data layout {layout}")]
    DataLayout {
        /// The inode's nid.
        nid: u64,
        /// The layout bits of `i_format`, shifted down.
        layout: u16,
    },
    /// A compressed inode that is neither a regular file, a directory nor a
    /// symlink.
    #[error("inode {nid}: compressed {}", kind.short_name())]
    CompressedNonRegular {
        /// The inode's nid.
        nid: u64,
        /// Its file type, from its mode.
        kind: FileType,
    },
    /// Chunk format bits this reader does not know.
    #[error("inode {nid}: chunk format {format:#x}")]
    ChunkFormat {
        /// The file's nid.
        nid: u64,
        /// The whole chunk format field, as stored.
        format: u16,
    },
    /// 2-byte compact indexes with logical clusters above 4 KiB.
    #[error("inode {nid}: 2-byte compact indexes with 2^{lclusterbits} logical clusters")]
    CompactIndexes2B {
        /// The file's nid.
        nid: u64,
        /// log2 of the logical cluster size.
        lclusterbits: u32,
    },
    /// Extra devices given for an image without a device table.
    #[error(
        "{}: {given} extra device(s) given but the image has no device table",
        path.display()
    )]
    DevicesWithoutTable {
        /// The image file.
        path: PathBuf,
        /// Extra devices given.
        given: usize,
    },
    /// Extra devices the image needs but that were not given.
    #[error(
        "{}: the image keeps data on {count} extra device(s) (first: \"{first}\"); pass each with -o device=PATH",
        path.display()
    )]
    DevicesNeeded {
        /// The image file.
        path: PathBuf,
        /// Extra devices in the image's device table.
        count: usize,
        /// The first unmapped device's tag, invalid UTF-8 replaced.
        first: String,
    },
    /// A different number of extra devices than the table lists.
    #[error(
        "{}: the image has {count} extra device(s) but {given} were given",
        path.display()
    )]
    DeviceCount {
        /// The image file.
        path: PathBuf,
        /// Extra devices in the image's device table.
        count: usize,
        /// Extra devices given.
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
