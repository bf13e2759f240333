//! `foliofs umount`: unmount a foliofs mount, also one whose server died.
//! A user may unmount their own mounts (through `fusermount3 -u`), root
//! any.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use foliofs_fuse::records::{process_alive, MountState};

/// How long to wait for the server to exit once its mount is gone.
const SERVER_EXIT_WAIT: Duration = Duration::from_secs(10);

/// Unmount a foliofs mount.
#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
}

/// The absolute path of `p` without touching `p` itself: the root of a
/// mount whose server is dead cannot be stat'ed.
pub(crate) fn mount_path(p: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(p).with_context(|| format!("{}: bad path", p.display()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .with_context(|| parent.display().to_string())?
            .join(name)),
        _ => Ok(abs),
    }
}

/// The foliofs mount at `p` (its path as [`mount_path`] makes it), or why
/// there is none.
pub(crate) fn foliofs_mount(p: &Path) -> anyhow::Result<(PathBuf, foliofs_fuse::MountInfo)> {
    let path = mount_path(p)?;
    let Some(m) = foliofs_fuse::find_mount(&path)? else {
        bail!("{}: not mounted", path.display());
    };
    if m.fs_type != foliofs_fuse::FS_TYPE {
        bail!(
            "{}: is a {} mount, not a foliofs one",
            path.display(),
            m.fs_type
        );
    }
    Ok((path, m))
}

/// A user's name, or their number where the system has no name for it.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

pub fn run(args: UmountArgs) -> anyhow::Result<i32> {
    let (path, m) = foliofs_mount(&args.mountpoint)?;
    let me = nix::unistd::getuid().as_raw();
    if !foliofs_fuse::mount::privilege::has_cap_sys_admin() {
        if let Some(owner) = m.user_id().filter(|&o| o != me) {
            let who = if owner == 0 { "root" } else { "they or root" };
            bail!(
                "{}: mounted by {}; only {who} may unmount it",
                path.display(),
                user_name(owner)
            );
        }
    }
    let state = MountState::find(&m);
    foliofs_fuse::unmount(&path).with_context(|| format!("cannot unmount {}", path.display()))?;
    if let Some(s) = state {
        // Wait for the server, so the image is no longer open when we return.
        let start = Instant::now();
        while process_alive(s.pid) && start.elapsed() < SERVER_EXIT_WAIT {
            std::thread::sleep(Duration::from_millis(10));
        }
        MountState::remove(s.mount_id, s.pid);
    }
    Ok(0)
}
