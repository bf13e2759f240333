//! The disk cache across mounts: a warm cache fetches nothing again, a
//! replaced object is read anew, `cache_size` bounds the directory, two
//! mounts of one object share its cache within that bound, and a server killed while it
//! writes chunks leaves a cache the next mount reads correctly.

use std::fs;
use std::time::Duration;

use super::{cache_dir, du, mount_url, remote_stats, start_weed, Creds, Images, Weed, BUCKET};
use crate::common::{self, Mount};
use crate::erofs::walk::{assert_same, walk_mounted, Tree};

#[test]
fn a_warm_cache_serves_a_second_mount_without_fetching() {
    require!("fuse", "weed", "mkfs.erofs");
    let weed = start_weed();
    let images = Images::new();
    let img = images.erofs_lz4();
    weed.put_file(BUCKET, "tree.erofs", &img).unwrap();
    let want = {
        let m = Mount::new(&img, None, "").unwrap();
        walk_mounted(m.path())
    };
    let cache = cache_dir(&images, "cache");
    let url = format!("s3://{BUCKET}/tree.erofs");
    let opts = format!(
        "{},cache={},chunk=64K",
        weed.mount_options(),
        cache.display()
    );

    let m = mount_url(None, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("cold", &want, &walk_mounted(m.path()));
    let cold = remote_stats(m.path());
    assert!(cold["bytes_read"] > 0, "{cold:?}");
    m.unmount().unwrap();
    let cached = du(&cache);
    assert!(cached > 0);

    // Cold for the kernel and for the server: nothing but the disk cache.
    common::drop_caches();
    let m = mount_url(None, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("warm", &want, &walk_mounted(m.path()));
    let warm = remote_stats(m.path());
    assert!(warm["bytes_read"] > 0, "{warm:?}");
    assert!(warm["cache_hits"] > 0, "{warm:?}");
    assert_eq!(
        (
            warm["bytes_fetched"],
            warm["cache_misses"],
            warm["fetch_errors"]
        ),
        (0, 0, 0),
        "a warm mount fetched: {warm:?}"
    );
    m.unmount().unwrap();
}

#[test]
fn a_replaced_object_is_read_anew() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let first = images.romfs();
    // A second image of another tree at the same key.
    let src2 = images.path("src2");
    fs::create_dir(&src2).unwrap();
    fs::write(src2.join("mixed"), b"another image altogether\n").unwrap();
    fs::write(src2.join("new"), vec![7u8; 3 << 20]).unwrap();
    let second = images.path("second.romfs");
    crate::romfs::util::genromfs(&src2, &second, &[]);

    let cache = cache_dir(&images, "cache");
    let url = format!("s3://{BUCKET}/img");
    let opts = format!(
        "{},cache={},chunk=64K",
        weed.mount_options(),
        cache.display()
    );
    let walk_of = |img: &std::path::Path| {
        let m = Mount::new(img, None, "").unwrap();
        walk_mounted(m.path())
    };

    weed.put_file(BUCKET, "img", &first).unwrap();
    let m = mount_url(None, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("first", &walk_of(&first), &walk_mounted(m.path()));
    m.unmount().unwrap();

    weed.put_file(BUCKET, "img", &second).unwrap();
    common::drop_caches();
    let m = mount_url(None, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("replaced", &walk_of(&second), &walk_mounted(m.path()));
    m.unmount().unwrap();
    // The first object's chunks went with its key.
    let left = du(&cache);
    assert!(
        left <= fs::metadata(&second).unwrap().len() + (1 << 20),
        "{left} bytes left in the cache after the object was replaced"
    );
}

/// A romfs image in S3 several times the size of a 1M cache, the options
/// that mount it so, and its walk from the local copy.
struct Bounded {
    _weed: Weed,
    _images: Images,
    cache: std::path::PathBuf,
    opts: String,
    want: Tree,
}

impl Bounded {
    const LIMIT: u64 = 1 << 20;

    fn new() -> Bounded {
        let weed = start_weed();
        let images = Images::new();
        let img = images.romfs();
        weed.put_file(BUCKET, "tree.romfs", &img).unwrap();
        let cache = cache_dir(&images, "cache");
        let opts = format!(
            "{},cache={},chunk=64K,cache_size=1M",
            weed.mount_options(),
            cache.display()
        );
        let want = {
            let m = Mount::new(&img, None, "").unwrap();
            walk_mounted(m.path())
        };
        assert!(fs::metadata(&img).unwrap().len() > 6 * Bounded::LIMIT);
        Bounded {
            _weed: weed,
            _images: images,
            cache,
            opts,
            want,
        }
    }

    fn mount(&self) -> Mount {
        let url = format!("s3://{BUCKET}/tree.romfs");
        mount_url(None, &Creds::Env, &url, &self.opts, &[]).unwrap()
    }
}

#[test]
fn cache_size_bounds_the_cache_directory() {
    require!("fuse", "weed", "genromfs");
    let b = Bounded::new();
    let (cache, want, limit) = (&b.cache, &b.want, Bounded::LIMIT);
    let m = b.mount();
    // Reads many times the limit, and all of it right.
    assert_same("bounded", want, &walk_mounted(m.path()));
    let stats = remote_stats(m.path());
    assert!(stats["bytes_fetched"] > 4 * limit, "{stats:?}");
    let held = du(cache);
    assert!(
        held <= limit,
        "the cache holds {held} bytes, more than cache_size=1M"
    );
    m.unmount().unwrap();
    assert!(du(cache) <= limit);
}

#[test]
fn two_mounts_of_one_object_share_its_cache_within_its_bound() {
    require!("fuse", "weed", "genromfs");
    let b = Bounded::new();
    let (cache, want, limit) = (&b.cache, &b.want, Bounded::LIMIT);
    let (first, second) = (b.mount(), b.mount());
    // Both read the whole object at once, each over the bound many times:
    // each frees chunks the other may be reading, which the other's
    // checksums tell from its data, and fetches them again.
    for round in 0..2 {
        std::thread::scope(|s| {
            let one = s.spawn(|| walk_mounted(first.path()));
            let two = s.spawn(|| walk_mounted(second.path()));
            assert_same("first", want, &one.join().unwrap());
            assert_same("second", want, &two.join().unwrap());
        });
        // Readers are answered before their chunks are stored and trimmed.
        assert!(
            common::wait_until(Duration::from_secs(10), || du(cache) <= limit),
            "round {round}: {} bytes cached with two mounts, more than cache_size=1M",
            du(cache)
        );
        common::drop_caches();
    }
    for m in [&first, &second] {
        let s = remote_stats(m.path());
        assert_eq!(
            s["cache_corrupt"], 0,
            "a freed chunk taken for damage: {s:?}"
        );
    }
    second.unmount().unwrap();
    first.unmount().unwrap();
    assert!(du(cache) <= limit);
}

/// The kernel's ramfs mounted on a directory, detached when dropped: a
/// file system that holds sparse files but cannot punch holes
/// (`fallocate` says EOPNOTSUPP).
struct NoPunch(std::path::PathBuf);

impl NoPunch {
    fn at(dir: &std::path::Path) -> Result<NoPunch, String> {
        let out = common::run_timeout(
            std::process::Command::new("mount")
                .args(["-t", "ramfs", "foliofs-nopunch"])
                .arg(dir),
            Duration::from_secs(30),
        );
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(NoPunch(dir.to_owned()))
    }
}

impl Drop for NoPunch {
    fn drop(&mut self) {
        let _ = common::run_timeout(
            std::process::Command::new("umount").arg("-l").arg(&self.0),
            Duration::from_secs(30),
        );
    }
}

#[test]
fn cache_size_bounds_a_cache_on_a_file_system_that_cannot_punch_holes() {
    require!("fuse", "weed", "genromfs", "mount", "fallocate");
    let b = Bounded::new();
    let (cache, want, limit) = (&b.cache, &b.want, Bounded::LIMIT);
    let _ramfs = match NoPunch::at(cache) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("skip: no kernel ramfs to hold the cache: {why}");
            return;
        }
    };
    // The premise: this file system refuses to punch a hole.
    let probe = cache.join("probe");
    fs::write(&probe, [1u8; 8192]).unwrap();
    let punch = common::run_timeout(
        std::process::Command::new("fallocate")
            .args(["-p", "-o", "0", "-l", "4096"])
            .arg(&probe),
        Duration::from_secs(30),
    );
    assert!(!punch.status.success(), "the kernel's ramfs punched a hole");
    fs::remove_file(&probe).unwrap();
    let m = b.mount();
    // Read twice over, many times the limit, and all of it right: whole
    // objects go where chunks cannot.
    for round in 0..2 {
        assert_same("no punching", want, &walk_mounted(m.path()));
        assert!(
            common::wait_until(Duration::from_secs(10), || du(cache) <= limit),
            "round {round}: the cache holds {} bytes, more than cache_size=1M",
            du(cache)
        );
        common::drop_caches();
    }
    let stats = remote_stats(m.path());
    assert!(stats["bytes_fetched"] > 4 * limit, "{stats:?}");
    assert_eq!(stats["cache_corrupt"], 0, "{stats:?}");
    m.unmount().unwrap();
    assert!(du(cache) <= limit, "{} bytes after unmount", du(cache));
}

#[test]
fn a_server_killed_while_caching_leaves_a_cache_the_next_mount_reads_right() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    // Big enough that the whole-image prefetch is still writing when killed.
    common::write_random_file(&images.src.join("big-random"), 48 << 20, 5);
    let img = images.romfs();
    weed.put_file(BUCKET, "tree.romfs", &img).unwrap();
    let want = {
        let m = Mount::new(&img, None, "").unwrap();
        walk_mounted(m.path())
    };
    let cache = cache_dir(&images, "cache");
    let url = format!("s3://{BUCKET}/tree.romfs");
    let opts = format!(
        "{},cache={},chunk=64K",
        weed.mount_options(),
        cache.display()
    );

    for round in 0..3 {
        let m = mount_url(
            None,
            &Creds::Env,
            &url,
            &format!("{opts},prefetch=all"),
            &[],
        )
        .unwrap();
        let pid = common::server_pid(None, m.path());
        // Some chunks written, and more on their way.
        let before = du(&cache);
        assert!(
            common::wait_until(Duration::from_secs(30), || du(&cache)
                > before + (256 << 10)),
            "round {round}: the prefetch wrote nothing"
        );
        std::thread::sleep(Duration::from_millis(20 * round));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        // The mount of a dead server: taken down as any other.
        drop(m);
    }
    // Whatever the kills left half written is never served.
    common::drop_caches();
    let m = mount_url(None, &Creds::Env, &url, &opts, &[]).unwrap();
    assert_same("after kills", &want, &walk_mounted(m.path()));
    let stats = remote_stats(m.path());
    assert!(stats["cache_hits"] > 0, "the cache was not used: {stats:?}");
    m.unmount().unwrap();
}
