//! `foliofs mount -t ramfs`: options, statfs, limits and concurrent writers,
//! checked through a real FUSE mount. Data is read back after dropping the
//! page cache, so what is compared is what the server stored.

use crate::common;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{drop_caches, Mount};

pub(super) fn ramfs(opts: &str) -> Mount {
    Mount::new(Path::new("none"), Some("ramfs"), opts)
        .unwrap_or_else(|e| panic!("mount -t ramfs -o {opts:?}: {e}"))
}

/// The data paths a ramfs of this process can take here, as mount
/// options: `passthrough` where the kernel passes files through (root on
/// Linux 6.9 and later), and always `nopassthrough`, the server's.
pub(super) fn data_paths() -> Vec<&'static str> {
    static PASSES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let passes = *PASSES.get_or_init(|| {
        Mount::new(Path::new("none"), Some("ramfs"), "passthrough").is_ok_and(|m| {
            let on = mounts_line(m.path()).contains("data=passthrough");
            drop(m);
            on
        })
    });
    if passes {
        vec!["passthrough", "nopassthrough"]
    } else {
        eprintln!("note: ramfs passthrough is not available here (root, Linux 6.9): the server's path only");
        vec!["nopassthrough"]
    }
}

pub(super) fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs {}", p.display());
    // SAFETY: statvfs returned 0, so it filled the struct.
    unsafe { st.assume_init() }
}

/// Reads `p` from the server, not from the page cache.
pub(super) fn read_fresh(p: &Path) -> Vec<u8> {
    assert!(drop_caches(), "cannot drop the page cache (needs root)");
    fs::read(p).unwrap()
}

pub(super) fn mounts_line(mnt: &Path) -> String {
    common::mounts_line_of(None, mnt)
}

#[test]
fn options_root_and_statfs() {
    require!("fuse");
    for (opt, bs) in [
        ("", 4096u64),
        ("blocksize=1", 4096),
        ("blocksize=12000", 8192),
        ("blocksize=64K", 65536),
        ("blocksize=3M", 2 << 20),
    ] {
        let m = ramfs(opt);
        let st = statvfs(m.path());
        assert_eq!(st.f_bsize, bs, "f_bsize with -o {opt:?}");
        assert_eq!(st.f_frsize, bs, "f_frsize with -o {opt:?}");
        let line = mounts_line(m.path());
        if bs == 4096 {
            assert!(!line.contains("blocksize="), "{line}");
        } else {
            assert!(line.contains(&format!("blocksize={bs}")), "{line}");
        }
        let root = fs::metadata(m.path()).unwrap();
        assert_eq!(root.mode() & 0o7777, 0o755);
        assert_eq!(root.blksize(), bs);
    }
    let m = ramfs("mode=1777,uid=123,gid=456");
    let root = fs::metadata(m.path()).unwrap();
    assert_eq!(
        (root.mode() & 0o7777, root.uid(), root.gid()),
        (0o1777, 123, 456)
    );
    assert!(mounts_line(m.path()).contains("mode=1777"));
}

#[test]
fn blocksize_zero_is_refused() {
    require!("fuse");
    let r = Mount::new(Path::new("none"), Some("ramfs"), "blocksize=0");
    let err = r.err().expect("blocksize=0 mounted");
    assert!(err.contains("blocksize"), "unclear error: {err}");
    let r = Mount::new(Path::new("none"), Some("ramfs"), "size=12Q");
    let err = r.err().expect("size=12Q mounted");
    assert!(err.contains("size"), "unclear error: {err}");
}

#[test]
fn holes_take_no_blocks_and_statfs_counts_use() {
    require!("fuse");
    for path in data_paths() {
        holes_and_statfs(path);
    }
}

fn holes_and_statfs(path: &str) {
    let m = ramfs(&format!("blocksize=64K,size=64M,{path}"));
    let before = statvfs(m.path());
    assert_eq!(before.f_blocks, 1024);
    let p = m.path().join("sparse");
    let f = File::create(&p).unwrap();
    f.write_all_at(b"tail", 40 << 20).unwrap();
    f.write_all_at(&[1u8; 100_000], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.len(), (40 << 20) + 4);
    let after = statvfs(m.path());
    if path == "passthrough" {
        // The kernel's tmpfs chose the folios (huge=within_size: up to
        // 2 MiB around a small write inside the size): the blocks are
        // the memory its folios hold, in whole 64 KiB blocks, at least the
        // three the data touches.
        let held: u64 = foliofs_testkit::folios::sizes(&p)
            .unwrap()
            .iter()
            .map(|(size, n)| size.div_ceil(65536) * n)
            .sum();
        let blocks = md.blocks() / (65536 / 512);
        assert_eq!(md.blocks() % (65536 / 512), 0, "{path}");
        assert!(
            blocks >= 3 && blocks <= held.max(3),
            "{blocks} blocks, folios hold {held}"
        );
        assert_eq!(before.f_bfree - after.f_bfree, blocks, "{path}");
    } else {
        // Two blocks for the head (100,000 bytes), one for the tail.
        assert_eq!(md.blocks(), 3 * 65536 / 512, "{path}");
        assert_eq!(before.f_bfree - after.f_bfree, 3, "{path}");
    }
    assert_eq!(before.f_ffree - after.f_ffree, 1);
    let data = read_fresh(&p);
    assert!(data[..100_000].iter().all(|&b| b == 1));
    assert!(data[100_000..40 << 20].iter().all(|&b| b == 0));
    assert_eq!(&data[40 << 20..], b"tail");
    fs::remove_file(&p).unwrap();
    // The last close (read_fresh's) reaches the server as a RELEASE the
    // kernel sends after close(2) returns, and an unlinked file's blocks
    // are freed with its last open: they come back shortly, not at once.
    let mut free = 0;
    let back = common::wait_until(std::time::Duration::from_secs(10), || {
        free = statvfs(m.path()).f_bfree;
        free == before.f_bfree
    });
    assert!(
        back,
        "{path}: {free} blocks free after the unlink, {} before",
        before.f_bfree
    );
}

/// Writes 1 MiB chunks of seeded random bytes to `p` until a write fails;
/// returns the error with the number of bytes write(2) acknowledged before
/// it (short writes included).
fn fill(p: &Path, seed: u64) -> (u64, std::io::Error) {
    let mut f = File::create(p).unwrap();
    let mut rng = common::rng(seed);
    let mut acked = 0u64;
    loop {
        let chunk = common::random_bytes(&mut rng, 1 << 20);
        let mut off = 0;
        while off < chunk.len() {
            match f.write(&chunk[off..]) {
                Ok(0) => return (acked, std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Ok(n) => {
                    off += n;
                    acked += n as u64;
                }
                Err(e) => return (acked, e),
            }
        }
        assert!(acked < 1 << 30, "no ENOSPC after 1 GiB");
    }
}

#[test]
fn size_limit_gives_enospc_and_keeps_earlier_data() {
    require!("fuse");
    for bs in ["4K", "2M"] {
        let m = ramfs(&format!("size=24M,blocksize={bs}"));
        let keep = m.path().join("keep");
        let mut rng = common::rng(7);
        let kept = common::random_bytes(&mut rng, 5 << 20);
        let mut f = File::create(&keep).unwrap();
        f.write_all(&kept).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let (done, err) = fill(&m.path().join("fill"), 9);
        assert_eq!(
            err.raw_os_error(),
            Some(libc::ENOSPC),
            "bs {bs}: expected ENOSPC, got {err}"
        );
        assert!(done >= 17 << 20, "bs {bs}: only {done} bytes fit");
        assert_eq!(statvfs(m.path()).f_bfree, 0, "bs {bs}");
        // New files cannot get data either, but earlier data is whole.
        let mut more = File::create(m.path().join("more")).unwrap();
        let r = more
            .write_all(&[3u8; 1 << 20])
            .and_then(|()| more.sync_all());
        assert!(r.is_err(), "bs {bs}: a write past the limit succeeded");
        drop(more);
        assert_eq!(read_fresh(&keep), kept, "bs {bs}: earlier file damaged");
        // Every byte write(2) acknowledged in the file that ran out is
        // there too: the refusal came at the write, not later.
        let got = read_fresh(&m.path().join("fill"));
        let mut rng = common::rng(9);
        let mut want = Vec::new();
        while (want.len() as u64) < done {
            want.extend(common::random_bytes(&mut rng, 1 << 20));
        }
        assert_eq!(&got[..done as usize], &want[..done as usize], "bs {bs}");
        // Freeing space makes room again.
        fs::remove_file(m.path().join("fill")).unwrap();
        let _ = fs::remove_file(m.path().join("more"));
        fs::write(m.path().join("again"), vec![4u8; 4 << 20]).unwrap();
        assert_eq!(read_fresh(&m.path().join("again")), vec![4u8; 4 << 20]);
    }
}

#[test]
fn inode_limit_gives_enospc() {
    require!("fuse");
    let m = ramfs("nr_inodes=50");
    let mut made = Vec::new();
    let err = loop {
        let p = m.path().join(format!("f{}", made.len()));
        match fs::write(&p, format!("file {}", made.len())) {
            Ok(()) => made.push(p),
            Err(e) => break e,
        }
        assert!(made.len() <= 50, "more than 50 inodes");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // The root is one of the 50.
    assert_eq!(made.len(), 49);
    let e = fs::create_dir(m.path().join("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    let e = std::os::unix::fs::symlink("x", m.path().join("l")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    let st = statvfs(m.path());
    assert_eq!((st.f_files, st.f_ffree), (50, 0));
    assert!(drop_caches());
    for (i, p) in made.iter().enumerate() {
        assert_eq!(fs::read_to_string(p).unwrap(), format!("file {i}"));
    }
    fs::remove_file(&made[0]).unwrap();
    fs::create_dir(m.path().join("d")).unwrap();
}

#[test]
fn concurrent_writers_to_different_files_and_to_one_file() {
    require!("fuse");
    for bs in ["4K", "64K", "2M"] {
        let m = ramfs(&format!("blocksize={bs}"));
        let shared = m.path().join("shared");
        File::create(&shared).unwrap();
        const THREADS: u64 = 4;
        const STRIPE: u64 = 96 * 1024 + 13;
        const ROUNDS: u64 = 48;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let own = m.path().join(format!("own{t}"));
                let shared = shared.clone();
                s.spawn(move || {
                    let mut rng = common::rng(100 + t);
                    let mut f = File::create(&own).unwrap();
                    let g = OpenOptions::new().write(true).open(&shared).unwrap();
                    for r in 0..ROUNDS {
                        f.write_all(&common::random_bytes(&mut rng, 70_001))
                            .unwrap();
                        let stripe = vec![(t * ROUNDS + r) as u8; STRIPE as usize];
                        g.write_all_at(&stripe, (r * THREADS + t) * STRIPE).unwrap();
                    }
                    f.sync_all().unwrap();
                    g.sync_all().unwrap();
                });
            }
        });
        assert!(drop_caches());
        for t in 0..THREADS {
            let mut rng = common::rng(100 + t);
            let want: Vec<u8> = (0..ROUNDS)
                .flat_map(|_| common::random_bytes(&mut rng, 70_001))
                .collect();
            let mut got = Vec::new();
            File::open(m.path().join(format!("own{t}")))
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            assert!(got == want, "bs {bs}: own{t} differs");
        }
        let got = fs::read(&shared).unwrap();
        assert_eq!(got.len() as u64, THREADS * ROUNDS * STRIPE, "bs {bs}");
        for (k, c) in got.chunks(STRIPE as usize).enumerate() {
            let (r, t) = (k as u64 / THREADS, k as u64 % THREADS);
            let want = (t * ROUNDS + r) as u8;
            assert!(c.iter().all(|&b| b == want), "bs {bs}: stripe {k} wrong");
        }
    }
}

#[test]
fn unmounted_data_is_gone() {
    require!("fuse");
    let dir = tempfile::tempdir().unwrap();
    {
        let m = Mount::at(Path::new("none"), dir.path(), Some("ramfs"), "").unwrap();
        fs::write(m.path().join("f"), b"x").unwrap();
        fs::set_permissions(m.path().join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        m.unmount().unwrap();
    }
    let m = Mount::at(Path::new("none"), dir.path(), Some("ramfs"), "").unwrap();
    let e = fs::metadata(m.path().join("f")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn seek_data_hole_and_punch_through_the_mount() {
    require!("fuse");
    use std::os::fd::AsRawFd;
    let seek = |f: &File, off: i64, whence: i32| {
        // SAFETY: a plain system call on a descriptor the test owns.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(errno())
        } else {
            Ok(r)
        }
    };
    for (path, (bs, b)) in data_paths()
        .into_iter()
        .flat_map(|p| [(p, ("4K", 4096i64)), (p, ("64K", 65536))])
    {
        let m = ramfs(&format!("blocksize={bs},{path}"));
        let p = m.path().join("f");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.write_all_at(&vec![7u8; 8 * b as usize], 0).unwrap();
        // SAFETY: as above.
        let punch = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                2 * b,
                3 * b,
            )
        };
        assert_eq!(punch, 0, "punch: errno {}", errno());
        // While it is open for writing, dirty pages in the kernel may cover
        // any hole the server sees, so none is reported; a file passed
        // through has no such pages: the backing file is the file.
        let hole = if path == "passthrough" { 2 * b } else { 8 * b };
        assert_eq!(seek(&f, 0, libc::SEEK_HOLE), Ok(hole), "bs {bs} {path}");
        drop(f);
        let f = File::open(&p).unwrap();
        assert_eq!(seek(&f, 0, libc::SEEK_HOLE), Ok(2 * b), "bs {bs}");
        assert_eq!(seek(&f, 2 * b, libc::SEEK_DATA), Ok(5 * b), "bs {bs}");
        assert_eq!(seek(&f, 5 * b + 1, libc::SEEK_HOLE), Ok(8 * b), "bs {bs}");
        assert_eq!(
            seek(&f, 8 * b, libc::SEEK_DATA),
            Err(libc::ENXIO),
            "bs {bs}"
        );
        let md = fs::metadata(&p).unwrap();
        assert_eq!(md.len(), 8 * b as u64);
        assert_eq!(md.blocks(), 5 * b as u64 / 512, "bs {bs}");
        let got = read_fresh(&p);
        let b = b as usize;
        assert!(got[..2 * b].iter().all(|&x| x == 7));
        assert!(got[2 * b..5 * b].iter().all(|&x| x == 0));
        assert!(got[5 * b..].iter().all(|&x| x == 7));
    }
}

#[test]
fn xattrs_through_the_mount() {
    require!("fuse");
    let m = ramfs("");
    let p = m.path().join("f");
    fs::write(&p, b"x").unwrap();
    let c = cpath(&p);
    let set = |name: &str, v: &[u8], flags: i32| {
        let n = std::ffi::CString::new(name).unwrap();
        // SAFETY: valid NUL-terminated strings and a buffer of `v.len()` bytes.
        let rc =
            unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags) };
        if rc == 0 {
            0
        } else {
            errno()
        }
    };
    let get = |name: &str, cap: usize| -> Result<Vec<u8>, i32> {
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; cap];
        // SAFETY: `buf` has `cap` writable bytes.
        let rc = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), cap) };
        if rc < 0 {
            return Err(errno());
        }
        buf.truncate(rc as usize);
        Ok(buf)
    };
    assert_eq!(set("user.one", b"first", 0), 0);
    assert_eq!(set("trusted.two", b"2", 0), 0);
    assert_eq!(set("security.three", b"", 0), 0);
    assert_eq!(set("user.one", b"again", libc::XATTR_CREATE), libc::EEXIST);
    assert_eq!(set("user.none", b"v", libc::XATTR_REPLACE), libc::ENODATA);
    assert_eq!(set("user.one", b"second", libc::XATTR_REPLACE), 0);
    assert_eq!(get("user.one", 64), Ok(b"second".to_vec()));
    assert_eq!(get("user.one", 3), Err(libc::ERANGE));
    assert_eq!(get("trusted.two", 64), Ok(b"2".to_vec()));
    assert_eq!(get("security.three", 64), Ok(Vec::new()));
    assert_eq!(get("user.none", 64), Err(libc::ENODATA));
    let mut list = vec![0u8; 256];
    // SAFETY: `list` has 256 writable bytes.
    let n = unsafe { libc::listxattr(c.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(n > 0, "listxattr: errno {}", errno());
    let mut names: Vec<&[u8]> = list[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    assert_eq!(names, [&b"security.three"[..], b"trusted.two", b"user.one"]);
    let name = std::ffi::CString::new("user.one").unwrap();
    // SAFETY: valid NUL-terminated strings.
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), name.as_ptr()) }, 0);
    assert_eq!(get("user.one", 64), Err(libc::ENODATA));
}

#[test]
fn readdir_stays_correct_while_the_directory_changes() {
    require!("fuse");
    let m = ramfs("");
    let d = m.path().join("d");
    fs::create_dir(&d).unwrap();
    const N: usize = 3000;
    for i in 0..N {
        File::create(d.join(format!("entry-{i:05}"))).unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut removed = std::collections::BTreeSet::new();
    let mut it = fs::read_dir(&d).unwrap();
    for _ in 0..100 {
        let name = it
            .next()
            .unwrap()
            .unwrap()
            .file_name()
            .into_string()
            .unwrap();
        assert!(seen.insert(name));
    }
    // Remove half of what is left, add as many new names, then go on.
    for i in (0..N).step_by(2) {
        let name = format!("entry-{i:05}");
        if !seen.contains(&name) {
            fs::remove_file(d.join(&name)).unwrap();
            removed.insert(name);
        }
        File::create(d.join(format!("new-{i:05}"))).unwrap();
    }
    for e in it {
        let name = e.unwrap().file_name().into_string().unwrap();
        // A removed or added name may or may not show (POSIX leaves it
        // open, and the C library buffers entries); nothing may repeat.
        assert!(seen.insert(name.clone()), "{name} listed twice");
    }
    for i in 0..N {
        let name = format!("entry-{i:05}");
        if !removed.contains(&name) {
            assert!(
                seen.contains(&name),
                "{name} was there throughout but not listed"
            );
        }
    }
}
