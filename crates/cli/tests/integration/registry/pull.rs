//! `foliofs pull` and `docker://` mounts against a registry of the test's
//! own.

use std::fs;
use std::path::Path;
use std::time::Duration;

use foliofs_testkit::proxy::{Fault, FaultProxy};

use super::{auth_file, foliofs, pull, push, store_traces, Registry};
use crate::common;
use crate::erofs::walk::{assert_same, walk_mounted};
use crate::image::umoci::umoci_image;
use crate::image::{comparable, user_listing};

/// `foliofs mount --tls-verify=false REFERENCE` as root.
pub(super) fn mount(store: &Path, auth: Option<&Path>, reference: &str) -> common::Mount {
    let mnt = tempfile::Builder::new()
        .prefix("foliofs-mnt.")
        .tempdir()
        .unwrap();
    let mut cmd = foliofs(store, auth);
    cmd.args(["mount", "--tls-verify=false", reference])
        .arg(mnt.path());
    common::Mount::by_command(None, &mut cmd, mnt.path())
        .unwrap()
        .keeping(mnt)
}

/// The layer digests of the manifest of the layout `l`'s only image.
fn layer_digests(l: &Path) -> Vec<String> {
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(l.join("index.json")).unwrap()).unwrap();
    let d = index["manifests"][0]["digest"].as_str().unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(l.join("blobs/sha256").join(&d[7..])).unwrap()).unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect()
}

pub(super) fn one_line_error(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "succeeded");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn an_image_pulled_from_a_registry_mounts_as_umoci_unpacks_it() {
    require!(
        "root",
        "fuse",
        "user-fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let reg = Registry::start(None);
    let reference = format!("docker://{}/foliofs/small:t", reg.host());
    push(&tmp.path().join("L"), "t", &reference, &[]);
    let store = tmp.path().join("store");
    let out = pull(&store, None, &reference, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = String::from_utf8(out.stdout).unwrap();
    assert!(Path::new(merged.trim()).is_file(), "{merged}");
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("3 layers (3 built now)"), "{summary}");
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    let m = mount(&store, None, &reference);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "foliofs's mount of the pulled image, against umoci unpack",
        &want,
        &comparable(got),
    );
    // The store lists the image under its reference, and removes it by
    // that name, and everything of it with a prune.
    let out = common::run_timeout(
        foliofs(&store, None).args(["images", "--json"]),
        Duration::from_secs(60),
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = listed.to_string();
    assert!(text.contains(&reference), "{text}");
    let out = common::run_timeout(
        foliofs(&store, None).args(["rmi", "--prune", &reference]),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(store_traces(&store, "erofs"), Vec::<String>::new());
    // Without --tls-verify=false the registry is spoken to over HTTPS,
    // and refused in one line that says so.
    let out = common::run_timeout(
        foliofs(&store, None).args(["pull", &reference]),
        Duration::from_secs(60),
    );
    let err = one_line_error(&out);
    assert!(err.contains("--tls-verify=false"), "{err}");
    let out = common::run_timeout(
        foliofs(&store, None).args(["pull", "--tls-verify=flase", &reference]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());

    // The user `tests` mounts it from their own store.
    common::open_to_all(tmp.path());
    common::sh_in(tmp.path(), "chmod a+rx U");
    let cache = common::user_tempdir(common::TEST_USER);
    let mnt = common::user_tempdir(common::TEST_USER);
    let mut cmd = common::user_command(common::TEST_USER, "env");
    cmd.arg(format!("XDG_CACHE_HOME={}", cache.path().display()))
        .arg(format!("HOME={}", cache.path().display()))
        .arg(common::bin())
        .args(["mount", "--tls-verify=false", &reference])
        .arg(mnt.path());
    let m = common::Mount::by_command(Some(common::TEST_USER), &mut cmd, mnt.path()).unwrap();
    assert_eq!(
        user_listing(m.path()),
        user_listing(&tmp.path().join("U/rootfs")),
        "a user's mount of the pulled image, against umoci unpack"
    );
    m.unmount().unwrap();
    let user_store = cache.path().join("foliofs/store");
    let layers = fs::read_dir(&user_store)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("layer-"))
        .count();
    assert_eq!(layers, 6, "3 layer images and their implied directories");
}

#[test]
fn a_registry_with_basic_auth_takes_the_credentials_of_the_auth_file() {
    require!(
        "root",
        "fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "htpasswd"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let reg = Registry::start(Some(("puller", "s3cret")));
    let reference = format!("docker://{}/private/img:t", reg.host());
    push(
        &tmp.path().join("L"),
        "t",
        &reference,
        &["--dest-creds", "puller:s3cret"],
    );
    let store = tmp.path().join("store");
    // No credentials: one line saying so, and nothing in the store.
    let out = pull(&store, None, &reference, &[]);
    let err = one_line_error(&out);
    assert!(err.contains("401") && err.contains("credentials"), "{err}");
    assert!(err.contains(&reg.host()), "{err}");
    // Wrong ones: refused, naming the file they came from.
    let wrong = tmp.path().join("wrong.json");
    auth_file(&wrong, &reg.host(), "puller", "nope");
    let err = one_line_error(&pull(&store, Some(&wrong), &reference, &[]));
    assert!(
        err.contains("refused") && err.contains("wrong.json"),
        "{err}"
    );
    assert!(store_traces(&store, "")
        .iter()
        .all(|n| !n.starts_with("layer-")));
    // The right ones, from REGISTRY_AUTH_FILE.
    let good = tmp.path().join("auth.json");
    auth_file(&good, &reg.host(), "puller", "s3cret");
    let out = pull(&store, Some(&good), &reference, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    let m = mount(&store, Some(&good), &reference);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "foliofs's mount of the image pulled with credentials, against umoci unpack",
        &want,
        &comparable(got),
    );
}

/// This machine's architecture as OCI names it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[test]
fn an_index_of_platforms_gives_this_machines_image() {
    require!("root", "fuse", "umoci", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    // Two one-layer images, each saying which it is, and an index of
    // them: the other platform's first.
    common::sh_in(
        tmp.path(),
        r#"umoci init --layout L
for p in host other; do
    umoci new --image L:$p
    umoci unpack --image L:$p B$p >/dev/null
    echo $p > B$p/rootfs/platform
    umoci repack --image L:$p B$p
done
"#,
    );
    let l = tmp.path().join("L");
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(l.join("index.json")).unwrap()).unwrap();
    let tagged = |tag: &str| -> serde_json::Value {
        let mut d = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap()
            .clone();
        d.as_object_mut().unwrap().remove("annotations");
        d
    };
    let other_arch = if host_arch() == "s390x" {
        "riscv64"
    } else {
        "s390x"
    };
    let (mut host, mut other) = (tagged("host"), tagged("other"));
    host["platform"] = serde_json::json!({"os": "linux", "architecture": host_arch()});
    other["platform"] = serde_json::json!({"os": "linux", "architecture": other_arch});
    let list = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [other, host],
    }))
    .unwrap();
    let digest = foliofs_oci::Digest::of(&list);
    fs::write(l.join("blobs/sha256").join(digest.hex()), &list).unwrap();
    let mut index = index.clone();
    index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": digest.to_string(),
            "size": list.len(),
            "annotations": {"org.opencontainers.image.ref.name": "multi"},
        }));
    fs::write(l.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();

    let reg = Registry::start(None);
    let reference = format!("docker://{}/multi/img:m", reg.host());
    push(&l, "multi", &reference, &["--all"]);
    let store = tmp.path().join("store");
    let m = mount(&store, None, &reference);
    assert_eq!(
        fs::read_to_string(m.path().join("platform")).unwrap(),
        "host\n"
    );
    m.unmount().unwrap();
    // --platform takes the other; one nobody built is refused, naming
    // those there are.
    let out = pull(
        &store,
        None,
        &reference,
        &["--platform", &format!("linux/{other_arch}")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = String::from_utf8(out.stdout).unwrap();
    let out = common::run_timeout(
        foliofs(&store, None).args(["cat", merged.trim(), "/platform"]),
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "other\n");
    let err = one_line_error(&pull(
        &store,
        None,
        &reference,
        &["--platform", "linux/mips64le"],
    ));
    assert!(
        err.contains("no image for linux/mips64le") && err.contains(&format!("linux/{other_arch}")),
        "{err}"
    );
}

#[test]
fn a_blob_that_is_not_its_digest_is_refused_and_kept_out_of_the_store() {
    require!("root", "umoci", "setfattr", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let reg = Registry::start(None);
    let reference = format!("docker://{}/damaged/img:t", reg.host());
    push(&tmp.path().join("L"), "t", &reference, &[]);
    // The second layer's blob, one byte in the middle changed on the
    // registry's disk.
    let layers = layer_digests(&tmp.path().join("L"));
    let file = reg.blob_file(&layers[1]);
    let mut bytes = fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&file, &bytes).unwrap();
    let store = tmp.path().join("store");
    let err = one_line_error(&pull(&store, None, &reference, &[]));
    assert!(err.contains("layer 2") && err.contains(&layers[1]), "{err}");
    // The first layer is in the store (and the third, when its build,
    // run beside the second's, was under way); nothing of the second is,
    // nor a merged image.
    let names = store_traces(&store, "");
    let built = names.iter().filter(|n| n.ends_with(".erofs")).count();
    assert!((1..=2).contains(&built), "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with('.') && !n.starts_with("image-")),
        "{names:?}"
    );
}

/// The umoci image with a fifth layer of 4 MiB of random bytes, big
/// enough that a broken-off connection leaves most of it unread.
fn big_image(dir: &Path) {
    umoci_image(dir);
    common::sh_in(
        dir,
        "head -c 4194304 /dev/urandom > B/rootfs/big && umoci repack --refresh-bundle --image L:t B \
         && rm -rf U && umoci unpack --image L:t U >/dev/null",
    );
}

#[test]
fn a_blob_broken_off_mid_stream_is_resumed_with_a_range() {
    require!(
        "root",
        "fuse",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo"
    );
    let tmp = tempfile::tempdir().unwrap();
    big_image(tmp.path());
    let reg = Registry::start(None);
    let proxy = FaultProxy::start(&reg.endpoint()).unwrap();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    // Pushed to the registry itself: the proxy passes on no request
    // bodies.
    push(
        &tmp.path().join("L"),
        "t",
        &format!("docker://{}/resumed/img:t", reg.host()),
        &[],
    );
    let reference = format!("docker://{host}/resumed/img:t");
    // The first blob is cut off half-way, the rest come whole.
    proxy.set(Fault::Short);
    let store = tmp.path().join("store");
    let mut child = foliofs(&store, None)
        .args(["pull", "--tls-verify=false", &reference])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(60), || proxy
        .faulted()
        >= 1));
    proxy.set(Fault::None);
    let done = common::wait_until(Duration::from_secs(120), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !done {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    let m = mount(&store, None, &reference);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "the image pulled with a resumed blob",
        &want,
        &comparable(got),
    );
}

#[test]
fn a_registry_killed_mid_pull_gives_one_error_and_leaves_nothing() {
    require!("root", "umoci", "setfattr", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let mut reg = Registry::start(None);
    let proxy = FaultProxy::start(&reg.endpoint()).unwrap();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    // Pushed to the registry itself: the proxy passes on no request
    // bodies.
    push(
        &tmp.path().join("L"),
        "t",
        &format!("docker://{}/killed/img:t", reg.host()),
        &[],
    );
    let reference = format!("docker://{host}/killed/img:t");
    let layers = layer_digests(&tmp.path().join("L"));
    // The first layer's blob stalls half-way; the registry is killed
    // then, and the stalled connection closed.
    proxy.set(Fault::Stall);
    let store = tmp.path().join("store");
    let mut child = foliofs(&store, None)
        .args(["pull", "--tls-verify=false", &reference])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(common::wait_until(Duration::from_secs(60), || proxy
        .faulted()
        >= 1));
    reg.kill();
    proxy.set(Fault::None);
    let done = common::wait_until(Duration::from_secs(120), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !done {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        done,
        "the pull did not end within 120 s of the registry's death"
    );
    let err = one_line_error(&out);
    assert!(err.contains(&layers[0]), "{err}");
    let names = store_traces(&store, "");
    assert!(
        names
            .iter()
            .all(|n| !n.ends_with(".erofs") && !n.starts_with('.')),
        "{names:?}"
    );
}
