//! Serving a mount in this process: its FUSE settings, the record
//! `foliofs mounts` shows, and its published counts.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use foliofs_block::IoMode;
use foliofs_fuse::{MountConfig, Overrides, ServerConfig};

use crate::open;

use super::source::Opened;
use super::watch::{mount_failure, spawn_watcher};
use super::{report_failure, MountArgs};
use crate::options::MountOpts;
use foliofs_fuse::records::MountState;

/// Server threads: enough for the kernel's parallel readahead and a
/// metadata walk at once on a small machine.
pub(super) const THREADS: usize = 4;

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
pub(super) fn ramfs_threads(polling: bool) -> usize {
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

/// The remote counters of this process (bytes read and fetched, cache
/// hits and misses, cached chunks found damaged, fetch errors, retries), published as group `remote`:
/// one mount is one process, so the process's counters are the mount's.
fn remote_gauge() -> foliofs_fuse::records::published::Gauge {
    foliofs_fuse::records::published::Gauge {
        name: "remote",
        read: Box::new(|| {
            let r = foliofs_block::remote::stats();
            vec![
                ("bytes_read", r.bytes_read),
                ("bytes_fetched", r.bytes_fetched),
                ("cache_hits", r.cache_hits),
                ("cache_misses", r.cache_misses),
                ("cache_corrupt", r.cache_corrupt),
                ("fetch_corrupt", r.fetch_corrupt),
                ("fetch_errors", r.fetch_errors),
                ("retries", r.retries),
                ("requests", r.requests),
            ]
        }),
    }
}

/// What the mount publishes beside its request counts: the format's own
/// figures, and a remote image's.
pub(super) fn gauges(
    source: &Path,
    opts: &MountOpts,
    own: Option<foliofs_fuse::records::published::Gauge>,
) -> Vec<foliofs_fuse::records::published::Gauge> {
    let remote = crate::open::reads_remote(source, &opts.image.devices);
    let mut gauges: Vec<_> = own.into_iter().collect();
    if remote {
        gauges.push(remote_gauge());
    }
    gauges
}

/// The session's options `foliofs mounts` shows after the format's.
pub(super) fn add_session_options(shown: &mut String, opts: &MountOpts) {
    for (on, name) in [
        (opts.fuse.allow_other, "allow_other"),
        (opts.fuse.debug, "debug"),
        (opts.fuse.auto_unmount, "auto_unmount"),
    ] {
        if on {
            push_option(shown, name);
        }
    }
}

/// The polling window a mount settled on, as the option that asks for
/// it: the default is measured at mount, so `foliofs mounts` says which.
pub(super) fn spin_option(spin: Duration) -> String {
    if spin.is_zero() {
        "nospin".to_owned()
    } else {
        format!("spin={}", spin.as_micros())
    }
}

/// Appends `,item` (or `item` to an empty list).
pub(super) fn push_option(list: &mut String, item: &str) {
    if !list.is_empty() {
        list.push(',');
    }
    list.push_str(item);
}

/// The source `/proc/mounts` shows: `fsname=`, else the source (a URL
/// without its secrets).
pub(super) fn fsname(opts: &MountOpts, source: &Path) -> String {
    opts.fuse
        .fsname
        .clone()
        .unwrap_or_else(|| open::shown(source))
}

/// The mount's FUSE settings, from its options and what it serves.
pub(super) fn config(
    args: &MountArgs,
    source: &Path,
    opts: &MountOpts,
    opened: &Opened,
) -> MountConfig {
    let read_only = opened.read_only || opts.fuse.read_only == Some(true);
    // A ramfs's work comes as chains of requests each waiting on the last
    // (lookup, create, write, setattr per file); an image's comes with its
    // pushes and parallel reads, which need the CPU a poller would take: a
    // cold walk of an image ran 10-20% slower with one polling.
    // Whether polling pays is measured on this host (the same machine kind
    // has seen it take a round trip from 14 to 9 µs, and from 21 to 34);
    // over io_uring, which only an explicit `io_uring` asks for, nothing
    // polls.
    let io_uring = opts.fuse.io_uring == Some(true);
    let spin = opts.fuse.spin.unwrap_or_else(|| {
        if opened.writable && !io_uring {
            let (window, why) = foliofs_fuse::server::spin::default_window();
            log::info!("polling for the next request: {window:?} ({why})");
            window
        } else {
            Duration::ZERO
        }
    });
    MountConfig {
        mountpoint: args.mountpoint.clone(),
        fsname: fsname(opts, source),
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
            // Only when asked by name. The kernel queues a request on its
            // caller's CPU, but the reply wakes the caller while that CPU
            // still runs the ring's thread, so the scheduler moves the
            // caller to an idle CPU: 3.3 moves per create on 2 CPUs
            // (`sched:sched_migrate_task`), and every ramfs workload of
            // `foliofs bench smallfiles` ran slower than over /dev/fuse
            // (creates 11.4x tmpfs against 7.5x).
            io_uring,
        },
    }
}

/// Mounts and serves until unmounted; reports readiness on `ready`.
pub(super) fn serve(
    args: &MountArgs,
    source: &Path,
    opts: &MountOpts,
    opened: Opened,
    ready: Option<File>,
) -> anyhow::Result<i32> {
    let cfg = config(args, source, opts, &opened);
    let mounted = match foliofs_fuse::mount(opened.fs.clone(), &cfg) {
        Ok(m) => m,
        Err(e) => return report_failure(ready, mount_failure(e, &args.mountpoint)),
    };
    serve_mounted(source, opts, opened, &cfg, mounted, ready)
}

/// Serves `mounted` (made for `opened` with `cfg`) until unmounted, once
/// what INIT settled is what the options asked for; reports readiness on
/// `ready`.
pub(super) fn serve_mounted(
    source: &Path,
    opts: &MountOpts,
    opened: Opened,
    cfg: &MountConfig,
    mounted: foliofs_fuse::Mounted,
    ready: Option<File>,
) -> anyhow::Result<i32> {
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
    push_option(&mut shown, &spin_option(cfg.spin));
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
    // A server alone: its death is the mount's (a ramfs's files with it).
    push_option(&mut shown, "survives=nothing");
    add_session_options(&mut shown, opts);
    let state = MountState::new(&info, pid, opened.format, shown);
    if let Err(e) = state.save() {
        log::warn!("cannot record the mount for `foliofs mounts`: {e}");
    }
    let gauges = gauges(source, opts, opened.gauge);
    let stats = foliofs_fuse::records::published::publish(
        info.mount_id,
        cfg.server.requests.clone(),
        gauges,
    );
    if let Some(mut r) = ready {
        let _ = writeln!(r, "ready");
    }
    let res = mounted.run();
    MountState::remove(info.mount_id, pid);
    stats.finish();
    res.context("serving the mount failed")?;
    Ok(0)
}
