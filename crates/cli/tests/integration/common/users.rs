//! The test user and running as them.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use super::run_timeout;

/// The user the tests mount as (`bash scripts/setup` adds it).
pub const TEST_USER: &str = "tests";

/// A user's (uid, gid), if the system knows the name.
pub fn user_ids(user: &str) -> Option<(u32, u32)> {
    let u = nix::unistd::User::from_name(user).ok()??;
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

/// `PROG` to be run as `user` (its uid, primary group and groups) with a
/// fresh environment, the way a login would set it (`setpriv --reset-env`:
/// no `XDG_RUNTIME_DIR`, `HOME` from the password file).
pub fn user_command(user: &str, prog: impl AsRef<OsStr>) -> Command {
    let (uid, gid) = user_ids(user).unwrap_or_else(|| panic!("no user {user}"));
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--init-groups", "--reset-env", "--"])
        .arg(prog)
        .current_dir("/");
    c
}

/// Runs `PROG ARGS` as `user` (see [`user_command`]), killed after
/// `timeout`.
pub fn as_user<I, S>(user: &str, prog: impl AsRef<OsStr>, args: I, timeout: Duration) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_timeout(user_command(user, prog).args(args), timeout)
}

/// `sh -c SCRIPT sh ARGS...` as `user`, bounded by 120 s.
pub fn sh_as_user<S: AsRef<OsStr>>(user: &str, script: &str, args: &[S]) -> Output {
    as_user(
        user,
        "/bin/sh",
        [OsStr::new("-c"), OsStr::new(script), OsStr::new("sh")]
            .into_iter()
            .chain(args.iter().map(|a| a.as_ref())),
        Duration::from_secs(120),
    )
}

/// A new empty directory in the temporary directory, owned by `user`.
pub fn user_tempdir(user: &str) -> tempfile::TempDir {
    let (uid, gid) = user_ids(user).unwrap_or_else(|| panic!("no user {user}"));
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-user.")
        .tempdir()
        .unwrap();
    std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid)).unwrap();
    tmp
}

/// Makes `dir` (a test's temporary directory) readable and searchable by
/// everyone, so a user can reach the fixtures in it.
pub fn open_to_all(dir: &Path) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether this process has root's user id.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
