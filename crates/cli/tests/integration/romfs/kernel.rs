//! The Linux romfs driver (in a VM) as the oracle: it must read every image
//! `mkfs` builds exactly as it reads genromfs's image of the same tree
//! (inode numbers aside), and the library must report exactly the
//! attributes the kernel shows for each image, inode numbers included.

use crate::common;

use std::path::Path;

use super::util::{genromfs, library_walk, mkfs, without_ino};
use common::every_type_tree;
use foliofs_block::{BlockSizeChoice, OpenOptions};

/// The fixture tree plus what only matters to the kernel's view: a
/// directory without exec bits, an exec file deeper down, a hard link across
/// directories.
fn tree(src: &Path) {
    every_type_tree(src);
    let d = src.join("noexec-dir");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("inside"), b"inside\n").unwrap();
    let tool = src.join("deep/level0/tool");
    std::fs::write(&tool, b"#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::hard_link(src.join("one"), d.join("one-again")).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn kernel_walk(img: &Path) -> String {
    common::oracle::kernel_walk(img)
}

#[test]
fn kernel_reads_mkfs_images_as_it_reads_genromfs_images_and_the_library_agrees() {
    require!("root", "genromfs", "romfs-vm");
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    tree(&src);
    let cases: [(&str, &[&str], &[&str]); 2] = [
        ("plain", &[], &[]),
        ("aligned", &["-a", "4096"], &["--align", "4096"]),
    ];
    for (what, g, m) in cases {
        let gi = t.path().join(format!("{what}.genromfs"));
        let mi = t.path().join(format!("{what}.mkfs"));
        genromfs(&src, &gi, g);
        mkfs(&src, &mi, m);
        let kg = kernel_walk(&gi);
        let km = kernel_walk(&mi);
        assert!(
            kg.lines().count() > 40,
            "kernel walk of {what} genromfs image:\n{kg}"
        );
        assert!(!kg.contains(" ERROR"), "{kg}");
        assert_eq!(
            without_ino(&km),
            without_ino(&kg),
            "{what}: the kernel reads the mkfs image as it reads genromfs's"
        );
        for (img, kernel) in [(&gi, &kg), (&mi, &km)] {
            for bs in [
                BlockSizeChoice::Default,
                BlockSizeChoice::LargeBlocks,
                BlockSizeChoice::Fixed(65536),
            ] {
                let opts = OpenOptions {
                    block_size: bs,
                    ..OpenOptions::default()
                };
                let lib = library_walk(img, &opts);
                assert_eq!(
                    &lib,
                    kernel,
                    "{}: library ({bs:?}) vs kernel",
                    img.display()
                );
            }
        }
    }
}
