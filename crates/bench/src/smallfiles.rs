//! The small-file section: a real source tree unpacked, read back and
//! removed, and many tiny files created and unlinked, on foliofs's ramfs
//! beside the kernel's tmpfs and ramfs. Each file costs FUSE several round
//! trips, so beside the times it reports the foliofs server's requests per
//! opcode for each workload.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use foliofs_vfs::chain_line;

use crate::env::{have, BenchEnv};
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::progress;
use crate::stats::summarize;
use crate::timing::time_cmd;
use crate::Config;
use foliofs_fuse::records::published::{self as mount_stats, Counts};

/// The tree to unpack: the newest Python standard library under /usr/lib
/// (many small source files, a few large ones, a few hundred directories).
pub(crate) fn python_stdlib() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let minor = name.strip_prefix("python3.")?.parse::<u32>().ok()?;
            let p = e.path();
            p.join("os.py").is_file().then_some((minor, p))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// Entries (files, directories, links) under `dir`, `dir` itself left out.
fn count_entries(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        n += 1;
        if e.file_type()?.is_dir() {
            n += count_entries(&e.path())?;
        }
    }
    Ok(n)
}

/// `n` files of 100 bytes in a new directory `dir` (open, write, close
/// each, as a build or a mail spool does); returns seconds.
fn create_files(dir: &Path, n: u64) -> Result<f64> {
    fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    let buf = [b'x'; 100];
    let start = Instant::now();
    for i in 0..n {
        let p = dir.join(format!("f{i}"));
        let mut f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
        f.write_all(&buf)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Unlinks every other file [`create_files`] made; returns seconds.
fn unlink_half(dir: &Path, n: u64) -> Result<f64> {
    let start = Instant::now();
    for i in (0..n).step_by(2) {
        let p = dir.join(format!("f{i}"));
        fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Writes of one byte to one place in a new write-only file in `dir`;
/// returns microseconds per write. On a foliofs ramfs each is one WRITE
/// request and its reply with next to no work between: the cost of a
/// round trip, which bounds from below what a FUSE file system can do.
fn one_byte_writes(dir: &Path, n: u64) -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let p = dir.join("trip");
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let write = || {
        f.write_at(b"x", 0)
            .with_context(|| format!("writing {}", p.display()))
    };
    // The first write allocates the file's block.
    for _ in 0..10 {
        write()?;
    }
    let start = Instant::now();
    for _ in 0..n {
        write()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// `getxattr(2)`s of a name no file has, on one open file in `dir`;
/// returns microseconds per call. FUSE caches no extended attribute, so on
/// foliofs each is one GETXATTR request and its reply on every data path
/// (where a passed-through ramfs answers a write in the kernel, the
/// 1-byte write is no round trip any more): the cost of one round trip.
fn missing_xattr_reads(dir: &Path, n: u64) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let p = dir.join("probe");
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let name = c"user.foliofs.bench.missing";
    let get = || {
        // SAFETY: a valid descriptor, a NUL-terminated name, and a zero-sized
        // buffer (the call only says how long the value is, or that there
        // is none).
        let r = unsafe { libc::fgetxattr(f.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) };
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA | libc::EOPNOTSUPP) if r < 0 => Ok(()),
            _ if r >= 0 => anyhow::bail!(
                "{} has {name:?}, which the probe expects absent",
                p.display()
            ),
            _ => Err(e).with_context(|| format!("getxattr of {}", p.display())),
        }
    };
    for _ in 0..10 {
        get()?;
    }
    let start = Instant::now();
    for _ in 0..n {
        get()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// Requests of `counts` whose caller waits for the reply: all but those
/// the kernel sends without waiting (FORGET has no reply; a file's RELEASE
/// goes in the background).
fn waited(counts: &Counts) -> u64 {
    counts
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "forget" | "release" | "interrupt"))
        .filter(|(k, _)| !foliofs_fuse::EXTRA_NAMES.contains(&k.as_str()))
        .map(|(_, n)| n)
        .sum()
}

/// What round trips alone cost a workload, against the reference's whole
/// time, and how far the row itself is above it: the requests that waited
/// times one round trip. A FUSE server cannot go below it however little
/// it does per request. Nor below that plus the reference's own time:
/// the names, inodes and pages of the workload are the kernel's work on a
/// FUSE mount too (with passthrough its pages are a tmpfs's), done
/// besides the waiting.
fn floor_line(row: &Row, trip_us: f64, trips: &Trips, reference: &Row) -> Option<String> {
    let parts: Vec<String> = trips
        .iter()
        .filter(|(key, _)| !PROBES.contains(key))
        .filter_map(|(key, counts)| {
            let t = summarize(reference.runs.get(key)?)?.median;
            let floor = waited(counts) as f64 * trip_us * 1e-6;
            let own = summarize(row.runs.get(key)?)?.median;
            (t > 0.0 && floor > 0.0).then(|| {
                format!(
                    "{key} {:.1}x, the row at {:.2}x its floor; {:.1}x with the reference's own time, the row at {:.2}x that",
                    floor / t,
                    own / floor,
                    (floor + t) / t,
                    own / (floor + t)
                )
            })
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "round-trip floor of {} / {}: {} (the requests each workload waited on, times one round trip of {trip_us:.2} µs, the missing-xattr read's median; then that plus what {} took itself: the workload's own work in the kernel, its names, inodes and pages, which a FUSE mount's kernel does as well as waiting)",
            row.label,
            reference.label,
            parts.join("; "),
            reference.label
        )
    })
}

/// The columns that measure a single call, not a workload.
const PROBES: [&str; 2] = ["trip", "xattr"];

/// The polling window the foliofs mount at `dir` settled on (`spin=US`
/// or `nospin`, as `foliofs mounts` shows it): the default is measured at
/// mount, so two mounts of one run can differ, and the round trip with it.
pub(crate) fn polling_of(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let m = foliofs_fuse::find_mount(&dir).ok().flatten()?;
    let state = foliofs_fuse::records::MountState::find(&m)?;
    state
        .options
        .split(',')
        .find(|o| *o == "nospin" || o.starts_with("spin="))
        .map(str::to_owned)
}

/// The live mount id of a foliofs mount at `dir`, to find its counts.
pub(crate) fn mount_id(dir: &Path) -> Option<u64> {
    let dir = dir.canonicalize().ok()?;
    foliofs_fuse::find_mount(&dir)
        .ok()
        .flatten()
        .filter(|m| m.fs_type == foliofs_fuse::FS_TYPE)
        .map(|m| m.mount_id)
}

struct Plan {
    label: &'static str,
    kind: &'static str,
    how: How,
}

/// Requests per workload of the last round of the foliofs row.
type Trips = Vec<(&'static str, Counts)>;

/// Ratios of a row to the reference per workload: the median of the
/// rounds' own ratios (each round ran both rows back to back) and the best
/// run's against the best run.
fn ratio_line(row: &Row, reference: &Row, columns: &[Column]) -> Option<String> {
    let mut parts = Vec::new();
    for c in columns {
        let (Some(a), Some(b)) = (row.runs.get(c.key), reference.runs.get(c.key)) else {
            continue;
        };
        if a.len() != b.len() || a.is_empty() {
            continue;
        }
        let per_round: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        let (Some(med), Some(best_a), Some(best_b)) =
            (summarize(&per_round), summarize(a), summarize(b))
        else {
            continue;
        };
        parts.push(format!(
            "{} {:.1}x (best/best {:.1}x)",
            c.key,
            med.median,
            best_a.min / best_b.min
        ));
    }
    (!parts.is_empty())
        .then(|| format!("{} / {}: {}", row.label, reference.label, parts.join(", ")))
}

/// The row's round trip set against the host's thread wake-up (a pipe
/// ping-pong, [`crate::wakeup`]) measured in the same rounds. A FUSE round
/// trip holds at least one wake-up of the caller and the crossings into
/// and out of the kernel on both sides; no server, however little it does,
/// takes less than that, so near 1x the round trip is at the host's floor.
fn wakeup_line(row: &Row, wakeups: &[crate::wakeup::Wakeup]) -> Option<String> {
    let trip = row.runs.get("xattr").filter(|t| t.len() == wakeups.len())?;
    let mut parts = Vec::new();
    for (what, pick) in [
        (
            "on one CPU",
            (|w: &crate::wakeup::Wakeup| w.same_cpu_us) as fn(&_) -> _,
        ),
        ("across two", |w| w.cross_cpu_us),
    ] {
        let host: Option<Vec<f64>> = wakeups.iter().map(pick).collect();
        let Some(host) = host else { continue };
        let per_round: Vec<f64> = trip.iter().zip(&host).map(|(t, h)| t / h).collect();
        let (Some(med), Some(t), Some(h)) =
            (summarize(&per_round), summarize(trip), summarize(&host))
        else {
            continue;
        };
        parts.push(format!(
            "{:.2}x the wake-up {what} (median {:.1} µs; best/best {:.2}x)",
            med.median,
            h.median,
            t.min / h.min
        ));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "round trip of {} against the host's thread wake-up (a pipe ping-pong, measured in the same rounds): {}",
            row.label,
            parts.join("; ")
        )
    })
}

/// Untar, read back and remove a real tree, then `N` small creates and
/// `N/2` unlinks, on foliofs ramfs, tmpfs and the kernel's ramfs.
pub fn smallfiles(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let mut notes = Vec::new();
    let n = cfg.small_files;
    // The archive, made once; the same page-cached file feeds every row.
    let tree = match python_stdlib() {
        None => {
            notes.push(
                "no Python standard library under /usr/lib (python3.N/os.py): untar, read-back and rm -rf skipped".into(),
            );
            None
        }
        Some(_) if !have("tar") => {
            notes.push("tar is not installed: untar, read-back and rm -rf skipped".into());
            None
        }
        Some(src) => {
            progress(cfg, &format!("[smallfiles] archiving {}", src.display()));
            let archive = env.dir.join("smallfiles.tar");
            let name = src.file_name().context("the tree has no name")?.to_owned();
            let parent = src.parent().context("the tree has no parent")?;
            super::env::run(
                Command::new("tar")
                    .arg("cf")
                    .arg(&archive)
                    .arg("-C")
                    .arg(parent)
                    .arg(&name),
            )?;
            let entries = count_entries(&src)? + 1;
            let bytes = fs::metadata(&archive)?.len();
            notes.push(format!(
                "tree: {} ({entries} entries, a {} MB tar); read-back = du -s, then cat of every file",
                src.display(),
                bytes / 1_000_000
            ));
            Some((archive, name, entries))
        }
    };
    let mut columns = Vec::new();
    if tree.is_some() {
        for (key, label) in [
            ("untar", "tar x"),
            ("read", "du + cat all"),
            ("rm", "rm -rf"),
        ] {
            columns.push(Column {
                key,
                label,
                unit: Unit::Seconds,
            });
        }
    }
    columns.push(Column {
        key: "create",
        label: "creates",
        unit: Unit::Seconds,
    });
    columns.push(Column {
        key: "unlink",
        label: "unlinks",
        unit: Unit::Seconds,
    });
    columns.push(Column {
        key: "trip",
        label: "1-byte write",
        unit: Unit::Micros,
    });
    columns.push(Column {
        key: "xattr",
        label: "round trip",
        unit: Unit::Micros,
    });
    let writes = n / 5;
    notes.push(format!(
        "creates: {n} files of 100 bytes in one directory (open, write, close); unlinks: every other one of them; 1-byte write: {writes} pwrites of one byte to one place in a write-only file (one round trip each on the server's data path; a passed-through ramfs writes in the kernel); round trip: {writes} getxattr calls of a name the file lacks (one GETXATTR request each on every foliofs row: FUSE caches no extended attribute)"
    ));

    let plans = [
        Plan {
            label: "foliofs ramfs",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: String::new(),
            },
        },
        // What polling for the next request (`spin=`, on by default for a
        // ramfs) buys, in the same rounds.
        Plan {
            label: "foliofs ramfs, nospin",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: "nospin".into(),
            },
        },
        // The default over FUSE's io_uring, where the run has it.
        Plan {
            label: "foliofs ramfs, io_uring",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: "io_uring".into(),
            },
        },
        // Root's ramfs passes its files through to the kernel (the row
        // above); this one keeps them in the server, as a user's does.
        Plan {
            label: "foliofs ramfs, nopassthrough",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: "nopassthrough".into(),
            },
        },
        Plan {
            label: "kernel tmpfs",
            kind: "kernel",
            how: How::KernelMem {
                fstype: "tmpfs",
                opts: String::new(),
            },
        },
        Plan {
            label: "kernel ramfs",
            kind: "kernel",
            how: How::KernelMem {
                fstype: "ramfs",
                opts: String::new(),
            },
        },
    ];
    let reference = plans
        .iter()
        .position(|p| p.label == "kernel tmpfs")
        .expect("a tmpfs row");
    // The rows whose requests are counted: the default's (the same with or
    // without polling), and the server's data path.
    let counted = [0, 2];
    let mut rows: Vec<Row> = plans
        .iter()
        .map(|p| {
            let mut row = Row::new(p.label, p.kind);
            if matches!(p.how, How::KernelMem { .. }) && !env.root {
                row.note = Some("kernel mounts need root".into());
            } else if matches!(p.how, How::Foliofs { .. }) && !Path::new("/dev/fuse").exists() {
                row.note = Some("/dev/fuse is missing".into());
            }
            row
        })
        .collect();
    let mut trips: [Trips; 2] = Default::default();
    // The host's wake-up cost, measured in every round beside the rows,
    // so the round trip can be set against it (see `wakeup_line`).
    let mut wakeups = Vec::new();
    // Row → the polling its mount settled on, round by round.
    let mut polling: Vec<Vec<String>> = vec![Vec::new(); plans.len()];
    for round in 0..cfg.runs {
        wakeups.push(crate::wakeup::Wakeup::measure());
        for (i, (plan, row)) in plans.iter().zip(rows.iter_mut()).enumerate() {
            if row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!(
                    "[smallfiles] round {}/{}: {}",
                    round + 1,
                    cfg.runs,
                    plan.label
                ),
            );
            let mut these: Trips = Vec::new();
            let r = (|| -> Result<()> {
                let m = Mounted::new(env, &plan.how, Path::new("none"), &env.fresh_dir("mnt")?)?;
                let id = mount_id(&m.dir);
                if matches!(plan.how, How::Foliofs { .. }) {
                    polling[i].push(polling_of(&m.dir).unwrap_or_else(|| "?".into()));
                }
                // A mount this new may not have published its counts yet:
                // none published is none counted (as in `counted`), or the
                // first workload's requests would go unreported.
                let mut last = id.map(|id| mount_stats::read_settled(id).unwrap_or_default());
                let mut measure = |key: &'static str, v: f64, row: &mut Row| {
                    row.runs.entry(key).or_default().push(v);
                    if let Some(id) = id {
                        let now = mount_stats::read_settled(id);
                        if let (Some(a), Some(b)) = (&last, &now) {
                            these.push((key, mount_stats::delta(a, b)));
                        }
                        last = now;
                    }
                };
                if let Some((archive, name, _)) = &tree {
                    let t = time_cmd(
                        Command::new("tar")
                            .arg("xf")
                            .arg(archive)
                            .arg("-C")
                            .arg(&m.dir),
                    )?;
                    measure("untar", t, row);
                    let unpacked = m.dir.join(name);
                    let start = Instant::now();
                    super::env::run(Command::new("du").arg("-s").arg(&unpacked))?;
                    super::env::run(
                        Command::new("find")
                            .arg(&unpacked)
                            .args(["-type", "f", "-exec", "cat", "{}", "+"]),
                    )?;
                    measure("read", start.elapsed().as_secs_f64(), row);
                    let t = time_cmd(Command::new("rm").arg("-rf").arg(&unpacked))?;
                    measure("rm", t, row);
                }
                let dir = m.dir.join("small");
                let t = create_files(&dir, n)?;
                measure("create", t, row);
                let t = unlink_half(&dir, n)?;
                measure("unlink", t, row);
                let t = one_byte_writes(&m.dir, writes)?;
                measure("trip", t, row);
                let t = missing_xattr_reads(&m.dir, writes)?;
                measure("xattr", t, row);
                Ok(())
            })();
            if let Err(e) = r {
                row.note = Some(chain_line(e.as_ref()));
                row.failed = true;
            } else if let Some(c) = counted.iter().position(|&r| r == i) {
                if !these.is_empty() {
                    trips[c] = these;
                }
            }
        }
    }
    for (i, row) in rows.iter().enumerate() {
        if i != reference && row.note.is_none() {
            if let Some(l) = ratio_line(row, &rows[reference], &columns) {
                notes.push(l);
            }
        }
    }
    for (c, &r) in counted.iter().enumerate() {
        if rows[r].note.is_none() {
            let trip = rows[r].runs.get("xattr").and_then(|v| summarize(v));
            if let Some(l) =
                trip.and_then(|t| floor_line(&rows[r], t.median, &trips[c], &rows[reference]))
            {
                notes.push(l);
            }
        }
    }
    for &r in &counted {
        notes.extend(wakeup_line(&rows[r], &wakeups));
    }
    let entries = tree.as_ref().map(|t| t.2);
    for (c, (key, counts)) in trips
        .iter()
        .enumerate()
        .flat_map(|(c, t)| t.iter().map(move |kc| (c, kc)))
    {
        let total: u64 = counts.values().sum();
        let per = match *key {
            "untar" | "read" | "rm" => entries,
            "create" => Some(n),
            "trip" | "xattr" => Some(writes),
            _ => Some(n / 2),
        };
        let per = per
            .filter(|&p| p > 0)
            .map(|p| format!(", {:.1} per entry", total as f64 / p as f64))
            .unwrap_or_default();
        notes.push(format!(
            "{} requests, {key}: {} ({total}{per})",
            rows[counted[c]].label,
            mount_stats::line(counts)
        ));
    }
    let settled: Vec<String> = rows
        .iter()
        .zip(&polling)
        .filter(|(_, p)| !p.is_empty())
        .map(|(row, p)| format!("{}: {}", row.label, p.join(" ")))
        .collect();
    if !settled.is_empty() {
        notes.push(format!(
            "polling each mount settled on at mount, round by round (measured there unless asked for): {}",
            settled.join("; ")
        ));
    }
    notes.extend(crate::rows::uring_note(env));
    Ok(Section {
        name: "smallfiles",
        title: "smallfiles: unpack, read back and remove a tree; many small creates and unlinks"
            .into(),
        columns,
        rows,
        reference,
        pairs: Vec::new(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pair_rounds_and_best_runs() {
        let mut a = Row::new("foliofs ramfs", "foliofs");
        a.runs.insert("create", vec![4.0, 9.0, 6.0]);
        let mut b = Row::new("kernel tmpfs", "kernel");
        b.runs.insert("create", vec![1.0, 3.0, 1.0]);
        let cols = [Column {
            key: "create",
            label: "creates",
            unit: Unit::Seconds,
        }];
        // Per round 4, 3, 6: median 4; best 4 against best 1.
        assert_eq!(
            ratio_line(&a, &b, &cols).unwrap(),
            "foliofs ramfs / kernel tmpfs: create 4.0x (best/best 4.0x)"
        );
        b.runs.clear();
        assert!(ratio_line(&a, &b, &cols).is_none());
    }

    #[test]
    fn the_round_trip_is_set_against_the_wake_up_of_its_own_round() {
        use crate::wakeup::Wakeup;
        let mut a = Row::new("foliofs ramfs", "foliofs");
        a.runs.insert("xattr", vec![12.0, 30.0, 16.0]);
        let w = |same, cross| Wakeup {
            same_cpu_us: Some(same),
            cross_cpu_us: cross,
        };
        // Per round 1.2, 1.5, 2.0 on one CPU: median 1.5; best 12 against
        // best 8. One round lacks the cross-CPU figure: that part is left out.
        let wakeups = [w(10.0, Some(20.0)), w(20.0, None), w(8.0, Some(16.0))];
        assert_eq!(
            wakeup_line(&a, &wakeups).unwrap(),
            "round trip of foliofs ramfs against the host's thread wake-up (a pipe ping-pong, measured in the same rounds): 1.50x the wake-up on one CPU (median 10.0 µs; best/best 1.50x)"
        );
        // A round whose row failed pairs nothing.
        assert!(wakeup_line(&a, &wakeups[..2]).is_none());
    }

    #[test]
    fn the_floor_counts_only_requests_that_wait() {
        let counts: Counts = [
            ("lookup", 100),
            ("create", 100),
            ("write", 100),
            ("getattr", 100),
            ("release", 100),
            ("forget", 7),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(waited(&counts), 400);
        let mut tmpfs = Row::new("kernel tmpfs", "kernel");
        tmpfs.runs.insert("create", vec![0.002, 0.001, 0.003]);
        // 400 waits of 10 µs = 4 ms against tmpfs's median of 2 ms.
        let trips: Trips = vec![
            ("create", counts),
            ("trip", Counts::new()),
            ("xattr", Counts::new()),
        ];
        let mut row = Row::new("foliofs ramfs", "foliofs");
        // 5 ms against the floor of 4 ms, and of 4 + 2 ms with tmpfs's own.
        row.runs.insert("create", vec![0.005, 0.004, 0.006]);
        assert_eq!(
            floor_line(&row, 10.0, &trips, &tmpfs).unwrap(),
            "round-trip floor of foliofs ramfs / kernel tmpfs: create 2.0x, the row at 1.25x its floor; 3.0x with the reference's own time, the row at 0.83x that (the requests each workload waited on, times one round trip of 10.00 µs, the missing-xattr read's median; then that plus what kernel tmpfs took itself: the workload's own work in the kernel, its names, inodes and pages, which a FUSE mount's kernel does as well as waiting)"
        );
        tmpfs.runs.clear();
        assert!(floor_line(&row, 10.0, &trips, &tmpfs).is_none());
    }

    #[test]
    fn missing_xattr_reads_time_each_call() {
        let d = tempfile::tempdir().unwrap();
        let us = missing_xattr_reads(d.path(), 100).unwrap();
        assert!(us > 0.0 && us.is_finite());
    }

    #[test]
    fn one_byte_writes_time_each_write() {
        let d = tempfile::tempdir().unwrap();
        let us = one_byte_writes(d.path(), 100).unwrap();
        assert!(us > 0.0 && us.is_finite());
        assert_eq!(fs::read(d.path().join("trip")).unwrap(), b"x");
    }

    #[test]
    fn small_files_are_made_and_half_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("s");
        create_files(&dir, 10).unwrap();
        unlink_half(&dir, 10).unwrap();
        assert_eq!(count_entries(&dir).unwrap(), 5);
        assert_eq!(fs::metadata(dir.join("f1")).unwrap().len(), 100);
    }
}
