//! Many-scenario studies: fast mode against FIFO and the stand-in over random
//! scenarios and over random arrival orders of one scenario.
//!
//! Why: the post's FIFO figures rest on a single arrival order, so one
//! scenario says little about how much better a policy is. These studies
//! report the distribution of gains (mean, p10, p50, p90) and count every plan
//! the checker rejects and every case where fast mode loses value to FIFO.

use crate::check::check;
use crate::model::Scenario;
use crate::{baseline, fast, gen};
use serde::Serialize;

/// Summary statistics of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Sample size.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl Stats {
    /// Statistics of `xs` (nearest-rank percentiles).
    pub fn of(xs: &[f64]) -> Stats {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let pick = |q: f64| {
            if n == 0 {
                0.0
            } else {
                v[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
            }
        };
        Stats {
            n,
            mean: if n == 0 {
                0.0
            } else {
                v.iter().sum::<f64>() / n as f64
            },
            p10: pick(0.1),
            p50: pick(0.5),
            p90: pick(0.9),
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Results of a study.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Study {
    /// Scenarios run.
    pub scenarios: usize,
    /// Fast-mode plans the checker rejected.
    pub fast_invalid: usize,
    /// Scenarios where fast mode's value is below FIFO's.
    pub fast_below_fifo_value: usize,
    /// Scenarios where fast mode's value is below the stand-in's.
    pub fast_below_greedy_value: usize,
    /// Fast vs FIFO value gain, percent (scenarios with FIFO value > 0).
    pub value_gain_vs_fifo_pct: Stats,
    /// Fast vs FIFO utilisation gain, points.
    pub util_gain_vs_fifo_pts: Stats,
    /// Fast vs stand-in value gain, percent.
    pub value_gain_vs_greedy_pct: Stats,
    /// Fast vs stand-in utilisation gain, points.
    pub util_gain_vs_greedy_pts: Stats,
}

fn run(scenarios: impl Iterator<Item = Scenario>) -> Study {
    let mut n = 0;
    let (mut invalid, mut below_fifo, mut below_greedy) = (0, 0, 0);
    let (mut vf, mut uf, mut vg, mut ug) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in scenarios {
        n += 1;
        let fifo = check(&s, &baseline::fifo(&s));
        let greedy = check(&s, &baseline::greedy(&s));
        let f = fast::solve(&s);
        let r = check(&s, &f.plan);
        if !r.valid() {
            invalid += 1;
        }
        if r.value < fifo.value - 1e-9 {
            below_fifo += 1;
        }
        if r.value < greedy.value - 1e-9 {
            below_greedy += 1;
        }
        if fifo.value > 0.0 {
            vf.push((r.value / fifo.value - 1.0) * 100.0);
        }
        if greedy.value > 0.0 {
            vg.push((r.value / greedy.value - 1.0) * 100.0);
        }
        uf.push((r.utilization - fifo.utilization) * 100.0);
        ug.push((r.utilization - greedy.utilization) * 100.0);
    }
    Study {
        scenarios: n,
        fast_invalid: invalid,
        fast_below_fifo_value: below_fifo,
        fast_below_greedy_value: below_greedy,
        value_gain_vs_fifo_pct: Stats::of(&vf),
        util_gain_vs_fifo_pts: Stats::of(&uf),
        value_gain_vs_greedy_pct: Stats::of(&vg),
        util_gain_vs_greedy_pts: Stats::of(&ug),
    }
}

/// `count` random scenarios from [`gen::scenario`] with seeds `seed..`.
pub fn random(count: u64, seed: u64) -> Study {
    run((seed..seed + count).map(gen::scenario))
}

/// `count` random arrival orders of `s` ([`gen::shuffle_arrivals`]).
pub fn orders(s: &Scenario, count: u64, seed: u64) -> Study {
    run((seed..seed + count).map(|k| gen::shuffle_arrivals(s, k)))
}
