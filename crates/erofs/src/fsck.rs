//! A full consistency check: every inode reachable from the root, every
//! directory block, every byte of file data and every xattr.

use std::collections::HashMap;

use foliofs_vfs::{CheckReport, Defect, Error, FileType, Scratch};

use crate::data::Phys;
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
        let mut r = FsckReport::default();
        let mut seen_dirs: HashMap<u64, ()> = HashMap::new();
        let mut links: HashMap<u64, (u32, u32, String)> = HashMap::new();
        let root = self.sb.root_nid;
        // (nid, parent nid, path)
        let mut stack = vec![(root, root, String::from("/"))];
        let mut scratch = Scratch::new();
        let note = |r: &mut FsckReport, path: &str, e: Error| {
            if r.errors.len() < MAX_LISTED {
                r.errors.push(Defect::new(Some(path), e));
            } else {
                r.unlisted += 1;
            }
        };
        while let Some((nid, parent, path)) = stack.pop() {
            let inode = match self.inode(nid) {
                Ok(i) => i,
                Err(e) => {
                    note(&mut r, &path, e);
                    continue;
                }
            };
            match self.xattrs(&inode) {
                Ok(list) => {
                    for x in &list {
                        r.xattrs += 1;
                        if let Err(e) = self.xattr_value(x) {
                            note(&mut r, &path, e);
                        }
                    }
                }
                Err(e) => note(&mut r, &path, e),
            }
            match inode.kind {
                FileType::Directory => {
                    if seen_dirs.insert(nid, ()).is_some() {
                        note(
                            &mut r,
                            &path,
                            Error::corrupt(inode.pos, Corrupt::DirectoryTwice { nid }),
                        );
                        continue;
                    }
                    r.directories += 1;
                    let bs = u64::from(self.sb.block_size());
                    let nblocks = inode.size.div_ceil(bs);
                    let mut prev: Option<Vec<u8>> = None;
                    let (mut dot, mut dotdot) = (false, false);
                    for b in 0..nblocks {
                        let res = self.with_dir_block(&inode, b, |blk| {
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
                                note(&mut r, &path, e);
                                break;
                            }
                        };
                        for (child, ftype, name, pos) in entries {
                            let bad = |kind: Corrupt| Error::corrupt(pos, kind);
                            if name.is_empty() || name.len() > 255 || name.contains(&b'/') {
                                note(
                                    &mut r,
                                    &path,
                                    bad(Corrupt::InvalidName {
                                        name: String::from_utf8_lossy(&name).into_owned(),
                                    }),
                                );
                                continue;
                            }
                            if let Some(p) = &prev {
                                if *p >= name {
                                    note(
                                        &mut r,
                                        &path,
                                        bad(Corrupt::DirentOrder {
                                            name: String::from_utf8_lossy(&name).into_owned(),
                                        }),
                                    );
                                }
                            }
                            prev = Some(name.clone());
                            if name == b"." {
                                dot = true;
                                if child != nid {
                                    note(
                                        &mut r,
                                        &path,
                                        bad(Corrupt::BadDot { nid, target: child }),
                                    );
                                }
                                continue;
                            }
                            if name == b".." {
                                dotdot = true;
                                if child != parent {
                                    note(
                                        &mut r,
                                        &path,
                                        bad(Corrupt::BadDotDot {
                                            parent,
                                            target: child,
                                        }),
                                    );
                                }
                                continue;
                            }
                            let child_path = if path == "/" {
                                format!("/{}", String::from_utf8_lossy(&name))
                            } else {
                                format!("{path}/{}", String::from_utf8_lossy(&name))
                            };
                            match self.inode(child) {
                                Ok(ci) => {
                                    let expect = crate::dirent::Dirent {
                                        nid: child,
                                        file_type: ftype,
                                        name: &name,
                                    }
                                    .kind();
                                    if expect != Some(ci.kind) {
                                        note(
                                            &mut r,
                                            &child_path,
                                            bad(Corrupt::DirentType {
                                                file_type: ftype,
                                                kind: ci.kind,
                                            }),
                                        );
                                    }
                                    if ci.kind != FileType::Directory {
                                        let l = links.entry(child).or_insert((
                                            0,
                                            ci.nlink,
                                            child_path.clone(),
                                        ));
                                        l.0 += 1;
                                    }
                                    stack.push((child, nid, child_path));
                                }
                                Err(e) => note(&mut r, &child_path, e),
                            }
                        }
                    }
                    // A directory marked DOT_OMITTED has no "." entry.
                    if nblocks > 0 && ((!dot && !inode.dot_omitted) || !dotdot) {
                        note(&mut r, &path, Error::corrupt(inode.pos, Corrupt::NoDots));
                    }
                }
                FileType::RegularFile | FileType::Symlink => {
                    if inode.kind == FileType::RegularFile {
                        r.files += 1;
                    } else {
                        r.symlinks += 1;
                    }
                    match self.check_data(&inode, &mut scratch) {
                        Ok(n) => r.data_bytes += n,
                        Err(e) => note(&mut r, &path, e),
                    }
                }
                _ => r.specials += 1,
            }
        }
        // No directory names the packed or the metabox inode; their data
        // (every fragment, every inode kept in the metabox) is read here.
        let hidden = [
            (self.sb.packed_nid != 0).then_some((self.sb.packed_nid, "<packed inode>")),
            self.metabox.as_ref().map(|m| (m.nid, "<metabox inode>")),
        ];
        for (nid, path) in hidden.into_iter().flatten() {
            match self.inode(nid) {
                Ok(inode) => match self.check_data(&inode, &mut scratch) {
                    Ok(n) => r.data_bytes += n,
                    Err(e) => note(&mut r, path, e),
                },
                Err(e) => note(&mut r, path, e),
            }
        }
        for (nid, (count, nlink, path)) in links {
            if count > nlink {
                note(
                    &mut r,
                    &path,
                    Error::corrupt(
                        0,
                        Corrupt::LinkCount {
                            nid,
                            names: count,
                            nlink,
                        },
                    ),
                );
            }
        }
        r
    }
}
