//! `auto_unmount`'s watcher, and what a failed mount says about a dead one.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::SOURCE_ENV;

/// Starts `foliofs watch-mount` for the mount `info`: it detaches the mount
/// once this process is gone (see `foliofs_fuse::mount::watch`). Returns the
/// descriptor to keep open until then.
pub(super) fn spawn_watcher(info: &foliofs_fuse::MountInfo) -> anyhow::Result<OwnedFd> {
    let exe = std::env::current_exe().context("cannot find the foliofs binary")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "watch-mount",
        "--mount-id",
        &info.mount_id.to_string(),
        "--",
    ])
    .arg(&info.mountpoint)
    // The watcher has no use for the source.
    .env_remove(SOURCE_ENV);
    let (_child, wr) =
        foliofs_fuse::mount::watch::spawn(cmd).context("cannot start the watcher")?;
    Ok(wr)
}

/// Watch a mount and detach it once its server is gone (`auto_unmount`).
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// The mount's id (`/proc/self/mountinfo`, field 1).
    #[arg(long)]
    pub mount_id: u64,
    /// The mount point, canonical.
    pub mountpoint: PathBuf,
    /// The read end of the server's pipe.
    pub fd: i32,
}

/// The watcher's body: `foliofs_fuse::mount::watch::wait_and_detach`.
pub fn watch(args: WatchArgs) -> anyhow::Result<i32> {
    // SAFETY: the server passed this descriptor for our exclusive use and
    // nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(args.fd) };
    // A session of its own: a signal to the server's process group or
    // session does not take it along.
    let _ = nix::unistd::setsid();
    foliofs_fuse::mount::watch::wait_and_detach(fd, args.mount_id, &args.mountpoint)
        .with_context(|| format!("auto_unmount of {}", args.mountpoint.display()))?;
    Ok(0)
}

/// Why mounting failed, with what to do when the mount point lies in a
/// FUSE mount whose server died: every access to it then fails with
/// ENOTCONN, or ECONNABORTED for a request caught in flight while the
/// kernel ends the connection (over io_uring that comes after the process
/// is gone, when its rings are torn down); neither says anything of the
/// cure.
pub(super) fn mount_failure(e: foliofs_fuse::MountError, mountpoint: &Path) -> anyhow::Error {
    let dead = matches!(&e, foliofs_fuse::MountError::Mountpoint { source, .. }
        if matches!(source.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)));
    if !dead {
        return e.into();
    }
    let Some(m) = dead_mount(mountpoint) else {
        return anyhow::anyhow!(
            "{e}; a FUSE mount there may have lost its server: run `foliofs umount {}` first",
            mountpoint.display()
        );
    };
    let cure = if m.fs_type == foliofs_fuse::FS_TYPE {
        "foliofs umount"
    } else {
        "fusermount3 -u"
    };
    anyhow::anyhow!(
        "{e}; the {} mount at {} lost its server: run `{cure} {}` first",
        m.fs_type,
        m.mountpoint.display(),
        m.mountpoint.display()
    )
}

/// The topmost FUSE mount at `p` or the nearest directory above it: the one
/// whose dead server makes `p` unreachable. Found in the mount table, since
/// the path itself cannot be resolved.
fn dead_mount(p: &Path) -> Option<foliofs_fuse::MountInfo> {
    let abs = std::path::absolute(p).ok()?;
    // The table has canonical paths: resolve what still resolves, the
    // directories above the dead mount.
    let abs = abs.ancestors().find_map(|a| {
        let rest = abs.strip_prefix(a).ok()?;
        Some(a.canonicalize().ok()?.join(rest))
    })?;
    let table = foliofs_fuse::mount_table().ok()?;
    abs.ancestors().find_map(|a| {
        table
            .iter()
            .rev()
            .find(|m| m.mountpoint == a)
            .filter(|m| m.fs_type.starts_with("fuse"))
            .cloned()
    })
}
