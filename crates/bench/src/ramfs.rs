//! The ramfs seed's table: a new file written at every block size, with
//! foliofs's data in the kernel's page cache and in the server; a rewrite
//! and a mapped read beside it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use foliofs_vfs::chain_line;
use foliofs_vfs::options::format_size;

use crate::env::{extra_dir, remove_extra_dir, BenchEnv};
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::{measure_rows, NoImage, Plan};
use crate::timing::{time_mmap_read, time_rewrite, time_write_zeros};
use crate::Config;

/// The ways a foliofs ramfs row keeps its file data.
const PATHS: [(&str, &str); 2] = [("passthrough", "passthrough"), ("server", "nopassthrough")];

/// The ramfs seed's table: `dd bs=2M` of a new file on a fresh mount at
/// every block size, foliofs's ramfs with its data in the kernel's page
/// cache (passthrough) and in the server, beside the kernel's in-memory
/// file systems; then a rewrite of the same file in place and a read of a
/// mapped file.
pub fn ramfs(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let total = cfg.ramfs_bytes;
    let mapped = cfg.ramfs_bytes / 4;
    let Plans {
        plans,
        same_policy,
        unsupervised,
        kernel_rows,
        shm,
    } = plans(env, total + mapped);
    let reference = kernel_rows["ramfs"];
    let rows = run_rows(env, cfg, &plans, total, mapped);
    let folios = folio_census(env, cfg, &plans, &rows);
    let (reference, ref_name) = match &shm {
        None => (reference, "the kernel's ramfs".to_owned()),
        Some((i, dir)) => (*i, shm_reference(dir)),
    };
    let mut pairs = pairs(&same_policy, &kernel_rows);
    pairs.extend(unsupervised);
    let mut notes = vec![
        format!(
            "{} MiB written to a new file in 2 MiB writes on a fresh mount per run, then written again over it; a {} MiB file written, then read through a shared mapping; ratios are to {ref_name}",
            total >> 20,
            mapped >> 20
        ),
        "the first write also measures how fast the machine hands out memory it has not used lately (in a VM, often a hypervisor fault per page), which depends on what ran before; the rewrite is the file systems' own speed".into(),
        "passthrough: the files live in a tmpfs of the mount's own (huge=never at 4K blocks, within_size above, always with huge=always) and the kernel reads, writes and maps them itself; server: the files live in the server and every read and write is a request; each passthrough row is paired with the kernel tmpfs of the same huge= setting".into(),
    ];
    notes.extend(folios);
    Ok(Section {
        name: "ramfs",
        title: "ramfs: dd of a new file by block size (ramfs blocksize= table), rewrite, mmap read"
            .into(),
        columns: columns(),
        rows,
        reference,
        pairs,
        notes,
    })
}

fn columns() -> Vec<Column> {
    // A first write into a fresh mount takes pages the machine may not
    // have backed yet (in a VM whose balloon reports free pages, every
    // such page costs the hypervisor a fault); the rewrite overwrites the
    // pages the first write made, the file system's own speed. The seed's
    // table is the first, on bare metal.
    vec![
        Column {
            key: "write",
            label: "write a new file (dd bs=2M)",
            unit: Unit::GBps,
        },
        Column {
            key: "rewrite",
            label: "rewrite it in place",
            unit: Unit::GBps,
        },
        Column {
            key: "mmap",
            label: "read a mapped file",
            unit: Unit::GBps,
        },
    ]
}

/// A directory of this run in /dev/shm and the tmpfs's options, or why
/// there is none.
type ShmDir = Result<(PathBuf, String), NoImage>;

/// The rows in table order, and where the pairs and the reference find
/// theirs.
struct Plans {
    plans: Vec<Plan>,
    /// Each passthrough row and the kernel row of its folio policy.
    same_policy: Vec<(usize, &'static str)>,
    /// A supervised row (the default) and the same unsupervised.
    unsupervised: Vec<(usize, usize)>,
    /// Each kernel row's key → its index.
    kernel_rows: BTreeMap<&'static str, usize>,
    /// A user's /dev/shm row: its index and its directory with the
    /// tmpfs's options, or why there is none.
    shm: Option<(usize, ShmDir)>,
}

/// The foliofs rows, then the kernel's, then (for a user) /dev/shm with
/// room for `shm_bytes`.
fn plans(env: &BenchEnv, shm_bytes: u64) -> Plans {
    let mut plans = Vec::new();
    let (same_policy, unsupervised) = foliofs_plans(&mut plans);
    let kernel_rows = kernel_plans(&mut plans);
    // A user can mount neither, but has the machine's /dev/shm, a tmpfs
    // already mounted: the kernel's in-memory file system beside foliofs's.
    // Its options are the machine's, not a fresh mount's defaults.
    let shm = (!env.root).then(|| {
        let dir = shm_dir(shm_bytes);
        plans.push(Plan {
            label: "kernel tmpfs at /dev/shm".into(),
            kind: "kernel",
            how: How::Plain,
            image: dir.as_ref().map(|(d, _)| d.clone()).map_err(Clone::clone),
            x: None,
        });
        (plans.len() - 1, dir)
    });
    Plans {
        plans,
        same_policy,
        unsupervised,
        kernel_rows,
        shm,
    }
}

/// The foliofs ramfs rows, every block size each way; returns where each
/// passthrough row's counterpart of the same folio policy sits among the
/// kernel rows: tmpfs with huge=never, huge=within_size (the policy the
/// passthrough pool takes above 4 KiB blocks) or huge=always.
/// Each passthrough row and its kernel counterpart's key; each supervised
/// row and the same row unsupervised.
type FoliofsRows = (Vec<(usize, &'static str)>, Vec<(usize, usize)>);

fn foliofs_plans(plans: &mut Vec<Plan>) -> FoliofsRows {
    let mut same_policy: Vec<(usize, &'static str)> = Vec::new();
    // The 2 MiB rows each way, to be run again unsupervised.
    let mut at_2m = Vec::new();
    let row = |plans: &mut Vec<Plan>, label: String, opts: String, x: Option<u64>| {
        plans.push(Plan {
            label,
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts,
            },
            image: Ok(PathBuf::from("none")),
            x,
        });
    };
    for (path, opt) in PATHS {
        let mut bs = 4096u64;
        while bs <= 2 << 20 {
            if path == "passthrough" {
                same_policy.push((plans.len(), if bs == 4096 { "tmpfs" } else { "within" }));
            }
            if bs == 2 << 20 {
                at_2m.push((plans.len(), path, opt));
            }
            row(
                plans,
                format!("foliofs ramfs blocksize={} ({path})", format_size(bs)),
                format!("blocksize={bs},{opt}"),
                (path == "passthrough").then_some(bs),
            );
            bs *= 2;
        }
        if path == "passthrough" {
            same_policy.push((plans.len(), "huge"));
        }
        // 2 MiB blocks as huge pages, beside the kernel's tmpfs huge=always.
        row(
            plans,
            format!("foliofs ramfs blocksize=2M,huge=always ({path})"),
            format!("blocksize=2M,huge=always,{opt}"),
            None,
        );
    }
    // What outliving the server costs the data path: nothing on the
    // passthrough path (the kernel writes), a ledger record per block a
    // write allocates on the server's.
    let mut unsupervised = Vec::new();
    for (supervised, path, opt) in at_2m {
        unsupervised.push((supervised, plans.len()));
        row(
            plans,
            format!("foliofs ramfs blocksize=2M ({path}, nosupervise)"),
            format!("blocksize=2M,{opt},nosupervise"),
            None,
        );
    }
    (same_policy, unsupervised)
}

/// The kernel's in-memory rows; returns each one's key → its index.
fn kernel_plans(plans: &mut Vec<Plan>) -> BTreeMap<&'static str, usize> {
    let mut kernel_rows = BTreeMap::new();
    for (key, label, fstype, opts) in [
        ("ramfs", "kernel ramfs", "ramfs", ""),
        ("tmpfs", "kernel tmpfs", "tmpfs", ""),
        (
            "within",
            "kernel tmpfs huge=within_size",
            "tmpfs",
            "huge=within_size",
        ),
        ("huge", "kernel tmpfs huge=always", "tmpfs", "huge=always"),
    ] {
        kernel_rows.insert(key, plans.len());
        plans.push(Plan {
            label: label.into(),
            kind: "kernel",
            how: How::KernelMem {
                fstype,
                opts: opts.into(),
            },
            image: Ok(PathBuf::from("none")),
            x: None,
        });
    }
    kernel_rows
}

/// The three workloads on every row: `total` bytes written and rewritten,
/// `mapped` bytes read through a mapping.
fn run_rows(env: &BenchEnv, cfg: &Config, plans: &[Plan], total: u64, mapped: u64) -> Vec<Row> {
    let write = |mnt: &Path| -> Result<f64> {
        let t = time_write_zeros(&mnt.join("f"), total, 2 << 20)?;
        Ok(total as f64 / 1e9 / t)
    };
    let rewrite = |mnt: &Path| -> Result<f64> {
        let f = mnt.join("f");
        let t = time_rewrite(&f, total, 2 << 20)?;
        std::fs::remove_file(&f)?;
        Ok(total as f64 / 1e9 / t)
    };
    let mmap = |mnt: &Path| -> Result<f64> {
        let f = mnt.join("m");
        time_write_zeros(&f, mapped, 2 << 20)?;
        let t = time_mmap_read(&f)?;
        std::fs::remove_file(&f)?;
        Ok(mapped as f64 / 1e9 / t)
    };
    // One mount per row and round, its workloads in turn: the write makes
    // the file the rewrite overwrites and removes.
    measure_rows(
        env,
        cfg,
        "ramfs",
        plans,
        false,
        &[("write", &write), ("rewrite", &rewrite), ("mmap", &mmap)],
    )
}

/// The /dev/shm row as the reference's name in the notes; removes the
/// run's directory there, the rows being done with it.
fn shm_reference(dir: &ShmDir) -> String {
    let opts = match dir {
        Ok((d, opts)) => {
            remove_extra_dir(d);
            format!(" ({opts})")
        }
        Err(_) => String::new(),
    };
    format!("the kernel's tmpfs at /dev/shm{opts}, already mounted: mounting a new ramfs or tmpfs needs root")
}

/// Each passthrough row against the kernel's tmpfs of the same folio
/// policy, and the largest block size against the kernel's ramfs, as the
/// seed compares its 2M row with its 4K one.
fn pairs(
    same_policy: &[(usize, &'static str)],
    kernel_rows: &BTreeMap<&'static str, usize>,
) -> Vec<(usize, usize)> {
    let mut pairs: Vec<(usize, usize)> = same_policy
        .iter()
        .filter_map(|(i, k)| kernel_rows.get(k).map(|&r| (*i, r)))
        .collect();
    if let Some(&(last, _)) = same_policy.iter().rev().nth(1) {
        pairs.push((last, kernel_rows["ramfs"]));
    }
    pairs
}

/// The folio sizes the kernel gave a file written as the `write` column
/// writes it, on each row whose data is in the kernel's page cache, as
/// note lines. Reading them needs root (`/proc/kpageflags`).
fn folio_census(env: &BenchEnv, cfg: &Config, plans: &[Plan], rows: &[Row]) -> Vec<String> {
    if !env.root {
        return vec![
            "the folio sizes are not shown: reading them (/proc/kpageflags) needs root".into(),
        ];
    }
    let bytes = cfg.ramfs_bytes.min(256 << 20);
    let mut lines = Vec::new();
    for (plan, row) in plans.iter().zip(rows) {
        let kernel_data = match &plan.how {
            How::Foliofs { opts, .. } => {
                opts.contains("passthrough") && !opts.contains("nopassthrough")
            }
            How::KernelMem { .. } => true,
            _ => false,
        };
        if !kernel_data || row.note.is_some() {
            continue;
        }
        let census = (|| -> Result<String> {
            let m = Mounted::new(env, &plan.how, Path::new("none"), &env.fresh_dir("mnt")?)?;
            let f = m.dir.join("f");
            time_write_zeros(&f, bytes, 2 << 20)?;
            let sizes = foliofs_testkit::folios::sizes(&f)?;
            Ok(sizes
                .iter()
                .rev()
                .map(|(size, n)| format!("{}x{n}", format_size(*size)))
                .collect::<Vec<_>>()
                .join(" "))
        })();
        match census {
            Ok(c) => lines.push(format!(
                "folios of a {} MiB file on {}: {c}",
                bytes >> 20,
                plan.label
            )),
            Err(e) => lines.push(format!(
                "folios on {}: {}",
                plan.label,
                chain_line(e.as_ref())
            )),
        }
    }
    lines
}

/// A directory of this run in /dev/shm, with the tmpfs's options, if
/// /dev/shm is a tmpfs with room for `bytes`.
fn shm_dir(bytes: u64) -> ShmDir {
    let shm = Path::new("/dev/shm")
        .canonicalize()
        .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
    match foliofs_fuse::find_mount(&shm).ok().flatten() {
        Some(m) if m.fs_type == "tmpfs" => {
            let st = nix::sys::statvfs::statvfs(&shm)
                .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
            let free = st.blocks_available() as u64 * st.fragment_size() as u64;
            if free < bytes + bytes / 8 {
                return Err(NoImage::skip(format!(
                    "/dev/shm has {} free, the run writes {}",
                    format_size(free),
                    format_size(bytes)
                )));
            }
            let dir = extra_dir(&shm).map_err(|e| NoImage::skip(chain_line(e.as_ref())))?;
            Ok((dir, m.super_options))
        }
        Some(m) => Err(NoImage::skip(format!(
            "/dev/shm is a {}, not a tmpfs",
            m.fs_type
        ))),
        None => Err(NoImage::skip("/dev/shm is not a mount of its own")),
    }
}
