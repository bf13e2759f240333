//! The small-file section: a real source tree unpacked, read back and
//! removed, and many tiny files created and unlinked, on foliofs's ramfs
//! beside the kernel's tmpfs and ramfs. Each file costs FUSE several round
//! trips, so beside the times it reports the foliofs server's requests per
//! opcode for each workload.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use foliofs_fuse::records::published::Counts;

use crate::env::{have, BenchEnv};
use crate::mount::How;
use crate::report::{Column, Row, Section, Unit};
use crate::rows::progress;
use crate::wakeup::Wakeup;
use crate::Config;

mod notes;
mod rounds;
mod workloads;

pub(crate) use rounds::mount_id;

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

struct Plan {
    label: &'static str,
    kind: &'static str,
    how: How,
}

/// Requests per workload of the last round of the foliofs row.
type Trips = Vec<(&'static str, Counts)>;

/// The archived tree the first three workloads unpack.
struct Tree {
    archive: PathBuf,
    /// The tree's directory name, as the archive holds it.
    name: OsString,
    /// Entries in it, its top directory included.
    entries: u64,
}

/// The sizes of the workloads: `n` creates, `n/2` unlinks, `writes`
/// 1-byte writes and as many missing-xattr reads.
#[derive(Clone, Copy)]
struct Load {
    n: u64,
    writes: u64,
}

/// What the rounds gathered besides the rows' times.
struct Rounds {
    /// The counted rows' requests per workload, from their last round.
    trips: [Trips; 2],
    /// The host's thread wake-up, one per round.
    wakeups: Vec<Wakeup>,
    /// Row → the polling its mount settled on, round by round.
    polling: Vec<Vec<String>>,
}

/// Untar, read back and remove a real tree, then `N` small creates and
/// `N/2` unlinks, on foliofs ramfs, tmpfs and the kernel's ramfs.
pub fn smallfiles(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let mut notes = Vec::new();
    let load = Load {
        n: cfg.small_files,
        writes: cfg.small_files / 5,
    };
    let tree = archive_tree(env, cfg, &mut notes)?;
    let columns = columns(tree.is_some());
    let Load { n, writes } = load;
    notes.push(format!(
        "creates: {n} files of 100 bytes in one directory (open, write, close); unlinks: every other one of them; 1-byte write: {writes} pwrites of one byte to one place in a write-only file (one round trip each on the server's data path; a passed-through ramfs writes in the kernel); round trip: {writes} getxattr calls of a name the file lacks (one GETXATTR request each on every foliofs row: FUSE caches no extended attribute)"
    ));
    let plans = plans();
    let reference = plans
        .iter()
        .position(|p| p.label == "kernel tmpfs")
        .expect("a tmpfs row");
    // The rows whose requests are counted: the default's (the same with or
    // without polling), and the server's data path.
    let counted = [0, 3];
    let mut rows = rows(env, &plans);
    let rounds = rounds::run(env, cfg, &plans, &mut rows, &counted, tree.as_ref(), load);
    notes.extend(notes::comparisons(
        &rows, reference, &columns, &counted, &rounds,
    ));
    notes.extend(notes::requests(
        &rows,
        &counted,
        &rounds.trips,
        tree.as_ref().map(|t| t.entries),
        load,
    ));
    notes.extend(notes::polling(&rows, &rounds.polling));
    notes.extend(crate::rows::uring_note(env));
    Ok(Section {
        name: "smallfiles",
        title: "smallfiles: unpack, read back and remove a tree; many small creates and unlinks"
            .into(),
        columns,
        rows,
        reference,
        // Supervision's cost, row by row in the same rounds.
        pairs: vec![(0, 1), (4, 5)],
        notes,
    })
}

/// The archive of the tree to unpack, made once: the same page-cached
/// file feeds every row. `None`, with a note saying why, where the machine
/// has no tree or no tar.
fn archive_tree(env: &BenchEnv, cfg: &Config, notes: &mut Vec<String>) -> Result<Option<Tree>> {
    Ok(match python_stdlib() {
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
            crate::env::run(
                Command::new("tar")
                    .arg("cf")
                    .arg(&archive)
                    .arg("-C")
                    .arg(parent)
                    .arg(&name),
            )?;
            let entries = workloads::count_entries(&src)? + 1;
            let bytes = fs::metadata(&archive)?.len();
            notes.push(format!(
                "tree: {} ({entries} entries, a {} MB tar); read-back = du -s, then cat of every file",
                src.display(),
                bytes / 1_000_000
            ));
            Some(Tree {
                archive,
                name,
                entries,
            })
        }
    })
}

/// The table's columns: the tree's workloads where there is a tree, then
/// the small files' and the two single-call probes.
fn columns(with_tree: bool) -> Vec<Column> {
    let mut columns = Vec::new();
    if with_tree {
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
    columns
}

/// The rows, foliofs's ramfs in its variants first, the kernel's file
/// systems after.
fn plans() -> [Plan; 8] {
    [
        Plan {
            label: "foliofs ramfs",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: String::new(),
            },
        },
        // What outliving its server costs: the default keeps its state in
        // files a supervisor holds, and logs every change before it
        // answers; this one lives and dies with its server.
        Plan {
            label: "foliofs ramfs, nosupervise",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: "nosupervise".into(),
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
        // Supervision's cost on that path, whose changes it logs with
        // every block a write allocates.
        Plan {
            label: "foliofs ramfs, nopassthrough, nosupervise",
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: "nopassthrough,nosupervise".into(),
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
    ]
}

/// A row per plan, noted already where this machine cannot run it.
fn rows(env: &BenchEnv, plans: &[Plan]) -> Vec<Row> {
    plans
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
        .collect()
}
