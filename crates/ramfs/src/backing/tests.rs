//! A ramfs whose file bodies live in the pool, through the trait as the
//! server path uses it and through the backing file as the kernel would
//! (passthrough writes go straight to it). Mounting the pool needs
//! `CAP_SYS_ADMIN`: without it each test says so and passes.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;

use foliofs_vfs::{Ctx, Error, FileSystem, Ino, Scratch, SetAttr, TimeSet, Timespec};

use crate::{Options, RamFs};

fn ctx() -> Ctx {
    Ctx {
        uid: 1000,
        gid: 1000,
        pid: 1,
        umask: 0o022,
    }
}

/// A backed ramfs with these options, or `None` (and a line saying why)
/// where the pool cannot be mounted.
fn backed(test: &str, opts: &[(&str, &str)]) -> Option<RamFs> {
    let mut o = Options::default();
    for (k, v) in opts {
        assert!(o.set(k, Some(v)).unwrap());
    }
    match RamFs::new_backed(&o) {
        Ok(fs) => Some(fs),
        Err(e) => {
            eprintln!("skip: {test}: needs CAP_SYS_ADMIN to mount the pool ({e})");
            None
        }
    }
}

fn create(fs: &RamFs, name: &str) -> (Ino, u64) {
    let (a, fh) = fs
        .create(fs.root(), OsStr::new(name), 0o644, libc::O_RDWR, &ctx())
        .unwrap();
    (a.ino, fh)
}

fn read(fs: &RamFs, ino: Ino, off: u64, len: u32) -> Vec<u8> {
    let mut s = Scratch::new();
    fs.read(ino, off, len, &mut s).unwrap().to_vec()
}

#[test]
fn data_lives_in_one_backing_file_per_inode() {
    let Some(fs) = backed(
        "data_lives_in_one_backing_file_per_inode",
        &[("blocksize", "64K")],
    ) else {
        return;
    };
    assert!(fs.is_backed());
    let (ino, fh) = create(&fs, "f");
    let file = fs.backing_file(ino).expect("a backed file");
    // Every open gets the same file, and a link is the same inode.
    let fh2 = fs.open(ino, libc::O_RDONLY).unwrap();
    let ino_of = |f: &std::fs::File| std::os::unix::fs::MetadataExt::ino(&f.metadata().unwrap());
    assert_eq!(ino_of(&file), ino_of(&fs.backing_file(ino).unwrap()));
    assert!(fs.backing_file(fs.root()).is_none());
    assert_eq!(fs.write(ino, fh, 100_000, b"tail", 0).unwrap(), 4);
    assert_eq!(read(&fs, ino, 99_998, 10), b"\0\0tail");
    // What the kernel writes through the backing file is what a read here
    // and getattr see.
    file.write_at(b"head", 0).unwrap();
    file.write_at(b"far", 300_000).unwrap();
    assert_eq!(read(&fs, ino, 0, 4), b"head");
    let a = fs.getattr(ino).unwrap();
    assert_eq!(a.size, 300_003);
    // Three pages touched, counted in whole 64 KiB blocks.
    assert_eq!(a.blocks % (65536 / 512), 0, "{a:?}");
    assert!(a.blocks >= 65536 / 512, "{a:?}");
    assert!(fs.backing_bytes().unwrap() >= 3 * 4096);
    fs.release(ino, fh).unwrap();
    fs.release(ino, fh2).unwrap();
}

#[test]
fn truncate_allocate_punch_and_seek_act_on_the_backing_file() {
    let Some(fs) = backed(
        "truncate_allocate_punch_and_seek_act_on_the_backing_file",
        &[],
    ) else {
        return;
    };
    let (ino, fh) = create(&fs, "f");
    fs.write(ino, fh, 0, &[7u8; 3 * 4096], 0).unwrap();
    let set = SetAttr {
        size: Some(5000),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, &set, &ctx()).unwrap().size, 5000);
    assert_eq!(read(&fs, ino, 4990, 100).len(), 10);
    fs.fallocate(ino, 0, 64 << 10, 0).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, 64 << 10);
    // tmpfs counts allocated but unwritten pages as holes (as ext4 does
    // unwritten extents): written ones are data.
    fs.write(ino, fh, 8192, &[8u8; 4096], 0).unwrap();
    fs.fallocate(
        ino,
        4096,
        4096,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    assert_eq!(fs.lseek(ino, 0, libc::SEEK_HOLE).unwrap(), 4096);
    assert_eq!(fs.lseek(ino, 4096, libc::SEEK_DATA).unwrap(), 8192);
    assert_eq!(
        fs.lseek(ino, 1 << 20, libc::SEEK_DATA).unwrap_err().errno(),
        libc::ENXIO
    );
    assert_eq!(read(&fs, ino, 4096, 4096), vec![0u8; 4096]);
    assert_eq!(read(&fs, ino, 0, 10), [7u8; 10]);
    // A mode tmpfs does not know is refused as ramfs refuses it.
    assert!(fs.fallocate(ino, 0, 10, 0x100).is_err());
    fs.release(ino, fh).unwrap();
}

#[test]
fn the_size_limit_is_the_kernels_and_nothing_stored_is_lost() {
    let Some(fs) = backed(
        "the_size_limit_is_the_kernels_and_nothing_stored_is_lost",
        &[("size", "1M")],
    ) else {
        return;
    };
    let (ino, fh) = create(&fs, "f");
    let data: Vec<u8> = (0..(2 << 20)).map(|i| (i % 251) as u8).collect();
    // The server path stores what fits and says so.
    let n = fs.write(ino, fh, 0, &data, 0).unwrap() as usize;
    assert!(n > 0 && n <= 1 << 20, "{n}");
    assert!(matches!(
        fs.write(ino, fh, n as u64, &data[n..], 0),
        Err(Error::NoSpace)
    ));
    // The kernel's own write through the backing file is refused too.
    let file = fs.backing_file(ino).unwrap();
    let e = file.write_at(&data[..1 << 20], n as u64).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(read(&fs, ino, 0, n as u32), &data[..n]);
    let st = fs.statfs().unwrap();
    assert_eq!(st.blocks, (1 << 20) / 4096);
    assert!(st.bfree < 4, "{st:?}");
    fs.release(ino, fh).unwrap();
}

#[test]
fn an_unlinked_file_gives_its_memory_back_at_the_last_release() {
    let Some(fs) = backed(
        "an_unlinked_file_gives_its_memory_back_at_the_last_release",
        &[],
    ) else {
        return;
    };
    let (ino, fh) = create(&fs, "f");
    fs.write(ino, fh, 0, &vec![1u8; 1 << 20], 0).unwrap();
    fs.unlink(fs.root(), OsStr::new("f"), &ctx()).unwrap();
    assert!(fs.backing_bytes().unwrap() >= 1 << 20);
    assert_eq!(read(&fs, ino, 0, 3), [1, 1, 1]);
    fs.release(ino, fh).unwrap();
    assert!(fs.backing_bytes().unwrap() < 1 << 20);
    assert!(fs.backing_file(ino).is_none());
}

#[test]
fn times_set_here_hold_and_writes_there_move_them() {
    let Some(fs) = backed("times_set_here_hold_and_writes_there_move_them", &[]) else {
        return;
    };
    let (ino, fh) = create(&fs, "f");
    let old = Timespec {
        sec: 1_000_000_000,
        nsec: 5,
    };
    let set = SetAttr {
        mtime: Some(TimeSet::At(old)),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, &set, &ctx()).unwrap().mtime, old);
    assert_eq!(fs.getattr(ino).unwrap().mtime, old);
    let before = fs.getattr(ino).unwrap().ctime;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs.backing_file(ino).unwrap().write_at(b"x", 0).unwrap();
    let a = fs.getattr(ino).unwrap();
    assert!(a.mtime > old && a.ctime > before, "{a:?}");
    fs.release(ino, fh).unwrap();
}

#[test]
fn a_new_files_descriptor_goes_to_its_first_open_and_what_is_written_there_counts() {
    let Some(fs) = backed(
        "a_new_files_descriptor_goes_to_its_first_open_and_what_is_written_there_counts",
        &[],
    ) else {
        return;
    };
    let (ino, fh) = create(&fs, "f");
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.size, a.blocks), (0, 0));
    // The create's own descriptor, which the kernel would write through;
    // nothing here opens the file by name after it.
    let file = fs.backing_file(ino).expect("a backed file");
    file.write_at(&[5u8; 10_000], 0).unwrap();
    let a = fs.getattr(ino).unwrap();
    assert_eq!(a.size, 10_000, "{a:?}");
    assert!(a.blocks >= 3 * 8, "{a:?}");
    fs.release(ino, fh).unwrap();

    // A time before 1970 set on a file nothing has opened holds.
    let (ino, fh) = create(&fs, "g");
    let old = Timespec {
        sec: -86_400,
        nsec: 5,
    };
    let set = SetAttr {
        mtime: Some(TimeSet::At(old)),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, &set, &ctx()).unwrap().mtime, old);
    assert_eq!(fs.getattr(ino).unwrap().mtime, old);
    fs.release(ino, fh).unwrap();
}
