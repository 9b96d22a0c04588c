//! The anti-gaming rule: savings are earned per tenant per window, and only
//! when the window's service held its bounds.
//!
//! A cheaper fleet that drops requests, misses SLOs or serves wrong cache
//! hits would show savings it did not earn. So every event falls into the
//! window `[start, start + window)` of its tenant (`start` a multiple of
//! the window length since the epoch) and a window forfeits its savings,
//! with the reason, when any of these fails:
//!
//! - served fraction `served / events >= min_served` (all its savings);
//! - for each latency class with an SLO, `met / with_slo >= min_slo`
//!   (a per-class bound overrides the default; all its savings);
//! - cache false-hit rate `false_hits / checked <= max_false_hit`, over
//!   the hits the filter sent upstream as well to check them (reason
//!   `cache_check`; vacuous while none was checked): its caching savings,
//!   since a wrong answer from the cache says nothing about the rest.

use crate::row::Row;
use crate::split::Split;
use std::collections::BTreeMap;

/// The bounds a window must hold.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rules {
    /// Window length, ms.
    pub window_ms: i64,
    /// Least served fraction.
    pub min_served: f64,
    /// Least SLO attainment for a latency class not in `min_slo_by_class`.
    pub min_slo: f64,
    /// Least SLO attainment per latency class.
    pub min_slo_by_class: BTreeMap<String, f64>,
    /// Most cache false-hit rate.
    pub max_false_hit: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            window_ms: 5 * 60 * 1000,
            min_served: 0.99,
            min_slo: 0.95,
            min_slo_by_class: BTreeMap::new(),
            max_false_hit: 0.01,
        }
    }
}

/// The name a tenant-less event is booked under.
pub const NO_TENANT: &str = "(none)";
/// The name of the latency class of an event that names none.
pub const NO_CLASS: &str = "(default)";

/// One tenant's window.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Window {
    pub tenant: String,
    pub start_ms: i64,
    pub events: u64,
    pub served: u64,
    /// Per latency class: (met, with an SLO).
    pub slo: BTreeMap<String, (u64, u64)>,
    pub cache_hits: u64,
    /// Hits checked against the upstream, and how many of them were wrong.
    pub checked: u64,
    pub false_hits: u64,
    /// Savings before the rule.
    pub savings: Split,
    /// Why its savings are forfeited, if they are.
    pub forfeited: Option<String>,
    /// What of `savings` the rule takes: all of it, the caching part, or
    /// nothing.
    pub lost: Split,
}

/// A bound of [`Rules`] a window is held to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Bound {
    /// Served fraction, at least [`Rules::min_served`]: failing it
    /// forfeits all the window's savings.
    Served,
    /// SLO attainment of this latency class, at least its bound: failing
    /// it forfeits all the window's savings.
    Slo(String),
    /// Cache false-hit rate over the checked hits, at most
    /// [`Rules::max_false_hit`]: failing it forfeits the caching savings.
    FalseHit,
}

/// One bound as a window's figures met it: `part` of `whole` against
/// `limit`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Check {
    pub bound: Bound,
    /// Served requests, requests that met their SLO, or false hits.
    pub part: u64,
    /// Events, requests with an SLO, or checked hits.
    pub whole: u64,
    pub limit: f64,
}

impl Check {
    /// `part / whole` (0 when `whole` is).
    pub fn figure(&self) -> f64 {
        self.part as f64 / self.whole.max(1) as f64
    }

    /// Whether the window met this bound (one that is not a number holds:
    /// no figure fails a comparison with it).
    pub fn held(&self) -> bool {
        let within = match self.bound {
            Bound::FalseHit => self.figure() <= self.limit,
            Bound::Served | Bound::Slo(_) => self.figure() >= self.limit,
        };
        within || self.limit.is_nan()
    }
}

/// As the forfeit reason names a failed bound (`served fraction 0.5000
/// (1 of 2) < 0.99`), and a held one with the comparison that held.
impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (held, figure, part, whole, limit) = (
            self.held(),
            self.figure(),
            self.part,
            self.whole,
            self.limit,
        );
        match &self.bound {
            Bound::Served => {
                let op = if held { ">=" } else { "<" };
                write!(f, "served fraction {figure:.4} ({part} of {whole}) {op} {limit}")
            }
            Bound::Slo(class) => {
                let op = if held { ">=" } else { "<" };
                write!(
                    f,
                    "SLO attainment for latency class {class} {figure:.4} ({part} of {whole}) {op} {limit}"
                )
            }
            Bound::FalseHit if held => write!(
                f,
                "cache false-hit rate {figure:.4} ({part} of {whole} checked) <= {limit}"
            ),
            Bound::FalseHit => write!(
                f,
                "cache false-hit rate {figure:.4} ({part} of {whole} checked) > {limit}: caching savings"
            ),
        }
    }
}

/// The event reason of a cache hit the filter checked against the
/// upstream ([`ace_event::reason::CACHE_CHECK`], which the flow writes).
pub const CHECK_REASON: &str = ace_event::reason::CACHE_CHECK;

/// The start of the window of length `window_ms` that holds `time_ms`
/// (saturating at `i64::MIN`, so any stored time has one).
pub fn start(time_ms: i64, window_ms: i64) -> i64 {
    time_ms.saturating_sub(time_ms.rem_euclid(window_ms.max(1)))
}

/// The window key of `r` under `rules`.
pub fn key(r: &Row, rules: &Rules) -> (String, i64) {
    let tenant = r.tenant.clone().unwrap_or_else(|| NO_TENANT.to_string());
    (tenant, start(r.time_ms, rules.window_ms))
}

impl Window {
    /// Count `r` in this window.
    pub fn add(&mut self, r: &Row, split: &Split) {
        self.events += 1;
        self.served += u64::from(r.served());
        if let Some(met) = r.slo_met {
            let class = r.latency_class.as_deref().unwrap_or(NO_CLASS);
            let e = self.slo.entry(class.to_string()).or_default();
            e.0 += u64::from(met);
            e.1 += 1;
        }
        self.cache_hits += u64::from(r.cached);
        // A false hit is found by a check (an older writer may mark the
        // cached row itself): each counts as checked.
        self.checked += u64::from(r.reason == CHECK_REASON || r.cache_false_hit);
        self.false_hits += u64::from(r.cache_false_hit);
        self.savings.add(split);
    }

    /// Every bound of `rules` that applies to this window, with its
    /// figures, in the order the forfeit reason names them: the served
    /// fraction, each latency class with an SLO, then the cache false-hit
    /// rate (only when a hit was checked).
    pub fn checks(&self, rules: &Rules) -> Vec<Check> {
        let mut checks = vec![Check {
            bound: Bound::Served,
            part: self.served,
            whole: self.events,
            limit: rules.min_served,
        }];
        for (class, (met, n)) in &self.slo {
            let limit = rules
                .min_slo_by_class
                .get(class)
                .copied()
                .unwrap_or(rules.min_slo);
            checks.push(Check {
                bound: Bound::Slo(class.clone()),
                part: *met,
                whole: *n,
                limit,
            });
        }
        if self.checked > 0 {
            checks.push(Check {
                bound: Bound::FalseHit,
                part: self.false_hits,
                whole: self.checked,
                limit: rules.max_false_hit,
            });
        }
        checks
    }

    /// Decide whether the window keeps its savings.
    pub fn judge(&mut self, rules: &Rules) {
        let failed: Vec<Check> = self
            .checks(rules)
            .into_iter()
            .filter(|c| !c.held())
            .collect();
        self.lost = Split::default();
        for c in &failed {
            match c.bound {
                Bound::FalseHit => self.lost.caching = self.savings.caching,
                Bound::Served | Bound::Slo(_) => {
                    self.lost = self.savings;
                    break;
                }
            }
        }
        let why: Vec<String> = failed.iter().map(Check::to_string).collect();
        self.forfeited = (!why.is_empty()).then(|| why.join("; "));
    }

    /// Why the window kept or forfeited its savings under `rules`: each
    /// bound it failed (its forfeit reason), then each it held, with the
    /// figures, and the bounds that did not apply (no request with an
    /// SLO, no cache hit checked).
    pub fn explain(&self, rules: &Rules) -> String {
        let (held, failed): (Vec<Check>, Vec<Check>) =
            self.checks(rules).into_iter().partition(Check::held);
        let mut parts: Vec<String> = failed.iter().map(Check::to_string).collect();
        let held: Vec<String> = held.iter().map(Check::to_string).collect();
        if !held.is_empty() {
            let held = held.join("; ");
            parts.push(if failed.is_empty() {
                held
            } else {
                format!("held: {held}")
            });
        }
        if self.slo.is_empty() {
            parts.push("no request with an SLO".into());
        }
        if self.checked == 0 {
            parts.push("no cache hit checked".into());
        }
        parts.join("; ")
    }

    /// What the window keeps.
    pub fn kept(&self) -> Split {
        let (s, l) = (&self.savings, &self.lost);
        Split {
            utilisation: s.utilisation.saturating_sub(l.utilisation),
            arbitrage: s.arbitrage.saturating_sub(l.arbitrage),
            routing: s.routing.saturating_sub(l.routing),
            caching: s.caching.saturating_sub(l.caching),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn false_hits_past_the_bound_forfeit_the_caching_savings_only() {
        let savings = Split {
            utilisation: 10,
            arbitrage: 20,
            routing: 30,
            caching: 40,
        };
        let mut w = Window {
            events: 100,
            served: 100,
            checked: 10,
            false_hits: 1,
            savings,
            ..Window::default()
        };
        w.judge(&Rules::default());
        assert!(w
            .forfeited
            .as_deref()
            .is_some_and(|r| r.contains("false-hit")));
        assert_eq!(w.lost.total(), 40, "{:?}", w.lost);
        assert_eq!(w.kept().total() + w.lost.total(), savings.total());
        // Within the bound: all kept.
        w.false_hits = 0;
        w.judge(&Rules::default());
        assert_eq!((w.forfeited.clone(), w.kept()), (None, savings));
        // A window that dropped traffic loses everything.
        w.served = 50;
        w.judge(&Rules::default());
        assert_eq!(w.lost, savings);
    }

    #[test]
    fn the_explanation_names_each_bound_held_or_failed_with_its_figures() {
        let rules = Rules::default();
        let mut w = Window {
            events: 10,
            served: 10,
            slo: BTreeMap::from([("interactive".to_string(), (7, 7))]),
            ..Window::default()
        };
        w.judge(&rules);
        assert_eq!(w.forfeited, None);
        assert_eq!(
            w.explain(&rules),
            "served fraction 1.0000 (10 of 10) >= 0.99; \
             SLO attainment for latency class interactive 1.0000 (7 of 7) >= 0.95; \
             no cache hit checked"
        );
        w.served = 7;
        w.checked = 2;
        w.judge(&rules);
        let reason = "served fraction 0.7000 (7 of 10) < 0.99";
        assert_eq!(w.forfeited.as_deref(), Some(reason));
        assert_eq!(
            w.explain(&rules),
            format!(
                "{reason}; held: SLO attainment for latency class interactive 1.0000 (7 of 7) \
                 >= 0.95; cache false-hit rate 0.0000 (0 of 2 checked) <= 0.01"
            )
        );
        // No SLO: said, not left out.
        w.slo.clear();
        assert_eq!(
            w.explain(&rules),
            format!(
                "{reason}; held: cache false-hit rate 0.0000 (0 of 2 checked) <= 0.01; \
                 no request with an SLO"
            )
        );
    }
}
