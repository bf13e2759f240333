//! `foliofs takeover`: a new server, from the `foliofs` binary on disk
//! now, takes over a live supervised mount, and the old one retires:
//! an upgrade in place, with no reader seeing an error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use foliofs_fuse::records::{process_alive, MountState};

/// How long the new server has to come up: the supervisor's own limit
/// (`foliofs_fuse::supervise::Policy::ready_timeout`) and some.
const TAKEOVER_WAIT: Duration = Duration::from_secs(70);

/// Start a new server for a supervised mount and retire the running one.
#[derive(clap::Args, Debug)]
pub struct TakeoverArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
}

pub fn run(args: TakeoverArgs) -> anyhow::Result<i32> {
    let (path, m) = crate::umount::foliofs_mount(&args.mountpoint)?;
    let Some(before) = MountState::find(&m) else {
        bail!(
            "{}: no record of its server (mounted by another user?)",
            path.display()
        );
    };
    let Some(old) = before.server else {
        bail!(
            "{}: not supervised (mounted with `nosupervise`, `io_uring`, or a ramfs without `supervise`): nothing could take it over",
            path.display()
        );
    };
    if !process_alive(before.pid) {
        bail!("{}: its supervisor is gone", path.display());
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(before.pid as i32),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .with_context(|| format!("cannot signal the supervisor of {}", path.display()))?;
    let start = Instant::now();
    while start.elapsed() < TAKEOVER_WAIT {
        std::thread::sleep(Duration::from_millis(20));
        let Some(now) = MountState::find(&m) else {
            bail!("{}: the mount went away", path.display());
        };
        if now.failed_takeovers > before.failed_takeovers {
            bail!(
                "{}: the new server did not come up; server {old} serves on (its log: {})",
                path.display(),
                log_path(m.mount_id)
            );
        }
        if now.restarts > before.restarts {
            if let Some(new) = now.server.filter(|&s| s != old) {
                println!("{}: server {new} took over from {old}", path.display());
                return Ok(0);
            }
        }
    }
    bail!(
        "{}: no new server within {}s",
        path.display(),
        TAKEOVER_WAIT.as_secs()
    )
}

/// Where a background supervisor logs (see `mount/supervise.rs`).
fn log_path(mount_id: u64) -> String {
    foliofs_fuse::records::own_dir().map_or_else(
        || "none".to_owned(),
        |d| {
            d.join("log")
                .join(mount_id.to_string())
                .display()
                .to_string()
        },
    )
}
