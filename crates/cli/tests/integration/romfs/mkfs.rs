//! `foliofs mkfs romfs`: round trips, reproducibility, alignment, equality
//! with genromfs, and refusals of what romfs cannot hold.

use crate::common;

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::util::{
    assert_hard_link_extracted, assert_same_romfs_tree, extract, genromfs, library_walk,
    ls_r_paths, mkfs, without_ino, Edit,
};
use common::{every_type_tree, walk};
use foliofs_block::OpenOptions;
use foliofs_romfs::{EntryType, RomFs};

/// `every_type_tree` at DIR/src and its `foliofs mkfs romfs` image at DIR/img.
fn every_type_image(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    every_type_tree(&src);
    let img = dir.join("img");
    mkfs(&src, &img, &[]);
    (src, img)
}

#[test]
fn mkfs_round_trip_gives_back_the_source_tree() {
    require!("root");
    let t = tempfile::tempdir().unwrap();
    let (src, img) = every_type_image(t.path());
    assert_eq!(
        std::fs::metadata(&img).unwrap().len() % 1024,
        0,
        "padded to 1 KiB"
    );
    let expected = walk(&src);
    let listed = ls_r_paths(&img);
    let want: std::collections::BTreeSet<_> = expected
        .keys()
        .filter(|p| !p.as_os_str().is_empty())
        .cloned()
        .collect();
    assert_eq!(listed, want);
    let dest = t.path().join("out");
    extract(&img, &dest);
    assert_same_romfs_tree(&expected, &walk(&dest));
    assert_hard_link_extracted(&dest);
    let fsck = common::foliofs([OsStr::new("fsck"), img.as_os_str()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let info =
        String::from_utf8(common::foliofs_ok([OsStr::new("info"), img.as_os_str()])).unwrap();
    assert!(info.contains("volume name:     foliofs"), "{info}");
    assert!(info.contains("superblock sum:  ok"), "{info}");
    assert!(info.contains("hard link      1"), "{info}");
}

#[test]
fn mkfs_is_reproducible() {
    let t = tempfile::tempdir().unwrap();
    // Two trees with the same content, created in opposite orders (so
    // directory order on disk differs) and with different times.
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    for (dir, rev) in [("a", false), ("b", true)] {
        let d = t.path().join(dir);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let mut order = names.clone();
        if rev {
            order.reverse();
        }
        for n in &order {
            std::fs::write(d.join(n), n.repeat(37)).unwrap();
            std::fs::write(d.join("sub").join(n), n.as_bytes()).unwrap();
        }
        std::os::unix::fs::symlink("f00", d.join("ln")).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let st = std::process::Command::new("touch")
        .arg(t.path().join("b/f07"))
        .status()
        .unwrap();
    assert!(st.success());
    let (i1, i2, i3) = (t.path().join("1"), t.path().join("2"), t.path().join("3"));
    mkfs(&t.path().join("a"), &i1, &[]);
    mkfs(&t.path().join("a"), &i2, &[]);
    mkfs(&t.path().join("b"), &i3, &[]);
    let b1 = std::fs::read(&i1).unwrap();
    assert!(b1 == std::fs::read(&i2).unwrap(), "same tree, same bytes");
    assert!(
        b1 == std::fs::read(&i3).unwrap(),
        "same content in another order, same bytes"
    );
}

/// End of the entry at header `h`: header, padded name, padded data.
fn entry_end(e: &Edit, h: u64) -> u64 {
    let o = h as usize;
    let name_len = e.bytes[o + 16..].iter().position(|&b| b == 0).unwrap() as u64;
    let meta = (16 + name_len + 1 + 15) & !15;
    let kind = EntryType::from_bits(e.word(h));
    let data = if kind.has_data() {
        (u64::from(e.word(h + 8)) + 15) & !15
    } else {
        0
    };
    h + meta + data
}

#[test]
fn mkfs_aligns_file_data_but_not_hard_links() {
    require!("root");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    every_type_tree(&src);
    std::fs::write(src.join("table.bin"), vec![1u8; 5000]).unwrap();
    let img = t.path().join("img");
    mkfs(
        &src,
        &img,
        &[
            "--align",
            "4096",
            "--align-pattern",
            "64K,*.bin",
            "--exclude",
            "deep",
        ],
    );
    let fs = RomFs::open(&img, &OpenOptions::default()).unwrap();
    let e = Edit::load(&img);
    let headers = e.all_headers();
    let mut files = 0;
    for (i, &h) in headers.iter().enumerate() {
        let hd = fs.header(h).unwrap();
        match hd.kind {
            EntryType::Regular if hd.size > 0 => {
                assert_eq!(hd.data_offset() % 4096, 0, "{}", hd.name_lossy());
                files += 1;
            }
            EntryType::HardLink if i > 0 => {
                assert_eq!(
                    entry_end(&e, headers[i - 1]),
                    h,
                    "no padding before link {}",
                    hd.name_lossy()
                );
            }
            _ => {}
        }
    }
    assert!(files > 10);
    let table = fs.find("table.bin").unwrap();
    assert_eq!(table.data_offset % 65536, 0);
    assert!(fs.find("deep").is_err(), "excluded");
    let dest = t.path().join("out");
    extract(&img, &dest);
    std::fs::remove_dir_all(src.join("deep")).unwrap();
    assert_same_romfs_tree(&walk(&src), &walk(&dest));
    for bad in ["3", "8", "4M", "x"] {
        let out = common::foliofs([
            OsStr::new("mkfs"),
            OsStr::new("romfs"),
            OsStr::new("--align"),
            OsStr::new(bad),
            src.as_os_str(),
            t.path().join("bad").as_os_str(),
        ]);
        assert!(!out.status.success(), "--align {bad} accepted");
        assert!(
            !t.path().join("bad").exists(),
            "no image left after a refusal"
        );
    }
}

#[test]
fn mkfs_and_genromfs_hold_the_same_entries_and_bytes() {
    require!("root", "genromfs");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    every_type_tree(&src);
    for (g, m) in [
        (&[][..], &[][..]),
        (&["-a", "4096"][..], &["--align", "4096"][..]),
    ] {
        let (gi, mi) = (t.path().join("g"), t.path().join("m"));
        genromfs(&src, &gi, g);
        mkfs(&src, &mi, m);
        let o = OpenOptions::default();
        let (gw, mw) = (library_walk(&gi, &o), library_walk(&mi, &o));
        assert_eq!(
            without_ino(&gw),
            without_ino(&mw),
            "genromfs {g:?} vs mkfs {m:?}"
        );
    }
}

#[test]
fn mkfs_refuses_what_romfs_cannot_hold() {
    let t = tempfile::tempdir().unwrap();
    let run = |src: &Path, extra: &[&str]| {
        let img = t.path().join("img");
        let mut args: Vec<&OsStr> = vec![OsStr::new("mkfs"), OsStr::new("romfs")];
        args.extend(extra.iter().map(OsStr::new));
        args.push(src.as_os_str());
        args.push(img.as_os_str());
        let out = common::foliofs(args);
        assert!(!out.status.success(), "mkfs of {} succeeded", src.display());
        assert!(!img.exists(), "a refused image is removed");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let long = t.path().join("long");
    std::fs::create_dir_all(long.join("d")).unwrap();
    let name = "n".repeat(128);
    std::fs::write(long.join("d").join(&name), b"x").unwrap();
    let err = run(&long, &[]);
    assert!(
        err.contains(&format!("d/{name}")) && err.contains("127"),
        "{err}"
    );

    let big = t.path().join("big");
    std::fs::create_dir_all(&big).unwrap();
    let f = std::fs::File::create(big.join("four-gib")).unwrap();
    f.set_len(4 << 30).unwrap();
    let err = run(&big, &[]);
    assert!(err.contains("four-gib") && err.contains("4 GiB"), "{err}");

    let many = t.path().join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..3 {
        let f = std::fs::File::create(many.join(format!("part{i}"))).unwrap();
        f.set_len(1536 << 20).unwrap();
    }
    let err = run(&many, &[]);
    assert!(err.contains("must not exceed 4 GiB"), "{err}");

    let small = t.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let err = run(&small, &["--volume", &"v".repeat(128)]);
    assert!(err.contains("volume name"), "{err}");
    let err = run(&small, &["--exclude", "a[b"]);
    assert!(err.contains("a[b"), "{err}");
}

#[test]
fn mkfs_shows_progress_on_a_terminal() {
    require!("script");
    // `script` gives the command a pseudo-terminal for stderr.
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..5 {
        std::fs::write(src.join(format!("f{i}")), vec![i as u8; 3 << 20]).unwrap();
    }
    let img = t.path().join("img");
    let cmd = format!(
        "{} mkfs romfs {} {}",
        common::bin().display(),
        src.display(),
        img.display()
    );
    let out = common::run_timeout(
        std::process::Command::new("script").args(["-qec", &cmd, "/dev/null"]),
        std::time::Duration::from_secs(60),
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("5/5 files, 15/15 MiB"), "{text}");
    // Not on a terminal: no progress lines.
    let out = common::foliofs([
        OsStr::new("mkfs"),
        OsStr::new("romfs"),
        src.as_os_str(),
        img.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("/5 files"), "{err}");
}

#[test]
fn extract_a_subtree_or_one_file_and_cat_at_any_block_size() {
    require!("root");
    let t = tempfile::tempdir().unwrap();
    let (src, img) = every_type_image(t.path());
    let dest = t.path().join("sub");
    common::foliofs_ok([
        OsStr::new("extract"),
        img.as_os_str(),
        dest.as_os_str(),
        OsStr::new("deep/level0"),
    ]);
    assert_same_romfs_tree(&walk(&src.join("deep/level0")), &walk(&dest));
    let one = t.path().join("one");
    common::foliofs_ok([
        OsStr::new("extract"),
        img.as_os_str(),
        one.as_os_str(),
        OsStr::new("dev/sda1"),
    ]);
    let names: Vec<_> = std::fs::read_dir(&one)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(names, ["sda1"]);
    let want = std::fs::read(src.join("big")).unwrap();
    for o in ["largeblocks", "blocksize=4096", "blocksize=2M", "directio"] {
        let got = common::foliofs_ok([
            OsStr::new("cat"),
            OsStr::new("-o"),
            OsStr::new(o),
            img.as_os_str(),
            OsStr::new("big"),
        ]);
        assert!(got == want, "cat -o {o} differs");
    }
    let out = common::foliofs([
        OsStr::new("cat"),
        OsStr::new("-o"),
        OsStr::new("blocksize=3000"),
        img.as_os_str(),
        OsStr::new("big"),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

#[test]
fn extract_leaves_an_existing_directory_alone_without_force() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"data\n").unwrap();
    std::fs::set_permissions(src.join("d"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = t.path().join("img");
    mkfs(&src, &img, &[]);
    let dest = t.path().join("out");
    std::fs::create_dir_all(dest.join("d")).unwrap();
    std::fs::set_permissions(dest.join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    extract(&img, &dest);
    assert_eq!(std::fs::read(dest.join("d/f")).unwrap(), b"data\n");
    assert_eq!(
        mode(&dest.join("d")),
        0o700,
        "the user's directory was changed"
    );
    common::foliofs_ok([
        OsStr::new("extract"),
        OsStr::new("--force"),
        img.as_os_str(),
        dest.as_os_str(),
    ]);
    // romfs stores only the exec bit: a directory with it reads as 0755.
    assert_eq!(
        mode(&dest.join("d")),
        0o755,
        "--force applies the image's mode"
    );
}
