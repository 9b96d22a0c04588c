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

/// The event reason of a cache hit the filter checked against the
/// upstream (`ace_flow::cache::CHECK_REASON`).
pub const CHECK_REASON: &str = "cache_check";

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

    /// Decide whether the window keeps its savings.
    pub fn judge(&mut self, rules: &Rules) {
        let mut why = Vec::new();
        let served = self.served as f64 / self.events.max(1) as f64;
        if served < rules.min_served {
            why.push(format!(
                "served fraction {:.4} ({} of {}) < {}",
                served, self.served, self.events, rules.min_served
            ));
        }
        for (class, (met, n)) in &self.slo {
            let bound = rules
                .min_slo_by_class
                .get(class)
                .copied()
                .unwrap_or(rules.min_slo);
            let got = *met as f64 / (*n).max(1) as f64;
            if got < bound {
                why.push(format!(
                    "SLO attainment for latency class {class} {got:.4} ({met} of {n}) < {bound}"
                ));
            }
        }
        self.lost = if why.is_empty() {
            Split::default()
        } else {
            self.savings
        };
        if self.checked > 0 {
            let rate = self.false_hits as f64 / self.checked as f64;
            if rate > rules.max_false_hit {
                why.push(format!(
                    "cache false-hit rate {rate:.4} ({} of {} checked) > {}: caching savings",
                    self.false_hits, self.checked, rules.max_false_hit
                ));
                self.lost.caching = self.savings.caching;
            }
        }
        self.forfeited = (!why.is_empty()).then(|| why.join("; "));
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
}
