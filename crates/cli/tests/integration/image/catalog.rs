//! The store's images listed and removed: two umoci images that share a
//! base layer, each with a layer of its own, mounted from one layout into
//! a store; `foliofs images` against the layout's own index, manifests
//! and configs (ids, layer counts) and the store's files (sizes); `rmi`
//! of one under a live mount of it; a damaged record, an unknown name;
//! and a prune that waits for a build's lock, then leaves nothing but
//! the lock file. As root with
//! `$FOLIOFS_STORE`, and as the test user with their own default store.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use crate::common;

/// An OCI layout `L` in `dir`: `base` (one layer), and `a` and `b` on
/// top of it, each with a layer of its own.
fn two_images(dir: &Path) {
    common::sh_in(
        dir,
        r#"umoci init --layout L
umoci new --image L:base
umoci unpack --image L:base B >/dev/null
mkdir -p B/rootfs/etc && echo shared > B/rootfs/etc/base
umoci repack --image L:base B && rm -rf B
for t in a b; do
  umoci config --image L:base --tag $t >/dev/null
  umoci unpack --image L:$t B >/dev/null
  echo "only $t" > B/rootfs/etc/$t
  head -c 30000 /dev/urandom > B/rootfs/etc/$t.bin
  umoci repack --image L:$t B && rm -rf B
done
umoci unpack --image L:a Ua >/dev/null
chmod -R a+rX L
"#,
    );
}

/// What the layout says of tag `t`: its manifest digest and diff_ids.
fn truth(l: &Path, t: &str) -> (String, Vec<String>) {
    let json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
    };
    let blob = |d: &str| l.join("blobs/sha256").join(&d[7..]);
    let index = json(l.join("index.json"));
    let m = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == t)
        .unwrap();
    let digest = m["digest"].as_str().unwrap().to_owned();
    let manifest = json(blob(&digest));
    let config = json(blob(manifest["config"]["digest"].as_str().unwrap()));
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    (digest, diff_ids)
}

/// The merged image's file of `diff_ids`, as the README names it: the
/// digest of the chain of diff_ids.
fn merged_file(diff_ids: &[String]) -> String {
    let chain: String = diff_ids.iter().map(|d| format!("{d}\n")).collect();
    let hex: String = Sha256::digest(chain.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("image-{hex}.erofs")
}

/// Who runs foliofs, and with which store.
struct Who {
    user: Option<&'static str>,
    /// For the user: their XDG_CACHE_HOME (the store is in it).
    cache: Option<tempfile::TempDir>,
    store: PathBuf,
}

impl Who {
    fn root(tmp: &Path) -> Who {
        Who {
            user: None,
            cache: None,
            store: tmp.join("store"),
        }
    }

    fn user() -> Who {
        let cache = common::user_tempdir(common::TEST_USER);
        let store = cache.path().join("foliofs/store");
        Who {
            user: Some(common::TEST_USER),
            cache: Some(cache),
            store,
        }
    }

    fn command(&self) -> Command {
        match (&self.user, &self.cache) {
            (Some(u), Some(c)) => {
                let mut cmd = common::user_command(u, "env");
                cmd.arg(format!("XDG_CACHE_HOME={}", c.path().display()))
                    .arg(common::bin());
                cmd
            }
            _ => {
                let mut cmd = Command::new(common::bin());
                cmd.env(super::STORE_ENV, &self.store);
                cmd
            }
        }
    }

    fn foliofs(&self, args: &[&str]) -> Output {
        common::run_timeout(self.command().args(args), Duration::from_secs(120))
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.foliofs(args);
        assert!(
            out.status.success(),
            "foliofs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn mount(&self, reference: &str) -> common::Mount {
        let mnt = match self.user {
            Some(u) => common::user_tempdir(u),
            None => tempfile::tempdir().unwrap(),
        };
        let mut cmd = self.command();
        cmd.arg("mount").arg(reference).arg(mnt.path());
        common::Mount::by_command(self.user, &mut cmd, mnt.path())
            .unwrap()
            .keeping(mnt)
    }

    /// `sh -c SCRIPT sh STORE` as whoever this is.
    fn sh(&self, script: &str) {
        let out = match self.user {
            Some(u) => common::sh_as_user(u, script, &[&self.store]),
            None => common::run_timeout(
                Command::new("sh")
                    .args(["-c", script, "sh"])
                    .arg(&self.store),
                Duration::from_secs(60),
            ),
        };
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The file at `path`, as whoever this is reads it (a user's mount is
    /// theirs alone).
    fn read(&self, path: &Path) -> Vec<u8> {
        let out = match self.user {
            Some(u) => common::sh_as_user(u, r#"cat "$1""#, &[path]),
            None => common::run_timeout(Command::new("cat").arg(path), Duration::from_secs(60)),
        };
        assert!(
            out.status.success(),
            "cat {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// The store's files with their sizes and mtimes.
    fn files(&self) -> BTreeMap<String, (u64, std::time::SystemTime)> {
        fs::read_dir(&self.store)
            .unwrap()
            .flatten()
            .map(|e| {
                let m = e.metadata().unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    (m.len(), m.modified().unwrap()),
                )
            })
            .collect()
    }

    fn has(&self, f: &str) -> bool {
        self.store.join(f).exists()
    }

    fn size(&self, files: &[String]) -> u64 {
        files
            .iter()
            .map(|f| fs::metadata(self.store.join(f)).map_or(0, |m| m.len()))
            .sum()
    }
}

/// A child process, killed if the test ends before it does.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn layer(d: &str) -> String {
    format!("layer-{}.erofs", &d[7..])
}

fn implied(d: &str) -> String {
    format!("layer-{}.implied", &d[7..])
}

/// The store's files an image keeps.
fn kept(diff_ids: &[String]) -> Vec<String> {
    let mut v = vec![merged_file(diff_ids)];
    for d in diff_ids {
        v.push(layer(d));
        v.push(implied(d));
    }
    v
}

fn scenario(who: &Who, tmp: &Path) {
    let l = tmp.join("L");
    let name = |t: &str| format!("oci:{}:{t}", l.display());
    let (id_a, diffs_a) = truth(&l, "a");
    let (id_b, diffs_b) = truth(&l, "b");
    assert_eq!(diffs_a.len(), 2);
    assert_eq!(diffs_a[0], diffs_b[0], "a and b share their base");
    assert_ne!(diffs_a[1], diffs_b[1]);

    for t in ["a", "b"] {
        let m = who.mount(&name(t));
        assert_eq!(
            who.read(&m.path().join(format!("etc/{t}"))),
            format!("only {t}\n").as_bytes()
        );
        m.unmount().unwrap();
    }

    // The list, against the layout and the store's files.
    let listing: serde_json::Value = serde_json::from_str(&who.ok(&["images", "--json"])).unwrap();
    let images = listing["images"].as_array().unwrap();
    assert_eq!(images.len(), 2, "{listing}");
    for (img, t, id, diffs) in [
        (&images[0], "a", &id_a, &diffs_a),
        (&images[1], "b", &id_b, &diffs_b),
    ] {
        assert_eq!(img["name"], name(t).as_str());
        assert_eq!(img["id"], id.as_str());
        assert_eq!(img["layers"], diffs.len());
        assert_eq!(img["image"], merged_file(diffs).as_str());
        assert_eq!(img["size"], who.size(&kept(diffs)));
    }
    let mut all = kept(&diffs_a);
    all.extend(kept(&diffs_b));
    all.sort();
    all.dedup();
    assert_eq!(listing["total_size"], who.size(&all));
    assert!(listing["damaged"].as_array().unwrap().is_empty());
    // The table: a row per image with its short id and layer count.
    let table = who.ok(&["images"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for (row, t, id) in [(lines[1], "a", &id_a), (lines[2], "b", &id_b)] {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[..3], [name(t).as_str(), &id[7..19], "2"], "{row}");
    }
    assert!(lines[3].starts_with("2 images, "), "{table}");

    // A name the store does not know: one line naming it, nothing changed.
    let before = who.files();
    for bad in ["oci:/nowhere:x", "nosuch", "ffffffff"] {
        let out = who.foliofs(&["rmi", &name("a"), bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rmi {bad} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(bad), "{err}");
    }
    assert_eq!(who.files(), before, "a failed rmi changed the store");

    // rmi of a, under a live mount of it: its merged image and own layer
    // go, the shared layer and b stay; the mount reads on.
    let m = who.mount(&name("a"));
    let removed = who.ok(&["rmi", &name("a")]);
    assert!(removed.contains(&merged_file(&diffs_a)), "{removed}");
    assert!(!who.has(&merged_file(&diffs_a)));
    assert!(!who.has(&layer(&diffs_a[1])) && !who.has(&implied(&diffs_a[1])));
    for f in kept(&diffs_b) {
        assert!(who.has(&f), "{f} went with a");
    }
    for f in ["etc/a.bin", "etc/a", "etc/base"] {
        assert_eq!(
            who.read(&m.path().join(f)),
            fs::read(tmp.join("Ua/rootfs").join(f)).unwrap(),
            "{f} after rmi, against umoci unpack"
        );
    }
    m.unmount().unwrap();
    let listing: serde_json::Value = serde_json::from_str(&who.ok(&["images", "--json"])).unwrap();
    assert_eq!(listing["images"].as_array().unwrap().len(), 1);
    assert_eq!(listing["images"][0]["id"], id_b.as_str());

    // A damaged record and a huge one: named, skipped, never followed.
    let junk = format!("ref-{}.json", "0".repeat(64));
    let huge = format!("ref-{}.json", "1".repeat(64));
    who.sh(&format!(
        r#"printf '{{"version":1,"name":"x","image":"../../etc"' > "$1/{junk}"
head -c 1000000 /dev/zero > "$1/{huge}"
: > "$1/.layer.left" && touch -d '1 hour ago' "$1/.layer.left"
: > "$1/.layer.building""#
    ));
    let out = who.foliofs(&["images"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&junk) && err.contains(&huge), "{err}");
    assert_eq!(err.trim().lines().count(), 2, "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&name("b")));

    // b removed by its short id, then a prune: the damaged records by
    // their files; a temporary file left an hour ago goes, one a build
    // may be writing stays.
    who.ok(&["rmi", &id_b[7..19], &junk, &huge]);
    // A build in another process holds the lock shared (flock(1) here):
    // the prune waits for it, saying so.
    let lock = who.store.join(".lock");
    let mut flock = match who.user {
        Some(u) => common::user_command(u, "flock"),
        None => Command::new("flock"),
    };
    let holder = Killed(
        flock
            .arg("-s")
            .arg(&lock)
            .args(["sleep", "2"])
            .spawn()
            .unwrap(),
    );
    let held = || {
        !Command::new("flock")
            .args(["-n", "-x"])
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    assert!(common::wait_until(Duration::from_secs(10), held));
    let start = std::time::Instant::now();
    let out = who.foliofs(&["rmi", "--prune"]);
    assert!(out.status.success());
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "the prune did not wait for the lock"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("waiting for the store's lock"), "{err}");
    drop(holder);
    let left: Vec<String> = who.files().into_keys().collect();
    assert_eq!(left, [".layer.building", ".lock"]);
    who.sh(r#"rm "$1/.layer.building""#);
    assert_eq!(who.ok(&["images", "--json"]).matches("\"name\"").count(), 0);
}

#[test]
fn images_in_the_store_are_listed_and_removed() {
    require!("root", "fuse", "umoci", "flock");
    let tmp = tempfile::tempdir().unwrap();
    two_images(tmp.path());
    scenario(&Who::root(tmp.path()), tmp.path());
}

#[test]
fn a_user_lists_and_removes_images_in_their_own_store() {
    require!("root", "user-fuse", "umoci", "flock");
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    two_images(tmp.path());
    scenario(&Who::user(), tmp.path());
}
