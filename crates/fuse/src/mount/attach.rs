//! Making a mount and taking it down: `mount(2)` of a `fuse.foliofs` file
//! system where this process may, `fusermount3` where it may not, and the
//! refusals of what neither would allow said in one line each, before
//! anything is mounted.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::{SigSet, Signal};

use super::fusermount::{self, FusermountError};
use super::privilege;
use super::table::{find_mount, MountInfo};
use super::MountConfig;

/// The file-system type every foliofs mount has (`fuse.<subtype>`).
pub const FS_TYPE: &str = "fuse.foliofs";

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount point cannot be resolved or is not a directory.
    #[error("{path}: {source}")]
    Mountpoint {
        /// The mount point as given.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },
    /// `/dev/fuse` cannot be opened (no FUSE module, or no permission).
    #[error("cannot open /dev/fuse: {0}")]
    DevFuse(#[source] io::Error),
    /// `mount(2)` refused, or the new mount did not show up in
    /// `/proc/self/mountinfo`; nothing is left mounted.
    #[error("cannot mount {path}: {source}")]
    Mount {
        /// The resolved mount point.
        path: PathBuf,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// `fusermount3` could not be run, or refused, or failed; nothing is
    /// left mounted.
    #[error("cannot mount {path}: {source}")]
    Fusermount {
        /// The resolved mount point.
        path: PathBuf,
        /// What went wrong, in `fusermount3`'s words where it said.
        #[source]
        source: FusermountError,
    },
    /// This process may not have the mount it asks for (an option only
    /// root may use, a mount point it cannot write); refused before
    /// anything was mounted.
    #[error("{0}")]
    Refused(String),
    /// Blocking the exit signals or the FUSE `INIT` exchange with the
    /// kernel failed; a mount already made has been detached.
    #[error("FUSE handshake failed: {0}")]
    Handshake(#[source] io::Error),
}

/// How a mount was made, which decides how it is taken down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountMethod {
    /// mount(2) by this process (root, or `CAP_SYS_ADMIN` in the user
    /// namespace owning its mount namespace).
    Syscall,
    /// The set-user-ID `fusermount3` (a user).
    Fusermount,
}

/// Detaches `mnt`, made by `method`.
pub(crate) fn detach(mnt: &Path, method: MountMethod) -> io::Result<()> {
    match method {
        MountMethod::Syscall => {
            nix::mount::umount2(mnt, MntFlags::MNT_DETACH).map_err(io::Error::from)
        }
        MountMethod::Fusermount if privilege::has_cap_sys_admin() => {
            nix::mount::umount2(mnt, MntFlags::MNT_DETACH).map_err(io::Error::from)
        }
        MountMethod::Fusermount => fusermount::unmount(mnt, true).map_err(io::Error::other),
    }
}

pub(super) fn exit_signals() -> SigSet {
    let mut s = SigSet::empty();
    s.add(Signal::SIGTERM);
    s.add(Signal::SIGINT);
    s.add(Signal::SIGHUP);
    s
}

/// A mount made, whose handshake is still to come.
pub(crate) struct Attached {
    pub(crate) fd: OwnedFd,
    pub(crate) mountpoint: PathBuf,
    pub(crate) info: MountInfo,
    pub(crate) method: MountMethod,
}

/// Mounts a `fuse.foliofs` file system at `cfg.mountpoint`, by `mount(2)`
/// or `fusermount3`, and blocks the signals [`Mounted::run`] turns into an
/// unmount (threads started later inherit that mask).
pub(crate) fn attach(cfg: &MountConfig) -> Result<Attached, MountError> {
    let mp_err = |source| MountError::Mountpoint {
        path: cfg.mountpoint.clone(),
        source,
    };
    let mountpoint = cfg.mountpoint.canonicalize().map_err(mp_err)?;
    let meta = std::fs::metadata(&mountpoint).map_err(mp_err)?;
    if !meta.is_dir() {
        return Err(mp_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mount point is not a directory",
        )));
    }
    let method = check_and_choose(cfg, &mountpoint)?;
    exit_signals()
        .thread_block()
        .map_err(|e| MountError::Handshake(e.into()))?;

    let (fd, method) = match method {
        MountMethod::Syscall => match mount_syscall(cfg, &mountpoint, &meta) {
            Ok(dev) => (dev, MountMethod::Syscall),
            // CAP_SYS_ADMIN in a user namespace that does not own our mount
            // namespace (`unshare -Ur` without `-m`) is no mount right.
            Err(MountError::Mount { source, .. })
                if source.raw_os_error() == Some(libc::EPERM)
                    && !privilege::in_initial_user_namespace() =>
            {
                log::info!("mount(2) refused in this user namespace; trying fusermount3");
                (mount_fusermount(cfg, &mountpoint)?, MountMethod::Fusermount)
            }
            Err(e) => return Err(e),
        },
        MountMethod::Fusermount => (mount_fusermount(cfg, &mountpoint)?, MountMethod::Fusermount),
    };
    // The mount just made is the topmost at that path; reading mountinfo
    // (rather than stat) sends no request to a server not yet running.
    match find_mount(&mountpoint)
        .ok()
        .flatten()
        .filter(|m| m.fs_type == FS_TYPE)
    {
        Some(info) => Ok(Attached {
            fd,
            mountpoint,
            info,
            method,
        }),
        None => {
            let _ = detach(&mountpoint, method);
            Err(MountError::Mount {
                path: mountpoint,
                source: io::Error::other("the new mount is missing from /proc/self/mountinfo"),
            })
        }
    }
}

/// Refuses what this process may not have, and picks how to mount.
fn check_and_choose(cfg: &MountConfig, mountpoint: &Path) -> Result<MountMethod, MountError> {
    let refused = |m: String| Err(MountError::Refused(m));
    // Device nodes and set-user-ID programs are root's to grant: the kernel
    // forces nodev in a user namespace, and fusermount3 forces both.
    if !privilege::is_machine_root() {
        for (off, name) in [(cfg.flags.nodev, "dev"), (cfg.flags.nosuid, "suid")] {
            if !off {
                return refused(format!(
                    "mount option `{name}` needs root: a user's mount is always no{name}"
                ));
            }
        }
    }
    if privilege::has_cap_sys_admin() {
        return Ok(MountMethod::Syscall);
    }
    // What fusermount3 would refuse, refused here in one line each.
    if cfg.allow_other && !privilege::user_allow_other() {
        return refused(format!(
            "mount option `allow_other` needs `user_allow_other` in {} (or root)",
            privilege::FUSE_CONF
        ));
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied {
            " (only root may use FUSE here; distributions make /dev/fuse mode 0666)"
        } else {
            ""
        };
        return Err(MountError::Refused(format!(
            "cannot open /dev/fuse: {e}{hint}"
        )));
    }
    if nix::unistd::access(mountpoint, nix::unistd::AccessFlags::W_OK).is_err() {
        return refused(format!(
            "{}: you (uid {}) cannot write this directory; a user may mount only on one they can write",
            mountpoint.display(),
            nix::unistd::getuid()
        ));
    }
    Ok(MountMethod::Fusermount)
}

/// mount(2) with a `/dev/fuse` descriptor of our own.
fn mount_syscall(
    cfg: &MountConfig,
    mountpoint: &Path,
    meta: &std::fs::Metadata,
) -> Result<OwnedFd, MountError> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(MountError::DevFuse)?;
    let dev: OwnedFd = dev.into();

    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={},default_permissions",
        dev.as_raw_fd(),
        libc::S_IFDIR | (meta.permissions().mode() & 0o7777),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MsFlags::empty();
    for (on, f) in [
        (cfg.flags.nosuid, MsFlags::MS_NOSUID),
        (cfg.flags.nodev, MsFlags::MS_NODEV),
        (cfg.flags.noexec, MsFlags::MS_NOEXEC),
        (cfg.flags.noatime, MsFlags::MS_NOATIME),
        (cfg.flags.sync, MsFlags::MS_SYNCHRONOUS),
        (cfg.flags.dirsync, MsFlags::MS_DIRSYNC),
        (cfg.read_only, MsFlags::MS_RDONLY),
    ] {
        if on {
            flags |= f;
        }
    }
    nix::mount::mount(
        Some(cfg.fsname.as_str()),
        mountpoint,
        Some(FS_TYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| MountError::Mount {
        path: mountpoint.to_owned(),
        source: e.into(),
    })?;
    Ok(dev)
}

/// The same mount through `fusermount3`, in its option language.
fn mount_fusermount(cfg: &MountConfig, mountpoint: &Path) -> Result<OwnedFd, MountError> {
    let mut opts = vec![
        "default_permissions".to_owned(),
        format!("fsname={}", fusermount::escape_value(&cfg.fsname)),
        format!("subtype={}", FS_TYPE.trim_start_matches("fuse.")),
        if cfg.read_only { "ro" } else { "rw" }.to_owned(),
    ];
    // fusermount3 starts from nosuid,nodev; only root may turn them off.
    for (on, set, unset) in [
        (cfg.flags.nosuid, "nosuid", "suid"),
        (cfg.flags.nodev, "nodev", "dev"),
        (cfg.flags.noexec, "noexec", "exec"),
        (cfg.flags.noatime, "noatime", "atime"),
        (cfg.flags.sync, "sync", "async"),
    ] {
        opts.push(if on { set } else { unset }.to_owned());
    }
    if cfg.flags.dirsync {
        opts.push("dirsync".to_owned());
    }
    if cfg.allow_other {
        opts.push("allow_other".to_owned());
    }
    fusermount::mount(mountpoint, &opts.join(",")).map_err(|source| MountError::Fusermount {
        path: mountpoint.to_owned(),
        source,
    })
}

/// Unmounts `path`. A busy or dead mount (its server gone) is detached.
/// Without `CAP_SYS_ADMIN` this goes through `fusermount3 -u`, which
/// unmounts only the calling user's own FUSE mounts.
pub fn unmount(path: &Path) -> io::Result<()> {
    if privilege::has_cap_sys_admin() {
        match nix::mount::umount2(path, MntFlags::empty()) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EBUSY) => {
                return nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(io::Error::from)
            }
            // A user namespace's CAP_SYS_ADMIN over a mount it does not own.
            Err(nix::errno::Errno::EPERM) if !privilege::in_initial_user_namespace() => {}
            Err(e) => return Err(e.into()),
        }
    }
    match fusermount::unmount(path, false) {
        Ok(()) => Ok(()),
        Err(FusermountError::Refused(m)) if m.contains("busy") => {
            fusermount::unmount(path, true).map_err(io::Error::other)
        }
        Err(e) => Err(io::Error::other(e)),
    }
}
