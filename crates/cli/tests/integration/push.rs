//! Data pushed into the kernel before it is read (`push=`, `nopush`) and
//! start-up profiles (`record=`, `prefetch=`): what a reader gets is the
//! source's bytes, pushed pages save READ requests (counted by the
//! server, `foliofs mounts --stats`), the push budget holds, and a profile
//! of another image is refused with a warning. Each runs on a romfs image,
//! an EROFS image and a merged EROFS image whose data is in its layer.

use crate::common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Mount, TEST_USER};

/// A tree of small files (what is pushed without a profile), a few
/// larger ones, in a few directories, where a user can read it.
fn source(root: &Path) -> PathBuf {
    let src = root.join("src");
    for d in 0..4u64 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..12u64 {
            let size = 1 + (d * 12 + f) * 2_731 % 100_000;
            common::write_random_file(&dir.join(format!("f{f}")), size, d * 100 + f);
        }
    }
    common::write_random_file(&src.join("d0/large"), 3 << 20, 77);
    src
}

/// `relative path -> bytes` of every regular file under `dir`, read in
/// directory order (a start-up reads its files that way).
fn read_all(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(dir).unwrap().to_owned();
                out.insert(rel, fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// Lists every directory under `dir` (READDIRPLUS: the kernel gets every
/// inode, and the server may push after each reply) and stats every
/// entry, as `find -ls` does.
fn list_all(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        fs::symlink_metadata(e.path()).unwrap();
        if e.file_type().unwrap().is_dir() {
            list_all(&e.path());
        }
    }
}

/// The mount's counts from `foliofs mounts --stats`, once two reads a
/// little apart agree (the server writes them every 100 ms).
fn counts(mnt: &Path) -> BTreeMap<String, u64> {
    let once = || {
        let out = common::foliofs_ok(["mounts", "--stats"]);
        let text = String::from_utf8_lossy(&out).into_owned();
        let mnt = mnt.to_string_lossy().into_owned();
        let mut lines = text.lines();
        lines.find(|l| l.split_whitespace().nth(1) == Some(mnt.as_str()));
        let stats = lines
            .next()
            .and_then(|l| l.trim().strip_prefix("requests:"))
            .unwrap_or_else(|| panic!("no counts for {mnt} in:\n{text}"))
            .to_owned();
        stats
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
            .collect::<BTreeMap<String, u64>>()
    };
    let mut last = once();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(250));
        let now = once();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

fn get(c: &BTreeMap<String, u64>, k: &str) -> u64 {
    c.get(k).copied().unwrap_or(0)
}

/// Mounts `img` with `opts`, reads one small file (through its path: no
/// listing), lists the tree, lets the pusher finish, reads every file;
/// returns the bytes read and the counts. Files are pushed only while the
/// mount is being read, hence the first read; it is not the large file,
/// which a profile pushes.
fn run(img: &Path, opts: &str) -> (BTreeMap<PathBuf, Vec<u8>>, BTreeMap<String, u64>) {
    // Pushed pages must stay until they are read for the counts to mean
    // anything: no other test may drop the caches meanwhile.
    let _kept = common::keeping_caches();
    let m = Mount::new(img, None, opts).unwrap_or_else(|e| panic!("-o {opts}: {e}"));
    fs::read(m.path().join("d0/f0")).unwrap();
    list_all(m.path());
    counts(m.path());
    let got = read_all(m.path());
    let c = counts(m.path());
    m.unmount().unwrap();
    (got, c)
}

/// Mounts `img` with `opts` up to three times until `saved` holds for its
/// counts. A store that overtakes the kernel's making of the inode it is
/// for is dropped without a word, and on a loaded machine the reader's
/// task can lose that race for a whole directory, so one mount's counts
/// may show no saving by chance; three in a row would not. Every
/// attempt's bytes must be the source's.
fn run_until(
    img: &Path,
    opts: &str,
    want: &BTreeMap<PathBuf, Vec<u8>>,
    saved: impl Fn(&BTreeMap<String, u64>) -> bool,
) -> BTreeMap<String, u64> {
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (got, c) = run(img, opts);
        assert!(
            got == *want,
            "{} -o {opts}: bytes differ from the source",
            img.display()
        );
        if saved(&c) {
            return c;
        }
        seen.push(c);
    }
    panic!(
        "{} -o {opts}: no saving in 3 mounts: {seen:?}",
        img.display()
    );
}

fn images(tmp: &Path, src: &Path) -> Vec<PathBuf> {
    let romfs = tmp.join("tree.romfs");
    common::build_romfs(src, &romfs);
    let mut v = vec![romfs];
    if common::have("mkfs.erofs", &["mkfs.erofs"]) {
        let erofs = tmp.join("tree.erofs");
        common::mkfs_erofs::<&str>(&[], &erofs, src);
        v.push(erofs);
    }
    v.push(merged(tmp, src));
    v
}

/// The tree as a merged image whose data stays in its one layer (built
/// beside it, where a mount finds it): pushes and profiles read through
/// chunks into another device.
fn merged(tmp: &Path, src: &Path) -> PathBuf {
    let layer = tmp.join("layer.erofs");
    let merged = tmp.join("merged.erofs");
    for args in [
        vec![
            "mkfs".as_ref(),
            "erofs".as_ref(),
            "-q".as_ref(),
            "-Enoinline_data".as_ref(),
            src.as_os_str(),
            layer.as_os_str(),
        ],
        vec![
            "mkfs".as_ref(),
            "erofs".as_ref(),
            "-q".as_ref(),
            "--merge".as_ref(),
            layer.as_os_str(),
            merged.as_os_str(),
        ],
    ] {
        let out = common::foliofs(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    merged
}

#[test]
fn pushed_pages_are_the_sources_bytes_and_save_reads() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let want = read_all(&src);
    for img in images(tmp.path(), &src) {
        for io in ["", "directio"] {
            let opts = |o: &str| {
                [io, o]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let what = format!("{} -o {}", img.display(), opts("nopush"));
            let (got, plain) = run(&img, &opts("nopush"));
            assert!(got == want, "{what}: bytes differ from the source");
            assert_eq!(get(&plain, "push"), 0, "{what}: {plain:?}");
            // 48 small files are pushed whole; the kernel drops a store
            // that overtakes the inode it is for, so not every push lands.
            run_until(&img, &opts(""), &want, |pushed| {
                get(pushed, "push") >= 24 && get(pushed, "read") + 24 <= get(&plain, "read")
            });
        }
    }
}

/// A walk that lists and stats a tree and reads no file (`find -ls`,
/// `du`, `ls -lR`), or stats every file by name (`git status`), gets no
/// file data pushed at it: pushing would only read from the disk what
/// nobody asked for.
#[test]
fn a_walk_that_reads_nothing_gets_nothing_pushed() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let files: Vec<PathBuf> = read_all(&src).into_keys().collect();
    for img in images(tmp.path(), &src) {
        for io in ["", "directio"] {
            let what = format!("{} -o {io}", img.display());
            let m = Mount::new(&img, None, io).unwrap_or_else(|e| panic!("{what}: {e}"));
            list_all(m.path());
            let listed = counts(m.path());
            m.unmount().unwrap();
            let m = Mount::new(&img, None, io).unwrap_or_else(|e| panic!("{what}: {e}"));
            for f in &files {
                fs::symlink_metadata(m.path().join(f)).unwrap();
            }
            let named = counts(m.path());
            m.unmount().unwrap();
            assert!(get(&listed, "readdirplus") > 0, "{what}: {listed:?}");
            assert!(
                get(&named, "lookup") as usize > files.len(),
                "{what}: {named:?}"
            );
            for c in [&listed, &named] {
                assert_eq!(get(c, "push"), 0, "{what}: {c:?}");
                assert_eq!(get(c, "read"), 0, "{what}: {c:?}");
            }
        }
    }
}

#[test]
fn pushes_stop_at_the_budget() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let want = read_all(&src);
    for img in images(tmp.path(), &src) {
        // directio pushes from several threads, which share the budget.
        for opts in ["push=200K", "push=200K,directio"] {
            let what = format!("{} -o {opts}", img.display());
            let (got, c) = run(&img, opts);
            assert!(got == want, "{what}: bytes differ from the source");
            let bytes = get(&c, "push_bytes");
            assert!(get(&c, "push") > 0, "{what}: {c:?}");
            assert!(bytes <= 200 << 10, "{what}: {c:?}");
        }
    }
}

#[test]
fn ramfs_refuses_push_and_profiles() {
    require!("fuse");
    for o in ["push=1M", "nopush", "record=/tmp/p", "prefetch=/tmp/p"] {
        let e = Mount::new(Path::new("none"), Some("ramfs"), o)
            .err()
            .unwrap_or_else(|| panic!("{o} accepted"));
        assert!(e.contains("ramfs does not take it"), "{o}: {e}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = images(tmp.path(), &source(tmp.path())).remove(0);
    let e = Mount::new(&img, None, "prefetch=all").err().unwrap();
    assert!(
        e.contains("mount option `prefetch` is for images in object storage"),
        "{e}"
    );
}

#[test]
fn a_recorded_profile_replays_the_same_bytes_with_fewer_reads() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let want = read_all(&src);
    for img in images(tmp.path(), &src) {
        let profile = tmp.path().join("start.profile");
        let what = img.display().to_string();
        // Reads without listing first: LOOKUPs, as a program start-up.
        let m = Mount::new(&img, None, &format!("record={}", profile.display())).unwrap();
        assert!(read_all(m.path()) == want, "{what}: recording run");
        let recorded = counts(m.path());
        assert_eq!(get(&recorded, "push"), 0, "{what}: a recording run pushes");
        m.unmount().unwrap();
        let text = fs::read_to_string(&profile).unwrap();
        assert!(text.starts_with("foliofs-profile 1\nimage size="), "{text}");
        // Every file read is in it, the large one with all its bytes.
        assert!(text.lines().count() >= 2 + want.len(), "{text}");
        assert!(text.contains(&format!(" 0+{}", 3 << 20)), "{text}");

        let (_, plain) = run(&img, "nopush");
        // The large file is pushed too (more than the small-file limit).
        run_until(
            &img,
            &format!("prefetch={}", profile.display()),
            &want,
            |replayed| {
                get(replayed, "read") < get(&plain, "read") && get(replayed, "push_bytes") > 3 << 20
            },
        );
        fs::remove_file(&profile).unwrap();
    }
}

#[test]
fn a_profile_of_another_image_is_ignored_with_a_warning() {
    require!("fuse");
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let want = read_all(&src);
    let img = images(tmp.path(), &src).remove(0);
    let profile = tmp.path().join("p");
    let m = Mount::new(&img, None, &format!("record={}", profile.display())).unwrap();
    read_all(m.path());
    m.unmount().unwrap();
    // The same tree with one file changed: another image.
    fs::write(src.join("d1/f0"), b"changed").unwrap();
    let other = tmp.path().join("other.romfs");
    common::build_romfs(&src, &other);
    let mnt = tempfile::tempdir().unwrap();
    let _guard = scopeguard(mnt.path());
    let out = common::foliofs([
        std::ffi::OsString::from("mount"),
        "-o".into(),
        format!("prefetch={}", profile.display()).into(),
        other.clone().into(),
        mnt.path().into(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("prefetch= ignored") && err.contains("recorded on another image"),
        "{err}"
    );
    let mut want = want;
    want.insert(PathBuf::from("d1/f0"), b"changed".to_vec());
    assert!(read_all(mnt.path()) == want, "bytes differ from the source");
}

/// Unmounts `dir` when dropped, whatever the test did.
struct Unmounter(PathBuf);

impl Drop for Unmounter {
    fn drop(&mut self) {
        common::force_unmount(&self.0);
    }
}

fn scopeguard(dir: &Path) -> Unmounter {
    Unmounter(dir.to_owned())
}

#[test]
fn a_user_records_a_profile() {
    require!("user-fuse");
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    let src = source(tmp.path());
    let img = images(tmp.path(), &src).remove(0);
    let dir = common::user_tempdir(TEST_USER);
    let profile = dir.path().join("start.profile");
    let m = Mount::as_user(
        TEST_USER,
        &img,
        None,
        &format!("record={}", profile.display()),
    )
    .unwrap();
    let out = common::sh_as_user(
        TEST_USER,
        r#"find "$1" -type f -exec cat {} + > /dev/null"#,
        &[m.path()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount().unwrap();
    let text = fs::read_to_string(&profile).unwrap();
    assert!(text.starts_with("foliofs-profile 1\n"), "{text}");
    assert!(text.lines().count() > 40, "{text}");
    let m = Mount::as_user(
        TEST_USER,
        &img,
        None,
        &format!("prefetch={}", profile.display()),
    )
    .unwrap();
    let got = common::listing(Some(TEST_USER), m.path());
    assert_eq!(got, common::listing(None, &src));
    m.unmount().unwrap();
}
