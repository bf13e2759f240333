//! Quick check against a genromfs image (the full suite lives in the cli tests).
use std::ffi::OsStr;
use std::process::Command;

use foliofs_block::OpenOptions;
use foliofs_romfs::RomFs;
use foliofs_vfs::{FileSystem, FileType, Scratch};

#[test]
fn reads_a_small_genromfs_image() {
    if !crate::have("smoke_walk::reads_a_small_genromfs_image", "genromfs") {
        return;
    }
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

/// Builds `img` from `src` with the default mkfs options.
fn mkfs(src: &std::path::Path, img: &std::path::Path) {
    foliofs_romfs::mkfs::build(
        src,
        img,
        &foliofs_romfs::mkfs::MkfsOptions::default(),
        &mut |_| {},
    )
    .unwrap();
}

#[test]
fn statfs_follows_the_chosen_block_size() {
    use foliofs_block::BlockSizeChoice;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), vec![1u8; 10_000]).unwrap();
    let img = t.path().join("img");
    mkfs(&src, &img);
    let size = std::fs::metadata(&img).unwrap().len();
    assert_eq!(size % 1024, 0);
    let page = foliofs_block::page_size();
    for (choice, bs) in [
        (BlockSizeChoice::Default, 1024),
        (
            BlockSizeChoice::LargeBlocks,
            foliofs_block::largeblocks(size, page),
        ),
        (BlockSizeChoice::Fixed(65536), 65536),
    ] {
        let opts = OpenOptions {
            block_size: choice,
            ..OpenOptions::default()
        };
        let fs = RomFs::open(&img, &opts).unwrap();
        let st = fs.statfs().unwrap();
        assert_eq!((st.bsize, st.frsize, st.namelen), (bs, bs, 127));
        assert_eq!(st.blocks, size.div_ceil(u64::from(bs)), "{choice:?}");
        assert_eq!((st.bfree, st.bavail, st.files, st.ffree), (0, 0, 0, 0));
        let info = fs.info();
        assert_eq!(
            (info.fs_type, info.block_size, info.read_only),
            ("romfs", bs, true)
        );
        let f = fs.lookup(fs.root(), OsStr::new("f")).unwrap();
        assert_eq!((f.blksize, f.blocks), (bs, 10_000u64.div_ceil(512)));
    }
}

/// A directory's entries as (name, ino, kind).
type Entries = Vec<(String, u64, FileType)>;

/// Every directory's entries, depth first.
fn listing(fs: &RomFs, prefetch: bool) -> Vec<(u64, Entries)> {
    let mut out = Vec::new();
    let mut stack = vec![fs.root()];
    while let Some(dir) = stack.pop() {
        if prefetch {
            fs.prefetch_dir(dir, 0, true);
        }
        let up = fs.lookup(dir, OsStr::new("..")).unwrap().ino;
        let mut v = vec![("..".to_string(), up, FileType::Directory)];
        fs.readdir(dir, 0, &mut |e| {
            v.push((e.name.to_string_lossy().into_owned(), e.ino, e.kind));
            false
        })
        .unwrap();
        stack.extend(
            v.iter()
                .skip(1)
                .filter(|e| e.2 == FileType::Directory)
                .map(|e| e.1),
        );
        out.push((dir, v));
    }
    out
}

#[test]
fn reading_subdirectories_ahead_lists_what_reading_them_in_turn_does() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    // More directories than one listing reads ahead, some of them empty.
    for d in 0..300 {
        let dir = src.join(format!("d{d}")).join(format!("e{}", d % 3));
        std::fs::create_dir_all(&dir).unwrap();
        if d % 5 == 0 {
            continue;
        }
        for f in 0..(d % 7) {
            std::fs::write(dir.join(format!("f{f}")), vec![d as u8; f * 700]).unwrap();
        }
        std::os::unix::fs::symlink("..", dir.join("up")).unwrap();
    }
    std::fs::hard_link(src.join("d6/e0/f1"), src.join("d1/link")).unwrap();
    let img = t.path().join("img");
    mkfs(&src, &img);
    let plain = listing(&RomFs::open(&img, &OpenOptions::default()).unwrap(), false);
    let ahead = listing(&RomFs::open(&img, &OpenOptions::default()).unwrap(), true);
    assert_eq!(plain.len(), 1 + 300 * 2);
    assert_eq!(plain, ahead);
}
