//! A Debian root as debootstrap makes it (made once per test process,
//! [`common::debian_root`]), as the first layer of an OCI image that umoci
//! builds, with layers of changes on top as a container makes them
//! (`umoci repack`: removals as `.wh.` files, a file for a directory and
//! a directory for a file, modes, owners, xattrs, hard links, contents),
//! and a last layer written by GNU tar (`umoci raw add-layer`) with
//! opaque directories, which `umoci repack` never writes. Oracles:
//!
//! - `umoci unpack` of the image: foliofs's mount, by root and by a user
//!   from their own store, and the kernel's mount of the merged image
//!   (which `fsck.erofs` 1.9.3 finds clean, where it is built) walk equal
//!   to it;
//! - the kernel's overlayfs over the kernel's mounts of the store's layer
//!   images, stacked as containerd stacks them, walks equal to the merged
//!   image but for what overlayfs reports of its own (link counts, a
//!   merged directory's size) and the directories a layer's tar only
//!   implied (which overlayfs shows as the layer image made them, and
//!   OCI's changesets, umoci and the merge as they were below);
//! - mkfs.erofs 1.9.3's rebuild mode on the same layer images walks equal
//!   to foliofs's merge but for the differences listed at its check.
//!
//! What umoci 0.4.7 records of xattrs, as on disk: `user.*`, `trusted.*`
//! (`trusted.overlay.*` too), `security.*` (`security.capability`) and
//! `system.posix_acl_*`, a removal as the file again without it; but
//! not `security.selinux`, nor `trusted.overlay.opaque` (for which it
//! writes no opaque directory either).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{comparable, merge_image, mount_image, user_listing};
use crate::common;
use crate::erofs::mkfs::kernel_walk_devices;
use crate::erofs::mkfs::merge::{as_overlay_shows, Overlay};
use crate::erofs::walk::{assert_same, walk_mounted, KernelMount, Tree};

/// Makes, in the current directory, the OCI layout `L` with the image
/// `t` of the root `$1` and its changes, and umoci's unpack of it in
/// `U`. Paths every Debian minbase root has (base-files, dpkg, apt,
/// coreutils, login and passwd's setuid programs).
const LAYERS: &str = r#"umoci init --layout L
umoci new --image L:t
umoci unpack --image L:t B >/dev/null
r=B/rootfs
# 1: the root as debootstrap made it (hard links, modes and times kept).
cp -a "$1"/. $r/
umoci repack --refresh-bundle --image L:t B
# 2: a whole directory and many files removed; a directory replaced by
# a file and a file by a directory; modes (setuid taken away), owners
# (a symlink's too); xattrs set (a user's, a trusted one, a file
# capability, an ACL); hard links, one to a file of layer 1; contents
# changed.
rm -rf $r/usr/share/doc
find $r/var/cache/apt -type f -delete
rm $r/var/lib/dpkg/status-old
rm -rf $r/etc/apt/apt.conf.d && echo 'APT::Install-Recommends "0";' > $r/etc/apt/apt.conf.d
rm $r/etc/hostname && mkdir $r/etc/hostname && echo inside > $r/etc/hostname/name
chmod u-s $r/usr/bin/su $r/usr/bin/chsh
chmod 0700 $r/var/log
chown 1000:1000 $r/home $r/etc/motd
chown -h 100000:70000 $r/usr/bin/sh
setfattr -n user.origin -v layer2 $r/usr/lib/os-release
setfattr -n user.gone -v soon $r/etc/issue
setfattr -n trusted.note -v 'set by root' $r/usr/bin/dpkg
setfattr -n security.capability -v 0sAQAAAgAgAAAAAAAAAAAAAAAAAAA= $r/usr/bin/env
setfattr -n system.posix_acl_access \
    -v 0sAgAAAAEABgD/////AgAEAOgDAAAEAAQA/////xAABAD/////IAAEAP////8= $r/etc/issue.net
ln $r/usr/bin/dpkg $r/usr/local/bin/dpkg-hard
echo 'a new file' > $r/usr/local/bin/tool && ln $r/usr/local/bin/tool $r/usr/local/bin/tool-hard
echo 'welcome to layer 2' > $r/etc/motd
printf '\n# appended by layer 2\n' >> $r/var/lib/dpkg/status
umoci repack --refresh-bundle --image L:t B
# 3: changes on the changes: xattrs changed and removed, a mode and an
# owner put back, setuid given, directories removed whole, the
# directory that was a file a file again, a directory made a symlink,
# one name of a hard-linked pair removed, a new hard link to a lower
# file, a new file, a file emptied, an old mtime.
setfattr -n user.origin -v layer3 $r/usr/lib/os-release
setfattr -x user.gone $r/etc/issue
setfattr -x trusted.note $r/usr/bin/dpkg
setfattr -n security.capability -v 0sAQAAAgAQAAAAAAAAAAAAAAAAAAA= $r/usr/bin/env
chmod 4750 $r/usr/bin/chsh
chown 0:0 $r/home && chmod 0750 $r/home
rm -rf $r/usr/share/man $r/var/cache/debconf
rm -r $r/etc/hostname && echo back-to-a-file > $r/etc/hostname
rm -rf $r/usr/games && ln -s local/bin $r/usr/games
rm $r/usr/local/bin/tool
ln $r/etc/passwd $r/etc/passwd.hard
head -c 100000 /dev/urandom > $r/usr/lib/big-new
: > $r/var/log/dpkg.log
touch -d @1500000000 $r/etc/motd
umoci repack --refresh-bundle --image L:t B
# 4, by GNU tar: an opaque directory the tar only implies (it keeps the
# attributes below) and one it declares (0750, an old mtime), each with
# a new file. The marker first, as overlayfs's tools write it.
mkdir -p raw/etc/default raw/etc/skel
: > raw/etc/default/.wh..wh..opq && echo only > raw/etc/default/only
: > raw/etc/skel/.wh..wh..opq && echo fresh > raw/etc/skel/.profile
chmod 0750 raw/etc/skel
touch -d @1600000000 raw/etc/skel raw/etc/skel/.profile raw/etc/default/only
tar --format=pax -C raw -cf opaque.tar etc/default/.wh..wh..opq etc/default/only \
    --no-recursion etc/skel etc/skel/.wh..wh..opq etc/skel/.profile
umoci raw add-layer --image L:t opaque.tar
umoci unpack --image L:t U >/dev/null
"#;

/// Runs [`LAYERS`] in `dir` on a copy of the Debian root `root`.
fn debian_image(dir: &Path, root: &Path) {
    let out = common::run_timeout(
        Command::new("sh")
            .args(["-ec", LAYERS, "sh"])
            .arg(root)
            .current_dir(dir),
        Duration::from_secs(900),
    );
    assert!(
        out.status.success(),
        "the layers: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The layer blobs of the image `t` in the layout `l`, lowest first,
/// with their diff_ids.
fn layer_blobs(l: &Path) -> Vec<(PathBuf, String)> {
    let json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&fs::read(&p).unwrap()).unwrap()
    };
    let blob = |digest: &serde_json::Value| {
        l.join("blobs/sha256")
            .join(&digest.as_str().unwrap()["sha256:".len()..])
    };
    let index = json(l.join("index.json"));
    let manifest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "t")
        .expect("the image t");
    let manifest = json(blob(&manifest["digest"]));
    let config = json(blob(&manifest["config"]["digest"]));
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), diff_ids.len());
    layers
        .iter()
        .zip(diff_ids)
        .map(|(l, d)| (blob(&l["digest"]), d.as_str().unwrap().to_owned()))
        .collect()
}

/// What a layer's tar lists, as GNU tar reads it: the paths its entries
/// declare, and the directories it only implies (parents no entry
/// declares; the root is the empty path).
struct TarPaths {
    declared: BTreeSet<PathBuf>,
    implied: BTreeSet<PathBuf>,
}

fn tar_paths(blob: &Path) -> TarPaths {
    let out = common::run_timeout(
        Command::new("tar")
            .args(["--quoting-style=literal", "-tf"])
            .arg(blob),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "tar -tf {}: {}",
        blob.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let declared: BTreeSet<PathBuf> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|n| {
            let n = n.trim_end_matches('/');
            let n = n.strip_prefix("./").unwrap_or(n);
            PathBuf::from(if n == "." { "" } else { n })
        })
        .collect();
    let implied = declared
        .iter()
        .flat_map(|p| p.ancestors().skip(1))
        .filter(|a| !declared.contains(*a))
        .map(Path::to_path_buf)
        .collect();
    TarPaths { declared, implied }
}

/// The directories overlayfs shows as a layer's tar implied them: those
/// whose topmost layer (of `layers`, lowest first) only implies them.
fn implied_on_top(layers: &[TarPaths]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut above = BTreeSet::new();
    for l in layers.iter().rev() {
        out.extend(l.implied.difference(&above).cloned());
        above.extend(l.declared.iter().cloned());
        above.extend(l.implied.iter().cloned());
    }
    out
}

/// The implied directories the store recorded beside the layer image of
/// `diff_id` (each path NUL-terminated).
fn store_implied(store: &Path, diff_id: &str) -> BTreeSet<PathBuf> {
    let hex = &diff_id["sha256:".len()..];
    let v = fs::read(store.join(format!("layer-{hex}.implied"))).unwrap();
    v.split_inclusive(|&b| b == 0)
        .map(|e| {
            let e = e.strip_suffix(&[0]).unwrap_or(e);
            PathBuf::from(String::from_utf8(e.to_vec()).unwrap())
        })
        .collect()
}

/// `t` without the paths in `out`.
fn without(t: Tree, out: &BTreeSet<PathBuf>) -> Tree {
    t.into_iter().filter(|(p, _)| !out.contains(p)).collect()
}

#[test]
fn a_debootstrap_root_in_layers_mounts_and_merges_as_umoci_overlayfs_and_mkfs_erofs_show_it() {
    require!(
        "root",
        "fuse",
        "kernel-erofs",
        "umoci",
        "setfattr",
        "tar",
        "debootstrap"
    );
    let Some(debian) = debian_root!() else {
        return;
    };
    // fsck.erofs 1.9.3 checks every image kernel_walk_devices walks, and
    // its mkfs.erofs is the last oracle: without it, one skip line here.
    let utils = erofs_utils_193!();
    let tmp = tempfile::tempdir().unwrap();
    debian_image(tmp.path(), debian);
    let l = tmp.path().join("L");
    let reference = format!("oci:{}:t", l.display());
    let store = tmp.path().join("store");
    let want = comparable(walk_mounted(&tmp.path().join("U/rootfs")));
    // What the layers did is in umoci's unpack.
    let at = |p: &str| &want[Path::new(p)];
    assert!(!want.contains_key(Path::new("usr/share/doc")));
    assert_eq!(at("etc/apt/apt.conf.d").kind, "reg");
    assert_eq!(at("etc/hostname").kind, "reg");
    assert_eq!(at("usr/games").kind, "lnk");
    assert_eq!(at("usr/bin/su").mode & 0o7777, 0o755);
    assert_eq!(at("usr/bin/chsh").mode & 0o7777, 0o4750);
    assert_eq!(at("usr/local/bin/dpkg-hard").nlink, 2);
    assert_eq!(at("usr/local/bin/tool-hard").nlink, 1);
    assert_eq!(at("etc/passwd.hard").nlink, 2);
    assert!(at("usr/bin/env")
        .xattrs
        .contains_key(&b"security.capability"[..]));
    assert!(at("etc/issue.net")
        .xattrs
        .contains_key(&b"system.posix_acl_access"[..]));
    assert!(at("etc/issue").xattrs.is_empty() && at("usr/bin/dpkg").xattrs.is_empty());
    let names = |dir: &str| -> Vec<PathBuf> {
        want.keys()
            .filter(|p| p.parent() == Some(Path::new(dir)))
            .cloned()
            .collect()
    };
    assert_eq!(names("etc/default"), [PathBuf::from("etc/default/only")]);
    assert_eq!(names("etc/skel"), [PathBuf::from("etc/skel/.profile")]);
    assert_eq!(at("etc/skel").mode & 0o7777, 0o750);

    // foliofs's mount, as root.
    let m = mount_image(&reference, &store);
    let got = walk_mounted(m.path());
    m.unmount().unwrap();
    assert_same(
        "foliofs's mount of the layered debootstrap root, against umoci unpack",
        &want,
        &comparable(got),
    );
    // The merged image through the kernel, with the store's layers (and
    // checked by foliofs's library, `foliofs fsck` and, where built,
    // fsck.erofs 1.9.3 on the way).
    let img = tmp.path().join("merged.erofs");
    let layers = merge_image(&reference, &store, &img);
    assert_eq!(layers.len(), 4);
    let devices: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let merged = kernel_walk_devices(&img, &devices);
    assert_same(
        "the kernel's mount of the merged debootstrap image, against umoci unpack",
        &want,
        &comparable(merged.clone()),
    );

    // The kernel's overlayfs over the same layer images. Where a layer's
    // tar only implied a directory, overlayfs shows the layer image's
    // directory; umoci and the merge keep the one below (checked above).
    let tars: Vec<TarPaths> = layer_blobs(&l)
        .iter()
        .map(|(blob, diff_id)| {
            let t = tar_paths(blob);
            assert_eq!(
                store_implied(&store, diff_id),
                t.implied,
                "the implied directories the store recorded for {diff_id}"
            );
            t
        })
        .collect();
    let implied = implied_on_top(&tars);
    // The raw layer's tar lists neither the root nor etc/default.
    assert!(implied.contains(Path::new("")) && implied.contains(Path::new("etc/default")));
    let stacked = {
        let mounts: Vec<KernelMount> = layers.iter().map(|l| KernelMount::new(l, "")).collect();
        let top_first: Vec<&Path> = mounts.iter().rev().map(KernelMount::path).collect();
        let ovl = Overlay::new(&top_first);
        walk_mounted(ovl.path())
    };
    let stacked_dirs: Tree = implied
        .iter()
        .map(|p| (p.clone(), stacked[p].clone()))
        .collect();
    let d = &stacked[Path::new("etc/default")];
    assert_eq!(
        (d.mode & 0o7777, d.uid, d.gid, d.mtime),
        (0o755, 0, 0, (0, 0)),
        "an implied directory as the layer image has it"
    );
    for p in &implied {
        assert_eq!(
            (stacked[p].kind, merged[p].kind),
            ("dir", "dir"),
            "{}",
            p.display()
        );
    }
    assert_same(
        "the merged debootstrap image, against the kernel's overlay of its layers \
         (but the directories implied on top)",
        &without(as_overlay_shows(stacked), &implied),
        &without(as_overlay_shows(merged.clone()), &implied),
    );

    // mkfs.erofs 1.9.3's rebuild mode on the same layer images.
    let Some(utils) = utils else {
        return;
    };
    let theirs = tmp.path().join("theirs.erofs");
    let started = std::time::SystemTime::now();
    let out = common::run_timeout(
        Command::new(utils.join("mkfs.erofs"))
            .args(["--aufs", "--ovlfs-strip=1", "--quiet"])
            .arg(&theirs)
            .args(&layers),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "mkfs.erofs 1.9.3 --aufs --ovlfs-strip=1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = (started, std::time::SystemTime::now());
    let rebuilt = comparable(kernel_walk_devices(&theirs, &devices));
    let ours = comparable(merged);
    // It cannot know that a layer's tar only implied a directory (a layer
    // image cannot say so): on the directories implied on top it shows
    // the top layer image's, as overlayfs does (0755 root:root at the
    // epoch), where OCI, umoci and foliofs keep the one below; and the
    // root, which the top layer's tar did not list, it makes 0777 with
    // the time of the build. All else, every field of every path, is
    // foliofs's: hard links and link counts too. (It drops mtimes'
    // nanoseconds, which does not show here: umoci's tars have whole
    // seconds.)
    assert_same(
        "foliofs's merge, against mkfs.erofs 1.9.3's rebuild mode \
         (but the directories implied on top)",
        &without(rebuilt.clone(), &implied),
        &without(ours, &implied),
    );
    let attrs =
        |n: &crate::erofs::walk::Node| (n.kind, n.mode, n.uid, n.gid, n.mtime, n.xattrs.clone());
    for p in implied.iter().filter(|p| !p.as_os_str().is_empty()) {
        assert_eq!(
            attrs(&rebuilt[p]),
            attrs(&stacked_dirs[p]),
            "{}: mkfs.erofs 1.9.3's rebuild mode, against overlayfs",
            p.display()
        );
    }
    let root = &rebuilt[Path::new("")];
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    };
    assert_eq!((root.mode & 0o7777, root.uid, root.gid), (0o777, 0, 0));
    assert!(
        (secs(built.0)..=secs(built.1)).contains(&root.mtime.0),
        "the root's mtime {:?}, the build {built:?}",
        root.mtime
    );
}

#[test]
fn a_user_mounts_the_layered_debootstrap_root_as_umoci_unpacks_it() {
    require!(
        "root",
        "user-fuse",
        "umoci",
        "setfattr",
        "tar",
        "debootstrap"
    );
    let Some(debian) = debian_root!() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    debian_image(tmp.path(), debian);
    common::open_to_all(tmp.path());
    // The layout for the user to read, and umoci's bundle (0700) for the
    // user to enter; its rootfs stays as unpacked.
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
    // The user lists their mount and umoci's unpack alike (what they may
    // not read or enter, alike on both sides).
    let got = user_listing(m.path());
    m.unmount().unwrap();
    let want = user_listing(&tmp.path().join("U/rootfs"));
    assert!(want.contains("usr/lib/os-release f 644"), "{want}");
    assert_eq!(
        got, want,
        "a user's mount of the layered debootstrap root, against umoci unpack"
    );
}
