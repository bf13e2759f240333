//! The transport: FUSE over io_uring for root and a user (with the
//! kernel's `enable_uring` switched on for the test and put back as it
//! was), and listings whose entries link no inode, walked every way a
//! program walks a tree and compared with the source.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{self, foliofs_ok, Mount, TEST_USER};

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// `enable_uring` switched on while this lives, then put back as it was
/// (also when the test fails). `None` where this kernel has no such
/// switch or it cannot be written (not root).
/// Held against a bench run as root, which switches it too.
struct UringOn {
    was: String,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl UringOn {
    fn new() -> Option<UringOn> {
        let alone = common::owning_uring();
        let was = fs::read_to_string(ENABLE_URING).ok()?.trim().to_owned();
        fs::write(ENABLE_URING, "Y").ok()?;
        Some(UringOn { was, _alone: alone })
    }
}

impl Drop for UringOn {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.was);
    }
}

fn mounts_line(mnt: &Path) -> String {
    common::mounts_line_of(None, mnt)
}

fn sh(script: &str, args: &[&Path]) -> String {
    let out = common::run_timeout(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .args(args),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A tree of every entry type and a few hundred files in nested
/// directories, in a new temporary directory.
fn tree() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    let src = tmp.path().join("src");
    common::every_type_tree(&src);
    let mut rng = common::rng(31);
    for d in 0..12 {
        let dir = src.join(format!("d{d:02}")).join(format!("e{}", d % 3));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..40 {
            let n = (i * 53 + d * 7) % 9000;
            fs::write(
                dir.join(format!("f{i:03}")),
                common::random_bytes(&mut rng, n),
            )
            .unwrap();
        }
    }
    (tmp, src)
}

/// Every request that reaches a server over io_uring is answered right:
/// a ramfs filled from a tree walks like the tree, and a romfs image of
/// it reads like it, for root and for a user.
#[test]
fn io_uring_serves_root_and_a_user() {
    require!("fuse", "root", "genromfs");
    let Some(_on) = UringOn::new() else {
        eprintln!("skip: io_uring_serves_root_and_a_user: no {ENABLE_URING} here");
        return;
    };
    let (tmp, src) = tree();
    let want = common::walk(&src);
    // A ramfs, filled by cp and checked.
    let m = Mount::new(Path::new("none"), Some("ramfs"), "io_uring").unwrap();
    assert!(
        mounts_line(m.path()).contains("transport=io_uring"),
        "{}",
        mounts_line(m.path())
    );
    let copy = m.path().join("copy");
    sh(r#"cp -a "$1" "$2""#, &[&src, &copy]);
    let all = common::Fields {
        perm: true,
        owner: true,
        nlink: true,
        ..common::Fields::default()
    };
    common::assert_same_tree(&want, &common::walk(&copy), all);
    let big = common::random_bytes(&mut common::rng(5), 5 << 20);
    fs::write(m.path().join("big"), &big).unwrap();
    fs::rename(m.path().join("big"), m.path().join("moved")).unwrap();
    assert!(fs::read(m.path().join("moved")).unwrap() == big);
    sh(
        r#"rm -rf "$1"/copy "$1"/moved && [ -z "$(ls -A "$1")" ]"#,
        &[m.path()],
    );
    drop(m);
    // An image over io_uring.
    let img = tmp.path().join("tree.romfs");
    crate::romfs::util::genromfs(&src, &img, &[]);
    let m = Mount::new(&img, None, "io_uring").unwrap();
    assert!(mounts_line(m.path()).contains("transport=io_uring"));
    crate::romfs::util::assert_same_romfs_tree(&want, &common::walk(m.path()));
    drop(m);
    // A user's ramfs.
    if common::have("transport user", &["user-fuse"]) {
        let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "io_uring").unwrap();
        let out = common::sh_as_user(
            TEST_USER,
            r#"set -e; head -c 300000 /dev/urandom > "$1/f"; cp "$1/f" "$1/g"; cmp "$1/f" "$1/g"; rm "$1/f" "$1/g"; echo ok"#,
            &[m.path()],
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("ok"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        m.unmount().unwrap();
    }
}

/// Where the kernel offers io_uring, a ramfs not asking for it by name
/// stays on `/dev/fuse`, which measured faster for every ramfs workload,
/// and polls as a `/dev/fuse` ramfs does.
#[test]
fn a_ramfs_not_asking_for_io_uring_stays_on_dev_fuse() {
    require!("fuse", "root");
    if std::env::var(common::TRANSPORT_ENV).is_ok() {
        eprintln!("skip: a_ramfs_not_asking_for_io_uring_stays_on_dev_fuse: this pass names a transport for every mount");
        return;
    }
    let Some(_on) = UringOn::new() else {
        eprintln!(
            "skip: a_ramfs_not_asking_for_io_uring_stays_on_dev_fuse: no {ENABLE_URING} here"
        );
        return;
    };
    let m = Mount::new(Path::new("none"), Some("ramfs"), "").unwrap();
    let line = mounts_line(m.path());
    assert!(line.contains("transport=dev"), "{line}");
    fs::write(m.path().join("f"), b"on /dev/fuse").unwrap();
    assert_eq!(fs::read(m.path().join("f")).unwrap(), b"on /dev/fuse");
}

/// Asked for by name where the kernel does not offer it, io_uring is
/// refused with the reason, and nothing stays mounted.
#[test]
fn io_uring_by_name_without_the_kernels_offer_is_refused() {
    require!("fuse");
    if fs::read_to_string(ENABLE_URING).is_ok_and(|s| s.trim() == "Y") {
        eprintln!(
            "skip: io_uring_by_name_without_the_kernels_offer_is_refused: enable_uring is on"
        );
        return;
    }
    let err = Mount::new(Path::new("none"), Some("ramfs"), "io_uring")
        .err()
        .expect("io_uring mounted without the kernel's offer");
    assert!(err.contains("enable_uring"), "unclear refusal: {err}");
}

/// What each walker sees of a mount: names and types (`find`), every
/// stat field `find -ls` and `ls -l` print, and `du`'s sizes.
fn walks(root: &Path) -> [String; 3] {
    let sorted = |s: String| {
        let mut v: Vec<&str> = s.lines().collect();
        v.sort_unstable();
        v.join("\n")
    };
    [
        sorted(sh(r#"cd "$1" && find . -printf '%P %y\n'"#, &[root])),
        // Directory sizes are each format's own: not compared.
        sorted(sh(
            r#"cd "$1" && find . ! -type d -printf '%P %y %m %n %U %G %s %l\n'"#,
            &[root],
        )),
        sorted(sh(
            r#"cd "$1" && find . -type f -print0 | xargs -0 -r du -b --apparent-size"#,
            &[root],
        )),
    ]
}

/// Plain `find` gets entries that link no inode (it sends no LOOKUP per
/// file), a statting walker gets every attribute right, and a name looked
/// up after a listing stats right too: on an image and on a ramfs.
#[test]
fn listings_without_inodes_walk_like_the_source() {
    require!("fuse", "genromfs");
    let (tmp, src) = tree();
    let want = walks(&src);
    let img = tmp.path().join("tree.romfs");
    crate::romfs::util::genromfs(&src, &img, &[]);
    let image = Mount::new(&img, None, "").unwrap();
    let ram = Mount::new(Path::new("none"), Some("ramfs"), "").unwrap();
    sh(r#"cp -a "$1"/. "$2""#, &[&src, ram.path()]);
    let files = want[1].lines().count() as u64;
    for (what, m) in [("romfs", &image), ("ramfs", &ram)] {
        // Cold: nothing of the tree in the kernel's caches. A plain walk
        // first: at most one LOOKUP per directory and a few more, not one
        // per file (a ramfs's cp left its names cached, so it may send
        // none at all).
        assert!(common::drop_caches(), "cannot drop the caches");
        let before = settled_lookups(m.path());
        let names = sh(r#"cd "$1" && find . -printf '%P %y\n' | sort"#, &[m.path()]);
        let plain = settled_lookups(m.path()) - before;
        assert!(
            plain < files / 4,
            "{what}: {plain} LOOKUPs for {files} files"
        );
        let got = walks(m.path());
        assert_eq!(want[0], names.trim_end(), "{what}: find, lean");
        assert_eq!(want[0], got[0], "{what}: find");
        // romfs stores no owners, no times, no link counts beyond 1: the
        // statting walkers compare only where the format keeps them.
        if what == "ramfs" {
            assert_eq!(want[1], got[1], "{what}: find -printf of every field");
        } else {
            let names_sizes = |s: &str| {
                s.lines()
                    .map(|l| {
                        let f: Vec<&str> = l.split(' ').collect();
                        format!("{} {} {}", f[0], f[1], f[6])
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(names_sizes(&want[1]), names_sizes(&got[1]), "{what}: sizes");
        }
        assert_eq!(want[2], got[2], "{what}: du");
        // A listing, then a stat of a listed name.
        assert!(common::drop_caches());
        let dir = m.path().join("d03/e0");
        let names = sh(r#"ls "$1""#, &[&dir]);
        for name in names.lines().take(10) {
            let got = fs::symlink_metadata(dir.join(name)).unwrap();
            let src_md = fs::symlink_metadata(src.join("d03/e0").join(name)).unwrap();
            assert_eq!(got.len(), src_md.len(), "{what}: {name}");
            assert_eq!(got.file_type(), src_md.file_type(), "{what}: {name}");
        }
    }
}

/// The LOOKUPs a mount has answered so far, once the figures it
/// publishes every 100 ms agree twice.
fn settled_lookups(mnt: &Path) -> u64 {
    let mut last = lookups(mnt);
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(250));
        let now = lookups(mnt);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// The LOOKUPs a mount has answered so far.
fn lookups(mnt: &Path) -> u64 {
    count(mnt, "lookup")
}

/// What a mount has counted as `name` so far (`foliofs mounts --stats`).
fn count(mnt: &Path, name: &str) -> u64 {
    let out = String::from_utf8(foliofs_ok(["mounts", "--stats"])).unwrap();
    let key = format!("{name}=");
    out.lines()
        .skip_while(|l| !l.contains(mnt.to_str().unwrap()))
        .nth(1)
        .and_then(|l| {
            l.split(' ')
                .find_map(|kv| kv.strip_prefix(key.as_str()))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Held inodes as a ramfs mount publishes them.
fn inodes_held(mnt: &Path) -> Option<u64> {
    let out = String::from_utf8(foliofs_ok(["mounts", "--stats"])).unwrap();
    out.lines()
        .skip_while(|l| !l.contains(mnt.to_str().unwrap()))
        .take(4)
        .find_map(|l| l.trim().strip_prefix("ramfs: "))
        .and_then(|l| {
            l.split(' ')
                .find_map(|kv| kv.strip_prefix("inodes_held="))
                .and_then(|v| v.parse().ok())
        })
}

/// Plain and statting walks over thousands of files, then everything
/// removed and the kernel's caches dropped: the server holds its root
/// alone again, so no walk left a lookup the kernel never forgets.
#[test]
fn a_long_walk_leaves_the_servers_inode_table_bounded() {
    require!("fuse", "root");
    let m = Mount::new(Path::new("none"), Some("ramfs"), "").unwrap();
    sh(
        r#"cd "$1" && for d in $(seq 30); do mkdir d$d; for f in $(seq 100); do : > d$d/f$f; done; done"#,
        &[m.path()],
    );
    for walk in [
        "find . >/dev/null",
        "find . -ls >/dev/null",
        "du -a >/dev/null",
        "ls -lR >/dev/null",
    ] {
        assert!(common::drop_caches());
        sh(&format!(r#"cd "$1" && {walk}"#), &[m.path()]);
    }
    sh(r#"rm -rf "$1"/d*"#, &[m.path()]);
    assert!(common::drop_caches());
    let settled = common::wait_until(Duration::from_secs(10), || inodes_held(m.path()) == Some(1));
    assert!(
        settled,
        "the server still holds {:?} inodes after every name went and the kernel forgot them",
        inodes_held(m.path())
    );
}

/// One directory of an image larger than a reply holds: a plain walk gets
/// plain entries past the first reply (no LOOKUP per file), and a walker
/// that stats every entry after listing them all (`find -ls`, `ls -l`)
/// gets every attribute right once the directory's lookups go through its
/// index, including a name that is not there.
#[test]
fn a_large_directory_listed_then_statted_walks_like_the_source() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    let src = tmp.path().join("src");
    let big = src.join("big");
    fs::create_dir_all(&big).unwrap();
    let mut rng = common::rng(47);
    let files = 3000u64;
    for i in 0..files {
        let n = (i * 131) % 700;
        fs::write(
            big.join(format!("file-with-a-longer-name-{i:05}")),
            common::random_bytes(&mut rng, n as usize),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("file-with-a-longer-name-00007", big.join("link")).unwrap();
    let img = tmp.path().join("big.erofs");
    crate::erofs::mkfs::build::<&str>(&[], &src, &img);
    let want = walks(&src);
    let m = Mount::new(&img, None, "").unwrap();
    assert!(common::drop_caches(), "cannot drop the caches");
    let before = settled_lookups(m.path());
    let names = sh(r#"cd "$1" && find . -printf '%P %y\n' | sort"#, &[m.path()]);
    let plain = settled_lookups(m.path()) - before;
    assert_eq!(want[0], names.trim_end(), "find");
    assert!(plain < 10, "a plain find sent {plain} LOOKUPs");
    let stats = String::from_utf8(foliofs_ok(["mounts", "--stats"])).unwrap();
    assert!(stats.contains(" readdir="), "no plain listing: {stats}");
    // The directory takes several replies: all but the first were built
    // while the kernel took in the one before, and the walk above is the
    // source's all the same.
    let ahead = count(m.path(), "listed_ahead");
    assert!(ahead > 0, "no reply was built ahead: {stats}");
    // Every entry statted after the whole listing: lookups past the
    // first few are answered from the directory's index.
    assert!(common::drop_caches());
    let got = walks(m.path());
    assert_eq!(want[1], got[1], "find -printf of every field");
    assert_eq!(want[2], got[2], "du");
    let long = sh(r#"cd "$1" && ls -ln big | tail -n +2 | sort"#, &[m.path()]);
    let long_src = sh(r#"cd "$1" && ls -ln big | tail -n +2 | sort"#, &[&src]);
    let fields = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                // mode, links, owner, group, size, name (and a link's target)
                [&f[..5], &f[8..]].concat().join(" ")
            })
            .collect()
    };
    assert_eq!(fields(&long_src), fields(&long), "ls -ln");
    // A name the directory does not hold, asked after its index exists.
    let missing = fs::symlink_metadata(big.join("no-such-name"));
    assert!(missing.is_err());
    let err = fs::symlink_metadata(m.path().join("big/no-such-name")).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}
