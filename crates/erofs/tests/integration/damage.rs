//! Damage of one kind at a time, crafted into an image mkfs.erofs built:
//! reading the damaged inode fails with that kind, at the inode, and a full
//! check lists it with the path it was met at.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use foliofs_block::OpenOptions;
use foliofs_erofs::superblock::{COMPAT_SB_CHKSUM, SUPER_OFFSET};
use foliofs_erofs::{Corrupt, Erofs, Incompatible};
use foliofs_vfs::{CheckReport, FileSystem};

/// An image of `d/f`, and where `f`'s inode sits.
struct Image {
    _t: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
    nid: u64,
    pos: usize,
}

fn image() -> Option<Image> {
    if Command::new("mkfs.erofs").arg("--help").output().is_err() {
        eprintln!("SKIP: mkfs.erofs is not installed");
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/f"), b"eff\n").unwrap();
    let path = t.path().join("img");
    let out = Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(&path)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fs = Erofs::open(&path, &OpenOptions::default(), &[]).unwrap();
    let d = fs.lookup(fs.root(), OsStr::new("d")).unwrap();
    let nid = fs.lookup(d.ino, OsStr::new("f")).unwrap().ino;
    let pos = fs.inode(nid).unwrap().pos as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    // The superblock's checksum may cover the inode: drop it rather than
    // recompute it, so the damage made is the only one.
    let compat = SUPER_OFFSET as usize + 8;
    bytes[compat] &= !(COMPAT_SB_CHKSUM as u8);
    Some(Image {
        _t: t,
        path,
        bytes,
        nid,
        pos,
    })
}

impl Image {
    fn write(&self) -> &Path {
        std::fs::write(&self.path, &self.bytes).unwrap();
        &self.path
    }
}

#[test]
fn unknown_inode_format_bits_are_corruption_of_that_inode() {
    let Some(mut img) = image() else { return };
    img.bytes[img.pos + 1] |= 0x10;
    let fs = Erofs::open(img.write(), &OpenOptions::default(), &[]).unwrap();
    let e = fs.getattr(img.nid).unwrap_err();
    assert_eq!(e.offset(), Some(img.pos as u64));
    assert!(
        matches!(
            e.corruption::<Corrupt>(),
            Some(Corrupt::BadInodeFormat { nid, .. }) if *nid == img.nid
        ),
        "{e}"
    );
    let r = fs.fsck();
    assert_eq!(r.defect_count(), 1, "{:#?}", r.errors);
    let d = &r.defects()[0];
    assert_eq!(d.path.as_deref(), Some("/d/f"));
    assert_eq!(d.offset(), Some(img.pos as u64));
    assert!(matches!(
        d.error.corruption::<Corrupt>(),
        Some(Corrupt::BadInodeFormat { .. })
    ));
}

#[test]
fn an_unknown_data_layout_is_incompatible_not_corrupt() {
    let Some(mut img) = image() else { return };
    // i_format bits 1..3 hold the layout; 5 is not defined yet.
    img.bytes[img.pos] = (img.bytes[img.pos] & !0x0e) | (5 << 1);
    let fs = Erofs::open(img.write(), &OpenOptions::default(), &[]).unwrap();
    let e = fs.getattr(img.nid).unwrap_err();
    assert_eq!(
        e.incompatibility::<Incompatible>(),
        Some(&Incompatible::DataLayout {
            nid: img.nid,
            layout: 5
        })
    );
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
    let r = fs.fsck();
    assert_eq!(r.defect_count(), 1, "{:#?}", r.errors);
    assert_eq!(
        r.defects()[0].to_string(),
        format!(
            "unsupported feature: /d/f: inode {}: data layout 5",
            img.nid
        )
    );
}
