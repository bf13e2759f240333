//! Quick check against a genromfs image (the full suite lives in the cli tests).
use std::ffi::OsStr;
use std::process::Command;

use foliofs_block::OpenOptions;
use foliofs_romfs::RomFs;
use foliofs_vfs::{FileSystem, FileType, Scratch};

#[test]
fn reads_a_small_genromfs_image() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("hello"), b"hello world\n").unwrap();
    std::fs::write(src.join("sub/deeper/x"), vec![7u8; 5000]).unwrap();
    std::fs::hard_link(src.join("hello"), src.join("sub/link")).unwrap();
    std::os::unix::fs::symlink("../hello", src.join("sub/sym")).unwrap();
    let img = t.path().join("img");
    let st = Command::new("genromfs")
        .args(["-V", "smoke", "-f"])
        .arg(&img)
        .arg("-d")
        .arg(&src)
        .status()
        .expect("genromfs runs");
    assert!(st.success());
    let fs = RomFs::open(&img, &OpenOptions::default()).unwrap();
    assert_eq!(fs.volume_name(), b"smoke");
    let root = fs.root();
    let mut names = Vec::new();
    fs.readdir(root, 0, &mut |e| {
        names.push(e.name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    names.sort();
    assert_eq!(names, ["hello", "sub"]);
    let hello = fs.lookup(root, OsStr::new("hello")).unwrap();
    let sub = fs.lookup(root, OsStr::new("sub")).unwrap();
    assert_eq!(sub.kind, FileType::Directory);
    let link = fs.lookup(sub.ino, OsStr::new("link")).unwrap();
    assert_eq!(link, hello, "a hard link is the same inode");
    let mut s = Scratch::new();
    assert_eq!(
        fs.read(hello.ino, 0, 100, &mut s).unwrap(),
        b"hello world\n"
    );
    assert_eq!(fs.read(hello.ino, 6, 3, &mut s).unwrap(), b"wor");
    let sym = fs.lookup(sub.ino, OsStr::new("sym")).unwrap();
    assert_eq!(fs.readlink(sym.ino).unwrap(), b"../hello");
    let x = fs.find("sub/deeper/x").unwrap();
    assert_eq!(x.size, 5000);
    let data = fs.read(x.ino, 1000, 4096, &mut s).unwrap();
    assert_eq!(data, &vec![7u8; 4000][..]);
    let dotdot = fs.lookup(sub.ino, OsStr::new("..")).unwrap();
    assert_eq!(dotdot.ino, root);
}
