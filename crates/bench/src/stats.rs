//! Summaries of repeated measurements.

use serde::Serialize;

use crate::report::Unit;

/// Median, minimum and maximum of a set of runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

/// Summarises `samples`; `None` when there are none (or any is not finite).
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[n - 1],
        runs: n,
    })
}

/// `value / reference`, when both exist and the reference is not zero.
pub fn ratio(value: Option<f64>, reference: Option<f64>) -> Option<f64> {
    match (value, reference) {
        (Some(v), Some(r)) if r > 0.0 => Some(v / r),
        _ => None,
    }
}

/// One row's runs over another's, round by round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Paired {
    /// Median of the per-round ratios.
    pub median: f64,
    /// The first row's best run over the second's best.
    pub best: f64,
}

/// `a` over `b` as times (for a rate, `b` over `a`, so above 1 is always
/// "`a` takes longer"), pairing run i of each: rounds measure every row
/// once, so the runs of one round saw the same machine. `None` unless both
/// have the same number of finite, positive runs.
pub fn paired_ratio(a: &[f64], b: &[f64], unit: Unit) -> Option<Paired> {
    let ok = |v: &[f64]| !v.is_empty() && v.iter().all(|x| x.is_finite() && *x > 0.0);
    if a.len() != b.len() || !ok(a) || !ok(b) {
        return None;
    }
    let time = |x: f64| match unit {
        Unit::Seconds | Unit::Micros => x,
        Unit::GBps => 1.0 / x,
    };
    let rounds: Vec<f64> = a.iter().zip(b).map(|(x, y)| time(*x) / time(*y)).collect();
    let best = |v: &[f64]| v.iter().map(|x| time(*x)).fold(f64::INFINITY, f64::min);
    Some(Paired {
        median: summarize(&rounds)?.median,
        best: best(a) / best(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_median_is_the_middle() {
        let s = summarize(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
    }

    #[test]
    fn even_count_median_averages_the_middle_two() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!((s.min, s.max), (1.0, 4.0));
    }

    #[test]
    fn one_sample_is_its_own_summary() {
        let s = summarize(&[0.25]).unwrap();
        assert_eq!((s.median, s.min, s.max), (0.25, 0.25, 0.25));
    }

    #[test]
    fn nothing_to_summarize() {
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn ratios_need_a_positive_reference() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }

    #[test]
    fn paired_ratios_go_round_by_round() {
        let p = paired_ratio(&[2.0, 9.0, 3.0], &[1.0, 3.0, 3.0], Unit::Seconds).unwrap();
        // Rounds: 2, 3, 1; best 2 over best 1.
        assert_eq!((p.median, p.best), (2.0, 2.0));
        let r = paired_ratio(&[1.0, 2.0], &[2.0, 4.0], Unit::GBps).unwrap();
        assert_eq!((r.median, r.best), (2.0, 2.0));
        assert!(paired_ratio(&[1.0], &[1.0, 2.0], Unit::Seconds).is_none());
        assert!(paired_ratio(&[], &[], Unit::Seconds).is_none());
        assert!(paired_ratio(&[1.0], &[0.0], Unit::Seconds).is_none());
    }
}
