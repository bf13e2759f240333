//! `--tar=i` index images: metadata only, each file's data left in the
//! tar, which is the image's extra device. Each image is read by the
//! kernel with the tar as `device=` and with the tar appended to it, by
//! foliofs's library and both fscks, against the source tree and against
//! mkfs.erofs 1.9.3's index image of the same tar; a user builds one and
//! mounts it with foliofs; what cannot be indexed is refused in one line.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::Command;

use super::super::walk::{assert_same, walk_mounted, KernelMount};
use super::trees::layer_tree;
use super::{build, comparable, kernel_walk, kernel_walk_with, mkfs, tar_of};
use crate::common::{self, listing, sh_as_user, Mount, TEST_USER};

/// The image with the tar appended, mounted with no device: the tar then
/// sits where the image's device table maps it.
fn appended_walk(img: &Path, tar: &Path, out: &Path) -> super::super::walk::Tree {
    let mut flat = fs::read(img).unwrap();
    flat.extend(fs::read(tar).unwrap());
    fs::write(out, flat).unwrap();
    let m = KernelMount::new(out, "");
    walk_mounted(m.path())
}

#[test]
fn index_images_walk_equal_with_the_tar_as_device_or_appended() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let layer = tmp.path().join("layer");
    layer_tree(&layer);
    let mut trees = vec![("layer", layer)];
    let python = Path::new("/usr/lib/python3.11");
    if python.is_dir() {
        trees.push(("python", python.to_owned()));
    }
    for (what, src) in trees {
        let tar = tmp.path().join(format!("{what}.tar"));
        tar_of(&src, &tar);
        let img = tmp.path().join(format!("{what}.img"));
        build(&["--tar=i", "--aufs", "-T0", "-Uclear"], &tar, &img);
        // Metadata only: the image is far smaller than the data.
        let data: u64 = walkdir_sizes(&src);
        assert!(
            fs::metadata(&img).unwrap().len() < data / 4 + (1 << 20),
            "{what}: the index image holds data"
        );
        let got = comparable(kernel_walk_with(&img, Some(&tar)), None);
        // The same tar with its data copied in, which other tests hold
        // to mkfs.erofs's and to the source tree.
        let copied = tmp.path().join(format!("{what}.copied"));
        build(&["--tar=f", "--aufs", "-T0", "-Uclear"], &tar, &copied);
        let want = comparable(kernel_walk(&copied), None);
        assert_same(
            &format!("{what}: index image (--tar=f is 'kernel')"),
            &want,
            &got,
        );
        if what == "python" {
            assert_same(
                "python: index image against the source tree",
                &comparable(walk_mounted(&src), Some(0)),
                &got,
            );
        }
        let flat = comparable(appended_walk(&img, &tar, &tmp.path().join("flat")), None);
        assert_same(
            &format!("{what}: appended (device= is 'kernel')"),
            &got,
            &flat,
        );
        if let Some(bin) = erofs_utils_193!() {
            let args = ["--tar=i", "--aufs", "-T0", "-Uclear"];
            super::through_both(&bin, &args, &tar, tmp.path(), Some(&tar));
        }
    }
}

/// Bytes of the regular files under `dir`.
fn walkdir_sizes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            total += walkdir_sizes(&e.path());
        } else if t.is_file() {
            total += e.metadata().unwrap().len();
        }
    }
    total
}

#[test]
fn what_an_index_image_cannot_hold_is_refused_in_one_line() {
    require!("tar", "gzip");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"data\n").unwrap();
    let f = fs::File::create(src.join("holes")).unwrap();
    f.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"x", 500_000).unwrap();
    let plain = tmp.path().join("plain.tar");
    let sparse = tmp.path().join("sparse.tar");
    let gz = tmp.path().join("plain.tar.gz");
    for (args, out) in [
        (&["--format=gnu", "-cf"][..], &plain),
        (&["--format=gnu", "--sparse", "-cf"][..], &sparse),
        (&["--format=gnu", "-czf"][..], &gz),
    ] {
        let st = Command::new("tar")
            .args(args)
            .arg(out)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
    }
    let img = tmp.path().join("img");
    let cases: [(&[&std::ffi::OsStr], &str); 4] = [
        (&["--tar=i".as_ref(), gz.as_os_str()], "uncompressed"),
        (&["--tar=i".as_ref(), sparse.as_os_str()], "sparse"),
        (
            &["--tar=i".as_ref(), "-zlz4".as_ref(), plain.as_os_str()],
            "-z",
        ),
        (&["--tar=i".as_ref(), src.as_os_str()], "is a directory"),
    ];
    for (args, expect) in cases {
        super::refused(args, &img, expect);
    }
    // The plain tar is indexed, and -b 4096 gives way to the tar's
    // 512-byte blocks as it does in mkfs.erofs 1.9.3 (containerd.rs).
    for b in [&[][..], &["-b", "4096"][..]] {
        let mut args = vec![OsStr::new("--tar=i")];
        args.extend(b.iter().map(OsStr::new));
        args.extend([plain.as_os_str(), img.as_os_str()]);
        let out = mkfs(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(fs::read(&img).unwrap()[1024 + 0x0C], 9, "{args:?}");
    }
}

#[test]
fn a_user_indexes_a_tar_and_mounts_it_with_the_tar_as_device() {
    require!("user-fuse", "tar");
    let tmp = common::user_tempdir(TEST_USER);
    let src = tmp.path().join("src");
    super::users_tree(&src);
    let (tar, img) = (tmp.path().join("layer.tar"), tmp.path().join("layer.img"));
    let out = sh_as_user(
        TEST_USER,
        r#"set -e
tar --sort=name --format=pax -C "$2" -cf "$3" .
"$1" mkfs erofs -q --tar=i "$3" "$4""#,
        &[
            common::bin().as_os_str(),
            src.as_os_str(),
            tar.as_os_str(),
            img.as_os_str(),
        ],
    );
    assert!(
        out.status.success(),
        "as {TEST_USER}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = Mount::as_user(
        TEST_USER,
        &img,
        Some("erofs"),
        &format!("device={}", tar.display()),
    )
    .unwrap();
    assert_eq!(listing(Some(TEST_USER), m.path()), listing(None, &src));
    m.unmount().unwrap();
}
