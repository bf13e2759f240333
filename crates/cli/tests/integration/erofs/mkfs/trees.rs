//! Real and made trees through `foliofs mkfs erofs`, from a directory and
//! from their tar, against the kernel, and against mkfs.erofs 1.9.3.

use std::fs;
use std::os::unix::fs::lchown;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::super::walk::{assert_same, set_mtime, set_xattr, walk_mounted};
use super::{build, check_tree, comparable, kernel_walk, tar_of};
use crate::common;

/// Every entry type, plus what picks the inode form and the xattr paths:
/// owners past 16 bits, mtimes with nanoseconds, xattrs in every
/// namespace, shared ones (the same pair on several inodes), and one
/// value large enough to push a small file's tail out of its block.
fn rich_tree(dir: &Path) {
    common::every_type_tree(dir);
    for f in ["one", "k1024", "p4097", "deep"] {
        set_xattr(&dir.join(f), "user.shared", b"same on four inodes");
    }
    set_xattr(&dir.join("one"), "user.only", b"here");
    set_xattr(&dir.join("one"), "trusted.t", b"\x00\x01binary");
    set_xattr(&dir.join("k1025"), "security.s", b"sec");
    set_xattr(&dir.join("p4095"), "user.big", &[b'v'; 3000]);
    set_xattr(&dir.join("empty-dir"), "user.on-a-dir", b"");
    lchown(dir.join("fifteen"), Some(100_000), Some(70_000)).unwrap();
    lchown(dir.join("link-rel"), Some(7), Some(8)).unwrap();
    set_mtime(&dir.join("seventeen"), 1_600_000_000, 123_456_789);
    set_mtime(&dir.join("deep"), 1_000, 1);
    set_mtime(&dir.join("link-abs"), -5, 0);
}

#[test]
fn every_type_walks_equal_at_every_block_size_with_and_without_inline_data() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    rich_tree(&src);
    for (args, time) in [
        (&[][..], None),
        (&["-Enoinline_data"][..], None),
        (&["-b512"][..], None),
        (&["-b1024", "-T", "1234567"][..], Some(1_234_567)),
        (&["-b2048", "-Enoinline_data", "-Uclear", "-Lvol"][..], None),
    ] {
        let img = tmp.path().join("img");
        check_tree(&src, &img, args, time);
    }
}

#[test]
fn python_library_and_usr_share_walk_equal() {
    require!("root", "kernel-erofs");
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("img");
    let python = Path::new("/usr/lib/python3.11");
    if python.is_dir() {
        check_tree(python, &img, &[], None);
        check_tree(python, &img, &["-Enoinline_data"], None);
    }
    for part in ["/usr/share/zoneinfo", "/usr/share/perl", "/usr/share/mime"] {
        if Path::new(part).is_dir() {
            check_tree(Path::new(part), &img, &["-b512"], None);
        }
    }
}

#[test]
fn a_tree_and_its_tar_give_the_same_image() {
    require!("root", "tar", "gzip");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    rich_tree(&src);
    // tar stores no sockets: the tree has none either.
    fs::remove_file(src.join("dev/socket")).unwrap();
    let tar = tmp.path().join("t.tar");
    tar_of(&src, &tar);
    let mut tars = vec![tar.clone(), super::compressed(&tar, "gzip")];
    if common::have("zstd", &["zstd"]) {
        tars.push(super::compressed(&tar, "zstd"));
    }
    for args in [&[][..], &["-T", "0", "-Enoinline_data"][..], &["-b512"][..]] {
        let from_dir = tmp.path().join("dir.img");
        build(args, &src, &from_dir);
        let want = fs::read(&from_dir).unwrap();
        for t in &tars {
            let from_tar = tmp.path().join("tar.img");
            build(args, t, &from_tar);
            assert!(
                fs::read(&from_tar).unwrap() == want,
                "{args:?}: the image of {} differs from the tree's",
                t.display()
            );
        }
        // And from standard input.
        let from_stdin = tmp.path().join("stdin.img");
        let out = common::run_timeout(
            Command::new("sh")
                .arg("-c")
                .arg("exec \"$0\" mkfs erofs -q \"$@\" < \"$T\"")
                .arg(common::bin())
                .args(args)
                .arg("-")
                .arg(&from_stdin)
                .env("T", tars.last().unwrap()),
            Duration::from_secs(300),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            fs::read(&from_stdin).unwrap() == want,
            "{args:?}: from stdin"
        );
    }
}

/// A layer as an overlayfs upper directory is tarred: whiteouts as AUFS
/// names, an opaque directory, a hard link, and files in several
/// directories.
pub(super) fn layer_tree(dir: &Path) {
    rich_tree(dir);
    fs::remove_file(dir.join("dev/socket")).unwrap();
    fs::write(dir.join(".wh.removed-file"), b"").unwrap();
    fs::create_dir_all(dir.join("etc/opaque")).unwrap();
    fs::write(dir.join("etc/opaque/.wh..wh..opq"), b"").unwrap();
    fs::write(dir.join("etc/opaque/kept"), b"kept\n").unwrap();
    fs::write(dir.join("etc/.wh.gone-dir"), b"").unwrap();
    fs::write(dir.join("etc/config"), b"key=value\n").unwrap();
}

#[test]
fn the_same_tar_through_mkfs_erofs_walks_equal_under_the_kernel() {
    require!("root", "kernel-erofs", "tar");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut layers = Vec::new();
    let layer = tmp.path().join("layer");
    layer_tree(&layer);
    layers.push(("layer", layer));
    let python = Path::new("/usr/lib/python3.11");
    if python.is_dir() {
        layers.push(("python", python.to_owned()));
    }
    for (what, src) in layers {
        let tar = tmp.path().join(format!("{what}.tar"));
        tar_of(&src, &tar);
        for extra in [&["-Enoinline_data"][..], &[][..], &["-b512"][..]] {
            let mut args = vec!["--tar=f", "--aufs", "-T0", "-Uclear"];
            args.extend_from_slice(extra);
            let (got, ours, theirs) = super::through_both(&bin, &args, &tar, tmp.path(), None);
            if what == "python" {
                // A real tree of many small files: where inodes and inline
                // tails are packed shows in the size.
                super::within_1_percent(&format!("python {extra:?}"), ours, theirs);
            }
            if what == "layer" {
                // The whiteouts are there to compare at all.
                assert_eq!(got[Path::new("removed-file")].kind, "chr");
                assert!(got[Path::new("etc/opaque")]
                    .xattrs
                    .contains_key(&b"trusted.overlay.opaque"[..]));
            }
        }
    }
}

/// A sparse tree and GNU tar's sparse tars of it, in every format GNU tar
/// writes them (old GNU, PAX 0.0, 0.1, 1.0), give one image, which keeps
/// the holes and walks equal to the tree under the kernel.
#[test]
fn sparse_tars_give_the_trees_image() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let f = fs::File::create(src.join("holes")).unwrap();
    f.set_len(10 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"data in the middle", 5_000_000).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"and at the end", (10 << 20) - 14).unwrap();
    fs::write(src.join("plain"), b"plain\n").unwrap();
    let tar_with = |args: &[&str], out: &Path| {
        let r = common::run_timeout(
            Command::new("tar")
                .args(["--sparse", "--sort=name"])
                .args(args)
                .arg("-C")
                .arg(&src)
                .arg("-cf")
                .arg(out)
                .arg("."),
            Duration::from_secs(60),
        );
        assert!(
            r.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    };
    let from_dir = tmp.path().join("dir.img");
    build(&["-T0"], &src, &from_dir);
    let want = fs::read(&from_dir).unwrap();
    // The holes stay holes: the image holds the data, not 10 MiB of zeros.
    assert!(
        want.len() < 1 << 20,
        "the holes were written: {} bytes",
        want.len()
    );
    for (name, args) in [
        ("gnu", &["--format=gnu"][..]),
        ("pax-0.0", &["--format=pax", "--sparse-version=0.0"]),
        ("pax-0.1", &["--format=pax", "--sparse-version=0.1"]),
        ("pax-1.0", &["--format=pax", "--sparse-version=1.0"]),
    ] {
        let t = tmp.path().join(format!("{name}.tar"));
        tar_with(args, &t);
        assert!(
            fs::metadata(&t).unwrap().len() < 1 << 20,
            "{name}: tar stored the holes"
        );
        let img = tmp.path().join(format!("{name}.img"));
        build(&["-T0"], &t, &img);
        assert!(
            fs::read(&img).unwrap() == want,
            "{name}: not the tree's image"
        );
    }
    let got = comparable(kernel_walk(&from_dir), None);
    let expect = comparable(walk_mounted(&src), Some(0));
    assert_same("the kernel's walk of a sparse tree", &expect, &got);

    // Past 4 GiB (an extended inode, a block map of many chunks): the
    // kernel reads the data where it was and zeros between, and the
    // image stays small. Checked at those offsets, not hashed whole.
    let big_src = tmp.path().join("big");
    fs::create_dir(&big_src).unwrap();
    let size: u64 = (5 << 30) + 12345;
    let marks: [(u64, &[u8]); 3] = [
        (4096, b"near the start"),
        ((9 << 29) + 17, b"past four gibibytes"),
        (size - 7, b"the end"),
    ];
    let f = fs::File::create(big_src.join("big")).unwrap();
    f.set_len(size).unwrap();
    for (at, what) in marks {
        std::os::unix::fs::FileExt::write_all_at(&f, what, at).unwrap();
    }
    drop(f);
    let t = tmp.path().join("big.tar");
    let r = common::run_timeout(
        Command::new("tar")
            .args(["--sparse", "--format=pax", "--sparse-version=1.0", "-C"])
            .arg(&big_src)
            .arg("-cf")
            .arg(&t)
            .arg("."),
        Duration::from_secs(120),
    );
    assert!(
        r.status.success(),
        "tar: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let img = tmp.path().join("big.img");
    build(&["-Enoinline_data"], &t, &img);
    assert!(
        fs::metadata(&img).unwrap().len() < 1 << 20,
        "the holes were written"
    );
    let m = super::super::walk::KernelMount::new(&img, "");
    let got = fs::File::open(m.path().join("big")).unwrap();
    assert_eq!(got.metadata().unwrap().len(), size);
    for (at, what) in marks {
        let mut buf = vec![1u8; what.len() + 64];
        std::os::unix::fs::FileExt::read_exact_at(&got, &mut buf, at - 64).unwrap();
        assert!(buf[..64].iter().all(|&b| b == 0), "zeros before byte {at}");
        assert_eq!(&buf[64..], what, "the data at byte {at}");
    }
}

/// A Debian root as debootstrap makes it, with AUFS whiteouts added as a
/// layer above it would carry them, through both tools: with
/// containerd's flags, as an index image, and with -zlz4hc; each pair
/// walks equal under the kernel, and the images are within 1% in size.
#[test]
fn a_debootstrap_root_with_whiteouts_walks_equal_through_both_tools() {
    require!("root", "kernel-erofs", "tar", "debootstrap");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let Some(debian) = debian_root!() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // The shared root stays as debootstrap made it: the whiteouts go
    // into a copy.
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    let out = common::run_timeout(
        Command::new("cp")
            .arg("-a")
            .arg(debian.join("."))
            .arg(&root),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "cp -a {}: {}",
        debian.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // A layer's whiteouts: of a file and a directory a lower layer had
    // (a layer never holds both a name and its whiteout), and an opaque
    // directory.
    fs::write(root.join("etc/.wh.removed.conf"), b"").unwrap();
    fs::write(root.join("var/.wh.removed-dir"), b"").unwrap();
    fs::write(root.join("usr/share/doc/.wh..wh..opq"), b"").unwrap();
    let tar = tmp.path().join("root.tar");
    tar_of(&root, &tar);
    for (extra, device) in [
        (&["--tar=f", "-Enoinline_data", "-b4096"][..], false),
        (&["--tar=i"][..], true),
        (&["--tar=f", "-zlz4hc"][..], false),
    ] {
        let mut args = vec!["--aufs", "-T0", "-Uclear"];
        args.extend_from_slice(extra);
        let dev = device.then_some(tar.as_path());
        let (got, ours, theirs) = super::through_both(&bin, &args, &tar, tmp.path(), dev);
        assert_eq!(got[Path::new("etc/removed.conf")].kind, "chr");
        assert!(got[Path::new("usr/share/doc")]
            .xattrs
            .contains_key(&b"trusted.overlay.opaque"[..]));
        super::within_1_percent(&format!("debootstrap root {extra:?}"), ours, theirs);
    }
}
