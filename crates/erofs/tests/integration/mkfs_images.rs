//! Images built by mkfs.erofs from a small tree read back through the
//! library exactly as the source tree holds them (content, types, modes,
//! owners, mtimes, link targets, device numbers, xattrs).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use foliofs_block::{BlockSizeChoice, OpenOptions};
use foliofs_erofs::Erofs;
use foliofs_vfs::{FileSystem, FileType, Scratch};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// Whether this machine can build the tree and its images: root (a device
/// node, another owner, a trusted xattr) and mkfs.erofs. When it cannot,
/// prints why the test is skipped.
fn can_build() -> bool {
    // SAFETY: geteuid has no preconditions.
    let why = if unsafe { libc::geteuid() } != 0 {
        "root"
    } else if Command::new("mkfs.erofs").arg("--help").output().is_err() {
        "mkfs.erofs (`bash scripts/setup` installs it)"
    } else {
        return true;
    };
    let current = std::thread::current();
    // Past the test harness's capture: a passing run says what it skipped.
    let _ = writeln!(
        std::io::stderr().lock(),
        "skip: {}: needs {why}",
        current.name().unwrap_or("mkfs_images")
    );
    false
}

/// Deterministic bytes: compressible or not.
fn data(seed: u64, len: usize, compressible: bool) -> Vec<u8> {
    if compressible {
        return (0..len).map(|i| (i / 7 % 26) as u8 + b'a').collect();
    }
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn setxattr(path: &Path, name: &str, value: &[u8]) {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a live buffer for the call.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr {name} on {}", path.display());
}

fn build_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    for (i, size) in [0usize, 1, 100, 4095, 4096, 4097, 10_000, 65_536, 300_001]
        .into_iter()
        .enumerate()
    {
        std::fs::write(
            dir.join(format!("r{size}")),
            data(i as u64 + 1, size, false),
        )
        .unwrap();
        std::fs::write(dir.join(format!("sub/c{size}")), data(0, size, true)).unwrap();
    }
    std::fs::write(dir.join("sub/deeper/mixed"), {
        let mut v = data(9, 200_000, true);
        v.extend(data(10, 150_000, false));
        v
    })
    .unwrap();
    std::os::unix::fs::symlink("sub/c100", dir.join("link")).unwrap();
    std::os::unix::fs::symlink("x".repeat(300), dir.join("longlink")).unwrap();
    std::fs::hard_link(dir.join("r100"), dir.join("hard")).unwrap();
    for i in 0..300 {
        std::fs::write(
            dir.join("sub")
                .join(format!("many-{i:04}-{}", "n".repeat(i % 90))),
            b"x",
        )
        .unwrap();
    }
    setxattr(&dir.join("r1"), "user.one", b"1");
    setxattr(&dir.join("r1"), "trusted.t", &data(3, 300, false));
    for f in ["r100", "r4096", "sub/c1"] {
        setxattr(&dir.join(f), "user.shared", b"same everywhere");
    }
    setxattr(&dir.join("sub"), "user.dir", b"on a directory");
    let fifo = std::ffi::CString::new(dir.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path.
    unsafe {
        assert_eq!(libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o640, 0), 0);
        let chr = std::ffi::CString::new(dir.join("chr").as_os_str().as_bytes()).unwrap();
        assert_eq!(
            libc::mknod(
                chr.as_ptr(),
                libc::S_IFCHR | 0o600,
                libc::makedev(259, 70000)
            ),
            0
        );
    }
    let owned = dir.join("r10000");
    std::os::unix::fs::lchown(&owned, Some(1234), Some(4321)).unwrap();
    set_times(dir, &mut 0);
}

/// Gives every entry a distinct mtime in the past with nanoseconds, as an
/// unpacked archive has. Left as made, the tree's mtimes fall in the second
/// of the build, which mkfs.erofs 1.8 and later store in the compact inode
/// form (the superblock's time, no nanoseconds) whatever `--preserve-mtime`
/// says; the tests would then depend on which mkfs.erofs is on PATH.
fn set_times(path: &Path, n: &mut i64) {
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            set_times(&path.join(name), n);
        }
    }
    *n += 1;
    let t = libc::timespec {
        tv_sec: 1_500_000_000 + *n * 3_601,
        tv_nsec: 123_456_789 + *n,
    };
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and two live timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

#[derive(Debug, PartialEq)]
struct Node {
    kind: FileType,
    perm: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, u32),
    nlink: u64,
    rdev: u64,
    content: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn host_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: valid path and a buffer of the stated size.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0);
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let cn = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: as above.
        let m = unsafe { libc::lgetxattr(p.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0);
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

fn walk_host(root: &Path, rel: PathBuf, out: &mut BTreeMap<PathBuf, Node>) {
    let p = root.join(&rel);
    let md = std::fs::symlink_metadata(&p).unwrap();
    let kind = FileType::from_std(md.file_type()).unwrap();
    let content = match kind {
        FileType::RegularFile => std::fs::read(&p).unwrap(),
        FileType::Symlink => std::fs::read_link(&p)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec(),
        _ => Vec::new(),
    };
    out.insert(
        rel.clone(),
        Node {
            kind,
            perm: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            size: if kind == FileType::Directory {
                0
            } else {
                md.size()
            },
            mtime: (md.mtime(), md.mtime_nsec() as u32),
            nlink: if kind == FileType::Directory {
                0
            } else {
                md.nlink()
            },
            rdev: md.rdev(),
            content,
            xattrs: host_xattrs(&p),
        },
    );
    if kind == FileType::Directory {
        for e in std::fs::read_dir(&p).unwrap() {
            walk_host(root, rel.join(e.unwrap().file_name()), out);
        }
    }
}

fn walk_fs(fs: &Erofs, ino: u64, rel: PathBuf, out: &mut BTreeMap<PathBuf, Node>) {
    let a = fs.getattr(ino).unwrap();
    let mut content = Vec::new();
    let mut scratch = Scratch::new();
    match a.kind {
        FileType::RegularFile => {
            // Odd-sized reads cross block, chunk and extent boundaries.
            let mut off = 0;
            loop {
                let got = fs.read(ino, off, 77_777, &mut scratch).unwrap();
                if got.is_empty() {
                    break;
                }
                content.extend_from_slice(got);
                off += got.len() as u64;
            }
        }
        FileType::Symlink => content = fs.readlink(ino).unwrap(),
        _ => {}
    }
    let mut xattrs = BTreeMap::new();
    for n in fs.listxattr(ino).unwrap() {
        let v = fs.getxattr(ino, OsStr::from_bytes(&n)).unwrap();
        xattrs.insert(n, v);
    }
    out.insert(
        rel.clone(),
        Node {
            kind: a.kind,
            perm: u32::from(a.perm),
            uid: a.uid,
            gid: a.gid,
            size: if a.kind == FileType::Directory {
                0
            } else {
                a.size
            },
            mtime: (a.mtime.sec, a.mtime.nsec),
            nlink: if a.kind == FileType::Directory {
                0
            } else {
                u64::from(a.nlink)
            },
            rdev: a.rdev.to_dev_t(),
            content,
            xattrs,
        },
    );
    if a.kind == FileType::Directory {
        let mut children = Vec::new();
        fs.readdir(ino, 0, &mut |e| {
            children.push((e.name.to_owned(), e.ino));
            false
        })
        .unwrap();
        for (name, child) in children {
            assert_eq!(fs.lookup(ino, &name).unwrap().ino, child, "lookup {name:?}");
            walk_fs(fs, child, rel.join(&name), out);
        }
    }
}

fn check(args: &[&str], blob: bool) {
    if !can_build() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    build_tree(&src);
    let img = tmp.path().join("img");
    let blob_path = tmp.path().join("blob");
    let mut cmd = Command::new("mkfs.erofs");
    cmd.arg("--quiet").args(args);
    if blob {
        cmd.arg(format!("--blobdev={}", blob_path.display()));
    }
    let out = cmd.arg(&img).arg(&src).output().unwrap();
    assert!(
        out.status.success(),
        "mkfs.erofs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let devices = if blob { vec![blob_path] } else { vec![] };
    let mut want = BTreeMap::new();
    walk_host(&src, PathBuf::new(), &mut want);
    // The cache's block size is independent of the image's: every choice
    // must read the same tree.
    for bs in [
        BlockSizeChoice::Default,
        BlockSizeChoice::Fixed(1024),
        BlockSizeChoice::Fixed(65536),
        BlockSizeChoice::Fixed(2 << 20),
    ] {
        let opts = OpenOptions {
            block_size: bs,
            ..OpenOptions::default()
        };
        let fs = Erofs::open(&img, &opts, &devices).unwrap();
        compare(args, bs, &fs, &want);
    }
    let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
    let report = fs.fsck();
    assert!(report.is_clean(), "fsck: {:?}", report.errors);
    assert_eq!(
        report.data_bytes,
        want.values()
            .filter(|n| n.kind != FileType::Directory)
            .map(|n| n.size)
            .sum::<u64>()
    );
}

fn compare(args: &[&str], bs: BlockSizeChoice, fs: &Erofs, want: &BTreeMap<PathBuf, Node>) {
    let mut got = BTreeMap::new();
    walk_fs(fs, fs.root(), PathBuf::new(), &mut got);
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing {}", p.display())),
            Some(g) => {
                // The root's mtime follows the build time without -T.
                let mut w2 = Node {
                    content: vec![],
                    xattrs: w.xattrs.clone(),
                    ..*w
                };
                let g2 = Node {
                    content: vec![],
                    xattrs: g.xattrs.clone(),
                    ..*g
                };
                if p.as_os_str().is_empty() {
                    w2.mtime = g2.mtime;
                }
                if w2 != g2 {
                    diffs.push(format!("{}: want {w2:?}\n   got {g2:?}", p.display()));
                }
                if w.content != g.content {
                    diffs.push(format!(
                        "{}: content differs ({} vs {} bytes)",
                        p.display(),
                        w.content.len(),
                        g.content.len()
                    ));
                }
            }
        }
    }
    for p in got.keys() {
        if !want.contains_key(p) {
            diffs.push(format!("extra {}", p.display()));
        }
    }
    assert!(
        diffs.is_empty(),
        "mkfs.erofs {args:?}, cache blocks {bs:?}:\n{}",
        diffs.join("\n")
    );
}

#[test]
fn uncompressed_default() {
    check(&["--preserve-mtime"], false);
}

#[test]
fn uncompressed_no_inline() {
    check(&["--preserve-mtime", "-Enoinline_data"], false);
}

#[test]
fn lz4_compact() {
    check(&["--preserve-mtime", "-zlz4"], false);
}

#[test]
fn lz4_legacy_full_indexes() {
    check(&["--preserve-mtime", "-zlz4", "-Elegacy-compress"], false);
}

#[test]
fn lz4hc_big_pclusters() {
    check(&["--preserve-mtime", "-zlz4hc", "-C65536"], false);
}

#[test]
fn lz4hc_big_pclusters_full_indexes() {
    check(
        &[
            "--preserve-mtime",
            "-zlz4hc",
            "-C16384",
            "-Elegacy-compress",
        ],
        false,
    );
}

#[test]
fn lz4hc_ztailpacking() {
    check(&["--preserve-mtime", "-zlz4hc", "-Eztailpacking"], false);
}

#[test]
fn lz4_big_ztailpacking() {
    check(
        &["--preserve-mtime", "-zlz4", "-C32768", "-Eztailpacking"],
        false,
    );
}

#[test]
fn chunked_block_map() {
    check(&["--preserve-mtime", "--chunksize=65536"], false);
}

#[test]
fn chunked_4k() {
    check(&["--preserve-mtime", "--chunksize=4096"], false);
}

#[test]
fn chunked_blobdev() {
    check(&["--preserve-mtime", "--chunksize=65536"], true);
}
