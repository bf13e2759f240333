//! Results: the table on stdout, the JSON file and the charts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::stats::{paired_ratio, ratio, summarize, Summary};

/// What a column measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Elapsed seconds (lower is better).
    Seconds,
    /// Gigabytes (10^9 bytes) per second (higher is better).
    GBps,
    /// Microseconds per operation (lower is better).
    Micros,
}

#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub key: &'static str,
    pub label: &'static str,
    pub unit: Unit,
}

/// One row: a file system (or the plain image) under one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub label: String,
    /// "foliofs", "kernel", "fuse-peer" or "baseline".
    pub kind: &'static str,
    /// Raw runs per column key.
    pub runs: BTreeMap<&'static str, Vec<f64>>,
    /// Why the row has no figures (peer not installed, not root, failure).
    pub note: Option<String>,
    /// True when `note` is a failure rather than a skip.
    pub failed: bool,
    /// A numeric parameter charts use as their x axis (block size in bytes).
    pub x: Option<u64>,
}

impl Row {
    pub fn new(label: impl Into<String>, kind: &'static str) -> Row {
        Row {
            label: label.into(),
            kind,
            runs: BTreeMap::new(),
            note: None,
            failed: false,
            x: None,
        }
    }

    pub fn summary(&self, key: &str) -> Option<Summary> {
        self.runs.get(key).and_then(|v| summarize(v))
    }
}

/// One section's results.
#[derive(Clone, Debug, Serialize)]
pub struct Section {
    pub name: &'static str,
    pub title: String,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// Index of the row every ratio is taken against.
    pub reference: usize,
    /// Rows compared head to head (foliofs, then its kernel counterpart),
    /// beside the ratios to the reference.
    pub pairs: Vec<(usize, usize)>,
    pub notes: Vec<String>,
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct Report {
    pub host: Host,
    pub quick: bool,
    pub cold_cache: bool,
    pub sections: Vec<Section>,
}

#[derive(Debug, Serialize)]
pub struct Host {
    pub kernel: String,
    pub cpus: usize,
    pub memory_bytes: u64,
    pub page_size: u32,
    /// Proactive reclaim that pages out idle page cache (see
    /// [`proactive_reclaim`]), which "already in the page cache" rows meet.
    pub proactive_reclaim: Option<String>,
    /// What waking a thread costs on this host, in µs per round trip of a
    /// pipe ping-pong between two threads (see [`crate::wakeup`]): most of
    /// a FUSE round trip over `/dev/fuse`, so it tells the transport's cost
    /// from the host's.
    pub wakeup: crate::wakeup::Wakeup,
}

impl Host {
    pub fn probe() -> Host {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let memory_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|k| k.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        Host {
            kernel,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes,
            page_size: foliofs_block::page_size(),
            proactive_reclaim: proactive_reclaim(Path::new(DAMON)),
            wakeup: crate::wakeup::Wakeup::measure(),
        }
    }
}

/// Where DAMON's sysfs interface lives.
const DAMON: &str = "/sys/kernel/mm/damon/admin/kdamonds";

/// A running DAMON scheme that pages out memory left idle, described: such
/// a machine evicts an image a run expects to find cached once it has sat
/// unread for a while, so a "1st run" can read from the disk after all.
pub fn proactive_reclaim(kdamonds: &Path) -> Option<String> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    let dirs = |p: PathBuf| -> Vec<PathBuf> {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    for k in dirs(kdamonds.to_owned()) {
        if read(k.join("state")).as_deref() != Some("on") {
            continue;
        }
        for ctx in dirs(k.join("contexts")) {
            let aggr_us: Option<u64> =
                read(ctx.join("monitoring_attrs/intervals/aggr_us")).and_then(|v| v.parse().ok());
            for scheme in dirs(ctx.join("schemes")) {
                if read(scheme.join("action")).as_deref() != Some("pageout") {
                    continue;
                }
                let min_age: Option<u64> =
                    read(scheme.join("access_pattern/age/min")).and_then(|v| v.parse().ok());
                let idle = match (min_age, aggr_us) {
                    (Some(a), Some(us)) => format!(" after about {} s idle", a * us / 1_000_000),
                    _ => String::new(),
                };
                return Some(format!(
                    "DAMON proactive reclaim is on ({}): it pages out memory{idle}",
                    k.display()
                ));
            }
        }
    }
    None
}

fn fmt_num(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

fn fmt_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Seconds if v < 10.0 => format!("{v:.3} s"),
        Unit::Seconds => format!("{v:.1} s"),
        Unit::GBps => format!("{v:.2} GB/s"),
        Unit::Micros => format!("{v:.2} µs"),
    }
}

/// The section as an aligned text table: each column's median with its
/// min..max, and its ratio to the reference row.
pub fn table(s: &Section) -> String {
    let reference = s.rows.get(s.reference);
    let mut header = vec!["".to_owned()];
    for c in &s.columns {
        header.push(c.label.to_owned());
        header.push("min..max".to_owned());
        header.push("x ref".to_owned());
    }
    let mut lines = vec![header];
    for (i, r) in s.rows.iter().enumerate() {
        let mut line = vec![if i == s.reference {
            format!("{} (ref)", r.label)
        } else {
            r.label.clone()
        }];
        if let Some(note) = &r.note {
            line.push(format!(
                "{}: {note}",
                if r.failed { "FAILED" } else { "skipped" }
            ));
            lines.push(line);
            continue;
        }
        for c in &s.columns {
            match r.summary(c.key) {
                Some(sum) => {
                    line.push(fmt_value(sum.median, c.unit));
                    line.push(format!("{}..{}", fmt_num(sum.min), fmt_num(sum.max)));
                    let rf = reference.and_then(|rr| rr.summary(c.key)).map(|x| x.median);
                    line.push(
                        ratio(Some(sum.median), rf)
                            .map(|x| format!("{x:.2}"))
                            .unwrap_or_else(|| "-".into()),
                    );
                }
                None => line.extend(["-".to_owned(), "".to_owned(), "".to_owned()]),
            }
        }
        lines.push(line);
    }
    let ncol = lines.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; ncol];
    for l in &lines {
        // A note spans the rest of its line; it does not widen the columns.
        if l.len() == 2 && ncol > 2 {
            widths[0] = widths[0].max(l[0].chars().count());
            continue;
        }
        for (i, cell) in l.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "== {} ==", s.title);
    for l in &lines {
        let mut row = String::new();
        for (i, cell) in l.iter().enumerate() {
            if i == 0 {
                let _ = write!(row, "{:<w$}", cell, w = widths[0]);
            } else if l.len() == 2 && ncol > 2 {
                let _ = write!(row, "  {cell}");
            } else {
                let _ = write!(row, "  {:>w$}", cell, w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", row.trim_end());
    }
    for &(a, b) in &s.pairs {
        if let Some(line) = pair_line(s, a, b) {
            let _ = writeln!(out, "{line}");
        }
    }
    for n in &s.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// "A / B, time ratio (below 1: A is faster): COLUMN 0.93 (best/best
/// 0.95), ...": row `a`'s time over row `b`'s in each column (a bandwidth
/// column is turned into time first, so every pair line reads one way), the median of the rounds' ratios (each round
/// measured both one after the other) and the best run over the best run.
fn pair_line(s: &Section, a: usize, b: usize) -> Option<String> {
    let (ra, rb) = (s.rows.get(a)?, s.rows.get(b)?);
    let cells: Vec<String> = s
        .columns
        .iter()
        .filter_map(|c| {
            let p = paired_ratio(ra.runs.get(c.key)?, rb.runs.get(c.key)?, c.unit)?;
            Some(format!(
                "{} {:.2} (best/best {:.2})",
                c.label, p.median, p.best
            ))
        })
        .collect();
    (!cells.is_empty()).then(|| {
        format!(
            "{} / {}, time ratio (below 1: {} is faster): {}",
            ra.label,
            rb.label,
            ra.label,
            cells.join(", ")
        )
    })
}

/// Writes the whole report as JSON.
pub fn write_json(report: &Report, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes one SVG bar chart per column of each section with rows.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    use plotters::prelude::*;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    for s in &report.sections {
        for c in &s.columns {
            let bars: Vec<(String, f64, &'static str)> = s
                .rows
                .iter()
                .filter_map(|r| {
                    r.summary(c.key)
                        .map(|m| (r.label.clone(), m.median, r.kind))
                })
                .collect();
            if bars.is_empty() {
                continue;
            }
            let path = dir.join(format!("{}-{}.svg", s.name, c.key));
            let height = 80 + 28 * bars.len() as u32;
            let root = SVGBackend::new(&path, (900, height)).into_drawing_area();
            root.fill(&WHITE)?;
            let max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max) * 1.15;
            let unit = match c.unit {
                Unit::Seconds => "seconds (lower is better)",
                Unit::GBps => "GB/s (higher is better)",
                Unit::Micros => "µs per operation (lower is better)",
            };
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{}: {}", s.title, c.label), ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(300)
                .build_cartesian_2d(0.0..max.max(1e-9), (0..bars.len()).into_segmented())?;
            let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
            chart
                .configure_mesh()
                .disable_y_mesh()
                .x_desc(unit)
                .y_labels(bars.len())
                .y_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                    _ => String::new(),
                })
                .draw()?;
            chart.draw_series(bars.iter().enumerate().map(|(i, (_, v, kind))| {
                let color = match *kind {
                    "foliofs" => RGBColor(0x2a, 0x6f, 0xdb),
                    "kernel" => RGBColor(0x99, 0x99, 0x99),
                    "baseline" => RGBColor(0x33, 0x33, 0x33),
                    _ => RGBColor(0xe0, 0x8a, 0x1e),
                };
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (*v, SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                );
                bar.set_margin(3, 3, 0, 0);
                bar
            }))?;
            root.present()?;
            drop(chart);
            drop(root);
            written.push(path);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> Section {
        let mut a = Row::new("image", "baseline");
        a.runs.insert("dd", vec![1.0, 2.0, 3.0]);
        let mut b = Row::new("mount", "foliofs");
        b.runs.insert("dd", vec![2.0, 4.0, 6.0]);
        let mut c = Row::new("peer", "fuse-peer");
        c.note = Some("squashfuse is not installed".into());
        Section {
            name: "seq",
            title: "test".into(),
            columns: vec![Column {
                key: "dd",
                label: "dd",
                unit: Unit::Seconds,
            }],
            rows: vec![a, b, c],
            reference: 0,
            pairs: vec![(1, 0), (2, 0)],
            notes: vec![],
        }
    }

    #[test]
    fn table_shows_medians_ratios_and_skips() {
        let t = table(&section());
        assert!(t.contains("image (ref)"), "{t}");
        assert!(t.contains("4.000 s"), "{t}");
        assert!(t.contains("2.00"), "ratio 4/2 missing: {t}");
        assert!(t.contains("skipped: squashfuse is not installed"), "{t}");
        // Round by round 2/1, 4/2, 6/3; best 2 over best 1. A row without
        // runs has no pair line.
        assert!(
            t.contains(
                "mount / image, time ratio (below 1: mount is faster): dd 2.00 (best/best 2.00)"
            ),
            "{t}"
        );
        assert!(!t.contains("peer / image"), "{t}");
    }

    #[test]
    fn proactive_reclaim_is_found_only_when_a_pageout_scheme_runs() {
        let dir = tempfile::tempdir().unwrap();
        let k = dir.path().join("0");
        let ctx = k.join("contexts/0");
        let scheme = ctx.join("schemes/0");
        std::fs::create_dir_all(scheme.join("access_pattern/age")).unwrap();
        std::fs::create_dir_all(ctx.join("monitoring_attrs/intervals")).unwrap();
        std::fs::write(ctx.join("monitoring_attrs/intervals/aggr_us"), "5000000\n").unwrap();
        std::fs::write(scheme.join("access_pattern/age/min"), "12\n").unwrap();
        std::fs::write(scheme.join("action"), "pageout\n").unwrap();
        std::fs::write(k.join("state"), "off\n").unwrap();
        assert_eq!(proactive_reclaim(dir.path()), None);
        std::fs::write(k.join("state"), "on\n").unwrap();
        let found = proactive_reclaim(dir.path()).unwrap();
        assert!(found.contains("after about 60 s idle"), "{found}");
        std::fs::write(scheme.join("action"), "stat\n").unwrap();
        assert_eq!(proactive_reclaim(dir.path()), None);
        assert_eq!(proactive_reclaim(&dir.path().join("missing")), None);
    }

    #[test]
    fn json_keeps_every_raw_run() {
        let r = Report {
            host: Host::probe(),
            quick: true,
            cold_cache: false,
            sections: vec![section()],
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        write_json(&r, &p).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(
            v["sections"][0]["rows"][1]["runs"]["dd"],
            serde_json::json!([2.0, 4.0, 6.0])
        );
    }

    #[test]
    fn plots_are_svg_files() {
        let r = Report {
            host: Host::probe(),
            quick: true,
            cold_cache: false,
            sections: vec![section()],
        };
        let dir = tempfile::tempdir().unwrap();
        let files = write_plots(&r, dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        let text = std::fs::read_to_string(&files[0]).unwrap();
        assert!(text.contains("<svg") && text.contains("mount"), "{text}");
    }
}
