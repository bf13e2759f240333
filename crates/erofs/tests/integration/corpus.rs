//! Every layout mkfs.erofs 1.9.3 writes, from the committed corpus: each
//! image's full walk through the library (attributes, inode numbers, xattrs,
//! data hashes, link targets, directory listings and lookups) equals its
//! manifest, and the library's check finds nothing. Needs nothing beside
//! the repository: no erofs-utils, no root.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use foliofs_block::{BlockSizeChoice, OpenOptions};
use foliofs_erofs::Erofs;
use foliofs_vfs::{FileSystem, FileType, Scratch};
use sha2::{Digest, Sha256};

use crate::manifest::{self, Entry, Manifest, Walk};

pub fn corpus() -> &'static Path {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest::corpus_dir(
        &crate_dir.join("tests/data/erofs-1.9/corpus.tar.xz"),
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    )
}

fn load(name: &str) -> Manifest {
    let path = corpus().join(format!("{name}.manifest"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    manifest::parse(&text)
}

/// The library's walk, in the manifest's terms; every listed entry is also
/// looked up by name and must agree with the listing.
pub fn walk_library(fs: &Erofs) -> Walk {
    let mut out = Walk::new();
    let mut stack = vec![(String::from("/"), fs.root())];
    let mut scratch = Scratch::new();
    while let Some((path, ino)) = stack.pop() {
        let a = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("getattr {path}: {e}"));
        let (mut sha256, mut target) = (None, None);
        match a.kind {
            FileType::RegularFile => {
                let mut h = Sha256::new();
                let mut off = 0u64;
                loop {
                    // An odd size, so reads straddle blocks, chunks and extents.
                    let got = fs
                        .read(ino, off, 77_777, &mut scratch)
                        .unwrap_or_else(|e| panic!("read {path} at {off}: {e}"));
                    if got.is_empty() {
                        break;
                    }
                    h.update(got);
                    off += got.len() as u64;
                }
                assert_eq!(off, a.size, "{path}: bytes read");
                sha256 = Some(format!("{:x}", h.finalize()));
            }
            FileType::Symlink => {
                target = Some(
                    fs.readlink(ino)
                        .unwrap_or_else(|e| panic!("readlink {path}: {e}")),
                )
            }
            FileType::Directory => {
                let mut children = Vec::new();
                fs.readdir(ino, 0, &mut |e| {
                    children.push((e.name.to_owned(), e.ino, e.kind));
                    false
                })
                .unwrap_or_else(|e| panic!("readdir {path}: {e}"));
                for (name, child, kind) in children {
                    let found = fs
                        .lookup(ino, &name)
                        .unwrap_or_else(|e| panic!("lookup {name:?} in {path}: {e}"));
                    assert_eq!(
                        (found.ino, found.kind),
                        (child, kind),
                        "{path}: lookup of {name:?} disagrees with readdir"
                    );
                    let sep = if path == "/" { "" } else { "/" };
                    stack.push((format!("{path}{sep}{}", name.to_string_lossy()), child));
                }
            }
            _ => {}
        }
        let mut xattrs = std::collections::BTreeMap::new();
        for n in fs
            .listxattr(ino)
            .unwrap_or_else(|e| panic!("listxattr {path}: {e}"))
        {
            let v = fs
                .getxattr(ino, OsStr::from_bytes(&n))
                .unwrap_or_else(|e| panic!("getxattr {path} {n:?}: {e}"));
            xattrs.insert(n, v);
        }
        out.insert(
            path,
            Entry {
                kind: a.kind.short_name().to_owned(),
                mode: a.mode(),
                uid: a.uid,
                gid: a.gid,
                nlink: u64::from(a.nlink),
                size: a.size,
                mtime: (a.mtime.sec, a.mtime.nsec),
                ino: a.ino,
                rdev: (a.rdev.major, a.rdev.minor),
                sha256,
                target,
                xattrs,
            },
        );
    }
    out
}

fn check(name: &str) {
    let dir = corpus();
    let m = load(name);
    let img = dir.join(&m.image);
    let devices: Vec<PathBuf> = m.device.iter().map(|d| dir.join(d)).collect();
    // The cache's block size is the mount's choice, not the image's: the
    // image's own, and one far larger, must read the same.
    for bs in [BlockSizeChoice::Default, BlockSizeChoice::Fixed(1 << 20)] {
        let opts = OpenOptions {
            block_size: bs,
            ..OpenOptions::default()
        };
        let fs = Erofs::open(&img, &opts, &devices)
            .unwrap_or_else(|e| panic!("{name} ({}): open: {e}", m.mkfs));
        let diffs = manifest::differences(&m, &walk_library(&fs));
        let n = diffs.len();
        assert!(
            n == 0,
            "{name} ({}), cache blocks {bs:?}: {n} difference(s) from the manifest \
             (its notes: {:?}):\n{}",
            m.mkfs,
            m.notes,
            diffs[..n.min(20)].join("\n")
        );
        let report = fs.fsck();
        assert!(report.is_clean(), "{name}: fsck: {:#?}", report.errors);
    }
}

macro_rules! images {
    ($($name:ident),* $(,)?) => {
        const ALL: &[&str] = &[$(stringify!($name)),*];
        #[allow(non_snake_case)]
        mod image {
            $(
                #[test]
                fn $name() {
                    // A name cannot start with a digit: `_48bit` is 48bit.
                    super::check(stringify!($name).trim_start_matches('_'));
                }
            )*
        }
    };
}

// One test per image of the corpus (`every_image_has_a_test` keeps this
// list and the archive together).
images! {
    plain, lz4, lz4hc_tail, lz4hc_C64k, lzma, lzma_C64k, deflate, zstd, zstd_C64k,
    mixed_cfgs, lz4_frag_dedupe, lz4_allfrag, lz4hc_fragdedupe_full, lz4hc_dedupe,
    lzma_allfrag_1m, zD, zD_MZ, MZ, b512, b1024, b2048, lz4_b1024, xattr_prefix,
    xattr_prefix_frag, no_xattr_filter, tar_f, tar_f_lz4hc_tail, tar_i, chunk_16k,
    chunk_blob, _48bit, _48bit_lz4, _48bit_zstd, _48bit_zstd_frag, dot_omitted,
    chunk_48bit, metabox, metabox_lzma, metabox_mixed,
}

#[test]
fn every_image_has_a_test() {
    let in_archive: Vec<String> = manifest::manifests(corpus()).into_keys().collect();
    let mut tested: Vec<String> = ALL
        .iter()
        .map(|n| n.trim_start_matches('_').to_owned())
        .collect();
    tested.sort();
    assert_eq!(tested, in_archive);
}

/// The fuzzer's seeds of the layouts Debian's mkfs.erofs cannot write
/// (`seeds/` of the corpus, which `scripts/fuzz-erofs` starts from) are
/// sound images within its input limit: each reads whole and checks clean.
#[test]
fn fuzz_seeds_read_clean() {
    let dir = corpus().join("seeds");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let img = e.unwrap().path();
        let len = std::fs::metadata(&img).unwrap().len();
        assert!(len <= 32 << 10, "{}: {len} bytes", img.display());
        let fs = Erofs::open(&img, &OpenOptions::default(), &[])
            .unwrap_or_else(|e| panic!("{}: {e}", img.display()));
        let walk = walk_library(&fs);
        assert!(walk.len() > 30, "{}: {} entries", img.display(), walk.len());
        let report = fs.fsck();
        assert!(report.is_clean(), "{}: {:#?}", img.display(), report.errors);
        n += 1;
    }
    assert!(n >= 8, "{n} seeds");
}
