//! EROFS conformance: images built by mkfs.erofs from a tree of more than
//! 10,000 entries (xattrs including POSIX ACLs, hard links, devices, fifos,
//! sockets, long names, owners other than root, nanosecond mtimes) are
//! mounted by the kernel's own EROFS driver, file-backed (mount(2) on the
//! image file, no loop device), and compared field by field with the
//! foliofs library walked directly and with foliofs FUSE mounts (buffered
//! and O_DIRECT). fsck.erofs and `foliofs fsck` must agree. Images
//! compressed with MicroLZMA, DEFLATE and Zstd are built with erofs-utils
//! 1.9.3 (`../shared/tools/erofs-utils.sh`) and skipped without it.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::Erofs;
use foliofs_vfs::FileSystem;
use rand::seq::SliceRandom;
use rand::Rng;

use super::walk::{
    assert_same, getxattr, host_xattrs, listing_in_order, set_mtime, set_xattr, walk_library,
    walk_mounted, xattr_names_in_order, KernelMount, Tree,
};

/// The source tree: deterministic, built once into Cargo's scratch
/// directory for integration tests and reused while its marker says it is
/// complete.
fn source_tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let root = base.join("erofs-conformance-tree");
        let done = base.join("erofs-conformance-tree.v3.done");
        if !done.exists() {
            let _ = fs::remove_dir_all(&root);
            build_tree(&root);
            fs::write(&done, b"").unwrap();
        }
        root
    })
}

/// More than 10,000 entries of every kind EROFS stores.
fn build_tree(root: &Path) {
    let mut rng = common::rng(0xE70F5);
    fs::create_dir_all(root).unwrap();
    let mut count = 0usize;
    let mut dirs = Vec::new();
    for d in 0..40 {
        let dir = root.join(format!("d{d:02}")).join(format!("sub{}", d % 3));
        fs::create_dir_all(&dir).unwrap();
        dirs.push(dir.parent().unwrap().to_owned());
        dirs.push(dir);
        count += 2;
    }
    let mut last_files: Vec<PathBuf> = Vec::new();
    let mut i = 0u64;
    while count < 10_400 {
        let dir = &dirs[(i as usize * 7) % dirs.len()];
        let roll = rng.gen_range(0..100);
        let name = if i % 97 == 5 {
            // Long names: 254 bytes, the most mkfs.erofs 1.5 accepts (it
            // fails on 255-byte names, EROFS's own limit).
            let base = format!("long-{i}-");
            base.clone() + &"n".repeat(254 - base.len())
        } else {
            format!("e{i}")
        };
        let p = dir.join(&name);
        match roll {
            0..=59 => {
                let size = match rng.gen_range(0..20) {
                    0 => 0,
                    1..=12 => rng.gen_range(0..3000),
                    13..=17 => rng.gen_range(0..20_000),
                    18 => 4096 * (1 + rng.gen_range(0..4)),
                    _ => 60_000 + rng.gen_range(0..400_000),
                } as usize;
                let content = if rng.gen_range(0..2) == 0 {
                    common::random_bytes(&mut rng, size)
                } else {
                    let word = format!("word{} ", rng.gen_range(0..50));
                    word.as_bytes().iter().cycle().take(size).copied().collect()
                };
                fs::write(&p, content).unwrap();
                let perm =
                    [0o644, 0o600, 0o755, 0o4755, 0o2711, 0o444][rng.gen_range(0..6) as usize];
                fs::set_permissions(&p, fs::Permissions::from_mode(perm)).unwrap();
                last_files.push(p.clone());
            }
            60..=67 => {
                if let Some(t) = last_files.choose(&mut rng) {
                    fs::hard_link(t, &p).unwrap();
                } else {
                    fs::write(&p, b"x").unwrap();
                }
            }
            68..=79 => {
                let cap = if rng.gen_range(0..10) == 0 { 3000 } else { 60 };
                let len = 1 + rng.gen_range(0..cap) as usize;
                let target: String = (0..len).map(|k| (b'a' + (k % 26) as u8) as char).collect();
                std::os::unix::fs::symlink(target, &p).unwrap();
            }
            80..=83 => common::mknod(
                &p,
                libc::S_IFCHR | 0o620,
                rng.gen_range(0..300) as u32,
                rng.gen_range(0..70_000) as u32,
            )
            .unwrap(),
            84..=86 => {
                common::mknod(&p, libc::S_IFBLK | 0o660, 8, rng.gen_range(0..256) as u32).unwrap()
            }
            87..=90 => common::mknod(&p, libc::S_IFIFO | 0o644, 0, 0).unwrap(),
            // mknod makes sockets whatever the path length (bind has a limit).
            91 => common::mknod(&p, libc::S_IFSOCK | 0o755, 0, 0).unwrap(),
            _ => {
                fs::create_dir(&p).unwrap();
                fs::set_permissions(
                    &p,
                    fs::Permissions::from_mode(0o1777 & !(rng.gen_range(0..2) as u32 * 0o1000)),
                )
                .unwrap();
            }
        }
        // Owners other than root, some beyond 16 bits (extended inodes).
        if rng.gen_range(0..3) > 0 {
            let uid = [1000, 65534, 123_456, 1][rng.gen_range(0..4) as usize];
            let gid = [100, 50_000, 200_000][rng.gen_range(0..3) as usize];
            std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
        }
        // user.* attributes exist only on regular files and directories.
        let md = fs::symlink_metadata(&p).unwrap();
        let user_ok = md.is_file() || md.is_dir();
        if rng.gen_range(0..8) == 0 && user_ok {
            set_xattr(&p, &format!("user.k{}", rng.gen_range(0..5)), &{
                let n = rng.gen_range(0..100) as usize;
                common::random_bytes(&mut rng, n)
            });
        }
        if rng.gen_range(0..10) == 0 && !name.starts_with("long") {
            // Used by many inodes: mkfs puts it in the shared area.
            if user_ok {
                set_xattr(&p, "user.shared", b"one value for many inodes");
            }
            set_xattr(&p, "trusted.overlay.opaque", b"y");
        }
        if rng.gen_range(0..40) == 0 {
            let n = 1 + rng.gen_range(0..200) as usize;
            set_xattr(&p, "security.test", &common::random_bytes(&mut rng, n));
        }
        // POSIX ACLs (name indexes 2 and 3): user 1000 gets rw.
        if user_ok && rng.gen_range(0..30) == 0 {
            let name = if md.is_dir() && rng.gen_range(0..2) == 0 {
                "system.posix_acl_default"
            } else {
                "system.posix_acl_access"
            };
            set_xattr(&p, name, &acl(1000));
        }
        count += 1;
        i += 1;
    }
    // mtimes last (creating entries touches directory mtimes), with nanoseconds.
    let mut all = Vec::new();
    collect(root, &mut all);
    for (k, p) in all.iter().enumerate() {
        set_mtime(
            p,
            1_600_000_000 + (k as i64 * 7919) % 100_000_000,
            (k as i64 * 104_729) % 1_000_000_000,
        );
    }
    assert!(all.len() >= 10_000, "tree has only {} entries", all.len());
}

/// A POSIX ACL xattr value (version 2) giving `uid` read-write access.
fn acl(uid: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 6, uid),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            collect(&e.unwrap().path(), out);
        }
    }
    out.push(p.to_owned());
}

/// Builds the image with `args` (and a blob device when asked), then checks
/// kernel == library == FUSE mount, and the two fsck verdicts.
fn conformance(args: &[&str], blob: bool) {
    conformance_with(&Tools::installed(), args, blob);
}

/// The erofs-utils a conformance run builds and checks images with.
struct Tools {
    mkfs: PathBuf,
    fsck: PathBuf,
    /// fsck.erofs --extract is trustworthy (1.9.3's is not on every image).
    extract: bool,
}

impl Tools {
    /// The erofs-utils on PATH.
    fn installed() -> Tools {
        Tools {
            mkfs: "mkfs.erofs".into(),
            fsck: "fsck.erofs".into(),
            extract: true,
        }
    }

    /// erofs-utils 1.9.3 (which writes MicroLZMA, DEFLATE and Zstd);
    /// `None` (after a skip line naming `test`) when it cannot be had.
    fn v1_9_3(test: &str) -> Option<Tools> {
        let bin = super::erofs_utils_193(test)?;
        Some(Tools {
            mkfs: bin.join("mkfs.erofs"),
            fsck: bin.join("fsck.erofs"),
            extract: false,
        })
    }
}

fn conformance_with(tools: &Tools, args: &[&str], blob: bool) {
    conformance_checked(tools, args, blob, &|_| {});
}

/// [`conformance_with`], then `check` on the opened image (that it has the
/// layout the test is about).
fn conformance_checked(tools: &Tools, args: &[&str], blob: bool, check: &dyn Fn(&Erofs)) {
    let src = source_tree();
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-img.")
        .tempdir()
        .unwrap();
    let img = tmp.path().join("image.erofs");
    let blob_path = tmp.path().join("blob");
    let mut mkfs_args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if blob {
        mkfs_args.push(format!("--blobdev={}", blob_path.display()));
    }
    let out = common::run_timeout(
        Command::new(&tools.mkfs)
            .arg("--quiet")
            .args(&mkfs_args)
            .arg(&img)
            .arg(src),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "{} {mkfs_args:?}: {}",
        tools.mkfs.display(),
        String::from_utf8_lossy(&out.stderr)
    );

    let data = if blob {
        format!("device={}", blob_path.display())
    } else {
        String::new()
    };
    let mut kernel = {
        let km = KernelMount::new(&img, &data);
        walk_mounted(km.path())
    };
    assert!(kernel.len() > 10_000, "only {} entries", kernel.len());

    let devices = if blob {
        vec![blob_path.clone()]
    } else {
        vec![]
    };
    let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
    check(&fs);
    let library = walk_library(&fs);
    metabox_shared_xattrs(src, &fs, &mut kernel, &library);
    assert_same("library", &kernel, &library);

    // fsck.erofs and foliofs fsck agree on a good image.
    let mut fsck = Command::new(&tools.fsck);
    if blob {
        fsck.arg(format!("--device={}", blob_path.display()));
    }
    if tools.extract {
        fsck.arg("--extract");
    }
    let theirs = common::run_timeout(fsck.arg(&img), Duration::from_secs(600));
    assert!(
        theirs.status.success(),
        "fsck.erofs: {}",
        String::from_utf8_lossy(&theirs.stderr)
    );
    let report = fs.fsck();
    assert!(report.is_clean(), "library fsck: {:?}", report.errors);
    let mut ours = vec!["fsck".to_owned(), img.display().to_string()];
    if blob {
        ours.extend(["-o".into(), data.clone()]);
    }
    let o = common::run_timeout(
        Command::new(common::bin()).args(&ours),
        Duration::from_secs(600),
    );
    assert!(
        o.status.success(),
        "foliofs fsck: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    if have!("fuse") {
        // Buffered (the default) and O_DIRECT reads of the image must agree.
        for io in ["", "directio"] {
            let opts = [data.as_str(), io]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(",");
            let m = common::Mount::new(&img, None, &opts)
                .unwrap_or_else(|e| panic!("foliofs mount -o {opts}: {e}"));
            let fuse = walk_mounted(m.path());
            m.unmount().unwrap();
            assert_same(&format!("foliofs mount -o {opts:?}"), &kernel, &fuse);
        }
    }
}

#[test]
fn defaults() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&[], false);
}

#[test]
fn fixed_timestamp() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-T0"], false);
}

#[test]
fn lz4() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4"], false);
}

#[test]
fn lz4hc_big_pclusters() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4hc", "-C65536"], false);
}

#[test]
fn lz4hc_ztailpacking() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["-zlz4hc", "-Eztailpacking"], false);
}

#[test]
fn chunked() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["--chunksize=65536"], false);
}

#[test]
fn chunked_blobdev() {
    require!("root", "kernel-erofs", "mkfs.erofs", "fsck.erofs");
    conformance(&["--chunksize=65536"], true);
}

/// Images compressed with every algorithm Linux reads besides LZ4, as
/// erofs-utils 1.9.3 writes them.
fn codec_conformance(test: &str, args: &[&str]) {
    require!("root", "kernel-erofs");
    if let Some(tools) = Tools::v1_9_3(test) {
        conformance_with(&tools, args, false);
    }
}

#[test]
fn micro_lzma() {
    codec_conformance("micro_lzma", &["-zlzma"]);
}

#[test]
fn micro_lzma_big_pclusters() {
    codec_conformance("micro_lzma_big_pclusters", &["-zlzma", "-C65536"]);
}

#[test]
fn deflate() {
    codec_conformance("deflate", &["-zdeflate"]);
}

#[test]
fn zstd() {
    codec_conformance("zstd", &["-zzstd"]);
}

#[test]
fn zstd_big_pclusters() {
    codec_conformance("zstd_big_pclusters", &["-zzstd", "-C65536"]);
}

/// `INCOMPAT_METABOX`.
const METABOX: u32 = 0x100;

/// Linux 6.18 loses shared xattrs on metabox images: an inode in block N
/// of the metabox data does not show a shared xattr kept in block N of the
/// image (the kernel reuses the metadata buffer it just read the inode
/// through for the shared xattr; erofsfuse 1.9.3 does the same). foliofs
/// shows them. So on a metabox image, wherever the kernel's view differs
/// from the library's, the difference must be exactly that: xattrs only,
/// the library's equal to the source tree's, the kernel missing some, and
/// each missing one a shared xattr in the image block numbered like the
/// inode's metabox block. There, and only there, the kernel's view is
/// replaced by the source tree's before anything is compared with it.
/// Returns the paths where it was.
pub(super) fn metabox_shared_xattrs(
    src: &Path,
    fs: &Erofs,
    kernel: &mut Tree,
    library: &Tree,
) -> Vec<PathBuf> {
    let mut corrected = Vec::new();
    let sb = fs.superblock();
    if sb.feature_incompat & METABOX == 0 {
        return corrected;
    }
    let bs = u64::from(sb.block_size());
    for (path, k) in kernel.iter_mut() {
        let Some(l) = library.get(path) else {
            continue;
        };
        if k == l {
            continue;
        }
        let p = path.display();
        let mut only_xattrs = k.clone();
        only_xattrs.xattrs = l.xattrs.clone();
        assert_eq!(
            &only_xattrs, l,
            "{p}: differs from the kernel beyond xattrs"
        );
        assert_eq!(
            l.xattrs,
            host_xattrs(&src.join(path)),
            "{p}: library xattrs differ from the source tree's"
        );
        let nid = fs.nid_of(l.ino);
        assert_ne!(
            nid >> 63,
            0,
            "{p}: kernel loses xattrs of an inode outside the metabox"
        );
        let inode_block = ((nid & !(1 << 63)) * 32) / bs;
        let inode = fs.inode(nid).unwrap();
        let entries = fs.xattrs(&inode).unwrap();
        for (name, value) in &l.xattrs {
            if k.xattrs.get(name) == Some(value) {
                continue;
            }
            let e = entries.iter().find(|e| &e.name == name).unwrap();
            assert!(
                !k.xattrs.contains_key(name) && !e.in_metabox && e.value_pos / bs == inode_block,
                "{p}: {:?} differs from the kernel's otherwise than by its bug",
                String::from_utf8_lossy(name)
            );
        }
        k.xattrs = l.xattrs.clone();
        corrected.push(path.clone());
    }
    corrected
}

/// [`codec_conformance`], then `check` on the opened image.
fn codec_conformance_checked(test: &str, args: &[&str], check: &dyn Fn(&Erofs)) {
    require!("root", "kernel-erofs");
    if let Some(tools) = Tools::v1_9_3(test) {
        conformance_checked(&tools, args, false, check);
    }
}

/// `INCOMPAT_48BIT`.
const BITS48: u32 = 0x80;

fn has_48bit(fs: &Erofs) {
    assert_ne!(
        fs.superblock().feature_incompat & BITS48,
        0,
        "no 48bit feature"
    );
}

/// Every inode of the image, by nid (the packed and metabox inodes, which
/// no directory names, left out).
fn all_inodes(fs: &Erofs) -> Vec<foliofs_erofs::Inode> {
    let mut out = Vec::new();
    let mut stack = vec![fs.root()];
    let mut seen = std::collections::HashSet::new();
    while let Some(ino) = stack.pop() {
        if !seen.insert(ino) {
            continue;
        }
        let a = fs.getattr(ino).unwrap();
        if a.kind == foliofs_vfs::FileType::Directory {
            fs.readdir(ino, 0, &mut |e| {
                stack.push(e.ino);
                false
            })
            .unwrap();
        }
        out.push(fs.inode(fs.nid_of(ino)).unwrap());
    }
    out
}

/// 48-bit block addresses (uncompressed): compact inodes' mtimes are
/// 32-bit seconds after the superblock's epoch, all with one nanosecond
/// value, which is what the kernel shows and what is compared.
#[test]
fn bits48() {
    codec_conformance_checked("bits48", &["-E48bit"], &has_48bit);
}

/// Directories without "." entries (which implies 48bit).
#[test]
fn dot_omitted() {
    codec_conformance_checked("dot_omitted", &["-Edot-omitted"], &|fs| {
        has_48bit(fs);
        let root = fs.inode(fs.superblock().root_nid).unwrap();
        assert!(root.dot_omitted, "the root keeps its \".\"");
    });
}

/// 8-byte chunk indexes in a 48-bit image.
#[test]
fn bits48_chunk_indexes() {
    codec_conformance_checked(
        "bits48_chunk_indexes",
        &["--chunksize=8192", "-E48bit,force-chunk-indexes"],
        &|fs| {
            has_48bit(fs);
            assert!(
                all_inodes(fs)
                    .iter()
                    .any(|i| i.layout == foliofs_erofs::Layout::ChunkBased && i.i_u & 0x20 != 0),
                "no chunk indexes"
            );
        },
    );
}

/// Whether some file of the image is mapped by extent records (a full
/// layout whose map header has the EXTENTS advice) rather than lcluster
/// indexes.
fn any_extent_records(fs: &Erofs, image: &Path) -> bool {
    let bytes = fs::read(image).unwrap();
    all_inodes(fs).iter().any(|i| {
        let h = ((i.pos + i.inode_size() + i.xattr_size()).div_ceil(8) * 8) as usize;
        i.layout == foliofs_erofs::Layout::CompressedFull
            && bytes[h + 7] & 0x80 == 0
            && u16::from_le_bytes([bytes[h + 4], bytes[h + 5]]) & 1 != 0
    })
}

/// LZ4 in a 48-bit image: compact indexes, and extent records where
/// mkfs.erofs picks them.
#[test]
fn lz4_48bit() {
    codec_conformance_checked("lz4_48bit", &["-zlz4", "-E48bit"], &|fs| {
        has_48bit(fs);
        assert!(any_extent_records(fs, fs.path()), "no extent records");
    });
}

/// Zstd in a 48-bit image: extent records with byte-aligned clusters.
#[test]
fn zstd_48bit() {
    codec_conformance_checked("zstd_48bit", &["-zzstd", "-E48bit"], &|fs| {
        has_48bit(fs);
        assert!(any_extent_records(fs, fs.path()), "no extent records");
    });
}

/// Extent records with fragment tails and dedupe's partial records.
#[test]
fn zstd_48bit_fragments_dedupe() {
    codec_conformance_checked(
        "zstd_48bit_fragments_dedupe",
        &["-zzstd", "-C65536", "-E48bit,fragments,dedupe"],
        &|fs| {
            has_48bit(fs);
            assert!(any_extent_records(fs, fs.path()), "no extent records");
        },
    );
}

fn has_metabox(fs: &Erofs) {
    assert_ne!(fs.superblock().feature_incompat & METABOX, 0, "no metabox");
    assert_ne!(
        fs.superblock().root_nid >> 63,
        0,
        "the root is not in the metabox"
    );
}

/// Metadata compressed into a metabox inode (LZ4, 4 KiB clusters).
#[test]
fn metabox_lz4() {
    codec_conformance_checked("metabox_lz4", &["-zlz4", "-m4096"], &has_metabox);
}

/// A MicroLZMA metabox with every file kept in fragments.
#[test]
fn metabox_lzma_all_fragments() {
    codec_conformance_checked(
        "metabox_lzma_all_fragments",
        &["-zlzma", "-C65536", "-m4096", "-Eall-fragments"],
        &has_metabox,
    );
}

/// A Zstd metabox over LZ4 files: two algorithms in use.
#[test]
fn metabox_zstd_over_lz4() {
    codec_conformance_checked(
        "metabox_zstd_over_lz4",
        &["-zlz4", "-m4096:zstd"],
        &has_metabox,
    );
}

/// Every algorithm listed, each with its configuration record, while the
/// files use LZ4 only: the image must open and read.
#[test]
fn every_algorithm_listed() {
    codec_conformance("every_algorithm_listed", &["-zlz4:lzma:deflate:zstd"]);
}

// Layouts of erofs-utils 1.9.3 that change no feature bit the reader
// refuses but move structures around: blocks smaller than a page (every
// "must not cross a block" rule at 512, 1024, 2048 bytes), a metadata
// zone, the xattr name filter off and on, and images built from a tar,
// as a copy (tar=f) or as an index into the tar itself (tar=i).

#[test]
fn block_size_512() {
    require!("root", "kernel-erofs");
    codec_conformance("block_size_512", &["-b512"]);
}

#[test]
fn block_size_1024() {
    require!("root", "kernel-erofs");
    codec_conformance("block_size_1024", &["-b1024"]);
}

#[test]
fn block_size_2048() {
    require!("root", "kernel-erofs");
    codec_conformance("block_size_2048", &["-b2048"]);
}

#[test]
fn lz4_block_size_1024() {
    require!("root", "kernel-erofs");
    codec_conformance("lz4_block_size_1024", &["-zlz4", "-b1024"]);
}

#[test]
fn metadata_zone() {
    require!("root", "kernel-erofs");
    codec_conformance("metadata_zone", &["--MZ"]);
}

#[test]
fn lz4_metadata_zone() {
    require!("root", "kernel-erofs");
    codec_conformance("lz4_metadata_zone", &["-zlz4", "--MZ"]);
}

#[test]
fn xattr_name_filter_off() {
    require!("root", "kernel-erofs");
    codec_conformance("xattr_name_filter_off", &["-E^xattr-name-filter"]);
}

#[test]
fn xattr_name_filter_on() {
    require!("root", "kernel-erofs");
    codec_conformance("xattr_name_filter_on", &["-Exattr-name-filter"]);
}

#[test]
fn tar_copy() {
    require!("root", "kernel-erofs");
    tar_conformance("tar_copy", &["--tar=f"]);
}

#[test]
fn tar_copy_lz4hc_ztailpacking() {
    require!("root", "kernel-erofs");
    tar_conformance(
        "tar_copy_lz4hc_ztailpacking",
        &["--tar=f", "-zlz4hc", "-Eztailpacking"],
    );
}

/// Metadata only: every file's data stays in the tar, the image's device.
#[test]
fn tar_index() {
    require!("root", "kernel-erofs");
    tar_conformance("tar_index", &["--tar=i"]);
}

/// The source tree as a pax tar (with xattrs, ACLs and nanosecond mtimes;
/// sockets cannot be archived), made once beside the tree.
fn source_tar() -> &'static Path {
    static TAR: OnceLock<PathBuf> = OnceLock::new();
    TAR.get_or_init(|| {
        let src = source_tree();
        let tar = src.with_extension("v3.tar");
        if !tar.exists() {
            let part = src.with_extension("v3.tar.part");
            let out = common::run_timeout(
                Command::new("tar")
                    .arg("-C")
                    .arg(src)
                    .args([
                        "--create",
                        "--format=pax",
                        "--sort=name",
                        "--numeric-owner",
                        "--xattrs",
                        "--xattrs-include=*",
                        "--acls",
                        "--pax-option=delete=atime,delete=ctime",
                        "--file",
                    ])
                    .arg(&part)
                    .arg("."),
                Duration::from_secs(600),
            );
            // Exit 1 is tar's "some files were not archived": the sockets.
            assert!(
                matches!(out.status.code(), Some(0 | 1)),
                "tar: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            fs::rename(&part, &tar).unwrap();
        }
        tar
    })
}

/// [`conformance_with`] for an image built from the source tree's tar:
/// kernel == library == FUSE mounts, and both checks clean. A `--tar=i`
/// image keeps its data in the tar, given to each reader as its device.
fn tar_conformance(test: &str, args: &[&str]) {
    let Some(tools) = Tools::v1_9_3(test) else {
        return;
    };
    let tar = source_tar();
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-tar.")
        .tempdir()
        .unwrap();
    let img = tmp.path().join("image.erofs");
    super::run_mkfs_erofs(&tools.mkfs, args, &img, tar);
    let device = args.contains(&"--tar=i").then_some(tar);

    // The kernel's file-backed mount takes the device as a file too (it
    // refuses a loop device beside a file-backed image).
    let data = device.map_or(String::new(), |d| format!("device={}", d.display()));
    let kernel = {
        let km = KernelMount::new(&img, &data);
        walk_mounted(km.path())
    };
    // Everything but the sockets, which tar leaves out.
    assert!(kernel.len() > 10_000, "only {} entries", kernel.len());
    assert!(kernel.values().all(|n| n.kind != "sock"));

    let devices: Vec<PathBuf> = device.iter().map(|d| d.to_path_buf()).collect();
    let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
    assert_same("library", &kernel, &walk_library(&fs));
    let report = fs.fsck();
    assert!(report.is_clean(), "library fsck: {:?}", report.errors);

    let mut fsck = Command::new(&tools.fsck);
    if let Some(d) = device {
        fsck.arg(format!("--device={}", d.display()));
    }
    let theirs = common::run_timeout(fsck.arg(&img), Duration::from_secs(600));
    assert!(
        theirs.status.success(),
        "fsck.erofs: {}",
        String::from_utf8_lossy(&theirs.stderr)
    );
    let mut ours = Command::new(common::bin());
    ours.arg("fsck").arg(&img);
    if device.is_some() {
        ours.args(["-o", &data]);
    }
    let o = common::run_timeout(&mut ours, Duration::from_secs(600));
    assert!(
        o.status.success(),
        "foliofs fsck: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    if have!("fuse") {
        for io in ["", "directio"] {
            let opts = [data.as_str(), io]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(",");
            let m = common::Mount::new(&img, None, &opts)
                .unwrap_or_else(|e| panic!("foliofs mount -o {opts}: {e}"));
            let fuse = walk_mounted(m.path());
            m.unmount().unwrap();
            assert_same(&format!("foliofs mount -o {opts:?}"), &kernel, &fuse);
        }
    }
}

/// Long xattr name prefixes (which mkfs.erofs 1.5 cannot write): an image is
/// patched to move one attribute's name onto a long prefix, and the kernel,
/// the library and a foliofs mount must all show the same new name.
#[test]
fn long_xattr_prefixes() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-lp.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), b"data of a").unwrap();
    fs::write(src.join("b"), b"data of b").unwrap();
    set_xattr(&src.join("a"), "user.foo", b"bar");
    set_xattr(&src.join("b"), "user.keep", b"1");
    set_xattr(&src.join("d"), "trusted.t", b"2");
    let img = tmp.path().join("image.erofs");
    common::mkfs_erofs(&["-T0"], &img, &src);

    let mut bytes = fs::read(&img).unwrap();
    let entry_index_at = {
        let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let nid = e.lookup(e.root(), OsStr::new("a")).unwrap().ino;
        let inode = e.inode(nid).unwrap();
        let body = (inode.pos + inode.inode_size()) as usize;
        assert_eq!(bytes[body + 4], 0, "user.foo should be inline, not shared");
        let entry = body + 12;
        assert_eq!(&bytes[entry..entry + 2], &[3, 1], "inline entry user.foo");
        entry + 1
    };
    // Prefix 0 = "user." + "long.prefix.", in unused space of block 0.
    let table = 2048usize;
    assert!(bytes[table..table + 64].iter().all(|&b| b == 0));
    let infix = b"long.prefix.";
    bytes[table..table + 2].copy_from_slice(&(1 + infix.len() as u16).to_le_bytes());
    bytes[table + 2] = 1;
    bytes[table + 3..table + 3 + infix.len()].copy_from_slice(infix);
    bytes[entry_index_at] = 0x80;
    let sb = 1024;
    let incompat = u32::from_le_bytes(bytes[sb + 0x50..sb + 0x54].try_into().unwrap()) | 0x40;
    bytes[sb + 0x50..sb + 0x54].copy_from_slice(&incompat.to_le_bytes());
    bytes[sb + 0x5B] = 1;
    bytes[sb + 0x5C..sb + 0x60].copy_from_slice(&((table / 4) as u32).to_le_bytes());
    // The superblock changed: drop its checksum rather than recompute it.
    // The name changed too, so the name filter (a bloom filter over each
    // inode's names, which newer mkfs.erofs writes) would be stale, and the
    // kernel would trust it and find no such attribute: drop its flag.
    bytes[sb + 0x08] &= !(1 | 0x4);
    fs::write(&img, &bytes).unwrap();

    let kernel = {
        let km = KernelMount::new(&img, "");
        walk_mounted(km.path())
    };
    let a = &kernel[Path::new("a")];
    assert_eq!(
        a.xattrs.keys().collect::<Vec<_>>(),
        [&b"user.long.prefix.foo".to_vec()],
        "the kernel does not see the long prefix: the patch is wrong"
    );
    let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    assert_same("library", &kernel, &walk_library(&e));
    if have!("fuse") {
        let m = common::Mount::new(&img, None, "").unwrap();
        let fuse = walk_mounted(m.path());
        m.unmount().unwrap();
        assert_same("foliofs mount", &kernel, &fuse);
    }
}

/// Chunk holes (which mkfs.erofs 1.5 never writes: it shares one zero
/// block instead): block map entries patched to the null address must read
/// as zeros, as the kernel reads them.
#[test]
fn chunk_holes_read_as_zeros() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-holes.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let mut rng = common::rng(4);
    let mut data = common::random_bytes(&mut rng, 20 * 4096 + 123);
    // Chunk 1 repeats chunk 0, so its entry points back at chunk 0's block.
    // Without a break in the data's run, mkfs.erofs 1.8 and later would
    // merge the chunks into one whatever --chunksize says, and there would
    // be no per-4 KiB entries to make holes of.
    data.copy_within(..4096, 4096);
    fs::write(src.join("f"), data).unwrap();
    let img = tmp.path().join("image.erofs");
    common::mkfs_erofs(&["-T0", "--chunksize=4096"], &img, &src);
    let mut bytes = fs::read(&img).unwrap();
    let (table, len) = {
        let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let nid = e.lookup(e.root(), OsStr::new("f")).unwrap().ino;
        e.index_range(&e.inode(nid).unwrap()).unwrap().unwrap()
    };
    assert_eq!(len, 21 * 4, "a 4-byte block map entry per chunk");
    // Chunks 3..=6 (adjacent holes) and the last, partial one.
    for chunk in [3u64, 4, 5, 6, 20] {
        let at = (table + 4 * chunk) as usize;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    }
    // The table may share block 0 with the superblock, whose checksum
    // covers it: drop the checksum rather than recompute it.
    bytes[1024 + 0x08] &= !1;
    fs::write(&img, &bytes).unwrap();

    let kernel_seeks;
    let kernel = {
        let km = KernelMount::new(&img, "");
        kernel_seeks = seeks(&km.path().join("f"));
        // The kernel reports the holes (else this comparison proves nothing).
        assert!(kernel_seeks.contains(&(libc::SEEK_HOLE, 0, Ok(3 * 4096))));
        assert!(kernel_seeks.contains(&(libc::SEEK_DATA, 13_000, Ok(7 * 4096))));
        let content = fs::read(km.path().join("f")).unwrap();
        assert!(content[3 * 4096..7 * 4096].iter().all(|&b| b == 0));
        assert!(content[20 * 4096..].iter().all(|&b| b == 0));
        assert!(content[..4096].iter().any(|&b| b != 0));
        walk_mounted(km.path())
    };
    let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    assert_same("library", &kernel, &walk_library(&e));
    if have!("fuse") {
        let m = common::Mount::new(&img, None, "").unwrap();
        let fuse = walk_mounted(m.path());
        let fuse_seeks = seeks(&m.path().join("f"));
        m.unmount().unwrap();
        assert_same("foliofs mount", &kernel, &fuse);
        assert_eq!(fuse_seeks, kernel_seeks, "SEEK_DATA/SEEK_HOLE answers");
    }
}

/// `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)` from every 1000th offset:
/// the offset found, or the errno.
type Seek = (i32, i64, Result<i64, i32>);

fn seeks(path: &Path) -> Vec<Seek> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
        for off in (0..size + 2000).step_by(1000) {
            // SAFETY: a valid open descriptor; lseek touches no memory.
            let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
            let r = if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap())
            } else {
                Ok(r)
            };
            out.push((whence, off, r));
        }
    }
    out
}

/// A tree for what a walk does not compare: names that sort before "."
/// (so the dots of a sorted directory sit inside its listing, not at its
/// front), a directory of several blocks with the dots in its middle, and
/// files with both inline and shared xattrs.
fn order_tree(root: &Path) {
    fs::create_dir_all(root.join("+plus")).unwrap();
    for name in [
        "!bang",
        "#hash",
        "-leading-dash",
        "Z",
        "~tilde",
        "+plus/,comma",
    ] {
        fs::write(root.join(name), name.as_bytes()).unwrap();
    }
    let big = root.join("big");
    fs::create_dir(&big).unwrap();
    for i in 0..300 {
        fs::write(big.join(format!("-before-the-dots-{i:03}")), b"").unwrap();
        fs::write(big.join(format!("after-the-dots-{i:03}")), b"").unwrap();
    }
    let sub = root.join("sub");
    fs::create_dir(&sub).unwrap();
    for i in 0..10 {
        let f = sub.join(format!("x{i}"));
        fs::write(&f, b"x").unwrap();
        // Used by every file, so mkfs.erofs shares them; the others are
        // each file's own and stay inline.
        set_xattr(&f, "user.shared", b"one value for every file");
        set_xattr(&f, "trusted.shared", b"y");
        set_xattr(&f, "user.own", format!("file {i}").as_bytes());
        set_xattr(&f, "security.own", format!("{i}").as_bytes());
    }
    set_xattr(&root.join("Z"), "user.only", b"inline");
}

/// Every path of the tree mounted at `root`, with `f`'s answer for it.
fn per_path<T>(root: &Path, f: &dyn Fn(&Path, &Path) -> T) -> BTreeMap<PathBuf, T> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        out.insert(rel.clone(), f(&rel, &p));
    }
    out
}

/// Builds [`order_tree`]'s image with `tools` and `args`, and returns the
/// image's path (in `tmp`) after checking that the tree shows what it is
/// for: the kernel lists a dot after other names, and an inode keeps
/// xattrs both inline and shared.
fn order_image(tmp: &Path, tools: &Tools, args: &[&str]) -> PathBuf {
    let src = tmp.join("src");
    order_tree(&src);
    let img = tmp.join("image.erofs");
    let out = common::run_timeout(
        Command::new(&tools.mkfs)
            .arg("--quiet")
            .args(args)
            .arg(&img)
            .arg(&src),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        tools.mkfs.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let first = {
        let km = KernelMount::new(&img, "");
        listing_in_order(km.path()).first().cloned()
    };
    assert_ne!(
        first.as_deref(),
        Some(&b"."[..]),
        "the root's listing starts with \".\": the tree does not test the dots' place"
    );
    let bytes = fs::read(&img).unwrap();
    let e = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let sub = e.lookup(e.root(), OsStr::new("sub")).unwrap();
    let x0 = e.lookup(sub.ino, OsStr::new("x0")).unwrap();
    let inode = e.inode(e.nid_of(x0.ino)).unwrap();
    let body = (inode.pos + inode.inode_size()) as usize;
    let shared = u64::from(bytes[body + 4]);
    assert!(
        shared > 0 && inode.xattr_size() > 12 + 4 * shared,
        "sub/x0 keeps {shared} shared xattrs in a {}-byte body: not both kinds",
        inode.xattr_size()
    );
    img
}

/// `f`'s answers for every path through the kernel's mount of `img` and
/// through a foliofs mount of it, which must be equal; the kernel's.
/// Without FUSE, only the kernel's.
fn same_as_kernel<T: PartialEq + std::fmt::Debug>(
    img: &Path,
    what: &str,
    f: &dyn Fn(&Path, &Path) -> T,
) -> BTreeMap<PathBuf, T> {
    let kernel = {
        let km = KernelMount::new(img, "");
        per_path(km.path(), f)
    };
    if have!("fuse") {
        let m = common::Mount::new(img, None, "").unwrap();
        let fuse = per_path(m.path(), f);
        m.unmount().unwrap();
        let mut diffs = Vec::new();
        for (path, want) in &kernel {
            let have = fuse.get(path);
            if have != Some(want) {
                diffs.push(format!(
                    "{what} of {path:?}:\n  kernel  {want:?}\n  foliofs {have:?}"
                ));
            }
        }
        let n = diffs.len();
        diffs.truncate(10);
        assert!(
            n == 0,
            "a foliofs mount differs from the kernel in {n} place(s):\n{}",
            diffs.join("\n")
        );
    }
    kernel
}

/// Names as text, for messages.
fn names(list: Vec<Vec<u8>>) -> Vec<String> {
    list.into_iter()
        .map(|n| String::from_utf8_lossy(&n).into_owned())
        .collect()
}

/// listxattr(2) lists an inode's inline xattrs first, then its shared
/// ones, as the kernel does.
#[test]
fn xattr_order() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-order.")
        .tempdir()
        .unwrap();
    let img = order_image(tmp.path(), &Tools::installed(), &[]);
    same_as_kernel(&img, "listxattr", &|_, p| names(xattr_names_in_order(p)));
}

/// Names whose getxattr(2) answer depends on who handles their namespace:
/// EROFS handles `user.`, `trusted.`, `security.` and the two POSIX ACL
/// names, and a bare prefix is no name.
const XATTR_PROBES: &[&str] = &[
    "system.foo",
    "lustre.lov",
    "foo",
    "user.",
    "trusted.",
    "security.",
    "user.missing",
    "trusted.missing",
    "security.missing",
    "user.shared",
    "user.own",
    "system.posix_acl_access",
    "system.posix_acl_default",
    "system.posix_acl_accessX",
];

/// getxattr(2) answers (value or errno) for names in no namespace EROFS
/// handles, bare prefixes, and names that are or are not there, as the
/// kernel gives them.
#[test]
fn xattr_namespaces() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-ns.")
        .tempdir()
        .unwrap();
    let img = order_image(tmp.path(), &Tools::installed(), &[]);
    let kernel = same_as_kernel(&img, "getxattr", &|rel, p| {
        if rel.starts_with("big") {
            return Vec::new();
        }
        XATTR_PROBES
            .iter()
            .map(|&name| (name, getxattr(p, name)))
            .collect::<Vec<_>>()
    });
    let root = &kernel[Path::new("")];
    assert!(
        root.contains(&("system.foo", Err(libc::EOPNOTSUPP))),
        "the kernel does not refuse system.foo: {root:?}"
    );
}

/// readdir(3) order, "." and ".." included: where they are among a
/// directory's sorted entries, as the kernel lists them, in a one-block
/// directory and in one of several blocks, read in several requests.
#[test]
fn listing_order() {
    require!("root", "kernel-erofs", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-ls.")
        .tempdir()
        .unwrap();
    let img = order_image(tmp.path(), &Tools::installed(), &[]);
    same_as_kernel(&img, "readdir", &|_, p| {
        p.is_dir().then(|| names(listing_in_order(p)))
    });
}

/// The same for directories that keep no "." entry (`-Edot-omitted`): the
/// kernel lists "." after every entry they keep.
#[test]
fn listing_order_dot_omitted() {
    require!("root", "kernel-erofs");
    let Some(tools) = Tools::v1_9_3("listing_order_dot_omitted") else {
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-ls.")
        .tempdir()
        .unwrap();
    let img = order_image(tmp.path(), &tools, &["-Edot-omitted"]);
    let kernel = same_as_kernel(&img, "readdir", &|_, p| {
        p.is_dir().then(|| names(listing_in_order(p)))
    });
    for (dir, listed) in kernel.iter().filter_map(|(d, l)| Some((d, l.as_ref()?))) {
        assert_eq!(
            listed.last().map(String::as_str),
            Some("."),
            "{dir:?}: the kernel lists \".\" elsewhere than last"
        );
    }
}
