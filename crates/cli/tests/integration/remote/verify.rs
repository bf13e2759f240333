//! The cache checks what it serves: cached chunks damaged on the disk
//! without changing their length are dropped and fetched again, counted,
//! and every reader gets the image's bytes, as root and as a user.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use super::{cache_dir, mount_url, start_weed, Creds, Images, BUCKET};
use crate::common::{self, listing, Mount, TEST_USER};

/// Flips one byte in every 64 KiB of every cached `data` file under
/// `cache` that holds data; returns how many it flipped.
fn damage(cache: &Path) -> usize {
    let mut flipped = 0;
    let mut stack = vec![cache.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() == "data" {
                let f = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .unwrap();
                let len = f.metadata().unwrap().len();
                for at in (1234..len).step_by(64 << 10) {
                    let mut b = [0u8; 1];
                    f.read_exact_at(&mut b, at).unwrap();
                    // A hole reads as zeros and has no chunk to damage.
                    if b[0] != 0 || at_has_data(&f, at) {
                        f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
                        flipped += 1;
                    }
                }
            }
        }
    }
    flipped
}

fn at_has_data(f: &fs::File, at: u64) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: lseek takes an open descriptor and integers only.
    let d = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
    d >= 0 && (d as u64) <= at
}

/// The remote counters in `foliofs mounts --stats` as `user` sees them.
fn stats_as(user: Option<&str>, dir: &Path) -> std::collections::BTreeMap<String, u64> {
    match user {
        None => super::remote_stats(dir),
        Some(u) => {
            let out = common::as_user(
                u,
                common::bin(),
                ["mounts", "--stats"],
                Duration::from_secs(30),
            );
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix("remote: "))
                .unwrap_or_else(|| panic!("no remote counters in:\n{text}"));
            line.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
                .collect()
        }
    }
}

fn damaged_chunks_are_fetched_again(user: Option<&str>) {
    let weed = start_weed();
    let images = Images::new();
    let img = images.erofs_lz4();
    weed.put_file(BUCKET, "tree.erofs", &img).unwrap();
    let want = {
        let m = Mount::new(&img, None, "").unwrap();
        listing(None, m.path())
    };
    let home = user.map(common::user_tempdir);
    let cache = match &home {
        Some(h) => h.path().join("cache"),
        None => cache_dir(&images, "cache"),
    };
    let url = format!("s3://{BUCKET}/tree.erofs");
    let opts = format!(
        "{},cache={},chunk=64K",
        weed.mount_options(),
        cache.display()
    );
    // Every file's sha256, read as the mount's owner reads it.
    let walk = |m: &Mount| listing(user, m.path());
    let assert_same = |what: &str, want: &String, got: &String| {
        assert!(want == got, "{what}: the mount differs from the image");
    };
    let m = mount_url(user, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("cold", &want, &walk(&m));
    m.unmount().unwrap();
    let flipped = damage(&cache);
    assert!(flipped > 4, "only {flipped} cached chunks to damage");

    common::drop_caches();
    let m = mount_url(user, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("damaged cache", &want, &walk(&m));
    let s = stats_as(user, m.path());
    assert!(s["cache_corrupt"] > 0, "no damage found: {s:?}");
    assert!(s["bytes_fetched"] > 0, "damaged chunks not fetched: {s:?}");
    assert_eq!(s["fetch_errors"], 0, "{s:?}");
    m.unmount().unwrap();

    // What was fetched again was stored right.
    common::drop_caches();
    let m = mount_url(user, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("refetched", &want, &walk(&m));
    let s = stats_as(user, m.path());
    assert_eq!((s["cache_corrupt"], s["bytes_fetched"]), (0, 0), "{s:?}");
    // Damage under a live mount: found at the next read from the disk.
    damage(&cache);
    common::drop_caches();
    assert_same("damaged under the mount", &want, &walk(&m));
    let after = stats_as(user, m.path());
    assert!(after["cache_corrupt"] > 0, "{after:?}");
    m.unmount().unwrap();
}

#[test]
fn damaged_cached_chunks_are_dropped_and_fetched_again() {
    require!("fuse", "weed", "mkfs.erofs");
    damaged_chunks_are_fetched_again(None);
}

#[test]
fn damaged_cached_chunks_are_dropped_and_fetched_again_for_a_user() {
    require!("user-fuse", "weed", "mkfs.erofs");
    damaged_chunks_are_fetched_again(Some(TEST_USER));
}
