//! Small umoci images, each made for the changes it records, mounted and
//! merged as `umoci unpack` unpacks them; and the store's own checks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{comparable, merge_image, mount_image, user_listing, STORE_ENV};
use crate::common;
use crate::erofs::walk::{assert_same, walk_mounted};

/// An OCI layout `L` in `dir` with the image `t`: a base and three layers
/// of changes, made in a bundle as a container would make them and
/// recorded by `umoci repack` (a layer per repack).
pub(crate) fn umoci_image(dir: &Path) {
    common::sh_in(
        dir,
        r#"umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t B >/dev/null
r=B/rootfs
mkdir -p $r/etc $r/usr/lib $r/usr/bin $r/opt/app/conf $r/var/cache/x $r/gone/deep $r/d2f/inner
printf 'root:x:0:0::/root:/bin/sh\n' > $r/etc/passwd
echo base > $r/etc/motd
head -c 20000 /dev/urandom > $r/usr/lib/libbig.so
printf '#!/bin/sh\necho tool\n' > $r/usr/bin/tool
chmod 0755 $r/usr/bin/tool
ln $r/etc/passwd $r/etc/passwd-
ln -s ../bin/tool $r/usr/lib/tool-link
echo conf > $r/opt/app/conf/a.conf
echo x > $r/var/cache/x/f
echo bye > $r/gone/deep/f
echo a > $r/d2f/inner/a
echo f2d > $r/f2d
mkfifo $r/var/fifo
setfattr -n user.origin -v base $r/etc/motd
chmod 0700 $r/opt/app
umoci repack --refresh-bundle --image L:t B
printf 'root:x:0:0::/root:/bin/bash\n' > $r/etc/passwd
rm -rf $r/gone $r/var/cache/x
rm $r/usr/lib/tool-link
echo more > $r/opt/app/conf/b.conf
rm -rf $r/d2f && echo now-a-file > $r/d2f
rm $r/f2d && mkdir $r/f2d && echo inside > $r/f2d/file
ln $r/opt/app/conf/b.conf $r/opt/app/conf/b-link.conf
setfattr -n user.origin -v upper $r/etc/motd
umoci repack --refresh-bundle --image L:t B
rm -rf $r/opt/app/conf && mkdir $r/opt/app/conf && echo fresh > $r/opt/app/conf/only
chmod 0750 $r/usr/lib
head -c 5000 /dev/urandom > $r/usr/lib/libbig.so
touch -d @1500000000 $r/etc/motd
umoci repack --refresh-bundle --image L:t B
umoci unpack --image L:t U >/dev/null
"#,
    );
}

#[test]
fn an_umoci_image_mounts_as_umoci_unpacks_it() {
    require!("root", "fuse", "kernel-erofs", "umoci", "setfattr");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let store = tmp.path().join("store");
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    let m = mount_image(&reference, &store);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "foliofs's mount of the umoci image, against umoci unpack",
        &want,
        &comparable(got.clone()),
    );
    // The same merged image through the kernel, with the store's layers.
    let img = tmp.path().join("merged.erofs");
    let layers = merge_image(&reference, &store, &img);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let kernel = crate::erofs::mkfs::kernel_walk_devices(&img, &devices);
    assert_same(
        "the kernel's mount of the merged image",
        &comparable(kernel),
        &want,
    );
    // A second mount builds nothing.
    let stamp = fs::metadata(&layers[0]).unwrap().modified().unwrap();
    let before = fs::read_dir(&store).unwrap().count();
    let m = mount_image(&reference, &store);
    m.unmount().unwrap();
    assert_eq!(fs::metadata(&layers[0]).unwrap().modified().unwrap(), stamp);
    assert_eq!(fs::read_dir(&store).unwrap().count(), before);
}

#[test]
fn a_user_mounts_an_umoci_image_from_their_own_store() {
    require!("root", "user-fuse", "umoci", "setfattr");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    common::open_to_all(tmp.path());
    // The layout for the user to read, and umoci's bundle (0700) for
    // the user to enter; its rootfs stays as unpacked.
    common::sh_in(tmp.path(), "chmod -R a+rX L && chmod a+rx U");
    let cache = common::user_tempdir(common::TEST_USER);
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let mnt = common::user_tempdir(common::TEST_USER);
    let mut cmd = common::user_command(common::TEST_USER, "env");
    cmd.arg(format!("XDG_CACHE_HOME={}", cache.path().display()))
        .arg(common::bin())
        .arg("mount")
        .arg(&reference)
        .arg(mnt.path());
    let m = common::Mount::by_command(Some(common::TEST_USER), &mut cmd, mnt.path()).unwrap();
    // The user lists their mount and umoci's unpack alike.
    assert_eq!(
        user_listing(m.path()),
        user_listing(&tmp.path().join("U/rootfs")),
        "a user's mount of the umoci image, against umoci unpack"
    );
    m.unmount().unwrap();
    assert!(cache.path().join("foliofs/store").is_dir());
}

#[test]
fn a_blob_that_is_not_its_digest_is_refused_and_kept_out_of_the_store() {
    require!("root", "umoci", "setfattr");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    // The second layer's blob, one byte changed.
    let manifest: serde_json::Value = {
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(tmp.path().join("L/index.json")).unwrap()).unwrap();
        let d = index["manifests"][0]["digest"].as_str().unwrap();
        let p = tmp.path().join("L/blobs/sha256").join(&d[7..]);
        serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
    };
    let layer = manifest["layers"][1]["digest"].as_str().unwrap().to_owned();
    let blob = tmp.path().join("L/blobs/sha256").join(&layer[7..]);
    let mut bytes = fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).unwrap();
    let store = tmp.path().join("store");
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let img = tmp.path().join("merged.erofs");
    let out = common::run_timeout(
        Command::new(common::bin())
            .env(STORE_ENV, &store)
            .args(["mkfs", "erofs", "-q", "--merge"])
            .arg(&reference)
            .arg(&img),
        Duration::from_secs(300),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "merged a damaged image");
    assert!(err.contains("layer 2") && err.contains(&layer), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!img.exists());
    // The first layer went into the store; the damaged one did not, nor
    // any part of it.
    let diff_ids = config_diff_ids(&tmp.path().join("L"), &manifest);
    assert!(store
        .join(format!("layer-{}.erofs", &diff_ids[0][7..]))
        .exists());
    for e in fs::read_dir(&store).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains(&diff_ids[1][7..]) && !name.starts_with(".layer."),
            "{name} left in the store"
        );
    }
}

/// The diff_ids of `manifest`'s config in the layout `l`.
fn config_diff_ids(l: &Path, manifest: &serde_json::Value) -> Vec<String> {
    let d = manifest["config"]["digest"].as_str().unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&fs::read(l.join("blobs/sha256").join(&d[7..])).unwrap()).unwrap();
    config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// On top of [`umoci_image`], a layer GNU tar wrote and `umoci raw
/// add-layer` added (`umoci repack` never writes an opaque directory),
/// with `.wh..wh..opq` in a directory the tar only implies (`usr/lib`,
/// 0750 below: it stays so), in one it declares (`etc`, 0711), after a
/// file of its own in the tar (`opt/app/conf`: the marker hides only
/// what is below, wherever it is in the tar), and in a directory with
/// nothing below (`fresh`, declared: a directory a tar only implies and
/// nothing below has is made at the time of umoci's unpack, foliofs's at
/// the epoch); each with a new file. umoci's unpack is in `U2`.
fn opaque_layer(dir: &Path) {
    common::sh_in(
        dir,
        r#"mkdir -p raw/usr/lib raw/etc raw/opt/app/conf raw/fresh
cd raw
: > usr/lib/.wh..wh..opq && echo only > usr/lib/only
: > etc/.wh..wh..opq && echo 'root:x:0:0::/root:/bin/zsh' > etc/passwd
chmod 0711 etc && touch -d @1400000000 etc
echo new > opt/app/conf/new && : > opt/app/conf/.wh..wh..opq
: > fresh/.wh..wh..opq && echo x > fresh/x && touch -d @1300000000 fresh
tar --format=pax -cf ../opaque.tar usr/lib/.wh..wh..opq usr/lib/only \
    opt/app/conf/new opt/app/conf/.wh..wh..opq \
    --no-recursion etc etc/.wh..wh..opq etc/passwd fresh fresh/.wh..wh..opq fresh/x
cd ..
umoci raw add-layer --image L:t opaque.tar
umoci unpack --image L:t U2 >/dev/null
"#,
    );
}

#[test]
fn opaque_directories_of_a_raw_layer_mount_as_umoci_unpacks_them() {
    require!("root", "fuse", "kernel-erofs", "umoci", "setfattr", "tar");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    opaque_layer(tmp.path());
    let want = comparable(walk_mounted(&tmp.path().join("U2/rootfs")));
    // umoci applied the markers as OCI has them.
    let names = |dir: &str| -> Vec<&Path> {
        want.keys()
            .filter(|p| p.parent() == Some(Path::new(dir)))
            .map(PathBuf::as_path)
            .collect()
    };
    assert_eq!(names("usr/lib"), [Path::new("usr/lib/only")]);
    assert_eq!(names("etc"), [Path::new("etc/passwd")]);
    assert_eq!(names("opt/app/conf"), [Path::new("opt/app/conf/new")]);
    assert_eq!(names("fresh"), [Path::new("fresh/x")]);
    assert_eq!(want[Path::new("usr/lib")].mode & 0o7777, 0o750);
    assert_eq!(want[Path::new("etc")].mode & 0o7777, 0o711);
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let store = tmp.path().join("store");
    let m = mount_image(&reference, &store);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "foliofs's mount of opaque directories, against umoci unpack",
        &want,
        &comparable(got),
    );
    let img = tmp.path().join("merged.erofs");
    let layers = merge_image(&reference, &store, &img);
    assert_eq!(layers.len(), 4);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let kernel = crate::erofs::mkfs::kernel_walk_devices(&img, &devices);
    assert_same(
        "the kernel's mount of the merged image with opaque directories",
        &want,
        &comparable(kernel),
    );
}

#[test]
fn an_image_of_30_layers_mounts_as_umoci_unpacks_it() {
    require!("root", "fuse", "kernel-erofs", "umoci");
    let tmp = tempfile::tempdir().unwrap();
    // Thirty layers, each adding, changing and removing a little: more
    // extra devices than a 4 KiB block holds slots for after the
    // superblock (23), so the device table runs on into the next block.
    common::sh_in(
        tmp.path(),
        r#"umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t B >/dev/null
r=B/rootfs
mkdir -p $r/etc $r/var/log
for i in $(seq 1 30); do
    mkdir -p $r/layer$i/sub
    echo "file of layer $i" > $r/layer$i/sub/f
    echo "$i" > $r/etc/generation
    echo "log $i" >> $r/var/log/messages
    if [ $i -gt 2 ]; then rm -rf $r/layer$((i - 2))/sub; fi
    if [ $((i % 5)) = 0 ]; then chmod 0700 $r/layer$i; fi
    umoci repack --refresh-bundle --image L:t B
done
umoci unpack --image L:t U >/dev/null
"#,
    );
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let store = tmp.path().join("store");
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    let m = mount_image(&reference, &store);
    let got = comparable(walk_mounted(m.path()));
    m.unmount().unwrap();
    assert_same("a 30-layer image, against umoci unpack", &want, &got);
    // And through the kernel, with every layer as a device.
    let img = tmp.path().join("merged.erofs");
    let layers = merge_image(&reference, &store, &img);
    assert_eq!(layers.len(), 30);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let kernel = crate::erofs::mkfs::kernel_walk_devices(&img, &devices);
    assert_same(
        "the kernel's mount of the 30-layer image",
        &want,
        &comparable(kernel),
    );
}

#[test]
fn layers_two_images_share_are_built_and_kept_once() {
    require!("root", "fuse", "umoci", "setfattr");
    let tmp = tempfile::tempdir().unwrap();
    umoci_image(tmp.path());
    // A second image on top of the first: its three layers and one more.
    common::sh_in(
        tmp.path(),
        "umoci config --image L:t --tag t2 >/dev/null
umoci unpack --image L:t2 B2 >/dev/null
echo more > B2/rootfs/etc/extra
umoci repack --refresh-bundle --image L:t2 B2",
    );
    let store = tmp.path().join("store");
    let layer_images = |store: &Path| {
        fs::read_dir(store)
            .unwrap()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("layer-") && n.ends_with(".erofs")
            })
            .count()
    };
    let l = tmp.path().join("L");
    let m = mount_image(&format!("oci:{}:t", l.display()), &store);
    m.unmount().unwrap();
    assert_eq!(layer_images(&store), 3);
    let m = mount_image(&format!("oci:{}:t2", l.display()), &store);
    let extra = fs::read_to_string(m.path().join("etc/extra")).unwrap();
    m.unmount().unwrap();
    assert_eq!(extra, "more\n");
    // One more layer image, and a merged image for each.
    assert_eq!(layer_images(&store), 4);
    let merged = fs::read_dir(&store)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("image-"))
        .count();
    assert_eq!(merged, 2);
}
