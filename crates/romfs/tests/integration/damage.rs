//! Damage of one kind at a time, crafted into a good image: reading fails
//! with that kind of corruption at the damaged structure, and a full check
//! lists it, with the path it was met at.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use foliofs_block::OpenOptions;
use foliofs_romfs::checksum::fix;
use foliofs_romfs::{check, mkfs, Corrupt, RomFs};
use foliofs_vfs::{CheckReport, Error, FileSystem};

struct Image {
    _t: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
    /// Header offsets: the file "a", directory "d", its file "b", and the
    /// hard link "hl" (to "a").
    a: u64,
    d: u64,
    b: u64,
    hl: u64,
}

impl Image {
    fn new() -> Image {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("a"), b"hello\n").unwrap();
        std::fs::write(src.join("d/b"), b"bee\n").unwrap();
        std::fs::hard_link(src.join("a"), src.join("hl")).unwrap();
        let path = t.path().join("img");
        mkfs::build(&src, &path, &mkfs::MkfsOptions::default(), &mut |_| {}).unwrap();
        let fs = RomFs::open(&path, &OpenOptions::default()).unwrap();
        let header = |dir: u64, name: &str| {
            fs.dir(dir)
                .unwrap()
                .find(name.as_bytes())
                .unwrap_or_else(|| panic!("{name} listed"))
                .header
        };
        let d = header(fs.root(), "d");
        let (a, b, hl) = (
            header(fs.root(), "a"),
            header(d, "b"),
            header(fs.root(), "hl"),
        );
        Image {
            bytes: std::fs::read(&path).unwrap(),
            _t: t,
            path,
            a,
            d,
            b,
            hl,
        }
    }

    fn word(&self, at: u64) -> u32 {
        let at = at as usize;
        u32::from_be_bytes(self.bytes[at..at + 4].try_into().unwrap())
    }

    fn set_word(&mut self, at: u64, w: u32) {
        let at = at as usize;
        self.bytes[at..at + 4].copy_from_slice(&w.to_be_bytes());
    }

    /// Rewrites the checksums of header `h` and of the superblock (whose
    /// span may cover the header), so only the damage meant is there.
    fn fix_sums(&mut self, h: u64) {
        let name_len = self.bytes[h as usize + 16..]
            .iter()
            .position(|&c| c == 0)
            .unwrap();
        let meta = (16 + name_len + 1 + 15) & !15;
        self.set_word(h + 12, 0);
        let sum = fix(&self.bytes[h as usize..h as usize + meta]);
        self.set_word(h + 12, sum);
        self.fix_superblock();
    }

    fn fix_superblock(&mut self) {
        let span = (self.word(8) as usize).min(512);
        self.set_word(12, 0);
        let sum = fix(&self.bytes[..span]);
        self.set_word(12, sum);
    }

    fn write(&self) -> &Path {
        std::fs::write(&self.path, &self.bytes).unwrap();
        &self.path
    }
}

fn kind(e: &Error) -> &Corrupt {
    e.corruption::<Corrupt>()
        .unwrap_or_else(|| panic!("not romfs corruption: {e}"))
}

/// The one defect a check of `path` lists.
fn only_defect(path: &Path) -> (Option<String>, u64, Corrupt) {
    let r = check::check(path, &OpenOptions::default()).unwrap();
    assert_eq!(r.defect_count(), 1, "{:#?}", r.defects);
    let d = &r.defects()[0];
    (d.path.clone(), d.offset().unwrap(), kind(&d.error).clone())
}

#[test]
fn a_bad_header_checksum_is_listed_by_check_but_does_not_stop_reads() {
    let mut img = Image::new();
    let a = img.a;
    img.set_word(a + 12, img.word(a + 12) ^ 1);
    img.fix_superblock();
    let path = img.write();
    let fs = RomFs::open(path, &OpenOptions::default()).unwrap();
    let attr = fs.lookup(fs.root(), OsStr::new("a")).unwrap();
    assert_eq!(attr.size, 6);
    let (at, offset, k) = only_defect(path);
    assert_eq!((at.as_deref(), offset), (Some("/a"), a + 12));
    assert!(matches!(k, Corrupt::HeaderChecksum { .. }), "{k:?}");
}

#[test]
fn hard_links_to_themselves_are_a_loop() {
    let mut img = Image::new();
    let hl = img.hl;
    img.set_word(hl + 4, hl as u32);
    img.fix_sums(hl);
    let path = img.write();
    let fs = RomFs::open(path, &OpenOptions::default()).unwrap();
    let e = fs.readdir(fs.root(), 0, &mut |_| false).unwrap_err();
    assert_eq!(e.offset(), Some(hl));
    assert_eq!(
        kind(&e),
        &Corrupt::LinkLoop {
            link: hl,
            through: hl
        }
    );
    let (at, offset, k) = only_defect(path);
    assert_eq!((at.as_deref(), offset), (Some("/hl"), hl));
    assert!(matches!(k, Corrupt::LinkLoop { .. }), "{k:?}");
}

#[test]
fn an_entry_chain_that_comes_back_is_a_loop() {
    let mut img = Image::new();
    let (d, b) = (img.d, img.b);
    let first = u64::from(img.word(d + 4) & !15);
    img.set_word(b, (img.word(b) & 15) | first as u32);
    img.fix_sums(b);
    let path = img.write();
    let fs = RomFs::open(path, &OpenOptions::default()).unwrap();
    let e = fs.readdir(d, 0, &mut |_| false).unwrap_err();
    assert_eq!(
        kind(&e),
        &Corrupt::ChainLoop {
            dir: d,
            offset: first
        }
    );
    let r = check::check(path, &OpenOptions::default()).unwrap();
    let loops: Vec<_> = r
        .defects
        .iter()
        .filter(|d| matches!(kind(&d.error), Corrupt::ChainLoop { .. }))
        .collect();
    assert_eq!(loops.len(), 1, "{:#?}", r.defects);
    assert_eq!(loops[0].path.as_deref(), Some("/d"));
}

#[test]
fn a_truncated_image_does_not_open_and_checks_as_one_defect() {
    let mut img = Image::new();
    let declared = img.word(8);
    img.bytes.truncate(img.a as usize);
    let path = img.write();
    let e = RomFs::open(path, &OpenOptions::default()).unwrap_err();
    assert_eq!(
        kind(&e),
        &Corrupt::ImageTruncated {
            declared,
            actual: img.a
        }
    );
    let (at, offset, k) = only_defect(path);
    assert_eq!((at, offset), (None, 8));
    assert!(matches!(k, Corrupt::ImageTruncated { .. }), "{k:?}");
}
