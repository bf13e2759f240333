//! What the section's notes say beyond the table: each row against the
//! reference, the round-trip floor of the counted rows, their round trip
//! against the host's wake-up, the requests per workload and the polling
//! each mount settled on.

use foliofs_fuse::records::published::{self as mount_stats, Counts};

use super::{Load, Rounds, Trips};
use crate::report::{Column, Row};
use crate::stats::summarize;

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

/// Each row against the reference, then the counted rows' round-trip
/// floors and their round trip against the host's wake-up.
pub(super) fn comparisons(
    rows: &[Row],
    reference: usize,
    columns: &[Column],
    counted: &[usize; 2],
    rounds: &Rounds,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        if i != reference && row.note.is_none() {
            if let Some(l) = ratio_line(row, &rows[reference], columns) {
                notes.push(l);
            }
        }
    }
    for (c, &r) in counted.iter().enumerate() {
        if rows[r].note.is_none() {
            let trip = rows[r].runs.get("xattr").and_then(|v| summarize(v));
            if let Some(l) = trip
                .and_then(|t| floor_line(&rows[r], t.median, &rounds.trips[c], &rows[reference]))
            {
                notes.push(l);
            }
        }
    }
    for &r in counted {
        notes.extend(wakeup_line(&rows[r], &rounds.wakeups));
    }
    notes
}

/// The counted rows' requests per workload, and per entry the workload
/// touched (`entries` those of the tree, where there is one).
pub(super) fn requests(
    rows: &[Row],
    counted: &[usize; 2],
    trips: &[Trips; 2],
    entries: Option<u64>,
    load: Load,
) -> Vec<String> {
    let Load { n, writes } = load;
    let mut notes = Vec::new();
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
    notes
}

/// The polling each foliofs mount settled on, row by row, if any did.
pub(super) fn polling(rows: &[Row], polling: &[Vec<String>]) -> Option<String> {
    let settled: Vec<String> = rows
        .iter()
        .zip(polling)
        .filter(|(_, p)| !p.is_empty())
        .map(|(row, p)| format!("{}: {}", row.label, p.join(" ")))
        .collect();
    (!settled.is_empty()).then(|| {
        format!(
            "polling each mount settled on at mount, round by round (measured there unless asked for): {}",
            settled.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Unit;

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
}
