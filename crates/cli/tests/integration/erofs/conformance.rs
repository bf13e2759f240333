//! EROFS conformance: images built by mkfs.erofs from a tree of more than
//! 10,000 entries (xattrs including POSIX ACLs, hard links, devices, fifos,
//! sockets, long names, owners other than root, nanosecond mtimes) are
//! mounted by the kernel's own EROFS driver, file-backed (mount(2) on the
//! image file, no loop device), and compared field by field with the
//! foliofs library walked directly and with foliofs FUSE mounts (buffered
//! and O_DIRECT). fsck.erofs and `foliofs fsck` must agree.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::Erofs;
use foliofs_vfs::{FileSystem, FileType, Scratch};
use rand::seq::SliceRandom;
use rand::Rng;
use sha2::{Digest, Sha256};

/// Everything compared for one path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    /// `st_ino`: the EROFS nid, as the kernel reports it.
    ino: u64,
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    nlink: u64,
    rdev: (u32, u32),
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    sha256: Option<String>,
}

type Tree = BTreeMap<PathBuf, Node>;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a live buffer for the call.
    let rc = unsafe {
        libc::lsetxattr(
            cstr(path).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr {name} on {}", path.display());
}

fn set_mtime(path: &Path, sec: i64, nsec: i64) {
    let ts = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cstr(path).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

/// The source tree: deterministic, built once into Cargo's scratch
/// directory for integration tests and reused while its marker says it is
/// complete.
fn source_tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let root = base.join("erofs-conformance-tree");
        let done = base.join("erofs-conformance-tree.v3.done");
        if !done.exists() {
            let _ = fs::remove_dir_all(&root);
            build_tree(&root);
            fs::write(&done, b"").unwrap();
        }
        root
    })
}

/// More than 10,000 entries of every kind EROFS stores.
fn build_tree(root: &Path) {
    let mut rng = common::rng(0xE70F5);
    fs::create_dir_all(root).unwrap();
    let mut count = 0usize;
    let mut dirs = Vec::new();
    for d in 0..40 {
        let dir = root.join(format!("d{d:02}")).join(format!("sub{}", d % 3));
        fs::create_dir_all(&dir).unwrap();
        dirs.push(dir.parent().unwrap().to_owned());
        dirs.push(dir);
        count += 2;
    }
    let mut last_files: Vec<PathBuf> = Vec::new();
    let mut i = 0u64;
    while count < 10_400 {
        let dir = &dirs[(i as usize * 7) % dirs.len()];
        let roll = rng.gen_range(0..100);
        let name = if i % 97 == 5 {
            // Long names: 254 bytes, the most mkfs.erofs 1.5 accepts (it
            // fails on 255-byte names, EROFS's own limit).
            let base = format!("long-{i}-");
            base.clone() + &"n".repeat(254 - base.len())
        } else {
            format!("e{i}")
        };
        let p = dir.join(&name);
        match roll {
            0..=59 => {
                let size = match rng.gen_range(0..20) {
                    0 => 0,
                    1..=12 => rng.gen_range(0..3000),
                    13..=17 => rng.gen_range(0..20_000),
                    18 => 4096 * (1 + rng.gen_range(0..4)),
                    _ => 60_000 + rng.gen_range(0..400_000),
                } as usize;
                let content = if rng.gen_range(0..2) == 0 {
                    common::random_bytes(&mut rng, size)
                } else {
                    let word = format!("word{} ", rng.gen_range(0..50));
                    word.as_bytes().iter().cycle().take(size).copied().collect()
                };
                fs::write(&p, content).unwrap();
                let perm =
                    [0o644, 0o600, 0o755, 0o4755, 0o2711, 0o444][rng.gen_range(0..6) as usize];
                fs::set_permissions(&p, fs::Permissions::from_mode(perm)).unwrap();
                last_files.push(p.clone());
            }
            60..=67 => {
                if let Some(t) = last_files.choose(&mut rng) {
                    fs::hard_link(t, &p).unwrap();
                } else {
                    fs::write(&p, b"x").unwrap();
                }
            }
            68..=79 => {
                let cap = if rng.gen_range(0..10) == 0 { 3000 } else { 60 };
                let len = 1 + rng.gen_range(0..cap) as usize;
                let target: String = (0..len).map(|k| (b'a' + (k % 26) as u8) as char).collect();
                std::os::unix::fs::symlink(target, &p).unwrap();
            }
            80..=83 => common::mknod(
                &p,
                libc::S_IFCHR | 0o620,
                rng.gen_range(0..300) as u32,
                rng.gen_range(0..70_000) as u32,
            )
            .unwrap(),
            84..=86 => {
                common::mknod(&p, libc::S_IFBLK | 0o660, 8, rng.gen_range(0..256) as u32).unwrap()
            }
            87..=90 => common::mknod(&p, libc::S_IFIFO | 0o644, 0, 0).unwrap(),
            // mknod makes sockets whatever the path length (bind has a limit).
            91 => common::mknod(&p, libc::S_IFSOCK | 0o755, 0, 0).unwrap(),
            _ => {
                fs::create_dir(&p).unwrap();
                fs::set_permissions(
                    &p,
                    fs::Permissions::from_mode(0o1777 & !(rng.gen_range(0..2) as u32 * 0o1000)),
                )
                .unwrap();
            }
        }
        // Owners other than root, some beyond 16 bits (extended inodes).
        if rng.gen_range(0..3) > 0 {
            let uid = [1000, 65534, 123_456, 1][rng.gen_range(0..4) as usize];
            let gid = [100, 50_000, 200_000][rng.gen_range(0..3) as usize];
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
        }
        // user.* attributes exist only on regular files and directories.
        let md = fs::symlink_metadata(&p).unwrap();
        let user_ok = md.is_file() || md.is_dir();
        if rng.gen_range(0..8) == 0 && user_ok {
            set_xattr(&p, &format!("user.k{}", rng.gen_range(0..5)), &{
                let n = rng.gen_range(0..100) as usize;
                common::random_bytes(&mut rng, n)
            });
        }
        if rng.gen_range(0..10) == 0 && !name.starts_with("long") {
            // Used by many inodes: mkfs puts it in the shared area.
            if user_ok {
                set_xattr(&p, "user.shared", b"one value for many inodes");
            }
            set_xattr(&p, "trusted.overlay.opaque", b"y");
        }
        if rng.gen_range(0..40) == 0 {
            let n = 1 + rng.gen_range(0..200) as usize;
            set_xattr(&p, "security.test", &common::random_bytes(&mut rng, n));
        }
        // POSIX ACLs (name indexes 2 and 3): user 1000 gets rw.
        if user_ok && rng.gen_range(0..30) == 0 {
            let name = if md.is_dir() && rng.gen_range(0..2) == 0 {
                "system.posix_acl_default"
            } else {
                "system.posix_acl_access"
            };
            set_xattr(&p, name, &acl(1000));
        }
        count += 1;
        i += 1;
    }
    // mtimes last (creating entries touches directory mtimes), with nanoseconds.
    let mut all = Vec::new();
    collect(root, &mut all);
    for (k, p) in all.iter().enumerate() {
        set_mtime(
            p,
            1_600_000_000 + (k as i64 * 7919) % 100_000_000,
            (k as i64 * 104_729) % 1_000_000_000,
        );
    }
    assert!(all.len() >= 10_000, "tree has only {} entries", all.len());
}

/// A POSIX ACL xattr value (version 2) giving `uid` read-write access.
fn acl(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 6, uid),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            collect(&e.unwrap().path(), out);
        }
    }
    out.push(p.to_owned());
}

fn host_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let p = cstr(path);
    let mut names = vec![0u8; 1 << 16];
    // SAFETY: valid path and a buffer of the stated size.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 1 << 16];
        // SAFETY: as above.
        let m = unsafe { libc::lgetxattr(p.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(
            m >= 0,
            "getxattr {} {:?}: {}",
            path.display(),
            String::from_utf8_lossy(name),
            std::io::Error::last_os_error()
        );
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

/// Walks a mounted directory through the system calls a user would make.
fn walk_mounted(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
        let ft = md.file_type();
        let kind = foliofs_vfs::FileType::from_std(ft)
            .map_or("unknown", foliofs_vfs::FileType::short_name);
        let mut sha256 = None;
        if ft.is_file() {
            let mut h = Sha256::new();
            let mut f = fs::File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f
                    .read(&mut buf)
                    .unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            sha256 = Some(format!("{:x}", h.finalize()));
        }
        let target = ft
            .is_symlink()
            .then(|| fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec());
        out.insert(
            rel.clone(),
            Node {
                ino: md.ino(),
                kind,
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                size: md.size(),
                mtime: (md.mtime(), md.mtime_nsec()),
                nlink: md.nlink(),
                rdev: (libc::major(md.rdev()), libc::minor(md.rdev())),
                target,
                xattrs: host_xattrs(&p),
                sha256,
            },
        );
        if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    out
}

/// Walks the library directly, through the `FileSystem` trait.
fn walk_library(fs: &Erofs) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(PathBuf::new(), fs.root())];
    let mut scratch = Scratch::new();
    while let Some((rel, ino)) = stack.pop() {
        let a = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("getattr {}: {e}", rel.display()));
        let mut sha256 = None;
        let mut target = None;
        match a.kind {
            FileType::RegularFile => {
                let mut h = Sha256::new();
                let mut off = 0u64;
                loop {
                    let got = fs
                        .read(ino, off, 1 << 17, &mut scratch)
                        .unwrap_or_else(|e| panic!("read {}: {e}", rel.display()));
                    if got.is_empty() {
                        break;
                    }
                    h.update(got);
                    off += got.len() as u64;
                }
                assert_eq!(off, a.size, "{}: read length", rel.display());
                sha256 = Some(format!("{:x}", h.finalize()));
            }
            FileType::Symlink => target = Some(fs.readlink(ino).unwrap()),
            FileType::Directory => {
                let mut children = Vec::new();
                fs.readdir(ino, 0, &mut |e| {
                    children.push((e.name.to_owned(), e.ino, e.kind));
                    false
                })
                .unwrap();
                for (name, child, kind) in children {
                    let looked = fs.lookup(ino, &name).unwrap();
                    assert_eq!((looked.ino, looked.kind), (child, kind), "lookup {name:?}");
                    stack.push((rel.join(name), child));
                }
            }
            _ => {}
        }
        let mut xattrs = BTreeMap::new();
        for n in fs.listxattr(ino).unwrap() {
            let v = fs.getxattr(ino, OsStr::from_bytes(&n)).unwrap();
            xattrs.insert(n, v);
        }
        out.insert(
            rel,
            Node {
                ino: a.ino,
                kind: a.kind.short_name(),
                mode: a.mode(),
                uid: a.uid,
                gid: a.gid,
                size: a.size,
                mtime: (a.mtime.sec, i64::from(a.mtime.nsec)),
                nlink: u64::from(a.nlink),
                rdev: (a.rdev.major, a.rdev.minor),
                target,
                xattrs,
                sha256,
            },
        );
    }
    out
}

fn assert_same(what: &str, want: &Tree, got: &Tree) {
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing: {}", p.display())),
            Some(g) if g != w => {
                diffs.push(format!("{}:\n  kernel {w:?}\n  {what} {g:?}", p.display()))
            }
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("unexpected: {}", p.display()));
    }
    let n = diffs.len();
    diffs.truncate(20);
    assert!(
        n == 0,
        "{what} differs from the kernel in {n} place(s):\n{}",
        diffs.join("\n")
    );
}

/// A kernel EROFS mount of an image file (file-backed, no loop device),
/// detached when dropped.
struct KernelMount {
    dir: tempfile::TempDir,
}

impl KernelMount {
    fn new(image: &Path, data: &str) -> KernelMount {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-kerofs.")
            .tempdir()
            .unwrap();
        let data = CString::new(data).unwrap();
        let fstype = CString::new("erofs").unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string for the call.
        let rc = unsafe {
            libc::mount(
                cstr(image).as_ptr(),
                cstr(dir.path()).as_ptr(),
                fstype.as_ptr(),
                libc::MS_RDONLY,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "kernel file-backed mount of {}: {}",
            image.display(),
            std::io::Error::last_os_error()
        );
        KernelMount { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(cstr(self.dir.path()).as_ptr(), libc::MNT_DETACH) };
    }
}

/// Builds the image with `args` (and a blob device when asked), then checks
/// kernel == library == FUSE mount, and the two fsck verdicts.
fn conformance(args: &[&str], blob: bool) {
    let src = source_tree();
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-img.")
        .tempdir()
        .unwrap();
    let img = tmp.path().join("image.erofs");
    let blob_path = tmp.path().join("blob");
    let mut mkfs_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if blob {
        mkfs_args.push(format!("--blobdev={}", blob_path.display()));
    }
    common::mkfs_erofs(&mkfs_args, &img, src);

    let data = if blob {
        format!("device={}", blob_path.display())
    } else {
        String::new()
    };
    let kernel = {
        let km = KernelMount::new(&img, &data);
        walk_mounted(km.path())
    };
    assert!(kernel.len() > 10_000, "only {} entries", kernel.len());

    let devices = if blob {
        vec![blob_path.clone()]
    } else {
        vec![]
    };
    let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
    assert_same("library", &kernel, &walk_library(&fs));

    // fsck.erofs and foliofs fsck agree on a good image.
    let mut fsck = Command::new("fsck.erofs");
    if blob {
        fsck.arg(format!("--device={}", blob_path.display()));
    }
    let theirs = common::run_timeout(fsck.arg("--extract").arg(&img), Duration::from_secs(600));
    assert!(
        theirs.status.success(),
        "fsck.erofs: {}",
        String::from_utf8_lossy(&theirs.stderr)
    );
    let report = fs.fsck();
    assert!(report.is_clean(), "library fsck: {:?}", report.errors);
    let mut ours = vec!["fsck".to_owned(), img.display().to_string()];
    if blob {
        ours.extend(["-o".into(), data.clone()]);
    }
    let o = common::run_timeout(
        Command::new(common::bin()).args(&ours),
        Duration::from_secs(600),
    );
    assert!(
        o.status.success(),
        "foliofs fsck: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    if have!("fuse") {
        // Buffered (the default) and O_DIRECT reads of the image must agree.
        for io in ["", "directio"] {
            let opts = [data.as_str(), io]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(",");
            let m = common::Mount::new(&img, None, &opts)
                .unwrap_or_else(|e| panic!("foliofs mount -o {opts}: {e}"));
            let fuse = walk_mounted(m.path());
            m.unmount().unwrap();
            assert_same(&format!("foliofs mount -o {opts:?}"), &kernel, &fuse);
        }
    }
}

#[test]
fn defaults() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&[], false);
}

#[test]
fn fixed_timestamp() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-T0"], false);
}

#[test]
fn lz4() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4"], false);
}

#[test]
fn lz4hc_big_pclusters() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4hc", "-C65536"], false);
}

#[test]
fn lz4hc_ztailpacking() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4hc", "-Eztailpacking"], false);
}

#[test]
fn chunked() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["--chunksize=65536"], false);
}

#[test]
fn chunked_blobdev() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["--chunksize=65536"], true);
}

/// Long xattr name prefixes (which mkfs.erofs 1.5 cannot write): an image is
/// patched to move one attribute's name onto a long prefix, and the kernel,
/// the library and a foliofs mount must all show the same new name.
#[test]
fn long_xattr_prefixes() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-lp.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), b"data of a").unwrap();
    fs::write(src.join("b"), b"data of b").unwrap();
    set_xattr(&src.join("a"), "user.foo", b"bar");
    set_xattr(&src.join("b"), "user.keep", b"1");
    set_xattr(&src.join("d"), "trusted.t", b"2");
    let img = tmp.path().join("image.erofs");
    common::mkfs_erofs(&["-T0"], &img, &src);

    let mut bytes = fs::read(&img).unwrap();
    let entry_index_at = {
        let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let nid = e.lookup(e.root(), OsStr::new("a")).unwrap().ino;
        let inode = e.inode(nid).unwrap();
        let body = (inode.pos + inode.inode_size()) as usize;
        assert_eq!(bytes[body + 4], 0, "user.foo should be inline, not shared");
        let entry = body + 12;
        assert_eq!(&bytes[entry..entry + 2], &[3, 1], "inline entry user.foo");
        entry + 1
    };
    // Prefix 0 = "user." + "long.prefix.", in unused space of block 0.
    let table = 2048usize;
    assert!(bytes[table..table + 64].iter().all(|&b| b == 0));
    let infix = b"long.prefix.";
    bytes[table..table + 2].copy_from_slice(&(1 + infix.len() as u16).to_le_bytes());
    bytes[table + 2] = 1;
    bytes[table + 3..table + 3 + infix.len()].copy_from_slice(infix);
    bytes[entry_index_at] = 0x80;
    let sb = 1024;
    let incompat = u32::from_le_bytes(bytes[sb + 0x50..sb + 0x54].try_into().unwrap()) | 0x40;
    bytes[sb + 0x50..sb + 0x54].copy_from_slice(&incompat.to_le_bytes());
    bytes[sb + 0x5B] = 1;
    bytes[sb + 0x5C..sb + 0x60].copy_from_slice(&((table / 4) as u32).to_le_bytes());
    // The superblock changed: drop its checksum rather than recompute it.
    bytes[sb + 0x08] &= !1;
    fs::write(&img, &bytes).unwrap();

    let kernel = {
        let km = KernelMount::new(&img, "");
        walk_mounted(km.path())
    };
    let a = &kernel[Path::new("a")];
    assert_eq!(
        a.xattrs.keys().collect::<Vec<_>>(),
        [&b"user.long.prefix.foo".to_vec()],
        "the kernel does not see the long prefix: the patch is wrong"
    );
    let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    assert_same("library", &kernel, &walk_library(&e));
    if have!("fuse") {
        let m = common::Mount::new(&img, None, "").unwrap();
        let fuse = walk_mounted(m.path());
        m.unmount().unwrap();
        assert_same("foliofs mount", &kernel, &fuse);
    }
}

/// Chunk holes (which mkfs.erofs 1.5 never writes: it shares one zero
/// block instead): block map entries patched to the null address must read
/// as zeros, as the kernel reads them.
#[test]
fn chunk_holes_read_as_zeros() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-holes.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = common::rng(4);
    fs::write(
        src.join("f"),
        common::random_bytes(&mut rng, 20 * 4096 + 123),
    )
    .unwrap();
    let img = tmp.path().join("image.erofs");
    common::mkfs_erofs(&["-T0", "--chunksize=4096"], &img, &src);
    let mut bytes = fs::read(&img).unwrap();
    let (table, len) = {
        let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let nid = e.lookup(e.root(), OsStr::new("f")).unwrap().ino;
        e.index_range(&e.inode(nid).unwrap()).unwrap().unwrap()
    };
    assert_eq!(len, 21 * 4, "a 4-byte block map entry per chunk");
    // Chunks 3..=6 (adjacent holes) and the last, partial one.
    for chunk in [3u64, 4, 5, 6, 20] {
        let at = (table + 4 * chunk) as usize;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    }
    // The table may share block 0 with the superblock, whose checksum
    // covers it: drop the checksum rather than recompute it.
    bytes[1024 + 0x08] &= !1;
    fs::write(&img, &bytes).unwrap();

    let kernel_seeks;
    let kernel = {
        let km = KernelMount::new(&img, "");
        kernel_seeks = seeks(&km.path().join("f"));
        // The kernel reports the holes (else this comparison proves nothing).
        assert!(kernel_seeks.contains(&(libc::SEEK_HOLE, 0, Ok(3 * 4096))));
        assert!(kernel_seeks.contains(&(libc::SEEK_DATA, 13_000, Ok(7 * 4096))));
        let content = fs::read(km.path().join("f")).unwrap();
        assert!(content[3 * 4096..7 * 4096].iter().all(|&b| b == 0));
        assert!(content[20 * 4096..].iter().all(|&b| b == 0));
        assert!(content[..4096].iter().any(|&b| b != 0));
        walk_mounted(km.path())
    };
    let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    assert_same("library", &kernel, &walk_library(&e));
    if have!("fuse") {
        let m = common::Mount::new(&img, None, "").unwrap();
        let fuse = walk_mounted(m.path());
        let fuse_seeks = seeks(&m.path().join("f"));
        m.unmount().unwrap();
        assert_same("foliofs mount", &kernel, &fuse);
        assert_eq!(fuse_seeks, kernel_seeks, "SEEK_DATA/SEEK_HOLE answers");
    }
}

/// `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)` from every 1000th offset:
/// the offset found, or the errno.
type Seek = (i32, i64, Result<i64, i32>);

fn seeks(path: &Path) -> Vec<Seek> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
        for off in (0..size + 2000).step_by(1000) {
            // SAFETY: a valid open descriptor; lseek touches no memory.
            let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
            let r = if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap())
            } else {
                Ok(r)
            };
            out.push((whence, off, r));
        }
    }
    out
}
