//! EROFS: mkfs.erofs images against the kernel's EROFS driver, damaged
//! images, concurrent reads through a mount, and the layouts only
//! erofs-utils 1.9.3 writes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common;

/// The bin directory of erofs-utils 1.9.3 (`mkfs.erofs`, `fsck.erofs`,
/// `dump.erofs`), or `None` after one `skip:` line naming the calling test.
/// Debian's 1.5 writes LZ4 only, without fragments, dedupe or compressed
/// directories; 1.9.3 writes every layout the kernel reads.
macro_rules! erofs_utils_193 {
    () => {{
        fn here() {}
        $crate::erofs::erofs_utils_193($crate::common::fn_path(std::any::type_name_of_val(&here)))
    }};
}

mod conformance;
mod corpus;
mod corrupt;
mod layouts;
pub(crate) mod mkfs;
pub mod mount;
pub mod walk;

/// [`erofs_utils_193!`] for a caller that names itself: the bin directory,
/// or `None` after `skip: WHAT: needs erofs-utils 1.9.3 ...` on stderr
/// (past the harness's capture, as `common::have` writes).
pub fn erofs_utils_193(what: &str) -> Option<PathBuf> {
    let bin = erofs_utils_193_bin();
    if bin.is_none() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "skip: {what}: needs erofs-utils 1.9.3 (`bash scripts/setup` builds it from \
             ../shared/tools/erofs-utils.sh)"
        );
    }
    bin.map(Path::to_path_buf)
}

/// Built (once per run, and only the first time on a machine) by the
/// script in `../shared/tools`, which prints its bin directory; a clone
/// without `../shared` has none. A worktree kept one directory further
/// down, beside others (`wt/NAME`), finds the same `shared` one more
/// level up.
pub fn erofs_utils_193_bin() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = common::workspace_root();
        let script = ["../shared", "../../shared"]
            .iter()
            .map(|up| root.join(up).join("tools/erofs-utils.sh"))
            .find(|script| script.exists())?;
        let out = common::run_timeout(Command::new("bash").arg(&script), Duration::from_secs(1800));
        if !out.status.success() {
            let _ = writeln!(
                std::io::stderr().lock(),
                "{}",
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
            return None;
        }
        let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        bin.join("mkfs.erofs").exists().then_some(bin)
    })
    .as_deref()
}

/// `MKFS --quiet ARGS IMG SRC` (an erofs-utils mkfs.erofs), bounded;
/// panics with its stderr unless it succeeds.
pub fn run_mkfs_erofs(mkfs: &Path, args: &[&str], img: &Path, src: &Path) {
    common::mkfs_erofs_with(mkfs, args, img, src);
}
