//! The builder against the crate's own reader and checker: names, order,
//! links, replacement and whiteouts, on images made here.

use std::ffi::OsStr;
use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use foliofs_block::OpenOptions;
use foliofs_vfs::{FileSystem, FileType, Scratch};

use super::source_tar::components;
use super::tar::pax::time as pax_time;
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
    assert!(components(b"/").is_err());
    assert!(components(b"/etc/passwd").is_err());
    assert!(components(b".").unwrap().is_empty());
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
        (
            "a file naming the root",
            tar_of(|b| {
                let mut h = header(tar::EntryType::Regular, 1, 0o644);
                h.as_gnu_mut().unwrap().name[..2].copy_from_slice(b"./");
                h.set_cksum();
                b.append(&h, &b"x"[..]).unwrap();
            }),
            "the root must be a directory",
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

/// `tar` crate's writer refuses some of what these tests need (links
/// through symlinks, `..` in names), so their headers are set raw.
fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    path: &[u8],
    link: &[u8],
    data: &[u8],
) {
    let mut h = header(kind, data.len() as u64, 0o644);
    {
        let g = h.as_gnu_mut().unwrap();
        g.name[..path.len()].copy_from_slice(path);
        g.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// The rules for ambiguous input, as containerd unpacks a layer: a hard
/// link keeps the file its target was when the link was read; entries
/// below a symlink go where it points, within the root; `./` and
/// duplicate slashes are dropped; a file replaces a directory's whole
/// subtree, and a directory over a directory merges.
#[test]
fn ambiguous_tars_read_as_containerd_unpacks_them() {
    use tar::EntryType as T;
    let tar = tar_of(|b| {
        raw_entry(b, T::Regular, b"./a//target", b"", b"old");
        raw_entry(b, T::Link, b"link", b"a/target", b"");
        raw_entry(b, T::Regular, b"a/target", b"", b"new");
        raw_entry(b, T::Directory, b"real/", b"", b"");
        raw_entry(b, T::Symlink, b"sym", b"real", b"");
        raw_entry(b, T::Regular, b"sym/under", b"", b"via symlink");
        raw_entry(b, T::Symlink, b"abs", b"/real/../real", b"");
        raw_entry(b, T::Regular, b"abs/deeper/f", b"", b"via absolute");
        raw_entry(b, T::Symlink, b"up", b"../../..", b"");
        raw_entry(b, T::Regular, b"up/top", b"", b"clamped at the root");
        raw_entry(b, T::Link, b"hl-sym", b"sym", b"");
        raw_entry(b, T::Regular, b"dir/sub/f", b"", b"x");
        raw_entry(b, T::Regular, b"dir", b"", b"a file now");
        raw_entry(b, T::Directory, b"merge/", b"", b"");
        raw_entry(b, T::Regular, b"merge/kept", b"", b"k");
        let mut h = header(T::Directory, 0, 0o700);
        b.append_data(&mut h, "merge/", &b""[..]).unwrap();
        raw_entry(b, T::Symlink, b"loop", b"loop", b"");
    });
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    Builder::build_tar(Box::new(Cursor::new(tar)), &img, Options::default()).unwrap();
    let fs = open(&img);
    let link = lookup(&fs, "link");
    assert_eq!(read_all(&fs, link.ino), b"old");
    assert_eq!(link.nlink, 1);
    assert_eq!(read_all(&fs, lookup(&fs, "a/target").ino), b"new");
    assert_eq!(read_all(&fs, lookup(&fs, "real/under").ino), b"via symlink");
    assert_eq!(
        read_all(&fs, lookup(&fs, "real/deeper/f").ino),
        b"via absolute"
    );
    assert_eq!(
        read_all(&fs, lookup(&fs, "top").ino),
        b"clamped at the root"
    );
    assert_eq!(lookup(&fs, "sym").kind, FileType::Symlink);
    // A hard link to a symlink is a link to the symlink itself.
    assert_eq!(lookup(&fs, "hl-sym").ino, lookup(&fs, "sym").ino);
    assert_eq!(lookup(&fs, "dir").kind, FileType::RegularFile);
    let merge = lookup(&fs, "merge");
    assert_eq!(merge.mode() & 0o7777, 0o700);
    assert_eq!(names(&fs, merge.ino), [b"kept"]);
    // A symlink loop among an entry's parents is an error naming it.
    let looped = tar_of(|b| {
        raw_entry(b, T::Symlink, b"loop", b"loop", b"");
        raw_entry(b, T::Regular, b"loop/f", b"", b"x");
    });
    let err = Builder::build_tar(
        Box::new(Cursor::new(looped)),
        &tmp.path().join("l"),
        Options::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("loop/f") && err.contains("symlinks followed"),
        "{err}"
    );
    // Only a directory may name the root.
    for (kind, name) in [
        (T::Regular, &b"./"[..]),
        (T::Symlink, b"."),
        (T::Fifo, b"a/.."),
    ] {
        let t = tar_of(|b| raw_entry(b, kind, name, b"x", b""));
        let err = Builder::build_tar(
            Box::new(Cursor::new(t)),
            &tmp.path().join("r"),
            Options::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("naming the root"), "{err}");
    }
}

/// A sparse file's holes are left out of the image where whole chunks
/// are holes, and it reads back byte for byte.
#[test]
fn sparse_files_keep_their_holes() {
    use super::tar::tests::{block, rec, tar as tar_bytes, USTAR};
    let size: u64 = 64 << 20;
    let body = [
        rec(b"GNU.sparse.major", b"1"),
        rec(b"GNU.sparse.minor", b"0"),
        rec(b"GNU.sparse.name", b"sparse"),
        rec(b"GNU.sparse.realsize", size.to_string().as_bytes()),
    ]
    .concat();
    let frags = [(4096u64, 5u64), (20 << 20, 8192), (size - 3, 3)];
    let mut data = format!("{}\n", frags.len());
    for (o, l) in frags {
        data += &format!("{o}\n{l}\n");
    }
    let mut data = data.into_bytes();
    data.resize(512, 0);
    let mut expect = vec![0u8; size as usize];
    for (i, (o, l)) in frags.iter().enumerate() {
        for k in 0..*l {
            let v = (i as u8 + 1).wrapping_mul(31).wrapping_add(k as u8);
            data.push(v);
            expect[(o + k) as usize] = v;
        }
    }
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    let f = block(b"./GNUSparseFile.0/sparse", b'0', data.len() as u64, USTAR);
    let t = tar_bytes(&[(&x, &body), (&f, &data)]);
    let tmp = tempfile::tempdir().unwrap();
    for (name, compression) in [
        ("plain", None),
        (
            "lz4",
            Some(super::Compression {
                compressor: super::Compressor::Lz4,
                pcluster: 4096,
            }),
        ),
    ] {
        let img = tmp.path().join(name);
        let opts = Options {
            compression,
            ..Options::default()
        };
        Builder::build_tar(Box::new(Cursor::new(t.clone())), &img, opts).unwrap();
        assert!(
            std::fs::metadata(&img).unwrap().len() < 1 << 20,
            "{name}: holes were written"
        );
        let fs = open(&img);
        let a = lookup(&fs, "sparse");
        assert_eq!(a.size, size);
        assert!(read_all(&fs, a.ino) == expect, "{name}: bytes differ");
    }
}

/// A made-up sparse map that would make a small tar write gigabytes (one
/// byte of data in a file of 2^56 bytes: chunks must be huge, and the
/// one holding the byte is written whole) is refused in one line; a file
/// with data in whole blocks far apart is not.
#[test]
fn sparse_files_may_not_grow_past_their_data() {
    use super::tar::tests::{block, rec, tar as tar_bytes, USTAR};
    let tar_of_map = |size: u64, frags: &[(u64, u64)]| {
        let map: Vec<String> = frags.iter().map(|(o, l)| format!("{o},{l}")).collect();
        let body = [
            rec(b"GNU.sparse.size", size.to_string().as_bytes()),
            rec(b"GNU.sparse.numblocks", frags.len().to_string().as_bytes()),
            rec(b"GNU.sparse.map", map.join(",").as_bytes()),
        ]
        .concat();
        let data: Vec<u8> = frags.iter().flat_map(|f| vec![7u8; f.1 as usize]).collect();
        let x = block(b"x", b'x', body.len() as u64, USTAR);
        let f = block(b"f", b'0', data.len() as u64, USTAR);
        tar_bytes(&[(&x, &body), (&f, &data)])
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    let t = tar_of_map(1 << 56, &[(1 << 40, 1)]);
    let started = std::time::Instant::now();
    let err = Builder::build_tar(Box::new(Cursor::new(t)), &img, Options::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("more than 16 times its data"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(!img.exists());
    // 64 GiB with a 4 KiB block of data every GiB: chunks small enough.
    let frags: Vec<(u64, u64)> = (0..64).map(|g| (g << 30, 4096)).collect();
    let t = tar_of_map(64 << 30, &frags);
    Builder::build_tar(Box::new(Cursor::new(t)), &img, Options::default()).unwrap();
    assert!(std::fs::metadata(&img).unwrap().len() < 16 << 20);
}
