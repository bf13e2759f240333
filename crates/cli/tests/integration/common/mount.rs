//! Mounting, and the guard that always unmounts; what `foliofs mounts`
//! says of a mount.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{as_user, bin, foliofs, run_timeout, user_command, user_tempdir};

/// Mount points listed in /proc/self/mountinfo, unescaped (read by the
/// library's own parser).
pub fn mount_points() -> Vec<PathBuf> {
    foliofs_fuse::mount_table()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mountpoint)
        .collect()
}

/// True if `dir` is a mount point now.
pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    mount_points().iter().any(|p| p == &dir)
}

/// The environment variable that runs every mount of the tests over a
/// transport by name: `io_uring` (the second pass of `scripts/test`, with
/// `enable_uring` on) or `dev`. A mount that cannot have it fails, so the
/// pass cannot quietly fall back.
pub const TRANSPORT_ENV: &str = "FOLIOFS_TEST_TRANSPORT";

/// `opts` with the transport [`TRANSPORT_ENV`] names, unless they name
/// one themselves.
pub fn with_transport(opts: &str) -> String {
    let named = opts
        .split(',')
        .any(|o| o == "io_uring" || o == "noio_uring");
    let wanted = match std::env::var(TRANSPORT_ENV).as_deref() {
        Ok("io_uring") => Some("io_uring"),
        Ok("dev") => Some("noio_uring"),
        _ => None,
    };
    match wanted {
        Some(w) if !named => [opts, w]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(","),
        _ => opts.to_owned(),
    }
}

/// A live foliofs mount that is unmounted when dropped, even if the test
/// panicked.
pub struct Mount {
    dir: PathBuf,
    /// The user who mounted it (and unmounts it); `None` for this process.
    user: Option<String>,
    _tmp: Option<tempfile::TempDir>,
}

impl Mount {
    /// `foliofs mount [-t TYPE] [-o OPTS] SOURCE <new temp dir>`; returns once
    /// the command returned and the mount is live, or the command's stderr.
    pub fn new(source: &Path, fstype: Option<&str>, opts: &str) -> Result<Mount, String> {
        let tmp = tempfile::Builder::new()
            .prefix("foliofs-mnt.")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_owned();
        let mut m = Self::at(source, &dir, fstype, opts)?;
        m._tmp = Some(tmp);
        Ok(m)
    }

    /// As [`Mount::new`], run as `user` on a new directory of theirs;
    /// dropping it unmounts as that user (then as root, as a last resort).
    pub fn as_user(
        user: &str,
        source: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        let tmp = user_tempdir(user);
        let dir = tmp.path().to_owned();
        let mut m = Self::at_as(Some(user), source, &dir, fstype, opts)?;
        m._tmp = Some(tmp);
        Ok(m)
    }

    /// As [`Mount::new`], on an existing directory.
    pub fn at(
        source: &Path,
        dir: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        Self::at_as(None, source, dir, fstype, opts)
    }

    /// As [`Mount::at`], run as `user` where given.
    pub fn at_as(
        user: Option<&str>,
        source: &Path,
        dir: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        let mut cmd = match user {
            Some(u) => user_command(u, bin()),
            None => Command::new(bin()),
        };
        cmd.arg("mount");
        if let Some(t) = fstype {
            cmd.args(["-t", t]);
        }
        let opts = with_transport(opts);
        if !opts.is_empty() {
            cmd.args(["-o", &opts]);
        }
        cmd.arg(source).arg(dir);
        Self::by_command(user, &mut cmd, dir)
    }

    /// Runs `cmd`, a `foliofs mount` (or a wrapper of it) of `dir` as
    /// `user` where given (who unmounts it again), and takes the mount if
    /// it is live; otherwise its stderr, never leaving a mount behind.
    pub fn by_command(user: Option<&str>, cmd: &mut Command, dir: &Path) -> Result<Mount, String> {
        Self::by_command_output(user, cmd, dir).map(|(m, _)| m)
    }

    /// As [`Mount::by_command`], with what the command printed.
    pub fn by_command_output(
        user: Option<&str>,
        cmd: &mut Command,
        dir: &Path,
    ) -> Result<(Mount, Output), String> {
        let out = run_timeout(cmd, Duration::from_secs(60));
        if !out.status.success() {
            if is_mounted(dir) {
                // Never leave a mount behind, whatever the command said.
                force_unmount(dir);
                return Err(format!(
                    "mount failed but left {} mounted: {}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if !is_mounted(dir) {
            return Err(format!(
                "foliofs mount returned success but {} is not a mount point",
                dir.display()
            ));
        }
        let m = Mount {
            dir: dir.to_owned(),
            user: user.map(ToOwned::to_owned),
            _tmp: None,
        };
        Ok((m, out))
    }

    /// Keeps `tmp` (the mount point's directory) until the mount is gone.
    pub fn keeping(mut self, tmp: tempfile::TempDir) -> Mount {
        self._tmp = Some(tmp);
        self
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Unmounts now with `foliofs umount` (as the user who mounted),
    /// reporting failure.
    pub fn unmount(mut self) -> Result<(), String> {
        let r = unmount_with_foliofs(&self.dir, self.user.as_deref());
        force_unmount(&self.dir);
        self.dir = PathBuf::new();
        r
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.dir.as_os_str().is_empty() {
            return;
        }
        let _ = unmount_with_foliofs(&self.dir, self.user.as_deref());
        force_unmount(&self.dir);
    }
}

fn unmount_with_foliofs(dir: &Path, user: Option<&str>) -> Result<(), String> {
    if !is_mounted(dir) {
        return Ok(());
    }
    let mut cmd = match user {
        Some(u) => user_command(u, bin()),
        None => Command::new(bin()),
    };
    let out = run_timeout(cmd.arg("umount").arg(dir), Duration::from_secs(30));
    if out.status.success() && !is_mounted(dir) {
        Ok(())
    } else {
        Err(format!(
            "foliofs umount {}: {} {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Last resort: lazy unmounts, bounded in time, until `dir` is no mount point.
pub fn force_unmount(dir: &Path) {
    for attempt in 0..3 {
        if !is_mounted(dir) {
            return;
        }
        let (prog, args): (&str, &[&str]) = if attempt == 0 {
            ("fusermount3", &["-u", "-z"])
        } else {
            ("umount", &["-l"])
        };
        let _ = Command::new(prog)
            .args(args)
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The mount at `dir`'s line of `foliofs mounts` run by `user` (this
/// process where `None`).
pub fn mounts_line_of(user: Option<&str>, dir: &Path) -> String {
    let out = match user {
        Some(u) => as_user(u, bin(), ["mounts"], Duration::from_secs(30)),
        None => foliofs(["mounts"]),
    };
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "foliofs mounts failed ({}):\n{list}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let dir = dir.to_str().unwrap();
    list.lines()
        .find(|l| l.split(' ').nth(1) == Some(dir))
        .unwrap_or_else(|| panic!("{dir} is not in foliofs mounts:\n{list}"))
        .to_owned()
}

fn pid_field(line: &str, key: &str) -> Option<u32> {
    line.split([' ', ','])
        .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
        .and_then(|p| p.trim().parse().ok())
}

/// The pid of the mount at `dir`'s process (`pid=`): its server, or the
/// supervisor that holds its connection, whose signals unmount.
pub fn mount_pid(user: Option<&str>, dir: &Path) -> u32 {
    let line = mounts_line_of(user, dir);
    pid_field(&line, "pid").unwrap_or_else(|| panic!("no pid in {line}"))
}

/// The pid of the process serving the mount at `dir` (`server=` under a
/// supervisor, else `pid=`), as `foliofs mounts` run by `user` (this
/// process where `None`) lists it.
pub fn server_pid(user: Option<&str>, dir: &Path) -> u32 {
    let line = mounts_line_of(user, dir);
    pid_field(&line, "server")
        .or_else(|| pid_field(&line, "pid"))
        .unwrap_or_else(|| panic!("no pid in {line}"))
}
