//! An image mount under a supervisor: this process mounts, answers INIT,
//! holds the connection's open files, and runs the servers as processes
//! of their own (`foliofs mount -f --handoff ...`, see `worker.rs`). A
//! server that dies, by a bug, the OOM killer or `kill -9`, is replaced
//! and the kernel resends what it was working on, so readers see their
//! reads complete; SIGUSR1 (`foliofs takeover`) replaces a live server
//! with one from the binary on disk now. See `foliofs_fuse::supervise::held` and
//! `foliofs_fuse::supervise`.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::{bail, Context};
use foliofs_fuse::records::{self as mount_state, MountState};
use foliofs_fuse::supervise::{Ended, Event, Policy, Starter};
use foliofs_fuse::{MountConfig, ServerConfig};

use super::serve::{add_session_options, fsname, push_option, THREADS};
use super::watch::{mount_failure, spawn_watcher};
use super::{absolute_paths, report_failure, server_command, MountArgs};
use crate::options::MountOpts;

/// Whether this mount runs under a supervisor: every mount does unless
/// `nosupervise` (or `io_uring` by name, whose rings the kernel does not
/// resend from). A ramfs's state then lives in files the supervisor holds
/// (see `foliofs_ramfs::StateFiles`).
pub(super) fn wanted(fstype: &str, opts: &MountOpts) -> anyhow::Result<bool> {
    let asked = opts.fuse.supervise;
    if fstype == "ramfs" && asked != Some(false) {
        if let Some(why) = super::source::unsupervisable_ramfs(opts)? {
            if asked == Some(true) {
                bail!("mount option `supervise`: {why}");
            }
            log::info!("ramfs: not supervised, its files die with its server: {why}");
            return Ok(false);
        }
    }
    if opts.fuse.io_uring == Some(true) {
        if asked == Some(true) {
            bail!("mount options `supervise` and `io_uring` exclude each other: the kernel does not resend the requests a dead server took from its io_uring queues");
        }
        return Ok(false);
    }
    Ok(asked != Some(false))
}

/// What a server says of itself when it reports ready: the format it
/// found and its options as `foliofs mounts` shows them.
pub(super) fn report(format: &str, shown: &str) -> String {
    format!("{format} {shown}")
}

/// Starts servers for the supervisor, and keeps the mount's record.
struct Servers {
    /// The binary on disk, as it was named when the mount was made: a
    /// takeover starts what is there now.
    exe: PathBuf,
    fstype: String,
    options: Vec<String>,
    source: PathBuf,
    mountpoint: PathBuf,
    opts: MountOpts,
    state: MountState,
    /// A ramfs's state files, held here for every server in turn.
    ramfs: Option<foliofs_ramfs::StateFiles>,
}

impl Starter for Servers {
    fn start(&mut self, handoff: &str, ready: &OwnedFd, restarted: bool) -> std::io::Result<Child> {
        let mut flags: Vec<std::ffi::OsString> = vec![
            "--ready-fd".into(),
            ready.as_raw_fd().to_string().into(),
            "--handoff".into(),
            handoff.into(),
        ];
        if restarted {
            flags.push("--restarted".into());
        }
        // Inherited by the server: duplicates without close-on-exec,
        // closed here once it is started.
        let mut inherited: Vec<OwnedFd> = Vec::new();
        if let Some(files) = &self.ramfs {
            for f in [files.ledger.as_fd(), files.data.as_fd()]
                .into_iter()
                .chain(files.pool.as_ref().map(|p| p.as_fd()))
            {
                inherited.push(nix::unistd::dup(f).map_err(std::io::Error::from)?);
            }
            let fds: Vec<String> = inherited
                .iter()
                .map(|f| f.as_raw_fd().to_string())
                .collect();
            flags.push("--state-fds".into());
            flags.push(fds.join(",").into());
        }
        let mut cmd = server_command(
            &self.exe,
            &self.fstype,
            &self.options,
            &self.source,
            &self.mountpoint,
            &flags,
        );
        // A process group of its own: a Ctrl-C at a foreground mount's
        // terminal reaches the supervisor, which unmounts, and not the
        // server, which would only be restarted. Its errors go where the
        // supervisor's go.
        cmd.process_group(0);
        let child = cmd.spawn();
        drop(inherited);
        child
    }

    fn exclusive(&self) -> bool {
        // Two servers of one ramfs would both change its state files.
        self.ramfs.is_some()
    }

    fn preflight(&mut self) -> std::io::Result<()> {
        let out = std::process::Command::new(&self.exe)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "{} --version: {}",
                self.exe.display(),
                out.status
            )));
        }
        Ok(())
    }

    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Serving {
                pid,
                restarts,
                report,
            } => {
                if restarts > 0 {
                    log::warn!("server {pid} serves the mount (restart {restarts})");
                }
                if let Some((format, shown)) = report.trim_end().split_once(' ') {
                    self.state.format = format.to_owned();
                    let mut shown = shown.to_owned();
                    push_option(&mut shown, "transport=dev");
                    push_option(&mut shown, "supervised");
                    add_session_options(&mut shown, &self.opts);
                    self.state.options = shown;
                }
                self.state.server = Some(pid);
                self.state.restarts = restarts;
                if let Err(e) = self.state.save() {
                    log::warn!("cannot record the mount for `foliofs mounts`: {e}");
                }
            }
            Event::Died { pid, how, wait } => {
                log::warn!(
                    "server {pid} {how}: its requests are resent to the next, started in {} ms",
                    wait.as_millis()
                );
            }
            Event::TakeoverFailed { reason } => {
                log::warn!("takeover failed: {reason}; the running server serves on");
                self.state.failed_takeovers += 1;
                if let Err(e) = self.state.save() {
                    log::warn!("cannot record the mount for `foliofs mounts`: {e}");
                }
            }
        }
    }
}

/// Where a background supervisor and its servers log: its standard error
/// is nowhere, and a server's death and a mount given up must be read
/// somewhere. `log/<mount id>` in the record directory, new for each
/// mount.
fn log_to_file(mount_id: u64) -> anyhow::Result<PathBuf> {
    let dir = mount_state::state_dir()?.join("log");
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let path = dir.join(mount_id.to_string());
    let f = File::create(&path).with_context(|| path.display().to_string())?;
    nix::unistd::dup2_stderr(&f).context("cannot log to the file")?;
    Ok(path)
}

/// Mounts, then supervises servers until unmounted; reports readiness on
/// `ready` once the first server serves. This process never opens the
/// source: its servers do (and the command that started it checked it).
pub(super) fn run(
    args: &MountArgs,
    source: &Path,
    opts: &MountOpts,
    ready: Option<File>,
) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("cannot find the foliofs binary")?;
    let mut options = absolute_paths(&args.options)?;
    let mut opts = opts.clone();
    if args.fstype == "ramfs" && opts.fuse.spin.is_none() {
        // Measured once, here: the threads held below and every server's
        // polling follow the same choice.
        let (window, why) = foliofs_fuse::server::spin::default_window();
        log::info!("polling for the next request: {window:?} ({why})");
        opts.fuse.spin = Some(window);
        options.push(super::serve::spin_option(window));
    }
    let opts = &opts;
    let held = match foliofs_fuse::supervise::held::hold(&held_config(args, source, opts)) {
        Ok(h) => h,
        Err(e) => return report_failure(ready, mount_failure(e, &args.mountpoint)),
    };
    let info = held.info().clone();
    let log = if ready.is_some() && !opts.fuse.debug {
        match log_to_file(info.mount_id) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("{e:#}");
                None
            }
        }
    } else {
        None
    };
    let _watch = if opts.fuse.auto_unmount {
        match spawn_watcher(&info) {
            Ok(w) => Some(w),
            Err(e) => {
                let _ = held.detach();
                return report_failure(ready, e.context("auto_unmount"));
            }
        }
    } else {
        None
    };
    let ramfs = if args.fstype == "ramfs" {
        match super::source::ramfs_state(opts) {
            Ok(f) => Some(f),
            Err(e) => {
                let _ = held.detach();
                return report_failure(ready, e);
            }
        }
    } else {
        None
    };
    let pid = std::process::id();
    let mut servers = Servers {
        ramfs,
        exe,
        fstype: args.fstype.clone(),
        options,
        source: source.to_owned(),
        mountpoint: info.mountpoint.clone(),
        opts: opts.clone(),
        state: MountState::new(&info, pid, "", String::new()),
    };
    let mut ready = ready;
    let r =
        foliofs_fuse::supervise::supervise(held, &mut servers, Policy::default(), &mut |_pid| {
            if let Some(mut r) = ready.take() {
                let _ = writeln!(r, "ready");
            }
        });
    MountState::remove(info.mount_id, pid);
    // A ramfs given up on: its files are still in the state held here,
    // and go with this process unless saved.
    let r = match (r, &servers.ramfs) {
        (Err(Ended::GaveUp(why)), Some(files)) => {
            Err(Ended::GaveUp(keep_state(files, info.mount_id, why)))
        }
        (r, _) => r,
    };
    match r {
        Ok(()) => Ok(0),
        Err(Ended::NeverServed(why)) if ready.is_some() => {
            let why = match &log {
                Some(p) => format!("{why} (log: {})", p.display()),
                None => why,
            };
            report_failure(ready, anyhow::anyhow!("{why}"))
        }
        // In the foreground, as the refusal of an unsupervised mount reads.
        Err(Ended::NeverServed(why)) => Err(anyhow::anyhow!("{why}")),
        Err(e) => Err(anyhow::Error::new(e).context(info.mountpoint.display().to_string())),
    }
}

/// Saves a given-up ramfs's state where `foliofs salvage` reads it, and
/// says so after `why`.
fn keep_state(files: &foliofs_ramfs::StateFiles, mount_id: u64, why: String) -> String {
    let dir = salvage_dir().join(format!(
        "{mount_id}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    ));
    match files.save_to(&dir) {
        Ok(()) => format!(
            "{why}; its files are kept in {d}: `foliofs salvage {d} DIR` recreates them in DIR",
            d = dir.display()
        ),
        Err(e) => format!(
            "{why}; its files could not be saved in {}: {e}",
            dir.display()
        ),
    }
}

/// Where given-up ramfs state is saved: `FOLIOFS_SALVAGE_DIR`, else
/// `/var/lib/foliofs/salvage` for root and `~/.local/state/foliofs/salvage`
/// for a user (on disk: a ramfs's files may be larger than memory left).
fn salvage_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FOLIOFS_SALVAGE_DIR") {
        return PathBuf::from(d);
    }
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/foliofs/salvage");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/foliofs/salvage")
}

/// What mounting needs to know, for a mount whose servers are other
/// processes: where, how, and one open file per server thread. (INIT and
/// every answer after it are the servers'.)
fn held_config(args: &MountArgs, source: &Path, opts: &MountOpts) -> MountConfig {
    // A ramfs is written; its threads are the unsupervised mount's.
    let ramfs = args.fstype == "ramfs";
    let read_only = !ramfs || opts.fuse.read_only == Some(true);
    let threads = if ramfs {
        super::serve::ramfs_threads(opts.fuse.spin.is_some_and(|s| !s.is_zero()))
    } else {
        THREADS
    };
    MountConfig {
        mountpoint: args.mountpoint.clone(),
        fsname: fsname(opts, source),
        flags: opts.fuse.flags,
        read_only,
        allow_other: opts.fuse.allow_other,
        threads: opts.fuse.threads.unwrap_or(threads),
        spin: Duration::ZERO,
        read_ahead_kb: read_only.then_some(foliofs_fuse::IMAGE_READ_AHEAD_KB),
        server: ServerConfig::default(),
    }
}

/// The state files a supervisor handed its server (`--state-fds L,D[,P]`:
/// ledger, data, and the tmpfs of a ramfs that passes its files through).
pub(super) fn state_files(fds: &str) -> anyhow::Result<foliofs_ramfs::StateFiles> {
    use std::os::fd::FromRawFd;
    let fds: Vec<i32> = fds
        .split(',')
        .map(|f| {
            f.parse()
                .map_err(|_| anyhow::anyhow!("--state-fds {fds}: not descriptors"))
        })
        .collect::<anyhow::Result<_>>()?;
    let (ledger, data, pool) = match fds[..] {
        [l, d] => (l, d, None),
        [l, d, p] => (l, d, Some(p)),
        _ => bail!("--state-fds: two or three descriptors expected"),
    };
    for fd in [ledger, data].into_iter().chain(pool) {
        nix::fcntl::fcntl(
            // SAFETY: checked only; not owned here.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .with_context(|| format!("--state-fds: descriptor {fd}"))?;
    }
    // SAFETY: the supervisor handed these open descriptors to this process
    // alone (checked open above), and nothing else here owns them.
    let (ledger, data, pool) = unsafe {
        (
            File::from_raw_fd(ledger),
            File::from_raw_fd(data),
            pool.map(|p| OwnedFd::from_raw_fd(p)),
        )
    };
    Ok(foliofs_ramfs::StateFiles { ledger, data, pool })
}
