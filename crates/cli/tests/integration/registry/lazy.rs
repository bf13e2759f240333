//! `foliofs mount docker://` of a native EROFS image that `foliofs push`
//! published: its layers read lazily from the registry, chunk by chunk,
//! each chunk checked against the chunk index (and every block against
//! the dm-verity tree) before it is served or cached; the tree the mount
//! shows compared with `umoci unpack` of the same layout, raw and
//! `+zstd`, as root and as the user `tests`; and the faults: a byte
//! flipped in the registry's copy of a chunk, and a registry that is gone.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::push_erofs::{all_implied, push, without};
use super::{foliofs, Registry};
use crate::common;
use crate::erofs::walk::{assert_same, walk_mounted};
use crate::image::umoci::umoci_image;
use crate::image::{comparable, user_listing};

/// `foliofs mount --tls-verify=false -o cache=CACHE[,EXTRA] SOURCE` as
/// root with the store at `store`.
fn mount(store: &Path, cache: &Path, source: &str, extra: &str) -> Result<common::Mount, String> {
    mount_with(store, None, cache, source, extra)
}

/// [`mount`], with the credentials of the auth file `auth`.
fn mount_with(
    store: &Path,
    auth: Option<&Path>,
    cache: &Path,
    source: &str,
    extra: &str,
) -> Result<common::Mount, String> {
    let mnt = tempfile::Builder::new()
        .prefix("foliofs-mnt.")
        .tempdir()
        .unwrap();
    let mut cmd = foliofs(store, auth);
    cmd.args(["mount", "--tls-verify=false", "-o"])
        .arg(format!("cache={}{extra}", cache.display()))
        .arg(source)
        .arg(mnt.path());
    common::Mount::by_command(None, &mut cmd, mnt.path()).map(|m| m.keeping(mnt))
}

/// The files in `dir` whose names start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The counter `key` the mount at `dir` publishes in its `remote` group.
fn remote_counter(dir: &Path, key: &str) -> u64 {
    let dir = dir.canonicalize().unwrap();
    let m = foliofs_fuse::mount_table()
        .unwrap()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == dir)
        .expect("the mount is in the table");
    let c = foliofs_fuse::records::published::read_group_settled(m.mount_id, "remote")
        .expect("the mount publishes its remote counters");
    c[key]
}

#[test]
fn a_native_image_mounts_lazily_as_umoci_unpacks_it() {
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
    let layout = tmp.path().join("L");
    let mut reg = Registry::start(None);
    let pushed = tmp.path().join("pushed");
    let raw = format!("docker://{}/lazy/raw:t", reg.host());
    let zstd = format!("docker://{}/lazy/zstd:t", reg.host());
    push(
        &pushed,
        &layout,
        &raw,
        &["--dm-verity", "--chunk-size", "64K"],
    );
    push(&pushed, &layout, &zstd, &["--zstd", "--chunk-size", "64K"]);
    // A native layer cannot say which directories its tar only implied:
    // there the mount shows the layer's own, as the kernel's overlayfs
    // over the same layers would.
    let implied = all_implied(&pushed);
    let want = without(
        comparable(walk_mounted(&tmp.path().join("U/rootfs"))),
        &implied,
    );
    let cache = tmp.path().join("cache");
    for reference in [&raw, &zstd] {
        let store = tmp.path().join(format!("store-{}", reference.len()));
        let m = mount(&store, &cache, reference, "").unwrap();
        let got = walk_mounted(m.path());
        // The layers' metadata came into the cache as the merged image
        // was built; the server reads the layers through it.
        let read = remote_counter(m.path(), "bytes_read");
        let corrupt = remote_counter(m.path(), "fetch_corrupt");
        m.unmount().unwrap();
        assert_same(
            &format!("the lazy mount of {reference}, against umoci unpack"),
            &want,
            &without(comparable(got), &implied),
        );
        assert!(read > 0, "{reference}: nothing read from the layers");
        assert!(!named(&cache, "").is_empty(), "{reference}: nothing cached");
        assert_eq!(corrupt, 0, "{reference}");
        // The store holds the merged metadata and the layers' sources,
        // and no layer: nothing was pulled whole.
        assert_eq!(named(&store, "layer-"), Vec::<String>::new());
        let lazy = named(&store, "lazy-");
        assert_eq!(lazy.len(), 2, "{lazy:?}");
        assert!(lazy[1].ends_with(".erofs.devices"), "{lazy:?}");
    }

    // With the registry gone, the merged image mounts from the store and
    // reads every file from the disk cache: all the walk above read.
    let store = tmp.path().join(format!("store-{}", raw.len()));
    let image = store.join(&named(&store, "lazy-")[0]);
    reg.kill();
    let m = mount(&store, &cache, image.to_str().unwrap(), ",timeout=5").unwrap();
    let again = walk_mounted(m.path());
    assert_eq!(remote_counter(m.path(), "bytes_fetched"), 0);
    m.unmount().unwrap();
    assert_same(
        "the lazy image from the disk cache, the registry gone",
        &want,
        &without(comparable(again), &implied),
    );
}

#[test]
fn a_user_mounts_a_native_image_lazily_from_their_own_store() {
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
    let layout = tmp.path().join("L");
    let reg = Registry::start(None);
    let reference = format!("docker://{}/lazy/user:t", reg.host());
    push(
        &tmp.path().join("pushed"),
        &layout,
        &reference,
        &["--zstd", "--dm-verity", "--chunk-size", "64K"],
    );
    // Root's lazy mount, open to all, as the truth the user's is held to.
    let root = mount(
        &tmp.path().join("store"),
        &tmp.path().join("cache"),
        &reference,
        ",allow_other",
    )
    .unwrap();
    let home = common::user_tempdir(common::TEST_USER);
    let mnt = common::user_tempdir(common::TEST_USER);
    let mut cmd = common::user_command(common::TEST_USER, "env");
    cmd.arg(format!("XDG_CACHE_HOME={}", home.path().display()))
        .arg(format!("HOME={}", home.path().display()))
        .arg(common::bin())
        .args(["mount", "--tls-verify=false", &reference])
        .arg(mnt.path());
    let m = common::Mount::by_command(Some(common::TEST_USER), &mut cmd, mnt.path()).unwrap();
    let theirs = user_listing(m.path());
    m.unmount().unwrap();
    let truth = user_listing(root.path());
    root.unmount().unwrap();
    assert_eq!(theirs, truth, "the user's lazy mount, against root's");
    assert!(theirs.contains("etc/passwd f 644"), "{theirs}");
    // Their store and cache are their own.
    let store = home.path().join("foliofs/store");
    assert_eq!(named(&store, "lazy-").len(), 2);
    assert!(home.path().join("foliofs").is_dir());
}

/// A one-layer layout `L:t` in `tmp` with a file of random bytes; the
/// file's bytes.
fn big_layout(tmp: &Path) -> Vec<u8> {
    common::sh_in(
        tmp,
        "umoci init --layout L && umoci new --image L:t
umoci unpack --image L:t B >/dev/null
head -c 1000000 /dev/urandom > B/rootfs/big
umoci repack --image L:t B",
    );
    fs::read(tmp.join("B/rootfs/big")).unwrap()
}

/// [`big_layout`]'s image pushed raw in chunks of 64 KiB; the file's
/// bytes and the blob's file in the registry.
fn one_big_file(tmp: &Path, reg: &Registry, reference: &str) -> (Vec<u8>, std::path::PathBuf) {
    big_layout(tmp);
    push(
        &tmp.join("pushed"),
        &tmp.join("L"),
        reference,
        &["--chunk-size", "64K"],
    );
    let big = fs::read(tmp.join("B/rootfs/big")).unwrap();
    // The EROFS manifest's one layer, from the registry's index.
    let out = common::run_timeout(
        Command::new("skopeo").args(["inspect", "--raw", "--tls-verify=false", reference]),
        Duration::from_secs(60),
    );
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifest = index["manifests"][1]["digest"].as_str().unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(reg.blob_file(manifest)).unwrap()).unwrap();
    let layer = m["layers"][0]["digest"].as_str().unwrap();
    (big, reg.blob_file(layer))
}

#[test]
fn a_flipped_byte_in_a_chunk_is_eio_and_never_cached() {
    require!("root", "fuse", "umoci", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start(None);
    let reference = format!("docker://{}/lazy/flip:t", reg.host());
    let (big, blob) = one_big_file(tmp.path(), &reg, &reference);
    // Where the file's middle lies in the blob (a raw layer's data is the
    // image's), flipped in the registry's own copy.
    let original = fs::read(&blob).unwrap();
    let needle = &big[500_000..500_064];
    let at = original
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the file's bytes are in the raw blob");
    let mut damaged = original.clone();
    damaged[at + 10] ^= 0x01;
    fs::write(&blob, &damaged).unwrap();

    let store = tmp.path().join("store");
    let cache = tmp.path().join("cache");
    let m = mount(&store, &cache, &reference, ",timeout=3").unwrap();
    let e = fs::read(m.path().join("big")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(remote_counter(m.path(), "fetch_corrupt") > 0);
    m.unmount().unwrap();
    // Put right in the registry, the same cache gives the right bytes:
    // nothing of the damaged chunk was kept.
    fs::write(&blob, &original).unwrap();
    let m = mount(&store, &cache, &reference, "").unwrap();
    assert!(fs::read(m.path().join("big")).unwrap() == big);
    assert_eq!(remote_counter(m.path(), "fetch_corrupt"), 0);
    m.unmount().unwrap();

    // A byte flipped in the disk cache itself is caught as it is read
    // back (the chunk's checksum, once per process) and fetched again.
    let data = named(&cache, "")
        .into_iter()
        .map(|n| cache.join(n))
        .flat_map(|d| walkdir(&d))
        .find(|p| p.file_name().is_some_and(|n| n == "data"))
        .expect("a cached object's data file");
    let mut cached = fs::read(&data).unwrap();
    let at = cached
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the chunk is cached");
    cached[at] ^= 0x80;
    fs::write(&data, &cached).unwrap();
    let m = mount(&store, &cache, &reference, "").unwrap();
    assert!(fs::read(m.path().join("big")).unwrap() == big);
    assert!(remote_counter(m.path(), "cache_corrupt") > 0);
    m.unmount().unwrap();
}

/// Every file under `dir`.
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = fs::read_dir(&d) else {
            out.push(d);
            continue;
        };
        for e in rd.flatten() {
            todo.push(e.path());
        }
    }
    out
}

/// A registry with [`one_big_file`]'s image at `REPO:t`, mounted lazily
/// with `extra` options (and `timeout=3`) from a store and cache in
/// `tmp`; the file's bytes.
fn big_mounted(tmp: &Path, repo: &str, extra: &str) -> (Registry, Vec<u8>, common::Mount) {
    let reg = Registry::start(None);
    let reference = format!("docker://{}/{repo}:t", reg.host());
    let (big, _) = one_big_file(tmp, &reg, &reference);
    let m = mount(
        &tmp.join("store"),
        &tmp.join("cache"),
        &reference,
        &format!(",timeout=3{extra}"),
    )
    .unwrap();
    (reg, big, m)
}

#[test]
fn a_registry_gone_mid_read_is_eio_within_the_timeout() {
    require!("root", "fuse", "umoci", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    let (mut reg, big, m) = big_mounted(tmp.path(), "lazy/gone", "");
    // The first 64 KiB, fetched while the registry is up.
    let mut head = vec![0u8; 4096];
    {
        use std::io::Read;
        let mut f = fs::File::open(m.path().join("big")).unwrap();
        f.read_exact(&mut head).unwrap();
    }
    assert!(head[..] == big[..4096]);
    reg.kill();
    let t = std::time::Instant::now();
    let e = fs::read(m.path().join("big")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "EIO after {:?}",
        t.elapsed()
    );
    m.unmount().unwrap();
}

/// Each fault of a registry (through a proxy in front of it) met by a
/// lazy read of a file none of whose chunks is cached yet: a fault that
/// goes on ends in EIO within `timeout=`, one that passes in the right
/// bytes; either way the same read once the registry answers again gives
/// the right bytes, so nothing wrong was cached.
#[test]
fn registry_faults_end_in_right_bytes_or_eio_and_nothing_wrong_is_cached() {
    use foliofs_testkit::proxy::{Fault, FaultProxy};
    require!("root", "fuse", "umoci", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start(None);
    let (big, _) = one_big_file(
        tmp.path(),
        &reg,
        &format!("docker://{}/lazy/faults:t", reg.host()),
    );
    let proxy = FaultProxy::start(&reg.endpoint()).unwrap();
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    let reference = format!("docker://{host}/lazy/faults:t");
    // (fault, whether the read gets the right bytes while it lasts)
    let faults = [
        (Fault::Reset, false),
        (Fault::Short, false),
        (Fault::WrongRange, false),
        (Fault::Flip, false),
        (
            Fault::Burst {
                status: 503,
                count: 2,
            },
            true,
        ),
        (
            Fault::Burst {
                status: 404,
                count: 1_000_000,
            },
            false,
        ),
        (Fault::Delay(Duration::from_millis(300)), true),
    ];
    for (i, (fault, passes)) in faults.into_iter().enumerate() {
        let what = format!("{fault:?}");
        proxy.set(Fault::None);
        let store = tmp.path().join(format!("store{i}"));
        let cache = tmp.path().join(format!("cache{i}"));
        // Mounted (the metadata fetched) while the registry answers.
        let m = mount(&store, &cache, &reference, ",timeout=3").unwrap();
        proxy.set(fault);
        let t = std::time::Instant::now();
        match fs::read(m.path().join("big")) {
            Ok(b) => {
                assert!(passes, "{what}: read");
                assert!(b == big, "{what}: wrong bytes");
            }
            Err(e) => {
                assert!(!passes, "{what}: {e}");
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: {:?}",
            t.elapsed()
        );
        if matches!(what.as_str(), "Flip") {
            assert!(remote_counter(m.path(), "fetch_corrupt") > 0, "{what}");
        }
        proxy.set(Fault::None);
        assert!(
            fs::read(m.path().join("big")).unwrap() == big,
            "{what}: wrong bytes once the registry answers again"
        );
        m.unmount().unwrap();
    }
}

/// A lazy read whose bearer token expired since the last one gets a new
/// token from the token service, and its bytes.
#[test]
fn a_lazy_read_after_its_token_expired_gets_a_new_token() {
    use super::token::{Policy, TokenServer};
    require!(
        "root",
        "fuse",
        "umoci",
        "docker-registry",
        "skopeo",
        "openssl"
    );
    let tmp = tempfile::tempdir().unwrap();
    let tokens = TokenServer::start(Policy {
        user: ("puller".into(), "t0ken".into()),
        anonymous_pull: false,
    });
    let reg = Registry::with_tokens(&tokens);
    let big = big_layout(tmp.path());
    let auth = tmp.path().join("auth.json");
    super::auth_file(&auth, &reg.host(), "puller", "t0ken");
    let reference = format!("docker://{}/lazy/token:t", reg.host());
    let out = common::run_timeout(
        foliofs(&tmp.path().join("pushed"), Some(&auth))
            .args(["push", "--tls-verify=false", "--chunk-size", "64K"])
            .arg(format!("oci:{}:t", tmp.path().join("L").display()))
            .arg(&reference),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokens.set_valid_for(Duration::from_secs(2));
    let m = mount_with(
        &tmp.path().join("store"),
        Some(&auth),
        &tmp.path().join("cache"),
        &reference,
        ",timeout=10",
    )
    .unwrap();
    let mut head = vec![0u8; 4096];
    {
        use std::io::Read;
        let mut f = fs::File::open(m.path().join("big")).unwrap();
        f.read_exact(&mut head).unwrap();
    }
    assert!(head[..] == big[..4096]);
    std::thread::sleep(Duration::from_millis(2500));
    let issued = tokens.issued();
    assert!(fs::read(m.path().join("big")).unwrap() == big);
    assert!(
        tokens.issued() > issued,
        "no new token after the last one expired"
    );
    m.unmount().unwrap();
}

/// `prefetch=all` fetches a lazy image whole in the background: once it
/// has, the registry can go and every read is served.
#[test]
fn prefetch_all_fetches_a_lazy_image_whole() {
    require!("root", "fuse", "umoci", "docker-registry", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    let (mut reg, big, m) = big_mounted(tmp.path(), "lazy/prefetch", ",prefetch=all");
    // Nothing read yet: what comes is the prefetch's (what the mount
    // fetched for the metadata is cached already), until it stops.
    let mut last = u64::MAX;
    let settled = common::wait_until(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(500));
        let now = remote_counter(m.path(), "bytes_fetched");
        std::mem::replace(&mut last, now) == now && now > 0
    });
    assert!(settled, "{last} bytes prefetched");
    assert_eq!(remote_counter(m.path(), "bytes_read"), 0);
    reg.kill();
    assert!(fs::read(m.path().join("big")).unwrap() == big);
    assert_eq!(remote_counter(m.path(), "fetch_errors"), 0);
    m.unmount().unwrap();
}
