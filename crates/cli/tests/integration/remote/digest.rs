//! `-o digest`: a mount whose digest is right reads the image's tree; one
//! whose digest is missing, damaged or of another object is refused with
//! one line naming the digest. As root and as the user `tests`.

use super::{mount_url, start_weed, Creds, Images, BUCKET};
use crate::common::{self, listing, Mount, TEST_USER};

fn digests(user: Option<&str>) {
    let weed = start_weed();
    let images = Images::new();
    let img = images.romfs();
    let want = {
        let m = Mount::new(&img, None, "").unwrap();
        listing(None, m.path())
    };
    let good = images.path("good.digest");
    common::foliofs_ok([
        "digest".as_ref(),
        img.as_os_str(),
        "-o".as_ref(),
        good.as_os_str(),
    ]);
    let mut damaged = std::fs::read(&good).unwrap();
    let at = damaged.len() / 2;
    damaged[at] ^= 1;
    // The digest of a longer object: the image with a block more.
    let longer = images.path("longer.img");
    let mut bytes = std::fs::read(&img).unwrap();
    bytes.extend_from_slice(&[0; 4096]);
    std::fs::write(&longer, &bytes).unwrap();
    let other = images.path("other.digest");
    common::foliofs_ok([
        "digest".as_ref(),
        longer.as_os_str(),
        "-o".as_ref(),
        other.as_os_str(),
    ]);
    for key in ["a.romfs", "b.romfs", "c.romfs", "d.romfs"] {
        weed.put_file(BUCKET, key, &img).unwrap();
    }
    weed.put_file(BUCKET, "a.romfs.digest", &good).unwrap();
    weed.put(BUCKET, "b.romfs.digest", &damaged).unwrap();
    weed.put_file(BUCKET, "other.digest", &other).unwrap();

    let home = user.map(common::user_tempdir);
    let cache = match &home {
        Some(h) => h.path().join("cache"),
        None => super::cache_dir(&images, "cache"),
    };
    let opts = |d: &str| format!("{},cache={},{d}", weed.mount_options(), cache.display());
    let url = |k: &str| format!("s3://{BUCKET}/{k}");
    let m = mount_url(user, &Creds::Env, &url("a.romfs"), &opts("digest"), &[])
        .unwrap_or_else(|e| panic!("a right digest: {e}"));
    let got = listing(user, m.path());
    m.unmount().unwrap();
    assert!(
        want == got,
        "the mount with a digest differs from the image"
    );

    let size = std::fs::metadata(&img).unwrap().len();
    for (key, d, why) in [
        ("b.romfs", "digest".to_owned(), "it is damaged".to_owned()),
        ("c.romfs", "digest".to_owned(), "404".to_owned()),
        (
            "d.romfs",
            format!("digest={}", url("other.digest")),
            format!(
                "the digest is for an object of {} bytes, this one has {size}",
                size + 4096
            ),
        ),
    ] {
        match mount_url(user, &Creds::Env, &url(key), &opts(&d), &[]) {
            Ok(m) => {
                m.unmount().unwrap();
                panic!("{key} -o {d}: mounted");
            }
            Err(e) => {
                assert!(
                    e.contains("digest s3://test/") && e.contains(&why),
                    "{key} -o {d}: {e}"
                );
                super::assert_no_panic(key, &e);
            }
        }
    }
}

#[test]
fn a_mount_checks_its_digest_and_refuses_a_wrong_one() {
    require!("fuse", "weed", "genromfs");
    digests(None);
}

#[test]
fn a_mount_checks_its_digest_and_refuses_a_wrong_one_for_a_user() {
    require!("user-fuse", "weed", "genromfs");
    digests(Some(TEST_USER));
}
