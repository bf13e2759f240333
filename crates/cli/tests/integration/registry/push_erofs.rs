//! `foliofs push`: an umoci image published to a registry of the test's
//! own as native EROFS layers beside its tar image, then checked with
//! other tools: `skopeo copy --all` brings back what was pushed, digest
//! for digest; the kernel mounts each raw layer blob as it is, and its
//! overlayfs over them shows what `umoci unpack` does; `veritysetup
//! verify` takes the dm-verity tree (and refuses a flipped byte); the
//! chunk index, read by foliofs-oci's reader, matches every chunk; a
//! client that picks a platform's image without knowing EROFS gets the
//! tar image; and the user `tests` pushing the same layout from their
//! own store gets the same digests.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::{foliofs, Registry};
use crate::common;
use crate::erofs::mkfs::merge::{as_overlay_shows, Overlay};
use crate::erofs::walk::{assert_same, walk_mounted, KernelMount, Tree};
use crate::image::comparable;
use crate::image::umoci::umoci_image;

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `foliofs push --tls-verify=false EXTRA oci:L:t DEST` as root with the
/// store at `store`; the index digest it printed.
pub(super) fn push(store: &Path, layout: &Path, dest: &str, extra: &[&str]) -> String {
    let out = common::run_timeout(
        foliofs(store, None)
            .args(["push", "--tls-verify=false"])
            .args(extra)
            .arg(format!("oci:{}:t", layout.display()))
            .arg(dest),
        Duration::from_secs(300),
    );
    ok(&out, "foliofs push").trim().to_owned()
}

pub(super) fn skopeo(args: &[&str]) -> String {
    let out = common::run_timeout(Command::new("skopeo").args(args), Duration::from_secs(300));
    ok(&out, &format!("skopeo {args:?}"))
}

/// A layout's blob.
fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout.join("blobs/sha256").join(&digest["sha256:".len()..])
}

/// The digest of the manifest `index.json` of `layout` names.
fn top_digest(layout: &Path) -> String {
    json(&fs::read(layout.join("index.json")).unwrap())["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The implied directories the store recorded for every layer (each
/// NUL-terminated), which overlayfs shows as the layer image has them.
pub(super) fn all_implied(store: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for e in fs::read_dir(store).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "implied") {
            for p in fs::read(e.path()).unwrap().split(|&b| b == 0) {
                if !p.is_empty() {
                    out.insert(PathBuf::from(String::from_utf8(p.to_vec()).unwrap()));
                }
            }
            out.insert(PathBuf::new());
        }
    }
    out
}

pub(super) fn without(t: Tree, out: &BTreeSet<PathBuf>) -> Tree {
    t.into_iter().filter(|(p, _)| !out.contains(p)).collect()
}

/// Every chunk of the blob at `path` (a layer of `desc`) against the
/// chunk index read from it; the image data it indexes, rebuilt.
fn check_chunks(path: &Path, desc: &serde_json::Value, zstd: bool) -> Vec<u8> {
    let a = &desc["annotations"];
    let raw = fs::read(path).unwrap();
    let digest =
        foliofs_oci::Digest::parse(a["org.erofs.chunk-index.digest"].as_str().unwrap()).unwrap();
    let idx = foliofs_oci::chunk_index::read_embedded(
        &mut std::io::Cursor::new(&raw),
        raw.len() as u64,
        a["org.erofs.chunk-index.range"].as_str().unwrap(),
        zstd,
        Some(&digest),
    )
    .unwrap();
    assert_eq!(
        a["org.erofs.chunk-index.mediaType"],
        "application/vnd.erofs.chunk-index.v1"
    );
    assert_eq!(idx.hash_size, 32);
    let mut data = Vec::new();
    for i in 0..idx.entries.len() {
        let (o, l) = idx.blob_range(i);
        let bytes = &raw[o as usize..(o + l) as usize];
        assert_eq!(
            Sha256::digest(bytes).as_slice(),
            &idx.entries[i].checksum[..],
            "chunk {i} of {}",
            path.display()
        );
        assert!(idx.checks(i, bytes));
        let (uo, ul) = idx.uncompressed_range(i);
        assert_eq!(uo as usize, data.len());
        if zstd {
            let plain = zstd::stream::decode_all(bytes).unwrap();
            assert_eq!(plain.len() as u64, ul, "chunk {i}");
            data.extend_from_slice(&plain);
        } else {
            assert_eq!((o, l), (uo, ul), "a raw chunk is where its data is");
            data.extend_from_slice(bytes);
        }
    }
    assert_eq!(data.len() as u64, idx.uncompressed_size);
    data
}

#[test]
fn foliofs_push_publishes_raw_erofs_layers_that_the_kernel_skopeo_and_veritysetup_take() {
    require!(
        "root",
        "user-fuse",
        "kernel-erofs",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo",
        "veritysetup"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let layout = tmp.path().join("L");
    let reg = Registry::start(None);
    let dest = format!("docker://{}/foliofs/erofs:t", reg.host());
    let store = tmp.path().join("store");
    let index = push(
        &store,
        &layout,
        &dest,
        &["--dm-verity", "--chunk-size", "16K"],
    );

    // The index, as another tool reads it: the tar manifest first, then
    // the EROFS one, whose platform says erofs.
    let raw = skopeo(&["inspect", "--raw", "--tls-verify=false", &dest]);
    assert_eq!(
        format!("sha256:{:x}", Sha256::digest(raw.as_bytes())),
        index
    );
    let idx = json(raw.as_bytes());
    let tar_manifest = top_digest(&layout);
    assert_eq!(idx["manifests"][0]["digest"], tar_manifest.as_str());
    assert!(idx["manifests"][0]["platform"]["os.features"].is_null());
    assert_eq!(
        idx["manifests"][1]["platform"]["os.features"],
        serde_json::json!(["erofs"])
    );

    // skopeo copies it all back, digest for digest (it checks each blob
    // against its descriptor on the way).
    let copy = tmp.path().join("COPY");
    skopeo(&[
        "copy",
        "--all",
        "--quiet",
        "--src-tls-verify=false",
        &dest,
        &format!("oci:{}:t", copy.display()),
    ]);
    assert_eq!(top_digest(&copy), index);
    let erofs_manifest = idx["manifests"][1]["digest"].as_str().unwrap();
    let m = json(&fs::read(blob(&copy, erofs_manifest)).unwrap());
    assert_eq!(
        fs::read(blob(&copy, &tar_manifest)).unwrap(),
        fs::read(blob(&layout, &tar_manifest)).unwrap()
    );
    let config = json(&fs::read(blob(&copy, m["config"]["digest"].as_str().unwrap())).unwrap());
    assert_eq!(config["os.features"], serde_json::json!(["erofs"]));
    assert_eq!(config["rootfs"]["type"], "layers");
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    let mut blobs = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let d = l["digest"].as_str().unwrap();
        let path = blob(&copy, d);
        assert_eq!(l["mediaType"], "application/vnd.erofs");
        assert_eq!(config["rootfs"]["diff_ids"][i], d, "a raw layer's DiffID");
        let role = &l["annotations"]["org.erofs.role"];
        if i + 1 < layers.len() {
            assert_eq!(role, "overlay-lower");
        } else {
            assert!(role.is_null());
        }
        let data = check_chunks(&path, l, false);
        // dm-verity: the tree after the image, as veritysetup takes it.
        let a = &l["annotations"];
        let hash_offset: u64 = a["org.erofs.dmverity.hash_offset"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(hash_offset % 4096, 0);
        assert_eq!(a["org.erofs.dmverity.block_size"], "4096");
        assert!(data.len() as u64 > hash_offset);
        let root = &a["org.erofs.dmverity.root_digest"].as_str().unwrap()["sha256:".len()..];
        let verify = |file: &Path| {
            common::run_timeout(
                Command::new("veritysetup")
                    .arg("verify")
                    .arg(format!("--hash-offset={hash_offset}"))
                    .arg(file)
                    .arg(file)
                    .arg(root),
                Duration::from_secs(60),
            )
        };
        ok(&verify(&path), "veritysetup verify");
        let flipped = tmp.path().join(format!("flipped{i}"));
        let mut b = fs::read(&path).unwrap();
        b[(hash_offset / 2) as usize] ^= 0x40;
        fs::write(&flipped, &b).unwrap();
        assert!(
            !verify(&flipped).status.success(),
            "veritysetup verify took a flipped byte in layer {i}"
        );
        blobs.push(path);
    }

    // The kernel mounts each blob as it is; its overlayfs over them, top
    // first, shows what umoci unpack does, but the directories a layer's
    // tar only implied (overlayfs shows the layer image's own).
    let implied = all_implied(&store);
    let stacked = {
        let mounts: Vec<KernelMount> = blobs.iter().map(|b| KernelMount::new(b, "")).collect();
        let top_first: Vec<&Path> = mounts.iter().rev().map(KernelMount::path).collect();
        let ovl = Overlay::new(&top_first);
        walk_mounted(ovl.path())
    };
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    assert_same(
        "the kernel's overlayfs over the pushed EROFS layer blobs, against umoci unpack \
         (but implied directories)",
        &without(as_overlay_shows(want), &implied),
        &without(as_overlay_shows(comparable(stacked)), &implied),
    );

    // A client that picks this machine's image and knows no EROFS gets
    // the tar image, which umoci unpacks.
    let tar_only = tmp.path().join("TAR");
    skopeo(&[
        "copy",
        "--quiet",
        "--src-tls-verify=false",
        &dest,
        &format!("oci:{}:t", tar_only.display()),
    ]);
    assert_eq!(top_digest(&tar_only), tar_manifest);
    common::sh_in(tmp.path(), "umoci unpack --image TAR:t U2 >/dev/null");
    assert_same(
        "umoci unpack of the tar image a tar-only client copied",
        &comparable(walk_mounted(&tmp.path().join("U/rootfs"))),
        &comparable(walk_mounted(&tmp.path().join("U2/rootfs"))),
    );

    // Pushed again, the same: nothing is uploaded twice, and the user
    // `tests`, from a store of their own, pushes the same digests.
    let again = common::run_timeout(
        foliofs(&store, None)
            .args([
                "push",
                "--tls-verify=false",
                "--dm-verity",
                "--chunk-size=16K",
            ])
            .arg(format!("oci:{}:t", layout.display()))
            .arg(&dest),
        Duration::from_secs(300),
    );
    assert_eq!(ok(&again, "foliofs push again").trim(), index);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("0 blobs uploaded"), "{said}");
    common::open_to_all(tmp.path());
    common::sh_in(tmp.path(), "chmod -R a+rX L");
    let cache = common::user_tempdir(common::TEST_USER);
    let mut cmd = common::user_command(common::TEST_USER, "env");
    cmd.arg(format!("XDG_CACHE_HOME={}", cache.path().display()))
        .arg(format!("HOME={}", cache.path().display()))
        .arg(common::bin())
        .args([
            "push",
            "--tls-verify=false",
            "--dm-verity",
            "--chunk-size",
            "16K",
        ])
        .arg(format!("oci:{}:t", layout.display()))
        .arg(format!("docker://{}/foliofs/user:t", reg.host()));
    let out = common::run_timeout(&mut cmd, Duration::from_secs(300));
    assert_eq!(ok(&out, "foliofs push as the user").trim(), index);
}

#[test]
fn foliofs_push_zstd_layers_are_one_frame_per_chunk_and_decompress_to_their_digest() {
    require!(
        "root",
        "kernel-erofs",
        "umoci",
        "setfattr",
        "docker-registry",
        "skopeo"
    );
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let layout = tmp.path().join("L");
    let reg = Registry::start(None);
    let dest = format!("docker://{}/foliofs/zstd:t", reg.host());
    let store = tmp.path().join("store");
    let index = push(&store, &layout, &dest, &["--zstd", "--chunk-size", "8K"]);
    let copy = tmp.path().join("COPY");
    skopeo(&[
        "copy",
        "--all",
        "--quiet",
        "--src-tls-verify=false",
        &dest,
        &format!("oci:{}:t", copy.display()),
    ]);
    assert_eq!(top_digest(&copy), index);
    let idx = json(&fs::read(blob(&copy, &index)).unwrap());
    let m = json(&fs::read(blob(&copy, idx["manifests"][1]["digest"].as_str().unwrap())).unwrap());
    let config = json(&fs::read(blob(&copy, m["config"]["digest"].as_str().unwrap())).unwrap());
    let layers = m["layers"].as_array().unwrap();
    let mut images = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(l["mediaType"], "application/vnd.erofs+zstd");
        let path = blob(&copy, l["digest"].as_str().unwrap());
        let data = check_chunks(&path, l, true);
        let range = l["annotations"]["org.erofs.chunk-index.range"]
            .as_str()
            .unwrap();
        let start: u64 = range.split(':').next().unwrap().parse().unwrap();
        assert_eq!(start % 4, 0, "the index frame is 4-byte aligned");
        // A plain zstd decoder reads the whole blob to the same data,
        // whose digest is the annotation and the config's DiffID.
        let whole = zstd::stream::decode_all(&fs::read(&path).unwrap()[..]).unwrap();
        assert!(
            whole == data,
            "layer {i}: the frames and the whole stream differ"
        );
        let d = format!("sha256:{:x}", Sha256::digest(&whole));
        assert_eq!(
            l["annotations"]["org.erofs.uncompressed-digest"],
            d.as_str()
        );
        assert_eq!(config["rootfs"]["diff_ids"][i], d.as_str());
        let img = tmp.path().join(format!("layer{i}.erofs"));
        fs::write(&img, &whole).unwrap();
        images.push(img);
    }
    // Decompressed, they stack as umoci unpacks the image.
    let implied = all_implied(&store);
    let stacked = {
        let mounts: Vec<KernelMount> = images.iter().map(|b| KernelMount::new(b, "")).collect();
        let top_first: Vec<&Path> = mounts.iter().rev().map(KernelMount::path).collect();
        let ovl = Overlay::new(&top_first);
        walk_mounted(ovl.path())
    };
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    assert_same(
        "the kernel's overlayfs over the decompressed +zstd layers, against umoci unpack",
        &without(as_overlay_shows(want), &implied),
        &without(as_overlay_shows(comparable(stacked)), &implied),
    );
}

/// A bottom layer that holds a whiteout (umoci adds such a tar as it is)
/// is refused before anything is sent, naming the layer, the path and
/// what is there: the format forbids overlayfs's markers where nothing
/// lies below them.
#[test]
fn a_bottom_layer_with_a_whiteout_is_refused_before_anything_is_sent() {
    require!("root", "umoci", "tar");
    let tmp = tempfile::tempdir().unwrap();
    common::sh_in(
        tmp.path(),
        "mkdir -p src/etc && echo kept > src/etc/kept && : > src/etc/.wh.gone
tar --format=pax --owner=0 --group=0 -C src -cf bottom.tar etc
umoci init --layout L
umoci new --image L:t
umoci raw add-layer --image L:t bottom.tar",
    );
    let store = tmp.path().join("store");
    let layout = format!("oci:{}:t", tmp.path().join("L").display());
    // No registry listens on port 1: anything sent would fail otherwise.
    let out = common::run_timeout(
        foliofs(&store, None).args([
            "push",
            "--tls-verify=false",
            &layout,
            "docker://127.0.0.1:1/bottom/img:t",
        ]),
        Duration::from_secs(120),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("layer 1") && err.contains("a whiteout at /etc/gone"),
        "{err}"
    );
}
