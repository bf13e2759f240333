//! Damage inside one physical cluster of each algorithm, of a compressed
//! directory, and of the packed inode (where fragments live), in images of
//! the committed corpus: reading what it holds fails as corruption of that
//! cluster, at its position and for its extent, within bounded time; the
//! check reports it with the path it was met at. Never a panic, a hang or
//! a wrong answer.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use foliofs_block::OpenOptions;
use foliofs_erofs::{Corrupt, Erofs, Extent};
use foliofs_vfs::{CheckReport, Error, FileSystem, Scratch};

/// Far more than any of these reads takes; a hang fails the case.
const LIMIT: Duration = Duration::from_secs(60);

/// `f` on a thread of its own, failing `what` if it has not answered
/// within [`LIMIT`] (or panicked).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT)
        .unwrap_or_else(|e| panic!("{what}: no answer within {LIMIT:?} ({e})"))
}

fn lookup_path(fs: &Erofs, path: &str) -> Result<u64, Error> {
    let mut ino = fs.root();
    for name in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(ino, OsStr::new(name))?.ino;
    }
    Ok(ino)
}

/// The first cluster of `path` stored compressed on the image itself.
fn first_pcluster(fs: &Erofs, nid: u64) -> Extent {
    let inode = fs.inode(nid).unwrap();
    let all = fs.extents(&inode).unwrap();
    all.iter()
        .find(|e| e.compressed && !e.inline && matches!(e.physical, Some((0, _))))
        .cloned()
        .unwrap_or_else(|| panic!("inode {nid} has no compressed cluster on the image: {all:?}"))
}

/// How to break the first bytes of a stream of each algorithm so that no
/// decoder can take it for a valid one (the data starts at the cluster's
/// first nonzero byte: clusters are right-aligned behind zeros).
#[derive(Clone, Copy, Debug)]
enum Breakage {
    /// A literal run longer than the cluster.
    Lz4,
    /// MicroLZMA keeps the inverted properties byte first: 0x01 stands for
    /// properties 254, above the 224 that exist.
    MicroLzma,
    /// Block type 3, which DEFLATE reserves.
    Deflate,
    /// Not the Zstandard frame magic.
    Zstd,
}

fn break_stream(bytes: &mut [u8], at: u64, len: u64, how: Breakage) {
    let cluster = &mut bytes[at as usize..(at + len) as usize];
    let start = cluster
        .iter()
        .position(|&b| b != 0)
        .expect("a cluster of zeros");
    let s = &mut cluster[start..];
    match how {
        Breakage::Lz4 => {
            let n = s.len().min(16);
            s[..n].fill(0xff)
        }
        Breakage::MicroLzma => s[0] = 0x01,
        Breakage::Deflate => s[0] = 0xff,
        Breakage::Zstd => s[..4].copy_from_slice(b"\xffbad"),
    }
}

/// A damaged copy of corpus image `name`: the first compressed cluster of
/// `path` (or, when its data is a fragment, the packed inode's cluster that
/// holds it; or the packed inode's first when `path` is `None`) broken as
/// `how`. Returns the copy, the cluster's extent, whether it is the packed
/// inode's, and the image's devices.
fn damaged(
    name: &str,
    path: Option<&str>,
    how: Breakage,
    tmp: &Path,
) -> (PathBuf, Extent, bool, Vec<PathBuf>) {
    let dir = crate::corpus::corpus();
    let m = crate::manifest::parse(
        &std::fs::read_to_string(dir.join(format!("{name}.manifest"))).unwrap(),
    );
    let img = dir.join(&m.image);
    let devices: Vec<PathBuf> = m.device.iter().map(|d| dir.join(d)).collect();
    let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
    let packed = fs.superblock().packed_nid;
    let (ext, in_packed) = match path {
        Some(p) => {
            let inode = fs.inode(lookup_path(&fs, p).unwrap()).unwrap();
            match fs.extents(&inode).unwrap()[0].fragment {
                None => (first_pcluster(&fs, inode.nid), false),
                Some(off) => {
                    let packed = fs.inode(packed).unwrap();
                    let all = fs.extents(&packed).unwrap();
                    let holder = all
                        .into_iter()
                        .find(|e| e.logical <= off && off < e.logical + e.length)
                        .unwrap();
                    assert!(holder.compressed && !holder.inline, "{holder:?}");
                    (holder, true)
                }
            }
        }
        None => {
            assert_ne!(packed, 0, "{name} has no packed inode");
            (first_pcluster(&fs, packed), true)
        }
    };
    let Some((0, at)) = ext.physical else {
        panic!("{name}: {ext:?} is not on the image")
    };
    let mut bytes = std::fs::read(&img).unwrap();
    break_stream(&mut bytes, at, ext.physical_len, how);
    let out = tmp.join(format!("{name}.erofs"));
    std::fs::write(&out, &bytes).unwrap();
    (out, ext, in_packed, devices)
}

/// The error names the broken cluster: corruption at its position, a
/// decoding failure of its extent.
fn names_the_cluster(e: &Error, at: u64, la: u64) -> bool {
    e.offset() == Some(at)
        && matches!(e.corruption::<Corrupt>(), Some(Corrupt::Decompress { la: l, .. }) if *l == la)
}

/// Reads all of `path` (a file) or lists it (a directory) in the damaged
/// copy, and checks the whole image.
fn case(name: &str, path: &str, how: Breakage) {
    let tmp = tempfile::tempdir().unwrap();
    let (img, ext, in_packed, devices) = damaged(name, Some(path), how, tmp.path());
    let Some((_, at)) = ext.physical else {
        unreachable!()
    };
    let what = format!("{name} {path}: {how:?} damage in the cluster at {at:#x}");
    let p = path.to_owned();
    let devs = devices.clone();
    let read = bounded(&what, move || {
        let fs = Erofs::open(&img, &OpenOptions::default(), &devs).unwrap();
        // Damage to a compressed directory may already stop the lookup.
        let ino = match lookup_path(&fs, &p) {
            Ok(ino) => ino,
            Err(e) => return Some(e),
        };
        let a = match fs.getattr(ino) {
            Ok(a) => a,
            Err(e) => return Some(e),
        };
        if a.kind == foliofs_vfs::FileType::Directory {
            return fs.readdir(ino, 0, &mut |_| false).err();
        }
        let mut scratch = Scratch::new();
        let mut off = 0;
        loop {
            match fs.read(ino, off, 1 << 17, &mut scratch) {
                Ok([]) => return None,
                Ok(got) => off += got.len() as u64,
                Err(e) => return Some(e),
            }
        }
    });
    let e = read.unwrap_or_else(|| panic!("{what}: read without an error"));
    assert!(
        names_the_cluster(&e, at, ext.logical),
        "{what}: wrong error: {e}"
    );
    // A packed cluster is met first at whichever path's fragment it holds.
    let met_at = (!in_packed).then_some(path);
    check_reports(
        &what,
        tmp.path().join(format!("{name}.erofs")),
        devices,
        at,
        met_at,
    );
}

/// The full check lists the broken cluster (at `path` when given).
fn check_reports(what: &str, img: PathBuf, devices: Vec<PathBuf>, at: u64, path: Option<&str>) {
    let report = bounded(what, move || {
        let fs = Erofs::open(&img, &OpenOptions::default(), &devices).unwrap();
        fs.fsck()
    });
    let hit = report.defects().iter().find(|d| d.offset() == Some(at));
    let d = hit.unwrap_or_else(|| panic!("{what}: the check misses it: {:#?}", report.errors));
    assert!(
        matches!(
            d.error.corruption::<Corrupt>(),
            Some(Corrupt::Decompress { .. })
        ),
        "{what}: the check says {}",
        d.error
    );
    if let Some(p) = path {
        assert_eq!(d.path.as_deref(), Some(p), "{what}: the check's path");
    }
}

#[test]
fn lz4_cluster() {
    case("lz4hc_C64k", "/prose_1m", Breakage::Lz4);
}

#[test]
fn lz4_cluster_with_sub_page_blocks() {
    case("lz4_b1024", "/text_70000", Breakage::Lz4);
}

#[test]
fn micro_lzma_cluster() {
    case("lzma", "/prose_1m", Breakage::MicroLzma);
    case("lzma_C64k", "/mixed_140k", Breakage::MicroLzma);
}

#[test]
fn deflate_cluster() {
    case("deflate", "/prose_1m", Breakage::Deflate);
}

#[test]
fn zstd_cluster() {
    case("zstd", "/prose_1m", Breakage::Zstd);
    case("zstd_C64k", "/mixed_140k", Breakage::Zstd);
}

/// Every algorithm listed, LZ4 used.
#[test]
fn cluster_of_an_image_listing_every_algorithm() {
    case("mixed_cfgs", "/prose_1m", Breakage::Lz4);
}

/// A cluster two files share (dedupe): both fail, each at it.
#[test]
fn deduplicated_cluster() {
    case("lz4hc_dedupe", "/dup_b", Breakage::Lz4);
}

/// Compressed directories live in the packed inode.
#[test]
fn compressed_directory_cluster() {
    case("zD", "/many", Breakage::Lz4);
}

/// The packed inode's first cluster: the check meets it (through the
/// fragments of the files whose tails it holds, or the packed inode).
fn packed_case(name: &str, how: Breakage) {
    let tmp = tempfile::tempdir().unwrap();
    let (img, ext, _, devices) = damaged(name, None, how, tmp.path());
    let Some((_, at)) = ext.physical else {
        unreachable!()
    };
    let what = format!("{name}: {how:?} damage in the packed inode's cluster at {at:#x}");
    check_reports(&what, img, devices, at, None);
}

#[test]
fn packed_inode_lz4() {
    packed_case("lz4_allfrag", Breakage::Lz4);
    packed_case("lz4_frag_dedupe", Breakage::Lz4);
}

#[test]
fn packed_inode_micro_lzma_one_mib_clusters() {
    packed_case("lzma_allfrag_1m", Breakage::MicroLzma);
}
