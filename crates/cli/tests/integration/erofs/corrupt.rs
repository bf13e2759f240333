//! Damaged EROFS images: random bytes written over the superblock, inodes,
//! directory blocks, chunk tables, compression indexes, compressed data and
//! the packed inode's clusters (mkfs.erofs images, and the committed
//! corpus's for every algorithm, fragments, dedupe and compressed
//! directories), chosen deterministically. Every damaged image gives `foliofs fsck` a clear error
//! (or a clean bill when the bytes did not matter) within a bounded time and
//! memory, never a panic; mounted, the damaged files answer EIO and the
//! server keeps serving.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::{Erofs, Inode, Layout};
use foliofs_vfs::{FileSystem, FileType};
use rand::rngs::StdRng;
use rand::{Rng, RngCore};

/// Address space allowed to each checker run: far above what a sound reader
/// needs for these images, far below what an unbounded allocation would take.
const MEMORY_LIMIT: u64 = 1 << 30;

fn source(dir: &Path) {
    let mut rng = common::rng(77);
    for d in 0..4 {
        let sub = dir.join(format!("dir{d}"));
        fs::create_dir_all(&sub).unwrap();
        // Enough names that directories span several blocks.
        for i in 0..120 {
            let name = format!("entry-{i:04}-{}", "x".repeat(i % 40));
            let size = [0, 10, 3000, 5000, 70_000, 300_000][rng.gen_range(0..6) as usize];
            let data = if rng.gen_range(0..2) == 0 {
                common::random_bytes(&mut rng, size)
            } else {
                // Words in random order: compresses, but not to nothing.
                let mut v = Vec::with_capacity(size + 16);
                while v.len() < size {
                    let w = ["alpha ", "beta ", "gamma ", "delta ", "epsilon "]
                        [rng.gen_range(0..5) as usize];
                    v.extend_from_slice(w.as_bytes());
                    v.extend_from_slice(&common::random_bytes(&mut rng, 1));
                }
                v.truncate(size);
                v
            };
            fs::write(sub.join(&name), data).unwrap();
        }
        std::os::unix::fs::symlink("dir0/entry-0001-x", sub.join("link")).unwrap();
    }
    let c = std::ffi::CString::new(dir.join("dir0/entry-0002-xx").to_str().unwrap()).unwrap();
    let (n, v) = (c"user.note", b"some value");
    // SAFETY: valid NUL-terminated strings and a live buffer.
    unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
}

/// Byte ranges of the image, by what they hold.
#[derive(Default, Debug)]
struct Regions {
    inodes: Vec<(u64, u64)>,
    dir_blocks: Vec<(u64, u64)>,
    chunk_tables: Vec<(u64, u64)>,
    cluster_indexes: Vec<(u64, u64)>,
    compressed_data: Vec<(u64, u64)>,
    /// The packed inode's clusters (fragments, compressed directories).
    packed: Vec<(u64, u64)>,
}

fn regions(img: &Path) -> Regions {
    let fs = Erofs::open(img, &OpenOptions::default(), &[]).unwrap();
    let mut r = Regions::default();
    let mut stack = vec![fs.root()];
    let mut seen = std::collections::HashSet::new();
    while let Some(nid) = stack.pop() {
        if !seen.insert(nid) {
            continue;
        }
        let inode: Inode = fs.inode(nid).unwrap();
        r.inodes
            .push((inode.pos, inode.inode_size() + inode.xattr_size()));
        if let Some(range) = fs.index_range(&inode).unwrap() {
            match inode.layout {
                Layout::ChunkBased => r.chunk_tables.push(range),
                _ => r.cluster_indexes.push(range),
            }
        }
        for e in fs.extents(&inode).unwrap() {
            let Some((0, at)) = e.physical else { continue };
            if inode.kind == FileType::Directory {
                r.dir_blocks.push((at, e.physical_len));
            } else if e.compressed && !e.inline {
                r.compressed_data.push((at, e.physical_len));
            }
        }
        if inode.kind == FileType::Directory {
            fs.readdir(nid, 0, &mut |e| {
                stack.push(e.ino);
                false
            })
            .unwrap();
        }
    }
    let packed = fs.superblock().packed_nid;
    if packed != 0 {
        let inode = fs.inode(packed).unwrap();
        r.inodes
            .push((inode.pos, inode.inode_size() + inode.xattr_size()));
        for e in fs.extents(&inode).unwrap() {
            if let Some((0, at)) = e.physical {
                r.packed.push((at, e.physical_len));
            }
        }
    }
    r
}

/// Runs `foliofs fsck` on `img` with bounded time and memory and checks the
/// outcome: exit 0, or exit 1 with a message naming the damage.
fn fsck_bounded(img: &Path, what: &str) -> bool {
    let mut cmd = Command::new(common::bin());
    cmd.arg("fsck").arg(img);
    common::limit_address_space(&mut cmd, MEMORY_LIMIT);
    let out = common::run_timeout(&mut cmd, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("panicked"),
        "{what}: foliofs fsck panicked:\n{text}"
    );
    match out.status.code() {
        Some(0) => false,
        Some(1) => {
            let clear = [
                "corrupt image at offset 0x",
                "unsupported feature",
                "not a romfs or EROFS image",
                "I/O error at offset",
            ];
            assert!(
                clear.iter().any(|c| text.contains(c)),
                "{what}: unclear error:\n{text}"
            );
            true
        }
        _ => panic!("{what}: foliofs fsck ended with {}:\n{text}", out.status),
    }
}

/// Writes `count` random bytes at random places inside `range` of a copy of
/// `img`; returns the copy.
fn damage(img: &[u8], range: (u64, u64), count: usize, rng: &mut StdRng, out: &Path) -> PathBuf {
    let mut bytes = img.to_vec();
    let (start, len) = (range.0 as usize, (range.1 as usize).max(1));
    for _ in 0..count {
        let at = (start + rng.gen_range(0..len)).min(bytes.len() - 1);
        let old = bytes[at];
        let mut new = rng.next_u64() as u8;
        if new == old {
            new ^= 0xff;
        }
        bytes[at] = new;
    }
    fs::write(out, &bytes).unwrap();
    out.to_owned()
}

fn corpus(args: &[&str]) {
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-bad.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    source(&src);
    let img = tmp.path().join("good.erofs");
    common::mkfs_erofs(args, &img, &src);
    damage_corpus(&img, &format!("{args:?}"), tmp.path());
}

/// Damage of every class of region of `img`, 16 variants each, checked
/// with bounded `foliofs fsck` runs (and one mount per class).
fn damage_corpus(img: &Path, args: &str, tmp: &Path) {
    assert!(
        !fsck_bounded(img, "the undamaged image"),
        "good image reported damaged"
    );
    let good = fs::read(img).unwrap();
    let r = regions(img);
    let mut classes: Vec<(&str, Vec<(u64, u64)>)> =
        vec![("superblock", vec![(1024, 128)]), ("inode", r.inodes)];
    // Compressed directories are all in the packed inode.
    if !r.dir_blocks.is_empty() {
        classes.push(("directory block", r.dir_blocks));
    }
    if !r.chunk_tables.is_empty() {
        classes.push(("chunk table", r.chunk_tables));
    }
    if !r.cluster_indexes.is_empty() {
        classes.push(("lcluster index", r.cluster_indexes));
    }
    if !r.compressed_data.is_empty() {
        classes.push(("compressed data", r.compressed_data));
    }
    if !r.packed.is_empty() {
        classes.push(("packed inode data", r.packed));
    }
    let mut rng = common::rng(0xBAD_E20F5);
    let bad = tmp.join("bad.erofs");
    let mount = have!("fuse");
    let mut mounted_once = Vec::new();
    for (class, ranges) in &classes {
        let mut detected = 0;
        for v in 0..16 {
            let range = ranges[rng.gen_range(0..ranges.len())];
            let count = 1 + rng.gen_range(0..8) as usize;
            damage(&good, range, count, &mut rng, &bad);
            let what = format!("{args} {class} variant {v} ({count} bytes in {range:?})");
            if fsck_bounded(&bad, &what) {
                detected += 1;
                if mount && !mounted_once.contains(class) {
                    mounted_once.push(class);
                    walk_mounted_damage(&bad, &what);
                }
            }
        }
        eprintln!("{args}: {class}: {detected}/16 variants reported damage");
    }
}

/// Mounts a damaged image (when it opens at all) and reads every file with a
/// bounded child process: errors are fine, a hang or a dead server is not.
fn walk_mounted_damage(img: &Path, what: &str) {
    let Ok(m) = common::Mount::new(img, None, "") else {
        return;
    };
    let out = common::run_timeout(
        Command::new("sh").arg("-c").arg(
            "find . -type f -print0 | xargs -0 -r cat > /dev/null; find . -type l | xargs -r readlink > /dev/null; exit 0",
        ).current_dir(m.path()),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{what}: walk failed: {:?}", out);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        errors.is_empty()
            || errors.contains("Input/output error")
            || errors.contains("No such file"),
        "{what}: unexpected errors from a damaged mount:\n{errors}"
    );
    // The server still answers after serving the damage.
    assert!(
        fs::metadata(m.path()).unwrap().is_dir(),
        "{what}: mount died"
    );
    m.unmount().unwrap();
}

#[test]
fn damaged_plain_images() {
    require!("mkfs.erofs");
    corpus(&[]);
}

#[test]
fn damaged_lz4_big_pcluster_ztailpacking_images() {
    require!("mkfs.erofs");
    corpus(&["-zlz4hc", "-C65536", "-Eztailpacking"]);
}

#[test]
fn damaged_lz4_full_index_images() {
    require!("mkfs.erofs");
    corpus(&["-zlz4", "-Elegacy-compress"]);
}

#[test]
fn damaged_chunked_images() {
    require!("mkfs.erofs");
    corpus(&["--chunksize=8192"]);
}

/// Images of the committed corpus (mkfs.erofs 1.9.3): clusters of every
/// algorithm, fragments in the packed inode, deduplicated clusters and
/// compressed directories, damaged as above.
fn damaged_corpus_image(name: &str) {
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-bad.")
        .tempdir()
        .unwrap();
    let img = super::corpus::corpus().join(format!("{name}.erofs"));
    damage_corpus(&img, name, tmp.path());
}

#[test]
fn damaged_micro_lzma_images() {
    damaged_corpus_image("lzma_C64k");
}

#[test]
fn damaged_micro_lzma_fragment_images() {
    damaged_corpus_image("lzma_allfrag_1m");
}

#[test]
fn damaged_deflate_images() {
    damaged_corpus_image("deflate");
}

#[test]
fn damaged_zstd_images() {
    damaged_corpus_image("zstd_C64k");
}

#[test]
fn damaged_lz4_fragment_dedupe_images() {
    damaged_corpus_image("lz4_frag_dedupe");
}

#[test]
fn damaged_lz4hc_dedupe_images() {
    damaged_corpus_image("lz4hc_dedupe");
}

#[test]
fn damaged_compressed_directory_images() {
    damaged_corpus_image("zD_MZ");
}

/// Features foliofs does not read are refused with their names, before any
/// file is served.
#[test]
fn unsupported_features_are_named() {
    require!("mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-unsup.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(
        src.join("f"),
        b"words words words words words words ".repeat(2000),
    )
    .unwrap();
    let build = |name: &str, args: &[&str]| {
        let img = tmp.path().join(name);
        common::mkfs_erofs(args, &img, &src);
        fs::read(&img).unwrap()
    };
    let plain = build("plain.erofs", &[]);
    let lz4 = build("lz4.erofs", &["-zlz4hc", "-C65536"]);
    let sb = 1024;
    // (description, base image, superblock byte, bits set in it, words the
    // refusal must contain)
    let cases: [(&str, &Vec<u8>, usize, u8, &str); 3] = [
        (
            "the first bit past metabox",
            &plain,
            0x51,
            0x02,
            "unknown incompat feature bit 0x200",
        ),
        (
            "a future feature",
            &plain,
            0x53,
            0x40,
            "unknown incompat feature bit 0x40000000",
        ),
        (
            "an unknown compression algorithm",
            &lz4,
            0x54,
            0x10,
            "unknown algorithm 4 compression",
        ),
    ];
    for (what, base, at, bits, words) in cases {
        let mut bytes = base.clone();
        bytes[sb + at] |= bits;
        bytes[sb + 0x08] &= !1; // no superblock checksum to recompute
        let img = tmp.path().join("patched.erofs");
        fs::write(&img, &bytes).unwrap();
        let out = common::foliofs([OsStr::new("fsck"), img.as_os_str()]);
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {text}");
        assert!(
            text.contains("unsupported feature") && text.contains(words),
            "{what}: refusal does not name it: {text}"
        );
    }
}
