//! EROFS layouts that mkfs.erofs 1.5 cannot write, built with mkfs.erofs
//! 1.9.3 (`../shared/tools/erofs-utils.sh`): fragments and the packed inode,
//! dedupe (partial references), compressed directories and long xattr
//! prefixes stored in the packed inode or plain. Each image is mounted by
//! the kernel's own EROFS driver and compared field by field with the
//! foliofs library walked directly and with foliofs FUSE mounts (buffered
//! and O_DIRECT); fsck.erofs 1.9.3 and `foliofs fsck` must agree.
//!
//! Without erofs-utils 1.9.3 (a clone with no `../shared`) each test says
//! so on one line and passes.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::superblock::{COMPAT_SB_CHKSUM, SUPER_OFFSET};
use foliofs_erofs::{Corrupt, Erofs, Layout};
use foliofs_vfs::{FileSystem, FileType, Scratch};
use rand::Rng;

use super::conformance::metabox_shared_xattrs;
use super::walk::{assert_same, set_mtime, set_xattr, walk_library, walk_mounted, KernelMount};

/// Words for compressible text.
const WORDS: &[&str] = &[
    "erofs",
    "fragment",
    "packed",
    "inode",
    "cluster",
    "dedupe",
    "prefix",
    "block",
    "extent",
    "the",
    "of",
    "and",
    "a",
    "compressed",
    "directory",
    "lookup",
    "tail",
];

fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = common::rng(seed);
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
        v.push(if rng.gen_range(0..12) == 0 {
            b'\n'
        } else {
            b' '
        });
    }
    v.truncate(len);
    v
}

/// The source tree: deterministic, built once into Cargo's scratch
/// directory and reused while its marker says it is complete.
fn source_tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let root = base.join("erofs-layouts-tree");
        let done = base.join("erofs-layouts-tree.v3.done");
        if !done.exists() {
            let _ = fs::remove_dir_all(&root);
            build_tree(&root);
            fs::write(&done, b"").unwrap();
        }
        root
    })
}

/// Files of many sizes (text and random, so both compressed and plain
/// clusters), files sharing a long run (dedupe, also as a prefix of
/// another's cluster), a directory of many blocks, symlinks (one long),
/// hard links, special files, long-prefix xattr candidates, a shared xattr,
/// nanosecond mtimes.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("many")).unwrap();
    fs::create_dir_all(root.join("nested/deeper/deepest")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    for (i, len) in [
        0usize, 1, 12, 100, 4095, 4096, 4097, 65659, 300_000, 1_500_000,
    ]
    .into_iter()
    .enumerate()
    {
        fs::write(root.join(format!("text_{len}")), text(len, i as u64)).unwrap();
    }
    for (i, len) in [3000u64, 70_000, 262_145].into_iter().enumerate() {
        common::write_random_file(&root.join(format!("rand_{len}")), len, 100 + i as u64);
    }
    let mut mixed = text(200_000, 7);
    mixed.extend(common::random_bytes(&mut common::rng(8), 50_000));
    mixed.extend(text(33_333, 9));
    fs::write(root.join("mixed"), &mixed).unwrap();
    // Dedupe: one long shared run, whole and cut short, behind different
    // heads.
    let shared = text(262_144, 11);
    let mut a = shared.clone();
    a.extend(text(10_000, 12));
    let mut b = text(5000, 13);
    b.extend(&shared);
    let mut c = shared[..100_000].to_vec();
    c.extend(text(7_878, 14));
    fs::write(root.join("dup_a"), &a).unwrap();
    fs::write(root.join("dup_b"), &b).unwrap();
    fs::write(root.join("dup_c"), &c).unwrap();
    fs::write(root.join("nested/deeper/dup_a_again"), &a).unwrap();
    fs::write(root.join("zeros"), vec![0u8; 1 << 20]).unwrap();
    for i in 0..400 {
        let len = (i * 37) % 3000;
        fs::write(
            root.join(format!("many/entry_with_a_longish_name_{i:04}")),
            text(len, 1000 + i as u64),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("text_100", root.join("link_rel")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", root.join("link_abs")).unwrap();
    std::os::unix::fs::symlink("nested", root.join("link_dir")).unwrap();
    let long_target = "long/".repeat(360) + "end";
    std::os::unix::fs::symlink(&long_target, root.join("link_long")).unwrap();
    fs::hard_link(root.join("text_4096"), root.join("nested/hard_4096")).unwrap();
    fs::hard_link(root.join("dup_c"), root.join("many/hard_dup_c")).unwrap();
    common::mknod(&root.join("fifo"), libc::S_IFIFO | 0o644, 0, 0).unwrap();
    common::mknod(&root.join("null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
    common::mknod(&root.join("loop"), libc::S_IFBLK | 0o660, 7, 0).unwrap();
    for i in 0..5 {
        set_xattr(
            &root.join(format!("text_{}", [1, 12, 100, 4095, 4096][i])),
            &format!("user.com.example.project.attribute.number{i}"),
            format!("value {i}").as_bytes(),
        );
    }
    for (i, d) in ["nested", "nested/deeper", "empty"].into_iter().enumerate() {
        set_xattr(&root.join(d), &format!("trusted.overlay.opaque{i}"), b"y");
    }
    for f in ["dup_a", "dup_b", "mixed", "many"] {
        set_xattr(&root.join(f), "user.shared", b"one value, many inodes");
    }
    // An inline xattr beside the shared one (what Linux 6.18's metabox
    // bug needs, see `metabox_shared_xattrs`).
    set_xattr(&root.join("dup_a"), "user.dup", b"a");
    set_xattr(&root.join("rand_3000"), "user.big", &vec![b'x'; 3000]);
    set_xattr(&root.join("text_0"), "user.empty", b"");
    fs::set_permissions(root.join("text_12"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::lchown(root.join("text_1"), Some(123_456), Some(654_321)).unwrap();
    set_mtime(&root.join("text_100"), 0, 0);
    set_mtime(&root.join("text_4097"), 4_070_908_800, 123_456_789);
    set_mtime(&root.join("dup_c"), 1_700_000_000, 999_999_999);
}

/// Builds the image with `mkfs.erofs` 1.9.3 (in `bin`) and `args`, then
/// checks kernel == library == FUSE mounts, and the two fsck verdicts.
/// Returns the image (and the directory holding it) for checks of its
/// layout.
fn layouts(bin: &Path, args: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (t, img, _) = layouts_kernel_bug(bin, args);
    (t, img)
}

/// [`layouts`], also returning the paths where the kernel's view was
/// corrected for its metabox shared-xattr bug
/// ([`metabox_shared_xattrs`]).
fn layouts_kernel_bug(bin: &Path, args: &[&str]) -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
    let src = source_tree();
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-layouts.")
        .tempdir()
        .unwrap();
    let img = tmp.path().join("image.erofs");
    super::run_mkfs_erofs(&bin.join("mkfs.erofs"), args, &img, src);

    let mut kernel = {
        let km = KernelMount::new(&img, "");
        walk_mounted(km.path())
    };
    assert!(kernel.len() > 400, "only {} entries", kernel.len());

    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let library = walk_library(&fs);
    let corrected = metabox_shared_xattrs(src, &fs, &mut kernel, &library);
    assert_same("library", &kernel, &library);

    // fsck.erofs and foliofs fsck agree on a good image. (fsck.erofs
    // 1.9.3's --extract misreads images with a packed inode, so only its
    // check runs.)
    let theirs = common::run_timeout(
        Command::new(bin.join("fsck.erofs")).arg(&img),
        Duration::from_secs(600),
    );
    assert!(
        theirs.status.success(),
        "fsck.erofs: {}",
        String::from_utf8_lossy(&theirs.stderr)
    );
    let report = fs.fsck();
    assert!(report.is_clean(), "library fsck: {:?}", report.errors);
    let o = common::run_timeout(
        Command::new(common::bin()).arg("fsck").arg(&img),
        Duration::from_secs(600),
    );
    assert!(
        o.status.success(),
        "foliofs fsck: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );

    if have!("fuse") {
        for opts in ["", "directio"] {
            let m = common::Mount::new(&img, None, opts)
                .unwrap_or_else(|e| panic!("foliofs mount -o {opts}: {e}"));
            let fuse = walk_mounted(m.path());
            m.unmount().unwrap();
            assert_same(&format!("foliofs mount -o {opts:?}"), &kernel, &fuse);
        }
    }
    (tmp, img, corrected)
}

/// The image's superblock feature words (compat, incompat).
fn features(img: &Path) -> (u32, u32) {
    let fs = Erofs::open(img, &OpenOptions::default(), &[]).unwrap();
    let sb = fs.superblock();
    (sb.feature_compat, sb.feature_incompat)
}

/// Whether some file of the image keeps data in a fragment.
fn any_fragment(img: &Path) -> bool {
    let fs = Erofs::open(img, &OpenOptions::default(), &[]).unwrap();
    let mut stack = vec![fs.root()];
    while let Some(ino) = stack.pop() {
        let inode = fs.inode(fs.nid_of(ino)).unwrap();
        if inode.layout.is_compressed()
            && fs
                .extents(&inode)
                .unwrap()
                .iter()
                .any(|e| e.fragment.is_some())
        {
            return true;
        }
        if inode.kind == FileType::Directory {
            fs.readdir(ino, 0, &mut |e| {
                stack.push(e.ino);
                false
            })
            .unwrap();
        }
    }
    false
}

const FRAGMENTS: u32 = 0x20;

#[test]
fn lz4_fragments() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(&bin, &["-zlz4", "-Efragments"]);
    assert_ne!(features(&img).1 & FRAGMENTS, 0);
    assert!(any_fragment(&img), "no file uses a fragment");
}

#[test]
fn lz4_all_fragments() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(&bin, &["-zlz4", "-Eall-fragments"]);
    assert!(any_fragment(&img), "no file uses a fragment");
}

#[test]
fn lz4_fragments_dedupe() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    layouts(&bin, &["-zlz4", "-Efragments,dedupe"]);
}

#[test]
fn lz4_dedupe() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(&bin, &["-zlz4", "-Ededupe"]);
    assert_ne!(features(&img).1 & FRAGMENTS, 0);
}

#[test]
fn lz4hc_dedupe_big_pclusters() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    layouts(&bin, &["-zlz4hc", "-C16384", "-Ededupe"]);
}

#[test]
fn lz4hc_all_fragments_fragdedupe_1m() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(
        &bin,
        &["-zlz4hc", "-Eall-fragments,fragdedupe=inode", "-C1048576"],
    );
    assert!(any_fragment(&img), "no file uses a fragment");
}

/// Extent records (48-bit images) with fragment tails and dedupe's
/// partial records, over the files sharing long runs.
#[test]
fn zstd_48bit_extents_fragments_dedupe() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(&bin, &["-zzstd", "-C65536", "-E48bit,fragments,dedupe"]);
    assert_ne!(features(&img).1 & 0x80, 0, "no 48bit feature");
    assert!(any_fragment(&img), "no file uses a fragment");
}

/// Metadata in a metabox. `dup_a`'s inode is in the first block of the
/// metabox data and has an inline xattr besides the shared `user.shared`,
/// which sits in the image's first block: Linux 6.18 reads that block
/// through the buffer still holding the metabox's first block and does
/// not show `user.shared` there. foliofs must show it (the compare checks
/// it against the source tree); on 6.18 the kernel's difference is
/// expected, on other kernels it may be gone.
#[test]
fn metabox_shared_xattrs_against_linux_6_18() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img, corrected) = layouts_kernel_bug(&bin, &["-zlz4", "-m4096"]);
    assert_eq!(features(&img).1 & 0x100, 0x100, "no metabox");
    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let dup_a = fs.lookup(fs.root(), OsStr::new("dup_a")).unwrap().ino;
    let value = fs.getxattr(dup_a, OsStr::new("user.shared")).unwrap();
    assert_eq!(value, b"one value, many inodes");
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if release.starts_with("6.18.") {
        assert!(
            corrected.contains(&PathBuf::from("dup_a")),
            "Linux {} shows dup_a's shared xattr: its metabox bug is gone \
             (corrected: {corrected:?})",
            release.trim()
        );
    }
}

/// Metadata in a metabox, with long xattr prefixes (whose table is then
/// in the metabox too).
#[test]
fn metabox_long_prefixes() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(
        &bin,
        &[
            "-zlz4",
            "-m4096",
            "--xattr-prefix=user.com.example.project.",
            "--xattr-prefix=trusted.overlay.",
        ],
    );
    let (compat, incompat) = features(&img);
    assert_eq!(compat & 0x10, 0, "prefixes stored plain");
    assert_eq!(incompat & 0x140, 0x140, "no metabox or no long prefixes");
}

#[test]
fn lz4_compressed_directories() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(&bin, &["-zlz4", "--zD"]);
    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let many = fs.lookup(fs.root(), OsStr::new("many")).unwrap().ino;
    let layout = fs.inode(many).unwrap().layout;
    assert!(
        matches!(layout, Layout::CompressedFull | Layout::CompressedCompact),
        "/many is {layout:?}, not compressed"
    );
}

#[test]
fn lz4_ztailpacking_fragments() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    layouts(&bin, &["-zlz4", "-Eztailpacking,fragments"]);
}

#[test]
fn long_prefixes_in_packed_inode() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(
        &bin,
        &[
            "-zlz4",
            "-Efragments",
            "--xattr-prefix=user.com.example.project.",
            "--xattr-prefix=trusted.overlay.",
        ],
    );
    let (compat, incompat) = features(&img);
    assert_eq!(compat & 0x10, 0, "prefixes stored plain");
    assert_ne!(incompat & 0x40, 0, "no long prefixes");
}

#[test]
fn long_prefixes_plain_with_fragments() {
    require!("root", "kernel-erofs");
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img) = layouts(
        &bin,
        &[
            "-zlz4",
            "-Efragments,plain-xattr-prefixes",
            "--xattr-prefix=user.com.example.project.",
        ],
    );
    assert_ne!(features(&img).0 & 0x10, 0, "prefixes not stored plain");
}

/// A small all-fragments image of `f` (whole-file fragment) and `g`,
/// with its bytes (superblock checksum dropped, so the damage made is the
/// only one), `f`'s nid and the packed inode.
fn fragment_image(bin: &Path) -> (tempfile::TempDir, PathBuf, Vec<u8>, u64) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), text(10_000, 1)).unwrap();
    fs::write(src.join("g"), text(30_000, 2)).unwrap();
    let img = t.path().join("img");
    let out = Command::new(bin.join("mkfs.erofs"))
        .args(["--quiet", "-zlz4", "-Eall-fragments"])
        .arg(&img)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let nid = fs.lookup(fs.root(), OsStr::new("f")).unwrap().ino;
    let mut bytes = fs::read(&img).unwrap();
    bytes[SUPER_OFFSET as usize + 8] &= !(COMPAT_SB_CHKSUM as u8);
    (t, img, bytes, nid)
}

/// Where the compression map header of an inode sits.
fn map_header(fs: &Erofs, nid: u64) -> usize {
    let inode = fs.inode(nid).unwrap();
    assert!(inode.layout.is_compressed(), "nid {nid} is not compressed");
    ((inode.pos + inode.inode_size() + inode.xattr_size()).div_ceil(8) * 8) as usize
}

#[test]
fn a_fragment_past_the_packed_inode_is_corruption_of_its_file() {
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img, mut bytes, nid) = fragment_image(&bin);
    let (inode, packed_size, h) = {
        let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let packed = fs.inode(fs.superblock().packed_nid).unwrap();
        (fs.inode(nid).unwrap(), packed.size, map_header(&fs, nid))
    };
    let word = u64::from_le_bytes(bytes[h..h + 8].try_into().unwrap());
    assert_ne!(word >> 63, 0, "f is not a whole-file fragment");
    let offset = packed_size - 100;
    bytes[h..h + 8].copy_from_slice(&(offset | 1 << 63).to_le_bytes());
    fs::write(&img, &bytes).unwrap();

    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let e = fs.read(nid, 0, 4096, &mut Scratch::new()).unwrap_err();
    assert_eq!(e.offset(), Some(inode.pos));
    assert_eq!(
        e.corruption::<Corrupt>(),
        Some(&Corrupt::FragmentOutOfPacked {
            nid,
            offset,
            len: inode.size,
            packed_size,
        })
    );
    let r = fs.fsck();
    assert_eq!(r.errors.len(), 1, "{:#?}", r.errors);
    assert_eq!(r.errors[0].path.as_deref(), Some("/f"));
    assert!(matches!(
        r.errors[0].error.corruption::<Corrupt>(),
        Some(Corrupt::FragmentOutOfPacked { .. })
    ));
}

#[test]
fn a_packed_inode_with_fragments_of_its_own_is_corrupt() {
    let Some(bin) = erofs_utils_193!() else {
        return;
    };
    let (_t, img, mut bytes, nid) = fragment_image(&bin);
    let (packed_nid, h) = {
        let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
        let packed_nid = fs.superblock().packed_nid;
        (packed_nid, map_header(&fs, packed_nid))
    };
    bytes[h + 7] |= 0x80;
    fs::write(&img, &bytes).unwrap();

    let fs = Erofs::open(&img, &OpenOptions::default(), &[]).unwrap();
    let e = fs.read(nid, 0, 4096, &mut Scratch::new()).unwrap_err();
    assert_eq!(e.offset(), Some(h as u64));
    assert_eq!(
        e.corruption::<Corrupt>(),
        Some(&Corrupt::PackedInodeFragment { nid: packed_nid })
    );
    let r = fs.fsck();
    assert!(!r.errors.is_empty());
    assert!(
        r.errors.iter().all(|d| matches!(
            d.error.corruption::<Corrupt>(),
            Some(Corrupt::PackedInodeFragment { .. })
        )),
        "{:#?}",
        r.errors
    );
    assert!(r
        .errors
        .iter()
        .any(|d| d.path.as_deref() == Some("<packed inode>")));
}
