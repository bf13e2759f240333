//! A full consistency check of a romfs image: what [`crate::RomFs`] checks
//! as it reads, over every entry, plus header checksums, overlapping
//! entries, names and "." / ".." links. Also gathers the figures `info`
//! shows (entry counts, data alignment).
//!
//! Every problem is a [`Defect`] holding an [`Error::Corrupt`] with a
//! [`Corrupt`] kind, the shape every format's check reports in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use foliofs_block::{BlockDev, OpenOptions};
use foliofs_vfs::{CheckReport, Defect, Error, FileType, Result};

use crate::checksum::word_sum;
use crate::dir::LoopGuard;
use crate::header::{EntryType, Header};
use crate::superblock::CHECKSUM_SPAN;
use crate::{Corrupt, RomFs};

/// Everything a check learned about an image.
#[derive(Debug, Default)]
pub struct Report {
    /// Size of the image file or device.
    pub image_size: u64,
    /// The size the superblock declares.
    pub declared_size: u32,
    /// The volume name, without its NUL.
    pub volume_name: Vec<u8>,
    /// Whether the superblock checksum is right.
    pub superblock_checksum_ok: bool,
    /// Headers checked.
    pub headers_checked: u64,
    /// Headers whose checksum is wrong.
    pub bad_header_checksums: u64,
    /// Entries by stored type ("." and ".." excluded).
    pub counts: BTreeMap<&'static str, u64>,
    /// Bytes of regular-file data (each file counted once).
    pub data_bytes: u64,
    /// The largest power of two (up to 2 MiB) dividing the data offset of
    /// every non-empty regular file; `None` when there are none.
    pub data_alignment: Option<u64>,
    /// Every problem found, in the order found; each error is
    /// [`Error::Corrupt`], with a [`Corrupt`] kind or, for reads past the
    /// end of the image, a [`foliofs_block::Corrupt`] one.
    pub defects: Vec<Defect>,
}

impl Report {
    /// True when no defect was found.
    pub fn is_clean(&self) -> bool {
        self.defects.is_empty()
    }
}

impl CheckReport for Report {
    fn defects(&self) -> &[Defect] {
        &self.defects
    }

    fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("entries", self.counts.values().sum()),
            ("headers checked", self.headers_checked),
        ]
    }
}

/// The largest alignment `info` reports.
const MAX_ALIGN: u64 = 2 << 20;

/// Checks the image at `path`. An image that cannot be opened at all (no
/// magic, truncated superblock, root not a directory) gives a report with
/// that one defect; I/O errors are returned as errors.
pub fn check(path: &Path, opts: &OpenOptions) -> Result<Report> {
    let dev = BlockDev::open(path, opts, crate::ROMFS_BLOCK_SIZE)?;
    let mut report = Report {
        image_size: dev.size(),
        ..Report::default()
    };
    let fs = match RomFs::from_block_dev(dev, false) {
        Ok(fs) => fs,
        Err(e @ Error::Corrupt { .. }) => {
            report.defects.push(Defect::new(None, e));
            return Ok(report);
        }
        Err(e) => return Err(e),
    };
    Checker::new(&fs, report).run()
}

struct Checker<'a> {
    fs: &'a RomFs,
    r: Report,
    /// Extents (start, end, path) of every distinct header with its data.
    extents: Vec<(u64, u64, String)>,
    /// Headers already counted (the root's "." is the root itself).
    seen_headers: HashSet<u64>,
    /// Directories walked, with the path they were first walked under.
    dirs_done: HashMap<u64, String>,
    /// Regular files whose data was counted.
    files_seen: HashSet<u64>,
    align_acc: u64,
}

impl<'a> Checker<'a> {
    fn new(fs: &'a RomFs, r: Report) -> Self {
        Checker {
            fs,
            r,
            extents: Vec::new(),
            seen_headers: HashSet::new(),
            dirs_done: HashMap::new(),
            files_seen: HashSet::new(),
            align_acc: 0,
        }
    }

    fn defect(&mut self, offset: u64, path: Option<&str>, kind: Corrupt) {
        self.found(path, Error::corrupt(offset, kind));
    }

    fn found(&mut self, path: Option<&str>, error: Error) {
        self.r.defects.push(Defect::new(path, error));
    }

    fn run(mut self) -> Result<Report> {
        let fs = self.fs;
        let sb = fs.superblock().clone();
        self.r.declared_size = sb.size;
        self.r.volume_name = sb.volume_name.clone();
        let span = sb.size.min(CHECKSUM_SPAN) as usize;
        let mut head = vec![0u8; span];
        fs.block_dev().read_exact(0, &mut head)?;
        let sum = word_sum(&head);
        self.r.superblock_checksum_ok = sum == 0;
        if sum != 0 {
            self.defect(12, None, Corrupt::SuperblockChecksum { span, sum });
        }
        self.extents
            .push((0, sb.root_offset, "(superblock)".to_owned()));
        let root = fs.root_inode();
        // Depth-first with an explicit stack (hostile images can nest
        // deeply); `on_path` holds the directories from the root down to
        // the one being read, so a loop is told apart from a second link.
        enum Step {
            Enter(u64, String, u64),
            Leave(u64),
        }
        let mut stack = vec![Step::Enter(root.ino, "/".to_owned(), root.ino)];
        let mut on_path = HashSet::new();
        self.dirs_done.insert(root.ino, "/".to_owned());
        self.visit_header(root.ino, "/")?;
        while let Some(step) = stack.pop() {
            let (dir, path, parent) = match step {
                Step::Enter(d, p, parent) => (d, p, parent),
                Step::Leave(d) => {
                    on_path.remove(&d);
                    continue;
                }
            };
            on_path.insert(dir);
            stack.push(Step::Leave(dir));
            let children = self.walk_dir(dir, &path, parent)?;
            for (child, child_path) in children.into_iter().rev() {
                if on_path.contains(&child) {
                    self.defect(child, Some(&child_path), Corrupt::DirectoryLoop);
                    continue;
                }
                if let Some(first) = self.dirs_done.get(&child) {
                    let first = first.clone();
                    self.defect(child, Some(&child_path), Corrupt::DirectoryTwice { first });
                    continue;
                }
                self.dirs_done.insert(child, child_path.clone());
                stack.push(Step::Enter(child, child_path, dir));
            }
        }
        self.check_overlaps();
        self.r.data_alignment = (self.align_acc != 0).then(|| {
            let a = 1u64 << self.align_acc.trailing_zeros();
            a.min(MAX_ALIGN)
        });
        Ok(self.r)
    }

    /// Checks one distinct header (checksum, extent, declared size).
    fn visit_header(&mut self, off: u64, path: &str) -> Result<Option<Header>> {
        if !self.seen_headers.insert(off) {
            return Ok(None);
        }
        let h = match self.fs.header(off) {
            Ok(h) => h,
            Err(e @ Error::Corrupt { .. }) => {
                self.found(Some(path), e);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        self.r.headers_checked += 1;
        let meta = h.meta_size();
        let mut buf = vec![0u8; meta as usize];
        self.fs.block_dev().read_exact(off, &mut buf)?;
        let sum = word_sum(&buf);
        if sum != 0 {
            self.r.bad_header_checksums += 1;
            self.defect(off + 12, Some(path), Corrupt::HeaderChecksum { sum });
        }
        let data_len = if h.kind.has_data() {
            (u64::from(h.size) + 15) & !15
        } else {
            0
        };
        let end = h.data_offset() + data_len;
        self.extents.push((off, end, path.to_owned()));
        let declared = u64::from(self.fs.superblock().size);
        let used_end = h.data_offset()
            + if h.kind.has_data() {
                u64::from(h.size)
            } else {
                0
            };
        if used_end > declared {
            self.defect(
                off,
                Some(path),
                Corrupt::BeyondDeclaredSize {
                    end: used_end,
                    declared: self.fs.superblock().size,
                },
            );
        }
        if h.kind == EntryType::HardLink && h.spec & 15 != 0 {
            self.defect(
                off + 4,
                Some(path),
                Corrupt::LinkTargetMisaligned { spec: h.spec },
            );
        }
        if h.kind == EntryType::Directory && h.spec & 15 != 0 {
            self.defect(
                off + 4,
                Some(path),
                Corrupt::FirstEntryMisaligned { spec: h.spec },
            );
        }
        if h.kind == EntryType::Symlink && h.size > crate::MAX_SYMLINK {
            self.defect(
                off + 8,
                Some(path),
                Corrupt::SymlinkTooLong {
                    offset: off,
                    len: h.size,
                },
            );
        }
        Ok(Some(h))
    }

    /// Checks the entries of directory `dir`; returns its subdirectories.
    fn walk_dir(&mut self, dir: u64, path: &str, parent: u64) -> Result<Vec<(u64, String)>> {
        let fs = self.fs;
        let mut subdirs = Vec::new();
        let first = match fs.inode(dir) {
            Ok(i) => i.first_entry(),
            Err(e @ Error::Corrupt { .. }) => {
                self.found(Some(path), e);
                return Ok(subdirs);
            }
            Err(e) => return Err(e),
        };
        let mut names: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut guard = LoopGuard::default();
        let mut off = first;
        while off != 0 {
            if !guard.visit(off) {
                self.defect(off, Some(path), Corrupt::ChainLoop { dir, offset: off });
                break;
            }
            let h = match fs.header(off) {
                Ok(h) => h,
                Err(e @ Error::Corrupt { .. }) => {
                    self.found(Some(path), e);
                    break;
                }
                Err(e) => return Err(e),
            };
            let name = h.name().to_vec();
            let shown = String::from_utf8_lossy(&name).into_owned();
            let child_path = if path == "/" {
                format!("/{shown}")
            } else {
                format!("{path}/{shown}")
            };
            off = h.next;
            if h.offset != dir {
                self.visit_header(h.offset, &child_path)?;
            }
            if name.is_empty() {
                self.defect(
                    h.offset + 16,
                    Some(&child_path),
                    Corrupt::EmptyName { offset: h.offset },
                );
                continue;
            }
            if name.contains(&b'/') {
                self.defect(
                    h.offset + 16,
                    Some(&child_path),
                    Corrupt::NameWithSlash {
                        offset: h.offset,
                        name: shown,
                    },
                );
                continue;
            }
            if let Some(prev) = names.insert(name.clone(), h.offset) {
                self.defect(
                    h.offset,
                    Some(&child_path),
                    Corrupt::DuplicateName { other: prev },
                );
            }
            let target = match fs.resolve(h.offset) {
                Ok(t) => t,
                Err(e @ Error::Corrupt { .. }) => {
                    self.found(Some(&child_path), e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if h.kind == EntryType::HardLink {
                // The target header gets its own checks even when no
                // directory lists it under its own name.
                self.visit_header(target.ino, &child_path)?;
            }
            match &name[..] {
                b"." => {
                    if target.ino != dir {
                        self.defect(
                            h.offset,
                            Some(path),
                            Corrupt::BadDot {
                                target: target.ino,
                                dir,
                            },
                        );
                    }
                    continue;
                }
                b".." => {
                    if target.ino != parent {
                        self.defect(
                            h.offset,
                            Some(path),
                            Corrupt::BadDotDot {
                                target: target.ino,
                                parent,
                            },
                        );
                    }
                    continue;
                }
                _ => {}
            }
            *self.r.counts.entry(h.kind.name()).or_default() += 1;
            match target.kind {
                FileType::Directory => subdirs.push((target.ino, child_path)),
                FileType::RegularFile if self.files_seen.insert(target.ino) => {
                    self.r.data_bytes += u64::from(target.size);
                    if target.size > 0 {
                        self.align_acc |= target.data_offset;
                    }
                }
                _ => {}
            }
        }
        Ok(subdirs)
    }

    fn check_overlaps(&mut self) {
        let mut ext = std::mem::take(&mut self.extents);
        ext.sort();
        let mut found = Vec::new();
        let mut prev: Option<&(u64, u64, String)> = None;
        for e in &ext {
            if let Some(p) = prev {
                if e.0 < p.1 {
                    found.push((
                        e.0,
                        e.2.clone(),
                        Corrupt::Overlap {
                            start: e.0,
                            end: e.1,
                            other: p.2.clone(),
                            other_start: p.0,
                            other_end: p.1,
                        },
                    ));
                }
            }
            if prev.is_none_or(|p| e.1 > p.1) {
                prev = Some(e);
            }
        }
        for (off, path, what) in found {
            self.defect(off, Some(&path), what);
        }
    }
}
