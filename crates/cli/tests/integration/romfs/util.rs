//! Helpers for the romfs tests: building images with genromfs and
//! `foliofs mkfs`, a walk of an image through the library in the kernel
//! oracle's line format, and an editor for crafting damaged images.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_romfs::{checksum, RomFs};
use foliofs_vfs::{FileSystem, FileType, Scratch};
use sha2::{Digest, Sha256};

use crate::common;
use crate::common::oracle::walk;
use crate::common::{Entry, Fields};

/// Runs genromfs with a fixed volume name.
pub fn genromfs(src: &Path, img: &Path, extra: &[&str]) {
    let out = common::run_timeout(
        Command::new("genromfs")
            .args(["-V", "test", "-f"])
            .arg(img)
            .arg("-d")
            .arg(src)
            .args(extra),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "genromfs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `foliofs mkfs romfs EXTRA SRC IMG`.
pub fn mkfs(src: &Path, img: &Path, extra: &[&str]) {
    let mut args: Vec<&OsStr> = vec![OsStr::new("mkfs"), OsStr::new("romfs")];
    args.extend(extra.iter().map(OsStr::new));
    args.push(src.as_os_str());
    args.push(img.as_os_str());
    common::foliofs_ok(args);
}

/// Runs `foliofs extract IMG DEST`.
pub fn extract(img: &Path, dest: &Path) {
    common::foliofs_ok([OsStr::new("extract"), img.as_os_str(), dest.as_os_str()]);
}

/// Asserts two walks hold the same tree as far as romfs keeps it: of a
/// mode, only the owner-exec bit.
pub fn assert_same_romfs_tree(
    expected: &BTreeMap<PathBuf, Entry>,
    actual: &BTreeMap<PathBuf, Entry>,
) {
    common::assert_same_tree(
        expected,
        actual,
        Fields {
            exec: true,
            ..Fields::default()
        },
    );
}

/// Asserts that [`common::every_type_tree`]'s hard link, extracted to
/// `dest`, is one file with its target again.
pub fn assert_hard_link_extracted(dest: &Path) {
    let a = std::fs::metadata(dest.join("k1025")).unwrap();
    let b = std::fs::metadata(dest.join("hardlink-to-k1025")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard link extracted as a hard link");
}

/// The walk of `img` as the library sees it, in the oracle's line format
/// (sorted bytewise, as the oracle sorts), written by the oracle's code.
pub fn library_walk(img: &Path, opts: &OpenOptions) -> String {
    let fs = RomFs::open(img, opts).unwrap_or_else(|e| panic!("{}: {e}", img.display()));
    let mut lines = Vec::new();
    let mut scratch = Scratch::new();
    let mut stack = vec![(fs.root(), ".".to_owned())];
    let mut line_for = |ino: u64, path: &str, lines: &mut Vec<String>| -> bool {
        let a = fs.getattr(ino).unwrap();
        let mut l = walk::attr_line(path, a.mode(), a.ino, a.nlink.into(), a.uid, a.gid, a.size);
        match a.kind {
            FileType::RegularFile => {
                let mut h = Sha256::new();
                let mut off = 0;
                loop {
                    let d = fs.read(ino, off, 1 << 20, &mut scratch).unwrap();
                    if d.is_empty() {
                        break;
                    }
                    h.update(d);
                    off += d.len() as u64;
                }
                l.push_str(&format!(" sha256={:x}", h.finalize()));
            }
            FileType::Symlink => l.push_str(&format!(
                " target={}",
                walk::escape(&fs.readlink(ino).unwrap(), false)
            )),
            FileType::CharDevice | FileType::BlockDevice => {
                l.push_str(&format!(" rdev={}:{}", a.rdev.major, a.rdev.minor))
            }
            _ => {}
        }
        lines.push(l);
        a.kind == FileType::Directory
    };
    line_for(fs.root(), ".", &mut lines);
    while let Some((dir, path)) = stack.pop() {
        let mut ents = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            ents.push((e.name.as_bytes().to_vec(), e.ino));
            false
        })
        .unwrap();
        for (name, ino) in ents {
            let p = if path == "." {
                walk::escape(&name, true)
            } else {
                format!("{path}/{}", walk::escape(&name, true))
            };
            if line_for(ino, &p, &mut lines) {
                stack.push((ino, p));
            }
        }
    }
    lines.sort();
    lines.join("\n") + "\n"
}

/// Drops the `ino=N` field of every line.
pub fn without_ino(walk: &str) -> String {
    walk.lines()
        .map(|l| {
            l.split(' ')
                .filter(|f| !f.starts_with("ino="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths listed by `foliofs ls -R IMAGE` (relative, without "./").
pub fn ls_r_paths(img: &Path) -> BTreeSet<PathBuf> {
    let out = common::foliofs_ok([OsStr::new("ls"), OsStr::new("-R"), img.as_os_str()]);
    let mut paths = BTreeSet::new();
    let mut cur = PathBuf::new();
    for line in out.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        if line.ends_with(b":") {
            let dir = &line[..line.len() - 1];
            let dir = dir
                .strip_prefix(b"./")
                .unwrap_or(if dir == b"." { b"" } else { dir });
            cur = PathBuf::from(OsStr::from_bytes(dir));
            continue;
        }
        paths.insert(cur.join(OsStr::from_bytes(line)));
    }
    paths
}

/// An image in memory, for crafting damage.
pub struct Edit {
    pub bytes: Vec<u8>,
    scratch: tempfile::NamedTempFile,
}

impl Edit {
    pub fn load(img: &Path) -> Edit {
        Edit {
            bytes: std::fs::read(img).unwrap(),
            scratch: tempfile::NamedTempFile::new().unwrap(),
        }
    }

    fn fs(&self) -> RomFs {
        std::fs::write(self.scratch.path(), &self.bytes).unwrap();
        RomFs::open_unverified(self.scratch.path(), &OpenOptions::default()).unwrap()
    }

    /// The header offset of the entry at `path` ("a/b"), not following a
    /// final hard link.
    pub fn header(&self, path: &str) -> u64 {
        let fs = self.fs();
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (fs.find(d).unwrap().ino, n),
            None => (fs.root(), path),
        };
        let d = fs.dir(dir).unwrap();
        d.entries()
            .iter()
            .find(|e| &*e.name == name.as_bytes())
            .unwrap_or_else(|| panic!("{path} not in image"))
            .header
    }

    /// Offsets of every header reachable from the root ("." and ".."
    /// entries included), in file order.
    pub fn all_headers(&self) -> Vec<u64> {
        let fs = self.fs();
        let mut out = BTreeSet::new();
        let mut stack = vec![fs.root()];
        while let Some(d) = stack.pop() {
            let mut off = fs.inode(d).unwrap().first_entry();
            while off != 0 {
                out.insert(off);
                let h = fs.header(off).unwrap();
                if h.kind == foliofs_romfs::EntryType::Directory && off != d {
                    stack.push(off);
                }
                off = h.next;
            }
        }
        out.into_iter().collect()
    }

    pub fn word(&self, off: u64) -> u32 {
        let o = off as usize;
        u32::from_be_bytes(self.bytes[o..o + 4].try_into().unwrap())
    }

    pub fn set_word(&mut self, off: u64, v: u32) {
        let o = off as usize;
        self.bytes[o..o + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the `next` pointer of the header at `h`, keeping its type bits.
    pub fn set_next(&mut self, h: u64, next: u32) {
        let flags = self.word(h) & 15;
        self.set_word(h, next | flags);
    }

    /// Makes the header at `h` sum to zero again, and the superblock too.
    pub fn fix_sums(&mut self, h: u64) {
        let o = h as usize;
        let name_len = self.bytes[o + 16..]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(0);
        let meta = (16 + name_len + 1 + 15) & !15;
        self.bytes[o + 12..o + 16].copy_from_slice(&[0; 4]);
        let c = checksum::fix(&self.bytes[o..o + meta]);
        self.set_word(h + 12, c);
        self.fix_superblock();
    }

    pub fn fix_superblock(&mut self) {
        let size = self.word(8) as usize;
        let span = size.min(512).min(self.bytes.len());
        self.set_word(12, 0);
        let c = checksum::fix(&self.bytes[..span]);
        self.set_word(12, c);
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.bytes).unwrap();
    }
}
