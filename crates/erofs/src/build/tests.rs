//! The builder against the crate's own reader and checker: names, order,
//! links, replacement and whiteouts, on images made here.

use std::ffi::OsStr;
use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use foliofs_block::OpenOptions;
use foliofs_vfs::{FileSystem, FileType, Scratch};

use super::source_tar::{components, pax_time};
use super::{Builder, Options};
use crate::Erofs;

fn open(img: &Path) -> Erofs {
    let fs = Erofs::open(img, &OpenOptions::default(), &[]).unwrap();
    let report = fs.fsck();
    assert!(report.is_clean(), "fsck: {report:?}");
    fs
}

fn names(fs: &Erofs, dir: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        out.push(e.name.as_bytes().to_vec());
        false
    })
    .unwrap();
    out
}

fn lookup(fs: &Erofs, path: &str) -> foliofs_vfs::Attr {
    let mut ino = fs.root();
    let mut attr = fs.getattr(ino).unwrap();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        attr = fs
            .lookup(ino, OsStr::new(c))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        ino = attr.ino;
    }
    attr
}

fn read_all(fs: &Erofs, ino: u64) -> Vec<u8> {
    let mut s = Scratch::new();
    let mut out = Vec::new();
    loop {
        let got = fs.read(ino, out.len() as u64, 1 << 16, &mut s).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend_from_slice(got);
    }
}

#[test]
fn paths_resolve_inside_the_root_only() {
    assert_eq!(components(b"./a//b/./c/").unwrap(), [b"a", b"b", b"c"]);
    assert_eq!(components(b"a/../b").unwrap(), [b"b"]);
    assert!(components(b"../etc/passwd").is_err());
    assert!(components(b"a/../../b").is_err());
    assert!(components(b"/").unwrap().is_empty());
}

#[test]
fn pax_times_keep_nanoseconds() {
    assert_eq!(
        pax_time(b"1700000000.5"),
        Some((1_700_000_000, 500_000_000))
    );
    assert_eq!(pax_time(b"12.000000001999"), Some((12, 1)));
    assert_eq!(pax_time(b"-1.25"), Some((-2, 750_000_000)));
    assert_eq!(pax_time(b"7"), Some((7, 0)));
    assert_eq!(pax_time(b"x"), None);
    assert_eq!(pax_time(b"1.2.3"), None);
}

/// A directory spanning many 512-byte blocks lists in byte order and
/// finds every name, "." and ".." sorted among the others.
#[test]
fn large_directories_sort_across_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut want: Vec<Vec<u8>> = vec![b".".to_vec(), b"..".to_vec()];
    for i in 0..300 {
        let n = format!("{}{i:03}", ["!", "-", "a", "Z", "~"][i % 5]);
        std::fs::write(src.join(&n), n.as_bytes()).unwrap();
        want.push(n.into_bytes());
    }
    want.sort();
    let img = tmp.path().join("img");
    let opts = Options {
        blkszbits: 9,
        time: Some(0),
        ..Options::default()
    };
    Builder::build_dir(&src, &img, opts).unwrap();
    let fs = open(&img);
    want.retain(|n| n != b"." && n != b"..");
    let mut got = names(&fs, fs.root());
    got.sort();
    assert_eq!(got, want);
    for n in &want {
        let n = std::str::from_utf8(n).unwrap();
        let a = lookup(&fs, n);
        assert_eq!(read_all(&fs, a.ino), n.as_bytes());
    }
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(1_000);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().unwrap()
}

/// Later entries replace earlier ones, parents nobody declared are made,
/// hard links share an inode, and AUFS whiteouts become overlayfs's.
#[test]
fn tar_replacement_links_and_whiteouts() {
    let tar = tar_of(|b| {
        let f = |b: &mut tar::Builder<Vec<u8>>, p: &str, data: &[u8]| {
            let mut h = header(tar::EntryType::Regular, data.len() as u64, 0o644);
            b.append_data(&mut h, p, data).unwrap();
        };
        f(b, "deep/er/file", b"first");
        f(b, "deep/er/file", b"second, longer");
        f(b, "gone", b"x");
        let mut h = header(tar::EntryType::Link, 0, 0o644);
        b.append_link(&mut h, "deep/hard", "deep/er/file").unwrap();
        let mut h = header(tar::EntryType::Regular, 0, 0o600);
        b.append_data(&mut h, "deep/.wh.gone", &b""[..]).unwrap();
        let mut h = header(tar::EntryType::Regular, 0, 0o600);
        b.append_data(&mut h, "opq/.wh..wh..opq", &b""[..]).unwrap();
    });
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    let opts = Options {
        aufs: true,
        ..Options::default()
    };
    Builder::build_tar(Box::new(Cursor::new(tar)), &img, opts).unwrap();
    let fs = open(&img);
    let file = lookup(&fs, "deep/er/file");
    assert_eq!(read_all(&fs, file.ino), b"second, longer");
    assert_eq!(file.nlink, 2);
    assert_eq!(lookup(&fs, "deep/hard").ino, file.ino);
    assert_eq!(lookup(&fs, "deep/er").mode() & 0o7777, 0o755);
    let wh = lookup(&fs, "deep/gone");
    assert_eq!(wh.kind, FileType::CharDevice);
    assert_eq!((wh.rdev.major, wh.rdev.minor), (0, 0));
    let deep = lookup(&fs, "deep");
    assert_eq!(
        fs.getxattr(deep.ino, OsStr::new("trusted.overlay.origin"))
            .unwrap(),
        b""
    );
    let opq = lookup(&fs, "opq");
    assert_eq!(
        fs.getxattr(opq.ino, OsStr::new("trusted.overlay.opaque"))
            .unwrap(),
        b"y"
    );
    assert!(names(&fs, opq.ino).is_empty());
    // "gone" at the root is untouched: the whiteout was in deep/.
    assert_eq!(read_all(&fs, lookup(&fs, "gone").ino), b"x");
}

/// Bad tars fail with the entry named, and leave no image.
#[test]
fn bad_tars_name_the_entry_and_leave_nothing() {
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "escape",
            tar_of(|b| {
                let mut h = header(tar::EntryType::Regular, 1, 0o644);
                h.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"../outside");
                h.set_cksum();
                b.append(&h, &b"x"[..]).unwrap();
            }),
            "climbs out of the root",
        ),
        (
            "long name",
            tar_of(|b| {
                let mut h = header(tar::EntryType::Regular, 1, 0o644);
                b.append_data(&mut h, "a".repeat(256), &b"x"[..]).unwrap();
            }),
            "256 bytes",
        ),
        (
            "dangling link",
            tar_of(|b| {
                let mut h = header(tar::EntryType::Link, 0, 0o644);
                b.append_link(&mut h, "l", "nowhere").unwrap();
            }),
            "no earlier entry made",
        ),
        (
            "truncated",
            {
                let mut t = tar_of(|b| {
                    let mut h = header(tar::EntryType::Regular, 5000, 0o644);
                    b.append_data(&mut h, "cut", &[7u8; 5000][..]).unwrap();
                });
                t.truncate(512 + 3000);
                t
            },
            "truncated",
        ),
    ];
    for (what, tar, expect) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        let err = Builder::build_tar(Box::new(Cursor::new(tar)), &img, Options::default())
            .expect_err(what)
            .to_string();
        assert!(err.contains(expect), "{what}: {err}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "{what}: left {left:?}");
    }
}
