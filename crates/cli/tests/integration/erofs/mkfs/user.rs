//! The user `tests` builds images of its own tree, from the directory and
//! from a tar on standard input, and mounts them.

use std::fs;

use super::super::walk::walk_mounted;
use super::{comparable, kernel_walk};
use crate::common::{self, listing, sh_as_user, Mount, TEST_USER};

#[test]
fn a_user_builds_from_a_directory_and_from_stdin_and_mounts_the_image() {
    require!("user-fuse", "kernel-erofs", "tar");
    let tmp = common::user_tempdir(TEST_USER);
    let src = tmp.path().join("src");
    super::users_tree(&src);
    let (dir_img, tar_img) = (tmp.path().join("dir.img"), tmp.path().join("tar.img"));
    let out = sh_as_user(
        TEST_USER,
        r#"set -e
"$1" mkfs erofs -q "$2" "$3"
tar --sort=name --format=pax -C "$2" -cf - . | "$1" mkfs erofs -q - "$4""#,
        &[
            common::bin().as_os_str(),
            src.as_os_str(),
            dir_img.as_os_str(),
            tar_img.as_os_str(),
        ],
    );
    assert!(
        out.status.success(),
        "as {TEST_USER}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        fs::read(&dir_img).unwrap() == fs::read(&tar_img).unwrap(),
        "the tree's and its tar's images differ"
    );
    let m = Mount::as_user(TEST_USER, &dir_img, Some("erofs"), "").unwrap();
    assert_eq!(listing(Some(TEST_USER), m.path()), listing(None, &src));
    m.unmount().unwrap();
    let want = comparable(walk_mounted(&src), None);
    let got = comparable(kernel_walk(&dir_img), None);
    super::super::walk::assert_same("the kernel's walk", &want, &got);
}
