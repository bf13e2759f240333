//! A full consistency check: every inode reachable from the root, every
//! directory block, every byte of file data and every xattr.

use std::collections::{HashMap, HashSet};

use foliofs_vfs::{CheckReport, Defect, Error, FileType, Scratch};

use crate::data::Phys;
use crate::format::NAME_LEN_MAX;
use crate::inode::Inode;
use crate::zdata::Piece;
use crate::{Corrupt, Erofs};

/// What a check found.
#[derive(Debug, Default)]
pub struct FsckReport {
    /// Directories walked.
    pub directories: u64,
    /// Regular files read.
    pub files: u64,
    /// Symlinks read.
    pub symlinks: u64,
    /// Devices, fifos and sockets.
    pub specials: u64,
    /// Bytes of file data read (and decompressed) end to end.
    pub data_bytes: u64,
    /// Extended attributes read.
    pub xattrs: u64,
    /// The first [`MAX_LISTED`] problems, each with the path it was met
    /// at: corruption (with a [`Corrupt`] kind, or the block layer's for
    /// reads past the end), features this reader does not implement, and
    /// I/O errors.
    pub errors: Vec<Defect>,
    /// Problems found beyond those listed.
    pub unlisted: u64,
}

impl FsckReport {
    /// True when nothing was wrong.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

impl CheckReport for FsckReport {
    fn defects(&self) -> &[Defect] {
        &self.errors
    }

    fn unlisted(&self) -> u64 {
        self.unlisted
    }

    fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("directories", self.directories),
            ("files", self.files),
            ("symlinks", self.symlinks),
            ("special", self.specials),
            ("xattrs", self.xattrs),
            ("data bytes", self.data_bytes),
        ]
    }
}

/// Problems beyond this many are counted but not listed: a badly damaged
/// image can have one per directory entry.
pub const MAX_LISTED: usize = 1000;

impl Erofs {
    /// Reads (and decompresses) every stored byte of `inode`, extent by
    /// extent, skipping holes; returns the file bytes covered.
    fn check_data(&self, inode: &Inode, scratch: &mut Scratch) -> foliofs_vfs::Result<u64> {
        let mut pos = 0u64;
        if inode.layout.is_compressed() {
            let z = self.zinfo(inode)?;
            if let Some(m) = &z.extents {
                self.check_ext_order(inode, m)?;
            }
            while pos < inode.size {
                let ext = match self.extent_data(inode, &z, pos)? {
                    Piece::Decoded(ext, _) | Piece::Zeros(ext) => ext,
                    // The packed inode's bytes are checked once, on their
                    // own; here only that the fragment lies inside them.
                    Piece::Fragment(ext) => {
                        self.fragment_source(inode, &ext)?;
                        ext
                    }
                };
                pos = ext.la + ext.llen;
            }
            return Ok(inode.size);
        }
        while pos < inode.size {
            let run = self.map_flat(inode, pos, inode.size)?;
            if run.la > pos || run.la + run.len <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    Corrupt::NoDataRun {
                        nid: inode.nid,
                        offset: pos,
                    },
                ));
            }
            let end = run.la + run.len;
            match run.phys {
                Phys::At(dev, p) => {
                    while pos < end {
                        let n = (end - pos).min(1 << 20) as usize;
                        self.read_phys_data(dev, p + (pos - run.la), n, scratch)?;
                        pos += n as u64;
                    }
                }
                Phys::Metabox(p) => {
                    let mut tail = vec![0u8; (end - pos) as usize];
                    self.metabox_bytes(inode.nid, p + (pos - run.la), &mut tail)?;
                }
                Phys::Tail(p) => {
                    let mut tail = vec![0u8; (end - pos) as usize];
                    self.meta(p + (pos - run.la), &mut tail)?;
                }
                Phys::Hole => {}
            }
            pos = end;
        }
        Ok(inode.size)
    }

    /// Checks the whole image. Problems are collected, not fatal, so one
    /// damaged file does not hide others.
    pub fn fsck(&self) -> FsckReport {
        let root = self.sb.root_nid;
        let mut w = Walk {
            fs: self,
            r: FsckReport::default(),
            seen_dirs: HashSet::new(),
            links: HashMap::new(),
            stack: vec![(root, root, String::from("/"))],
            scratch: Scratch::new(),
        };
        while let Some((nid, parent, path)) = w.stack.pop() {
            w.inode(nid, parent, &path);
        }
        w.hidden_inodes();
        w.link_counts();
        w.r
    }
}

/// The state of one check: the report, and what the walk must remember
/// across inodes.
struct Walk<'a> {
    fs: &'a Erofs,
    r: FsckReport,
    /// Directories walked, so that a directory named twice is found.
    seen_dirs: HashSet<u64>,
    /// For every non-directory: (names found, its link count, a path).
    links: HashMap<u64, (u32, u32, String)>,
    /// Inodes still to check: (nid, parent nid, path).
    stack: Vec<(u64, u64, String)>,
    scratch: Scratch,
}

impl Walk<'_> {
    fn note(&mut self, path: &str, e: Error) {
        if self.r.errors.len() < MAX_LISTED {
            self.r.errors.push(Defect::new(Some(path), e));
        } else {
            self.r.unlisted += 1;
        }
    }

    /// Checks one inode: its xattrs, then its listing or its data.
    fn inode(&mut self, nid: u64, parent: u64, path: &str) {
        let inode = match self.fs.inode(nid) {
            Ok(i) => i,
            Err(e) => return self.note(path, e),
        };
        self.xattrs(&inode, path);
        match inode.kind {
            FileType::Directory => self.directory(&inode, parent, path),
            FileType::RegularFile | FileType::Symlink => {
                if inode.kind == FileType::RegularFile {
                    self.r.files += 1;
                } else {
                    self.r.symlinks += 1;
                }
                self.data(&inode, path);
            }
            _ => self.r.specials += 1,
        }
    }

    fn xattrs(&mut self, inode: &Inode, path: &str) {
        match self.fs.xattrs(inode) {
            Ok(list) => {
                for x in &list {
                    self.r.xattrs += 1;
                    if let Err(e) = self.fs.xattr_value(x) {
                        self.note(path, e);
                    }
                }
            }
            Err(e) => self.note(path, e),
        }
    }

    fn data(&mut self, inode: &Inode, path: &str) {
        match self.fs.check_data(inode, &mut self.scratch) {
            Ok(n) => self.r.data_bytes += n,
            Err(e) => self.note(path, e),
        }
    }

    /// Checks a directory's entries block by block (names valid and in
    /// order, "." and ".." right, types matching their inodes) and queues
    /// the inodes they name.
    fn directory(&mut self, inode: &Inode, parent: u64, path: &str) {
        let nid = inode.nid;
        if !self.seen_dirs.insert(nid) {
            let e = Error::corrupt(inode.pos, Corrupt::DirectoryTwice { nid });
            return self.note(path, e);
        }
        self.r.directories += 1;
        let bs = u64::from(self.fs.sb.block_size());
        let nblocks = inode.size.div_ceil(bs);
        let mut prev: Option<Vec<u8>> = None;
        let (mut dot, mut dotdot) = (false, false);
        for b in 0..nblocks {
            let res = self.fs.with_dir_block(inode, b, |blk| {
                let mut out = Vec::new();
                for i in 0..blk.len() {
                    let e = blk.get(i);
                    out.push((e.nid, e.file_type, e.name.to_vec(), blk.entry_pos(i)));
                }
                Ok(out)
            });
            let entries = match res {
                Ok(v) => v,
                Err(e) => {
                    self.note(path, e);
                    break;
                }
            };
            for (child, ftype, name, pos) in entries {
                let bad = |kind: Corrupt| Error::corrupt(pos, kind);
                let shown = || String::from_utf8_lossy(&name).into_owned();
                if name.is_empty() || name.len() > NAME_LEN_MAX || name.contains(&b'/') {
                    self.note(path, bad(Corrupt::InvalidName { name: shown() }));
                    continue;
                }
                if prev.as_ref().is_some_and(|p| *p >= name) {
                    self.note(path, bad(Corrupt::DirentOrder { name: shown() }));
                }
                prev = Some(name.clone());
                if name == b"." {
                    dot = true;
                    if child != nid {
                        self.note(path, bad(Corrupt::BadDot { nid, target: child }));
                    }
                    continue;
                }
                if name == b".." {
                    dotdot = true;
                    if child != parent {
                        let e = bad(Corrupt::BadDotDot {
                            parent,
                            target: child,
                        });
                        self.note(path, e);
                    }
                    continue;
                }
                let child_path = if path == "/" {
                    format!("/{}", shown())
                } else {
                    format!("{path}/{}", shown())
                };
                self.entry(nid, child, ftype, &name, pos, child_path);
            }
        }
        // A directory marked DOT_OMITTED has no "." entry.
        if nblocks > 0 && ((!dot && !inode.dot_omitted) || !dotdot) {
            self.note(path, Error::corrupt(inode.pos, Corrupt::NoDots));
        }
    }

    /// Checks that an entry's type is its inode's, counts the names of a
    /// non-directory, and queues the inode.
    fn entry(&mut self, dir: u64, child: u64, ftype: u8, name: &[u8], pos: u64, path: String) {
        let ci = match self.fs.inode(child) {
            Ok(ci) => ci,
            Err(e) => return self.note(&path, e),
        };
        let expect = crate::dirent::Dirent {
            nid: child,
            file_type: ftype,
            name,
        }
        .kind();
        if expect != Some(ci.kind) {
            let e = Error::corrupt(
                pos,
                Corrupt::DirentType {
                    file_type: ftype,
                    kind: ci.kind,
                },
            );
            self.note(&path, e);
        }
        if ci.kind != FileType::Directory {
            let l = self
                .links
                .entry(child)
                .or_insert((0, ci.nlink, path.clone()));
            l.0 += 1;
        }
        self.stack.push((child, dir, path));
    }

    /// No directory names the packed or the metabox inode; their data
    /// (every fragment, every inode kept in the metabox) is read here.
    fn hidden_inodes(&mut self) {
        let sb = &self.fs.sb;
        let hidden = [
            (sb.packed_nid != 0).then_some((sb.packed_nid, "<packed inode>")),
            self.fs.metabox.as_ref().map(|m| (m.nid, "<metabox inode>")),
        ];
        for (nid, path) in hidden.into_iter().flatten() {
            match self.fs.inode(nid) {
                Ok(inode) => self.data(&inode, path),
                Err(e) => self.note(path, e),
            }
        }
    }

    /// A non-directory found under more names than its link count.
    fn link_counts(&mut self) {
        for (nid, (count, nlink, path)) in std::mem::take(&mut self.links) {
            if count > nlink {
                let kind = Corrupt::LinkCount {
                    nid,
                    names: count,
                    nlink,
                };
                self.note(&path, Error::corrupt(0, kind));
            }
        }
    }
}
