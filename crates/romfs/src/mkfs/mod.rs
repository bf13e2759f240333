//! Building romfs images from a directory tree.
//!
//! The layout is the one genromfs uses and the kernel expects: the root
//! header (named ".") right after the superblock, each directory's entries
//! directly after its header, "." and ".." as hard links at the head of every
//! list, data right after each header's padded name. Unlike genromfs, entries
//! are sorted by name and nothing depends on the clock, so one tree always
//! gives the same bytes.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::checksum::{fix, word_sum};
use crate::header::{EntryType, HEADER_SIZE};
use crate::superblock::{CHECKSUM_SPAN, MAGIC, MAX_NAME};

mod layout;
mod scan;
mod write;

use layout::*;
use scan::*;
use write::*;

/// The volume name used when none is given (a fixed one keeps images
/// reproducible).
pub const DEFAULT_VOLUME: &str = "foliofs";
/// Smallest data alignment (romfs's own 16 bytes).
pub const MIN_ALIGN: u64 = 16;
/// Largest data alignment.
pub const MAX_ALIGN: u64 = 2 << 20;
/// Images are padded to a multiple of this.
pub const IMAGE_PAD: u64 = 1024;
/// The largest image whose offsets fit romfs's 32-bit fields.
pub const MAX_IMAGE: u64 = 1 << 32;

/// Why an image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MkfsError {
    /// Reading the tree or writing the image failed.
    #[error("{path}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A file name longer than 127 bytes.
    #[error("{path}: name is {len} bytes; romfs names hold at most 127")]
    NameTooLong {
        /// The file.
        path: PathBuf,
        /// Its name's length.
        len: usize,
    },
    /// A volume name longer than 127 bytes.
    #[error("volume name is {0} bytes; romfs holds at most 127")]
    VolumeTooLong(usize),
    /// A file of 4 GiB or more.
    #[error("{path}: {size} bytes; romfs files must be smaller than 4 GiB")]
    FileTooBig {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The whole image would not fit 32-bit offsets.
    #[error("the image would be {size} bytes (at {path}); romfs images must not exceed 4 GiB")]
    ImageTooBig {
        /// The source tree.
        path: PathBuf,
        /// The size the image would have.
        size: u64,
    },
    /// A file changed size between the scan and the copy.
    #[error("{path}: file changed size while being read (expected {expected} bytes, {found})")]
    Changed {
        /// The file.
        path: PathBuf,
        /// Its size when the tree was scanned.
        expected: u64,
        /// What was found instead.
        found: String,
    },
    /// A device number that does not fit 16 + 16 bits.
    #[error("{path}: device {major}:{minor} does not fit romfs's 16-bit major and minor")]
    DeviceNumber {
        /// The device node.
        path: PathBuf,
        /// Its major number.
        major: u32,
        /// Its minor number.
        minor: u32,
    },
    /// A file that is none of the types romfs stores.
    #[error("{path}: unsupported file type")]
    UnsupportedType {
        /// The file.
        path: PathBuf,
    },
    /// An alignment that is not a power of two from 16 B to 2 MiB.
    #[error("alignment {0}: must be a power of two from 16 bytes to 2 MiB")]
    BadAlign(u64),
    /// A glob that does not parse.
    #[error("bad pattern {pattern:?}: {why}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// Why it is wrong.
        why: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MkfsError + '_ {
    move |source| MkfsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What to build.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// The volume name (at most 127 bytes).
    pub volume: Vec<u8>,
    /// Every regular file's data starts on a multiple of this (16 = no extra
    /// alignment).
    pub align: u64,
    /// `(alignment, glob)`: matching regular files get their data aligned,
    /// other matching entries their header, to the largest matching value.
    /// A glob with a '/' is matched against the path from the source root
    /// ("/dir/file"), otherwise against the file name.
    pub align_patterns: Vec<(u64, String)>,
    /// Globs (matched like `align_patterns`) of entries to leave out; an
    /// excluded directory is left out with everything in it.
    pub excludes: Vec<String>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            volume: DEFAULT_VOLUME.as_bytes().to_vec(),
            align: MIN_ALIGN,
            align_patterns: Vec::new(),
            excludes: Vec::new(),
        }
    }
}

/// How far a build has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Regular files copied so far.
    pub files_done: u64,
    /// Regular files to copy.
    pub files_total: u64,
    /// Data bytes copied so far.
    pub bytes_done: u64,
    /// Data bytes to copy.
    pub bytes_total: u64,
}

/// What a build produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Size of the image file (padded).
    pub image_size: u64,
    /// Entries written, "." and ".." excluded.
    pub entries: u64,
    /// Regular files stored with their data.
    pub files: u64,
    /// Entries stored as hard links to an earlier name.
    pub hard_links: u64,
    /// Bytes of file data.
    pub data_bytes: u64,
}

/// Builds a romfs image of the tree at `src` into `image`, calling
/// `progress` as files are copied.
pub fn build(
    src: &Path,
    image: &Path,
    opts: &MkfsOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Summary, MkfsError> {
    check_options(opts)?;
    let root_md = source_root(src)?;
    // Created before the scan, which leaves the image out of the tree when
    // it is written inside it.
    let (out, output) = create_image(image)?;
    let tree = scan_tree(src, &root_md, opts, output)?;
    let mut nodes = tree.nodes;
    let placed = lay_out(&mut nodes, tree.root, opts.volume.len(), src)?;
    let mut w = ImageWriter::new(
        out,
        image,
        Summary {
            image_size: placed.padded,
            ..Summary::default()
        },
        Progress {
            files_total: tree.files,
            bytes_total: tree.bytes,
            ..Progress::default()
        },
    );
    w.superblock(&opts.volume, placed.root_off, placed.end)?;
    for s in &placed.slots {
        w.slot(s, &nodes, progress)?;
    }
    let (out, sum) = w.finish(placed.padded)?;
    fix_checksum(out, image, placed.end)?;
    Ok(sum)
}

/// Refuses a volume name romfs cannot hold and alignments out of range.
fn check_options(opts: &MkfsOptions) -> Result<(), MkfsError> {
    if opts.volume.len() > MAX_NAME {
        return Err(MkfsError::VolumeTooLong(opts.volume.len()));
    }
    check_align(opts.align)?;
    for (a, _) in &opts.align_patterns {
        check_align(*a)?;
    }
    Ok(())
}

/// The metadata of the tree's root, which must be a directory.
fn source_root(src: &Path) -> Result<Metadata, MkfsError> {
    let root_md = std::fs::metadata(src).map_err(io_err(src))?;
    if !root_md.is_dir() {
        return Err(MkfsError::Io {
            path: src.to_owned(),
            source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
        });
    }
    Ok(root_md)
}

/// Creates (or truncates) the image file; returns it with its device and
/// inode numbers.
fn create_image(image: &Path) -> Result<(File, (u64, u64)), MkfsError> {
    let out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(image)
        .map_err(io_err(image))?;
    let out_md = out.metadata().map_err(io_err(image))?;
    Ok((out, (out_md.dev(), out_md.ino())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_alignment_places_headers_so_data_lands_on_the_boundary() {
        let mut nodes = Vec::new();
        let mut l = Layout {
            nodes: &mut nodes,
            slots: Vec::new(),
            pos: 0x60,
        };
        let at = l.place(b"file.bin", 4096, true, 10);
        assert_eq!((at + meta_size(8)) % 4096, 0);
        assert_eq!(l.pos, at + meta_size(8) + 16);
        let at = l.place(b"dev", 512, false, 0);
        assert_eq!(at % 512, 0);
        let before = l.pos;
        assert_eq!(l.place(b"link", 16, false, 0), before, "no padding at 16");
    }
}
