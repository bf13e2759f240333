//! Containers: runc started on a mounted image, by root, and rootless by
//! a user on their own mount, runs a shell from the image.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{mount_image, STORE_ENV};
use crate::common;

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
