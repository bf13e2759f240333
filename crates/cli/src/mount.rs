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
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use foliofs_block::remote::is_remote;
use foliofs_block::IoMode;
use foliofs_fuse::{format_size, MountConfig, Overrides, ServerConfig};
use foliofs_vfs::FileSystem;

use crate::open::{self, Image};
use crate::options::MountOpts;
use foliofs_fuse::records::{self as mount_state, MountState};

/// How long the command waits for its server to report the mount live.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Server threads: enough for the kernel's parallel readahead and a
/// metadata walk at once on a small machine.
const THREADS: usize = 4;

/// Pusher threads of a `directio` image mount: each reads a file while the
/// others' reads are in the device's queue.
const PUSH_READERS_DIRECT: usize = 4;
/// Server threads of a ramfs: no more than the machine has cores, one
/// fewer while a thread polls. Its requests are a few microseconds of work
/// in memory, with no reads to overlap, so threads past that only add
/// wake-ups: on two cores, creating small files one after another ran
/// 15-20% faster with 2 threads than 4. The polling thread takes a core of
/// its own, and every thread asleep in a read is woken for each request
/// the poller then takes first: creates ran about 15% faster with it alone
/// than beside a second thread.
fn ramfs_threads(polling: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(THREADS, |n| n.get().min(THREADS));
    if polling {
        (cores - 1).max(1)
    } else {
        cores
    }
}
/// Lifetime of cached entries and attributes. An image cannot change under
/// the mount, and a ramfs changes only through it: the kernel updates or
/// drops its cached entries and attributes itself on every change it sends
/// (it invalidates a directory's attributes after a create or unlink in it,
/// a file's after a write, link, unlink or rename, and takes a SETATTR's
/// reply as the new attributes), and the server tells it when it drops
/// set-user-ID on a write by itself.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

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
    /// The image file or block device (any name for ramfs).
    pub source: PathBuf,
    /// The directory to mount on.
    pub mountpoint: PathBuf,
}

/// An opened source, ready to be served.
struct Opened {
    fs: Arc<dyn FileSystem>,
    format: &'static str,
    read_only: bool,
    /// A format that can change (so owner overrides and long caches do not apply).
    writable: bool,
    /// The format's effective options, as `foliofs mounts` shows them.
    shown: String,
    /// Bytes the server may push into the kernel unasked (0: none).
    push_budget: u64,
    /// `record=`: where the profile goes, and the image's key.
    record: Option<(PathBuf, foliofs_fuse::ImageKey)>,
    /// `prefetch=`: the profile to replay, if it is this image's.
    profile: Option<Arc<foliofs_fuse::Profile>>,
    /// A ramfs whose files live in backing files: passed through where the
    /// kernel takes it, and whether the user asked for that by name.
    passthrough: Option<(Arc<foliofs_fuse::Passthrough>, bool)>,
    /// Figures the mount publishes beside its request counts.
    gauge: Option<foliofs_fuse::published::Gauge>,
}

/// The remote counters of this process (bytes read and fetched, cache
/// hits and misses, fetch errors, retries), published as group `remote`:
/// one mount is one process, so the process's counters are the mount's.
fn remote_gauge() -> foliofs_fuse::published::Gauge {
    foliofs_fuse::published::Gauge {
        name: "remote",
        read: Box::new(|| {
            let r = foliofs_block::remote::stats();
            vec![
                ("bytes_read", r.bytes_read),
                ("bytes_fetched", r.bytes_fetched),
                ("cache_hits", r.cache_hits),
                ("cache_misses", r.cache_misses),
                ("fetch_errors", r.fetch_errors),
                ("retries", r.retries),
            ]
        }),
    }
}

/// Appends `,item` (or `item` to an empty list).
fn push_option(list: &mut String, item: &str) {
    if !list.is_empty() {
        list.push(',');
    }
    list.push_str(item);
}

/// The environment variable a background server takes its source from
/// (see [`MountArgs::source_from_env`]).
const SOURCE_ENV: &str = "FOLIOFS_MOUNT_SOURCE";

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
    // Everything that can be refused is refused here, before any mount.
    let opened = match open_source(&args.fstype, &source, &opts) {
        Ok(o) => o,
        Err(e) => return report_failure(ready, e),
    };
    if !args.foreground && ready.is_none() {
        drop(opened);
        return spawn_server(&args, &source, &opts);
    }
    serve(&args, &source, &opts, opened, ready)
}

fn report_failure(ready: Option<File>, e: anyhow::Error) -> anyhow::Result<i32> {
    match ready {
        Some(mut r) => {
            let _ = writeln!(r, "error: {}", crate::error_line(&e));
            Ok(1)
        }
        None => Err(e),
    }
}

fn open_source(fstype: &str, source: &Path, opts: &MountOpts) -> anyhow::Result<Opened> {
    if fstype == "ramfs" {
        return open_ramfs(opts);
    }
    open::refuse_misplaced(source, opts)?;
    let open_opts = &opts.image.open;
    let format = if fstype == "auto" {
        open::detect(source, open_opts)?
    } else {
        let found = open::detect(source, open_opts)?;
        if found.name() != fstype {
            bail!(
                "{}: is a {} image, not {fstype}",
                open::shown(source),
                found.name()
            );
        }
        found
    };
    opts.refuse_extra()?;
    if opts.fuse.read_only == Some(false) {
        log::info!(
            "{}: {} is read-only; mounting ro",
            open::shown(source),
            format.name()
        );
    }
    // writeback is a setting of the FUSE session, not of the image; only a
    // writable format has writes to cache.
    if opts.fuse.writeback {
        bail!("mount option `writeback` is for ramfs; images are read-only");
    }
    let image = open::open_with_devices(source, open_opts, &opts.image.devices)?;
    let io_mode = match &image {
        Image::Romfs(r) => r.block_dev().store().mode(),
        Image::Erofs(e) => e.block_dev().store().mode(),
    };
    let fs = image.fs();
    let info = fs.info();
    let mut shown = vec![
        format!("blocksize={}", format_size(u64::from(info.block_size))),
        match io_mode {
            IoMode::Direct => "directio".to_owned(),
            IoMode::Buffered => "buffered".to_owned(),
        },
    ];
    if open_opts.io_mode == IoMode::Direct && io_mode != IoMode::Direct {
        shown.push("directio_fallback".to_owned());
    }
    if let Some(u) = opts.fuse.uid {
        shown.push(format!("uid={u}"));
    }
    if let Some(g) = opts.fuse.gid {
        shown.push(format!("gid={g}"));
    }
    if let Some(m) = opts.fuse.umask {
        shown.push(format!("umask={m:04o}"));
    }
    let (push_budget, record, profile) = profiles(source, opts)?;
    if let Some((p, _)) = &record {
        shown.push(format!("record={}", p.display()));
    }
    if profile.is_some() {
        if let Some(p) = &opts.fuse.prefetch {
            shown.push(format!("prefetch={}", p.display()));
        }
    }
    if push_budget > 0 && record.is_none() {
        shown.push(format!("push={}", format_size(push_budget)));
    } else {
        shown.push("nopush".to_owned());
    }
    if is_remote(source) || opts.image.devices.iter().any(|d| is_remote(d)) {
        shown.extend(remote_shown(&opts.image.open.remote));
    }
    Ok(Opened {
        fs,
        format: image.format().name(),
        read_only: true,
        writable: false,
        shown: shown.join(","),
        push_budget,
        record,
        profile,
        passthrough: None,
        gauge: None,
    })
}

/// An image mount's push budget, the profile to record, and the profile to
/// replay. A profile of another image (or one that cannot be read) is left
/// out with a warning: the mount works as without it.
#[allow(clippy::type_complexity)]
fn profiles(
    source: &Path,
    opts: &MountOpts,
) -> anyhow::Result<(
    u64,
    Option<(PathBuf, foliofs_fuse::ImageKey)>,
    Option<Arc<foliofs_fuse::Profile>>,
)> {
    let budget = opts
        .fuse
        .push
        .unwrap_or(foliofs_fuse::push::DEFAULT_PUSH_BUDGET);
    if opts.fuse.record.is_some() && opts.fuse.prefetch.is_some() {
        bail!("mount options `record=` and `prefetch=` go on different mounts: a replayed run reads less than it needs");
    }
    if opts.fuse.record.is_none() && opts.fuse.prefetch.is_none() {
        return Ok((budget, None, None));
    }
    let key = image_key(source, opts)
        .with_context(|| format!("{}: cannot read it to key a profile", open::shown(source)))?;
    let mut record = None;
    if let Some(p) = &opts.fuse.record {
        let p = std::path::absolute(p).with_context(|| format!("{}: bad path", p.display()))?;
        // Written at unmount: refuse now a place that cannot take it.
        let mut tmp = p.as_os_str().to_owned();
        tmp.push(".tmp");
        File::create(&tmp)
            .and_then(|_| std::fs::remove_file(&tmp))
            .with_context(|| format!("record={}: cannot write there", p.display()))?;
        record = Some((p, key));
    }
    let mut profile = None;
    if let Some(p) = &opts.fuse.prefetch {
        let p = std::path::absolute(p).with_context(|| format!("{}: bad path", p.display()))?;
        match foliofs_fuse::Profile::load(&p, key) {
            Ok(pr) => profile = Some(Arc::new(pr)),
            Err(e) => log::warn!("prefetch= ignored: {e}"),
        }
        if profile.is_some() && budget == 0 {
            log::warn!("prefetch= with nopush (push=0): the profile is not used");
        }
    }
    Ok((budget, record, profile))
}

/// The key a start-up profile of `source` carries: a local image read as
/// a file, an image in object storage through its store (and its cache).
fn image_key(source: &Path, opts: &MountOpts) -> anyhow::Result<foliofs_fuse::ImageKey> {
    if !is_remote(source) {
        return Ok(foliofs_fuse::ImageKey::of_image(source)?);
    }
    let store = foliofs_block::Store::open(source, &opts.image.open)?;
    Ok(foliofs_fuse::ImageKey::of_reader(
        store.size(),
        &mut |buf, at| {
            store
                .read_at(buf, at)
                .map(|_| ())
                .map_err(std::io::Error::other)
        },
    )?)
}

/// A remote image's options as `foliofs mounts` shows them: the chunk and
/// timeout always, the rest where given. An endpoint is shown redacted as
/// the source is.
fn remote_shown(r: &foliofs_block::remote::RemoteOptions) -> Vec<String> {
    let mut v = vec![format!("chunk={}", format_size(u64::from(r.chunk)))];
    if let Some(d) = &r.cache_dir {
        v.push(format!("cache={}", d.display()));
    }
    if let Some(n) = r.cache_size {
        v.push(format!("cache_size={}", format_size(n)));
    }
    if r.prefetch_all {
        v.push("prefetch=all".to_owned());
    }
    if let Some(e) = &r.endpoint {
        v.push(format!("endpoint={}", foliofs_block::remote::redact(e)));
    }
    if let Some(region) = &r.region {
        v.push(format!("region={region}"));
    }
    if r.path_style {
        v.push("path_style".to_owned());
    }
    if r.insecure_http {
        v.push("insecure_http".to_owned());
    }
    v.push(format!("timeout={}", r.timeout.as_secs()));
    v
}

fn open_ramfs(opts: &MountOpts) -> anyhow::Result<Opened> {
    let ro = open::ramfs_options(opts)?;
    let read_only = opts.fuse.read_only == Some(true);
    let mut shown = ro.show();
    if opts.fuse.writeback {
        shown = [shown.as_str(), "writeback"]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(",");
    }
    let fs = Arc::new(ramfs_with_data_path(&ro, opts)?);
    let passthrough: Option<(Arc<foliofs_fuse::Passthrough>, bool)> = fs
        .is_backed()
        .then(|| (Arc::default(), ro.passthrough == Some(true)));
    let gauge = {
        let fs = fs.clone();
        let p = passthrough.as_ref().map(|(p, _)| p.clone());
        foliofs_fuse::published::Gauge {
            name: "ramfs",
            read: Box::new(move || {
                let mut v = vec![("inodes_held", fs.inodes_held() as u64)];
                if let Some(p) = &p {
                    v.push(("backing_bytes", fs.backing_bytes().unwrap_or(0)));
                    v.push(("passthrough_files", p.registered() as u64));
                }
                v
            }),
        }
    };
    Ok(Opened {
        fs,
        format: "ramfs",
        read_only,
        writable: !read_only,
        shown,
        push_budget: 0,
        record: None,
        profile: None,
        passthrough,
        gauge: Some(gauge),
    })
}

/// A ramfs whose file data lives where `passthrough` says: in backing
/// files the kernel reads and writes itself, wherever that is allowed
/// (`CAP_SYS_ADMIN` of the machine, Linux 6.9, no writeback cache) unless
/// `nopassthrough`; in the server otherwise. Asked for by name, it is had
/// or refused with the reason.
fn ramfs_with_data_path(
    ro: &foliofs_ramfs::Options,
    opts: &MountOpts,
) -> anyhow::Result<foliofs_ramfs::RamFs> {
    let asked = ro.passthrough == Some(true);
    let why_not = if ro.passthrough == Some(false) {
        return Ok(foliofs_ramfs::RamFs::new(ro));
    } else if opts.fuse.writeback {
        Some("the kernel passes no file through while it caches writes (`writeback`)".to_owned())
    } else if !foliofs_fuse::privilege::kernel_at_least(6, 9) {
        Some("FUSE passthrough needs Linux 6.9 or later".to_owned())
    } else if !foliofs_fuse::privilege::is_machine_root() {
        Some(
            "FUSE passthrough needs CAP_SYS_ADMIN of the machine: the kernel lets only such a server hand it backing files (a user's ramfs keeps its files in the server)"
                .to_owned(),
        )
    } else {
        match foliofs_ramfs::RamFs::new_backed(ro) {
            Ok(fs) => return Ok(fs),
            Err(e) => Some(format!(
                "mounting the tmpfs that holds the files failed: {e}"
            )),
        }
    };
    let why = why_not.expect("every way on returned");
    if asked {
        bail!("mount option `passthrough`: {why}");
    }
    log::info!("ramfs: files stay in the server: {why}");
    Ok(foliofs_ramfs::RamFs::new(ro))
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
    let mut cmd = Command::new(exe);
    cmd.args(["mount", "-f", "--ready-fd"])
        .arg(wr_child.as_raw_fd().to_string())
        .args(["-t", &args.fstype]);
    for o in absolute_paths(&args.options)? {
        cmd.arg("-o").arg(o);
    }
    let shown = open::shown(source);
    if shown.as_str() != source.as_os_str() {
        cmd.arg("--source-from-env").env(SOURCE_ENV, source);
        cmd.arg("--").arg(&shown);
    } else {
        cmd.arg("--").arg(source);
    }
    cmd.arg(&mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        // Holding no directory busy but `/`.
        .current_dir("/");
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

/// Starts `foliofs watch-mount` for the mount `info`: it detaches the mount
/// once this process is gone (see `foliofs_fuse::watch`). Returns the
/// descriptor to keep open until then.
fn spawn_watcher(info: &foliofs_fuse::MountInfo) -> anyhow::Result<OwnedFd> {
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
    let (_child, wr) = foliofs_fuse::watch::spawn(cmd).context("cannot start the watcher")?;
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

/// The watcher's body: `foliofs_fuse::watch::wait_and_detach`.
pub fn watch(args: WatchArgs) -> anyhow::Result<i32> {
    // SAFETY: the server passed this descriptor for our exclusive use and
    // nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(args.fd) };
    // A session of its own: a signal to the server's process group or
    // session does not take it along.
    let _ = nix::unistd::setsid();
    foliofs_fuse::watch::wait_and_detach(fd, args.mount_id, &args.mountpoint)
        .with_context(|| format!("auto_unmount of {}", args.mountpoint.display()))?;
    Ok(0)
}

/// Why mounting failed, with what to do when the mount point lies in a
/// FUSE mount whose server died: every access to it then fails with
/// ENOTCONN, which says nothing of the cure.
fn mount_failure(e: foliofs_fuse::MountError, mountpoint: &Path) -> anyhow::Error {
    let dead = matches!(&e, foliofs_fuse::MountError::Mountpoint { source, .. }
        if source.raw_os_error() == Some(libc::ENOTCONN));
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

/// Mounts and serves until unmounted; reports readiness on `ready`.
fn serve(
    args: &MountArgs,
    source: &Path,
    opts: &MountOpts,
    opened: Opened,
    ready: Option<File>,
) -> anyhow::Result<i32> {
    let read_only = opened.read_only || opts.fuse.read_only == Some(true);
    // A ramfs's work comes as chains of requests each waiting on the last
    // (lookup, create, write, setattr per file); an image's comes with its
    // pushes and parallel reads, which need the CPU a poller would take: a
    // cold walk of an image ran 10-20% slower with one polling.
    // Whether polling pays is measured on this host (the same machine kind
    // has seen it take a round trip from 14 to 9 µs, and from 21 to 34);
    // over io_uring a request is answered on its caller's CPU and nothing
    // polls.
    let uring_likely = opts.fuse.io_uring != Some(false)
        && std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
            .is_ok_and(|s| s.trim() == "Y");
    let spin = opts.fuse.spin.unwrap_or_else(|| {
        if opened.writable && !uring_likely {
            let (window, why) = foliofs_fuse::spin::default_window();
            log::info!("polling for the next request: {window:?} ({why})");
            window
        } else {
            Duration::ZERO
        }
    });
    let cfg = MountConfig {
        mountpoint: args.mountpoint.clone(),
        fsname: opts
            .fuse
            .fsname
            .clone()
            .unwrap_or_else(|| open::shown(source)),
        flags: opts.fuse.flags,
        read_only,
        allow_other: opts.fuse.allow_other,
        threads: opts.fuse.threads.unwrap_or(if opened.writable {
            ramfs_threads(!spin.is_zero())
        } else {
            THREADS
        }),
        spin,
        read_ahead_kb: read_only.then_some(foliofs_fuse::IMAGE_READ_AHEAD_KB),
        server: ServerConfig {
            ttl: TTL,
            read_only,
            overrides: if !opened.writable {
                // romfs stores no owners (Linux reports 0:0): its files
                // belong to whoever mounts it, as on vfat, unless uid=/gid=
                // say otherwise. EROFS keeps the image's.
                let own = opened.format == "romfs";
                Overrides {
                    uid: opts
                        .fuse
                        .uid
                        .or_else(|| own.then(|| nix::unistd::getuid().as_raw())),
                    gid: opts
                        .fuse
                        .gid
                        .or_else(|| own.then(|| nix::unistd::getgid().as_raw())),
                    umask: opts.fuse.umask,
                }
            } else {
                Overrides::default()
            },
            debug: opts.fuse.debug,
            writeback: opts.fuse.writeback,
            requests: Default::default(),
            push_budget: opened.push_budget,
            // Direct reads wait for the device, whose queue serves several
            // at once; buffered ones come from the page cache, where more
            // threads would only take the CPU the reader needs.
            push_readers: if opts.image.open.io_mode == IoMode::Direct {
                PUSH_READERS_DIRECT
            } else {
                1
            },
            record: opened.record.clone(),
            profile: opened.profile.clone(),
            passthrough: opened.passthrough.as_ref().map(|(p, _)| p.clone()),
            // Where root let the kernel offer it (`enable_uring`), unless
            // refused by name.
            io_uring: opts.fuse.io_uring != Some(false),
        },
    };
    let mounted = match foliofs_fuse::mount(opened.fs, &cfg) {
        Ok(m) => m,
        Err(e) => return report_failure(ready, mount_failure(e, &args.mountpoint)),
    };
    let info = mounted.info().clone();
    let mut shown = opened.shown;
    if opts.fuse.io_uring == Some(true) && mounted.transport() != "io_uring" {
        drop(mounted);
        let _ = foliofs_fuse::unmount(&info.mountpoint);
        return report_failure(
            ready,
            anyhow::anyhow!(
                "mount option `io_uring`: the kernel did not offer FUSE over io_uring (Linux 6.14, CONFIG_FUSE_IO_URING, and root writing Y to /sys/module/fuse/parameters/enable_uring)"
            ),
        );
    }
    push_option(&mut shown, &format!("transport={}", mounted.transport()));
    if let Some((p, asked)) = &opened.passthrough {
        // INIT is over: the kernel took passthrough or it did not.
        if p.active() {
            push_option(&mut shown, "data=passthrough");
        } else if *asked {
            drop(mounted);
            let _ = foliofs_fuse::unmount(&info.mountpoint);
            return report_failure(
                ready,
                anyhow::anyhow!(
                    "mount option `passthrough`: the kernel did not offer FUSE passthrough (CONFIG_FUSE_PASSTHROUGH)"
                ),
            );
        } else {
            // The files live in backing files still, read and written
            // through the server.
            push_option(&mut shown, "data=server");
        }
    } else if opened.format == "ramfs" {
        push_option(&mut shown, "data=server");
    }
    // Held until this process ends, whichever way: its closing is what
    // tells the watcher the server is gone.
    let _watch = if opts.fuse.auto_unmount {
        match spawn_watcher(&info) {
            Ok(w) => Some(w),
            Err(e) => {
                drop(mounted);
                let _ = foliofs_fuse::unmount(&info.mountpoint);
                return report_failure(ready, e.context("auto_unmount"));
            }
        }
    } else {
        None
    };
    let pid = std::process::id();
    if opts.fuse.allow_other {
        shown.push_str(",allow_other");
    }
    if opts.fuse.debug {
        shown.push_str(",debug");
    }
    if opts.fuse.auto_unmount {
        shown.push_str(",auto_unmount");
    }
    let state = MountState {
        mount_id: info.mount_id,
        pid,
        source: info.source.clone(),
        mountpoint: info.mountpoint.clone(),
        format: opened.format.to_owned(),
        options: shown,
    };
    if let Err(e) = state.save() {
        log::warn!("cannot record the mount for `foliofs mounts`: {e}");
    }
    let remote = is_remote(source) || opts.image.devices.iter().any(|d| is_remote(d));
    let mut gauges: Vec<_> = opened.gauge.into_iter().collect();
    if remote {
        gauges.push(remote_gauge());
    }
    let stats =
        foliofs_fuse::published::publish(info.mount_id, cfg.server.requests.clone(), gauges);
    if let Some(mut r) = ready {
        let _ = writeln!(r, "ready");
    }
    let res = mounted.run();
    MountState::remove(info.mount_id, pid);
    stats.finish();
    res.context("serving the mount failed")?;
    Ok(0)
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
