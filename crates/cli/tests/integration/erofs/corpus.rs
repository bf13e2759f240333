//! The committed EROFS corpus (`crates/erofs/tests/data/erofs-1.9`, every
//! layout mkfs.erofs 1.9.3 writes) through foliofs mounts: a handful of its
//! images, one per kind of layout, mounted with `foliofs mount` and walked
//! with the system calls a user makes, must read as their manifests say.
//! The library test of the same corpus reads every image; this one checks
//! the FUSE layer passes all of it through (inode numbers included). Needs
//! root and /dev/fuse, nothing beside the repository.

use crate::common;

use std::path::Path;

// The EROFS library's own tests read the corpus through the same module.
#[path = "../../../../erofs/tests/integration/manifest.rs"]
#[allow(dead_code)]
mod manifest;

use manifest::{Entry, Walk};

use super::walk::walk_mounted;

pub(super) fn corpus() -> &'static Path {
    manifest::corpus_dir(
        &common::workspace_root().join("crates/erofs/tests/data/erofs-1.9/corpus.tar.xz"),
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    )
}

/// Mounts the image `name` (with its device, if it has one) and compares
/// the walk with its manifest.
fn mounted_reads_as_manifest(name: &str, extra_opts: &str) {
    reads_as_manifest(name, extra_opts, false);
}

/// As [`mounted_reads_as_manifest`]; with `relative`, the image and its
/// device are named relative to the corpus directory, which the mount
/// command runs in.
fn reads_as_manifest(name: &str, extra_opts: &str, relative: bool) {
    let dir = corpus();
    let m =
        manifest::parse(&std::fs::read_to_string(dir.join(format!("{name}.manifest"))).unwrap());
    let named = |p: &str| {
        if relative {
            Path::new(p).to_owned()
        } else {
            dir.join(p)
        }
    };
    let opts: Vec<String> = m
        .device
        .iter()
        .map(|d| format!("device={}", named(d).display()))
        .chain((!extra_opts.is_empty()).then(|| extra_opts.to_owned()))
        .collect();
    let opts = opts.join(",");
    let mount = if relative {
        let tmp = tempfile::Builder::new()
            .prefix("foliofs-mnt.")
            .tempdir()
            .unwrap();
        let mut cmd = std::process::Command::new(common::bin());
        cmd.current_dir(dir)
            .args(["mount", "-o", &opts])
            .arg(&m.image)
            .arg(tmp.path());
        common::Mount::by_command(None, &mut cmd, tmp.path()).map(|m| m.keeping(tmp))
    } else {
        common::Mount::new(&named(&m.image), None, &opts)
    }
    .unwrap_or_else(|e| panic!("foliofs mount -o {opts:?} {name} ({}): {e}", m.mkfs));
    let walk = walk_mounted(mount.path());
    mount.unmount().unwrap();
    let got: Walk = walk
        .into_iter()
        .map(|(rel, n)| {
            let path = format!("/{}", rel.display());
            let entry = Entry {
                kind: n.kind.to_owned(),
                mode: n.mode,
                uid: n.uid,
                gid: n.gid,
                nlink: n.nlink,
                size: n.size,
                mtime: (n.mtime.0, n.mtime.1 as u32),
                ino: n.ino,
                rdev: n.rdev,
                sha256: n.sha256,
                target: n.target,
                xattrs: n.xattrs,
            };
            (path, entry)
        })
        .collect();
    let diffs = manifest::differences(&m, &got);
    let n = diffs.len();
    assert!(
        n == 0,
        "{name} ({}) mounted with -o {opts:?}: {n} difference(s) from the manifest \
         (its notes: {:?}):\n{}",
        m.mkfs,
        m.notes,
        diffs[..n.min(20)].join("\n")
    );
}

#[test]
fn plain() {
    require!("fuse");
    mounted_reads_as_manifest("plain", "");
}

#[test]
fn plain_direct_io() {
    require!("fuse");
    mounted_reads_as_manifest("plain", "directio");
}

#[test]
fn sub_page_blocks() {
    require!("fuse");
    mounted_reads_as_manifest("b512", "");
    mounted_reads_as_manifest("lz4_b1024", "");
}

#[test]
fn every_algorithm() {
    require!("fuse");
    for name in ["lz4hc_tail", "lzma_C64k", "deflate", "zstd_C64k"] {
        mounted_reads_as_manifest(name, "");
    }
}

#[test]
fn fragments_dedupe_and_compressed_directories() {
    require!("fuse");
    for name in [
        "lzma_allfrag_1m",
        "lz4hc_dedupe",
        "zD_MZ",
        "xattr_prefix_frag",
    ] {
        mounted_reads_as_manifest(name, "");
    }
}

#[test]
fn extra_devices() {
    require!("fuse");
    mounted_reads_as_manifest("tar_i", "");
    mounted_reads_as_manifest("chunk_blob", "");
}

/// The mount's server runs from `/`: an image and a device named relative
/// to where `foliofs mount` ran must still be found.
#[test]
fn relative_paths_name_files_where_the_mount_ran() {
    require!("fuse");
    reads_as_manifest("chunk_blob", "", true);
}

/// 48-bit addresses, the extent map, omitted "." entries and metabox inodes,
/// whose inode numbers are the kernel's mapping of their nids: the mount's
/// `st_ino` must be the one the manifest took from the kernel.
#[test]
fn forty_eight_bit_and_metabox() {
    require!("fuse");
    for name in [
        "48bit_zstd_frag",
        "dot_omitted",
        "chunk_48bit",
        "metabox_lzma",
        "metabox_mixed",
    ] {
        mounted_reads_as_manifest(name, "");
    }
}
