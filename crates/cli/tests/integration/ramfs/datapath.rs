//! ramfs data paths through a real FUSE mount: direct writes beside
//! readers and mappings, huge-page blocks, set-ID bits dropped on writes,
//! the kernel's caches of names and attributes, passthrough, and open
//! files that outlive unlink and rename.

use crate::common;

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use foliofs_testkit::mapping::Mapping;
use rand::Rng;

use common::{foliofs_ok, Mount};

use super::behaviour::{data_paths, mounts_line, ramfs, read_fresh, statvfs};

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
        let map = Mapping::read_write(&rw, want.len()).unwrap_or_else(|e| panic!("mmap: {e}"));
        assert_eq!(map.get(8190, 5), b"AAAAA");
        // A dirty page in the mapping, then a later write over it through a
        // write-only descriptor: the later write must win.
        map.write(12_000, b"MMMMM");
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
        // Its dirty page written back before it goes, so what follows
        // reads settled bytes.
        let _ = map.sync();
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
    let map = Mapping::read_write(&b, 8 << 20).unwrap();
    assert_eq!(map.touch(100), b'c');
    map.write(5 << 20, &[0xAB]);
    let mut one = [0u8; 1];
    a.read_exact_at(&mut one, 5 << 20).unwrap();
    assert_eq!(one[0], 0xAB);
    drop(map);
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
        // The kernel sends the server's RELEASE after close(2) returns, so
        // the blocks come back soon after, not at once.
        let mut freed = statvfs(m.path());
        common::wait_until(Duration::from_secs(5), || {
            freed = statvfs(m.path());
            freed.f_bfree > used.f_bfree
        });
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

/// A passed-through ramfs keeps each file's bytes in a named file of its
/// own tmpfs and holds a descriptor only while a file is in use, so its
/// descriptor limit does not cap how many files it stores: its server run
/// under a limit of 256 stores 3,999 files, each with its own bytes, and
/// `nr_inodes=4000` (the root is one) then refuses the next with ENOSPC;
/// what it holds stays readable, also through open descriptors far more
/// than the server's limit.
#[test]
fn passthrough_stores_files_past_its_descriptor_limit_up_to_nr_inodes() {
    require!("fuse", "prlimit");
    if !data_paths().contains(&"passthrough") {
        eprintln!("skip: passthrough_stores_files_past_its_descriptor_limit_up_to_nr_inodes: needs ramfs passthrough (root, Linux 6.9)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let m = Mount::by_command(
        None,
        std::process::Command::new("prlimit")
            .arg("--nofile=256:256")
            .arg(common::bin())
            .args([
                "mount",
                "-t",
                "ramfs",
                "-o",
                "passthrough,nr_inodes=4000",
                "none",
            ])
            .arg(&dir),
        &dir,
    )
    .unwrap();
    const FILES: usize = 3999;
    for i in 0..FILES {
        let p = dir.join(format!("f{i}"));
        fs::write(&p, format!("file {i}\n")).unwrap_or_else(|e| panic!("file {i}: {e}"));
    }
    let e = fs::write(dir.join("one-too-many"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    for i in (0..FILES).step_by(37) {
        assert_eq!(
            fs::read_to_string(dir.join(format!("f{i}"))).unwrap(),
            format!("file {i}\n")
        );
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), FILES);
    // 1,000 files open at once through the mount: the kernel holds their
    // backing files, not the server.
    let open: Vec<fs::File> = (0..1000)
        .map(|i| fs::File::open(dir.join(format!("f{i}"))).unwrap())
        .collect();
    for (i, f) in open.iter().enumerate().step_by(111) {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut &*f, &mut s).unwrap();
        assert_eq!(s, format!("file {i}\n"));
    }
    drop(open);
    // Freeing files gives their inodes back.
    for i in 0..100 {
        fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
    fs::write(dir.join("again"), b"again").unwrap();
    assert_eq!(fs::read(dir.join("again")).unwrap(), b"again");
    m.unmount().unwrap();
}
