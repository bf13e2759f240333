//! Behaviour of the file system through the `FileSystem` trait.

use std::ffi::OsStr;
use std::sync::Arc;

use foliofs_vfs::{
    Ctx, FileSystem, FileType, Ino, Rdev, Result, Scratch, SetAttr, TimeSet, Timespec,
};

use crate::{Options, RamFs, ROOT_INO};

fn ctx() -> Ctx {
    Ctx {
        uid: 1000,
        gid: 1000,
        pid: 1,
        umask: 0o022,
    }
}

fn fs_with(opts: &[(&str, &str)]) -> RamFs {
    let mut o = Options::default();
    for (k, v) in opts {
        assert!(o.set(k, Some(v)).unwrap());
    }
    RamFs::new(&o)
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn names(fs: &RamFs, dir: Ino) -> Vec<String> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        v.push(e.name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    v
}

fn read_all(fs: &RamFs, ino: Ino) -> Vec<u8> {
    let mut s = Scratch::new();
    let size = fs.getattr(ino).unwrap().size;
    fs.read(ino, 0, size as u32, &mut s).unwrap().to_vec()
}

fn new_file(fs: &RamFs, parent: Ino, name: &str) -> (Ino, u64) {
    let (a, fh) = fs
        .create(parent, n(name), 0o644, libc::O_RDWR, &ctx())
        .unwrap();
    (a.ino, fh)
}

fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.unwrap_err().errno()
}

#[test]
fn root_follows_options() {
    let fs = fs_with(&[("mode", "1777"), ("uid", "5"), ("gid", "6")]);
    let a = fs.getattr(fs.root()).unwrap();
    assert_eq!(a.kind, FileType::Directory);
    assert_eq!((a.perm, a.uid, a.gid, a.nlink), (0o1777, 5, 6, 2));
    assert_eq!(fs.lookup(fs.root(), n("..")).unwrap().ino, ROOT_INO);
    assert_eq!(fs.info().block_size, 4096);
}

#[test]
fn create_write_read_with_holes_at_every_block_size() {
    for bs in ["4K", "64K", "2M"] {
        let fs = fs_with(&[("blocksize", bs)]);
        let bsz = u64::from(fs.info().block_size);
        let (ino, fh) = new_file(&fs, ROOT_INO, "f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let off = 3 * bsz + 17;
        let mut written = 0;
        while written < data.len() {
            let chunk = &data[written..(written + 65536).min(data.len())];
            written += fs.write(ino, fh, off + written as u64, chunk, 0).unwrap() as usize;
        }
        let a = fs.getattr(ino).unwrap();
        assert_eq!(a.size, off + data.len() as u64);
        assert_eq!(a.blksize as u64, bsz);
        let used = (off + data.len() as u64).div_ceil(bsz) - off / bsz;
        assert_eq!(a.blocks, used * bsz / 512, "bs {bs}");
        let all = read_all(&fs, ino);
        assert!(all[..off as usize].iter().all(|&b| b == 0));
        assert_eq!(&all[off as usize..], &data[..]);
        let st = fs.statfs().unwrap();
        assert_eq!(st.bsize as u64, bsz);
        assert_eq!(st.blocks - st.bfree, used);
        fs.release(ino, fh).unwrap();
    }
}

#[test]
fn open_flags_excl_and_trunc() {
    let fs = fs_with(&[]);
    let (ino, fh) = new_file(&fs, ROOT_INO, "f");
    fs.write(ino, fh, 0, b"abc", 0).unwrap();
    fs.release(ino, fh).unwrap();
    let excl = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    assert_eq!(
        errno(fs.create(ROOT_INO, n("f"), 0o644, excl, &ctx())),
        libc::EEXIST
    );
    let (a, fh) = fs
        .create(ROOT_INO, n("f"), 0o644, libc::O_RDWR, &ctx())
        .unwrap();
    assert_eq!((a.ino, a.size), (ino, 3));
    fs.release(ino, fh).unwrap();
    let before = fs.getattr(ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let fh = fs.open(ino, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    let after = fs.getattr(ino).unwrap();
    assert_eq!(after.size, 0);
    assert!(after.mtime > before.mtime && after.ctime > before.ctime);
    fs.release(ino, fh).unwrap();
    // O_TRUNC on a read-only open changes nothing.
    fs.write(ino, 0, 0, b"x", 0).unwrap();
    let fh = fs.open(ino, libc::O_RDONLY | libc::O_TRUNC).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, 1);
    fs.release(ino, fh).unwrap();
}

#[test]
fn directories_link_counts_and_times() {
    let fs = fs_with(&[]);
    let c = ctx();
    let root0 = fs.getattr(ROOT_INO).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let d = fs.mkdir(ROOT_INO, n("d"), 0o755, &c).unwrap();
    assert_eq!((d.nlink, d.uid, d.gid), (2, 1000, 1000));
    let root1 = fs.getattr(ROOT_INO).unwrap();
    assert_eq!(root1.nlink, 3);
    assert!(root1.mtime > root0.mtime && root1.ctime > root0.ctime);
    assert_eq!(errno(fs.mkdir(ROOT_INO, n("d"), 0o755, &c)), libc::EEXIST);
    let e = fs.mkdir(d.ino, n("e"), 0o700, &c).unwrap();
    assert_eq!(fs.lookup(e.ino, n("..")).unwrap().ino, d.ino);
    assert_eq!(errno(fs.rmdir(ROOT_INO, n("d"), &c)), libc::ENOTEMPTY);
    assert_eq!(errno(fs.unlink(d.ino, n("e"), &c)), libc::EISDIR);
    fs.rmdir(d.ino, n("e"), &c).unwrap();
    assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
    assert_eq!(fs.getattr(e.ino).unwrap().nlink, 0);
    fs.forget(e.ino, 2);
    assert_eq!(errno(fs.getattr(e.ino)), libc::ENOENT);
    let (f, fh) = new_file(&fs, d.ino, "f");
    fs.release(f, fh).unwrap();
    assert_eq!(errno(fs.rmdir(d.ino, n("f"), &c)), libc::ENOTDIR);
    // Creating inside a removed directory fails.
    fs.unlink(d.ino, n("f"), &c).unwrap();
    fs.rmdir(ROOT_INO, n("d"), &c).unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 2);
    assert_eq!(errno(fs.mkdir(d.ino, n("x"), 0o755, &c)), libc::ENOENT);
    assert_eq!(
        errno(fs.mkdir(ROOT_INO, n(&"x".repeat(256)), 0o755, &c)),
        libc::ENAMETOOLONG
    );
    fs.mkdir(ROOT_INO, n(&"x".repeat(255)), 0o755, &c).unwrap();
}

#[test]
fn hard_links_and_unlink_while_open() {
    let fs = fs_with(&[]);
    let c = ctx();
    let (f, fh) = new_file(&fs, ROOT_INO, "a");
    fs.write(f, fh, 0, &[1u8; 10_000], 0).unwrap();
    let a = fs.link(f, ROOT_INO, n("b"), &c).unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(errno(fs.link(ROOT_INO, ROOT_INO, n("r"), &c)), libc::EPERM);
    assert_eq!(errno(fs.link(f, ROOT_INO, n("b"), &c)), libc::EEXIST);
    // The second name holds an inode slot of its own.
    assert_eq!(fs.usage(), (3, 3));
    fs.unlink(ROOT_INO, n("a"), &c).unwrap();
    assert_eq!(fs.usage(), (3, 2));
    fs.unlink(ROOT_INO, n("b"), &c).unwrap();
    // Still open: data readable, space still held.
    assert_eq!(read_all(&fs, f), vec![1u8; 10_000]);
    assert_eq!(fs.usage(), (3, 2));
    fs.release(f, fh).unwrap();
    assert_eq!(fs.usage(), (0, 1));
    assert_eq!(errno(fs.link(f, ROOT_INO, n("c"), &c)), libc::ENOENT);
}

#[test]
fn setgid_directories_pass_their_group_down() {
    let fs = fs_with(&[]);
    let d = fs.mkdir(ROOT_INO, n("d"), 0o755, &ctx()).unwrap();
    fs.setattr(
        d.ino,
        &SetAttr {
            mode: Some(0o2775),
            gid: Some(4242),
            ..Default::default()
        },
        &ctx(),
    )
    .unwrap();
    let sub = fs.mkdir(d.ino, n("s"), 0o755, &ctx()).unwrap();
    assert_eq!((sub.gid, sub.perm), (4242, 0o2755));
    let (f, fh) = new_file(&fs, d.ino, "f");
    fs.release(f, fh).unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.gid, a.perm), (4242, 0o644));
}

#[test]
fn chown_clears_setuid_and_group_exec_setgid() {
    let fs = fs_with(&[]);
    let (f, fh) = new_file(&fs, ROOT_INO, "f");
    fs.release(f, fh).unwrap();
    let chmod = |m| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    let chown = SetAttr {
        uid: Some(7),
        ..Default::default()
    };
    fs.setattr(f, &chmod(0o6755), &ctx()).unwrap();
    assert_eq!(fs.setattr(f, &chown, &ctx()).unwrap().perm, 0o755);
    fs.setattr(f, &chmod(0o6745), &ctx()).unwrap();
    assert_eq!(fs.setattr(f, &chown, &ctx()).unwrap().perm, 0o2745);
    let d = fs.mkdir(ROOT_INO, n("d"), 0o755, &ctx()).unwrap();
    fs.setattr(d.ino, &chmod(0o6755), &ctx()).unwrap();
    assert_eq!(fs.setattr(d.ino, &chown, &ctx()).unwrap().perm, 0o6755);
}

#[test]
fn utimens_now_omit_and_nanoseconds() {
    let fs = fs_with(&[]);
    let (f, fh) = new_file(&fs, ROOT_INO, "f");
    fs.release(f, fh).unwrap();
    let t = Timespec::new(1_234_567_890, 123_456_789);
    let a = fs
        .setattr(
            f,
            &SetAttr {
                atime: Some(TimeSet::At(t)),
                ..Default::default()
            },
            &ctx(),
        )
        .unwrap();
    assert_eq!(a.atime, t);
    assert_ne!(a.mtime, t);
    let before = Timespec::now();
    let b = fs
        .setattr(
            f,
            &SetAttr {
                mtime: Some(TimeSet::Now),
                ..Default::default()
            },
            &ctx(),
        )
        .unwrap();
    assert_eq!(b.atime, t);
    assert!(b.mtime >= before && b.ctime >= before);
}

#[test]
fn truncate_times_and_type_errors() {
    let fs = fs_with(&[]);
    let (f, fh) = new_file(&fs, ROOT_INO, "f");
    fs.write(f, fh, 0, &[5u8; 9000], 0).unwrap();
    let size = |s| SetAttr {
        size: Some(s),
        ..Default::default()
    };
    let a = fs.setattr(f, &size(100), &ctx()).unwrap();
    assert_eq!((a.size, a.blocks), (100, 8));
    let a = fs.setattr(f, &size(1 << 40), &ctx()).unwrap();
    assert_eq!((a.size, a.blocks), (1 << 40, 8));
    let mut s = Scratch::new();
    assert_eq!(fs.read(f, 99, 3, &mut s).unwrap(), &[5, 0, 0]);
    assert_eq!(errno(fs.setattr(ROOT_INO, &size(0), &ctx())), libc::EISDIR);
    assert_eq!(errno(fs.setattr(f, &size(u64::MAX), &ctx())), libc::EFBIG);
    assert_eq!(
        errno(fs.write(f, fh, u64::MAX - 2, b"abcd", 0)),
        libc::EFBIG
    );
    fs.release(f, fh).unwrap();
}

#[test]
fn rename_rules() {
    let fs = fs_with(&[]);
    let c = ctx();
    let d1 = fs.mkdir(ROOT_INO, n("d1"), 0o755, &c).unwrap().ino;
    let d2 = fs.mkdir(ROOT_INO, n("d2"), 0o755, &c).unwrap().ino;
    let sub = fs.mkdir(d1, n("sub"), 0o755, &c).unwrap().ino;
    let (a, fh) = new_file(&fs, ROOT_INO, "a");
    fs.release(a, fh).unwrap();
    let (b, fh) = new_file(&fs, ROOT_INO, "b");
    fs.release(b, fh).unwrap();

    // Over a file: the victim goes.
    fs.rename(ROOT_INO, n("a"), ROOT_INO, n("b"), 0, &c)
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, n("b")).unwrap().ino, a);
    assert_eq!(fs.getattr(b).unwrap().nlink, 0);
    assert_eq!(errno(fs.lookup(ROOT_INO, n("a"))), libc::ENOENT);
    // Type mismatches.
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("b"), ROOT_INO, n("d1"), 0, &c)),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("d2"), ROOT_INO, n("b"), 0, &c)),
        libc::ENOTDIR
    );
    // A directory into its own subtree.
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("d1"), sub, n("x"), 0, &c)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("d1"), d1, n("x"), 0, &c)),
        libc::EINVAL
    );
    // Over a non-empty directory, then an empty one.
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("d2"), ROOT_INO, n("d1"), 0, &c)),
        libc::ENOTEMPTY
    );
    fs.rename(d1, n("sub"), d2, n("moved"), 0, &c).unwrap();
    assert_eq!(fs.getattr(d1).unwrap().nlink, 2);
    assert_eq!(fs.getattr(d2).unwrap().nlink, 3);
    assert_eq!(fs.lookup(sub, n("..")).unwrap().ino, d2);
    fs.rename(ROOT_INO, n("d2"), ROOT_INO, n("d1"), 0, &c)
        .unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(fs.getattr(d1).unwrap().nlink, 0);
    // NOREPLACE and EXCHANGE.
    let d = fs.lookup(ROOT_INO, n("d1")).unwrap().ino;
    assert_eq!(d, d2);
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("b"), d, n("moved"), libc::RENAME_NOREPLACE, &c)),
        libc::EEXIST
    );
    fs.rename(ROOT_INO, n("b"), d, n("moved"), libc::RENAME_EXCHANGE, &c)
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, n("b")).unwrap().ino, sub);
    assert_eq!(fs.lookup(d, n("moved")).unwrap().ino, a);
    assert_eq!(fs.lookup(sub, n("..")).unwrap().ino, ROOT_INO);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("b"), d, n("none"), libc::RENAME_EXCHANGE, &c)),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.rename(ROOT_INO, n("b"), d, n("x"), 3, &c)),
        libc::EINVAL
    );
    // A name onto another name of the same inode changes nothing.
    fs.link(a, d, n("alias"), &c).unwrap();
    fs.rename(d, n("alias"), d, n("moved"), 0, &c).unwrap();
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
}

#[test]
fn readdir_cookies_survive_changes() {
    let fs = fs_with(&[]);
    let c = ctx();
    for i in 0..500 {
        fs.mknod(ROOT_INO, n(&format!("f{i}")), FileType::Fifo, 0o644, 0, &c)
            .unwrap();
    }
    // List in small pieces, deleting entries already seen and ones not yet
    // seen, and adding new ones, between pieces.
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let mut got = 0;
        fs.readdir(ROOT_INO, offset, &mut |e| {
            seen.push(e.name.to_string_lossy().into_owned());
            offset = e.next;
            got += 1;
            got == 7
        })
        .unwrap();
        if got == 0 {
            break;
        }
        let k = seen.len();
        if k < 490 {
            fs.unlink(ROOT_INO, n(&seen[k - 1]), &c).unwrap();
            let _ = fs.unlink(ROOT_INO, n(&format!("f{}", 499 - k / 7)), &c);
            fs.mknod(
                ROOT_INO,
                n(&format!("new{k}")),
                FileType::Socket,
                0o644,
                0,
                &c,
            )
            .unwrap();
        }
    }
    let mut uniq = seen.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), seen.len(), "an entry was listed twice");
    // Every entry that was present the whole time was listed.
    let now: std::collections::HashSet<String> = names(&fs, ROOT_INO).into_iter().collect();
    for i in 0..430 {
        let name = format!("f{i}");
        if now.contains(&name) {
            assert!(seen.contains(&name), "{name} skipped");
        }
    }
}

#[test]
fn symlinks_and_special_files() {
    let fs = fs_with(&[]);
    let c = ctx();
    let l = fs.symlink(ROOT_INO, n("l"), b"target/x", &c).unwrap();
    assert_eq!((l.kind, l.size, l.perm), (FileType::Symlink, 8, 0o777));
    assert_eq!(fs.readlink(l.ino).unwrap(), b"target/x");
    assert_eq!(errno(fs.readlink(ROOT_INO)), libc::EINVAL);
    assert_eq!(
        errno(fs.symlink(ROOT_INO, n("m"), &[b'a'; 4096], &c)),
        libc::ENAMETOOLONG
    );
    let rdev = Rdev::new(8, 1).to_new_encoding();
    let b = fs
        .mknod(ROOT_INO, n("b"), FileType::BlockDevice, 0o600, rdev, &c)
        .unwrap();
    assert_eq!(b.rdev, Rdev::new(8, 1));
    let s = fs
        .mknod(ROOT_INO, n("s"), FileType::Socket, 0o600, 0, &c)
        .unwrap();
    assert_eq!(s.kind, FileType::Socket);
    let mut got = names(&fs, ROOT_INO);
    got.sort();
    assert_eq!(got, ["b", "l", "s"]);
}

#[test]
fn xattrs() {
    let fs = fs_with(&[]);
    let c = ctx();
    let (f, fh) = new_file(&fs, ROOT_INO, "f");
    fs.release(f, fh).unwrap();
    fs.setxattr(f, n("user.a"), b"1", 0, &c).unwrap();
    fs.setxattr(f, n("trusted.b"), b"", 0, &c).unwrap();
    fs.setxattr(f, n("security.c"), b"333", 0, &c).unwrap();
    assert_eq!(
        errno(fs.setxattr(f, n("user.a"), b"2", libc::XATTR_CREATE, &c)),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.setxattr(f, n("user.z"), b"2", libc::XATTR_REPLACE, &c)),
        libc::ENODATA
    );
    fs.setxattr(f, n("user.a"), b"22", libc::XATTR_REPLACE, &c)
        .unwrap();
    assert_eq!(fs.getxattr(f, n("user.a")).unwrap(), b"22");
    assert_eq!(fs.getxattr(f, n("trusted.b")).unwrap(), b"");
    assert_eq!(
        fs.listxattr(f).unwrap(),
        vec![
            b"security.c".to_vec(),
            b"trusted.b".to_vec(),
            b"user.a".to_vec()
        ]
    );
    assert_eq!(
        errno(fs.setxattr(f, n("bogus.a"), b"", 0, &c)),
        libc::EOPNOTSUPP
    );
    assert_eq!(errno(fs.setxattr(f, n("user."), b"", 0, &c)), libc::EINVAL);
    assert_eq!(
        errno(fs.setxattr(f, n(&format!("user.{}", "n".repeat(251))), b"", 0, &c)),
        libc::ERANGE
    );
    assert_eq!(
        errno(fs.setxattr(f, n("user.big"), &vec![0; 65537], 0, &c)),
        libc::E2BIG
    );
    // "user.a"+"22", "trusted.b"+"", "security.c"+"333".
    assert_eq!(fs.xattr_bytes(), 8 + 9 + 13);
    fs.removexattr(f, n("user.a"), &c).unwrap();
    assert_eq!(errno(fs.getxattr(f, n("user.a"))), libc::ENODATA);
    assert_eq!(errno(fs.removexattr(f, n("user.a"), &c)), libc::ENODATA);
    assert_eq!(fs.xattr_bytes(), 9 + 13);
    fs.unlink(ROOT_INO, n("f"), &c).unwrap();
    assert_eq!(fs.xattr_bytes(), 0);
}

#[test]
fn xattrs_are_held_to_the_size_limit() {
    let fs = fs_with(&[("size", "100K")]);
    let c = ctx();
    let value = vec![1u8; 60_000];
    let mut made = 0;
    let err = loop {
        let name = format!("f{made}");
        fs.mknod(ROOT_INO, n(&name), FileType::RegularFile, 0o644, 0, &c)
            .unwrap();
        let ino = fs.lookup(ROOT_INO, n(&name)).unwrap().ino;
        match fs.setxattr(ino, n("user.v"), &value, 0, &c) {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
    };
    assert_eq!((made, err.errno()), (1, libc::ENOSPC));
}

#[test]
fn fallocate_punch_and_seek() {
    let fs = fs_with(&[("blocksize", "64K")]);
    const B: u64 = 65536;
    let (f, fh) = new_file(&fs, ROOT_INO, "f");
    fs.write(f, fh, 0, &vec![3u8; (4 * B) as usize], 0).unwrap();
    fs.fallocate(
        f,
        B,
        2 * B,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (4 * B, 2 * B / 512));
    // With a writer open, no holes are reported (a cache above may hold
    // data for them); once it is closed, the real layout shows.
    assert_eq!(fs.lseek(f, 0, libc::SEEK_HOLE).unwrap(), 4 * B);
    assert_eq!(fs.lseek(f, B, libc::SEEK_DATA).unwrap(), B);
    fs.release(f, fh).unwrap();
    let fh = fs.open(f, libc::O_RDONLY).unwrap();
    assert_eq!(fs.lseek(f, 0, libc::SEEK_HOLE).unwrap(), B);
    assert_eq!(fs.lseek(f, B, libc::SEEK_DATA).unwrap(), 3 * B);
    assert_eq!(fs.lseek(f, 3 * B + 5, libc::SEEK_HOLE).unwrap(), 4 * B);
    assert_eq!(errno(fs.lseek(f, 4 * B, libc::SEEK_DATA)), libc::ENXIO);
    let all = read_all(&fs, f);
    assert!(all[B as usize..3 * B as usize].iter().all(|&b| b == 0));
    assert!(all[3 * B as usize..].iter().all(|&b| b == 3));
    // A partial punch zeroes without freeing.
    fs.fallocate(
        f,
        10,
        20,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    assert_eq!(
        &read_all(&fs, f)[..40],
        &[&[3u8; 10][..], &[0; 20], &[3; 10]].concat()
    );
    assert_eq!(
        errno(fs.fallocate(f, 0, 1, libc::FALLOC_FL_PUNCH_HOLE)),
        libc::EOPNOTSUPP
    );
    // Plain and KEEP_SIZE allocation.
    fs.fallocate(f, 8 * B, B, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 4 * B);
    assert_eq!(fs.getattr(f).unwrap().blocks, 3 * B / 512);
    fs.fallocate(f, 5 * B, 10, 0).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 5 * B + 10);
    assert_eq!(fs.lseek(f, 4 * B, libc::SEEK_DATA).unwrap(), 5 * B);
    let w = fs.open(f, libc::O_WRONLY).unwrap();
    assert_eq!(fs.lseek(f, 4 * B, libc::SEEK_DATA).unwrap(), 4 * B);
    fs.release(f, w).unwrap();
    fs.release(f, fh).unwrap();
}

#[test]
fn size_limit_gives_enospc_and_keeps_data() {
    let fs = fs_with(&[("size", "1M"), ("blocksize", "64K")]);
    let (a, fh) = new_file(&fs, ROOT_INO, "a");
    let first: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    assert_eq!(fs.write(a, fh, 0, &first, 0).unwrap(), 300_000);
    let (b, fhb) = new_file(&fs, ROOT_INO, "b");
    let mut off = 0u64;
    let err = loop {
        match fs.write(b, fhb, off, &[0xEE; 100_000], 0) {
            Ok(n) => off += u64::from(n),
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), libc::ENOSPC);
    // 16 blocks in all, 5 taken by "a".
    assert_eq!(off, 11 * 65536);
    assert_eq!(fs.getattr(b).unwrap().size, off);
    assert_eq!(read_all(&fs, a), first);
    assert!(read_all(&fs, b).iter().all(|&x| x == 0xEE));
    let st = fs.statfs().unwrap();
    assert_eq!((st.blocks, st.bfree), (16, 0));
    assert_eq!(errno(fs.fallocate(a, 0, 2 << 20, 0)), libc::ENOSPC);
    // Freeing space makes room again.
    fs.release(b, fhb).unwrap();
    fs.unlink(ROOT_INO, n("b"), &ctx()).unwrap();
    assert_eq!(fs.statfs().unwrap().bfree, 11);
    assert_eq!(fs.write(a, fh, 300_000, b"more", 0).unwrap(), 4);
    fs.release(a, fh).unwrap();
}

#[test]
fn inode_limit_gives_enospc() {
    let fs = fs_with(&[("nr_inodes", "10")]);
    let c = ctx();
    for i in 0..9 {
        fs.mknod(
            ROOT_INO,
            n(&format!("f{i}")),
            FileType::RegularFile,
            0o644,
            0,
            &c,
        )
        .unwrap();
    }
    assert_eq!(errno(fs.mkdir(ROOT_INO, n("d"), 0o755, &c)), libc::ENOSPC);
    assert_eq!(
        errno(fs.create(ROOT_INO, n("g"), 0o644, libc::O_RDWR, &c)),
        libc::ENOSPC
    );
    let st = fs.statfs().unwrap();
    assert_eq!((st.files, st.ffree), (10, 0));
    assert_eq!(names(&fs, ROOT_INO).len(), 9);
    fs.unlink(ROOT_INO, n("f0"), &c).unwrap();
    fs.mkdir(ROOT_INO, n("d"), 0o755, &c).unwrap();
    // Hard links take slots too.
    let f1 = fs.lookup(ROOT_INO, n("f1")).unwrap().ino;
    assert_eq!(errno(fs.link(f1, ROOT_INO, n("l"), &c)), libc::ENOSPC);
    fs.unlink(ROOT_INO, n("f2"), &c).unwrap();
    fs.link(f1, ROOT_INO, n("l"), &c).unwrap();
    // Renaming over one of two names of an inode frees a slot.
    fs.rename(ROOT_INO, n("f3"), ROOT_INO, n("l"), 0, &c)
        .unwrap();
    fs.mknod(ROOT_INO, n("g"), FileType::Fifo, 0o644, 0, &c)
        .unwrap();
    assert_eq!(fs.statfs().unwrap().ffree, 0);
}

#[test]
fn symlink_targets_are_held_to_the_size_limit() {
    let fs = fs_with(&[("size", "8K")]);
    let c = ctx();
    let target = vec![b'x'; 4000];
    fs.symlink(ROOT_INO, n("a"), &target, &c).unwrap();
    fs.symlink(ROOT_INO, n("b"), &target, &c).unwrap();
    assert_eq!(
        errno(fs.symlink(ROOT_INO, n("c"), &target, &c)),
        libc::ENOSPC
    );
    fs.unlink(ROOT_INO, n("a"), &c).unwrap();
    let a = fs.lookup(ROOT_INO, n("b")).unwrap();
    fs.forget(a.ino, 1);
    fs.symlink(ROOT_INO, n("c"), &target, &c).unwrap();
}

#[test]
fn concurrent_writers() {
    let fs = Arc::new(fs_with(&[("blocksize", "8K")]));
    let (shared, sfh) = new_file(&fs, ROOT_INO, "shared");
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let (own, fh) = new_file(&fs, ROOT_INO, &format!("own{t}"));
                for i in 0..200u64 {
                    let chunk = vec![t.wrapping_mul(31).wrapping_add(i as u8); 3000];
                    fs.write(own, fh, i * 3000, &chunk, 0).unwrap();
                    // Interleaved 1000-byte stripes of one shared file.
                    fs.write(
                        shared,
                        sfh,
                        (i * 4 + u64::from(t)) * 1000,
                        &[t + 1; 1000],
                        0,
                    )
                    .unwrap();
                }
                fs.release(own, fh).unwrap();
                own
            })
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        let own = h.join().unwrap();
        let data = read_all(&fs, own);
        assert_eq!(data.len(), 600_000);
        for (i, c) in data.chunks(3000).enumerate() {
            let want = (t as u8).wrapping_mul(31).wrapping_add(i as u8);
            assert!(c.iter().all(|&b| b == want));
        }
    }
    let data = read_all(&fs, shared);
    assert_eq!(data.len(), 800_000);
    for (k, c) in data.chunks(1000).enumerate() {
        assert!(c.iter().all(|&b| b == (k % 4) as u8 + 1), "stripe {k}");
    }
    fs.release(shared, sfh).unwrap();
}
