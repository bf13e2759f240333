//! The source tree every writer archives, on a tmpfs of the test's own
//! (which keeps `trusted.*` and `security.*` xattrs and POSIX ACLs, and
//! holes), and the scratch room the writers' extractions go to.

use std::fs;
use std::os::unix::fs::{lchown, symlink, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::super::super::walk::{cstr, set_mtime, set_xattr};
use crate::common;

/// A tmpfs mounted on a new temporary directory, detached when dropped
/// (also when the test panics).
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new() -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-writers.")
            .tempdir()
            .unwrap();
        let src = std::ffi::CString::new("foliofs-writers").unwrap();
        let fstype = std::ffi::CString::new("tmpfs").unwrap();
        // Room for the tree and one extraction of it at a time (the holes
        // take none).
        let data = std::ffi::CString::new("size=2g,mode=0755").unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string for the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                cstr(dir.path()).as_ptr(),
                fstype.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount tmpfs on {}: {}",
            dir.path().display(),
            std::io::Error::last_os_error()
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(cstr(self.dir.path()).as_ptr(), libc::MNT_DETACH) };
    }
}

/// `security.capability` as `setcap cap_net_raw+ep` writes it: revision
/// 2, effective, CAP_NET_RAW (13) permitted, nothing inheritable.
pub const CAP_NET_RAW_EP: [u8; 20] = [
    0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

const MIB: u64 = 1 << 20;

/// A file of `size` bytes, holes but for `runs` (offset, length) of
/// seeded random bytes.
fn sparse_file(path: &Path, size: u64, runs: &[(u64, usize)], seed: u64) {
    let f = fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut rng = common::rng(seed);
    for &(at, len) in runs {
        f.write_all_at(&common::random_bytes(&mut rng, len), at)
            .unwrap();
    }
}

fn mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn setfacl(args: &[&str], path: &Path) {
    let out = common::run_timeout(
        Command::new("setfacl").args(args).arg(path),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "setfacl {args:?} {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the writers are given: every entry type tar stores, the xattrs
/// and ACLs image layers carry (binary values with newlines and NULs, a
/// capability), names and paths past every header field's length,
/// owners and times past every octal field's range, every mode bit, and
/// sparse files. Each thing a format may not hold is a leaf of its own,
/// so a writer that skips it skips nothing else.
pub fn source_tree(dir: &Path) {
    let mut rng = common::rng(7);
    fs::create_dir(dir).unwrap();
    let d = |p: &str| -> PathBuf {
        let p = dir.join(p);
        fs::create_dir_all(&p).unwrap();
        p
    };

    let files = d("files");
    fs::write(files.join("empty"), b"").unwrap();
    fs::write(files.join("small"), b"small\n").unwrap();
    fs::write(
        files.join("random"),
        common::random_bytes(&mut rng, 100_003),
    )
    .unwrap();
    fs::write(files.join("exec"), b"#!/bin/sh\n").unwrap();
    mode(&files.join("exec"), 0o755);

    let x = d("xattrs");
    let bin = x.join("binary");
    fs::write(&bin, b"xattrs\n").unwrap();
    set_xattr(&bin, "user.newlines", b"line one\nline two\n");
    set_xattr(&bin, "user.nul-and-newline", b"\x00\n\x00=\n\xff");
    let big: Vec<u8> = (0..3000u32)
        .map(|i| {
            if i % 61 == 60 {
                b'\n'
            } else {
                b'a' + (i % 26) as u8
            }
        })
        .collect();
    set_xattr(&bin, "user.big", &big);
    set_xattr(&bin, "user.empty", b"");
    set_xattr(&bin, "trusted.binary", b"\x00\x01\n\xfe\xff");
    let cap = x.join("capability");
    fs::write(&cap, b"ping\n").unwrap();
    mode(&cap, 0o755);
    set_xattr(&cap, "security.capability", &CAP_NET_RAW_EP);
    set_xattr(&d("xattrs/on-a-dir"), "user.dir", b"dir\nvalue");

    let acl = d("acl");
    fs::write(acl.join("file"), b"acl\n").unwrap();
    setfacl(&["-m", "u:1234:r--,g:5678:rw-"], &acl.join("file"));
    let with_default = d("acl/dir");
    setfacl(&["-m", "u:1234:rwx,g:5678:r-x"], &with_default);
    setfacl(&["-d", "-m", "u:1234:rwx,g:5678:r-x"], &with_default);

    // A 220-byte component; a path of 187 bytes (over ustar's 100-byte
    // name, splittable into its prefix) and one of 277 (over both).
    let names = d("names");
    fs::write(names.join("N".repeat(220)), b"long name\n").unwrap();
    let long = d(&format!("names/{}/{}", "a".repeat(90), "b".repeat(90)));
    fs::write(
        names.join("a".repeat(90)).join("over-100-bytes"),
        b"past 100\n",
    )
    .unwrap();
    fs::write(long.join("c".repeat(80)), b"past 255\n").unwrap();

    let links = d("links");
    symlink("../files/small", links.join("relative")).unwrap();
    symlink("t/".repeat(60), links.join("long-target")).unwrap();
    let hard = d("hard");
    fs::write(hard.join("one"), b"three names\n").unwrap();
    set_xattr(&hard.join("one"), "user.linked", b"on all three");
    fs::hard_link(hard.join("one"), hard.join("two")).unwrap();
    fs::hard_link(hard.join("one"), hard.join("three")).unwrap();

    let dev = d("dev");
    common::mknod(&dev.join("null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
    common::mknod(&dev.join("sda1"), libc::S_IFBLK | 0o660, 8, 1).unwrap();
    common::mknod(&dev.join("nvme"), libc::S_IFBLK | 0o640, 259, 65_537).unwrap();
    common::mknod(&dev.join("fifo"), libc::S_IFIFO | 0o600, 0, 0).unwrap();

    let sparse = d("sparse");
    sparse_file(
        &sparse.join("runs"),
        64 * MIB,
        &[
            (0, 4096),
            (MIB, 8192),
            (10 * MIB + 4096, 4096),
            (33 * MIB, 3 * 4096),
            (63 * MIB, 4096),
        ],
        1,
    );
    sparse_file(
        &sparse.join("data-at-the-end"),
        8 * MIB,
        &[(4 * MIB, 4096), (8 * MIB - 1, 1)],
        2,
    );
    sparse_file(&sparse.join("all-hole"), 2 * MIB, &[], 3);

    let owners = d("owners");
    for (name, uid, gid) in [
        ("root", 0, 0),
        ("nobody", 65_534, 65_534),
        ("u70000", 70_000, 70_001),
        // One past the 7 octal digits of ustar's id fields.
        ("u2097152", 2_097_152, 2_097_152),
        ("u4294967294", 4_294_967_294, 4_294_967_294),
    ] {
        let p = owners.join(name);
        fs::write(&p, name).unwrap();
        lchown(&p, Some(uid), Some(gid)).unwrap();
    }
    symlink("root", owners.join("link")).unwrap();
    lchown(owners.join("link"), Some(70_000), Some(5678)).unwrap();
    let owned_dir = d("owners/dir");
    lchown(&owned_dir, Some(1234), Some(5678)).unwrap();

    let modes = d("modes");
    for (name, m) in [
        ("setuid", 0o4755),
        ("setgid", 0o2750),
        ("all-bits", 0o7777),
        ("none", 0o000),
    ] {
        fs::write(modes.join(name), name).unwrap();
        mode(&modes.join(name), m);
    }
    mode(&d("modes/sticky"), 0o1777);
    mode(&d("modes/private"), 0o700);

    let times = d("times");
    for (name, sec, nsec) in [
        ("before-1970", -86_400 * 365, 0),
        ("before-1970-nanos", -1_000_000, 250_000_000),
        ("after-2038", 4_102_444_800, 0),
        ("nanos", 1_600_000_000, 123_456_789),
    ] {
        fs::write(times.join(name), name).unwrap();
        set_mtime(&times.join(name), sec, nsec);
    }
    set_mtime(&links.join("relative"), 1_000_000_000, 5);

    // Directories last, deepest first: filling one moves its mtime.
    let mut dirs = Vec::new();
    collect_dirs(dir, &mut dirs);
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in dirs.iter().enumerate() {
        set_mtime(p, 1_500_000_000 + i as i64 * 1000, i as i64 * 1_000_001);
    }
    set_mtime(&times, 4_102_444_800, 7);
    mode(dir, 0o750);
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            collect_dirs(&e.path(), out);
        }
    }
}

/// The one file past 4 GiB, in a tree of its own that only a sparse
/// writer's case adds (`./huge/...`): a writer that stores holes as
/// zeros would write all of it.
pub fn huge_tree(dir: &Path) {
    let huge = dir.join("huge");
    fs::create_dir_all(&huge).unwrap();
    let p = huge.join("past-4-gib");
    sparse_file(&p, (4 << 30) + 8192, &[(MIB, 4096), (4 << 30, 8192)], 4);
    set_mtime(&p, 1_700_000_000, 1);
    set_mtime(&huge, 1_700_000_000, 2);
}
