//! The romfs oracle's walk: one line per entry of a directory tree, sorted
//! bytewise, so two views of one image can be diffed line by line.
//!
//! ```text
//! PATH TYPE MODE ino=N nlink=N uid=N gid=N size=N [sha256=HEX | target=ESC | rdev=MAJ:MIN]
//! ```
//!
//! PATH is relative to the root, which is `.`; TYPE is one of dir reg lnk
//! chr blk fifo sock; MODE is the whole `st_mode` in octal with a leading 0.
//! Bytes up to 0x20, from 0x7f, `\` (and `/` inside a name) are written
//! `\xHH`, so a line is printable ASCII without spaces inside a field.
//! Problems are lines too: `PATH ERROR op:ERRNO`, `PATH ERROR loop` (a
//! directory that is its own ancestor), `PATH ERROR readdir-loop` (a
//! listing that repeats a name), `PATH ERROR badname` (a `/` in a name),
//! and `. LIMIT entries` when the walk stopped early.
//!
//! Only the standard library: the same file is the guest's walker (built
//! static by `romfs-vm.sh`, with `guest.rs`) and a module of the host-side
//! test harness, so the kernel's view and a foliofs mount are printed by
//! the same code. Only hashing differs, so each side passes its own.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// More entries than any test tree has, few enough that a looping image
/// ends in bounded time and memory.
pub const MAX_ENTRIES: usize = 100_000;

/// Hashes a file's whole content: lowercase hex SHA-256.
pub type Hash<'a> = dyn FnMut(&mut File) -> io::Result<String> + 'a;

/// `bytes` with everything outside printable ASCII, the backslash, and
/// with `slash` the slash, written as `\xHH`.
pub fn escape(bytes: &[u8], slash: bool) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &c in bytes {
        if c <= 0x20 || c >= 0x7f || c == b'\\' || (slash && c == b'/') {
            s.push_str(&format!("\\x{c:02x}"));
        } else {
            s.push(char::from(c));
        }
    }
    s
}

/// The short name of the file type in `mode` (`st_mode`).
pub fn kind_name(mode: u32) -> &'static str {
    match mode & 0o170000 {
        0o040000 => "dir",
        0o100000 => "reg",
        0o120000 => "lnk",
        0o020000 => "chr",
        0o060000 => "blk",
        0o010000 => "fifo",
        0o140000 => "sock",
        _ => "unknown",
    }
}

/// The attribute part of an entry's line, up to and including `size=`.
pub fn attr_line(
    path: &str,
    mode: u32,
    ino: u64,
    nlink: u64,
    uid: u32,
    gid: u32,
    size: u64,
) -> String {
    format!(
        "{path} {} 0{mode:o} ino={ino} nlink={nlink} uid={uid} gid={gid} size={size}",
        kind_name(mode)
    )
}

/// The errno's name (the common ones), else its number.
fn errno(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(1) => "EPERM",
        Some(2) => "ENOENT",
        Some(5) => "EIO",
        Some(6) => "ENXIO",
        Some(7) => "E2BIG",
        Some(12) => "ENOMEM",
        Some(13) => "EACCES",
        Some(14) => "EFAULT",
        Some(20) => "ENOTDIR",
        Some(21) => "EISDIR",
        Some(22) => "EINVAL",
        Some(27) => "EFBIG",
        Some(34) => "ERANGE",
        Some(36) => "ENAMETOOLONG",
        Some(40) => "ELOOP",
        Some(61) => "ENODATA",
        Some(75) => "EOVERFLOW",
        Some(95) => "EOPNOTSUPP",
        Some(116) => "ESTALE",
        Some(117) => "EUCLEAN",
        Some(n) => return format!("errno{n}"),
        None => return format!("{:?}", e.kind()),
    };
    name.to_owned()
}

struct Walk<'h, 'a> {
    root: PathBuf,
    hash: &'h mut Hash<'a>,
    lines: Vec<String>,
    entries: usize,
    /// (st_dev, st_ino) of the directories from the root to the current one.
    ancestors: Vec<(u64, u64)>,
}

impl Walk<'_, '_> {
    fn error(&mut self, path: &str, what: &str) {
        self.lines.push(format!("{path} ERROR {what}"));
    }

    /// Prints `rel` (escaped as `path`) and, for a directory, everything
    /// below it. False once the entry limit is reached.
    fn entry(&mut self, rel: &Path, path: &str) -> bool {
        if self.entries >= MAX_ENTRIES {
            return false;
        }
        self.entries += 1;
        let full = self.root.join(rel);
        let md = match fs::symlink_metadata(&full) {
            Ok(md) => md,
            Err(e) => {
                self.error(path, &format!("lstat:{}", errno(&e)));
                return true;
            }
        };
        let mut line = attr_line(
            path,
            md.mode(),
            md.ino(),
            md.nlink(),
            md.uid(),
            md.gid(),
            md.size(),
        );
        let ft = md.file_type();
        if ft.is_file() {
            match File::open(&full).and_then(|mut f| (self.hash)(&mut f)) {
                Ok(hex) => line.push_str(&format!(" sha256={hex}")),
                Err(e) => self.error(path, &format!("read:{}", errno(&e))),
            }
        } else if ft.is_symlink() {
            match fs::read_link(&full) {
                Ok(t) => line.push_str(&format!(
                    " target={}",
                    escape(t.as_os_str().as_bytes(), false)
                )),
                Err(e) => self.error(path, &format!("readlink:{}", errno(&e))),
            }
        } else if ft.is_char_device() || ft.is_block_device() {
            let (major, minor) = split_dev(md.rdev());
            line.push_str(&format!(" rdev={major}:{minor}"));
        }
        self.lines.push(line);
        if !ft.is_dir() {
            return true;
        }
        let id = (md.dev(), md.ino());
        if self.ancestors.contains(&id) {
            self.error(path, "loop");
            return true;
        }
        self.ancestors.push(id);
        let more = self.children(rel, path, &full);
        self.ancestors.pop();
        more
    }

    fn children(&mut self, rel: &Path, path: &str, full: &Path) -> bool {
        let list = match fs::read_dir(full) {
            Ok(l) => l,
            Err(e) => {
                self.error(path, &format!("opendir:{}", errno(&e)));
                return true;
            }
        };
        let mut names = Vec::new();
        let mut seen = HashSet::new();
        for d in list {
            match d {
                Ok(d) => {
                    let name = d.file_name();
                    if !seen.insert(name.clone()) {
                        // A chain that loops lists the same names forever.
                        self.error(path, "readdir-loop");
                        break;
                    }
                    if names.len() >= MAX_ENTRIES {
                        break;
                    }
                    names.push(name);
                }
                Err(e) => {
                    self.error(path, &format!("readdir:{}", errno(&e)));
                    break;
                }
            }
        }
        names.sort();
        for name in names {
            let bytes = name.as_bytes();
            let child = if rel.as_os_str().is_empty() {
                escape(bytes, true)
            } else {
                format!("{path}/{}", escape(bytes, true))
            };
            if bytes.contains(&b'/') {
                self.error(&child, "badname");
                continue;
            }
            if !self.entry(&rel.join(&name), &child) {
                return false;
            }
        }
        true
    }
}

/// Major and minor of a Linux `dev_t`.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    (major, minor)
}

/// The walk of `root` (not following symlinks), sorted, one line each.
pub fn walk(root: &Path, hash: &mut Hash) -> Vec<String> {
    let mut w = Walk {
        root: root.to_owned(),
        hash,
        lines: Vec::new(),
        entries: 0,
        ancestors: Vec::new(),
    };
    if !w.entry(Path::new(""), ".") {
        w.lines.push(". LIMIT entries".to_owned());
    }
    w.lines.sort();
    w.lines
}
