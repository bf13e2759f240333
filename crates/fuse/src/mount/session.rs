//! A mount's life in this process: mounting, the FUSE handshake, the
//! bdi tuning, and serving until the mount goes away. Each step that may
//! fail after the mount exists takes it down again, so a failed
//! [`mount`] leaves nothing behind.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use foliofs_vfs::FileSystem;

use super::attach::{attach, detach, exit_signals, Attached, MountError, MountMethod};
use super::privilege;
use super::table::MountInfo;
use crate::kernel::uring::Queues;
use crate::kernel::{abi, conn, Agreed, Dev};
use crate::options::MountFlags;
use crate::server::spin::Spin;
use crate::server::{Server, ServerConfig};

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
    /// each one (`spin=`, see [`crate::server::spin`]); zero sleeps at once.
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
    queues: Option<Queues>,
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

    /// Whether the kernel can resend what a dead server had read
    /// (`FUSE_HAS_RESEND`, Linux 6.9): what lets a supervised mount outlive
    /// its server.
    pub fn can_resend(&self) -> bool {
        self.agreed.offered & crate::kernel::abi::init::HAS_RESEND != 0
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
    /// supervisor, which unmounts on its own signals, see [`crate::supervise::held`]).
    pub fn serve(self) -> io::Result<()> {
        conn::serve(self.dev, self.others, self.queues, self.server, self.agreed)
    }

    /// What INIT agreed on this mount's connection.
    pub(crate) fn agreed(&self) -> &Agreed {
        &self.agreed
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
    let queues = if agreed.flags & abi::init::OVER_IO_URING != 0 {
        Some(Queues::new(&dev, &agreed).map_err(undo)?)
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

fn write_sysfs(dir: &str, file: &str, value: &str) {
    let path = format!("{dir}/{file}");
    if let Err(e) = std::fs::write(&path, value) {
        log::warn!("cannot set {path} to {value}: {e}");
    }
}
