//! Container images: OCI image layouts that umoci builds, layer by layer
//! from a container's changes, mounted as `oci:DIR:TAG` (each layer built
//! into the store, the layers merged) and compared with `umoci unpack` of
//! the same image, which applies OCI's changeset rules in userspace: every
//! path, every stat field, xattr and byte. One module per concern:
//!
//! - [`umoci`]: small images made for the changes they record, a 30-layer
//!   one, and the store's checks (a blob whose digest is wrong is refused
//!   by name and leaves nothing in the store; a layer two images share is
//!   built once);
//! - [`runc`]: a container started by runc on such a mount, by root and
//!   rootless by a user on their own mount, runs a shell from the image;
//! - [`catalog`]: the store's images listed (`foliofs images`) and
//!   removed (`foliofs rmi`, `--prune`), as root and as a user, a
//!   damaged record named and skipped;
//! - [`debian`]: a debootstrap root as the first layer of an image, with
//!   layers of changes on top, against umoci, the kernel's overlayfs over
//!   the layers and mkfs.erofs 1.9.3's rebuild mode.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common;
use crate::erofs::walk::Tree;

mod catalog;
mod debian;
mod runc;
pub(crate) mod umoci;

/// What the two sides cannot agree on: inode numbers, and a directory's
/// size (each file system's own).
pub(crate) fn comparable(mut t: Tree) -> Tree {
    for n in t.values_mut() {
        n.ino = 0;
        if n.kind == "dir" {
            n.size = 0;
        }
    }
    t
}

/// The store's environment variable.
pub(crate) const STORE_ENV: &str = "FOLIOFS_STORE";

/// `foliofs mount REFERENCE` with the store at `store`.
pub(super) fn mount_image(reference: &str, store: &Path) -> common::Mount {
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
pub(super) fn merge_image(reference: &str, store: &Path, img: &Path) -> Vec<PathBuf> {
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
pub(super) fn store_layers(store: &Path, img: &Path) -> Vec<PathBuf> {
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

/// Every path's type, mode, owner, link count, size (but a directory's),
/// mtime, symlink target, user xattrs and readable data, as the test user
/// reads them.
pub(crate) fn user_listing(dir: &Path) -> String {
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
