//! Commitment sizing: how many GPUs to reserve, by the critical-fractile
//! (newsvendor) rule of §2.3 of the scheduling note.
//!
//! Why this rule and not "p90": committing `c` GPUs costs `r` per GPU-hour
//! whether used or not; demand above `c` spills to on-demand at `p`. The
//! expected hourly cost `r c + p E[(D - c)+]` is minimised where
//! `P(D > c*) = r / p`, i.e. `c* = F^-1(1 - r/p)`. A 40% discount (`r = 0.6p`)
//! means committing to the 40th percentile, far below p90. Only when burst
//! capacity cannot be bought does the overflow cost become the RT shortfall
//! penalty `pi` (5-10x), giving `P(D > c*) = r / pi` and a p80-p90 answer; that
//! is the one case where a "p90 rule" is right.
//!
//! [`recommend`] returns `c*` and the whole buy-versus-spill cost curve, so the
//! answer can be read off and checked (the curve's minimum sits at `c*`).
//! [`demand_from_azure_trace`] turns the Azure LLM conversation trace into
//! per-minute GPU demand (see `planner/README.md` for the derivation).

use serde::Serialize;

/// Prices, per GPU-hour, in any one currency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prices {
    /// Effective committed (reserved) price per GPU-hour.
    pub reserved: f64,
    /// On-demand price per GPU-hour (the spill price when burst is buyable).
    pub on_demand: f64,
    /// Whether on-demand GPUs can actually be bought at the moment of need.
    pub burst_available: bool,
    /// Cost per unmet GPU-hour when burst cannot be bought (the RT penalty).
    pub shortfall_penalty: f64,
}

/// One point of the buy-versus-spill curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurvePoint {
    /// GPUs committed.
    pub commit: u32,
    /// `reserved x commit` per hour.
    pub reserved_cost: f64,
    /// Expected spill (or shortfall) cost per hour.
    pub spill_cost: f64,
    /// Total expected cost per hour.
    pub total: f64,
    /// Expected fraction of committed GPUs in use.
    pub utilization: f64,
}

/// The recommendation and the curve behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// Samples of demand used.
    pub samples: usize,
    /// Mean demand (GPUs).
    pub mean: f64,
    /// Peak demand (GPUs).
    pub peak: u32,
    /// The 90th percentile of demand (for comparison with "p90" rules).
    pub p90: u32,
    /// Overflow price used: `on_demand`, or `shortfall_penalty` without burst.
    pub overflow_price: f64,
    /// `reserved / overflow_price`: the exceedance probability at the optimum.
    pub ratio: f64,
    /// The demand quantile committed to, `1 - ratio`.
    pub quantile: f64,
    /// `c* = F^-1(1 - ratio)`.
    pub commit: u32,
    /// Argmin of the cost curve (equals `commit` up to ties).
    pub curve_argmin: u32,
    /// Expected cost per hour at `commit`.
    pub cost_at_commit: f64,
    /// Expected cost per hour when committing to p90 instead.
    pub cost_at_p90: f64,
    /// Expected cost per hour with no commitment (all overflow).
    pub cost_all_overflow: f64,
    /// Expected cost per hour when committing to the peak.
    pub cost_at_peak: f64,
    /// Cost curve for `0..=peak`.
    pub curve: Vec<CurvePoint>,
}

fn quantile(sorted: &[u32], q: f64) -> u32 {
    // Smallest value v with F(v) >= q (the empirical inverse CDF).
    let n = sorted.len();
    let k = ((q * n as f64 - 1e-9).ceil() as usize).clamp(1, n);
    sorted[k - 1]
}

/// Sizes the commitment for demand samples (GPUs needed per period).
pub fn recommend(demand: &[u32], prices: Prices) -> Result<Recommendation, String> {
    if demand.is_empty() {
        return Err("commitment sizing needs at least one demand sample".into());
    }
    let overflow = if prices.burst_available {
        prices.on_demand
    } else {
        prices.shortfall_penalty
    };
    if !(prices.reserved > 0.0 && overflow > prices.reserved && overflow.is_finite()) {
        return Err(format!(
            "prices must satisfy 0 < reserved ({}) < overflow price ({overflow}); committing \
             never pays otherwise",
            prices.reserved
        ));
    }
    let mut sorted = demand.to_vec();
    sorted.sort_unstable();
    let n = sorted.len() as f64;
    let peak = *sorted.last().unwrap_or(&0);
    let mean = sorted.iter().map(|&d| f64::from(d)).sum::<f64>() / n;
    let ratio = prices.reserved / overflow;
    let q = 1.0 - ratio;
    let commit = quantile(&sorted, q);
    let cost = |c: u32| -> CurvePoint {
        let spill: f64 = sorted
            .iter()
            .map(|&d| f64::from(d.saturating_sub(c)))
            .sum::<f64>()
            / n;
        let used: f64 = sorted.iter().map(|&d| f64::from(d.min(c))).sum::<f64>() / n;
        let reserved_cost = prices.reserved * f64::from(c);
        let spill_cost = overflow * spill;
        CurvePoint {
            commit: c,
            reserved_cost,
            spill_cost,
            total: reserved_cost + spill_cost,
            utilization: if c == 0 { 0.0 } else { used / f64::from(c) },
        }
    };
    let curve: Vec<CurvePoint> = (0..=peak).map(cost).collect();
    let mut argmin = 0;
    for p in &curve {
        if p.total < curve[argmin as usize].total - 1e-9 {
            argmin = p.commit;
        }
    }
    let p90 = quantile(&sorted, 0.9);
    Ok(Recommendation {
        samples: sorted.len(),
        mean,
        peak,
        p90,
        overflow_price: overflow,
        ratio,
        quantile: q,
        commit,
        curve_argmin: argmin,
        cost_at_commit: cost(commit).total,
        cost_at_p90: cost(p90).total,
        cost_all_overflow: cost(0).total,
        cost_at_peak: cost(peak).total,
        curve,
    })
}

/// How trace tokens become GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TraceModel {
    /// Tokens (context + generated) one GPU serves per second.
    pub tokens_per_gpu_s: f64,
    /// Peak-to-trough ratio of the daily shape laid over the trace (1 = none;
    /// 2.5 for conversation traffic per §4.1 of the note).
    pub diurnal_ratio: f64,
}

/// Per-minute GPU demand from the Azure LLM inference trace
/// (`TIMESTAMP,ContextTokens,GeneratedTokens`). Each minute's tokens are
/// divided by `60 x tokens_per_gpu_s` and rounded up. With a diurnal ratio
/// above 1 the hour of minutes is replayed for each of 24 hours, scaled by a
/// cosine day shape (trough 08:00, peak 20:00 UTC, peak/trough = ratio)
/// normalised to 1 at the trace's own hour, giving 1,440 samples.
pub fn demand_from_azure_trace(text: &str, m: TraceModel) -> Result<Vec<u32>, String> {
    let bad = |x: f64, min: f64| x.is_nan() || x < min;
    if bad(m.tokens_per_gpu_s, f64::MIN_POSITIVE) || bad(m.diurnal_ratio, 1.0) {
        return Err("tokens_per_gpu_s must be > 0 and diurnal_ratio >= 1".into());
    }
    let mut minutes: Vec<(u32, f64)> = Vec::new(); // (minute of day, tokens)
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim().starts_with("TIMESTAMP") => {}
        _ => {
            return Err(
                "line 1: expected the header `TIMESTAMP,ContextTokens,GeneratedTokens`".into(),
            )
        }
    }
    let mut hour_of_trace = None;
    for (i, line) in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what} in `{line}`", i + 1);
        let mut f = line.split(',');
        let (Some(ts), Some(ctx), Some(gen)) = (f.next(), f.next(), f.next()) else {
            return Err(bad("expected 3 comma-separated fields"));
        };
        // `YYYY-MM-DD HH:MM:SS.fffffff`
        let time = ts
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| bad("no time of day"))?;
        let mut hm = time.split(':');
        let h: u32 = hm
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("bad hour"))?;
        let mi: u32 = hm
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("bad minute"))?;
        let ctx: f64 = ctx.trim().parse().map_err(|_| bad("bad ContextTokens"))?;
        let gen: f64 = gen.trim().parse().map_err(|_| bad("bad GeneratedTokens"))?;
        hour_of_trace.get_or_insert(h);
        let key = h * 60 + mi;
        match minutes.last_mut() {
            Some((k, tok)) if *k == key => *tok += ctx + gen,
            _ => minutes.push((key, ctx + gen)),
        }
    }
    if minutes.is_empty() {
        return Err("the trace has no data rows".into());
    }
    let per_min: Vec<f64> = minutes
        .iter()
        .map(|&(_, tok)| tok / (60.0 * m.tokens_per_gpu_s))
        .collect();
    if m.diurnal_ratio <= 1.0 {
        return Ok(per_min.iter().map(|g| g.ceil() as u32).collect());
    }
    let shape = |h: f64| {
        // 1 at the trough (08:00), ratio at the peak (20:00).
        let phase = ((h - 8.0) / 24.0) * std::f64::consts::TAU;
        1.0 + (m.diurnal_ratio - 1.0) * (1.0 - phase.cos()) / 2.0
    };
    let base = shape(f64::from(hour_of_trace.unwrap_or(18)));
    let mut out = Vec::with_capacity(per_min.len() * 24);
    for h in 0..24 {
        let k = shape(f64::from(h)) / base;
        out.extend(per_min.iter().map(|g| (g * k).ceil() as u32));
    }
    Ok(out)
}

/// Demand samples from a plain file: one number per line (GPUs per period,
/// e.g. the ledger's hourly RT GPU-hours); `#` comments allowed.
pub fn demand_from_lines(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let v = line.split('#').next().unwrap_or("").trim();
        if v.is_empty() {
            continue;
        }
        let last = v.rsplit([',', ' ', '\t']).next().unwrap_or(v);
        let x: f64 = last
            .parse()
            .map_err(|_| format!("line {}: `{v}` is not a number of GPUs", i + 1))?;
        if x.is_nan() || x < 0.0 {
            return Err(format!("line {}: demand must be >= 0", i + 1));
        }
        out.push(x.ceil() as u32);
    }
    if out.is_empty() {
        return Err("the demand file has no numbers".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices(r: f64) -> Prices {
        Prices {
            reserved: r,
            on_demand: 1.0,
            burst_available: true,
            shortfall_penalty: 8.0,
        }
    }

    #[test]
    fn critical_fractile_is_the_curve_minimum() {
        // Demand 1..=100 uniformly: F^-1(0.4) = 40.
        let d: Vec<u32> = (1..=100).collect();
        let rec = recommend(&d, prices(0.6)).unwrap();
        assert_eq!(rec.commit, 40);
        assert_eq!(rec.p90, 90);
        // Ties: cost is flat between the fractile and the next sample.
        let min = rec
            .curve
            .iter()
            .map(|p| p.total)
            .fold(f64::INFINITY, f64::min);
        assert!(
            (rec.cost_at_commit - min).abs() < 1e-9,
            "{} vs {min}",
            rec.cost_at_commit
        );
        assert!(rec.cost_at_p90 > rec.cost_at_commit);
        // 3-year (r = 0.4p) commits more: the 60th percentile.
        assert_eq!(recommend(&d, prices(0.4)).unwrap().commit, 60);
    }

    #[test]
    fn no_burst_moves_the_answer_towards_p90() {
        let d: Vec<u32> = (1..=100).collect();
        let mut p = prices(0.6);
        p.burst_available = false;
        p.shortfall_penalty = 6.0; // r/pi = 0.1 -> p90
        let rec = recommend(&d, p).unwrap();
        assert_eq!(rec.commit, 90);
        assert!((rec.ratio - 0.1).abs() < 1e-12);
    }

    #[test]
    fn trace_minutes_become_gpus() {
        let t = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:15:46.68,6000,0\n2023-11-16 18:15:50.9,5999,1\n\
                 2023-11-16 18:16:01.0,100,20\n";
        let m = TraceModel {
            tokens_per_gpu_s: 100.0,
            diurnal_ratio: 1.0,
        };
        assert_eq!(demand_from_azure_trace(t, m).unwrap(), vec![2, 1]);
        let day = demand_from_azure_trace(
            t,
            TraceModel {
                diurnal_ratio: 2.5,
                ..m
            },
        )
        .unwrap();
        assert_eq!(day.len(), 48);
        assert!(demand_from_azure_trace("a,b\n", m)
            .unwrap_err()
            .contains("line 1"));
        assert!(demand_from_lines("3\n# x\nfoo\n")
            .unwrap_err()
            .contains("line 3"));
    }

    #[test]
    fn bad_prices_are_refused() {
        assert!(recommend(&[1, 2], prices(1.5)).is_err());
        assert!(recommend(&[], prices(0.5)).is_err());
    }
}
