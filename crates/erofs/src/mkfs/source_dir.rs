//! A directory tree as a source: depth first, each directory's entries in
//! byte order of their names (the order `tar --sort=name` writes, so a
//! tree and its sorted tar give the same image), hard links by device and
//! inode, xattrs as the file has them (symlinks' own, not their targets').

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::tree::{Body, Meta};
use super::{BuildError, Builder, EntryError};

fn meta_of(path: &Path, md: &fs::Metadata) -> Result<Meta, BuildError> {
    let mut xattrs = std::collections::BTreeMap::new();
    let names = xattr::list(path).map_err(BuildError::io(format!(
        "listing the xattrs of {}",
        path.display()
    )))?;
    for n in names {
        if let Some(v) = xattr::get(path, &n).map_err(BuildError::io(format!(
            "reading xattr {n:?} of {}",
            path.display()
        )))? {
            xattrs.insert(n.as_bytes().to_vec(), v);
        }
    }
    Ok(Meta {
        mode: md.mode(),
        uid: md.uid(),
        gid: md.gid(),
        mtime: md.mtime(),
        nsec: md.mtime_nsec() as u32,
        xattrs,
    })
}

fn sorted_names(dir: &Path) -> Result<Vec<Vec<u8>>, BuildError> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(BuildError::io(format!("listing {}", dir.display())))? {
        let e = e.map_err(BuildError::io(format!("listing {}", dir.display())))?;
        names.push(e.file_name().as_bytes().to_vec());
    }
    names.sort();
    Ok(names)
}

/// A frame of the depth-first walk: a directory's components, its sorted
/// names, and how many of them are done.
type Frame = (Vec<Vec<u8>>, Vec<Vec<u8>>, usize);

/// Adds everything under `src` (which becomes the root) to `b`.
pub(crate) fn add_tree(b: &mut Builder, src: &Path) -> Result<(), BuildError> {
    let md = fs::symlink_metadata(src).map_err(BuildError::io(src.display().to_string()))?;
    if !md.is_dir() {
        return Err(BuildError::Source {
            path: src.to_owned(),
            why: "not a directory (nor a tar file)".into(),
        });
    }
    let bad = |path: &Path| {
        let path = path.to_owned();
        move |why: String| BuildError::Source { path, why }
    };
    b.add(&[], meta_of(src, &md)?, Body::Dir(Default::default()))
        .map_err(bad(src))?;
    // The first path of each multiply linked inode.
    let mut seen: HashMap<(u64, u64), Vec<Vec<u8>>> = HashMap::new();
    let mut stack: Vec<Frame> = vec![(Vec::new(), sorted_names(src)?, 0)];
    while let Some((dir, names, done)) = stack.last_mut() {
        let Some(name) = names.get(*done).cloned() else {
            stack.pop();
            continue;
        };
        *done += 1;
        let mut comps = dir.clone();
        comps.push(name);
        let path: PathBuf = src.join(Path::new(std::ffi::OsStr::from_bytes(&comps.join(&b'/'))));
        let refs: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
        let md = fs::symlink_metadata(&path).map_err(BuildError::io(path.display().to_string()))?;
        let ft = md.file_type();
        if !ft.is_dir() && md.nlink() > 1 {
            let key = (md.dev(), md.ino());
            if let Some(first) = seen.get(&key) {
                let first: Vec<&[u8]> = first.iter().map(Vec::as_slice).collect();
                b.link(&refs, &first).map_err(bad(&path))?;
                continue;
            }
            seen.insert(key, comps.clone());
        }
        let meta = meta_of(&path, &md)?;
        if ft.is_dir() {
            b.add(&refs, meta, Body::Dir(Default::default()))
                .map_err(bad(&path))?;
            let names = sorted_names(&path)?;
            stack.push((comps, names, 0));
        } else if ft.is_file() {
            let mut f =
                fs::File::open(&path).map_err(BuildError::io(path.display().to_string()))?;
            let shown = path.display().to_string();
            let what = || shown.clone();
            let res = match data_map(&f, &md).map_err(BuildError::io(shown.clone()))? {
                Some(map) => {
                    let mut data = Fragments {
                        f: &f,
                        map: &map,
                        next: 0,
                        at: 0,
                    };
                    b.add_sparse(&refs, meta, &mut data, &map, md.len(), &what)
                }
                None => b.add_file(&refs, meta, &mut f, md.len(), &what),
            };
            res.map_err(|e| match e {
                EntryError::Bad(why) => bad(&path)(why),
                EntryError::Build(e) => e,
            })?;
            let mut more = [0u8; 1];
            if f.read_at(&mut more, md.len())
                .map_err(BuildError::io(shown.clone()))?
                > 0
            {
                return Err(bad(&path)(format!(
                    "grew past {} bytes while being read",
                    md.len()
                )));
            }
        } else if ft.is_symlink() {
            let t = fs::read_link(&path).map_err(BuildError::io(path.display().to_string()))?;
            b.add(
                &refs,
                meta,
                Body::Symlink(t.as_os_str().as_bytes().to_vec()),
            )
            .map_err(bad(&path))?;
        } else if ft.is_char_device() || ft.is_block_device() {
            let rdev = md.rdev();
            let body = Body::Device(libc::major(rdev), libc::minor(rdev));
            b.add(&refs, meta, body).map_err(bad(&path))?;
        } else if ft.is_fifo() || ft.is_socket() {
            b.add(&refs, meta, Body::Special).map_err(bad(&path))?;
        } else {
            return Err(bad(&path)("a file type EROFS does not store".into()));
        }
    }
    Ok(())
}

/// A file's data runs (offset, length) as the file system reports them
/// (`SEEK_DATA` / `SEEK_HOLE`), when it has holes; `None` when it has none
/// (or the file system cannot tell), so that a tree and GNU tar's
/// `--sparse` tar of it give the same image.
fn data_map(f: &fs::File, md: &fs::Metadata) -> io::Result<Option<Vec<(u64, u64)>>> {
    use rustix::fs::{seek, SeekFrom};
    let size = md.len();
    // As many bytes allocated as the size: no holes (the common case,
    // answered without a system call).
    if md.blocks() * 512 >= size {
        return Ok(None);
    }
    let mut map = Vec::new();
    let mut off = 0u64;
    while off < size {
        let data = match seek(f, SeekFrom::Data(off)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if data >= size {
            break;
        }
        let hole = seek(f, SeekFrom::Hole(data))?.min(size);
        map.push((data, hole - data));
        off = hole;
        if map.len() > super::tar::sparse::MAX_FRAGMENTS {
            // Past what a map may hold: write the holes as zeros.
            return Ok(None);
        }
    }
    seek(f, SeekFrom::Start(0))?;
    let covered: u64 = map.iter().map(|r| r.1).sum();
    Ok((covered < size).then_some(map))
}

/// A file's data runs, one after another, as a sparse tar entry stores
/// them.
struct Fragments<'a> {
    f: &'a fs::File,
    map: &'a [(u64, u64)],
    next: usize,
    /// Bytes of the current run already read.
    at: u64,
}

impl Read for Fragments<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(&(off, len)) = self.map.get(self.next) {
            if self.at == len {
                self.next += 1;
                self.at = 0;
                continue;
            }
            let n = (len - self.at).min(buf.len() as u64) as usize;
            let got = self.f.read_at(&mut buf[..n], off + self.at)?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being read",
                ));
            }
            self.at += got as u64;
            return Ok(got);
        }
        Ok(0)
    }
}
