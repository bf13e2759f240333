//! Mounting: `mount(2)` of a `fuse.foliofs` file system (or `fusermount3`
//! for a user who may not), the FUSE handshake, the bdi tuning, and serving
//! until the mount goes away.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use foliofs_vfs::FileSystem;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::{SigSet, Signal};

use crate::fusermount::{self, FusermountError};
use crate::kernel::{conn, Agreed, Dev};
use crate::options::MountFlags;
use crate::privilege;
use crate::server::{Server, ServerConfig};
use crate::spin::Spin;

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

/// Readahead an image mount asks for on its bdi, in KiB (the kernel's
/// FUSE default is 128): a large sequential read then has several
/// requests in flight.
pub const IMAGE_READ_AHEAD_KB: u32 = 4096;

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
    /// How long one server thread keeps polling for the next request after
    /// each one (`spin=`, see [`crate::spin`]); zero sleeps at once.
    pub spin: Duration,
    /// Readahead set on the mount's bdi once it is live, in KiB; `None`
    /// keeps the kernel's. (Only root may write the bdi's settings.)
    pub read_ahead_kb: Option<u32>,
    /// How the server answers requests once the mount is live.
    pub server: ServerConfig,
}

/// A live mount whose requests are not served yet: call [`Mounted::run`].
pub struct Mounted {
    dev: Arc<Dev>,
    others: Vec<Dev>,
    queues: Option<crate::kernel::uring::Queues>,
    server: Arc<Server>,
    agreed: Agreed,
    mountpoint: PathBuf,
    info: MountInfo,
    method: MountMethod,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .field("info", &self.info)
            .field("method", &self.method)
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

impl MountInfo {
    /// The user who mounted it, as a FUSE mount's `user_id=` says.
    pub fn user_id(&self) -> Option<u32> {
        self.super_options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }
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

    /// How the mount was made.
    pub fn method(&self) -> MountMethod {
        self.method
    }

    /// How requests reach the server: `io_uring`, or `dev` (`/dev/fuse`).
    pub fn transport(&self) -> &'static str {
        if self.queues.is_some() {
            "io_uring"
        } else {
            "dev"
        }
    }

    /// Serves requests until the file system is unmounted, and nothing
    /// else: signals keep their usual effect (for a server under a
    /// supervisor, which unmounts on its own signals, see [`crate::held`]).
    pub fn serve(self) -> io::Result<()> {
        conn::serve(self.dev, self.others, self.queues, self.server, self.agreed)
    }

    /// The line a server under a holder reports ready with: what INIT
    /// agreed, then `extra` (see [`crate::held::Held::learn`]).
    pub fn ready_report(&self, extra: &str) -> String {
        crate::held::ready_report(&self.agreed, extra)
    }

    pub(crate) fn from_parts(
        dev: Arc<Dev>,
        others: Vec<Dev>,
        server: Arc<Server>,
        agreed: Agreed,
        mountpoint: PathBuf,
        info: MountInfo,
        method: MountMethod,
    ) -> Mounted {
        Mounted {
            dev,
            others,
            queues: None,
            server,
            agreed,
            mountpoint,
            info,
            method,
        }
    }

    /// Serves requests until the file system is unmounted (by `umount`, or
    /// by SIGTERM, SIGINT or SIGHUP to this process, which unmount it).
    pub fn run(self) -> io::Result<()> {
        let mnt = self.mountpoint.clone();
        let method = self.method;
        let sigs = exit_signals();
        std::thread::Builder::new()
            .name("foliofs-signals".into())
            .spawn(move || loop {
                let Ok(sig) = sigs.wait() else { continue };
                log::info!("{sig:?}: unmounting {}", mnt.display());
                // Detached, so a busy mount still goes away from the namespace;
                // the server keeps answering the files still open in it.
                if let Err(e) = detach(&mnt, method) {
                    log::warn!("unmount {}: {e}", mnt.display());
                }
            })?;
        conn::serve(self.dev, self.others, self.queues, self.server, self.agreed)
    }
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

fn exit_signals() -> SigSet {
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

/// Sets the mount's bdi as `cfg` asks, once INIT is over (its reply may
/// only lower readahead). Only root of the machine may write a bdi's
/// settings; a user's mount keeps the kernel's.
pub(crate) fn tune_bdi(cfg: &MountConfig, info: &MountInfo) {
    if !privilege::is_machine_root() {
        return;
    }
    let bdi = format!("/sys/class/bdi/{}:{}", info.major, info.minor);
    if let Some(kb) = cfg.read_ahead_kb {
        write_sysfs(&bdi, "read_ahead_kb", &kb.to_string());
    }
    if !cfg.read_only {
        // FUSE bdis may dirty only 1% of memory (strict_limit), which
        // throttles a writeback-cached in-memory file system long before
        // memory is short.
        write_sysfs(&bdi, "strict_limit", "0");
        write_sysfs(&bdi, "max_ratio", "50");
    }
}

/// One open file of the connection per thread past the first: each
/// sleeps in its own read, and the first one's may poll (`spin=`) without
/// the others.
pub(crate) fn clones(dev: &Dev, threads: usize) -> io::Result<Vec<Dev>> {
    (1..threads.max(1))
        .map(|_| dev.clone_connection())
        .collect()
}

/// Starts the polling thread `cfg.spin` asks for on `dev` (not over
/// io_uring, where a request is answered on its caller's CPU and a poller
/// would take that CPU from the caller).
pub(crate) fn start_spin(cfg: &MountConfig, dev: &Dev, server: &Server) {
    if cfg.spin.is_zero() {
        return;
    }
    if let Some(s) = dev
        .try_clone_fd()
        .ok()
        .and_then(|fd| Spin::start(fd, cfg.spin))
    {
        let _ = server.spin_slot().set(s);
    }
}

/// Mounts `fs` at `cfg.mountpoint` and completes the FUSE handshake.
///
/// Call this before the process starts other threads: it blocks the
/// signals that [`Mounted::run`] turns into an unmount, and threads
/// inherit that mask.
pub fn mount(fs: Arc<dyn FileSystem>, cfg: &MountConfig) -> Result<Mounted, MountError> {
    let Attached {
        fd,
        mountpoint,
        info,
        method,
    } = attach(cfg)?;
    // From here on a failure must take the mount down again.
    let undo = |e: io::Error| {
        let _ = detach(&mountpoint, method);
        MountError::Handshake(e)
    };
    let server = Arc::new(Server::new(fs, cfg.server.clone()));
    let dev = Arc::new(Dev::new(fd));
    let _ = server.dev_slot().set(dev.clone());
    let agreed = conn::handshake(&dev, &*server).map_err(undo)?;
    // Over io_uring a thread per CPU serves the rings; `/dev/fuse` is left
    // with FORGET, INTERRUPT and what comes before the rings are ready,
    // which one thread answers.
    let queues = if agreed.flags & crate::kernel::abi::init::OVER_IO_URING != 0 {
        Some(crate::kernel::uring::Queues::new(&dev, &agreed).map_err(undo)?)
    } else {
        None
    };
    let threads = if queues.is_some() { 1 } else { cfg.threads };
    let others = clones(&dev, threads).map_err(undo)?;
    // After the handshake, which reads expecting it to block.
    if queues.is_none() {
        start_spin(cfg, &dev, &server);
    }
    tune_bdi(cfg, &info);
    Ok(Mounted {
        dev,
        others,
        queues,
        server,
        agreed,
        mountpoint,
        info,
        method,
    })
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

fn write_sysfs(dir: &str, file: &str, value: &str) {
    let path = format!("{dir}/{file}");
    if let Err(e) = std::fs::write(&path, value) {
        log::warn!("cannot set {path} to {value}: {e}");
    }
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
        assert_eq!(m.user_id(), Some(0));
        assert!(parse_mountinfo_line("garbage").is_none());
    }
}
