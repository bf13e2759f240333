//! `mkfs erofs --merge`: layer images stacked into one image whose files
//! point into them. The layers are GNU tar's tars of trees that change
//! from layer to layer as image tools record changes (whiteouts as
//! `.wh.` files, an opaque directory as `.wh..wh..opq`), built by foliofs
//! with `--aufs` in three forms (tails inline, no inline data, LZ4HC).
//! The merged image, mounted by the kernel with one `device=` per layer,
//! must walk equal to the kernel's overlayfs over the kernel's mounts of
//! the layers (stacked as containerd stacks them), but for what overlayfs
//! reports of its own (a merged directory's size and link count, a lower
//! file's link count); foliofs's mount of it, as root and as a user, must
//! walk equal to the kernel's on every field.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::super::walk::{assert_same, cstr, set_xattr, walk_mounted, KernelMount, Tree};
use super::{build, comparable, kernel_walk_devices, mkfs, tar_of};
use crate::common;

/// Writes `text` to `dir/rel`, making its parents.
fn put(dir: &Path, rel: &str, text: &[u8]) {
    let p = dir.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

/// Three layers' source trees, lowest first, as an image tool records a
/// container's changes: what each layer adds or changes, and a `.wh.`
/// file for what it removes.
fn layer_sources(dir: &Path) -> Vec<PathBuf> {
    let (l1, l2, l3) = (dir.join("s1"), dir.join("s2"), dir.join("s3"));
    // The base: a little of everything.
    put(&l1, "etc/passwd", b"root:x:0:0::/root:/bin/sh\n");
    put(&l1, "etc/motd", b"base\n");
    put(
        &l1,
        "usr/lib/big",
        &common::random_bytes(&mut common::rng(7), 3 * 4096 + 1000),
    );
    put(
        &l1,
        "usr/lib/exact",
        &common::random_bytes(&mut common::rng(8), 2 * 4096),
    );
    put(&l1, "usr/bin/tool", b"#!/bin/sh\necho tool\n");
    put(&l1, "d2f/inner/a", b"a\n");
    put(&l1, "opq/old/deep", b"deep\n");
    put(&l1, "opq/keep-below", b"hidden by the opaque upper\n");
    put(&l1, "gone/f", b"removed later\n");
    put(&l1, "f2d", b"a file that becomes a directory\n");
    put(&l1, "var/empty/.keep", b"");
    common::sh_in(
        &l1,
        "ln etc/passwd etc/passwd.hard
         ln -s ../usr/bin/tool usr/lib/tool-link
         mkfifo var/fifo
         mknod var/null c 1 3
         chmod 0700 var/empty",
    );
    set_xattr(&l1.join("etc/motd"), "user.origin", b"base");
    set_xattr(&l1.join("usr"), "trusted.note", b"lower dir xattr");
    // The second: changes, removals, a directory made opaque.
    put(&l2, "etc/passwd", b"root:x:0:0::/root:/bin/bash\n");
    put(&l2, ".wh.gone", b"");
    put(&l2, "usr/lib/.wh.exact", b"");
    put(&l2, "opq/.wh..wh..opq", b"");
    put(&l2, "opq/new", b"only this is left in opq\n");
    put(&l2, "f2d/now-a-dir", b"inside\n");
    put(&l2, "d2f", b"the directory became a file\n");
    put(
        &l2,
        "usr/lib/more",
        &common::random_bytes(&mut common::rng(9), 5000),
    );
    common::sh_in(&l2, "chmod 0750 usr; ln usr/lib/more usr/lib/more.hard");
    set_xattr(&l2.join("usr"), "user.upper", b"upper dir xattr");
    // The third, compressed: more changes on top.
    put(&l3, "etc/motd", b"upper\n");
    put(&l3, "etc/.wh.passwd.hard", b"");
    put(
        &l3,
        "usr/lib/big",
        &common::random_bytes(&mut common::rng(10), 40_000),
    );
    put(&l3, "var/.wh.fifo", b"");
    common::sh_in(&l3, "ln -s /etc/motd motd-link");
    set_xattr(&l3.join("etc/motd"), "user.origin", b"upper");
    vec![l1, l2, l3]
}

/// The kernel's overlayfs over `lowers` (top first), read-only; detached
/// when dropped.
pub(crate) struct Overlay {
    dir: tempfile::TempDir,
}

impl Overlay {
    pub(crate) fn new(lowers: &[&Path]) -> Overlay {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-ovl.")
            .tempdir()
            .unwrap();
        let list: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let data = CString::new(format!("lowerdir={}", list.join(":"))).unwrap();
        let (src, fstype) = (
            CString::new("overlay").unwrap(),
            CString::new("overlay").unwrap(),
        );
        // SAFETY: every pointer is a valid NUL-terminated string for the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                cstr(dir.path()).as_ptr(),
                fstype.as_ptr(),
                libc::MS_RDONLY,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "overlay mount: {}", std::io::Error::last_os_error());
        Overlay { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(cstr(self.dir.path()).as_ptr(), libc::MNT_DETACH) };
    }
}

/// What overlayfs reports of its own taken out: a merged directory's
/// size and link count are the upper layer's, a file's link count its
/// lower inode's (names hidden above still count).
pub(crate) fn as_overlay_shows(mut t: Tree) -> Tree {
    for n in comparable(std::mem::take(&mut t), None).into_iter() {
        let (p, mut n) = n;
        n.nlink = 0;
        t.insert(p, n);
    }
    t
}

/// Builds the three layers (tails inline, no inline data, LZ4HC) into
/// `dir`, returning their paths, lowest first.
fn build_layers(dir: &Path) -> Vec<PathBuf> {
    let forms: [&[&str]; 3] = [&[], &["-Enoinline_data"], &["-zlz4hc"]];
    let mut layers = Vec::new();
    for (i, src) in layer_sources(dir).iter().enumerate() {
        let tar = dir.join(format!("l{}.tar", i + 1));
        tar_of(src, &tar);
        let img = dir.join(format!("l{}.erofs", i + 1));
        let mut args: Vec<&str> = vec!["--tar=f", "--aufs"];
        args.extend_from_slice(forms[i]);
        build(&args, &tar, &img);
        layers.push(img);
    }
    layers
}

/// `device=L1,device=L2,...`.
fn devices_opt(layers: &[PathBuf]) -> String {
    let opts: Vec<String> = layers
        .iter()
        .map(|l| format!("device={}", l.display()))
        .collect();
    opts.join(",")
}

/// Every path's type, mode, owner, link count, size (but a
/// directory's), mtime, symlink target, user xattrs and, where readable,
/// data, as `user` (or this process) reads them with the system's tools;
/// what `user` may not enter is listed as refused, on both sides alike.
fn stat_listing(user: Option<&str>, dir: &Path) -> String {
    const SCRIPT: &str = r#"cd "$1" || exit 1
export LC_ALL=C
find . ! -type d -printf '%P %y %m %U:%G %n %s %T@ %l\n' 2>&1 | sort
find . -type d -printf '%P %y %m %U:%G %n %T@\n' 2>&1 | sort
find . -type f -readable -print0 2>/dev/null | sort -z | xargs -0r sha256sum
getfattr -R -h -d -m '^user\.' . 2>&1
exit 0"#;
    let out = match user {
        Some(u) => common::sh_as_user(u, SCRIPT, &[dir]),
        None => common::run_timeout(
            Command::new("/bin/sh").args(["-c", SCRIPT, "sh"]).arg(dir),
            Duration::from_secs(120),
        ),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn merge(layers: &[PathBuf], img: &Path) -> String {
    let mut cmd = Command::new(common::bin());
    cmd.args(["mkfs", "erofs", "--merge"]).args(layers).arg(img);
    let out = common::run_timeout(&mut cmd, Duration::from_secs(600));
    assert!(
        out.status.success(),
        "mkfs erofs --merge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The bytes the summary says were copied from the layers.
fn copied(summary: &str) -> u64 {
    let (before, _) = summary
        .split_once(" of them copied")
        .unwrap_or_else(|| panic!("no copied count in {summary:?}"));
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn merged_layers_walk_as_the_kernels_overlay_stacks_them() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let layers = build_layers(tmp.path());
    let img = tmp.path().join("merged.erofs");
    let summary = merge(&layers, &img);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    // The kernel's mount of the merged image (checked against foliofs's
    // library, `foliofs fsck` and fsck.erofs on the way).
    let merged = kernel_walk_devices(&img, &devices);
    // The kernel's stack of the same layers.
    let stacked = {
        let mounts: Vec<KernelMount> = layers.iter().map(|l| KernelMount::new(l, "")).collect();
        let top_first: Vec<&Path> = mounts.iter().rev().map(KernelMount::path).collect();
        let ovl = Overlay::new(&top_first);
        walk_mounted(ovl.path())
    };
    assert_same(
        "the merged image, against the kernel's overlay of its layers",
        &as_overlay_shows(stacked),
        &as_overlay_shows(merged.clone()),
    );
    // What overlayfs shows differently, checked against the trees: one
    // name left of the base's hard-linked passwd, two of the second
    // layer's more.
    assert_eq!(merged[Path::new("etc/passwd")].nlink, 1);
    assert_eq!(merged[Path::new("usr/lib/more")].nlink, 2);
    assert!(!merged.contains_key(Path::new("etc/passwd.hard")));
    // Only the first layer's inline tails and the third's compressed
    // files were copied; the second layer's data was pointed at.
    assert!(copied(&summary) > 0, "{summary}");
    // foliofs's mount of the merged image, as root.
    let m = common::Mount::new(&img, None, &devices_opt(&layers)).unwrap();
    assert_same(
        "foliofs's mount of the merged image",
        &comparable(merged.clone(), None),
        &comparable(walk_mounted(m.path()), None),
    );
    m.unmount().unwrap();
    // And with the layers found beside it by their UUIDs, every field
    // (inode numbers included) as the kernel's.
    let m = common::Mount::new(&img, None, "").unwrap();
    assert_same(
        "foliofs's mount of the merged image, layers found beside it",
        &merged,
        &walk_mounted(m.path()),
    );
    m.unmount().unwrap();
}

#[test]
fn a_merged_image_finds_its_layers_beside_it_or_names_the_one_missing() {
    require!("root", "fuse");
    let tmp = tempfile::tempdir().unwrap();
    let layers = build_layers(tmp.path());
    let img = tmp.path().join("merged.erofs");
    merge(&layers, &img);
    let out = common::foliofs(["ls".as_ref(), img.as_os_str(), "/usr/lib".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("more"));
    // The second layer moved away: the mount says which device is
    // missing, and where it looked.
    let uuid = foliofs_erofs::Erofs::open(&layers[1], &Default::default(), &[])
        .unwrap()
        .superblock()
        .uuid_hex();
    let away = tempfile::tempdir().unwrap();
    fs::rename(&layers[1], away.path().join("l2.erofs")).unwrap();
    let err = common::Mount::new(&img, None, "")
        .err()
        .expect("mounted without its layer");
    assert!(err.contains("device 2") && err.contains(&uuid), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn layers_whose_data_is_not_inline_are_pointed_at_and_nothing_is_copied() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let mut layers = Vec::new();
    for (i, src) in layer_sources(tmp.path()).iter().enumerate() {
        let tar = tmp.path().join(format!("n{i}.tar"));
        tar_of(src, &tar);
        let img = tmp.path().join(format!("n{i}.erofs"));
        build(&["--tar=f", "--aufs", "-Enoinline_data"], &tar, &img);
        layers.push(img);
    }
    let img = tmp.path().join("merged.erofs");
    let summary = merge(&layers, &img);
    assert_eq!(copied(&summary), 0, "{summary}");
    // The merged image holds metadata only: smaller than any file's data.
    assert!(fs::metadata(&img).unwrap().len() < 40_000);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let merged = kernel_walk_devices(&img, &devices);
    assert_eq!(
        merged[Path::new("usr/lib/big")].size,
        40_000,
        "the third layer's file"
    );
}

#[test]
fn a_user_merges_layers_and_mounts_the_result() {
    require!("root", "user-fuse", "kernel-erofs");
    let tmp = common::user_tempdir(common::TEST_USER);
    let layers = build_layers(tmp.path());
    for l in &layers {
        fs::set_permissions(l, fs::Permissions::from_mode(0o644)).unwrap();
    }
    let img = tmp.path().join("merged.erofs");
    let mut cmd = common::user_command(common::TEST_USER, common::bin());
    cmd.args(["mkfs", "erofs", "-q", "--merge"])
        .args(&layers)
        .arg(&img);
    let out = common::run_timeout(&mut cmd, Duration::from_secs(600));
    assert!(
        out.status.success(),
        "as {}: {}",
        common::TEST_USER,
        String::from_utf8_lossy(&out.stderr)
    );
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    // Checked as the other images are, though a user built it.
    kernel_walk_devices(&img, &devices);
    // The short command: the layers are found beside the image.
    let m = common::Mount::as_user(common::TEST_USER, &img, None, "").unwrap();
    // Root cannot enter the user's mount: the user lists both it and
    // the kernel's mount, with the same tools.
    let kernel = KernelMount::new(&img, &devices_opt(&layers));
    let got = stat_listing(Some(common::TEST_USER), m.path());
    assert_eq!(
        got,
        stat_listing(Some(common::TEST_USER), kernel.path()),
        "a user's foliofs mount of the merged image, against the kernel's"
    );
    assert!(got.contains("usr/lib/more f 644"), "{got}");
    drop(kernel);
    m.unmount().unwrap();
}

#[test]
fn bad_layers_are_refused_by_name_and_leave_no_image() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    put(&src, "f", b"x");
    let good = tmp.path().join("good.erofs");
    let tar = tmp.path().join("t.tar");
    tar_of(&src, &tar);
    build(&["--tar=f"], &tar, &good);
    let small = tmp.path().join("small.erofs");
    build(&["-b", "512"], &src, &small);
    let not_erofs = tmp.path().join("garbage");
    fs::write(&not_erofs, common::random_bytes(&mut common::rng(3), 5000)).unwrap();
    let missing = tmp.path().join("missing.erofs");
    let img = tmp.path().join("merged.erofs");
    let cases: [(&[&Path], &str); 5] = [
        (&[&good, &missing], "missing.erofs"),
        (&[&tar, &not_erofs], "garbage"),
        (
            &[&not_erofs, &good],
            "garbage: neither an EROFS image nor a tar",
        ),
        (&[&good, &small], "512-byte blocks"),
        (&[], "no"),
    ];
    for (layers, want) in cases {
        let mut args: Vec<&std::ffi::OsStr> = vec!["--merge".as_ref()];
        args.extend(layers.iter().map(|l| l.as_os_str()));
        args.push(img.as_os_str());
        let out = mkfs(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{layers:?} merged");
        assert!(err.contains(want), "{layers:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{layers:?}: {err}");
        assert!(!img.exists(), "{layers:?} left an image");
        let left: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".merged"))
            .collect();
        assert!(left.is_empty(), "{layers:?} left {left:?}");
        // Nor a layer image built of the tar before the merge failed.
        let images = fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".erofs"))
            .count();
        assert_eq!(images, 2, "{layers:?}: only good.erofs and small.erofs");
    }
}

/// The layer images a `--merge` of tars built, from its summary.
fn built_layers(summary: &str) -> Vec<PathBuf> {
    summary
        .lines()
        .filter_map(|l| l.strip_suffix(": a layer image built of a tar"))
        .map(PathBuf::from)
        .collect()
}

#[test]
fn tars_merge_and_a_directory_a_tar_only_implies_keeps_what_is_below() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let (s1, s2) = (tmp.path().join("s1"), tmp.path().join("s2"));
    put(&s1, "a/old", b"old\n");
    put(&s1, "d2f/inner", b"a directory in the base\n");
    common::sh_in(&s1, "chown 1000:1000 a; chmod 0700 a; touch -d @1000000 a");
    put(&s2, "a/b", b"new\n");
    put(&s2, "d2f", b"now a file\n");
    put(&s2, "x/.wh.inner", b"");
    let (t1, t2) = (tmp.path().join("l1.tar"), tmp.path().join("l2.tar"));
    tar_of(&s1, &t1);
    // The second layer as umoci writes such a change: `a/b` with no
    // entry for `a` (nor for the root), and a directory turned into a
    // file with a whiteout beneath the file's name.
    common::sh_in(
        tmp.path(),
        "mkdir -p x && cp s2/d2f x/d2f && mkdir -p y/d2f && touch y/d2f/.wh.inner
         tar --format=pax -cf l2.tar -C s2 a/b d2f -C ../y d2f/.wh.inner",
    );
    let img = tmp.path().join("merged.erofs");
    let summary = {
        let mut cmd = Command::new(common::bin());
        cmd.args(["mkfs", "erofs", "--merge"])
            .arg(&t1)
            .arg(&t2)
            .arg(&img);
        let out = common::run_timeout(&mut cmd, Duration::from_secs(600));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let layers = built_layers(&summary);
    assert_eq!(layers.len(), 2, "{summary}");
    assert_eq!(copied(&summary), 0, "{summary}");
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let merged = kernel_walk_devices(&img, &devices);
    let a = &merged[Path::new("a")];
    assert_eq!(
        (a.mode & 0o7777, a.uid, a.gid, a.mtime.0),
        (0o700, 1000, 1000, 1_000_000),
        "the implied a kept the base's attributes"
    );
    assert!(merged.contains_key(Path::new("a/old")) && merged.contains_key(Path::new("a/b")));
    assert_eq!(merged[Path::new("d2f")].kind, "reg");
    assert!(!merged.contains_key(Path::new("d2f/inner")));
    // The kernel's overlay of the same layer images agrees on all else;
    // on `a` it shows the upper layer's implied directory, 0755 root.
    let stacked = {
        let mounts: Vec<KernelMount> = layers.iter().map(|l| KernelMount::new(l, "")).collect();
        let top_first: Vec<&Path> = mounts.iter().rev().map(KernelMount::path).collect();
        let ovl = Overlay::new(&top_first);
        walk_mounted(ovl.path())
    };
    assert_eq!(stacked[Path::new("a")].mode & 0o7777, 0o755);
    let without_a = |t: Tree| -> Tree {
        as_overlay_shows(t)
            .into_iter()
            .filter(|(p, _)| p != Path::new("a") && p != Path::new(""))
            .collect()
    };
    assert_same(
        "the merged tars, against the kernel's overlay (but the implied a)",
        &without_a(stacked),
        &without_a(merged),
    );
}

#[test]
fn a_clean_merge_copies_every_byte_and_needs_no_layer() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let layers = build_layers(tmp.path());
    let by_ref = tmp.path().join("merged.erofs");
    merge(&layers, &by_ref);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let want = kernel_walk_devices(&by_ref, &devices);
    let clean = tmp.path().join("clean.erofs");
    let mut cmd = Command::new(common::bin());
    cmd.args(["mkfs", "erofs", "--merge", "--clean=data"])
        .args(&layers)
        .arg(&clean);
    let out = common::run_timeout(&mut cmd, Duration::from_secs(600));
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{summary}");
    // Every file's bytes (each inode once; the layers' files that upper
    // layers replaced are copied too, as the layers are walked in turn).
    let files: std::collections::BTreeMap<u64, u64> = want
        .values()
        .filter(|n| n.kind == "reg")
        .map(|n| (n.ino, n.size))
        .collect();
    let data: u64 = files.values().sum();
    assert!(copied(&summary) >= data, "{summary}: {data} bytes of files");
    // The layers gone, the image alone reads the same.
    let away = tempfile::tempdir().unwrap();
    for l in &layers {
        fs::rename(l, away.path().join(l.file_name().unwrap())).unwrap();
    }
    let got = kernel_walk_devices(&clean, &[]);
    assert_same(
        "the clean merge, against the merge by reference",
        &comparable(want, None),
        &comparable(got, None),
    );
    // Only --clean=data is built; and --clean needs a merge.
    let out = mkfs(&["--merge", "--clean=rvsp", "x.erofs", "y.erofs"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clean=rvsp"));
}

#[test]
fn containerds_fsmerge_command_line_runs_through_a_mkfs_erofs_link() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let mut layers = Vec::new();
    for (i, src) in layer_sources(tmp.path()).iter().enumerate() {
        let tar = tmp.path().join(format!("c{i}.tar"));
        tar_of(src, &tar);
        let img = tmp.path().join(format!("c{i}.erofs"));
        // As containerd's differ builds each layer.
        build(
            &["--tar=f", "--aufs", "-Enoinline_data", "-b4096"],
            &tar,
            &img,
        );
        layers.push(img);
    }
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let link = bin.join("mkfs.erofs");
    std::os::unix::fs::symlink(common::bin(), &link).unwrap();
    // containerd's fsmerge: `mkfs.erofs --aufs --ovlfs-strip=1 --quiet
    // fsmeta.erofs layer1.erofs ...`.
    let fsmeta = tmp.path().join("fsmeta.erofs");
    let out = common::run_timeout(
        Command::new(&link)
            .args(["--aufs", "--ovlfs-strip=1", "--quiet"])
            .arg(&fsmeta)
            .args(&layers),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same image as foliofs's own spelling makes.
    let ours = tmp.path().join("ours.erofs");
    merge(&layers, &ours);
    assert_eq!(fs::read(&fsmeta).unwrap(), fs::read(&ours).unwrap());
    // Without --ovlfs-strip=1 mkfs.erofs would keep the whiteouts: refused.
    let out = common::run_timeout(
        Command::new(&link)
            .arg("--quiet")
            .arg(tmp.path().join("x.erofs"))
            .args(&layers),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ovlfs-strip=1"));
    // mkfs.erofs 1.9.3's rebuild mode on the same layers: the same tree,
    // but for two things. The root, which it gives mode 0777 and the time
    // of the build when the top layer's tar did not list it (foliofs: the
    // top layer image's root, 0755 at the epoch, as a layer image cannot
    // say its root was implied). And mtimes, whose nanoseconds it drops
    // (foliofs keeps the layers' own, as the kernel's overlay shows them).
    let Some(utils) = super::erofs_utils() else {
        return;
    };
    let theirs = tmp.path().join("theirs.erofs");
    let out = common::run_timeout(
        Command::new(utils.join("mkfs.erofs"))
            .args(["--aufs", "--ovlfs-strip=1", "--quiet"])
            .arg(&theirs)
            .args(&layers),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let without_root = |t: Tree| -> Tree {
        comparable(t, None)
            .into_iter()
            .filter(|(p, _)| p != Path::new(""))
            .map(|(p, mut n)| {
                n.mtime.1 = 0;
                (p, n)
            })
            .collect()
    };
    assert_same(
        "foliofs's merge, against mkfs.erofs 1.9.3's rebuild mode",
        &without_root(kernel_walk_devices(&theirs, &devices)),
        &without_root(kernel_walk_devices(&fsmeta, &devices)),
    );
}
