//! Rows measured in interleaved rounds, with the foliofs server's requests
//! by opcode for each workload of the last round: what the realstart and
//! bigdir sections share.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use foliofs_vfs::chain_line;

use crate::env::BenchEnv;
use crate::mount::{How, Mounted};
use crate::report::Row;
use crate::rows::{progress, unavailable, Image};
use crate::smallfiles::mount_id;
use crate::Config;
use foliofs_fuse::records::published::{self as mount_stats, Counts};

/// One row: a label, how to mount, and which image.
pub(crate) struct Plan {
    pub label: String,
    pub kind: &'static str,
    pub how: How,
    pub image: Image,
}

/// What the page cache holds of the image before a fresh mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prime {
    /// Nothing: dropped (root) or evicted (a user), as cold runs elsewhere.
    Cold,
    /// All of it: the image was just written or fetched, so only the
    /// mount's own caches start empty.
    Warm,
}

/// A timed workload: a column key, whether it gets a fresh mount (else it
/// runs on the mount the previous step used), and a function of the mount
/// point giving seconds.
pub(crate) struct Step<'a> {
    pub key: &'static str,
    pub fresh: bool,
    pub run: &'a dyn Fn(&Path) -> Result<f64>,
}

/// Requests one foliofs row's server saw during one step of the last round.
pub(crate) struct Trips {
    pub row: String,
    pub key: &'static str,
    pub counts: Counts,
}

/// Pages the kernel's LRU lists activated during one step of one row in
/// the last round (`pgactivate` in `/proc/vmstat`, machine-wide): a page
/// moves to the active list on its second read, so these counts show in
/// which run each row pays that move.
pub(crate) struct Activated {
    pub row: String,
    pub key: &'static str,
    pub pages: u64,
}

/// The machine's `pgactivate` count, if `/proc/vmstat` has one.
fn pages_activated() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("pgactivate "))
        .and_then(|n| n.trim().parse().ok())
}

/// Reads `path` through once, so its pages are cached.
fn read_through(path: &Path) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

/// Measures every plan with every step, `cfg.runs` rounds; a round
/// visits every plan once, so drift in the machine spreads over all rows.
/// The first step of a row must be `fresh`.
pub(crate) fn measure(
    env: &BenchEnv,
    cfg: &Config,
    section: &str,
    plans: &[Plan],
    steps: &[Step<'_>],
    prime: Prime,
) -> (Vec<Row>, Vec<Trips>, Vec<Activated>) {
    let mut rows: Vec<Row> = plans
        .iter()
        .map(|p| {
            let mut row = Row::new(p.label.clone(), p.kind);
            if let Some(why) = unavailable(env, &p.how) {
                row.note = Some(why);
            } else if let Err(no) = &p.image {
                row.note = Some(format!("no image: {}", no.why));
                row.failed = no.failed;
            }
            row
        })
        .collect();
    let mut trips = Vec::new();
    let mut activated = Vec::new();
    for round in 0..cfg.runs {
        let last = round + 1 == cfg.runs;
        for (plan, row) in plans.iter().zip(rows.iter_mut()) {
            let Ok(image) = &plan.image else { continue };
            if row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!(
                    "[{section}] round {}/{}: {}",
                    round + 1,
                    cfg.runs,
                    plan.label
                ),
            );
            let counted = last && matches!(plan.how, How::Foliofs { .. });
            let r = (|| -> Result<()> {
                let mut mount: Option<Mounted> = None;
                for step in steps {
                    if step.fresh || mount.is_none() {
                        drop(mount.take());
                        if prime == Prime::Warm && !matches!(plan.how, How::Plain) {
                            read_through(image)?;
                        }
                        let m = Mounted::new(env, &plan.how, image, &env.fresh_dir("mnt")?)?;
                        if prime == Prime::Cold {
                            env.cool(image);
                        }
                        mount = Some(m);
                    }
                    let m = mount.as_ref().expect("mounted above");
                    let id = counted.then(|| mount_id(&m.dir)).flatten();
                    // No file yet: the server has counted nothing worth
                    // writing since it started.
                    let before = id.map(|id| mount_stats::read_settled(id).unwrap_or_default());
                    let active_before = last.then(pages_activated).flatten();
                    let v = (step.run)(&m.dir)?;
                    row.runs.entry(step.key).or_default().push(v);
                    if let (Some(b), Some(a)) = (active_before, pages_activated()) {
                        activated.push(Activated {
                            row: plan.label.clone(),
                            key: step.key,
                            pages: a.saturating_sub(b),
                        });
                    }
                    if let (Some(id), Some(before)) = (id, before) {
                        if let Some(after) = mount_stats::read_settled(id) {
                            trips.push(Trips {
                                row: plan.label.clone(),
                                key: step.key,
                                counts: mount_stats::delta(&before, &after),
                            });
                        }
                    }
                }
                Ok(())
            })();
            if let Err(e) = r {
                row.note = Some(chain_line(e.as_ref()));
                row.failed = true;
            }
        }
    }
    (rows, trips, activated)
}

/// One note per row and step: "foliofs erofs, 1st run: lookup=3 read=5
/// (8, 0.4 per file)", `per` naming what the total is divided by.
pub(crate) fn trip_notes(trips: &[Trips], per: Option<(u64, &str)>) -> Vec<String> {
    trips
        .iter()
        .map(|t| {
            // Pushes are not requests: they are listed, not added up.
            let total: u64 = t
                .counts
                .iter()
                .filter(|(k, _)| !foliofs_fuse::EXTRA_NAMES.contains(&k.as_str()))
                .map(|(_, n)| n)
                .sum();
            let each = match per {
                Some((n, what)) if n > 0 => {
                    format!(", {:.2} per {what}", total as f64 / n as f64)
                }
                _ => String::new(),
            };
            let line = mount_stats::line(&t.counts);
            format!(
                "foliofs requests, {}, {}: {} ({total}{each})",
                t.row,
                t.key,
                if line.is_empty() { "none" } else { &line }
            )
        })
        .collect()
}
