//! One flat directory of many entries, listed and stat'ed cold: what a
//! mail spool, a package cache or a build's object directory asks of a
//! file system, and where any cost per entry (a round trip, a search of
//! the directory, a reply too small) multiplies.

use std::fs::File;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::counted::{measure, trip_notes, Plan, Prime, Step};
use crate::env::{run, BenchEnv};
use crate::mount::How;
use crate::report::{Column, Section, Unit};
use crate::rows::{cold_note, progress, unavailable, uring_note, Image, NoImage, NO_MKFS_EROFS};
use crate::stats::summarize;
use crate::timing::time_cmd;
use crate::Config;

/// `n` empty files `f0000000`.. in a new directory `dir`.
fn flat_dir(dir: &Path, n: u64) -> Result<()> {
    for i in 0..n {
        let p = dir.join(format!("f{i:07}"));
        File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    }
    Ok(())
}

/// The images: mkfs.erofs's (uncompressed) and foliofs mkfs romfs's.
fn images(env: &BenchEnv, cfg: &Config, src: &Path) -> (Image, Image) {
    progress(cfg, "[bigdir] building images");
    let erofs = match &cfg.mkfs_erofs {
        Some(mkfs) => {
            let img = env.dir.join("bigdir.erofs");
            run(Command::new(mkfs)
                .args(["--quiet", "-T0"])
                .arg(&img)
                .arg(src))
            .map(|_| img)
            .map_err(|e| NoImage::failed(&e))
        }
        None => Err(NoImage::skip(NO_MKFS_EROFS)),
    };
    let img = env.dir.join("bigdir.romfs");
    let romfs = run(Command::new(&env.exe)
        .args(["mkfs", "romfs"])
        .arg(src)
        .arg(&img))
    .map(|_| img)
    .map_err(|e| NoImage::failed(&e));
    (erofs, romfs)
}

/// `find` and `find -ls` over one directory of `cfg.bigdir_entries`
/// entries, cold, foliofs beside the kernel's EROFS.
pub fn bigdir(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let n = cfg.bigdir_entries;
    let src = env.subdir("bigdir-src")?;
    progress(cfg, &format!("[bigdir] making {n} files"));
    flat_dir(&src, n)?;
    let (erofs, romfs) = images(env, cfg, &src);
    let columns = vec![
        Column {
            key: "find",
            label: "find MNT",
            unit: Unit::Seconds,
        },
        Column {
            key: "find_ls",
            label: "find MNT -ls",
            unit: Unit::Seconds,
        },
    ];
    let plans = vec![
        Plan {
            label: "foliofs erofs".into(),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "erofs",
                opts: String::new(),
            },
            image: erofs.clone(),
        },
        Plan {
            label: "foliofs romfs".into(),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "romfs",
                opts: String::new(),
            },
            image: romfs,
        },
        Plan {
            label: "foliofs erofs, io_uring".into(),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "erofs",
                opts: "io_uring".into(),
            },
            image: erofs.clone(),
        },
        Plan {
            label: "kernel erofs, file-backed".into(),
            kind: "kernel",
            how: How::KernelFile {
                fstype: "erofs",
                opts: String::new(),
            },
            image: erofs,
        },
    ];
    let reference = plans
        .iter()
        .position(|p| p.kind == "kernel")
        .expect("a kernel row");
    let find = |mnt: &Path| time_cmd(Command::new("find").arg(mnt));
    let find_ls = |mnt: &Path| time_cmd(Command::new("find").arg(mnt).arg("-ls"));
    let steps = [
        Step {
            key: "find",
            fresh: true,
            run: &find,
        },
        Step {
            key: "find_ls",
            fresh: true,
            run: &find_ls,
        },
    ];
    let (rows, trips, _) = measure(env, cfg, "bigdir", &plans, &steps, Prime::Cold);
    let pairs = (0..rows.len())
        .filter(|&i| i != reference)
        .map(|i| (i, reference))
        .collect();
    let mut notes = vec![format!(
        "one directory of {n} empty files, each run on a fresh mount with the image out of the page cache; ratios are to the kernel's file-backed EROFS mount{}",
        if unavailable(env, &plans[reference].how).is_some() {
            " (none here: it needs root)"
        } else {
            ""
        }
    )];
    let per_entry: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let cell = |key: &str| {
                let s = summarize(r.runs.get(key)?)?;
                Some(format!("{:.1}", s.median * 1e6 / n.max(1) as f64))
            };
            Some(format!(
                "{} {} / {}",
                r.label,
                cell("find")?,
                cell("find_ls")?
            ))
        })
        .collect();
    if !per_entry.is_empty() {
        notes.push(format!(
            "microseconds per entry (find / find -ls): {}",
            per_entry.join("; ")
        ));
    }
    notes.extend(trip_notes(&trips, Some((n, "entry"))));
    notes.extend(cold_note(env));
    notes.extend(uring_note(env));
    Ok(Section {
        name: "bigdir",
        title: "bigdir: one flat directory listed and stat'ed, cold".into(),
        columns,
        rows,
        reference,
        pairs,
        notes,
    })
}
