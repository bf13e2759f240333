//! Kinds of romfs damage, as carried by [`foliofs_vfs::Error::Corrupt`]
//! (which also holds the byte offset). romfs has no optional features, so
//! nothing is ever incompatible: what cannot be read is damage.

use crate::header::EntryType;
use crate::superblock::MAX_NAME;
use crate::MAX_SYMLINK;

/// What is wrong with a romfs image. Reading reports the first of these
/// it meets; [`check`](crate::check::check) reports every one it finds.
// Every field is shown by its variant's message, which says what it is.
#[allow(missing_docs)]
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    // ---- the superblock
    /// The image starts with the magic but is shorter than a superblock.
    #[error("superblock truncated: the image is only {len} bytes")]
    SuperblockTruncated { len: usize },
    /// The image does not start with `-rom1fs-`.
    #[error("no romfs magic: expected \"-rom1fs-\", found {found:02x?}")]
    BadMagic { found: Vec<u8> },
    /// The superblock declares more bytes than the file holds.
    #[error(
        "superblock says the image is {declared} bytes but the file holds only {actual} (truncated?)"
    )]
    ImageTruncated { declared: u32, actual: u64 },
    /// The volume name's NUL would lie past the end of the image.
    #[error("volume name runs beyond the end of the image")]
    VolumeNameOutOfImage,
    /// No NUL within the longest volume name.
    #[error("volume name is longer than {MAX_NAME} bytes (no NUL found)")]
    VolumeNameNotTerminated,
    /// The declared size ends before the root header.
    #[error("superblock size {size} leaves no room for the root header at {root:#x}")]
    NoRoomForRoot { size: u32, root: u64 },
    /// The image is shorter than the bytes its superblock checksum covers.
    #[error("superblock checksum area is truncated")]
    SuperblockChecksumTruncated,
    /// The first `span` bytes do not sum to zero.
    #[error("bad superblock checksum: the first {span} bytes sum to {sum:#010x}, not 0")]
    SuperblockChecksum { span: usize, sum: u32 },
    /// The first header is not a directory.
    #[error("the root entry at {offset:#x} is a {}, not a directory", kind.name())]
    RootNotDirectory { offset: u64, kind: EntryType },

    // ---- one header
    /// A pointer to a header lands before the first header.
    #[error(
        "header offset {offset:#x} points into the superblock (the first header is at {first:#x})"
    )]
    HeaderInSuperblock { offset: u64, first: u64 },
    /// A pointer to a header is not 16-byte aligned.
    #[error("header offset {offset:#x} is not 16-byte aligned")]
    HeaderMisaligned { offset: u64 },
    /// A header (with at least its name's first byte) does not fit the image.
    #[error("header at {offset:#x} lies beyond the end of the {size}-byte image")]
    HeaderOutOfImage { offset: u64, size: u64 },
    /// An entry name's NUL would lie past the end of the image.
    #[error("entry name runs beyond the end of the image")]
    NameOutOfImage,
    /// No NUL within the longest entry name.
    #[error("entry name is longer than {MAX_NAME} bytes (no NUL within 128 bytes)")]
    NameNotTerminated,
    /// The name's 16-byte padding ends past the image.
    #[error(
        "padded name of the header at {offset:#x} ends at {end:#x}, beyond the {size}-byte image"
    )]
    PaddedNameOutOfImage { offset: u64, end: u64, size: u64 },
    /// A file's or symlink's data does not fit the image.
    #[error(
        "{} \"{name}\" at {offset:#x} has {len} bytes of data at {data:#x}, beyond the {size}-byte image",
        kind.name()
    )]
    DataOutOfImage {
        kind: EntryType,
        name: String,
        offset: u64,
        len: u32,
        data: u64,
        size: u64,
    },
    /// `spec` is set on a type that requires it to be zero.
    #[error("{} \"{name}\" at {offset:#x} has spec {spec:#x}; it must be 0", kind.name())]
    SpecNotZero {
        kind: EntryType,
        name: String,
        offset: u64,
        spec: u32,
    },
    /// An entry's name is empty.
    #[error("the entry at {offset:#x} has an empty name")]
    EmptyName { offset: u64 },
    /// An entry's name holds a '/'.
    #[error("the entry at {offset:#x} has a name containing '/': \"{name}\"")]
    NameWithSlash { offset: u64, name: String },
    /// A symlink target longer than the kernel follows.
    #[error("symlink at {offset:#x} has a {len}-byte target; at most {MAX_SYMLINK} are allowed")]
    SymlinkTooLong { offset: u64, len: u32 },
    /// A file's data ended before its size (the image shrank under us).
    #[error("file data of the entry at {offset:#x} ends early")]
    DataEndsEarly { offset: u64 },

    // ---- chains of headers
    /// A directory's chain of `next` pointers comes back to a header.
    #[error("the entry chain of the directory at {dir:#x} loops back to {offset:#x}")]
    ChainLoop { dir: u64, offset: u64 },
    /// Hard links lead to each other without reaching an entry.
    #[error("the hard link at {link:#x} is part of a loop of links through {through:#x}")]
    LinkLoop { link: u64, through: u64 },

    // ---- found only by a full check
    /// A header and its name do not sum to zero (the kernel does not check).
    #[error("bad header checksum: header and name sum to {sum:#010x}, not 0")]
    HeaderChecksum { sum: u32 },
    /// An entry ends past the size the superblock declares.
    #[error("entry ends at {end:#x}, beyond the {declared} bytes the superblock declares")]
    BeyondDeclaredSize { end: u64, declared: u32 },
    /// A hard link's target has flag bits set.
    #[error("hard-link target {spec:#x} is not 16-byte aligned")]
    LinkTargetMisaligned { spec: u32 },
    /// A directory's first-entry pointer has flag bits set.
    #[error("first-entry offset {spec:#x} is not 16-byte aligned")]
    FirstEntryMisaligned { spec: u32 },
    /// Two entries of a directory share a name.
    #[error("duplicate name: an entry of the same name is at {other:#x}")]
    DuplicateName { other: u64 },
    /// A directory's "." names another entry.
    #[error("\".\" points to {target:#x}, not to its directory {dir:#x}")]
    BadDot { target: u64, dir: u64 },
    /// A directory's ".." names another entry than its parent.
    #[error("\"..\" points to {target:#x}, not to the parent directory {parent:#x}")]
    BadDotDot { target: u64, parent: u64 },
    /// A directory contains one of its own ancestors.
    #[error("directory loop: this entry leads back to one of its own ancestors")]
    DirectoryLoop,
    /// A directory is listed in two places.
    #[error("directory is reachable twice (also as {first})")]
    DirectoryTwice { first: String },
    /// Two entries (header with data) share bytes.
    #[error("entry {start:#x}..{end:#x} overlaps {other} ({other_start:#x}..{other_end:#x})")]
    Overlap {
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
}
