//! Opening what a mount serves: an image, checked and with its profiles,
//! or a new ramfs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use foliofs_block::remote::is_remote;
use foliofs_block::IoMode;
use foliofs_fuse::format_size;
use foliofs_vfs::FileSystem;

use crate::open::{self, Image};
use crate::options::MountOpts;

/// An opened source, ready to be served.
pub(super) struct Opened {
    pub(super) fs: Arc<dyn FileSystem>,
    pub(super) format: &'static str,
    pub(super) read_only: bool,
    /// A format that can change (so owner overrides and long caches do not apply).
    pub(super) writable: bool,
    /// The format's effective options, as `foliofs mounts` shows them.
    pub(super) shown: String,
    /// Bytes the server may push into the kernel unasked (0: none).
    pub(super) push_budget: u64,
    /// `record=`: where the profile goes, and the image's key.
    pub(super) record: Option<(PathBuf, foliofs_fuse::ImageKey)>,
    /// `prefetch=`: the profile to replay, if it is this image's.
    pub(super) profile: Option<Arc<foliofs_fuse::Profile>>,
    /// A ramfs whose files live in backing files: passed through where the
    /// kernel takes it, and whether the user asked for that by name.
    pub(super) passthrough: Option<(Arc<foliofs_fuse::Passthrough>, bool)>,
    /// Figures the mount publishes beside its request counts.
    pub(super) gauge: Option<foliofs_fuse::records::published::Gauge>,
}

/// The ramfs state a supervised server is handed: its files, and whether
/// an earlier server left them.
pub(super) type HandedState = Option<foliofs_ramfs::StateFiles>;

pub(super) fn open_source(
    fstype: &str,
    source: &Path,
    opts: &MountOpts,
    state: HandedState,
    restarted: bool,
) -> anyhow::Result<Opened> {
    if fstype == "ramfs" {
        return open_ramfs(opts, state, restarted);
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
    if open::reads_remote(source, &opts.image.devices) {
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
    // A push of a remote image's file costs a fetch the kernel did not
    // ask for (every name a program looks up, read or not): off unless
    // asked for, or a profile says what to push.
    let default = if open::reads_remote(source, &opts.image.devices) && opts.fuse.prefetch.is_none()
    {
        0
    } else {
        foliofs_fuse::server::push::DEFAULT_PUSH_BUDGET
    };
    let budget = opts.fuse.push.unwrap_or(default);
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

fn open_ramfs(opts: &MountOpts, state: HandedState, restarted: bool) -> anyhow::Result<Opened> {
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
    let fs = Arc::new(match state {
        Some(files) => supervised_ramfs(&ro, files, restarted)?,
        None => ramfs_with_data_path(&ro, opts)?,
    });
    if let Some(line) = limits_warning(&fs) {
        log::warn!("{line}");
    }
    let passthrough: Option<(Arc<foliofs_fuse::Passthrough>, bool)> = fs
        .is_backed()
        .then(|| (Arc::default(), ro.passthrough == Some(true)));
    let gauge = {
        let fs = fs.clone();
        let p = passthrough.as_ref().map(|(p, _)| p.clone());
        foliofs_fuse::records::published::Gauge {
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

/// The line that says which memory limits this server runs under are
/// below the ramfs's `size=`, if any are.
fn limits_warning(fs: &foliofs_ramfs::RamFs) -> Option<String> {
    let below = fs.limits_below_size();
    if below.is_empty() {
        return None;
    }
    let size = fs.statfs().ok()?.blocks * u64::from(fs.info().block_size);
    let named: Vec<String> = below
        .iter()
        .map(|l| {
            format!(
                "{} is {} ({} free)",
                l.name,
                format_size(l.limit),
                about(l.left)
            )
        })
        .collect();
    let tail = if fs.is_backed() {
        // Measured: a passthrough write is charged to the writer's cgroup,
        // as a tmpfs write is, and never reaches this server.
        "writes this server makes past it fail with ENOSPC; data written through passthrough is charged to the writing program's memory cgroup, not to this one"
    } else {
        "writes past what it leaves fail with ENOSPC"
    };
    Some(format!(
        "ramfs: size={} is above this server's memory limit: {}; {tail}",
        format_size(size),
        named.join(", ")
    ))
}

/// `n` bytes to one decimal in the largest binary unit it reaches (`183.4M`).
fn about(n: u64) -> String {
    let mut v = n as f64;
    for unit in ["", "K", "M", "G", "T"] {
        if v < 1024.0 || unit == "T" {
            return if unit.is_empty() {
                format!("{n}")
            } else {
                format!("{v:.1}{unit}")
            };
        }
        v /= 1024.0;
    }
    unreachable!("the last unit returns")
}

/// The state a supervised ramfs's supervisor makes and holds for its
/// servers: with a tmpfs for its files where they are passed through to
/// the kernel (as `ramfs_with_data_path` decides for one unsupervised).
pub(super) fn ramfs_state(opts: &MountOpts) -> anyhow::Result<foliofs_ramfs::StateFiles> {
    let ro = open::ramfs_options(opts)?;
    let backed = match passthrough_refusal(&ro, opts) {
        None => match foliofs_ramfs::StateFiles::create(&ro, true) {
            Ok(f) => return Ok(f),
            Err(e) => Some(format!(
                "mounting the tmpfs that holds the files failed: {e}"
            )),
        },
        why => why,
    };
    if let Some(why) = backed.filter(|_| ro.passthrough == Some(true)) {
        bail!("mount option `passthrough`: {why}");
    }
    foliofs_ramfs::StateFiles::create(&ro, false).context("cannot make the ramfs's state files")
}

/// Why a ramfs with these options cannot outlive its server, if it
/// cannot: kept in the server (no passthrough), `huge=always` blocks are
/// huge pages only where the kernel gives shared memory huge pages, and a
/// supervised ramfs keeps its blocks in shared memory.
pub(super) fn unsupervisable_ramfs(opts: &MountOpts) -> anyhow::Result<Option<String>> {
    let ro = open::ramfs_options(opts)?;
    if !ro.huge || passthrough_refusal(&ro, opts).is_none() {
        return Ok(None);
    }
    if foliofs_ramfs::shared_huge_pages() {
        return Ok(None);
    }
    Ok(Some(
        "`huge=always` blocks kept in the server are huge pages of its own memory: this kernel gives shared memory none (/sys/kernel/mm/transparent_hugepage/shmem_enabled is `never`)"
            .to_owned(),
    ))
}

/// Why a ramfs with these options cannot pass its files through, if it
/// cannot (`nopassthrough` included).
fn passthrough_refusal(ro: &foliofs_ramfs::Options, opts: &MountOpts) -> Option<String> {
    if ro.passthrough == Some(false) {
        Some("nopassthrough".to_owned())
    } else if opts.fuse.writeback {
        Some("the kernel passes no file through while it caches writes (`writeback`)".to_owned())
    } else if !foliofs_fuse::kernel_at_least(6, 9) {
        Some("FUSE passthrough needs Linux 6.9 or later".to_owned())
    } else if !foliofs_fuse::mount::privilege::is_machine_root() {
        Some(
            "FUSE passthrough needs CAP_SYS_ADMIN of the machine: the kernel lets only such a server hand it backing files (a user's ramfs keeps its files in the server)"
                .to_owned(),
        )
    } else {
        None
    }
}

/// A supervised server's ramfs: new, or as the one before left it.
fn supervised_ramfs(
    ro: &foliofs_ramfs::Options,
    files: foliofs_ramfs::StateFiles,
    restarted: bool,
) -> anyhow::Result<foliofs_ramfs::RamFs> {
    if restarted {
        foliofs_ramfs::RamFs::recover(ro, files)
            .context("the ramfs the last server left cannot be read back")
    } else {
        Ok(foliofs_ramfs::RamFs::supervised(ro, files)?)
    }
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
    } else if let Some(why) = passthrough_refusal(ro, opts) {
        Some(why)
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
