//! The ledger's figures for every booked event, computed in one pass over
//! the store's rows (so SQLite and PostgreSQL give the same report), and
//! printed as a terminal table or JSON.
//!
//! Tenant budgets ([`BudgetLine`]) are the one figure not taken from the
//! scan: each budget's spend in its period is summed by the store
//! ([`crate::budget::spends`]), as the control service reads it, so the
//! report shows the spend the filter was held to. Sums of integers, so
//! both stores still give the same report.
//!
//! Names in the table come from access-log lines, which anyone who can
//! send a request partly writes: control characters are printed escaped
//! ([`terminal`]), so a tenant name cannot drive the terminal.

use crate::chargeback::{self, Chargeback, PoolUse};
use crate::configs::Registry;
use crate::money::{usd, Nano};
use crate::price;
use crate::row::Row;
use crate::split::Split;
use crate::store::Reject;
use crate::store::Store;
use crate::window::{self, Rules, Window};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

pub use crate::text::terminal;

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

/// Prefix locality's requests: those ACE sent to a destination it
/// expected to hold part of their prompt (the event's
/// `tokens_prefix_held`), and what that destination's prompt cache then
/// took off their input. Not a fifth part of the split: the counterfactual
/// prices the same cache reads at its own destination's cached price, so
/// the split's total already nets them out; this says what the caches gave
/// the requests locality kept with their prefix's holder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LocalityLine {
    /// Served requests sent to a holder.
    pub requests: u64,
    /// Input tokens the holders were expected to hold.
    pub held_tokens: u64,
    /// Of those, the input tokens their usage says were read from the
    /// cache.
    pub cache_read_tokens: u64,
    /// What reading them from the cache took off their list input price.
    pub discount: Nano,
}

/// One tenant budget's use: its terms, as the configuration of the
/// report's latest event that defines it has them; its spend in the
/// period holding the report's last event (`Report::last_ms`, so the same
/// events give the same report whenever it is run); and what it did to
/// the requests whose event names it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BudgetLine {
    /// Its name.
    pub name: String,
    /// Whether a configuration of the report's events defines it; when
    /// not, only events name it (a budget since removed, or a line
    /// naming what it likes), and only the counts are known.
    pub configured: bool,
    /// The tenants whose spend it counts.
    pub tenants: Vec<String>,
    /// `day`, `week`, `month` or `rolling` (none: no amount, so no
    /// period).
    pub period: Option<String>,
    /// A rolling period's length, ms.
    pub window_ms: Option<u64>,
    /// The spend allowed per period, USD (none: a token limit only).
    pub usd: Option<f64>,
    /// Tokens its tenants may use per minute, per proxy.
    pub tokens_per_minute: Option<u64>,
    /// When the period holding the last event began, Unix ms.
    pub start_ms: Option<u64>,
    /// When it resets, Unix ms (0: a rolling window).
    pub resets_ms: Option<u64>,
    /// Booked cost of its tenants in that period (none without an
    /// amount).
    pub spent: Option<Nano>,
    /// `spent` over the amount.
    pub used: Option<f64>,
    /// Where that spend leaves it: `ok`, `soft` or `exhausted`.
    pub state: Option<String>,
    /// Requests refused (429) because it was exhausted.
    pub refused_exhausted: u64,
    /// Requests refused (429) for its tokens per minute.
    pub refused_tokens: u64,
    /// Requests served while it was soft, on the rungs it allows.
    pub served_soft: u64,
    /// Requests refused (429) while it was soft: none of the rungs it
    /// allows could take them.
    pub refused_soft: u64,
    /// Other events naming it: a soft request that then failed upstream,
    /// or a state or status that does not go with a budget's (a line the
    /// filter did not write).
    pub other: u64,
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
    /// Lines of events that could not be priced because their
    /// configuration is not registered (or an `ace.event/1` line named
    /// none), and that no later ingest booked.
    pub unpriced: Vec<Reject>,
    pub disagreements: u64,
    /// Events booked under a derived id (`<event_id>~<hash>`) because a
    /// different event was stored under their logged `event_id` first:
    /// one of the two is forged or the writer reused an id.
    pub conflicts: Vec<String>,
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
    /// Prefix locality's requests ([`LocalityLine`]).
    pub locality: LocalityLine,
    /// Every tenant budget the report's events' configurations define or
    /// its events name, by name ([`BudgetLine`]).
    pub budgets: Vec<BudgetLine>,
    /// The books against the providers' bills stored
    /// ([`crate::bill::reconcile`]; empty when none is).
    pub bills: crate::bill::reconcile::Reconciliation,
}

/// Which windows [`Report::table_listing`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Those that forfeited savings, with the reason (`ace ledger report`).
    Forfeited,
    /// Every one, with why it kept or forfeited its savings.
    Every,
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
    let rejects = store.rejects()?;
    let waiting: HashSet<&str> = rejects
        .iter()
        .filter_map(|r| r.event_id.as_deref())
        .collect();
    let mut booked_since: HashSet<String> = HashSet::new();
    let mut config_last: HashMap<String, i64> = HashMap::new();
    let mut budget_counts: BTreeMap<String, BudgetLine> = BTreeMap::new();
    store.scan(&mut |row: Row| {
        match config_last.get_mut(row.config.as_str()) {
            Some(t) => *t = (*t).max(row.time_ms),
            None => {
                config_last.insert(row.config.clone(), row.time_ms);
            }
        }
        if let Some(name) = row.budget.as_deref() {
            count_budget(&mut budget_counts, name, &row);
        }
        if waiting.contains(row.event_id.as_str()) {
            booked_since.insert(row.event_id.clone());
        }
        let split = Split::of(&row);
        let (tenant, start) = window::key(&row, rules);
        r.events += 1;
        r.first_ms = r.first_ms.min(row.time_ms);
        r.last_ms = r.last_ms.max(row.time_ms);
        r.disagreements += u64::from(row.disagrees());
        if row.conflicted() {
            r.conflicts.push(row.event_id.clone());
        }
        r.estimated_tokens += u64::from(row.tokens_estimated);
        r.usage_capped += u64::from(row.usage_capped);
        r.booked = r.booked.saturating_add(row.booked);
        let d = direct.entry(tenant.clone()).or_default();
        *d = d.saturating_add(row.booked);
        let tokens = count(row.tokens_in).saturating_add(count(row.tokens_out));
        if row.served() {
            r.served += 1;
            r.booked_served = r.booked_served.saturating_add(row.booked);
            r.counterfactual = r
                .counterfactual
                .saturating_add(row.counterfactual.unwrap_or(row.booked));
            if row.slo_met != Some(false) {
                r.goodput_tokens = r.goodput_tokens.saturating_add(count(row.tokens_out));
            }
        } else {
            r.not_served += 1;
        }
        r.savings.add(&split);
        let tier = row.tier.clone().unwrap_or_else(|| "(refused)".to_string());
        let t = r.by_tier.entry(tier.clone()).or_default();
        t.events += 1;
        t.tokens = t.tokens.saturating_add(tokens);
        t.booked = t.booked.saturating_add(row.booked);
        let c = r
            .cost_series
            .entry(start)
            .or_default()
            .entry(tier)
            .or_default();
        *c = c.saturating_add(row.booked);
        if let (Some(dest), true) = (row.destination.as_deref(), row.served()) {
            let model = registry
                .get(&row.config)
                .and_then(|c| price::model_of(&c.config, dest).copied());
            if let Some(m) = model.filter(|m| m.tier.is_sunk()) {
                let p = pools.entry(dest.to_string()).or_default();
                p.knee = m.knee;
                p.capacity = m.capacity;
                p.usage.tier = m.tier.as_str().to_string();
                p.usage.usd_per_hour = m.usd_per_gpu_hour;
                p.usage.capacity = m.capacity;
                let busy = row.latency_ms.max(0);
                p.usage.busy_ms = p.usage.busy_ms.saturating_add(busy);
                let t = p.usage.tokens.entry(tenant.clone()).or_default();
                *t = t.saturating_add(tokens);
                let b = p.busy.entry(start).or_default();
                *b = b.saturating_add(busy);
            }
        }
        if row.served() && row.tokens_prefix_held > 0 {
            let l = &mut r.locality;
            let held = count(row.tokens_prefix_held);
            let read = count(row.tokens_cache_read).min(held);
            l.requests += 1;
            l.held_tokens = l.held_tokens.saturating_add(held);
            l.cache_read_tokens = l.cache_read_tokens.saturating_add(read);
            let off = row.destination.as_deref().and_then(|dest| {
                let c = registry.get(&row.config)?;
                let d = c.config.destinations.iter().find(|d| d.name == dest)?;
                let list_in = price::model_of(&c.config, dest)?.rest_prices().0;
                Some(read as f64 * list_in * (1.0 - d.cache_factors().0))
            });
            let off = crate::money::from_usd_saturating(off.unwrap_or(0.0).max(0.0));
            l.discount = l.discount.saturating_add(off);
        }
        let tl = r.by_tenant.entry(tenant.clone()).or_default();
        tl.events += 1;
        tl.served += u64::from(row.served());
        tl.booked = tl.booked.saturating_add(row.booked);
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
    let still = |r: &&Reject| {
        r.event_id
            .as_ref()
            .is_none_or(|id| !booked_since.contains(id))
    };
    r.rejected_lines = rejects.iter().filter(still).count() as u64;
    r.unpriced = rejects
        .iter()
        .filter(still)
        .filter(|r| r.event_id.is_some())
        .cloned()
        .collect();
    for w in windows.values_mut() {
        w.judge(rules);
        let tl = r.by_tenant.entry(w.tenant.clone()).or_default();
        let kept = w.kept();
        r.forfeited.add(&w.lost);
        tl.forfeited = tl.forfeited.saturating_add(w.lost.total());
        r.earned.add(&kept);
        tl.earned = tl.earned.saturating_add(kept.total());
    }
    r.windows = windows.into_values().collect();
    if r.events == 0 {
        r.first_ms = 0;
        r.last_ms = 0;
    }
    let w = rules.window_ms.max(1);
    let period = charged_period(r.cost_series.keys().copied(), w);
    let booked_usd = crate::money::usd_f64(r.booked);
    r.goodput_per_usd = (booked_usd > 0.0).then(|| r.goodput_tokens as f64 / booked_usd);
    // Capacity is paid for used or not: every standing pool is charged.
    for (name, s) in chargeback::standing(registry, &config_last) {
        pools.entry(name).or_insert_with(|| PoolAcc {
            knee: s.knee,
            capacity: s.usage.capacity,
            usage: s.usage,
            ..PoolAcc::default()
        });
    }
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
    r.budgets = budgets(store, registry, &config_last, budget_counts, r.last_ms)?;
    r.bills = crate::bill::reconcile::run(store, registry, &Default::default())?;
    Ok(r)
}

/// Count `row`, which names budget `name`, in its line.
fn count_budget(lines: &mut BTreeMap<String, BudgetLine>, name: &str, row: &Row) {
    let l = lines.entry(name.to_string()).or_insert_with(|| BudgetLine {
        name: name.to_string(),
        ..BudgetLine::default()
    });
    let refused = row.status == 429 && !row.served();
    let n = match (row.budget_state.as_deref(), refused) {
        (Some("exhausted"), true) => &mut l.refused_exhausted,
        (Some("tokens_per_minute"), true) => &mut l.refused_tokens,
        (Some("soft"), true) => &mut l.refused_soft,
        (Some("soft"), false) if row.served() => &mut l.served_soft,
        _ => &mut l.other,
    };
    *n = n.saturating_add(1);
}

/// The budget lines: each budget the configurations of the events define
/// (the definition of the configuration whose latest event is latest
/// winning), with its spend in the period holding `last_ms`, and each
/// budget only events name, with `counts` from the events.
fn budgets(
    store: &mut dyn Store,
    registry: &Registry,
    config_last: &HashMap<String, i64>,
    mut counts: BTreeMap<String, BudgetLine>,
    last_ms: i64,
) -> anyhow::Result<Vec<BudgetLine>> {
    let mut configs: Vec<(&i64, &String)> = config_last.iter().map(|(c, t)| (t, c)).collect();
    configs.sort();
    let mut defined: BTreeMap<&str, &ace_config::budget::Budget> = BTreeMap::new();
    for (_, id) in configs {
        if let Some(setup) = registry.get(id) {
            for b in &setup.config.budgets.list {
                defined.insert(b.name.as_str(), b);
            }
        }
    }
    let with_amount: Vec<&ace_config::budget::Budget> = defined
        .values()
        .copied()
        .filter(|b| b.usd.is_some())
        .collect();
    let now = u64::try_from(last_ms).unwrap_or(0);
    let spends = crate::budget::spends(store, &with_amount, now)?;
    let spent: HashMap<&str, crate::budget::Spend> = with_amount
        .iter()
        .map(|b| b.name.as_str())
        .zip(spends)
        .collect();
    for (name, b) in defined {
        let l = counts.entry(name.to_string()).or_default();
        l.name = name.to_string();
        l.configured = true;
        l.tenants = b.tenants.clone();
        l.usd = b.usd;
        l.tokens_per_minute = b.tokens_per_minute;
        if let (Some(usd), Some(s)) = (b.usd, spent.get(name)) {
            l.period = Some(b.period.as_str().to_string());
            if let ace_config::budget::Period::Rolling { ms } = b.period {
                l.window_ms = Some(ms);
            }
            l.start_ms = Some(s.start_ms);
            l.resets_ms = Some(s.resets_ms);
            l.spent = Some(s.spent);
            l.used = Some(crate::money::usd_f64(s.spent) / usd);
            let state = b.state(crate::budget::spent_usd(s.spent));
            l.state = Some(state.as_str().to_string());
        }
    }
    Ok(counts.into_values().collect())
}

/// The longest stretch without any event that a pool is still charged
/// for: one day (a quiet night is idle capacity; a longer silence is a log
/// from elsewhere or a wrong clock).
pub const MAX_CHARGED_GAP_MS: i64 = 86_400_000;

/// The chargeback period over the window starts that hold events (in
/// order): from the first window's start to the last one's end, except
/// that a gap of more than [`MAX_CHARGED_GAP_MS`] between two windows with
/// events counts as nothing. So one stray event far from the rest adds one
/// window to every owned pool's bill, never the years between.
pub fn charged_period(starts: impl Iterator<Item = i64>, window_ms: i64) -> i64 {
    let mut period = 0i64;
    let mut last: Option<i64> = None;
    for s in starts {
        let step = match last {
            Some(l) if s.saturating_sub(l) <= MAX_CHARGED_GAP_MS => s.saturating_sub(l),
            _ => window_ms,
        };
        period = period.saturating_add(step);
        last = Some(s);
    }
    period
}

/// A stored count as `u64` (a negative one, which only an edited store
/// holds, as 0).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// How many conflicts or unpriced lines the table names.
const SHOWN: usize = 20;

fn more(s: &mut String, n: usize) {
    if n > SHOWN {
        let _ = writeln!(s, "  ... and {} more", n - SHOWN);
    }
}

fn pct(part: Nano, whole: Nano) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1} %", part as f64 * 100.0 / whole as f64)
    }
}

/// A budget's period as the table shows it (`rolling 3600 s`).
pub fn budget_period(b: &BudgetLine) -> String {
    match (b.period.as_deref(), b.window_ms) {
        (Some(p), Some(ms)) => format!("{p} {} s", ms / 1000),
        (Some(p), None) => p.to_string(),
        (None, _) => "-".to_string(),
    }
}

/// A budget's amount as the table shows it: USD, or its token limit.
pub fn budget_amount(b: &BudgetLine) -> String {
    match (b.usd, b.tokens_per_minute) {
        (Some(u), _) => usd(crate::money::from_usd_saturating(u)),
        (None, Some(t)) => format!("{t} tokens/min"),
        (None, None) => "-".into(),
    }
}

/// A budget's share used as the table shows it.
pub fn budget_used(b: &BudgetLine) -> String {
    b.used.map_or("-".into(), |u| format!("{:.1} %", u * 100.0))
}

impl Report {
    /// The budgets' lines of the table (nothing when there are none).
    fn budget_table(&self, s: &mut String) {
        if self.budgets.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\nbudgets, spend in the period holding the last event ({}):",
            crate::time::rfc3339(self.last_ms)
        );
        let _ = writeln!(
            s,
            "{:<20} {:<14} {:>18} {:>18} {:>8} {:<9} {:>9} {:>10} {:>11} {:>12} {:>6}  tenants",
            "budget",
            "period",
            "amount",
            "spent",
            "used",
            "state",
            "exhausted",
            "tokens/min",
            "served soft",
            "refused soft",
            "other"
        );
        for b in &self.budgets {
            let tenants: Vec<String> = b.tenants.iter().map(|t| terminal(t)).collect();
            let tenants = if b.configured {
                tenants.join(", ")
            } else {
                "(in no configuration of these events)".into()
            };
            let _ = writeln!(
                s,
                "{:<20} {:<14} {:>18} {:>18} {:>8} {:<9} {:>9} {:>10} {:>11} {:>12} {:>6}  {tenants}",
                terminal(&b.name),
                budget_period(b),
                budget_amount(b),
                b.spent.map_or("-".into(), usd),
                budget_used(b),
                b.state.as_deref().unwrap_or("-"),
                b.refused_exhausted,
                b.refused_tokens,
                b.served_soft,
                b.refused_soft,
                b.other
            );
        }
        let _ = writeln!(
            s,
            "  requests naming each: refused (429) as exhausted or over tokens per minute; \
             served or refused (429) while soft; other"
        );
    }

    /// Each tenant window's forfeit reason (`None` when it kept its
    /// savings), by (tenant, window start).
    pub fn verdicts(&self) -> BTreeMap<(String, i64), Option<String>> {
        self.windows
            .iter()
            .map(|w| ((w.tenant.clone(), w.start_ms), w.forfeited.clone()))
            .collect()
    }

    /// The terminal table, naming the forfeited windows.
    pub fn table(&self) -> String {
        self.table_listing(Windows::Forfeited)
    }

    /// The terminal table, naming the `windows` chosen: each forfeited
    /// one with its reason, or every one with why it kept or forfeited
    /// its savings ([`Window::explain`]).
    pub fn table_listing(&self, windows: Windows) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "events {}  served {}  not served {}  malformed lines {}  cost disagreements with the filter {}  event id conflicts {}",
            self.events, self.served, self.not_served, self.rejected_lines, self.disagreements, self.conflicts.len()
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
        if self.locality.requests > 0 {
            let l = &self.locality;
            let _ = writeln!(
                s,
                "\nprefix locality: {} requests sent to their prefix's holder, {} input tokens expected held, {} read from its cache, ${} off their input",
                l.requests,
                l.held_tokens,
                l.cache_read_tokens,
                usd(l.discount)
            );
        }
        self.budget_table(&mut s);
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
            let tier = terminal(tier);
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
            let name = terminal(name);
            let _ = writeln!(
                s,
                "{name:<20} {:>8} {:>18} {:>18} {:>18} {:>18} {:>18}",
                t.events,
                usd(t.booked),
                usd(t.earned),
                usd(t.forfeited),
                usd(cb.used_capacity.saturating_add(cb.idle_capacity)),
                usd(cb.total)
            );
        }
        // Capacity no tenant used: charged, with no event of its own.
        for (name, cb) in &self.chargeback.tenants {
            if !self.by_tenant.contains_key(name) {
                let _ = writeln!(
                    s,
                    "{:<20} {:>8} {:>18} {:>18} {:>18} {:>18} {:>18}",
                    terminal(name),
                    0,
                    usd(0),
                    usd(0),
                    usd(0),
                    usd(cb.used_capacity.saturating_add(cb.idle_capacity)),
                    usd(cb.total)
                );
            }
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
                    terminal(&p.destination),
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
        match windows {
            Windows::Forfeited => {
                for w in forfeited {
                    let _ = writeln!(
                        s,
                        "  forfeited {} @ {} ({} ms): ${}: {}",
                        terminal(&w.tenant),
                        crate::time::rfc3339(w.start_ms),
                        w.start_ms,
                        usd(w.savings.total()),
                        terminal(w.forfeited.as_deref().unwrap_or(""))
                    );
                }
            }
            Windows::Every => {
                for w in &self.windows {
                    let _ =
                        writeln!(
                        s,
                        "  {} {} @ {}: {} event{}, savings ${}, kept ${}, forfeited ${}\n      {}",
                        if w.forfeited.is_some() { "forfeited" } else { "earned" },
                        terminal(&w.tenant),
                        crate::time::rfc3339(w.start_ms),
                        w.events,
                        if w.events == 1 { "" } else { "s" },
                        usd(w.savings.total()),
                        usd(w.kept().total()),
                        usd(w.lost.total()),
                        terminal(&w.explain(&self.rules))
                    );
                }
            }
        }
        self.bills.table(&mut s);
        if !self.conflicts.is_empty() {
            let _ = writeln!(
                s,
                "
event id conflicts {}: a different event was stored under each one's logged \
                 id first, so it is booked apart (`ace ledger trace --flagged`):",
                self.conflicts.len()
            );
            for id in self.conflicts.iter().take(SHOWN) {
                let _ = writeln!(s, "  {}", terminal(id));
            }
            more(&mut s, self.conflicts.len());
        }
        if !self.unpriced.is_empty() {
            let _ = writeln!(
                s,
                "
lines not priced {}: register their configuration (`ace ledger ingest \
                 --config FILE`) and ingest them again:",
                self.unpriced.len()
            );
            for r in self.unpriced.iter().take(SHOWN) {
                let _ = writeln!(
                    s,
                    "  {}:{}: {}",
                    terminal(&r.source),
                    r.line,
                    terminal(&r.error)
                );
            }
            more(&mut s, self.unpriced.len());
        }
        s
    }
}
