//! Checks of the test harness itself: the tree walk and comparison must see
//! the differences every other test relies on them to see.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use common::{assert_same_tree, every_type_tree, walk, Entry, Fields};

type Tree = BTreeMap<PathBuf, Entry>;

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

/// Asserts that comparing the walks fails with a message naming `what`.
/// (Not `#[should_panic]`: a test skipped for want of root must pass.)
fn assert_seen(a: &Tree, b: &Tree, what: &str) {
    let err = std::panic::catch_unwind(|| assert_same_tree(a, b, Fields::default()))
        .expect_err("the comparison did not see the difference");
    let msg = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(msg.contains(what), "expected {what:?} in: {msg}");
}

#[test]
fn a_copy_compares_equal() {
    require!("root");
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
fn changed_content_is_seen() {
    require!("root");
    let (_t, a, b) = copy_tree();
    let mut bytes = fs::read(b.join("k1024")).unwrap();
    bytes[1000] ^= 1;
    fs::write(b.join("k1024"), bytes).unwrap();
    assert_seen(&walk(&a), &walk(&b), "content differs");
}

#[test]
fn a_missing_entry_is_seen() {
    require!("root");
    let (_t, a, b) = copy_tree();
    fs::remove_file(b.join("dev/fifo")).unwrap();
    assert_seen(&walk(&a), &walk(&b), "missing");
}

#[test]
fn a_changed_symlink_is_seen() {
    require!("root");
    let (_t, a, b) = copy_tree();
    fs::remove_file(b.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("two", b.join("link-rel")).unwrap();
    assert_seen(&walk(&a), &walk(&b), "target");
}
