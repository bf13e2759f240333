//! A supervised ramfs rebuilt from its state files compares equal, to the
//! byte and the nanosecond, with the one that wrote them, whatever was
//! done to it; a resent request is answered as the first was.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::request::Scope;
use foliofs_vfs::{Attr, Ctx, FileSystem, FileType, Ino, Scratch, SetAttr, TimeSet};

use crate::{Options, RamFs, StateFiles};

fn opts(bs: &str) -> Options {
    let mut o = Options::default();
    o.set("blocksize", Some(bs)).unwrap();
    o.set("size", Some("64M")).unwrap();
    o
}

/// Everything a reader can see, from the root down.
fn dump(fs: &RamFs) -> Vec<String> {
    let mut out = Vec::new();
    walk(fs, fs.root(), "", &mut out);
    out.push(format!("usage {:?} xattr {}", fs.usage(), fs.xattr_bytes()));
    out
}

fn walk(fs: &RamFs, ino: Ino, path: &str, out: &mut Vec<String>) {
    let a: Attr = fs.getattr(ino).unwrap();
    let mut xattrs: Vec<_> = fs
        .listxattr(ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = fs.getxattr(ino, OsStr::from_bytes(&n)).unwrap();
            (n, v)
        })
        .collect();
    xattrs.sort();
    out.push(format!("{path} {a:?} {xattrs:?}"));
    match a.kind {
        FileType::Directory => {
            let mut entries = Vec::new();
            fs.readdir(ino, 0, &mut |e| {
                entries.push((e.name.to_owned(), e.ino, e.next));
                false
            })
            .unwrap();
            for (name, child, cookie) in entries {
                out.push(format!("{path}/{} cookie {cookie}", name.to_string_lossy()));
                walk(
                    fs,
                    child,
                    &format!("{path}/{}", name.to_string_lossy()),
                    out,
                );
            }
        }
        FileType::RegularFile => {
            let mut s = Scratch::new();
            let data = fs.read(ino, 0, a.size as u32, &mut s).unwrap().to_vec();
            out.push(format!("{path} data {:x}", crc32c::crc32c(&data)));
        }
        FileType::Symlink => out.push(format!("{path} -> {:?}", fs.readlink(ino).unwrap())),
        _ => {}
    }
}

/// `fs` as a server killed now leaves it: nothing of it runs again (its
/// memory is simply lost), and the next one reads its state files.
fn kill_and_recover(fs: RamFs, files: &StateFiles, o: &Options) -> RamFs {
    std::mem::forget(fs);
    RamFs::recover(o, dup(files)).unwrap()
}

fn dup(files: &StateFiles) -> StateFiles {
    StateFiles {
        ledger: files.ledger.try_clone().unwrap(),
        data: files.data.try_clone().unwrap(),
        pool: files.pool.as_ref().map(|p| p.try_clone().unwrap()),
    }
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Whether this process may mount the tmpfs a backed ramfs keeps its
/// files on (root); says why not otherwise.
fn can_back() -> bool {
    let o = opts("4K");
    match StateFiles::create(&o, true) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skip: backed files: {e}");
            false
        }
    }
}

#[test]
fn every_kind_of_change_survives_a_restart() {
    every_change_survives(false);
}

#[test]
fn every_kind_of_change_to_backed_files_survives_a_restart() {
    if can_back() {
        every_change_survives(true);
    }
}

fn every_change_survives(backed: bool) {
    for bs in ["4K", "64K"] {
        let o = opts(bs);
        let files = StateFiles::create(&o, backed).unwrap();
        let fs = RamFs::supervised(&o, dup(&files)).unwrap();
        let ctx = Ctx {
            uid: 1000,
            gid: 100,
            ..Ctx::default()
        };
        let root = fs.root();
        let d = fs.mkdir(root, n("d"), 0o755, &ctx).unwrap().ino;
        let (a, fh) = fs.create(d, n("a"), 0o644, libc::O_RDWR, &ctx).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs.write(a.ino, fh, 0, &data, 0).unwrap();
        fs.write(a.ino, fh, 1 << 20, b"far", 0).unwrap();
        fs.fallocate(
            a.ino,
            4096,
            8192,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
        fs.release(a.ino, fh).unwrap();
        let (b, bfh) = fs
            .create(root, n("b"), 0o600, libc::O_WRONLY, &ctx)
            .unwrap();
        fs.write(b.ino, bfh, 0, b"held open", 0).unwrap();
        fs.unlink(root, n("b"), &ctx).unwrap();
        fs.symlink(d, n("s"), b"../x/y", &ctx).unwrap();
        fs.link(a.ino, root, n("hard"), &ctx).unwrap();
        fs.mknod(root, n("fifo"), FileType::Fifo, 0o640, 0, &ctx)
            .unwrap();
        fs.setxattr(a.ino, n("user.k"), b"v1", 0, &ctx).unwrap();
        fs.setxattr(d, n("user.k2"), b"v2", 0, &ctx).unwrap();
        fs.removexattr(d, n("user.k2"), &ctx).unwrap();
        let set = SetAttr {
            mode: Some(0o4711),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        };
        fs.setattr(a.ino, &set, &ctx).unwrap();
        let (c, cfh) = fs.create(root, n("c"), 0o644, libc::O_RDWR, &ctx).unwrap();
        fs.write(c.ino, cfh, 0, &[5u8; 20_000], 0).unwrap();
        let cut = SetAttr {
            size: Some(5000),
            ..SetAttr::default()
        };
        fs.setattr(c.ino, &cut, &ctx).unwrap();
        fs.release(c.ino, cfh).unwrap();
        fs.mkdir(root, n("gone"), 0o700, &ctx).unwrap();
        fs.rmdir(root, n("gone"), &ctx).unwrap();
        fs.rename(root, n("c"), d, n("c2"), 0, &ctx).unwrap();
        fs.rename(d, n("c2"), root, n("hard"), 0, &ctx).unwrap();
        let before = dump(&fs);

        let fs = kill_and_recover(fs, &files, &o);
        assert_eq!(dump(&fs), before, "block size {bs}");
        // The unlinked file still open reads and closes as before.
        let mut s = Scratch::new();
        assert_eq!(fs.read(b.ino, 0, 100, &mut s).unwrap(), b"held open");
        fs.release(b.ino, bfh).unwrap();
        // New inodes take new numbers; a write after the restart stays.
        let (e, efh) = fs.create(root, n("e"), 0o644, libc::O_RDWR, &ctx).unwrap();
        assert!(e.ino > b.ino);
        fs.write(e.ino, efh, 0, b"after", 0).unwrap();
        let before = dump(&fs);
        let fs = kill_and_recover(fs, &files, &o);
        assert_eq!(dump(&fs), before, "block size {bs}, second restart");
        assert!(matches!(
            fs.getattr(b.ino),
            Err(foliofs_vfs::Error::NotFound)
        ));
    }
}

#[test]
fn a_resent_request_is_answered_as_the_first_was() {
    let o = opts("4K");
    let files = StateFiles::create(&o, false).unwrap();
    let fs = RamFs::supervised(&o, dup(&files)).unwrap();
    let ctx = Ctx::default();
    let root = fs.root();
    let (a, fh) = {
        let _r = Scope::enter(10, false);
        fs.create(root, n("a"), 0o644, libc::O_RDWR | libc::O_EXCL, &ctx)
            .unwrap()
    };
    {
        let _r = Scope::enter(12, false);
        fs.unlink(root, n("a"), &ctx).unwrap();
    }
    let fs = kill_and_recover(fs, &files, &o);
    // The server died before answering either: both come again.
    {
        let _r = Scope::enter(10, true);
        let (again, fh2) = fs
            .create(root, n("a"), 0o644, libc::O_RDWR | libc::O_EXCL, &ctx)
            .unwrap();
        assert_eq!((again.ino, fh2), (a.ino, fh));
    }
    {
        let _r = Scope::enter(12, true);
        fs.unlink(root, n("a"), &ctx).unwrap();
    }
    // Not resent: carried out, and refused as it should be.
    {
        let _r = Scope::enter(12, false);
        assert!(fs.unlink(root, n("a"), &ctx).is_err());
    }
    // The handle the first create opened is still one open.
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
    fs.release(a.ino, fh).unwrap();
    assert_eq!(fs.usage().1, 1, "only the root is left");
}

#[test]
fn the_ledger_is_rewritten_when_it_grows_and_still_replays() {
    let o = opts("4K");
    let files = StateFiles::create(&o, false).unwrap();
    let fs = RamFs::supervised(&o, dup(&files)).unwrap();
    let ctx = Ctx::default();
    let root = fs.root();
    let (a, fh) = fs.create(root, n("a"), 0o644, libc::O_RDWR, &ctx).unwrap();
    // Each a few hundred bytes of ledger: well past the bound.
    for i in 0..120_000u64 {
        fs.write(a.ino, fh, (i % 64) * 4096, &i.to_le_bytes(), 0)
            .unwrap();
        if i % 1000 == 0 {
            let (t, tfh) = fs.create(root, n("t"), 0o644, libc::O_RDWR, &ctx).unwrap();
            fs.release(t.ino, tfh).unwrap();
            fs.unlink(root, n("t"), &ctx).unwrap();
        }
    }
    assert!(
        fs.ledger_bytes().unwrap() < 48 << 20,
        "rewritten: {} bytes",
        fs.ledger_bytes().unwrap()
    );
    let before = dump(&fs);
    let fs = kill_and_recover(fs, &files, &o);
    assert_eq!(dump(&fs), before);
}

#[test]
fn a_damaged_ledger_is_refused_with_where() {
    let o = opts("4K");
    let files = StateFiles::create(&o, false).unwrap();
    let fs = RamFs::supervised(&o, dup(&files)).unwrap();
    fs.mkdir(fs.root(), n("d"), 0o755, &Ctx::default()).unwrap();
    std::mem::forget(fs);
    use std::os::unix::fs::FileExt;
    // A byte of the active region's first transaction flipped (the
    // header's third word says which region is active).
    let mut w = [0u8; 8];
    files.ledger.read_exact_at(&mut w, 16).unwrap();
    let at = 4096 + u64::from_le_bytes(w) * (1 << 40) + 12;
    let mut b = [0u8; 1];
    files.ledger.read_exact_at(&mut b, at).unwrap();
    files.ledger.write_all_at(&[b[0] ^ 1], at).unwrap();
    let e = RamFs::recover(&o, dup(&files)).unwrap_err().to_string();
    assert!(e.contains("CRC-32C") && e.contains("byte 0"), "{e}");
    // Another block size's ledger is not this one.
    let e = RamFs::recover(&opts("64K"), dup(&files))
        .unwrap_err()
        .to_string();
    assert!(e.contains("block size 4096"), "{e}");
}
