//! Seeded files and a tree of every entry type.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use super::{random_bytes, rng};

/// Writes a file of `size` pseudo-random bytes (seeded), streaming, so large
/// files cost no memory.
pub fn write_random_file(path: &Path, size: u64, seed: u64) {
    foliofs_testkit::data::random_file(path, size, seed).unwrap();
}

/// Makes a device node, fifo or socket with `mknod(2)` (needs root for devices).
pub fn mknod(path: &Path, mode: u32, major: u32, minor: u32) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, libc::makedev(major, minor)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A tree holding every entry type romfs and EROFS can store: regular files
/// of awkward sizes (empty, around 16 bytes and block boundaries), nested and
/// empty directories, symlinks (relative, absolute, dangling), a hard link,
/// block and char devices, a fifo, a socket, exec bits, odd and 127-byte names.
pub fn every_type_tree(dir: &Path) {
    let mut rng = rng(42);
    fs::create_dir_all(dir).unwrap();
    for (name, size) in [
        ("empty", 0u64),
        ("one", 1),
        ("fifteen", 15),
        ("sixteen", 16),
        ("seventeen", 17),
        ("k1023", 1023),
        ("k1024", 1024),
        ("k1025", 1025),
        ("p4095", 4095),
        ("p4096", 4096),
        ("p4097", 4097),
        ("big", 3 * 1024 * 1024 + 77),
    ] {
        fs::write(dir.join(name), random_bytes(&mut rng, size as usize)).unwrap();
    }
    let exe = dir.join("run.sh");
    fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(dir.join("empty-dir")).unwrap();
    let mut deep = dir.join("deep");
    for i in 0..12 {
        deep = deep.join(format!("level{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom.txt"), b"the bottom\n").unwrap();
    let long = "L".repeat(120) + "-name12";
    assert_eq!(long.len(), 127);
    fs::write(dir.join(&long), b"long name\n").unwrap();
    fs::write(dir.join("sp ace & 'quote' \u{e9}t\u{e9}"), b"odd\n").unwrap();
    fs::write(dir.join(".hidden"), b"dot file\n").unwrap();
    std::os::unix::fs::symlink("one", dir.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.join("link-abs")).unwrap();
    std::os::unix::fs::symlink("no/such/target", dir.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("deep/level0", dir.join("link-dir")).unwrap();
    fs::hard_link(dir.join("k1025"), dir.join("hardlink-to-k1025")).unwrap();
    fs::create_dir_all(dir.join("dev")).unwrap();
    mknod(&dir.join("dev/null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
    mknod(&dir.join("dev/sda1"), libc::S_IFBLK | 0o660, 8, 1).unwrap();
    mknod(&dir.join("dev/fifo"), libc::S_IFIFO | 0o644, 0, 0).unwrap();
    let sock = dir.join("dev/socket");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
}
