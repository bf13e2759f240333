//! Images built for a test: romfs by the project's own builder, EROFS
//! by mkfs.erofs.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::run_timeout;

/// Builds the romfs image `img` of the tree `src` with the project's own
/// builder and its defaults (no outside tool needed).
pub fn build_romfs(src: &Path, img: &Path) {
    foliofs_romfs::mkfs::build(
        src,
        img,
        &foliofs_romfs::mkfs::MkfsOptions::default(),
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("building {}: {e}", img.display()));
}

/// A romfs image `f.romfs` in `dir` of a tree `src` holding one file, `f`:
/// for tests about a mount rather than its contents.
pub fn one_file_romfs(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"hi\n").unwrap();
    let img = dir.join("f.romfs");
    build_romfs(&src, &img);
    img
}

/// Builds `img` from `src` with `mkfs.erofs --quiet ARGS` (bounded),
/// panicking with its stderr if it fails.
pub fn mkfs_erofs<S: AsRef<OsStr>>(args: &[S], img: &Path, src: &Path) {
    mkfs_erofs_with(Path::new("mkfs.erofs"), args, img, src);
}

/// As [`mkfs_erofs`], with the mkfs.erofs at `mkfs` (erofs-utils 1.9.3's,
/// say).
pub fn mkfs_erofs_with<S: AsRef<OsStr>>(mkfs: &Path, args: &[S], img: &Path, src: &Path) {
    let out = run_timeout(
        Command::new(mkfs)
            .arg("--quiet")
            .args(args)
            .arg(img)
            .arg(src),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "{} {:?}: {}",
        mkfs.display(),
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}
