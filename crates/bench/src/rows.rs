//! What every section's rows share: whether a row can run here and why
//! not, rounds that visit every row in turn, and the notes on what "cold"
//! meant in this run.

use std::path::{Path, PathBuf};

use anyhow::Result;
use foliofs_vfs::chain_line;
use foliofs_vfs::options::OptionError;

use crate::env::{have, BenchEnv, Cooling};
use crate::mount::{user_read_ahead_kb, How, Mounted};
use crate::report::Row;
use crate::Config;

/// Prints progress on one line of stderr.
pub fn progress(cfg: &Config, msg: &str) {
    if cfg.tty {
        eprint!("\r\x1b[K{msg}");
    } else {
        eprintln!("{msg}");
    }
}

/// What "cold" means in this run, where it is not root's dropped page
/// cache.
pub(crate) fn cold_note(env: &BenchEnv) -> Option<String> {
    if env.cooling() == Cooling::DropCaches {
        return None;
    }
    let l = env.take_leftover();
    if l.bytes == 0 {
        return None;
    }
    let mut note = if l.cached == 0 {
        "not running as root, so the page cache was not dropped (/proc/sys/vm/drop_caches needs root): each cold run instead wrote back and evicted the files it reads with posix_fadvise(POSIX_FADV_DONTNEED), and mincore(2) found none of their pages left; the disk's directories and inodes stay cached".to_owned()
    } else {
        // Of every byte the evictions were asked for, the share still cached.
        let pct = (l.cached as f64 * 100.0 / l.bytes.max(1) as f64).ceil();
        let warm = if l.cached >= l.bytes {
            "warm"
        } else {
            "partly warm"
        };
        format!(
            "not running as root, so the page cache was not dropped (/proc/sys/vm/drop_caches needs root), and posix_fadvise(POSIX_FADV_DONTNEED) left {pct:.0}% of the files the cold runs read cached (a work directory on tmpfs keeps them all: --workdir on a disk), so 'cold' figures are {warm}"
        )
    };
    if l.unchecked > 0 {
        note.push_str(&format!(
            "; {} MB in files that are not yours could not be checked",
            l.unchecked.div_ceil(1_000_000)
        ));
    }
    Some(note)
}

/// What the seq note says about each cold run.
pub(crate) fn cold_phrase(env: &BenchEnv) -> &'static str {
    match env.cooling() {
        Cooling::DropCaches => "each run drops the page cache first",
        Cooling::Evict => "each run first evicts the image from the page cache",
    }
}

/// What a user's foliofs mounts read ahead, for the sections that read
/// files through them.
pub(crate) fn read_ahead_note(env: &BenchEnv) -> Option<String> {
    if env.root {
        return None;
    }
    let kb = match user_read_ahead_kb() {
        Some(kb) => format!("{kb} KiB, "),
        None => String::new(),
    };
    Some(format!(
        "not running as root, so foliofs mounts read ahead {kb}the kernel's FUSE default: raising it to {} KiB, as root's mounts do, is writing /sys/class/bdi, which needs root, so large sequential reads may be slower than root's",
        foliofs_fuse::IMAGE_READ_AHEAD_KB
    ))
}

/// Why a row cannot run here, if it cannot.
pub(crate) fn unavailable(env: &BenchEnv, how: &How) -> Option<String> {
    match how {
        How::KernelFile { fstype, .. } if !env.root => Some(format!(
            "needs root: mounting the kernel's {fstype} (mount(2) of the image file)"
        )),
        How::KernelLoop { fstype } if !env.root => Some(format!(
            "needs root: a loop device to mount the kernel's {fstype} on"
        )),
        How::KernelMem { fstype, .. } if !env.root => {
            Some(format!("needs root: mounting a new kernel {fstype}"))
        }
        How::Squashfuse if !have("squashfuse") => Some("squashfuse is not installed".into()),
        How::Foliofs { opts, .. } if opts.split(',').any(|o| o == "io_uring") && !env.uring => {
            Some(if env.root {
                "this kernel has no FUSE over io_uring (Linux 6.14, CONFIG_FUSE_IO_URING)".into()
            } else {
                "needs root: switching FUSE over io_uring on (enable_uring)".into()
            })
        }
        How::Foliofs { .. } | How::Image { .. } | How::Squashfuse
            if !Path::new("/dev/fuse").exists() =>
        {
            Some("/dev/fuse is missing".into())
        }
        How::Foliofs {
            fstype: "ramfs",
            opts,
        } if opts.split(',').any(|o| o == "passthrough")
            && !foliofs_fuse::mount::privilege::is_machine_root() =>
        {
            Some("needs root: FUSE passthrough takes backing files only from a server with CAP_SYS_ADMIN".into())
        }
        How::Foliofs {
            fstype: "ramfs",
            opts,
        } => ramfs_options_refused(opts),
        _ => None,
    }
}

/// Why a ramfs row's options cannot be had here (`huge=always` without
/// transparent huge pages), if so: `foliofs mount -t ramfs`'s own answer.
fn ramfs_options_refused(opts: &str) -> Option<String> {
    // Supervision is the mount's, not the ramfs's.
    let items: Vec<(String, Option<String>)> = opts
        .split(',')
        .filter(|i| !i.is_empty() && !matches!(*i, "supervise" | "nosupervise"))
        .map(|i| match i.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (i.to_owned(), None),
        })
        .collect();
    let refused = foliofs_ramfs::Options::from_mount_options(&items).err()?;
    // A row's options are written here and are fine on their own; what is
    // left is why this machine cannot have them, which is the note.
    Some(match refused {
        OptionError::Conflict(why) => why,
        e => e.to_string(),
    })
}

/// Why a row has no image: a tool this machine lacks (the row is skipped)
/// or a build that went wrong (the row failed).
#[derive(Clone, Debug)]
pub(crate) struct NoImage {
    pub(crate) why: String,
    pub(crate) failed: bool,
}

impl NoImage {
    pub(crate) fn skip(why: impl Into<String>) -> NoImage {
        NoImage {
            why: why.into(),
            failed: false,
        }
    }

    pub(crate) fn failed(e: &anyhow::Error) -> NoImage {
        NoImage {
            why: chain_line(e.as_ref()),
            failed: true,
        }
    }
}

pub(crate) type Image = Result<PathBuf, NoImage>;

pub(crate) const NO_MKFS_EROFS: &str = "mkfs.erofs is not installed (erofs-utils)";

/// One row to measure: a label, how to mount, and which image.
pub(crate) struct Plan {
    pub(crate) label: String,
    pub(crate) kind: &'static str,
    pub(crate) how: How,
    pub(crate) image: Image,
    pub(crate) x: Option<u64>,
}

/// A timed workload on a mounted file system: a column key and a function
/// of the mount point giving seconds (or, for throughput columns, GB/s).
type Workload<'a> = (&'static str, &'a dyn Fn(&Path) -> Result<f64>);

/// Measures every plan with every workload, `cfg.runs` rounds. A round
/// visits every plan once, so drift in the machine (a noisy disk, other
/// load) spreads over all rows instead of landing on one. Cold workloads get
/// a fresh mount and a dropped page cache every time, so neither the
/// kernel's caches nor a FUSE server's own block cache carry over from one
/// measurement to the next.
pub(crate) fn measure_rows(
    env: &BenchEnv,
    cfg: &Config,
    section: &str,
    plans: &[Plan],
    cold: bool,
    workloads: &[Workload<'_>],
) -> Vec<Row> {
    let mut rows: Vec<Row> = plans
        .iter()
        .map(|p| {
            let mut row = Row::new(p.label.clone(), p.kind);
            row.x = p.x;
            if let Some(why) = unavailable(env, &p.how) {
                row.note = Some(why);
            } else if let Err(no) = &p.image {
                row.note = Some(format!("no image: {}", no.why));
                row.failed = no.failed;
            }
            row
        })
        .collect();
    for i in 0..cfg.runs {
        for (plan, row) in plans.iter().zip(rows.iter_mut()) {
            let Ok(image) = &plan.image else { continue };
            if row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!("[{section}] round {}/{}: {}", i + 1, cfg.runs, plan.label),
            );
            let result = (|| -> Result<()> {
                let mount = || Mounted::new(env, &plan.how, image, &env.fresh_dir("mnt")?);
                let warm = if cold { None } else { Some(mount()?) };
                for (key, work) in workloads {
                    let v = match &warm {
                        Some(m) => work(&m.dir)?,
                        None => {
                            let m = mount()?;
                            env.cool(image);
                            work(&m.dir)?
                        }
                    };
                    push(row, key, v);
                }
                Ok(())
            })();
            if let Err(e) = result {
                row.note = Some(chain_line(e.as_ref()));
                row.failed = true;
            }
        }
    }
    rows
}

pub(crate) fn push(row: &mut Row, key: &'static str, v: f64) {
    row.runs.entry(key).or_default().push(v);
}

/// The note every section with io_uring rows prints.
pub(crate) fn uring_note(env: &BenchEnv) -> Option<String> {
    env.uring.then(|| {
        format!(
            "the io_uring rows run over FUSE's io_uring, which this run switched on (/sys/module/fuse/parameters/enable_uring was {}, and is put back after); every other foliofs row runs over /dev/fuse",
            crate::env::uring_was().unwrap_or_else(|| "?".into())
        )
    })
}

/// A pair line for each foliofs row over `reference`: the median of the
/// rounds' own ratios and best over best, beside the table's ratio of
/// medians.
pub(crate) fn foliofs_pairs(rows: &[Row], reference: usize) -> Vec<(usize, usize)> {
    rows.iter()
        .enumerate()
        .filter(|(i, r)| *i != reference && r.kind == "foliofs")
        .map(|(i, _)| (i, reference))
        .collect()
}

/// Every row of `plans` without a note measured once per round, rows
/// interleaved (the machine's drift lands on all alike): `measure` gives
/// a round's figures by column; a row that fails keeps why in its note
/// and runs no more.
pub(crate) fn interleaved<P>(
    cfg: &Config,
    section: &str,
    plans: &mut [P],
    row: impl Fn(&mut P) -> &mut Row,
    mut measure: impl FnMut(&P) -> Result<Vec<(&'static str, f64)>>,
) {
    for round in 0..cfg.runs {
        for plan in plans.iter_mut() {
            if row(plan).note.is_some() {
                continue;
            }
            let label = row(plan).label.clone();
            progress(
                cfg,
                &format!("[{section}] round {}/{}: {label}", round + 1, cfg.runs),
            );
            let res = measure(plan);
            let r = row(plan);
            match res {
                Ok(figures) => {
                    for (k, v) in figures {
                        r.runs.entry(k).or_default().push(v);
                    }
                }
                Err(e) => {
                    r.note = Some(format!("failed: {e:#}"));
                    r.failed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_foliofs_row_and_only_those_is_paired_with_the_reference() {
        let rows = [
            Row::new("foliofs romfs", "foliofs"),
            Row::new("kernel erofs", "kernel"),
            Row::new("squashfuse", "fuse-peer"),
            Row::new("foliofs erofs", "foliofs"),
        ];
        assert_eq!(foliofs_pairs(&rows, 1), vec![(0, 1), (3, 1)]);
        // A foliofs reference is not paired with itself.
        assert_eq!(foliofs_pairs(&rows, 3), vec![(0, 3)]);
    }
}
