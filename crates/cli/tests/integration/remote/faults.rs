//! What goes wrong with a remote image: the server dies mid-read (EIO
//! within the timeout, the mount stays, reads work again once it is
//! back), a truncated or corrupt object, wrong or missing credentials and
//! missing objects (one line, nothing mounted), and credentials from
//! `~/.aws/credentials`.

use std::fs;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use super::{
    assert_no_panic, cache_dir, foliofs_with, lines, mount_url, start_weed, Creds, Images, BUCKET,
};
use crate::common::{self, Mount};
use crate::erofs::walk::{assert_same, walk_mounted};

#[test]
fn a_dead_server_gives_eio_within_the_timeout_and_a_restart_heals() {
    require!("fuse", "weed", "genromfs");
    let mut weed = start_weed();
    let images = Images::new();
    common::write_random_file(&images.src.join("big-random"), 32 << 20, 9);
    let img = images.romfs();
    weed.put_file(BUCKET, "tree.romfs", &img).unwrap();
    let cache = cache_dir(&images, "cache");
    let opts = format!(
        "{},cache={},chunk=64K,timeout=3",
        weed.mount_options(),
        cache.display()
    );
    let m = mount_url(
        None,
        &Creds::Env,
        &format!("s3://{BUCKET}/tree.romfs"),
        &opts,
        &[],
    )
    .unwrap();
    let want = fs::read(images.src.join("big-random")).unwrap();
    let f = fs::File::open(m.path().join("big-random")).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, want[..4096]);

    weed.kill();
    // Far from anything read so far: the server has to fetch it.
    let at = 24u64 << 20;
    let start = Instant::now();
    let err = f.read_exact_at(&mut buf, at).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The bound is the option's (3 s) plus a request in flight; a wide
    // margin here, the figure itself is for `foliofs bench`.
    assert!(took < Duration::from_secs(30), "EIO after {took:?}");
    assert!(common::is_mounted(m.path()), "the mount went away");
    fs::metadata(m.path().join("many")).unwrap();

    weed.restart().unwrap();
    f.read_exact_at(&mut buf, at).unwrap();
    assert_eq!(buf, want[at as usize..at as usize + 4096]);
    let mut all = Vec::new();
    std::io::Read::read_to_end(
        &mut fs::File::open(m.path().join("big-random")).unwrap(),
        &mut all,
    )
    .unwrap();
    assert!(all == want, "content after the restart differs");
    let stats = super::remote_stats(m.path());
    assert!(stats["fetch_errors"] > 0, "{stats:?}");
    m.unmount().unwrap();
}

#[test]
fn truncated_and_corrupt_objects_give_clear_errors() {
    require!("fuse", "weed", "genromfs", "mkfs.erofs");
    let weed = start_weed();
    let images = Images::new();
    let cache = cache_dir(&images, "cache");
    let opts = format!("{},cache={}", weed.mount_options(), cache.display());
    for (name, img) in [("romfs", images.romfs()), ("erofs", images.erofs_lz4())] {
        let data = fs::read(&img).unwrap();
        // Cut in the middle: the superblock is fine, much of the rest gone.
        let key = format!("{name}-truncated");
        weed.put(BUCKET, &key, &data[..data.len() / 2]).unwrap();
        let url = format!("s3://{BUCKET}/{key}");
        let (ok, out, err) = foliofs_with(&Creds::Env, &["fsck", "-o", &opts, &url]);
        assert!(!ok, "{name}: fsck of a truncated image passed:\n{out}");
        assert_no_panic(&key, &err);
        match mount_url(None, &Creds::Env, &url, &opts, &[]) {
            // Refused in one line, or mounted with errors where data is missing.
            Err(e) => assert_eq!(lines(&e).len(), 1, "{e}"),
            Ok(m) => {
                let failed = read_everything(m.path());
                assert!(
                    failed > 0,
                    "{name}: a truncated image read without an error"
                );
                assert!(common::is_mounted(m.path()));
                fs::metadata(m.path()).unwrap();
                m.unmount().unwrap();
            }
        }

        // Damage in the middle of the data: no panic, and a mount that
        // answers on.
        let mut bad = data.clone();
        let mid = bad.len() / 3;
        for b in &mut bad[mid..mid + 256 * 1024] {
            *b ^= 0x5a;
        }
        let key = format!("{name}-corrupt");
        weed.put(BUCKET, &key, &bad).unwrap();
        let url = format!("s3://{BUCKET}/{key}");
        let (_, _, err) = foliofs_with(&Creds::Env, &["fsck", "-o", &opts, &url]);
        assert_no_panic(&key, &err);
        if let Ok(m) = mount_url(None, &Creds::Env, &url, &opts, &[]) {
            read_everything(m.path());
            assert!(common::is_mounted(m.path()));
            fs::metadata(m.path()).unwrap();
            m.unmount().unwrap();
        }
    }
    // Not an image at all, and an empty object: one line each.
    weed.put(BUCKET, "text", b"just some text, not an image\n")
        .unwrap();
    weed.put(BUCKET, "empty", b"").unwrap();
    for (key, want) in [("text", "not a romfs or EROFS image"), ("empty", "")] {
        let url = format!("s3://{BUCKET}/{key}");
        let e = mount_url(None, &Creds::Env, &url, &opts, &[])
            .err()
            .expect("mounted");
        assert_eq!(lines(&e).len(), 1, "{e}");
        assert!(e.contains(want) && e.contains(&url), "{e}");
        assert_no_panic(key, &e);
    }
}

/// Reads every file under `dir`, counting the reads and listings that
/// failed; each failure must be EIO (the image is damaged), never a hang.
fn read_everything(dir: &std::path::Path) -> usize {
    let mut failed = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{}: {e}", d.display());
                failed += 1;
                continue;
            }
        };
        for e in entries {
            let Ok(e) = e else {
                failed += 1;
                continue;
            };
            let p = e.path();
            match fs::symlink_metadata(&p) {
                Ok(md) if md.is_dir() => stack.push(p),
                Ok(md) if md.is_file() => {
                    if let Err(err) = fs::read(&p) {
                        assert_eq!(
                            err.raw_os_error(),
                            Some(libc::EIO),
                            "{}: {err}",
                            p.display()
                        );
                        failed += 1;
                    }
                }
                Ok(_) => {}
                Err(_) => failed += 1,
            }
        }
    }
    failed
}

#[test]
fn wrong_or_missing_credentials_and_missing_objects_are_refused_in_one_line() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    weed.put_file(BUCKET, "tree.romfs", &images.romfs())
        .unwrap();
    let cache = cache_dir(&images, "cache");
    let opts = format!("{},cache={}", weed.mount_options(), cache.display());
    let url = format!("s3://{BUCKET}/tree.romfs");
    for (creds, url, what) in [
        (
            Creds::Pair(super::ACCESS_KEY, "not-the-secret"),
            url.clone(),
            "403",
        ),
        (Creds::Pair("nobody", "nothing"), url.clone(), "403"),
        (Creds::Anonymous, url.clone(), "403"),
        (Creds::Env, format!("s3://{BUCKET}/no-such-image"), "404"),
        (
            Creds::Env,
            "s3://no-such-bucket/tree.romfs".to_owned(),
            "404",
        ),
    ] {
        let e = mount_url(None, &creds, &url, &opts, &[])
            .err()
            .expect("mounted");
        assert_eq!(lines(&e).len(), 1, "{creds:?} {url}: {e}");
        assert!(e.contains(what) || e.contains(&url), "{creds:?} {url}: {e}");
        assert!(!e.contains("not-the-secret"), "{e}");
        let (ok, _, err) = foliofs_with(&creds, &["info", "-o", &opts, &url]);
        assert!(!ok);
        assert_eq!(lines(&err).len(), 1, "{err}");
    }
    // Nothing was cached from what was refused, and nothing is mounted.
    assert_eq!(super::file_count(&cache), 0);
}

#[test]
fn credentials_come_from_the_aws_files_of_home() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let img = images.romfs();
    weed.put_file(BUCKET, "tree.romfs", &img).unwrap();
    let home = images.path("home");
    fs::create_dir_all(home.join(".aws")).unwrap();
    fs::write(
        home.join(".aws/credentials"),
        format!(
            "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n\
             [seaweed]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            super::ACCESS_KEY,
            super::SECRET_KEY
        ),
    )
    .unwrap();
    fs::write(
        home.join(".aws/config"),
        "[profile seaweed]\nregion = us-east-1\n",
    )
    .unwrap();
    let cache = cache_dir(&images, "cache");
    let opts = format!("{},cache={}", weed.mount_options(), cache.display());
    let url = format!("s3://{BUCKET}/tree.romfs");
    let want = {
        let m = Mount::new(&img, None, "").unwrap();
        walk_mounted(m.path())
    };
    // The default profile's keys are wrong...
    let e = mount_url(None, &Creds::Home(home.clone()), &url, &opts, &[])
        .err()
        .expect("mounted with the default profile's wrong keys");
    assert_eq!(lines(&e).len(), 1, "{e}");
    // ...AWS_PROFILE picks the right ones.
    let profile = std::path::PathBuf::from("seaweed");
    let m = mount_url(
        None,
        &Creds::Home(home.clone()),
        &url,
        &opts,
        &[("AWS_PROFILE", &profile)],
    )
    .unwrap();
    assert_same("profile", &want, &walk_mounted(m.path()));
    m.unmount().unwrap();
}
