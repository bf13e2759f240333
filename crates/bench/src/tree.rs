//! The romfs seed's test 3: a whole tree listed and stat'ed cold.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::env::BenchEnv;
use crate::images::{build_images, read_plans, source_tree};
use crate::report::{Column, Section, Unit};
use crate::rows::{cold_note, foliofs_pairs, measure_rows};
use crate::timing::time_cmd;
use crate::Config;

/// The romfs seed's test 3: list and stat a whole tree, cold.
pub fn tree(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let (src, stats) = source_tree(env, cfg, "tree", cfg.tree_files, cfg.tree_bytes)?;
    let images = build_images(env, &src, cfg);
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
    let plans = read_plans(
        &images,
        &[("1K", "blocksize=1K"), ("largeblocks", "largeblocks")],
        false,
    );
    let reference = plans
        .iter()
        .position(|p| p.label == "kernel erofs, file-backed")
        .unwrap_or(0);
    let find = |mnt: &Path| time_cmd(Command::new("find").arg(mnt));
    let find_ls = |mnt: &Path| time_cmd(Command::new("find").arg(mnt).arg("-ls"));
    let rows = measure_rows(
        env,
        cfg,
        "tree",
        &plans,
        true,
        &[("find", &find), ("find_ls", &find_ls)],
    );
    let pairs = foliofs_pairs(&rows, reference);
    let mut notes = vec![format!(
        "{} files in {} directories, {} MB; ratios are to the kernel's file-backed EROFS mount{}",
        stats.files,
        stats.dirs,
        stats.bytes / 1_000_000,
        if env.root {
            ""
        } else {
            " (none here: it needs root)"
        }
    )];
    notes.extend(cold_note(env));
    notes.extend(crate::rows::uring_note(env));
    Ok(Section {
        name: "tree",
        title: "tree: list and stat a whole tree, cold (romfs test 3)".into(),
        columns,
        rows,
        reference,
        pairs,
        notes,
    })
}
