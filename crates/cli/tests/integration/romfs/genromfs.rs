//! genromfs images read by foliofs: `ls -R`, `cat` and `extract` compared
//! with the source tree, with and without data alignment, with `-A` and `-x`.

use crate::common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::util::{
    assert_hard_link_extracted, assert_same_romfs_tree, extract, genromfs, ls_r_paths,
};
use common::{every_type_tree, walk, write_random_file};
use foliofs_block::OpenOptions;
use foliofs_romfs::RomFs;
use foliofs_vfs::FileType;

/// Every path of the source tree except the root.
fn source_paths(src: &Path) -> BTreeSet<PathBuf> {
    walk(src)
        .into_keys()
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

/// Checks `ls -R`, `cat` of every file and `extract` of `img` against `src`.
fn check_image_against(img: &Path, src: &Path, scratch: &Path) {
    assert_eq!(
        ls_r_paths(img),
        source_paths(src),
        "ls -R of {}",
        img.display()
    );
    let expected = walk(src);
    for (p, e) in &expected {
        if e.kind != "reg" {
            continue;
        }
        let out = common::foliofs_ok([OsStr::new("cat"), img.as_os_str(), p.as_os_str()]);
        let want = std::fs::read(src.join(p)).unwrap();
        assert!(out == want, "cat {} differs from the source", p.display());
    }
    let dest = scratch.join("extracted");
    extract(img, &dest);
    assert_same_romfs_tree(&expected, &walk(&dest));
    assert_hard_link_extracted(&dest);
    std::fs::remove_dir_all(&dest).unwrap();
}

/// Data offsets of every non-empty regular file, through the library.
fn data_offsets(img: &Path) -> Vec<(String, u64)> {
    let fs = RomFs::open(img, &OpenOptions::default()).unwrap();
    let mut out = Vec::new();
    let mut stack = vec![(fs.root_inode(), String::new())];
    while let Some((d, path)) = stack.pop() {
        for e in fs.dir(d.ino).unwrap().entries() {
            let i = fs.inode(e.ino).unwrap();
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            match i.kind {
                FileType::Directory => stack.push((i, p)),
                FileType::RegularFile if i.size > 0 => out.push((p, i.data_offset)),
                _ => {}
            }
        }
    }
    out
}

#[test]
fn genromfs_images_with_and_without_alignment_match_the_source() {
    require!("root", "genromfs");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    every_type_tree(&src);
    // Over 100 MiB, not a multiple of 16 or of any block size.
    write_random_file(&src.join("huge.bin"), 101 * 1024 * 1024 + 13, 7);
    for extra in [&[][..], &["-a", "4096"][..]] {
        let img = t.path().join("img");
        genromfs(&src, &img, extra);
        check_image_against(&img, &src, t.path());
        if !extra.is_empty() {
            for (p, off) in data_offsets(&img) {
                assert_eq!(off % 4096, 0, "{p}: data at {off:#x} is not 4096-aligned");
            }
            let info = common::foliofs_ok([OsStr::new("info"), img.as_os_str()]);
            let info = String::from_utf8(info).unwrap();
            assert!(
                info.contains("data alignment:  4096 bytes"),
                "info shows the alignment found:\n{info}"
            );
        }
        let fsck = common::foliofs([OsStr::new("fsck"), img.as_os_str()]);
        assert!(
            fsck.status.success(),
            "fsck of a genromfs image {extra:?}: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
}

#[test]
fn genromfs_align_pattern_and_exclude() {
    require!("root", "genromfs");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    every_type_tree(&src);
    let img = t.path().join("img");
    genromfs(&src, &img, &["-A", "512,*.sh", "-x", "big", "-x", "deep"]);
    let offsets = data_offsets(&img);
    let (_, run) = offsets.iter().find(|(p, _)| p == "/run.sh").unwrap();
    assert_eq!(run % 512, 0, "run.sh data at {run:#x}");
    // The expected tree is the source without what -x dropped.
    let pruned = t.path().join("pruned");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&pruned)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_file(pruned.join("big")).unwrap();
    std::fs::remove_dir_all(pruned.join("deep")).unwrap();
    check_image_against(&img, &pruned, t.path());
}

#[test]
fn ls_long_and_cat_of_a_single_entry() {
    require!("root", "genromfs");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    every_type_tree(&src);
    let img = t.path().join("img");
    genromfs(&src, &img, &[]);
    let out = common::foliofs_ok([
        OsStr::new("ls"),
        OsStr::new("-l"),
        img.as_os_str(),
        OsStr::new("dev"),
    ]);
    let out = String::from_utf8(out).unwrap();
    let line = |name: &str| {
        out.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("{name} missing from:\n{out}"))
            .to_owned()
    };
    assert!(line("null").starts_with("crw------- "), "{out}");
    assert!(line("null").contains(" 1, 3 "), "{out}");
    assert!(line("sda1").starts_with("brw------- "), "{out}");
    assert!(line("fifo").starts_with("prw-r--r-- "), "{out}");
    assert!(line("socket").starts_with("srw-r--r-- "), "{out}");
    let out = common::foliofs_ok([
        OsStr::new("ls"),
        OsStr::new("-l"),
        img.as_os_str(),
        OsStr::new("link-rel"),
    ]);
    let out = String::from_utf8(out).unwrap();
    assert!(
        out.starts_with("lrwxrwxrwx ") && out.trim_end().ends_with("link-rel -> one"),
        "{out}"
    );
    let out = common::foliofs([OsStr::new("cat"), img.as_os_str(), OsStr::new("no/such")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    let out = common::foliofs([OsStr::new("cat"), img.as_os_str(), OsStr::new("deep")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
}
