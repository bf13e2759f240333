//! What the commands that look into images without mounting them (`info`,
//! `ls`, `cat`, `extract`, `fsck`) share: paths in an image, directory
//! listings and names of file kinds.
//!
//! `ls`, `cat` and `extract` only use the `FileSystem` trait, so they work
//! for every format; `info` and `fsck` ask the format itself.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use anyhow::{bail, Context};
use foliofs_vfs::{Attr, FileSystem, FileType, Ino};

/// Bytes asked for per read by `cat` and `extract`.
pub const CHUNK: u32 = 1 << 20;

/// Resolves a `/`-separated path in the image from its root, without
/// following symlinks.
pub fn resolve(fs: &dyn FileSystem, path: &str) -> anyhow::Result<Attr> {
    let mut cur = fs.getattr(fs.root())?;
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if cur.kind != FileType::Directory {
            bail!("{path}: a component before {comp:?} is not a directory");
        }
        cur = fs
            .lookup(cur.ino, OsStr::new(comp))
            .with_context(|| format!("{path}: cannot look up {comp:?}"))?;
    }
    Ok(cur)
}

/// All entries of a directory, by name.
pub fn list(fs: &dyn FileSystem, dir: Ino) -> foliofs_vfs::Result<Vec<(OsString, Ino, FileType)>> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        out.push((e.name.to_owned(), e.ino, e.kind));
        false
    })?;
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

pub fn kind_name(k: FileType) -> &'static str {
    match k {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::BlockDevice => "block device",
        FileType::CharDevice => "char device",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
    }
}
