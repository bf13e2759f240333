//! `foliofs mount -t ramfs`: options, statfs, limits and concurrent writers,
//! checked through a real FUSE mount. Data is read back after dropping the
//! page cache, so what is compared is what the server stored.

use crate::common;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use rand::Rng;

use common::{drop_caches, foliofs_ok, Mount};

fn ramfs(opts: &str) -> Mount {
    Mount::new(Path::new("none"), Some("ramfs"), opts)
        .unwrap_or_else(|e| panic!("mount -t ramfs -o {opts:?}: {e}"))
}

/// The data paths a ramfs of this process can take here, as mount
/// options: `passthrough` where the kernel passes files through (root on
/// Linux 6.9 and later), and always `nopassthrough`, the server's.
fn data_paths() -> Vec<&'static str> {
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

fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs {}", p.display());
    // SAFETY: statvfs returned 0, so it filled the struct.
    unsafe { st.assume_init() }
}

/// Reads `p` from the server, not from the page cache.
fn read_fresh(p: &Path) -> Vec<u8> {
    assert!(drop_caches(), "cannot drop the page cache (needs root)");
    fs::read(p).unwrap()
}

fn mounts_line(mnt: &Path) -> String {
    let out = String::from_utf8(foliofs_ok(["mounts"])).unwrap();
    out.lines()
        .find(|l| l.contains(mnt.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} missing from `foliofs mounts`:\n{out}", mnt.display()))
        .to_owned()
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
    assert_eq!(statvfs(m.path()).f_bfree, before.f_bfree);
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

/// A shared read-write mapping of a whole file.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(f: &File, len: usize) -> Map {
        use std::os::unix::io::AsRawFd;
        // SAFETY: a fresh shared mapping of an open file; the result is
        // checked, and the mapping lives until `drop` unmaps it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Map { ptr: p.cast(), len }
    }

    fn get(&self, at: usize, n: usize) -> Vec<u8> {
        assert!(at + n <= self.len);
        // SAFETY: `at..at+n` lies inside the live mapping.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n).to_vec() }
    }

    fn set(&self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.len);
        // SAFETY: as in `get`; the mapping is writable and shared.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(at), data.len()) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made, once.
        unsafe {
            libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC);
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Write-only descriptors skip the page cache (direct I/O); readers,
/// mappings and appends through other descriptors must not notice.
#[test]
fn write_only_descriptors_stay_coherent_with_readers_and_mappings() {
    require!("fuse");
    for opts in ["", "blocksize=2M"] {
        let m = ramfs(opts);
        let p = m.path().join("c");
        let mut want = vec![b'A'; 20_000];
        fs::write(&p, &want).unwrap();
        let reader = File::open(&p).unwrap();
        let mut buf = [0u8; 5];
        reader.read_exact_at(&mut buf, 8190).unwrap();
        assert_eq!(&buf, b"AAAAA");
        let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let map = Map::new(&rw, want.len());
        assert_eq!(map.get(8190, 5), b"AAAAA");
        // A dirty page in the mapping, then a later write over it through a
        // write-only descriptor: the later write must win.
        map.set(12_000, b"MMMMM");
        let w = OpenOptions::new().write(true).open(&p).unwrap();
        w.write_all_at(b"BBBBB", 8190).unwrap();
        w.write_all_at(b"WWWWW", 12_000).unwrap();
        want[8190..8195].copy_from_slice(b"BBBBB");
        want[12_000..12_005].copy_from_slice(b"WWWWW");
        reader.read_exact_at(&mut buf, 8190).unwrap();
        assert_eq!(&buf, b"BBBBB", "{opts:?}: a reader kept stale cached bytes");
        assert_eq!(
            map.get(8190, 5),
            b"BBBBB",
            "{opts:?}: the mapping kept stale bytes"
        );
        assert_eq!(
            map.get(12_000, 5),
            b"WWWWW",
            "{opts:?}: the mapping's older bytes won"
        );
        drop(map);
        let mut a = OpenOptions::new().append(true).open(&p).unwrap();
        a.write_all(b"tail").unwrap();
        want.extend_from_slice(b"tail");
        assert_eq!(reader.metadata().unwrap().len(), want.len() as u64);
        let mut end = [0u8; 6];
        reader.read_exact_at(&mut end, 19_998).unwrap();
        assert_eq!(&end, b"AAtail");
        drop((reader, rw, w, a));
        assert!(
            read_fresh(&p) == want,
            "{opts:?}: the server holds other bytes"
        );
    }
}

/// The server's `AnonHugePages` in kB, from the pid `foliofs mounts` shows.
fn server_huge_kb(mnt: &Path) -> u64 {
    let line = mounts_line(mnt);
    let pid = line
        .split([',', ' '])
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    smaps
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no AnonHugePages in {smaps}"))
}

#[test]
fn huge_always_makes_2m_blocks_huge_pages() {
    require!("fuse");
    for bad in ["blocksize=64K,huge=always", "blocksize=2M,huge=within_size"] {
        let err = Mount::new(Path::new("none"), Some("ramfs"), bad)
            .err()
            .unwrap_or_else(|| panic!("{bad} mounted"));
        assert!(err.contains("huge="), "unclear error for {bad}: {err}");
    }
    let opts = "blocksize=2M,huge=always";
    if common::huge_unusable().is_some() {
        let err = Mount::new(Path::new("none"), Some("ramfs"), opts)
            .err()
            .expect("huge=always mounted where huge pages cannot be had");
        assert!(err.contains("huge"), "unclear error: {err}");
        return;
    }
    for path in data_paths() {
        huge_blocks(&format!("{opts},{path}"), path == "passthrough");
    }
}

fn huge_blocks(opts: &str, passed_through: bool) {
    let m = ramfs(opts);
    assert!(mounts_line(m.path()).contains("huge=always"));
    if passed_through {
        // The data is the kernel's: its page cache holds it in huge folios.
        let data = common::random_bytes(&mut common::rng(4), 8 << 20);
        let p = m.path().join("f");
        fs::write(&p, &data).unwrap();
        let folios = foliofs_testkit::folios::sizes(&p).unwrap();
        assert!(
            folios.get(&(2 << 20)).is_some_and(|&n| n >= 1),
            "8 MiB with huge=always, but the folios are {folios:?}"
        );
        assert!(read_fresh(&p) == data, "huge folios hold other bytes");
        return;
    }
    let before = server_huge_kb(m.path());
    let data = common::random_bytes(&mut common::rng(4), 8 << 20);
    let p = m.path().join("f");
    fs::write(&p, &data).unwrap();
    let after = server_huge_kb(m.path());
    // At least one of the four blocks (the kernel may fall back to small
    // pages for some when memory is fragmented).
    assert!(
        after >= before + 2048,
        "8 MiB in 2 MiB huge blocks, but AnonHugePages went from {before} to {after} kB"
    );
    assert!(read_fresh(&p) == data, "huge blocks hold other bytes");
    // A rewrite reuses the freed huge blocks from the pool.
    fs::remove_file(&p).unwrap();
    fs::write(&p, &data[..4 << 20]).unwrap();
    assert!(read_fresh(&p) == data[..4 << 20]);
}

/// A write by someone without CAP_FSETID drops set-user-ID, and
/// set-group-ID where group execute is set, whether it goes through the
/// page cache (the kernel drops them) or straight to the server (the
/// server must: write-only descriptors write directly).
#[test]
fn unprivileged_writes_drop_set_id_bits() {
    require!("fuse", "setpriv");
    let m = ramfs("allow_other");
    let cases = [
        ("write-only", "exec 3>>\"$1\" && printf x >&3"),
        ("read-write", "exec 3<>\"$1\" && printf x >&3"),
    ];
    for (i, (how, script)) in cases.iter().enumerate() {
        for (mode, want) in [(0o6777, 0o777), (0o6767, 0o2767)] {
            let p = m.path().join(format!("f{i}-{mode:o}"));
            fs::write(&p, b"abc").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            let out = common::run_timeout(
                std::process::Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .args(["sh", "-c", script, "sh"])
                    .arg(&p),
                std::time::Duration::from_secs(30),
            );
            assert!(
                out.status.success(),
                "{how} write as nobody failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Attributes are cached for a second; wait out that much.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let got = fs::metadata(&p).unwrap().mode() & 0o7777;
                if got == want {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{how} write left mode {got:o} on a {mode:o} file (want {want:o})"
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// Readers caching pages while a write-only descriptor overwrites the file
/// directly must not keep the old bytes afterwards.
#[test]
fn readers_during_direct_writes_see_the_new_bytes_after() {
    require!("fuse");
    const N: usize = 32 << 20;
    let m = ramfs("blocksize=64K");
    let p = m.path().join("race");
    fs::write(&p, vec![b'A'; N]).unwrap();
    let reader = std::sync::Arc::new(File::open(&p).unwrap());
    for trial in 0..4u8 {
        let fill = vec![b'B' + trial; 4 << 20];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (r, stop) = (reader.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = common::rng(u64::from(trial) * 2 + t);
                    let mut page = [0u8; 4096];
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let at = rng.gen_range(0..(N / 4096) as u64) * 4096;
                        r.read_exact_at(&mut page, at).unwrap();
                    }
                })
            })
            .collect();
        let w = OpenOptions::new().write(true).open(&p).unwrap();
        for at in (0..N).step_by(fill.len()) {
            w.write_all_at(&fill, at as u64).unwrap();
        }
        drop(w);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let mut page = [0u8; 4096];
        let stale = (0..N / 4096)
            .filter(|i| {
                reader.read_exact_at(&mut page, (i * 4096) as u64).unwrap();
                page.iter().any(|&b| b != fill[0])
            })
            .count();
        assert_eq!(
            stale, 0,
            "trial {trial}: {stale} pages kept their old bytes"
        );
    }
}

/// The kernel caches missing names too (a LOOKUP miss answered with node 0
/// and a lifetime): every way of making the name through the mount must
/// turn the cached miss into the new entry at once.
#[test]
fn names_cached_as_missing_appear_when_made_through_the_mount() {
    require!("fuse");
    let m = ramfs("");
    let p = |n: &str| m.path().join(n);
    let missing = |n: &str| {
        for _ in 0..2 {
            let e = fs::symlink_metadata(p(n)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{n}: {e}");
        }
    };
    // A create without O_EXCL goes straight to the cached miss.
    missing("file");
    fs::write(p("file"), b"abc").unwrap();
    assert_eq!(fs::metadata(p("file")).unwrap().len(), 3);
    assert_eq!(fs::read(p("file")).unwrap(), b"abc");
    missing("dir");
    fs::create_dir(p("dir")).unwrap();
    assert!(fs::metadata(p("dir")).unwrap().is_dir());
    missing("dir/inner");
    fs::write(p("dir/inner"), b"x").unwrap();
    assert_eq!(fs::read_dir(p("dir")).unwrap().count(), 1);
    missing("link");
    std::os::unix::fs::symlink("file", p("link")).unwrap();
    assert_eq!(fs::read_link(p("link")).unwrap(), Path::new("file"));
    missing("hard");
    fs::hard_link(p("file"), p("hard")).unwrap();
    assert_eq!(fs::metadata(p("hard")).unwrap().nlink(), 2);
    missing("moved");
    fs::rename(p("dir/inner"), p("moved")).unwrap();
    assert_eq!(fs::read(p("moved")).unwrap(), b"x");
    missing("dir/inner");
    // And back: removed names are missing again, and can be made again.
    fs::remove_file(p("file")).unwrap();
    missing("file");
    assert_eq!(fs::read(p("hard")).unwrap(), b"abc");
    fs::write(p("file"), b"new").unwrap();
    assert_eq!(fs::read(p("file")).unwrap(), b"new");
    fs::remove_dir(p("dir")).unwrap();
    missing("dir");
}

/// Entries and attributes stay cached for as long as the kernel likes (a
/// ramfs changes only through its mount), so every change made through it
/// must show at once, without waiting for a cache to expire.
#[test]
fn attributes_changed_through_the_mount_show_at_once() {
    require!("fuse");
    let m = ramfs("");
    let f = m.path().join("f");
    let md = || fs::metadata(&f).unwrap();
    let mut w = File::create(&f).unwrap();
    let made = md();
    assert_eq!(made.len(), 0);
    std::thread::sleep(std::time::Duration::from_millis(20));
    w.write_all(b"hello").unwrap();
    let after = md();
    assert_eq!(after.len(), 5);
    assert!(after.modified().unwrap() > made.modified().unwrap());
    // Another descriptor appends; a third truncates.
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(b" world")
        .unwrap();
    assert_eq!(md().len(), 11);
    assert_eq!(fs::read(&f).unwrap(), b"hello world");
    OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(md().len(), 2);
    assert_eq!(fs::read(&f).unwrap(), b"he");
    drop(w);
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(md().modified().unwrap(), t);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(md().mode() & 0o7777, 0o640);
    // Link counts and ctime, which the server changes as a side effect.
    let c0 = md().ctime_nsec() as i128 + md().ctime() as i128 * 1_000_000_000;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::hard_link(&f, m.path().join("g")).unwrap();
    assert_eq!(md().nlink(), 2);
    let c1 = md().ctime_nsec() as i128 + md().ctime() as i128 * 1_000_000_000;
    assert!(c1 > c0, "link left ctime at {c0}");
    fs::remove_file(m.path().join("g")).unwrap();
    assert_eq!(md().nlink(), 1);
    // A directory's size, times and link count follow what is made in it.
    let d = m.path().join("d");
    fs::create_dir(&d).unwrap();
    let d0 = fs::metadata(&d).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::create_dir(d.join("sub")).unwrap();
    let d1 = fs::metadata(&d).unwrap();
    assert_eq!(d1.nlink(), d0.nlink() + 1);
    assert!(d1.modified().unwrap() > d0.modified().unwrap());
    fs::rename(&f, d.join("f")).unwrap();
    assert_eq!(fs::metadata(d.join("f")).unwrap().len(), 2);
    assert!(fs::metadata(&d).unwrap().modified().unwrap() > d1.modified().unwrap());
}

/// As root a ramfs's files live in backing files the kernel reads and
/// writes itself: no READ or WRITE reaches the server, every descriptor of
/// a file (and a mapping of it) sees the same bytes, and `--stats` shows
/// what the backing files hold. With the writeback cache the kernel passes
/// nothing through, so asking for both is refused.
#[test]
fn passthrough_serves_reads_writes_and_mappings_in_the_kernel() {
    require!("fuse");
    if !data_paths().contains(&"passthrough") {
        eprintln!(
            "skip: passthrough_serves_reads_writes_and_mappings_in_the_kernel: no passthrough here"
        );
        return;
    }
    let err = Mount::new(Path::new("none"), Some("ramfs"), "passthrough,writeback")
        .err()
        .expect("passthrough with writeback mounted");
    assert!(err.contains("writeback"), "unclear refusal: {err}");
    // The default for root.
    let m = ramfs("blocksize=64K");
    assert!(mounts_line(m.path()).contains("data=passthrough"));
    let data = common::random_bytes(&mut common::rng(11), 8 << 20);
    let p = m.path().join("f");
    fs::write(&p, &data).unwrap();
    let a = File::open(&p).unwrap();
    let b = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    b.write_all_at(b"changed", 100).unwrap();
    let mut got = [0u8; 7];
    a.read_exact_at(&mut got, 100).unwrap();
    assert_eq!(&got, b"changed");
    // A shared mapping and a write(2) see each other's bytes.
    // SAFETY: a new shared mapping of an open file, unmapped below; the
    // test reads and writes only inside it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&b),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: inside the 8 MiB mapping made above.
    unsafe {
        assert_eq!(*(map as *const u8).add(100), b'c');
        *(map as *mut u8).add(5 << 20) = 0xAB;
    }
    let mut one = [0u8; 1];
    a.read_exact_at(&mut one, 5 << 20).unwrap();
    assert_eq!(one[0], 0xAB);
    // SAFETY: the mapping made above, used no more.
    unsafe { libc::munmap(map, 8 << 20) };
    drop((a, b));
    // The server publishes its figures every 100 ms: wait (bounded) for
    // the ones after the writes.
    let figures = || {
        let stats = String::from_utf8(foliofs_ok(["mounts", "--stats"])).unwrap();
        let ours: Vec<String> = stats
            .lines()
            .skip_while(|l| !l.contains(m.path().to_str().unwrap()))
            .take(3)
            .map(str::to_owned)
            .collect();
        let requests = ours
            .iter()
            .find(|l| l.contains("requests:"))
            .cloned()
            .unwrap_or_default();
        let backing = ours
            .iter()
            .find_map(|l| l.trim().strip_prefix("ramfs: ").map(str::to_owned))
            .unwrap_or_default();
        let bytes: u64 = backing
            .split(' ')
            .find_map(|kv| kv.strip_prefix("backing_bytes="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (requests, backing, bytes)
    };
    common::wait_until(Duration::from_secs(10), || figures().2 >= 8 << 20);
    let (requests, backing, bytes) = figures();
    assert!(
        !requests.contains(" read=") && !requests.contains(" write="),
        "reads or writes reached the server: {requests}"
    );
    assert!(bytes >= 8 << 20, "{backing}");
    let mut want = data.clone();
    want[100..107].copy_from_slice(b"changed");
    want[5 << 20] = 0xAB;
    assert!(read_fresh(&p) == want, "the file holds other bytes");
}

/// On either data path an open file outlives its name, whether unlinked
/// or renamed over, and gives its memory back at its last close;
/// copy_file_range and fsync work (the kernel copies through the backing
/// files itself on passthrough).
#[test]
fn open_files_outlive_unlink_and_rename_and_copy_between_files() {
    require!("fuse");
    use std::os::fd::AsRawFd;
    for path in data_paths() {
        let m = ramfs(&format!("blocksize=64K,{path}"));
        let old = common::random_bytes(&mut common::rng(21), 3 << 20);
        let new = common::random_bytes(&mut common::rng(22), 1 << 20);
        let (a, b) = (m.path().join("a"), m.path().join("b"));
        fs::write(&a, &old).unwrap();
        fs::write(&b, &new).unwrap();
        let held = OpenOptions::new().read(true).write(true).open(&a).unwrap();
        // b replaces a: the open descriptor keeps a's bytes and may write.
        fs::rename(&b, &a).unwrap();
        let mut got = vec![0u8; old.len()];
        held.read_exact_at(&mut got, 0).unwrap();
        assert!(got == old, "{path}: the renamed-over file changed");
        held.write_all_at(b"still", 0).unwrap();
        assert!(
            fs::read(&a).unwrap() == new,
            "{path}: the new name holds other bytes"
        );
        // Unlinked while open: still there to the descriptor.
        fs::remove_file(&a).unwrap();
        held.read_exact_at(&mut got[..5], 0).unwrap();
        assert_eq!(&got[..5], b"still", "{path}");
        let used = statvfs(m.path());
        drop(held);
        let freed = statvfs(m.path());
        assert!(
            freed.f_bfree > used.f_bfree,
            "{path}: closing the unlinked file freed nothing ({} then {})",
            used.f_bfree,
            freed.f_bfree
        );
        // copy_file_range, then fsync of both.
        let src = m.path().join("src");
        fs::write(&src, &old).unwrap();
        let s = File::open(&src).unwrap();
        let d = File::create(m.path().join("dst")).unwrap();
        let mut left = old.len();
        while left > 0 {
            // SAFETY: both descriptors are open for the call; null offsets
            // use and advance the files' own.
            let n = unsafe {
                libc::copy_file_range(
                    s.as_raw_fd(),
                    std::ptr::null_mut(),
                    d.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    0,
                )
            };
            assert!(
                n > 0,
                "{path}: copy_file_range: {}",
                std::io::Error::last_os_error()
            );
            left -= n as usize;
        }
        d.sync_all().unwrap();
        s.sync_all().unwrap();
        drop((s, d));
        assert!(
            read_fresh(&m.path().join("dst")) == old,
            "{path}: the copy differs"
        );
    }
}
