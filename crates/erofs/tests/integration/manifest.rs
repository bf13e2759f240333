//! The committed EROFS corpus (`tests/data/erofs-1.9/corpus.tar.xz`, made
//! by `make.sh` beside it with mkfs.erofs 1.9.3 and checked against Linux):
//! unpacking it, and reading and comparing its manifests. Shared with the
//! foliofs integration tests, which mount some of the same images.
//!
//! The archive is unpacked with `tar -xJf` (GNU tar and xz-utils, which
//! every Debian machine that builds foliofs has and `scripts/setup`
//! installs) rather than through archive crates: it runs once per test
//! binary, and no dependency is added for it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// One path of an image as it must read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `reg`, `dir`, `lnk`, `chr`, `blk`, `fifo` or `sock`.
    pub kind: String,
    /// `st_mode`, type bits included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    pub mtime: (i64, u32),
    /// `st_ino` as Linux reports it: the nid, or on metabox images the
    /// kernel's 64-bit inode number made from it.
    pub ino: u64,
    pub rdev: (u32, u32),
    /// Of a regular file's data.
    pub sha256: Option<String>,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A walk: path (from `/`) to entry.
pub type Walk = BTreeMap<String, Entry>;

/// What one image holds and how it was made.
#[derive(Debug)]
pub struct Manifest {
    /// The image's file name in the corpus directory.
    pub image: String,
    /// The mkfs.erofs command line that built it.
    pub mkfs: String,
    /// Its extra device (the tar of a `--tar=i` image, a blob), if any.
    pub device: Option<String>,
    /// Where the expected value is not what Linux showed, and why.
    pub notes: Vec<String>,
    pub entries: Walk,
}

impl Manifest {
    /// The image's name without `.erofs`.
    pub fn name(&self) -> &str {
        self.image.trim_end_matches(".erofs")
    }
}

fn hex(s: &str) -> Vec<u8> {
    if s == "-" {
        return Vec::new();
    }
    assert!(s.len().is_multiple_of(2), "odd hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn opt(s: &str) -> Option<&str> {
    (s != "-").then_some(s)
}

pub fn parse(text: &str) -> Manifest {
    let mut m = Manifest {
        image: String::new(),
        mkfs: String::new(),
        device: None,
        notes: Vec::new(),
        entries: Walk::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f[0] {
            "image" => m.image = f[1].to_owned(),
            "mkfs" => m.mkfs = f[1].to_owned(),
            "device" => m.device = Some(f[1].to_owned()),
            "note" => m.notes.push(f[1].to_owned()),
            "entry" => {
                assert_eq!(f.len(), 13, "entry line {line:?}");
                let (sec, nsec) = f[8].split_once('.').unwrap();
                let (major, minor) = f[10].split_once(':').unwrap();
                let e = Entry {
                    kind: f[2].to_owned(),
                    mode: u32::from_str_radix(f[3], 8).unwrap(),
                    uid: f[4].parse().unwrap(),
                    gid: f[5].parse().unwrap(),
                    nlink: f[6].parse().unwrap(),
                    size: f[7].parse().unwrap(),
                    mtime: (sec.parse().unwrap(), nsec.parse().unwrap()),
                    ino: f[9].parse().unwrap(),
                    rdev: (major.parse().unwrap(), minor.parse().unwrap()),
                    sha256: opt(f[11]).map(str::to_owned),
                    target: opt(f[12]).map(hex),
                    xattrs: BTreeMap::new(),
                };
                m.entries.insert(f[1].to_owned(), e);
            }
            "xattr" => {
                assert_eq!(f.len(), 4, "xattr line {line:?}");
                m.entries
                    .get_mut(f[1])
                    .unwrap_or_else(|| panic!("xattr of an unlisted path: {line:?}"))
                    .xattrs
                    .insert(f[2].as_bytes().to_vec(), hex(f[3]));
            }
            other => panic!("unknown manifest line kind {other:?}"),
        }
    }
    assert!(!m.image.is_empty() && !m.mkfs.is_empty() && m.entries.contains_key("/"));
    m
}

/// The corpus, unpacked (once per archive content) under `tmp`, a test
/// binary's `CARGO_TARGET_TMPDIR`.
pub fn corpus_dir(archive: &Path, tmp: &Path) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut h = Sha256::new();
        let mut f = fs::File::open(archive)
            .unwrap_or_else(|e| panic!("the EROFS corpus {}: {e}", archive.display()));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let key = format!("{:x}", h.finalize());
        let dir = tmp.join(format!("erofs-1.9-corpus-{}", &key[..16]));
        if !dir.join(".done").exists() {
            // Unpacked beside and renamed into place, so a run cut short or
            // another test binary unpacking at the same time leaves no
            // half-filled directory under the final name.
            let part = tmp.join(format!("erofs-1.9-corpus.part.{}", std::process::id()));
            let _ = fs::remove_dir_all(&part);
            fs::create_dir_all(&part).unwrap();
            let out = Command::new("tar")
                .arg("-xJf")
                .arg(archive)
                .arg("-C")
                .arg(&part)
                .output()
                .unwrap_or_else(|e| panic!("tar (to unpack the EROFS corpus): {e}"));
            assert!(
                out.status.success(),
                "tar -xJf {}: {} (needs GNU tar and xz-utils)",
                archive.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            fs::write(part.join(".done"), b"").unwrap();
            let _ = fs::remove_dir_all(&dir);
            if fs::rename(&part, &dir).is_err() {
                let _ = fs::remove_dir_all(&part);
                assert!(dir.join(".done").exists());
            }
        }
        dir
    })
}

/// Every manifest of the corpus in `dir`, by image name.
pub fn manifests(dir: &Path) -> BTreeMap<String, Manifest> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "manifest") {
            let m = parse(&fs::read_to_string(&p).unwrap());
            out.insert(m.name().to_owned(), m);
        }
    }
    out
}

/// Each difference of `got` from the manifest, as a line; empty when equal.
pub fn differences(want: &Manifest, got: &Walk) -> Vec<String> {
    let mut diffs = Vec::new();
    for (p, w) in &want.entries {
        match got.get(p) {
            None => diffs.push(format!("missing: {p}")),
            Some(g) if g != w => diffs.push(format!("{p}:\n  want {w:?}\n  got  {g:?}")),
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.entries.contains_key(*p)) {
        diffs.push(format!("unexpected: {p}"));
    }
    diffs
}
