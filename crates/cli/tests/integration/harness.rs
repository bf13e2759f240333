//! Checks of the test harness itself: the tree walk and comparison must see
//! the differences every other test relies on them to see.

use crate::common;

use std::fs;
use std::process::Command;

use common::{assert_same_tree, every_type_tree, walk, Fields};

fn copy_tree() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    every_type_tree(&a);
    let st = Command::new("cp")
        .arg("-a")
        .arg(&a)
        .arg(&b)
        .status()
        .unwrap();
    assert!(st.success());
    (tmp, a, b)
}

#[test]
fn a_copy_compares_equal() {
    let (_t, a, b) = copy_tree();
    let fields = Fields {
        perm: true,
        owner: true,
        nlink: true,
        ..Default::default()
    };
    assert_same_tree(&walk(&a), &walk(&b), fields);
}

#[test]
#[should_panic(expected = "content differs")]
fn changed_content_is_seen() {
    let (_t, a, b) = copy_tree();
    let mut bytes = fs::read(b.join("k1024")).unwrap();
    bytes[1000] ^= 1;
    fs::write(b.join("k1024"), bytes).unwrap();
    assert_same_tree(&walk(&a), &walk(&b), Fields::default());
}

#[test]
#[should_panic(expected = "missing")]
fn a_missing_entry_is_seen() {
    let (_t, a, b) = copy_tree();
    fs::remove_file(b.join("dev/fifo")).unwrap();
    assert_same_tree(&walk(&a), &walk(&b), Fields::default());
}

#[test]
#[should_panic(expected = "target")]
fn a_changed_symlink_is_seen() {
    let (_t, a, b) = copy_tree();
    fs::remove_file(b.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("two", b.join("link-rel")).unwrap();
    assert_same_tree(&walk(&a), &walk(&b), Fields::default());
}
