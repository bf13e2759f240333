//! Walking trees and comparing them.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{run_timeout, sh_as_user};

/// What a tree holds, as `user` (or this process, for `None`) sees it with
/// the system's own tools: every path with its type, each regular file's
/// SHA-256, each symlink's target and each device's numbers. Two trees
/// with the same listing hold the same things.
pub fn listing(user: Option<&str>, dir: &Path) -> String {
    const SCRIPT: &str = r#"cd "$1" || exit 1
export LC_ALL=C
find . -printf '%y %P
' | sort
find . -type f -print0 | sort -z | xargs -0r sha256sum
find . -type l -printf '%P -> %l
' | sort
find . \( -type c -o -type b \) -exec stat -c '%n %t:%T' {} + | sort"#;
    let out = match user {
        Some(u) => sh_as_user(u, SCRIPT, &[dir]),
        None => run_timeout(
            Command::new("/bin/sh").args(["-c", SCRIPT, "sh"]).arg(dir),
            Duration::from_secs(120),
        ),
    };
    assert!(
        out.status.success(),
        "listing {} as {user:?}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One entry of a walked tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    /// Full st_mode.
    pub mode: u32,
    pub ino: u64,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// sha256 of a regular file's content.
    pub sha256: Option<String>,
    pub target: Option<Vec<u8>>,
    pub rdev: Option<(u32, u32)>,
}

/// Walks `root` without following symlinks; keys are paths relative to
/// `root` ("" is the root itself).
pub fn walk(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    walk_into(root, Path::new(""), &mut out);
    out
}

fn walk_into(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
    let path = root.join(rel);
    let md =
        fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
    let ft = md.file_type();
    let kind =
        foliofs_vfs::FileType::from_std(ft).map_or("unknown", foliofs_vfs::FileType::short_name);
    let mut e = Entry {
        kind,
        mode: md.mode(),
        ino: md.ino(),
        nlink: md.nlink(),
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        sha256: None,
        target: None,
        rdev: None,
    };
    if ft.is_file() {
        let mut h = Sha256::new();
        let mut f =
            fs::File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        e.sha256 = Some(format!("{:x}", h.finalize()));
    } else if ft.is_symlink() {
        e.target = Some(
            fs::read_link(&path)
                .unwrap()
                .into_os_string()
                .into_vec_bytes(),
        );
    } else if ft.is_char_device() || ft.is_block_device() {
        e.rdev = Some((libc::major(md.rdev()), libc::minor(md.rdev())));
    }
    out.insert(rel.to_owned(), e);
    if ft.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("readdir {}: {e}", path.display()))
            .map(|d| d.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            walk_into(root, &rel.join(n), out);
        }
    }
}

trait IntoVecBytes {
    fn into_vec_bytes(self) -> Vec<u8>;
}

impl IntoVecBytes for std::ffi::OsString {
    fn into_vec_bytes(self) -> Vec<u8> {
        use std::os::unix::ffi::OsStringExt;
        self.into_vec()
    }
}

/// Which fields [`assert_same_tree`] compares besides path and type.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields {
    /// Permission bits (st_mode & 0o7777).
    pub perm: bool,
    /// Only the owner-exec bit (romfs keeps nothing else).
    pub exec: bool,
    pub owner: bool,
    pub nlink: bool,
    pub ino: bool,
}

/// Asserts two walks hold the same paths with the same type, size, content,
/// symlink target and rdev (and the `fields` asked for); lists every difference.
pub fn assert_same_tree(
    expected: &BTreeMap<PathBuf, Entry>,
    actual: &BTreeMap<PathBuf, Entry>,
    fields: Fields,
) {
    let mut diffs = Vec::new();
    for (p, e) in expected {
        let Some(a) = actual.get(p) else {
            diffs.push(format!("missing: {}", p.display()));
            continue;
        };
        let mut d = Vec::new();
        if e.kind != a.kind {
            d.push(format!("type {} != {}", e.kind, a.kind));
        }
        if (e.kind == "reg" || e.kind == "lnk") && e.size != a.size {
            d.push(format!("size {} != {}", e.size, a.size));
        }
        if e.sha256 != a.sha256 {
            d.push("content differs".into());
        }
        if e.target != a.target {
            d.push(format!("target {:?} != {:?}", e.target, a.target));
        }
        if e.rdev != a.rdev {
            d.push(format!("rdev {:?} != {:?}", e.rdev, a.rdev));
        }
        if fields.perm && e.mode & 0o7777 != a.mode & 0o7777 {
            d.push(format!("mode {:o} != {:o}", e.mode, a.mode));
        }
        if fields.exec && e.kind == "reg" && e.mode & 0o100 != a.mode & 0o100 {
            d.push(format!("exec bit {:o} != {:o}", e.mode, a.mode));
        }
        if fields.owner && (e.uid, e.gid) != (a.uid, a.gid) {
            d.push(format!("owner {}:{} != {}:{}", e.uid, e.gid, a.uid, a.gid));
        }
        if fields.nlink && e.nlink != a.nlink {
            d.push(format!("nlink {} != {}", e.nlink, a.nlink));
        }
        if fields.ino && e.ino != a.ino {
            d.push(format!("ino {} != {}", e.ino, a.ino));
        }
        if !d.is_empty() {
            diffs.push(format!("{}: {}", p.display(), d.join(", ")));
        }
    }
    for p in actual.keys() {
        if !expected.contains_key(p) {
            diffs.push(format!("unexpected: {}", p.display()));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} difference(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
