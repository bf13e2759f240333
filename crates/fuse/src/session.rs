//! Mounting: `mount(2)` of a `fuse.foliofs` file system, the FUSE handshake,
//! the bdi tuning, and serving until the mount goes away.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use foliofs_vfs::FileSystem;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::{SigSet, Signal};

use crate::options::MountFlags;
use crate::server::{Server, ServerConfig};

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
    #[error("mount(2) of {path} failed: {source}")]
    Mount {
        /// The resolved mount point.
        path: PathBuf,
        /// The system call's error.
        #[source]
        source: io::Error,
    },
    /// Blocking the exit signals or the FUSE `INIT` exchange with the
    /// kernel failed; a mount already made has been detached.
    #[error("FUSE handshake failed: {0}")]
    Handshake(#[source] io::Error),
}

/// Everything about one mount besides the file system itself.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// The directory to mount on; resolved to an absolute path first.
    pub mountpoint: PathBuf,
    /// Source shown in `/proc/mounts`.
    pub fsname: String,
    /// `MS_*` flags for `mount(2)`.
    pub flags: MountFlags,
    /// Mount with `MS_RDONLY`, and leave the bdi's dirty-page limits alone.
    /// The server's own refusal of changes is [`ServerConfig::read_only`].
    pub read_only: bool,
    /// Let users other than the mounting one in (`allow_other`); otherwise
    /// the session serves only the owner.
    pub allow_other: bool,
    /// Server threads (each with its own cloned `/dev/fuse` descriptor).
    pub threads: usize,
    /// Readahead set on the mount's bdi once it is live, in KiB; `None`
    /// keeps the kernel's.
    pub read_ahead_kb: Option<u32>,
    /// How the server answers requests once the mount is live.
    pub server: ServerConfig,
}

/// A live mount whose requests are not served yet: call [`Mounted::run`].
pub struct Mounted {
    session: fuser::Session<Server>,
    mountpoint: PathBuf,
    info: MountInfo,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .field("info", &self.info)
            .finish()
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// The mount's unique id (field 1).
    pub mount_id: u64,
    /// Major number of the superblock's device (`st_dev`); with `minor` it
    /// names the bdi in `/sys/class/bdi/MAJOR:MINOR`.
    pub major: u32,
    /// Minor number of the superblock's device.
    pub minor: u32,
    /// Where it is mounted, with mountinfo's escapes decoded.
    pub mountpoint: PathBuf,
    /// The file-system type, `fuse.foliofs` for ours (see [`FS_TYPE`]).
    pub fs_type: String,
    /// The mount source (`fsname=` for a FUSE mount).
    pub source: String,
    /// Per-mount options (`rw,nosuid,nodev,...`).
    pub mount_options: String,
    /// Per-superblock options (`user_id=0,...`).
    pub super_options: String,
}

/// Decodes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from(std::ffi::OsStr::from_bytes(&out))
}

/// Every mount this process can see, from `/proc/self/mountinfo`.
pub fn mount_table() -> io::Result<Vec<MountInfo>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    if l.len() < 6 || r.len() < 3 {
        return None;
    }
    let (major, minor) = l[2].split_once(':')?;
    Some(MountInfo {
        mount_id: l[0].parse().ok()?,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mountpoint: PathBuf::from(unescape(l[4])),
        mount_options: l[5].to_owned(),
        fs_type: r[0].to_owned(),
        source: unescape(r[1]).to_string_lossy().into_owned(),
        super_options: r[2].to_owned(),
    })
}

/// The topmost mount at `path` (already canonical), if any.
pub fn find_mount(path: &Path) -> io::Result<Option<MountInfo>> {
    Ok(mount_table()?
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path))
}

impl Mounted {
    /// The mount as `/proc/self/mountinfo` shows it.
    pub fn info(&self) -> &MountInfo {
        &self.info
    }

    /// The canonical mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Serves requests until the file system is unmounted (by `umount`, or
    /// by SIGTERM, SIGINT or SIGHUP to this process, which unmount it).
    pub fn run(self) -> io::Result<()> {
        let mnt = self.mountpoint.clone();
        let sigs = exit_signals();
        std::thread::Builder::new()
            .name("foliofs-signals".into())
            .spawn(move || loop {
                let Ok(sig) = sigs.wait() else { continue };
                log::info!("{sig:?}: unmounting {}", mnt.display());
                // Detached, so a busy mount still goes away from the namespace;
                // the server keeps answering the files still open in it.
                match nix::mount::umount2(&mnt, MntFlags::MNT_DETACH) {
                    Ok(()) => {}
                    Err(e) => log::warn!("unmount {}: {e}", mnt.display()),
                }
            })?;
        self.session.run()
    }
}

fn exit_signals() -> SigSet {
    let mut s = SigSet::empty();
    s.add(Signal::SIGTERM);
    s.add(Signal::SIGINT);
    s.add(Signal::SIGHUP);
    s
}

/// Mounts `fs` at `cfg.mountpoint` and completes the FUSE handshake.
///
/// Call this before the process starts other threads: it blocks the
/// signals that [`Mounted::run`] turns into an unmount, and threads
/// inherit that mask.
pub fn mount(fs: Arc<dyn FileSystem>, cfg: &MountConfig) -> Result<Mounted, MountError> {
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
    exit_signals()
        .thread_block()
        .map_err(|e| MountError::Handshake(e.into()))?;

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
        &mountpoint,
        Some(FS_TYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| MountError::Mount {
        path: mountpoint.clone(),
        source: e.into(),
    })?;

    // From here on a failure must take the mount down again.
    let undo = |e: MountError| {
        let _ = nix::mount::umount2(&mountpoint, MntFlags::MNT_DETACH);
        e
    };
    // The mount just made is the topmost at that path; reading mountinfo
    // (rather than stat) sends no request to a server not yet running.
    let info = find_mount(&mountpoint)
        .ok()
        .flatten()
        .filter(|m| m.fs_type == FS_TYPE)
        .ok_or_else(|| {
            undo(MountError::Mount {
                path: mountpoint.clone(),
                source: io::Error::other("the new mount is missing from /proc/self/mountinfo"),
            })
        })?;

    let acl = if cfg.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    let mut fcfg = fuser::Config::default();
    fcfg.n_threads = Some(cfg.threads.max(1));
    fcfg.clone_fd = true;
    let server = Server::new(fs, cfg.server.clone());
    let session = fuser::Session::from_fd(server, dev, acl, fcfg)
        .map_err(|e| undo(MountError::Handshake(e)))?;

    // The INIT reply may only lower readahead, so it is raised after it.
    let bdi = format!("/sys/class/bdi/{}:{}", info.major, info.minor);
    if let Some(kb) = cfg.read_ahead_kb {
        write_sysfs(&bdi, "read_ahead_kb", &kb.to_string());
    }
    if !cfg.read_only {
        // FUSE bdis may dirty only 1% of memory (strict_limit), which throttles
        // a writeback-cached in-memory file system long before memory is short.
        write_sysfs(&bdi, "strict_limit", "0");
        write_sysfs(&bdi, "max_ratio", "50");
    }
    Ok(Mounted {
        session,
        mountpoint,
        info,
    })
}

fn write_sysfs(dir: &str, file: &str, value: &str) {
    let path = format!("{dir}/{file}");
    if let Err(e) = std::fs::write(&path, value) {
        log::warn!("cannot set {path} to {value}: {e}");
    }
}

/// Unmounts `path`. A busy or dead mount (its server gone) is detached.
pub fn unmount(path: &Path) -> io::Result<()> {
    match nix::mount::umount2(path, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => {
            nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(io::Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = "36 35 0:57 / /mnt/a\\040b rw,nosuid,nodev,relatime shared:1 - fuse.foliofs /img/x\\040y.romfs ro,user_id=0,group_id=0";
        let m = parse_mountinfo_line(l).unwrap();
        assert_eq!(m.mount_id, 36);
        assert_eq!((m.major, m.minor), (0, 57));
        assert_eq!(m.mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(m.fs_type, "fuse.foliofs");
        assert_eq!(m.source, "/img/x y.romfs");
        assert_eq!(m.mount_options, "rw,nosuid,nodev,relatime");
        assert!(parse_mountinfo_line("garbage").is_none());
    }
}
