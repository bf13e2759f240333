//! Metabox images made by hand: inodes, inline data and xattrs read out of
//! the metabox inode's data, the kernel's inode numbers, and the hostile
//! nids a reader must refuse.

use std::ffi::OsStr;

use foliofs_vfs::{Error, FileSystem, Scratch};

use super::{ino_to_nid, nid_to_ino};
use crate::format::{COMPAT_SHARED_EA_IN_METABOX, INCOMPAT_48BIT, INCOMPAT_METABOX, NID_METABOX};
use crate::testimage::{TestImage, BS, DATA_BLK, FLAT_INLINE, FLAT_PLAIN, ROOT};
use crate::{Corrupt, Erofs};

/// The metabox inode's nid (in the image).
const MB: u64 = 8;
/// Where the metabox inode's data is.
const MB_DATA: u64 = DATA_BLK * BS;
/// The root and a file, in the metabox.
const MROOT: u64 = NID_METABOX;
const MFILE: u64 = NID_METABOX | 4;
/// The block holding the shared xattr area.
const XATTR_BLK: u64 = 2;

fn corruption(e: &Error) -> Corrupt {
    e.corruption::<Corrupt>()
        .unwrap_or_else(|| panic!("not corruption: {e}"))
        .clone()
}

/// An xattr entry: name index, suffix, value (4-byte aligned).
fn xattr(index: u8, suffix: &[u8], value: &[u8]) -> Vec<u8> {
    let mut v = vec![suffix.len() as u8, index];
    v.extend((value.len() as u16).to_le_bytes());
    v.extend(suffix);
    v.extend(value);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

/// A metabox image: the root (nid 1 << 63) lists `f` ([`MFILE`]), an
/// inline file whose inline xattrs hold one shared id and `user.inline`;
/// the shared area holds `user.shared`, in the image at [`XATTR_BLK`] and
/// (as "user.boxed") at the same offset of the metabox data.
fn image(compat: u32) -> TestImage {
    let mut t = TestImage::new(INCOMPAT_48BIT | INCOMPAT_METABOX, 1);
    t.sb(0x08, &compat.to_le_bytes());
    t.sb(0x70, &MROOT.to_le_bytes());
    t.sb(0x80, &MB.to_le_bytes());
    t.sb(0x2C, &(XATTR_BLK as u32).to_le_bytes());
    // The image's own root stays a valid, empty directory no one uses.
    t.inode(MB, FLAT_PLAIN, 0o100600, BS as u32 * 8, DATA_BLK as u32);
    let mut mb = vec![0u8; 8 * BS as usize];
    let dir = TestImage::dir_block(&[("f", MFILE, 1)], MROOT, MROOT);
    mb[..32].copy_from_slice(&TestImage::inode_bytes(
        FLAT_INLINE,
        0o40755,
        dir.len() as u32,
        0,
    ));
    mb[32..32 + dir.len()].copy_from_slice(&dir);
    // The file: xattr header (12 bytes, one shared id), its id, the inline
    // entry, then the inline data.
    let mut body = vec![0u8; 12];
    body[4] = 1;
    body.extend(0u32.to_le_bytes());
    body.extend(xattr(1, b"inline", b"in the metabox"));
    let icount = 1 + (body.len() - 12) / 4;
    let mut core = TestImage::inode_bytes(FLAT_INLINE, 0o100644, 11, 0);
    core[2..4].copy_from_slice(&(icount as u16).to_le_bytes());
    let at = (MFILE & !NID_METABOX) as usize * 32;
    mb[at..at + 32].copy_from_slice(&core);
    mb[at + 32..at + 32 + body.len()].copy_from_slice(&body);
    let data = at + 32 + body.len();
    mb[data..data + 11].copy_from_slice(b"boxed bytes");
    let boxed = xattr(1, b"boxed", b"from the box");
    let shared_at = (XATTR_BLK * BS) as usize;
    mb[shared_at..shared_at + boxed.len()].copy_from_slice(&boxed);
    t.put(MB_DATA, &mb);
    t.put(XATTR_BLK * BS, &xattr(1, b"shared", b"from the image"));
    t
}

fn xattrs(fs: &Erofs, ino: u64) -> Vec<(String, String)> {
    fs.listxattr(ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = fs.getxattr(ino, OsStr::new(std::str::from_utf8(&n).unwrap()));
            (
                String::from_utf8(n).unwrap(),
                String::from_utf8(v.unwrap()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn inode_numbers_follow_the_kernel() {
    assert_eq!(nid_to_ino(NID_METABOX), 2_147_483_648);
    assert_eq!(nid_to_ino(NID_METABOX | 64), 2_147_483_712);
    assert_eq!(nid_to_ino(37), 37);
    assert_eq!(nid_to_ino(1 << 31), 1 << 32);
    for nid in [
        0,
        1,
        37,
        1 << 31,
        (1 << 31) - 1,
        NID_METABOX | 5,
        u64::MAX,
        0x1234_5678_9abc_def0,
    ] {
        assert_eq!(ino_to_nid(nid_to_ino(nid)), nid, "{nid:#x}");
        assert_eq!(nid_to_ino(ino_to_nid(nid)), nid, "{nid:#x}");
    }
}

#[test]
fn metadata_is_read_out_of_the_metabox() {
    let (_d, fs) = image(0).open();
    assert_eq!(fs.root(), nid_to_ino(MROOT));
    let root = fs.inode(MROOT).unwrap();
    assert!(root.in_metabox);
    assert_eq!(root.pos, 0);
    let a = fs.lookup(fs.root(), OsStr::new("f")).unwrap();
    assert_eq!(a.ino, nid_to_ino(MFILE));
    let mut names = Vec::new();
    fs.readdir(fs.root(), 0, &mut |e| {
        names.push((e.name.to_owned(), e.ino));
        false
    })
    .unwrap();
    assert_eq!(names, [(OsStr::new("f").to_owned(), nid_to_ino(MFILE))]);
    let got = fs
        .read(a.ino, 0, 100, &mut Scratch::new())
        .unwrap()
        .to_vec();
    assert_eq!(got, b"boxed bytes");
    // Shared xattrs are in the image unless the superblock says otherwise;
    // like the kernel, the inline ones are listed first.
    assert_eq!(
        xattrs(&fs, a.ino),
        [
            ("user.inline".into(), "in the metabox".into()),
            ("user.shared".into(), "from the image".into())
        ]
    );
    let r = fs.fsck();
    assert!(r.is_clean(), "{:?}", r.errors);

    let (_d, fs) = image(COMPAT_SHARED_EA_IN_METABOX).open();
    assert_eq!(
        xattrs(&fs, nid_to_ino(MFILE)).last(),
        Some(&("user.boxed".into(), "from the box".into()))
    );
}

#[test]
fn a_metabox_inode_inside_the_metabox_is_refused() {
    let mut t = image(0);
    t.sb(0x80, &(NID_METABOX | MB).to_le_bytes());
    let e = t.try_open().unwrap_err();
    assert_eq!(
        corruption(&e),
        Corrupt::MetaboxInMetabox {
            nid: NID_METABOX | MB
        }
    );
}

#[test]
fn a_metabox_inode_must_hold_data() {
    let mut t = image(0);
    t.inode(MB, FLAT_PLAIN, 0o40755, 0, 0);
    let e = t.try_open().unwrap_err();
    assert_eq!(corruption(&e), Corrupt::MetaboxNotRegular { nid: MB });
}

#[test]
fn a_nid_past_the_metabox_is_corrupt() {
    let mut t = image(0);
    // The root lists a second entry whose inode lies past the metabox's
    // eight blocks.
    let far = NID_METABOX | (8 * BS / 32);
    let dir = TestImage::dir_block(&[("f", MFILE, 1), ("g", far, 1)], MROOT, MROOT);
    let core = TestImage::inode_bytes(FLAT_INLINE, 0o40755, dir.len() as u32, 0);
    t.put(MB_DATA, &core);
    t.put(MB_DATA + 32, &dir);
    let (_d, fs) = t.open();
    let e = fs.lookup(fs.root(), OsStr::new("g")).unwrap_err();
    assert_eq!(
        corruption(&e),
        Corrupt::InodeOutOfMetabox {
            nid: far,
            size: 8 * BS
        }
    );
    let r = fs.fsck();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].path.as_deref(), Some("/g"));
}

#[test]
fn a_metabox_nid_without_a_metabox_is_corrupt() {
    let mut t = TestImage::new(INCOMPAT_48BIT, 0);
    t.root(&[("f", MFILE, 1)]);
    let (_d, fs) = t.open();
    let e = fs.lookup(fs.root(), OsStr::new("f")).unwrap_err();
    assert_eq!(corruption(&e), Corrupt::NoMetabox { nid: MFILE });
    // Without the feature inode numbers are nids.
    assert_eq!(fs.root(), ROOT);
}
