//! The section's rounds: each row's workloads on a new mount of its own,
//! the counted rows' requests read from their server as they go.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Result;
use foliofs_fuse::records::published as mount_stats;
use foliofs_vfs::chain_line;

use super::workloads::{create_files, missing_xattr_reads, one_byte_writes, unlink_half};
use super::{Load, Plan, Rounds, Tree, Trips};
use crate::env::BenchEnv;
use crate::mount::{How, Mounted};
use crate::report::Row;
use crate::rows::progress;
use crate::timing::time_cmd;
use crate::wakeup::Wakeup;
use crate::Config;

/// Runs every row that can run, `cfg.runs` rounds of them; a row that
/// fails keeps the error as its note and runs no more. `counted` are the
/// rows whose requests are kept.
pub(super) fn run(
    env: &BenchEnv,
    cfg: &Config,
    plans: &[Plan],
    rows: &mut [Row],
    counted: &[usize; 2],
    tree: Option<&Tree>,
    load: Load,
) -> Rounds {
    let mut trips: [Trips; 2] = Default::default();
    // The host's wake-up cost, measured in every round beside the rows,
    // so the round trip can be set against it (see `wakeup_line`).
    let mut wakeups = Vec::new();
    let mut polling: Vec<Vec<String>> = vec![Vec::new(); plans.len()];
    for round in 0..cfg.runs {
        wakeups.push(Wakeup::measure());
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
            let r = one_row(env, plan, row, tree, load, &mut these, &mut polling[i]);
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
    Rounds {
        trips,
        wakeups,
        polling,
    }
}

/// One round of one row: its workloads on a new mount, each time added to
/// the row's runs and, where the mount publishes counts, its requests to
/// `these`; a foliofs mount's polling to `polling`.
fn one_row(
    env: &BenchEnv,
    plan: &Plan,
    row: &mut Row,
    tree: Option<&Tree>,
    load: Load,
    these: &mut Trips,
    polling: &mut Vec<String>,
) -> Result<()> {
    let m = Mounted::new(env, &plan.how, Path::new("none"), &env.fresh_dir("mnt")?)?;
    let id = mount_id(&m.dir);
    if matches!(plan.how, How::Foliofs { .. }) {
        polling.push(polling_of(&m.dir).unwrap_or_else(|| "?".into()));
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
    if let Some(Tree { archive, name, .. }) = tree {
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
        crate::env::run(Command::new("du").arg("-s").arg(&unpacked))?;
        crate::env::run(
            Command::new("find")
                .arg(&unpacked)
                .args(["-type", "f", "-exec", "cat", "{}", "+"]),
        )?;
        measure("read", start.elapsed().as_secs_f64(), row);
        let t = time_cmd(Command::new("rm").arg("-rf").arg(&unpacked))?;
        measure("rm", t, row);
    }
    let Load { n, writes } = load;
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
}

/// The polling window the foliofs mount at `dir` settled on (`spin=US`
/// or `nospin`, as `foliofs mounts` shows it): the default is measured at
/// mount, so two mounts of one run can differ, and the round trip with it.
fn polling_of(dir: &Path) -> Option<String> {
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
