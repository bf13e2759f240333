//! `foliofs mount` of romfs images: every block size and I/O mode against
//! the source tree and the kernel's own romfs, statfs, options, refusals.

use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::util::assert_same_romfs_tree;
use common::{Fields, Mount};

/// A source tree and the genromfs image of it.
struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    img: PathBuf,
}

fn genromfs_fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    common::every_type_tree(&src);
    let img = tmp.path().join("tree.romfs");
    let out = common::run_timeout(
        Command::new("genromfs")
            .arg("-f")
            .arg(&img)
            .arg("-d")
            .arg(&src)
            .args(["-V", "foliofs-test"]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "genromfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fixture {
        _tmp: tmp,
        src,
        img,
    }
}

/// foliofs's own romfs builder (what `foliofs mkfs romfs` runs) on the same tree.
fn mkfs_image(fx: &Fixture) -> PathBuf {
    let img = fx.img.with_extension("mkfs.romfs");
    common::build_romfs(&fx.src, &img);
    img
}

/// (f_bsize, f_frsize, f_blocks, f_namemax) of `dir`, as `stat -f` reports them.
fn stat_f(dir: &Path) -> (u64, u64, u64, u64) {
    let out = common::run_timeout(
        Command::new("stat")
            .args(["-f", "-c", "%s %S %b %l"])
            .arg(dir),
        Duration::from_secs(30),
    );
    assert!(out.status.success());
    let v: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    (v[0], v[1], v[2], v[3])
}

fn expected_block_size(opts: &str, image_size: u64) -> u64 {
    let mut bs = 1024u64;
    for o in opts.split(',') {
        if o == "largeblocks" {
            bs = u64::from(foliofs_block::largeblocks(
                image_size,
                foliofs_block::page_size(),
            ));
        } else if let Some(v) = o.strip_prefix("blocksize=") {
            bs = foliofs_fuse::parse_size(v).unwrap();
        }
    }
    bs
}

const OPTION_SETS: &[&str] = &[
    "",
    "largeblocks",
    "blocksize=64K",
    "blocksize=1M",
    "blocksize=2M",
    "directio",
    "largeblocks,directio",
    "blocksize=64K,directio",
    "blocksize=2M,directio",
];

fn check_every_block_size(img: &Path, src: &Path) {
    let expected = common::walk(src);
    let size = fs::metadata(img).unwrap().len();
    for opts in OPTION_SETS {
        let m = Mount::new(img, None, opts).unwrap_or_else(|e| panic!("mount -o {opts:?}: {e}"));
        let actual = common::walk(m.path());
        assert_eq!(actual.len(), expected.len(), "-o {opts:?}");
        assert_same_romfs_tree(&expected, &actual);
        let bs = expected_block_size(opts, size);
        let (bsize, frsize, blocks, namemax) = stat_f(m.path());
        assert_eq!((bsize, frsize), (bs, bs), "-o {opts:?}: stat -f block size");
        assert_eq!(blocks, size.div_ceil(bs), "-o {opts:?}: f_blocks");
        assert_eq!(namemax, 127, "-o {opts:?}");
        // foliofs mounts shows what the server resolved.
        let list = String::from_utf8(common::foliofs_ok(["mounts"])).unwrap();
        let mnt = m.path().canonicalize().unwrap();
        let line = list
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(mnt.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{} not in `foliofs mounts`:\n{list}", mnt.display()));
        let want_bs = format!("blocksize={}", foliofs_fuse::format_size(bs));
        assert!(line.contains(&want_bs), "{line}: no {want_bs}");
        assert!(line.contains(",ro,") || line.starts_with("ro,") || line.contains(" ro,"));
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
        let mode = if opts.contains("directio") {
            "directio"
        } else {
            "buffered"
        };
        assert!(line.contains(mode), "{line}: no {mode}");
        m.unmount().unwrap();
    }
}

#[test]
fn genromfs_image_at_every_block_size_matches_the_source() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    check_every_block_size(&fx.img, &fx.src);
}

#[test]
fn mkfs_image_at_every_block_size_matches_the_source() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let img = mkfs_image(&fx);
    check_every_block_size(&img, &fx.src);
}

#[test]
fn default_mount_matches_the_kernel_romfs() {
    require!("fuse", "genromfs", "romfs-vm");
    let fx = genromfs_fixture();
    let kernel = common::oracle::kernel_walk(&fx.img);
    let m = Mount::new(&fx.img, None, "").unwrap();
    let ours = common::oracle::host_walk(m.path());
    m.unmount().unwrap();
    if kernel != ours {
        let k: Vec<_> = kernel.lines().collect();
        let o: Vec<_> = ours.lines().collect();
        let only_k: Vec<_> = k.iter().filter(|l| !o.contains(l)).collect();
        let only_o: Vec<_> = o.iter().filter(|l| !k.contains(l)).collect();
        panic!("kernel and foliofs differ\nkernel only:\n{only_k:#?}\nfoliofs only:\n{only_o:#?}");
    }
}

#[test]
fn mount_options_and_read_only_behaviour() {
    require!("fuse", "genromfs", "getfattr");
    let fx = genromfs_fixture();
    let m = Mount::new(&fx.img, Some("romfs"), "uid=1234,gid=99,umask=027,noexec").unwrap();
    let mnt = m.path();
    for (p, e) in common::walk(mnt) {
        assert_eq!((e.uid, e.gid), (1234, 99), "{}", p.display());
        let perm = e.mode & 0o7777;
        match e.kind {
            "dir" => assert_eq!(perm, 0o750, "{}", p.display()),
            "lnk" => {}
            "reg" if e.mode & 0o100 != 0 => assert_eq!(perm, 0o750, "{}", p.display()),
            _ => assert_eq!(perm, 0o640, "{}", p.display()),
        }
    }
    // Every kind of change is refused with EROFS.
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(fs::write(mnt.join("new"), b"x"), "create");
    erofs(
        fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("one"))
            .map(drop),
        "open for write",
    );
    erofs(fs::create_dir(mnt.join("d")), "mkdir");
    erofs(fs::remove_file(mnt.join("one")), "unlink");
    erofs(fs::rename(mnt.join("one"), mnt.join("two")), "rename");
    erofs(std::os::unix::fs::symlink("x", mnt.join("sym")), "symlink");
    // No extended attributes.
    let out = Command::new("getfattr")
        .args(["-d", "-m", "-"])
        .arg(mnt.join("one"))
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new("getfattr")
        .args(["-n", "user.x"])
        .arg(mnt.join("one"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No such attribute"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // /proc/mounts: fuse.foliofs, source = image, nosuid,nodev,noexec,ro.
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let canon = mnt.canonicalize().unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == canon.to_str())
        .unwrap();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[0], fx.img.to_str().unwrap());
    assert_eq!(f[2], "fuse.foliofs");
    for flag in ["ro", "nosuid", "nodev", "noexec", "default_permissions"] {
        assert!(f[3].split(',').any(|o| o == flag), "{line}: no {flag}");
    }
    // st_ino of the root is the format's own (romfs: the header offset), not 1.
    assert_ne!(fs::metadata(mnt).unwrap().ino(), 1);
    m.unmount().unwrap();
}

#[test]
fn refused_options_and_images_leave_no_mount() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.img");
    fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let truncated = dir.path().join("truncated.romfs");
    let bytes = fs::read(&fx.img).unwrap();
    fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let missing = dir.path().join("missing.romfs");
    let cases: &[(&Path, &str, &str)] = &[
        (&fx.img, "bogus", "bogus"),
        (&fx.img, "blocksize=3K", "blocksize"),
        (&fx.img, "blocksize=4M", "blocksize"),
        (&fx.img, "blocksize=512", "blocksize"),
        (&fx.img, "uid=abc", "uid"),
        (&fx.img, "umask=999", "umask"),
        (&fx.img, "ro=yes", "ro"),
        (&fx.img, "size=1M", "size"),
        (&garbage, "", "not a romfs"),
        (&truncated, "", "truncated.romfs"),
        (&missing, "", "missing.romfs"),
    ];
    for (img, opts, needle) in cases {
        let mnt = tempfile::tempdir().unwrap();
        let r = Mount::at(img, mnt.path(), None, opts);
        let err = match r {
            Ok(m) => {
                drop(m);
                panic!("{} -o {opts:?} was mounted", img.display());
            }
            Err(e) => e,
        };
        assert!(
            err.contains(needle),
            "{} -o {opts:?}: error does not name {needle:?}: {err}",
            img.display()
        );
        assert!(!common::is_mounted(mnt.path()), "{opts:?} left a mount");
    }
    // A wrong -t is refused too.
    let mnt = tempfile::tempdir().unwrap();
    let err = Mount::at(&fx.img, mnt.path(), Some("erofs"), "")
        .err()
        .expect("romfs mounted as erofs");
    assert!(err.contains("romfs"), "{err}");
    assert!(!common::is_mounted(mnt.path()));
}

#[test]
fn sixteen_concurrent_readers_see_the_right_bytes() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let expected = common::walk(&fx.src);
    for opts in ["", "blocksize=64K,directio"] {
        let m = Mount::new(&fx.img, None, opts).unwrap();
        let root = m.path().to_owned();
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let root = root.clone();
                std::thread::spawn(move || common::walk(&root))
            })
            .collect();
        for h in handles {
            let actual = h.join().expect("a reader panicked");
            common::assert_same_tree(&expected, &actual, Fields::default());
        }
        m.unmount().unwrap();
    }
}

#[test]
fn truncated_image_under_a_live_mount_gives_eio_and_keeps_serving() {
    require!("fuse", "genromfs");
    for opts in ["", "directio", "blocksize=2M"] {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("a-small"), b"small file\n").unwrap();
        common::write_random_file(&src.join("z-big"), 8 << 20, 7);
        let img = tmp.path().join("img.romfs");
        let st = Command::new("genromfs")
            .arg("-f")
            .arg(&img)
            .arg("-d")
            .arg(&src)
            .status()
            .unwrap();
        assert!(st.success());
        let m = Mount::new(&img, None, opts).unwrap();
        let mnt = m.path();
        assert_eq!(fs::read(mnt.join("a-small")).unwrap(), b"small file\n");
        let size = fs::metadata(&img).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(size / 2)
            .unwrap();
        let e = fs::read(mnt.join("z-big")).expect_err("read past the truncation succeeded");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "-o {opts:?}: {e}");
        // The server is still there and serves the part that is left.
        assert_eq!(fs::read(mnt.join("a-small")).unwrap(), b"small file\n");
        assert!(fs::read_dir(mnt).unwrap().count() >= 2);
        m.unmount().unwrap();
    }
}

fn signal(pid: u32, sig: i32) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success());
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z"))
            .unwrap_or(true)
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let m = Mount::new(&fx.img, None, "").unwrap();
        let pid = common::mount_pid(None, m.path());
        signal(pid, sig);
        assert!(
            common::wait_until(Duration::from_secs(20), || !common::is_mounted(m.path())),
            "signal {sig} did not unmount"
        );
        assert!(
            common::wait_until(Duration::from_secs(20), || !alive(pid)),
            "server survived signal {sig}"
        );
        drop(m);
    }
}

#[test]
fn killed_server_mount_is_cleared_by_foliofs_umount() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let m = Mount::new(&fx.img, None, "").unwrap();
    // Its supervisor first, or it would start another server.
    let pids = [
        common::mount_pid(None, m.path()),
        common::server_pid(None, m.path()),
    ];
    for pid in pids {
        signal(pid, libc::SIGKILL);
        assert!(common::wait_until(Duration::from_secs(20), || !alive(pid)));
    }
    assert!(
        common::is_mounted(m.path()),
        "the dead mount vanished by itself"
    );
    let list = String::from_utf8(common::foliofs_ok(["mounts"])).unwrap();
    assert!(list.contains("server=dead"), "{list}");
    // Mounting there again fails with ENOTCONN, and says what to run first.
    let dead = m
        .path()
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap()
        .join(m.path().file_name().unwrap());
    let again = common::foliofs([
        OsStr::new("mount"),
        fx.img.as_os_str(),
        m.path().as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "mounted on a dead mount");
    assert!(
        err.contains("Transport endpoint is not connected")
            && err.contains(&format!("run `foliofs umount {}` first", dead.display())),
        "{err}"
    );
    let out = common::foliofs([OsStr::new("umount"), m.path().as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!common::is_mounted(m.path()));
    drop(m);
}

#[test]
fn foreground_server_serves_until_interrupted() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let mnt = tempfile::tempdir().unwrap();
    let mut child = Command::new(common::bin())
        .args(["mount", "-f", "-o", "largeblocks"])
        .arg(&fx.img)
        .arg(mnt.path())
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut std::process::Child, &'a Path);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            common::force_unmount(self.1);
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = child.id();
    let reap = Reap(&mut child, mnt.path());
    assert!(common::wait_until(Duration::from_secs(30), || {
        common::is_mounted(mnt.path())
    }));
    assert_eq!(
        fs::read(mnt.path().join("one")).unwrap(),
        fs::read(fx.src.join("one")).unwrap()
    );
    signal(pid, libc::SIGINT);
    assert!(common::wait_until(Duration::from_secs(20), || {
        matches!(reap.0.try_wait(), Ok(Some(_)))
    }));
    assert!(!common::is_mounted(mnt.path()));
    drop(reap);
}

/// Unmounts whatever is left at `mnt`, and removes a temporary helper
/// symlink, even on failure.
struct Cleanup<'a> {
    mnt: &'a Path,
    link: Option<PathBuf>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        common::force_unmount(self.mnt);
        if let Some(l) = self.link.take() {
            let _ = fs::remove_file(l);
        }
    }
}

fn check_helper_mount(fx: &Fixture, mnt: &Path, fstype: &str, source: &OsStr) {
    let out = common::run_timeout(
        Command::new("mount")
            .args(["-t", fstype, "-o", "largeblocks"])
            .arg(source)
            .arg(mnt),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "mount -t {fstype}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(common::is_mounted(mnt));
    let size = fs::metadata(&fx.img).unwrap().len();
    assert_eq!(stat_f(mnt).0, expected_block_size("largeblocks", size));
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    let canon = mnt.canonicalize().unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == canon.to_str())
        .unwrap();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[2], "fuse.foliofs", "{line}");
    // mount.fuse3 passes dev,suid; an image still gets nosuid,nodev.
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(f[3].split(',').any(|o| o == flag), "{line}: no {flag}");
    }
    common::assert_same_tree(
        &common::walk(&fx.src),
        &common::walk(mnt),
        Fields::default(),
    );
    let st = Command::new("umount").arg(mnt).status().unwrap();
    assert!(st.success());
    assert!(!common::is_mounted(mnt));
}

#[test]
fn mount_fuse3_helper_and_plain_umount() {
    require!("fuse", "genromfs", "mount.fuse3", "fusermount3");
    let fx = genromfs_fixture();
    let mnt = tempfile::tempdir().unwrap();
    let mut guard = Cleanup {
        mnt: mnt.path(),
        link: None,
    };
    // `mount -t fuse PROGRAM#SOURCE`: mount.fuse3 runs PROGRAM SOURCE MNT -o OPTS.
    let mut src = common::bin().into_os_string();
    src.push("#");
    src.push(&fx.img);
    check_helper_mount(&fx, mnt.path(), "fuse", &src);
    // `mount -t fuse.foliofs` (the fstab form) finds `foliofs` on the
    // helper's fixed PATH, so it needs the binary in a system directory.
    let link = Path::new("/usr/local/sbin/foliofs");
    if fs::symlink_metadata(link).is_err() {
        std::os::unix::fs::symlink(common::bin(), link).unwrap();
        guard.link = Some(link.to_owned());
        check_helper_mount(&fx, mnt.path(), "fuse.foliofs", fx.img.as_os_str());
    } else {
        eprintln!(
            "note: {} exists; `-t fuse.foliofs` not tried",
            link.display()
        );
    }

    // fusermount3 -u unmounts too.
    let m = Mount::at(&fx.img, mnt.path(), None, "").unwrap();
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!common::is_mounted(mnt.path()));
    drop(m);
    drop(guard);
}

#[test]
fn debug_option_logs_requests() {
    require!("fuse", "genromfs");
    let fx = genromfs_fixture();
    let mnt = tempfile::tempdir().unwrap();
    let out = common::run_timeout(
        Command::new(common::bin())
            // nopush: a pushed file would be read with no READ to log.
            .args(["mount", "-o", "debug,nopush"])
            .arg(&fx.img)
            .arg(mnt.path()),
        Duration::from_secs(60),
    );
    let _guard = Cleanup {
        mnt: mnt.path(),
        link: None,
    };
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let log = stderr
        .lines()
        .find_map(|l| l.strip_prefix("foliofs: debug log in "))
        .unwrap_or_else(|| panic!("no log path in: {stderr}"))
        .to_owned();
    assert_eq!(
        fs::read(mnt.path().join("sixteen")).unwrap(),
        fs::read(fx.src.join("sixteen")).unwrap()
    );
    let st = Command::new(common::bin())
        .arg("umount")
        .arg(mnt.path())
        .status()
        .unwrap();
    assert!(st.success());
    let text = fs::read_to_string(&log).unwrap();
    let _ = fs::remove_file(&log);
    assert!(text.contains("lookup(1, \"sixteen\")"), "{text}");
    assert!(text.lines().any(|l| l.contains("read(")), "{text}");
}
