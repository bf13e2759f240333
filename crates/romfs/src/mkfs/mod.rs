//! Building romfs images from a directory tree.
//!
//! The layout is the one genromfs uses and the kernel expects: the root
//! header (named ".") right after the superblock, each directory's entries
//! directly after its header, "." and ".." as hard links at the head of every
//! list, data right after each header's padded name. Unlike genromfs, entries
//! are sorted by name and nothing depends on the clock, so one tree always
//! gives the same bytes.

use std::collections::HashMap;
use std::fs::Metadata;
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

use layout::*;
use scan::*;

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
    if opts.volume.len() > MAX_NAME {
        return Err(MkfsError::VolumeTooLong(opts.volume.len()));
    }
    check_align(opts.align)?;
    for (a, _) in &opts.align_patterns {
        check_align(*a)?;
    }
    let excl: Vec<&str> = opts.excludes.iter().map(String::as_str).collect();
    let alpat: Vec<&str> = opts
        .align_patterns
        .iter()
        .map(|(_, p)| p.as_str())
        .collect();
    let root_md = std::fs::metadata(src).map_err(io_err(src))?;
    if !root_md.is_dir() {
        return Err(MkfsError::Io {
            path: src.to_owned(),
            source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
        });
    }
    let out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(image)
        .map_err(io_err(image))?;
    let out_md = out.metadata().map_err(io_err(image))?;
    let mut sc = Scanner {
        opts,
        excludes: Matcher::new(&excl)?,
        aligns: Matcher::new(&alpat)?,
        nodes: Vec::new(),
        linked: HashMap::new(),
        output: Some((out_md.dev(), out_md.ino())),
        files: 0,
        bytes: 0,
    };
    let root = sc.push(
        Vec::new(),
        src.to_owned(),
        Kind::Dir(Vec::new()),
        root_md.mode() & 0o111 != 0,
        0,
    );
    let children = sc.scan_dir(src, Path::new(""))?;
    sc.nodes[root].kind = Kind::Dir(children);
    let (files_total, bytes_total) = (sc.files, sc.bytes);
    let mut nodes = sc.nodes;

    let root_off = meta_size(opts.volume.len());
    let mut lay = Layout {
        nodes: &mut nodes,
        slots: Vec::new(),
        pos: root_off + meta_size(1),
    };
    lay.nodes[root].offset = root_off;
    let root_slot = lay.slot(
        root_off,
        type_bits(EntryType::Directory, lay.nodes[root].exec),
        root_off as u32,
        0,
        b".",
        Data::None,
    );
    lay.dir_list(root, root_off, root_off, Some(root_slot));
    let end = lay.pos;
    let padded = align_up(end, IMAGE_PAD);
    if padded > MAX_IMAGE {
        return Err(MkfsError::ImageTooBig {
            path: src.to_owned(),
            size: padded,
        });
    }
    let slots = lay.slots;

    let mut sum = Summary {
        image_size: padded,
        ..Summary::default()
    };
    let mut w = BufWriter::with_capacity(1 << 20, out);
    let mut sb = Vec::with_capacity(root_off as usize);
    sb.extend_from_slice(MAGIC);
    sb.extend_from_slice(&(end as u32).to_be_bytes());
    sb.extend_from_slice(&[0; 4]);
    sb.extend_from_slice(&opts.volume);
    sb.resize(root_off as usize, 0);
    w.write_all(&sb).map_err(io_err(image))?;
    let mut pos = root_off;
    let mut prog = Progress {
        files_total,
        bytes_total,
        ..Progress::default()
    };
    let mut buf = vec![0u8; 1 << 20];
    for s in &slots {
        write_zeros(&mut w, s.offset - pos).map_err(io_err(image))?;
        let meta = meta_size(s.name.len()) as usize;
        let mut h = Vec::with_capacity(meta);
        h.extend_from_slice(&(s.next | s.bits).to_be_bytes());
        h.extend_from_slice(&s.spec.to_be_bytes());
        h.extend_from_slice(&s.size.to_be_bytes());
        h.extend_from_slice(&[0; 4]);
        h.extend_from_slice(&s.name);
        h.resize(meta, 0);
        let c = fix(&h);
        h[12..16].copy_from_slice(&c.to_be_bytes());
        w.write_all(&h).map_err(io_err(image))?;
        pos = s.offset + meta as u64;
        if s.name != b"." && s.name != b".." {
            sum.entries += 1;
        }
        match &s.data {
            Data::None => {
                if s.bits & 7 == 0 && s.name != b"." && s.name != b".." {
                    sum.hard_links += 1;
                }
            }
            Data::Bytes(b) => {
                w.write_all(b).map_err(io_err(image))?;
                pos += b.len() as u64;
            }
            Data::File(n) => {
                let path = &nodes[*n].path;
                let size = u64::from(s.size);
                copy_file(path, size, &mut w, &mut buf, &mut |n| {
                    prog.bytes_done += n;
                    if prog.bytes_done % (64 << 20) < n {
                        progress(&prog);
                    }
                })?;
                pos += size;
                sum.files += 1;
                sum.data_bytes += size;
                prog.files_done += 1;
                progress(&prog);
            }
        }
        let pad = align_up(pos, 16) - pos;
        write_zeros(&mut w, pad).map_err(io_err(image))?;
        pos += pad;
    }
    write_zeros(&mut w, padded - pos).map_err(io_err(image))?;
    let mut out = w.into_inner().map_err(|e| MkfsError::Io {
        path: image.to_owned(),
        source: e.into_error(),
    })?;
    // The superblock checksum covers whatever headers and data fall in the
    // first 512 bytes, so it is fixed last.
    let span = end.min(u64::from(CHECKSUM_SPAN)) as usize;
    let mut head = vec![0u8; span];
    out.seek(SeekFrom::Start(0)).map_err(io_err(image))?;
    out.read_exact(&mut head).map_err(io_err(image))?;
    let c = word_sum(&head).wrapping_neg();
    out.seek(SeekFrom::Start(12)).map_err(io_err(image))?;
    out.write_all(&c.to_be_bytes()).map_err(io_err(image))?;
    out.sync_all().map_err(io_err(image))?;
    Ok(sum)
}

fn write_zeros(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const Z: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(Z.len() as u64) as usize;
        w.write_all(&Z[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Copies exactly `size` bytes of `path`; a file that has shrunk or grown
/// since it was scanned is an error.
fn copy_file(
    path: &Path,
    size: u64,
    w: &mut impl Write,
    buf: &mut [u8],
    on_bytes: &mut dyn FnMut(u64),
) -> Result<(), MkfsError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(path))?;
    let mut left = size;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        let n = f.read(&mut buf[..k]).map_err(io_err(path))?;
        if n == 0 {
            return Err(MkfsError::Changed {
                path: path.to_owned(),
                expected: size,
                found: format!("it ended after {}", size - left),
            });
        }
        w.write_all(&buf[..n]).map_err(io_err(path))?;
        left -= n as u64;
        on_bytes(n as u64);
    }
    let mut probe = [0u8; 1];
    if f.read(&mut probe).map_err(io_err(path))? != 0 {
        return Err(MkfsError::Changed {
            path: path.to_owned(),
            expected: size,
            found: "it has grown".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_changed_size_is_an_error_not_padding() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, vec![5u8; 1000]).unwrap();
        let mut buf = vec![0u8; 64];
        let mut sink = Vec::new();
        // Scanned at 1200 bytes, 1000 there now: it shrank.
        let e = copy_file(&p, 1200, &mut sink, &mut buf, &mut |_| {}).unwrap_err();
        assert!(
            matches!(&e, MkfsError::Changed { found, .. } if found.contains("ended after 1000")),
            "{e}"
        );
        // Scanned at 900 bytes: it grew.
        sink.clear();
        let e = copy_file(&p, 900, &mut sink, &mut buf, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("grown"), "{e}");
        sink.clear();
        copy_file(&p, 1000, &mut sink, &mut buf, &mut |_| {}).unwrap();
        assert_eq!(sink, vec![5u8; 1000]);
    }

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
