//! The ledger's figures for every booked event, computed in one pass over
//! the store's rows (so SQLite and PostgreSQL give the same report), and
//! printed as a terminal table or JSON.

use crate::chargeback::{self, Chargeback, PoolUse};
use crate::configs::Registry;
use crate::money::{usd, Nano};
use crate::price;
use crate::row::Row;
use crate::split::Split;
use crate::store::Store;
use crate::window::{self, Rules, Window};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Totals for one tier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TierLine {
    pub events: u64,
    pub tokens: u64,
    pub booked: Nano,
}

/// Totals for one tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TenantLine {
    pub events: u64,
    pub served: u64,
    pub booked: Nano,
    pub earned: Nano,
    pub forfeited: Nano,
}

/// One owned or reserved pool's utilisation per window, against its knee.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolSeries {
    pub destination: String,
    pub knee: f64,
    pub capacity: u32,
    /// (window start ms, utilisation).
    pub points: Vec<(i64, f64)>,
}

/// Everything `ace ledger report` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub rules: Rules,
    pub events: u64,
    pub served: u64,
    pub not_served: u64,
    pub rejected_lines: u64,
    pub disagreements: u64,
    pub estimated_tokens: u64,
    pub usage_capped: u64,
    pub first_ms: i64,
    pub last_ms: i64,
    /// Booked marginal cost of every event.
    pub booked: Nano,
    /// What the cheapest feasible pay-as-you-go would have charged for the
    /// served requests (their booked cost where none was feasible).
    pub counterfactual: Nano,
    /// Booked cost of the served requests.
    pub booked_served: Nano,
    /// Savings before the window rule (= counterfactual − booked_served).
    pub savings: Split,
    /// Savings of windows that held their bounds.
    pub earned: Split,
    /// Savings of windows that did not.
    pub forfeited: Split,
    /// Output tokens of served requests that met their SLO (or had none).
    pub goodput_tokens: u64,
    /// Goodput tokens per booked dollar.
    pub goodput_per_usd: Option<f64>,
    pub by_tier: BTreeMap<String, TierLine>,
    pub by_tenant: BTreeMap<String, TenantLine>,
    /// Every tenant window, by tenant then start.
    pub windows: Vec<Window>,
    /// Booked cost per window start per tier.
    pub cost_series: BTreeMap<i64, BTreeMap<String, Nano>>,
    pub pools: Vec<PoolSeries>,
    pub chargeback: Chargeback,
}

#[derive(Default)]
struct PoolAcc {
    knee: f64,
    capacity: u32,
    busy: BTreeMap<i64, i64>,
    usage: PoolUse,
}

/// Compute the report over every row of `store`.
pub fn build(store: &mut dyn Store, registry: &Registry, rules: &Rules) -> anyhow::Result<Report> {
    let mut r = Report {
        rules: rules.clone(),
        first_ms: i64::MAX,
        last_ms: i64::MIN,
        ..Report::default()
    };
    let mut windows: BTreeMap<(String, i64), Window> = BTreeMap::new();
    let mut pools: BTreeMap<String, PoolAcc> = BTreeMap::new();
    let mut direct: BTreeMap<String, Nano> = BTreeMap::new();
    store.scan(&mut |row: Row| {
        let split = Split::of(&row);
        let (tenant, start) = window::key(&row, rules);
        r.events += 1;
        r.first_ms = r.first_ms.min(row.time_ms);
        r.last_ms = r.last_ms.max(row.time_ms);
        r.disagreements += u64::from(!row.flags.is_empty());
        r.estimated_tokens += u64::from(row.tokens_estimated);
        r.usage_capped += u64::from(row.usage_capped);
        r.booked += row.booked;
        *direct.entry(tenant.clone()).or_default() += row.booked;
        let tokens = (row.tokens_in + row.tokens_out) as u64;
        if row.served() {
            r.served += 1;
            r.booked_served += row.booked;
            r.counterfactual += row.counterfactual.unwrap_or(row.booked);
            if row.slo_met != Some(false) {
                r.goodput_tokens += row.tokens_out as u64;
            }
        } else {
            r.not_served += 1;
        }
        r.savings.add(&split);
        let tier = row.tier.clone().unwrap_or_else(|| "(refused)".to_string());
        let t = r.by_tier.entry(tier.clone()).or_default();
        t.events += 1;
        t.tokens += tokens;
        t.booked += row.booked;
        *r.cost_series
            .entry(start)
            .or_default()
            .entry(tier)
            .or_default() += row.booked;
        if let (Some(dest), true) = (row.destination.as_deref(), row.served()) {
            let model = registry
                .get(&row.config)
                .and_then(|c| price::model_of(c, dest).copied());
            if let Some(m) = model.filter(|m| m.tier.is_sunk()) {
                let p = pools.entry(dest.to_string()).or_default();
                p.knee = m.knee;
                p.capacity = m.capacity;
                p.usage.tier = m.tier.as_str().to_string();
                p.usage.usd_per_hour = m.usd_per_gpu_hour;
                p.usage.capacity = m.capacity;
                p.usage.busy_ms += row.latency_ms;
                *p.usage.tokens.entry(tenant.clone()).or_default() += tokens;
                *p.busy
                    .entry(row.time_ms - row.time_ms.rem_euclid(rules.window_ms.max(1)))
                    .or_default() += row.latency_ms;
            }
        }
        let tl = r.by_tenant.entry(tenant.clone()).or_default();
        tl.events += 1;
        tl.served += u64::from(row.served());
        tl.booked += row.booked;
        let w = windows
            .entry((tenant.clone(), start))
            .or_insert_with(|| Window {
                tenant,
                start_ms: start,
                ..Window::default()
            });
        w.add(&row, &split);
        Ok(())
    })?;
    r.rejected_lines = store.rejects()?.len() as u64;
    for w in windows.values_mut() {
        w.judge(rules);
        let tl = r.by_tenant.entry(w.tenant.clone()).or_default();
        let kept = w.kept();
        r.forfeited.add(&w.lost);
        tl.forfeited += w.lost.total();
        r.earned.add(&kept);
        tl.earned += kept.total();
    }
    r.windows = windows.into_values().collect();
    if r.events == 0 {
        r.first_ms = 0;
        r.last_ms = 0;
    }
    let w = rules.window_ms.max(1);
    let period_start = r.first_ms - r.first_ms.rem_euclid(w);
    let period_end = r.last_ms - r.last_ms.rem_euclid(w) + w;
    let period = if r.events == 0 {
        0
    } else {
        period_end - period_start
    };
    let booked_usd = crate::money::usd_f64(r.booked);
    r.goodput_per_usd = (booked_usd > 0.0).then(|| r.goodput_tokens as f64 / booked_usd);
    r.pools = pools
        .iter()
        .map(|(name, p)| PoolSeries {
            destination: name.clone(),
            knee: p.knee,
            capacity: p.capacity,
            points: p
                .busy
                .iter()
                .map(|(s, busy)| (*s, *busy as f64 / (w as f64 * f64::from(p.capacity.max(1)))))
                .collect(),
        })
        .collect();
    let uses: BTreeMap<String, PoolUse> = pools.into_iter().map(|(k, p)| (k, p.usage)).collect();
    r.chargeback = chargeback::build(&direct, &uses, period);
    Ok(r)
}

fn pct(part: Nano, whole: Nano) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1} %", part as f64 * 100.0 / whole as f64)
    }
}

impl Report {
    /// Each tenant window's forfeit reason (`None` when it kept its
    /// savings), by (tenant, window start).
    pub fn verdicts(&self) -> BTreeMap<(String, i64), Option<String>> {
        self.windows
            .iter()
            .map(|w| ((w.tenant.clone(), w.start_ms), w.forfeited.clone()))
            .collect()
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "events {}  served {}  not served {}  malformed lines {}  cost disagreements with the filter {}",
            self.events, self.served, self.not_served, self.rejected_lines, self.disagreements
        );
        let _ = writeln!(
            s,
            "booked (true marginal) ${}   all pay-as-you-go ${}   savings ${} ({} of pay-as-you-go)",
            usd(self.booked),
            usd(self.counterfactual),
            usd(self.savings.total()),
            pct(self.savings.total(), self.counterfactual)
        );
        let _ = writeln!(
            s,
            "\n{:<14} {:>18} {:>18} {:>18}",
            "savings", "total", "earned", "forfeited"
        );
        let rows = [
            (
                "utilisation",
                self.savings.utilisation,
                self.earned.utilisation,
                self.forfeited.utilisation,
            ),
            (
                "arbitrage",
                self.savings.arbitrage,
                self.earned.arbitrage,
                self.forfeited.arbitrage,
            ),
            (
                "model routing",
                self.savings.routing,
                self.earned.routing,
                self.forfeited.routing,
            ),
            (
                "caching",
                self.savings.caching,
                self.earned.caching,
                self.forfeited.caching,
            ),
            (
                "total",
                self.savings.total(),
                self.earned.total(),
                self.forfeited.total(),
            ),
        ];
        for (name, t, e, f) in rows {
            let _ = writeln!(s, "{name:<14} {:>18} {:>18} {:>18}", usd(t), usd(e), usd(f));
        }
        match self.goodput_per_usd {
            Some(g) => {
                let _ = writeln!(
                    s,
                    "\ngoodput {} output tokens within SLO, {g:.0} per booked dollar",
                    self.goodput_tokens
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "\ngoodput {} output tokens within SLO (nothing booked)",
                    self.goodput_tokens
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{:<12} {:>9} {:>12} {:>18}",
            "tier", "events", "tokens", "booked"
        );
        for (tier, t) in &self.by_tier {
            let _ = writeln!(
                s,
                "{tier:<12} {:>9} {:>12} {:>18}",
                t.events,
                t.tokens,
                usd(t.booked)
            );
        }
        let _ = writeln!(
            s,
            "\n{:<20} {:>8} {:>18} {:>18} {:>18} {:>18} {:>18}",
            "tenant", "events", "booked", "earned", "forfeited", "capacity share", "chargeback"
        );
        for (name, t) in &self.by_tenant {
            let cb = self
                .chargeback
                .tenants
                .get(name)
                .cloned()
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "{name:<20} {:>8} {:>18} {:>18} {:>18} {:>18} {:>18}",
                t.events,
                usd(t.booked),
                usd(t.earned),
                usd(t.forfeited),
                usd(cb.used_capacity + cb.idle_capacity),
                usd(cb.total)
            );
        }
        if !self.chargeback.pools.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<20} {:>10} {:>18} {:>18} {:>18}",
                "pool", "use", "cost", "used", "idle"
            );
            for p in &self.chargeback.pools {
                let _ = writeln!(
                    s,
                    "{:<20} {:>9.1}% {:>18} {:>18} {:>18}",
                    p.destination,
                    p.utilisation * 100.0,
                    usd(p.cost),
                    usd(p.used),
                    usd(p.idle)
                );
            }
        }
        let forfeited: Vec<&Window> = self
            .windows
            .iter()
            .filter(|w| w.forfeited.is_some())
            .collect();
        let _ = writeln!(
            s,
            "\nwindows of {} s: {} ({} forfeited)",
            self.rules.window_ms / 1000,
            self.windows.len(),
            forfeited.len()
        );
        for w in forfeited {
            let _ = writeln!(
                s,
                "  forfeited {} @ {} ({} ms): ${}: {}",
                w.tenant,
                crate::focus::rfc3339(w.start_ms),
                w.start_ms,
                usd(w.savings.total()),
                w.forfeited.as_deref().unwrap_or("")
            );
        }
        s
    }
}
