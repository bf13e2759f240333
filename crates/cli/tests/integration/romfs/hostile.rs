//! Corrupt and hostile romfs images, crafted here from a good one: every
//! tool must fail with a clear message (or extract safely), promptly, and
//! never panic, hang or write outside the extraction directory.

use crate::common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::util::{mkfs, Edit};

/// Generous bound that only catches hangs (the tools answer in milliseconds).
const HANG: Duration = Duration::from_secs(20);

fn run(args: &[&OsStr]) -> Output {
    let out = common::run_timeout(Command::new(common::bin()).args(args), HANG);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked"),
        "foliofs {args:?} panicked: {err}"
    );
    out
}

struct Fixture {
    _t: tempfile::TempDir,
    root: PathBuf,
    base: PathBuf,
    outside: PathBuf,
}

/// A small tree: a.txt, ccc -> OUTSIDE, ddd/{b.txt,c.txt}, hl (link to
/// a.txt), lnk -> OUTSIDE; OUTSIDE is a directory that must stay empty.
fn fixture() -> Fixture {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().to_owned();
    let src = root.join("src");
    let outside = root.join("outside");
    std::fs::create_dir_all(src.join("ddd")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(src.join("a.txt"), b"hello\n").unwrap();
    std::fs::hard_link(src.join("a.txt"), src.join("hl")).unwrap();
    std::fs::write(src.join("ddd/b.txt"), b"bee\n").unwrap();
    std::fs::write(src.join("ddd/c.txt"), b"sea\n").unwrap();
    std::os::unix::fs::symlink(&outside, src.join("ccc")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("lnk")).unwrap();
    let base = root.join("base.img");
    mkfs(&src, &base, &[]);
    Fixture {
        _t: t,
        root,
        base,
        outside,
    }
}

/// What a case expects.
struct Expect {
    /// A phrase `fsck` must print (it must also exit 1).
    fsck: &'static str,
    /// Whether `ls -R` must fail, and a phrase its stderr must hold then.
    ls: Option<&'static str>,
}

const fn fails(fsck: &'static str, ls: &'static str) -> Expect {
    Expect { fsck, ls: Some(ls) }
}

/// Runs fsck, ls -R, extract and cat on `img`, checking `e` and that
/// extraction stays inside its directory.
fn check(f: &Fixture, case: &str, img: &Path, e: &Expect) {
    let fsck = run(&[OsStr::new("fsck"), img.as_os_str()]);
    let text =
        String::from_utf8_lossy(&fsck.stdout).into_owned() + &String::from_utf8_lossy(&fsck.stderr);
    assert_eq!(
        fsck.status.code(),
        Some(1),
        "{case}: fsck exit, output:\n{text}"
    );
    assert!(
        text.contains(e.fsck),
        "{case}: fsck should say {:?}:\n{text}",
        e.fsck
    );
    let ls = run(&[OsStr::new("ls"), OsStr::new("-R"), img.as_os_str()]);
    let err = String::from_utf8_lossy(&ls.stderr);
    match e.ls {
        Some(phrase) => {
            assert!(!ls.status.success(), "{case}: ls -R succeeded");
            assert!(
                err.contains(phrase),
                "{case}: ls -R should say {phrase:?}: {err}"
            );
        }
        None => assert!(ls.status.success(), "{case}: ls -R failed: {err}"),
    }
    for force in [false, true] {
        let box_dir = f.root.join(format!("box-{case}-{force}"));
        let dest = box_dir.join("dest");
        std::fs::create_dir_all(&box_dir).unwrap();
        let mut args = vec![OsStr::new("extract")];
        if force {
            args.push(OsStr::new("--force"));
        }
        args.extend([img.as_os_str(), dest.as_os_str()]);
        run(&args);
        let around: Vec<_> = std::fs::read_dir(&box_dir)
            .unwrap()
            .map(|d| d.unwrap().file_name())
            .collect();
        assert!(
            around.iter().all(|n| n == "dest"),
            "{case}: extract wrote beside DIR: {around:?}"
        );
        let out: Vec<_> = std::fs::read_dir(&f.outside).unwrap().collect();
        assert!(
            out.is_empty(),
            "{case}: extract wrote through a symlink into {}",
            f.outside.display()
        );
        std::fs::remove_dir_all(&box_dir).unwrap();
    }
    run(&[OsStr::new("cat"), img.as_os_str(), OsStr::new("ddd/b.txt")]);
    run(&[OsStr::new("info"), img.as_os_str()]);
}

fn write(f: &Fixture, name: &str, e: &Edit) -> PathBuf {
    let p = f.root.join(format!("{name}.img"));
    e.write(&p);
    p
}

fn rename(e: &mut Edit, h: u64, new: &str) {
    let o = h as usize + 16;
    let old_len = e.bytes[o..].iter().position(|&b| b == 0).unwrap();
    assert_eq!(old_len, new.len(), "renames keep the length");
    e.bytes[o..o + new.len()].copy_from_slice(new.as_bytes());
    e.fix_sums(h);
}

fn set_type(e: &mut Edit, h: u64, ty: u32) {
    let w = e.word(h);
    e.set_word(h, (w & !7) | ty);
}

#[test]
fn truncated_at_every_header() {
    let f = fixture();
    let base = Edit::load(&f.base);
    let mut cuts: Vec<u64> = vec![0, 10, 20];
    for h in base.all_headers() {
        cuts.extend([h, h + 8, h + 17]);
    }
    for cut in cuts {
        // As cut (the superblock still claims the full size) ...
        let mut e = Edit::load(&f.base);
        e.bytes.truncate(cut as usize);
        let img = write(&f, &format!("cut{cut}"), &e);
        let expect = fails("truncated", "truncated");
        if cut < 8 {
            // Not recognisable as romfs at all: every tool says what it found.
            for cmd in ["fsck", "ls", "info"] {
                let out = run(&[OsStr::new(cmd), img.as_os_str()]);
                assert!(!out.status.success());
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(
                    err.contains("not a romfs or EROFS image"),
                    "cut {cut}: {err}"
                );
            }
            continue;
        }
        check(&f, &format!("cut{cut}"), &img, &expect);
        // ... and with the superblock made to agree with the cut, so the
        // damage shows at the headers themselves.
        if cut >= 48 {
            e.set_word(8, cut as u32);
            e.fix_superblock();
            let img = write(&f, &format!("cutfixed{cut}"), &e);
            check(
                &f,
                &format!("cutfixed{cut}"),
                &img,
                &fails("beyond the end", "beyond the end"),
            );
        }
    }
}

#[test]
fn loops_and_self_containing_directories() {
    let f = fixture();
    let base = Edit::load(&f.base);
    let ddd = base.header("ddd");
    let b = base.header("ddd/b.txt");
    let c = base.header("ddd/c.txt");
    let hl = base.header("hl");
    let lnk = base.header("lnk");

    // The last entry of ddd points back to its first ("." link).
    let mut e = Edit::load(&f.base);
    let first = e.word(ddd + 4) & !15;
    e.set_next(c, first);
    e.fix_sums(c);
    check(
        &f,
        "next-loop",
        &write(&f, "next-loop", &e),
        &fails("loops back", "loops back"),
    );

    // The last entry of the root points back to the root header.
    let mut e = Edit::load(&f.base);
    let root = 0x20;
    e.set_next(lnk, root);
    e.fix_sums(lnk);
    check(
        &f,
        "root-loop",
        &write(&f, "root-loop", &e),
        &fails("loops back", "loops back"),
    );

    // Two hard links pointing at each other.
    let mut e = Edit::load(&f.base);
    set_type(&mut e, lnk, 0);
    e.set_word(lnk + 4, hl as u32);
    e.set_word(lnk + 8, 0);
    e.set_word(hl + 4, lnk as u32);
    e.fix_sums(lnk);
    e.fix_sums(hl);
    check(
        &f,
        "link-loop",
        &write(&f, "link-loop", &e),
        &fails("loop of links", "loop of links"),
    );

    // A hard link to itself.
    let mut e = Edit::load(&f.base);
    e.set_word(hl + 4, hl as u32);
    e.fix_sums(hl);
    check(
        &f,
        "self-link",
        &write(&f, "self-link", &e),
        &fails("loop of links", "loop of links"),
    );

    // ddd holds a hard link to ddd itself.
    let mut e = Edit::load(&f.base);
    set_type(&mut e, b, 0);
    e.set_word(b + 4, ddd as u32);
    e.set_word(b + 8, 0);
    e.fix_sums(b);
    check(
        &f,
        "dir-in-itself",
        &write(&f, "dir-in-itself", &e),
        &fails("directory loop", "already listed"),
    );

    // ddd's entry list starts at ddd's own header (as the root's does), so
    // ddd lists itself under its own name.
    let mut e = Edit::load(&f.base);
    e.set_word(ddd + 4, ddd as u32);
    e.fix_sums(ddd);
    check(
        &f,
        "dir-lists-itself",
        &write(&f, "dir-lists-itself", &e),
        &fails("directory loop", "already listed"),
    );
}

#[test]
fn bad_checksums() {
    let f = fixture();
    let mut e = Edit::load(&f.base);
    let w = e.word(12);
    e.set_word(12, w ^ 0x100);
    check(
        &f,
        "sb-sum",
        &write(&f, "sb-sum", &e),
        &fails("bad superblock checksum", "bad superblock checksum"),
    );

    // Header checksums are not checked on reads (the kernel does not check
    // them either); fsck reports them.
    let mut e = Edit::load(&f.base);
    let c = e.header("ddd/c.txt");
    let w = e.word(c + 12);
    e.set_word(c + 12, w ^ 1);
    e.fix_superblock();
    let img = write(&f, "hdr-sum", &e);
    check(
        &f,
        "hdr-sum",
        &img,
        &Expect {
            fsck: "/ddd/c.txt: bad header checksum",
            ls: None,
        },
    );
}

#[test]
fn offsets_and_sizes_beyond_the_image() {
    let f = fixture();
    let base = Edit::load(&f.base);
    let (ddd, a, hl, c) = (
        base.header("ddd"),
        base.header("a.txt"),
        base.header("hl"),
        base.header("ddd/c.txt"),
    );
    let cases: [(&str, u64, u64, u32); 5] = [
        ("next-beyond", c, 0, 0xffff_fff0),
        ("dirspec-beyond", ddd, 4, 0x7fff_0000),
        ("link-beyond", hl, 4, 0x0100_0000),
        ("size-beyond", a, 8, 0x4000_0000),
        ("link-into-superblock", hl, 4, 0x10),
    ];
    for (name, h, field, value) in cases {
        let mut e = Edit::load(&f.base);
        if field == 0 {
            e.set_next(h, value);
        } else {
            e.set_word(h + field, value);
        }
        e.fix_sums(h);
        let phrase = if name == "link-into-superblock" {
            "into the superblock"
        } else {
            "beyond"
        };
        check(&f, name, &write(&f, name, &e), &fails(phrase, phrase));
    }
    // Nonzero spec where the type requires zero.
    let mut e = Edit::load(&f.base);
    e.set_word(a + 4, 0x1234);
    e.fix_sums(a);
    check(
        &f,
        "spec",
        &write(&f, "spec", &e),
        &fails("must be 0", "must be 0"),
    );
    // A file whose size makes its data run over the next header: reads
    // still work (the bytes are in the image), fsck reports the overlap.
    let mut e = Edit::load(&f.base);
    e.set_word(a + 8, 64);
    e.fix_sums(a);
    let img = write(&f, "overlap", &e);
    check(
        &f,
        "overlap",
        &img,
        &Expect {
            fsck: "overlaps",
            ls: None,
        },
    );
    // The root is not a directory.
    let mut e = Edit::load(&f.base);
    set_type(&mut e, 0x20, 2);
    e.set_word(0x24, 0);
    e.fix_sums(0x20);
    check(
        &f,
        "root-file",
        &write(&f, "root-file", &e),
        &fails("not a directory", "not a directory"),
    );
    // A name with no NUL in 128 bytes (on the last entry, so nothing else
    // is overwritten).
    let c = base.header("lnk");
    let mut e = Edit::load(&f.base);
    let end = (c + 16 + 128) as usize;
    if e.bytes.len() < end + 64 {
        e.bytes.resize(end + 1024, 0);
        let len = e.bytes.len() as u32;
        e.set_word(8, len);
    }
    for byte in &mut e.bytes[c as usize + 16..end] {
        *byte = b'N';
    }
    e.fix_superblock();
    check(
        &f,
        "long-name",
        &write(&f, "long-name", &e),
        &fails("longer than 127", "longer than 127"),
    );
}

#[test]
fn hostile_names_and_shared_names_extract_safely() {
    let f = fixture();
    let base = Edit::load(&f.base);
    let (b, c, ccc, lnk) = (
        base.header("ddd/b.txt"),
        base.header("ddd/c.txt"),
        base.header("ccc"),
        base.header("lnk"),
    );

    // A name with a '/' that climbs out.
    let mut e = Edit::load(&f.base);
    rename(&mut e, b, "../xx");
    check(
        &f,
        "slash",
        &write(&f, "slash", &e),
        &fails("containing '/'", "containing '/'"),
    );

    // A regular file called ".." is hidden, as the kernel hides it; nothing
    // lands in the parent of DIR.
    let mut e = Edit::load(&f.base);
    // c.txt -> ".." needs a 2-byte name: write it and pad with NULs.
    let o = c as usize + 16;
    e.bytes[o..o + 5].copy_from_slice(b"..\0\0\0");
    e.fix_sums(c);
    let img = write(&f, "dotdot-file", &e);
    let ls = run(&[OsStr::new("ls"), img.as_os_str(), OsStr::new("ddd")]);
    assert_eq!(String::from_utf8_lossy(&ls.stdout), "b.txt\n");
    let dest = f.root.join("dd-box/dest");
    std::fs::create_dir_all(&dest).unwrap();
    let out = run(&[OsStr::new("extract"), img.as_os_str(), dest.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let around: Vec<_> = std::fs::read_dir(f.root.join("dd-box"))
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(around, ["dest"]);
    assert_eq!(std::fs::read(dest.join("ddd/b.txt")).unwrap(), b"bee\n");

    // A symlink and a directory with one name, the symlink first: the
    // directory's contents must not go through the link.
    let mut e = Edit::load(&f.base);
    rename(&mut e, ccc, "ddd");
    let img = write(&f, "link-then-dir", &e);
    check(
        &f,
        "link-then-dir",
        &img,
        &fails("duplicate name", "").with_ls_ok(),
    );
    let out = run(&[
        OsStr::new("extract"),
        img.as_os_str(),
        f.root.join("ltd").as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The directory first, then the symlink.
    let mut e = Edit::load(&f.base);
    rename(&mut e, lnk, "ddd");
    let img = write(&f, "dir-then-link", &e);
    check(
        &f,
        "dir-then-link",
        &img,
        &fails("duplicate name", "").with_ls_ok(),
    );
    let out = run(&[
        OsStr::new("extract"),
        img.as_os_str(),
        f.root.join("dtl").as_os_str(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = run(&[
        OsStr::new("extract"),
        OsStr::new("--force"),
        img.as_os_str(),
        f.root.join("dtl2").as_os_str(),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not replacing"));
}

impl Expect {
    fn with_ls_ok(self) -> Expect {
        Expect { ls: None, ..self }
    }
}

#[test]
fn extract_never_overwrites_without_force() {
    let f = fixture();
    let dest = f.root.join("dest");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("a.txt"), b"mine\n").unwrap();
    let out = run(&[OsStr::new("extract"), f.base.as_os_str(), dest.as_os_str()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not overwriting"));
    assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"mine\n");
    let out = run(&[
        OsStr::new("extract"),
        OsStr::new("--force"),
        f.base.as_os_str(),
        dest.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(dest.join("a.txt")).unwrap(), b"hello\n");
}

#[test]
fn not_romfs_at_all() {
    let t = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("empty", Vec::new()),
        ("text", b"just some text\n".to_vec()),
        ("almost", b"-rom1fs".to_vec()),
        ("squash", b"hsqs\0\0\0\0".to_vec()),
    ] {
        let p = t.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        let out = run(&[OsStr::new("ls"), p.as_os_str()]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a romfs or EROFS image"), "{name}: {err}");
    }
    let out = run(&[OsStr::new("info"), t.path().join("squash").as_os_str()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("squashfs"));
}

/// A romfs image of `depth` nested directories named "d", written by hand
/// (host paths cannot nest this deep): each level is a directory header and
/// its "." and ".." links.
fn deep_image(depth: usize) -> Vec<u8> {
    fn header(b: &mut Vec<u8>, next: u32, ty: u32, spec: u32, name: &[u8]) {
        let at = b.len();
        b.extend_from_slice(&(next | ty).to_be_bytes());
        b.extend_from_slice(&spec.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(name);
        b.resize(at + 32, 0);
        let sum = b[at..at + 32].chunks(4).fold(0u32, |s, w| {
            s.wrapping_add(u32::from_be_bytes(w.try_into().unwrap()))
        });
        b[at + 12..at + 16].copy_from_slice(&sum.wrapping_neg().to_be_bytes());
    }
    let mut b = b"-rom1fs-\0\0\0\0\0\0\0\0deep".to_vec();
    b.resize(32, 0);
    // Root: its header is its own "." entry; then its "..".
    header(&mut b, 0x40, 9, 0x20, b".");
    header(&mut b, 0x60, 0, 0x20, b"..");
    let mut parent = 0x20u32;
    let mut d = 0x60u32;
    for level in 0..depth {
        // A directory "d" (last in its parent), then its "." and "..";
        // the next level's "d" follows its "..".
        let last = level + 1 == depth;
        header(&mut b, 0, 9, d + 32, b"d");
        header(&mut b, d + 64, 0, d, b".");
        header(&mut b, if last { 0 } else { d + 96 }, 0, parent, b"..");
        parent = d;
        d += 96;
    }
    let end = b.len() as u32;
    b[8..12].copy_from_slice(&end.to_be_bytes());
    b.resize(b.len().div_ceil(1024) * 1024, 0);
    let sum = b[..512].chunks(4).fold(0u32, |s, w| {
        s.wrapping_add(u32::from_be_bytes(w.try_into().unwrap()))
    });
    b[12..16].copy_from_slice(&sum.wrapping_neg().to_be_bytes());
    b
}

#[test]
fn very_deep_nesting_is_walked_without_recursion() {
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("deep.img");
    let depth = 3000;
    std::fs::write(&img, deep_image(depth)).unwrap();
    let fsck = run(&[OsStr::new("fsck"), img.as_os_str()]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let ls = run(&[OsStr::new("ls"), OsStr::new("-R"), img.as_os_str()]);
    assert!(ls.status.success());
    let sections = ls
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| l.ends_with(b":"))
        .count();
    assert_eq!(sections, depth + 1);
    let dest = t.path().join("out");
    let out = run(&[OsStr::new("extract"), img.as_os_str(), dest.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The deepest directory exists: walk down by descriptors-free counting.
    let mut levels = 0;
    let mut p = dest.clone();
    while p.join("d").is_dir() && levels < 100 {
        p = p.join("d");
        levels += 1;
    }
    assert_eq!(levels, 100, "the first hundred levels were extracted");
}
