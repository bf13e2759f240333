//! The user `tests` mounts an image from S3 through fusermount3: with a
//! cache directory of their own (`-o cache=`), and with the default one
//! under their `XDG_CACHE_HOME`.

use std::path::Path;
use std::time::Duration;

use super::{file_count, mount_url, start_weed, Creds, Images, Weed, BUCKET};
use crate::common::{self, listing, Mount, TEST_USER};

/// Mounts the romfs image as the user with `opts` and `env`, and checks
/// the user sees the tree the local image holds.
fn user_mount(weed: &Weed, images: &Images, opts: &str, env: &[(&str, &Path)]) {
    let img = images.romfs();
    let want = {
        // Root's own mount, which only root may enter.
        let m = Mount::new(&img, None, "").unwrap();
        listing(None, m.path())
    };
    weed.put_file(BUCKET, "tree.romfs", &img).unwrap();
    let opts = format!("{},{opts}", weed.mount_options());
    let m = mount_url(
        Some(TEST_USER),
        &Creds::Env,
        &format!("s3://{BUCKET}/tree.romfs"),
        &opts,
        env,
    )
    .unwrap_or_else(|e| panic!("user mount: {e}"));
    let got = listing(Some(TEST_USER), m.path());
    assert!(
        want == got,
        "the user's remote mount differs from the image"
    );
    // The user's own mount, listed for them with its counters.
    let out = common::as_user(
        TEST_USER,
        common::bin(),
        ["mounts", "--stats"],
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("s3://test/tree.romfs") && text.contains("remote: "),
        "{text}"
    );
    m.unmount().unwrap();
}

#[test]
fn a_user_mounts_from_s3_with_a_cache_of_their_own() {
    require!("user-fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let home = common::user_tempdir(TEST_USER);
    let cache = home.path().join("cache");
    user_mount(&weed, &images, &format!("cache={}", cache.display()), &[]);
    assert!(
        file_count(&cache) > 0,
        "nothing cached in {}",
        cache.display()
    );
}

#[test]
fn a_users_default_cache_is_under_their_xdg_cache_home() {
    require!("user-fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let home = common::user_tempdir(TEST_USER);
    let xdg = home.path().join("xdg-cache");
    user_mount(&weed, &images, "", &[("XDG_CACHE_HOME", &xdg)]);
    let ours = xdg.join("foliofs");
    assert!(
        file_count(&ours) > 0,
        "nothing cached in {}",
        ours.display()
    );
}
