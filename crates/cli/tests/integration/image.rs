//! Container images: OCI image layouts that umoci builds, layer by layer
//! from a container's changes, mounted as `oci:DIR:TAG` (each layer built
//! into the store, the layers merged) and compared with `umoci unpack` of
//! the same image, which applies OCI's changeset rules in userspace: every
//! path, every stat field, xattr and byte. A container started by runc on
//! such a mount, by root and rootless by a user on their own mount, runs
//! a shell from the image. Also the store's checks: a blob whose digest is
//! wrong is refused by name and leaves nothing in the store.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::erofs::walk::{assert_same, walk_mounted, Tree};

/// An OCI layout `L` in `dir` with the image `t`: a base and three layers
/// of changes, made in a bundle as a container would make them and
/// recorded by `umoci repack` (a layer per repack).
fn umoci_image(dir: &Path) {
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

/// What the two sides cannot agree on: inode numbers, and a directory's
/// size (each file system's own).
fn comparable(mut t: Tree) -> Tree {
    for n in t.values_mut() {
        n.ino = 0;
        if n.kind == "dir" {
            n.size = 0;
        }
    }
    t
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

/// The store's environment variable.
const STORE_ENV: &str = "FOLIOFS_STORE";

/// `foliofs mount REFERENCE` with the store at `store`.
fn mount_image(reference: &str, store: &Path) -> common::Mount {
    let mnt = tempfile::Builder::new()
        .prefix("foliofs-mnt.")
        .tempdir()
        .unwrap();
    let mut cmd = Command::new(common::bin());
    cmd.env(STORE_ENV, store)
        .arg("mount")
        .arg(reference)
        .arg(mnt.path());
    common::Mount::by_command(None, &mut cmd, mnt.path())
        .unwrap()
        .keeping(mnt)
}

/// `mkfs erofs --merge REFERENCE IMG` with the store at `store`; the
/// layer images it points into, in order.
fn merge_image(reference: &str, store: &Path, img: &Path) -> Vec<PathBuf> {
    let out = common::run_timeout(
        Command::new(common::bin())
            .env(STORE_ENV, store)
            .args(["mkfs", "erofs", "-q", "--merge"])
            .arg(reference)
            .arg(img),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    store_layers(store, img)
}

/// The layer images `img`'s device table names, found in `store` by UUID.
fn store_layers(store: &Path, img: &Path) -> Vec<PathBuf> {
    let (_, slots) = foliofs_erofs::Erofs::device_table(img, &Default::default()).unwrap();
    let mut by_uuid = std::collections::HashMap::new();
    for e in fs::read_dir(store).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "erofs") {
            if let Ok(fs) = foliofs_erofs::Erofs::open(&p, &Default::default(), &[]) {
                by_uuid.insert(fs.superblock().uuid_hex(), p);
            }
        }
    }
    slots
        .iter()
        .map(|s| by_uuid[&String::from_utf8_lossy(&s.tag).into_owned()].clone())
        .collect()
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

/// Every path's type, mode, owner, link count, size (but a directory's),
/// mtime, symlink target, user xattrs and readable data, as the test user
/// reads them.
fn user_listing(dir: &Path) -> String {
    const SCRIPT: &str = r#"cd "$1" || exit 1
export LC_ALL=C
find . ! -type d -printf '%P %y %m %U:%G %n %s %T@ %l\n' 2>&1 | sort
find . -type d -printf '%P %y %m %U:%G %n %T@\n' 2>&1 | sort
find . -type f -readable -print0 2>/dev/null | sort -z | xargs -0r sha256sum
find . -print0 2>/dev/null | sort -z | xargs -0 getfattr -h -d -m '^user\.' 2>&1
exit 0"#;
    let out = common::sh_as_user(common::TEST_USER, SCRIPT, &[dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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

/// An OCI layout `L` in `dir` with the image `t`: busybox as `/bin/sh`
/// and a few commands, the mount points a runtime needs, and `/etc/motd`
/// written by one layer and added to by the next.
fn busybox_image(dir: &Path) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("busybox");
    common::sh_in(
        dir,
        &format!(
            r#"umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t B >/dev/null
r=B/rootfs
mkdir -p $r/bin $r/etc $r/proc $r/dev $r/sys $r/tmp
cp {busybox} $r/bin/busybox
for a in sh echo cat ls id; do ln -s busybox $r/bin/$a; done
echo "hello from the base layer" > $r/etc/motd
umoci repack --refresh-bundle --image L:t B
echo "and from the top one" >> $r/etc/motd
umoci repack --refresh-bundle --image L:t B
chmod -R a+rX L
"#
        ),
    );
}

/// A runc bundle in `dir` whose root is `root`, read-only, running
/// `script` with `/bin/sh`; `rootless` for an ordinary user's runc.
fn runc_bundle(dir: &Path, root: &Path, script: &str, rootless: bool) -> String {
    let mut spec = Command::new("runc");
    spec.arg("spec").current_dir(dir);
    if rootless {
        spec.arg("--rootless");
    }
    let out = common::run_timeout(&mut spec, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    c["root"] = serde_json::json!({"path": root, "readonly": true});
    c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    c["process"]["terminal"] = serde_json::json!(false);
    if rootless {
        // `runc spec --rootless` maps the container's root to whoever ran
        // it (root, here): map it to the test user, who runs the container.
        let (uid, gid) = common::user_ids(common::TEST_USER).unwrap();
        c["linux"]["uidMappings"][0]["hostID"] = serde_json::json!(uid);
        c["linux"]["gidMappings"][0]["hostID"] = serde_json::json!(gid);
    }
    fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
    dir.display().to_string()
}

const IN_CONTAINER: &str = "cat /etc/motd; ls /bin; id -u";
const EXPECTED: &str = "hello from the base layer\nand from the top one\n\
                        busybox\ncat\necho\nid\nls\nsh\n0\n";

#[test]
fn runc_starts_a_container_on_a_mounted_image() {
    require!("root", "fuse", "umoci", "runc", "busybox");
    let tmp = tempfile::tempdir().unwrap();
    busybox_image(tmp.path());
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let m = mount_image(&reference, &tmp.path().join("store"));
    let bundle = tmp.path().join("bundle");
    fs::create_dir(&bundle).unwrap();
    runc_bundle(&bundle, m.path(), IN_CONTAINER, false);
    let id = format!("foliofs-test-{}", std::process::id());
    let out = common::run_timeout(
        Command::new("runc")
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id),
        Duration::from_secs(120),
    );
    let _ = common::run_timeout(
        Command::new("runc").args(["delete", "-f", &id]),
        Duration::from_secs(30),
    );
    m.unmount().unwrap();
    assert!(
        out.status.success(),
        "runc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), EXPECTED);
}

#[test]
fn rootless_runc_starts_a_container_on_a_users_mount() {
    require!("root", "user-fuse", "umoci", "runc", "busybox");
    let tmp = tempfile::tempdir().unwrap();
    busybox_image(tmp.path());
    common::open_to_all(tmp.path());
    let home = common::user_tempdir(common::TEST_USER);
    let (store, state, bundle, mnt) = (
        home.path().join("store"),
        home.path().join("runc"),
        home.path().join("bundle"),
        home.path().join("mnt"),
    );
    for d in [&bundle, &mnt, &state] {
        fs::create_dir(d).unwrap();
    }
    common::sh_in(
        home.path(),
        &format!("chown {u}:{u} bundle mnt runc", u = common::TEST_USER),
    );
    let reference = format!("oci:{}:t", tmp.path().join("L").display());
    let mut cmd = common::user_command(common::TEST_USER, "env");
    cmd.arg(format!("{STORE_ENV}={}", store.display()))
        .arg(common::bin())
        .arg("mount")
        .arg(&reference)
        .arg(&mnt);
    let m = common::Mount::by_command(Some(common::TEST_USER), &mut cmd, &mnt).unwrap();
    runc_bundle(&bundle, &mnt, IN_CONTAINER, true);
    common::sh_in(
        home.path(),
        &format!("chown -R {u}:{u} bundle runc", u = common::TEST_USER),
    );
    let id = format!("foliofs-user-test-{}", std::process::id());
    // runc hands the container its standard streams and, rootless, can
    // only do that with the user's own: pipes the user's shell makes.
    let script = r#": | runc --root "$1" run --bundle "$2" "$3" 2>"$1/err" | cat
rc=$?
runc --root "$1" delete -f "$3" >/dev/null 2>&1
cat "$1/err" >&2
exit $rc"#;
    let out = common::sh_as_user(
        common::TEST_USER,
        script,
        &[state.as_os_str(), bundle.as_os_str(), id.as_ref()],
    );
    m.unmount().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "rootless runc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Root in the container's user namespace, the user outside it.
    assert_eq!(String::from_utf8_lossy(&out.stdout), EXPECTED);
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
