//! The romfs oracle: Linux's own romfs driver in a VM
//! (`tests/oracle/romfs-vm.sh`) prints its walk of an image, and
//! [`host_walk`] prints a host directory (a foliofs mount) with the same
//! code (`tests/oracle/walk.rs`), so the two compare as text.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

#[path = "../../oracle/walk.rs"]
pub mod walk;

/// What the oracle needs on the machine, for [`crate::require!`]; it
/// fetches the kernel itself on first use.
pub const NEEDS: &[&str] = &["qemu-system-x86_64", "busybox", "cpio"];

/// The oracle's script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/romfs-vm.sh")
}

/// The walk of `img` as Linux's romfs reads it, one line each (see
/// `walk.rs`); panics with the oracle's notes if the run fails.
pub fn kernel_walk(img: &Path) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg(script()).arg(img);
    if std::env::var_os("RUSTC").is_none() {
        // The toolchain that built these tests builds the guest's walker.
        let rustc = Path::new(env!("CARGO")).with_file_name("rustc");
        if rustc.is_file() {
            cmd.env("RUSTC", rustc);
        }
    }
    let out = super::run_timeout(&mut cmd, Duration::from_secs(900));
    assert!(
        out.status.success(),
        "romfs-vm.sh {} exited {}:\n{}",
        img.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the oracle prints ASCII")
}

/// The same walk of a directory on this machine.
pub fn host_walk(dir: &Path) -> String {
    let mut sha256 = |f: &mut std::fs::File| -> io::Result<String> {
        let mut h = Sha256::new();
        io::copy(f, &mut h)?;
        Ok(format!("{:x}", h.finalize()))
    };
    walk::walk(dir, &mut sha256)
        .into_iter()
        .map(|l| l + "\n")
        .collect()
}
