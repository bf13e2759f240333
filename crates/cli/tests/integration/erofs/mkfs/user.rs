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

/// The user `tests` tars a tree of its own with GNU tar as people do
/// (`--xattrs --acls --sparse`, POSIX format: binary xattr values with
/// newlines, an access and a default ACL, a sparse file), builds an image
/// of it from standard input, and mounts it; the xattrs, ACLs and data
/// come back as the user set them, through the user's mount and the
/// kernel's.
#[test]
fn a_user_builds_from_a_tar_with_xattrs_acls_and_holes() {
    require!("user-fuse", "kernel-erofs", "tar", "setfacl", "setfattr");
    let tmp = common::user_tempdir(TEST_USER);
    let (src, img) = (tmp.path().join("src"), tmp.path().join("img"));
    let out = sh_as_user(
        TEST_USER,
        r#"set -e
mkdir "$2"
cd "$2"
printf 'capabilities and acls\n' >f
setfattr -n user.bin -v 0x0a00ff0a0a3232206c696e6b706174683d2f6574632f6576696c0a f
setfacl -m u:1234:r--,g:5678:rw- f
truncate -s 8M sparse
printf data | dd of=sparse bs=1 seek=4194304 conv=notrunc 2>/dev/null
mkdir d
setfacl -d -m u:1234:rwx d
cd ..
tar --sort=name --format=posix --xattrs --xattrs-include='*' --acls --sparse -C "$2" -cf - . |
    "$1" mkfs erofs -q - "$3"
getfattr -h -d -m - -e hex "$2/f" "$2/d" >"$2.want"
"#,
        &[common::bin().as_os_str(), src.as_os_str(), img.as_os_str()],
    );
    assert!(
        out.status.success(),
        "as {TEST_USER}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        fs::metadata(&img).unwrap().len() < 1 << 20,
        "the holes were written"
    );
    let m = Mount::as_user(TEST_USER, &img, Some("erofs"), "").unwrap();
    assert_eq!(listing(Some(TEST_USER), m.path()), listing(None, &src));
    let got = sh_as_user(
        TEST_USER,
        r#"cd "$1" && getfattr -h -d -m - -e hex f d"#,
        &[m.path()],
    );
    let want = fs::read_to_string(tmp.path().join("src.want")).unwrap();
    let strip = |s: &str| -> String {
        s.lines()
            .map(|l| match l.strip_prefix("# file: ") {
                Some(path) => path.rsplit('/').next().unwrap_or(path).to_owned(),
                None => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&String::from_utf8_lossy(&got.stdout)), strip(&want));
    assert!(want.contains("system.posix_acl_access") && want.contains("system.posix_acl_default"));
    m.unmount().unwrap();
    let want = comparable(walk_mounted(&src), None);
    let got = comparable(kernel_walk(&img), None);
    super::super::walk::assert_same("the kernel's walk", &want, &got);
}
