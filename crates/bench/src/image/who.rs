//! Who runs a row: whoever runs the bench, or (when that is root) an
//! ordinary user, whose rows mount and read as that user does.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::env::BenchEnv;

/// The user root's bench runs the user rows as: present on every Debian
/// system, and owning nothing the bench reads.
const USER: &str = "nobody";

#[derive(Clone, Debug)]
pub(crate) enum Who {
    /// Whoever runs the bench.
    Me,
    /// An ordinary user, through `setpriv` with no supplementary groups.
    User {
        name: String,
        uid: u32,
        gid: u32,
        home: std::path::PathBuf,
    },
}

impl Who {
    /// The runner of the user rows: the bench's own user when that is not
    /// root, else [`USER`]; why not, when it cannot be had.
    pub(crate) fn ordinary(env: &BenchEnv) -> Result<Who, String> {
        if !env.root {
            return Ok(Who::Me);
        }
        let u = nix::unistd::User::from_name(USER)
            .ok()
            .flatten()
            .ok_or_else(|| format!("no user {USER} to mount as"))?;
        let fuse = std::fs::metadata("/dev/fuse").map_err(|e| format!("/dev/fuse: {e}"))?;
        if fuse.permissions().mode() & 0o006 != 0o006 {
            return Err(
                "/dev/fuse is not open to ordinary users (mode 0666, as scripts/setup makes it)"
                    .into(),
            );
        }
        if !crate::env::have("setpriv") {
            return Err("setpriv is not installed (util-linux)".into());
        }
        Ok(Who::User {
            name: USER.into(),
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            home: u.dir,
        })
    }

    /// `prog`, to be run as this runner.
    pub(crate) fn command(&self, prog: impl AsRef<OsStr>) -> Command {
        match self {
            Who::Me => Command::new(prog),
            Who::User {
                name,
                uid,
                gid,
                home,
            } => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "--"])
                    .arg(prog)
                    // The user's own environment, not root's: what it
                    // looks up under its home (auth files) is its own.
                    .env("HOME", home)
                    .env("USER", name)
                    .env("LOGNAME", name)
                    .env_remove("XDG_RUNTIME_DIR")
                    .env_remove("XDG_CACHE_HOME")
                    .env_remove("REGISTRY_AUTH_FILE");
                c
            }
        }
    }

    /// Gives `dir` to this runner.
    pub(crate) fn own(&self, dir: &Path) -> Result<()> {
        if let Who::User { uid, gid, .. } = self {
            std::os::unix::fs::chown(dir, Some(*uid), Some(*gid))
                .with_context(|| format!("giving {} to uid {uid}", dir.display()))?;
        }
        Ok(())
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Who::Me => "the user running the bench".into(),
            Who::User { name, uid, .. } => format!("{name} (uid {uid})"),
        }
    }
}

/// Seconds this runner takes to read every file under `dir`: the bench's
/// own reader (`foliofs bench read-tree`), run as a process of its own
/// for every row alike.
pub(crate) fn read_tree(env: &BenchEnv, who: &Who, dir: &Path) -> Result<f64> {
    reader(env, who, "read-tree", dir)
}

/// Seconds this runner takes to read the first byte of the first file a
/// walk of `dir` meets (`foliofs bench first-byte`).
pub(crate) fn first_byte(env: &BenchEnv, who: &Who, dir: &Path) -> Result<f64> {
    reader(env, who, "first-byte", dir)
}

/// `foliofs bench WHAT --tree DIR` as `who`: the seconds it prints.
fn reader(env: &BenchEnv, who: &Who, what: &str, dir: &Path) -> Result<f64> {
    let out = who
        .command(&env.exe)
        .args(["bench", what, "--tree"])
        .arg(dir)
        .output()
        .with_context(|| format!("starting foliofs bench {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} of {} ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let s = String::from_utf8_lossy(&out.stdout);
    s.trim()
        .parse()
        .with_context(|| format!("{what} printed {s:?}"))
}
