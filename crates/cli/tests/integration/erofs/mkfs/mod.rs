//! `foliofs mkfs erofs`: every image is mounted by the kernel's EROFS and
//! walked equal to its source, read equal by the library, and checked
//! clean by fsck.erofs 1.9.3 (where built) and `foliofs fsck`; a tree and
//! its tar give the same bytes; a tar through mkfs.erofs 1.9.3 and
//! through foliofs walks the same under the kernel; tars from every
//! common writer walk as their writers extract them; bad tars fail in one
//! line and leave nothing; the user `tests` builds and mounts images;
//! containerd's command lines work as they work with mkfs.erofs.

mod compressed;
mod containerd;
mod hostile;
mod index;
pub(crate) mod merge;
mod trees;
mod user;
mod writers;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::Erofs;

use super::walk::{assert_same, walk_library, walk_mounted, KernelMount, Tree};
use crate::common;

/// `foliofs mkfs erofs ARGS`, bounded.
pub fn mkfs<S: AsRef<OsStr>>(args: &[S]) -> Output {
    common::run_timeout(
        Command::new(common::bin())
            .args(["mkfs", "erofs", "-q"])
            .args(args)
            .stdin(Stdio::null()),
        Duration::from_secs(600),
    )
}

/// Builds `img` from `src` with `ARGS`, panicking with the error if it
/// fails.
pub fn build<S: AsRef<OsStr>>(args: &[S], src: &Path, img: &Path) {
    let mut all: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    all.push(src.as_os_str());
    all.push(img.as_os_str());
    let out = mkfs(&all);
    assert!(
        out.status.success(),
        "foliofs mkfs erofs {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A walk with what differs between a source tree and any image of it
/// taken out: inode numbers, directory sizes (each format's own), and,
/// under `-T`, the mtimes.
pub fn comparable(mut t: Tree, time: Option<i64>) -> Tree {
    for n in t.values_mut() {
        n.ino = 0;
        if n.kind == "dir" {
            n.size = 0;
        }
        if let Some(t) = time {
            n.mtime = (t, 0);
        }
    }
    t
}

/// The kernel's walk of `img` (as mounted, inode numbers included), after
/// checking that foliofs's library reads the same and that fsck.erofs
/// 1.9.3 (where built) and `foliofs fsck` find it clean.
pub fn kernel_walk(img: &Path) -> Tree {
    kernel_walk_with(img, None)
}

/// As [`kernel_walk`], with `device` as the image's extra device.
pub fn kernel_walk_with(img: &Path, device: Option<&Path>) -> Tree {
    let devices: Vec<&Path> = device.into_iter().collect();
    kernel_walk_devices(img, &devices)
}

/// As [`kernel_walk`], with `devices` as the image's extra devices, in
/// order.
pub fn kernel_walk_devices(img: &Path, devices: &[&Path]) -> Tree {
    let list: Vec<String> = devices
        .iter()
        .map(|d| format!("device={}", d.display()))
        .collect();
    let kernel = {
        let m = KernelMount::new(img, &list.join(","));
        walk_mounted(m.path())
    };
    let owned: Vec<PathBuf> = devices.iter().map(|d| d.to_path_buf()).collect();
    let fs = Erofs::open(img, &OpenOptions::default(), &owned).unwrap();
    assert_same("foliofs's library", &kernel, &walk_library(&fs));
    let mut args = vec![OsStr::new("fsck").to_owned()];
    if !list.is_empty() {
        args.push("-o".into());
        args.push(list.join(",").into());
    }
    args.push(img.as_os_str().to_owned());
    let out = common::foliofs(&args);
    assert!(
        out.status.success(),
        "foliofs fsck {}: {}{}",
        img.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(bin) = erofs_utils() {
        let mut fsck = Command::new(bin.join("fsck.erofs"));
        for d in devices {
            fsck.arg(format!("--device={}", d.display()));
        }
        let out = common::run_timeout(fsck.arg(img), Duration::from_secs(600));
        assert!(
            out.status.success(),
            "fsck.erofs 1.9.3 {}: {}",
            img.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    kernel
}

/// Builds `src` into an image with `args`, and checks it four ways
/// against the source's own walk.
pub fn check_tree(src: &Path, img: &Path, args: &[&str], time: Option<i64>) {
    build(args, src, img);
    let want = comparable(walk_mounted(src), time);
    let got = comparable(kernel_walk(img), None);
    assert_same(
        &format!("the kernel's walk of mkfs erofs {args:?}"),
        &want,
        &got,
    );
}

/// erofs-utils 1.9.3's bin directory, if it is built (quietly: callers
/// that need it say so themselves).
pub fn erofs_utils() -> Option<PathBuf> {
    super::erofs_utils_193("mkfs erofs checks")
}

/// `tar --sort=name --format=pax` of `src`'s contents with xattrs, as a
/// tree's canonical tar.
pub fn tar_of(src: &Path, tar: &Path) {
    let out = common::run_timeout(
        Command::new("tar")
            .args([
                "--sort=name",
                "--format=pax",
                "--xattrs",
                "--xattrs-include=*",
            ])
            .arg("-C")
            .arg(src)
            .arg("-cf")
            .arg(tar)
            .arg("."),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "tar of {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `src` (a tar) with mkfs.erofs 1.9.3 from `bin` and with foliofs,
/// both given `args` (spelt alike), into `theirs.img` and `ours.img` in
/// `dir`; asserts that the two walk equal under the kernel (with `device`
/// as their extra device) and that foliofs's image is clean four ways
/// ([`kernel_walk_with`]). Returns foliofs's walk, its image's size and
/// mkfs.erofs's.
pub fn through_both(
    bin: &Path,
    args: &[&str],
    src: &Path,
    dir: &Path,
    device: Option<&Path>,
) -> (Tree, u64, u64) {
    let theirs = dir.join("theirs.img");
    super::run_mkfs_erofs(&bin.join("mkfs.erofs"), args, &theirs, src);
    let ours = dir.join("ours.img");
    build(args, src, &ours);
    let data = device.map_or(String::new(), |d| format!("device={}", d.display()));
    let want = comparable(walk_mounted(KernelMount::new(&theirs, &data).path()), None);
    let got = comparable(kernel_walk_with(&ours, device), None);
    assert_same(
        &format!(
            "{} {args:?}: foliofs (mkfs.erofs is 'kernel')",
            src.display()
        ),
        &want,
        &got,
    );
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    (got, size(&ours), size(&theirs))
}

/// Asserts that foliofs's image is within 1% of mkfs.erofs's size.
pub fn within_1_percent(what: &str, ours: u64, theirs: u64) {
    assert!(
        (ours as f64 / theirs as f64 - 1.0).abs() <= 0.01,
        "{what}: foliofs's image is {ours} bytes, mkfs.erofs's {theirs}: more than 1% apart"
    );
}

/// Asserts that `foliofs mkfs erofs ARGS IMG` fails with one line that
/// says `expect`, and leaves no image.
pub fn refused<S: AsRef<OsStr> + std::fmt::Debug>(args: &[S], img: &Path, expect: &str) {
    let mut all: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    all.push(img.as_os_str());
    let out = mkfs(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(
        err.contains(expect),
        "{args:?}: expected {expect:?} in {err}"
    );
    assert!(!img.exists(), "{args:?} left an image");
}

/// Every entry type but sockets (tar stores none) under `dir`, owned by
/// the user [`common::TEST_USER`].
pub fn users_tree(dir: &Path) {
    common::every_type_tree(dir);
    std::fs::remove_file(dir.join("dev/socket")).unwrap();
    let st = Command::new("chown")
        .args(["-R", "-h", common::TEST_USER])
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success());
}

/// `tar` compressed with `tool` (`gzip` or `zstd`) beside it, as
/// `NAME.tar.TOOL`.
pub fn compressed(tar: &Path, tool: &str) -> PathBuf {
    let out = tar.with_extension(format!("tar.{tool}"));
    let r = common::run_timeout(
        Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" -c < "$1" > "$2""#)
            .arg(tool)
            .arg(tar)
            .arg(&out),
        Duration::from_secs(300),
    );
    assert!(
        r.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    out
}
