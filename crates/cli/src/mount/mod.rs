//! `foliofs mount`: check the image, mount it over FUSE, serve it in the
//! background (or the foreground with `-f`).
//!
//! Without `-f` the command starts a copy of itself with `-f` and a pipe,
//! and returns only when that server reports the mount live (or reports why
//! not), so scripts and `mount.fuse3` can use the mount right away.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use foliofs_block::remote::is_remote;

use crate::open;
use crate::options::MountOpts;
use foliofs_fuse::records as mount_state;

mod serve;
mod source;
mod supervise;
mod watch;
mod worker;

use source::open_source;
pub use watch::{watch, WatchArgs};

/// How long the command waits for its server to report the mount live.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Mount an image (or a new ramfs) over FUSE.
#[derive(clap::Args, Debug)]
pub struct MountArgs {
    /// Format of SOURCE: auto (detect from the image), romfs, erofs or ramfs.
    #[arg(short = 't', long = "type", default_value = "auto",
          value_parser = ["auto", "romfs", "erofs", "ramfs"])]
    pub fstype: String,
    /// Comma-separated options: ro, rw, largeblocks, blocksize=N, directio,
    /// nodirectio, allow_other, uid=N, gid=N, umask=OCT, fsname=NAME, debug, writeback,
    /// device=PATH, threads=N, spin=USEC, nospin, push=SIZE, nopush, record=FILE,
    /// prefetch=FILE, and the usual noexec/noatime/sync.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    #[command(flatten)]
    pub registry: crate::image::RegistryArgs,
    /// Serve in the foreground instead of returning once the mount is live.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Descriptor on which a background server reports readiness.
    #[arg(long, hide = true)]
    pub ready_fd: Option<i32>,
    /// Started by `mount.fuse3` (`foliofs SOURCE MOUNTPOINT -o OPTIONS`),
    /// whose own additions to the options are taken off again.
    #[arg(long, hide = true)]
    pub mount_helper: bool,
    /// The background server's source is in `FOLIOFS_MOUNT_SOURCE`, and
    /// SOURCE is only its redacted form: a URL's query string or user info
    /// (a presigned URL's signature) stays out of the server's command
    /// line, which every user can read.
    #[arg(long, hide = true)]
    pub source_from_env: bool,
    /// Serve the connection a supervisor holds, as this description of
    /// it says (see `foliofs_fuse::supervise::held`), instead of mounting.
    #[arg(long, hide = true)]
    pub handoff: Option<String>,
    /// With `--handoff`: an earlier server served this mount.
    #[arg(long, hide = true)]
    pub restarted: bool,
    /// With `--handoff`, for a ramfs: the descriptors of its state files
    /// (ledger, data), which the supervisor holds.
    #[arg(long, hide = true)]
    pub state_fds: Option<String>,
    /// The image file or block device (any name for ramfs).
    pub source: PathBuf,
    /// The directory to mount on.
    pub mountpoint: PathBuf,
}

/// The environment variable a background server takes its source from
/// (see [`MountArgs::source_from_env`]).
pub(super) const SOURCE_ENV: &str = "FOLIOFS_MOUNT_SOURCE";

pub fn run(mut args: MountArgs) -> anyhow::Result<i32> {
    if args.source_from_env {
        let Some(source) = std::env::var_os(SOURCE_ENV) else {
            bail!("{SOURCE_ENV} is not set");
        };
        args.source = PathBuf::from(source);
        args.source_from_env = false;
    }
    if args.mount_helper {
        args.options = vec![foliofs_fuse::strip_helper_defaults(&args.options.join(","))];
        args.mount_helper = false;
    }
    let opts = open::parse_mount_options(&args.fstype, &args.options)?;
    // A URL is not a path: made absolute it would name a local file.
    let source = if args.fstype == "ramfs" || is_remote(&args.source) {
        args.source.clone()
    } else if let Some(merged) =
        crate::image::merged(&args.source, &args.registry, &opts.image.open)?
    {
        // An image (oci:DIR[:TAG], docker://...) is mounted as its merged
        // image in the store, with its layers beside it.
        merged
    } else {
        std::path::absolute(&args.source)
            .with_context(|| format!("{}: bad path", args.source.display()))?
    };
    let ready = args.ready_fd.map(|fd| {
        // SAFETY: the parent passed this descriptor for our exclusive use and
        // nothing else in this process owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Kept from whatever this server starts (fusermount3 outlives the
        // report under auto_unmount): the parent reads until every copy of
        // this pipe's end is closed.
        let _ = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        File::from(fd)
    });
    let supervised = match supervise::wanted(&args.fstype, &opts) {
        Ok(s) => s,
        Err(e) => return report_failure(ready, e),
    };
    // A supervisor leaves the source to its servers: the command that
    // started it checked the source, and in the foreground the first
    // server does (a refusal then takes the mount down again at once).
    // Opened here, a remote image would be fetched twice, and its cache
    // held by a process that serves nothing.
    if supervised && args.handoff.is_none() && (args.foreground || ready.is_some()) {
        return supervise::run(&args, &source, &opts, ready);
    }
    // Everything that can be refused is refused here, before any mount.
    let state = match args
        .state_fds
        .as_deref()
        .map(supervise::state_files)
        .transpose()
    {
        Ok(s) => s,
        Err(e) => return report_failure(ready, e),
    };
    let opened = match open_source(&args.fstype, &source, &opts, state, args.restarted) {
        Ok(o) => o,
        Err(e) => return report_failure(ready, e),
    };
    // What format probes opened and the chosen source does not use.
    foliofs_block::remote::release_unused();
    if let Some(handoff) = args.handoff.take() {
        return worker::serve(&args, &source, &opts, opened, &handoff, ready);
    }
    if !args.foreground && ready.is_none() {
        drop(opened);
        return spawn_server(&args, &source, &opts);
    }
    serve::serve(&args, &source, &opts, opened, ready)
}

pub(super) fn report_failure(ready: Option<File>, e: anyhow::Error) -> anyhow::Result<i32> {
    match ready {
        Some(mut r) => {
            let _ = writeln!(r, "error: {}", crate::error_line(&e));
            Ok(1)
        }
        None => Err(e),
    }
}

/// `options` with the values that name local files (`device=`, `record=`,
/// `prefetch=FILE`) made absolute from this process's directory: the
/// server runs from `/`.
fn absolute_paths(options: &[String]) -> anyhow::Result<Vec<String>> {
    let item = |item: &str| -> anyhow::Result<String> {
        let Some((key, value)) = item.split_once('=') else {
            return Ok(item.to_owned());
        };
        let local_file = match key {
            "device" | "record" => true,
            "prefetch" => value != "all",
            _ => false,
        };
        if !local_file || value.is_empty() || is_remote(Path::new(value)) {
            return Ok(item.to_owned());
        }
        let p = std::path::absolute(value).with_context(|| format!("{key}={value}: bad path"))?;
        let p = p
            .to_str()
            .with_context(|| format!("{key}={value}: this directory's name is not UTF-8"))?;
        Ok(format!("{key}={p}"))
    };
    options
        .iter()
        .map(|o| {
            Ok(o.split(',')
                .map(item)
                .collect::<anyhow::Result<Vec<_>>>()?
                .join(","))
        })
        .collect()
}

/// `exe mount -f` serving `source` of type `fstype` with `options` (their
/// file names absolute) at `mountpoint` (absolute), with `flags` first;
/// from `/`, with no input or output.
fn server_command(
    exe: &Path,
    fstype: &str,
    options: &[String],
    source: &Path,
    mountpoint: &Path,
    flags: &[std::ffi::OsString],
) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["mount", "-f"]).args(flags).args(["-t", fstype]);
    for o in options {
        cmd.arg("-o").arg(o);
    }
    let shown = open::shown(source);
    if shown.as_str() != source.as_os_str() {
        cmd.arg("--source-from-env").env(SOURCE_ENV, source);
        cmd.arg("--").arg(&shown);
    } else {
        cmd.arg("--").arg(source);
    }
    cmd.arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Holding no directory busy but `/`.
        .current_dir("/");
    cmd
}

/// Starts `foliofs mount -f` in the background and waits for its verdict.
fn spawn_server(args: &MountArgs, source: &Path, opts: &MountOpts) -> anyhow::Result<i32> {
    let mountpoint = std::path::absolute(&args.mountpoint)
        .with_context(|| format!("{}: bad path", args.mountpoint.display()))?;
    let (mut rd, wr) = std::io::pipe().context("cannot create a pipe")?;
    // The child needs a descriptor without close-on-exec: a dup of the
    // writer, handed to it as a number.
    let wr_child = nix::unistd::dup(&wr).context("cannot duplicate the pipe")?;
    drop(wr);
    let stderr = if opts.fuse.debug {
        let dir = mount_state::state_dir()?;
        let log = dir.join(format!("debug.{}.log", std::process::id()));
        eprintln!("foliofs: debug log in {}", log.display());
        Stdio::from(File::create(&log).with_context(|| log.display().to_string())?)
    } else {
        Stdio::null()
    };
    let exe = std::env::current_exe().context("cannot find the foliofs binary")?;
    let mut cmd = server_command(
        &exe,
        &args.fstype,
        &absolute_paths(&args.options)?,
        source,
        &mountpoint,
        &["--ready-fd".into(), wr_child.as_raw_fd().to_string().into()],
    );
    cmd.stderr(stderr);
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only setsid(2), which is async-signal-safe and touches no memory.
    unsafe {
        // A session of its own: neither a Ctrl-C meant for the caller's
        // shell nor the hangup of its terminal takes the mount down.
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().context("cannot start the server")?;
    drop(wr_child);

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut msg = String::new();
        let _ = rd.read_to_string(&mut msg);
        let _ = tx.send(msg);
    });
    let msg = match rx.recv_timeout(READY_TIMEOUT) {
        Ok(m) => m,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            let _ = foliofs_fuse::unmount(&mountpoint);
            bail!(
                "the server did not report within {}s; stopped it",
                READY_TIMEOUT.as_secs()
            );
        }
    };
    if msg.starts_with("ready") {
        return Ok(0);
    }
    let _ = child.wait();
    match msg.strip_prefix("error: ") {
        Some(e) => bail!("{}", e.trim_end()),
        None => bail!("the server exited before the mount was live"),
    }
}

#[cfg(test)]
mod tests {
    use super::absolute_paths;

    #[test]
    fn file_options_are_made_absolute_for_the_server() {
        let cwd = std::env::current_dir().unwrap();
        let opts = vec![
            "ro,device=blob.img,prefetch=all,record=run.prof".to_owned(),
            "device=s3://bucket/blob,prefetch=p.prof,device=/abs/b,cache=/c".to_owned(),
        ];
        let got = absolute_paths(&opts).unwrap();
        assert_eq!(
            got[0],
            format!(
                "ro,device={},prefetch=all,record={}",
                cwd.join("blob.img").display(),
                cwd.join("run.prof").display()
            )
        );
        assert_eq!(
            got[1],
            format!(
                "device=s3://bucket/blob,prefetch={},device=/abs/b,cache=/c",
                cwd.join("p.prof").display()
            )
        );
    }
}
