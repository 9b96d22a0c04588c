//! Per-tenant chargeback, with owned and reserved capacity amortised by
//! share of use and idle capacity shown, not hidden.
//!
//! For each owned or reserved pool (a destination of tier `inhouse` or
//! `reserved` with a `usd_per_gpu_hour`), over the report's period `P`
//! (from the first window with events to the end of the last, without
//! silences of more than a day: [`crate::report::charged_period`], so a
//! stray event cannot bill a pool for the years between it and the rest):
//!
//! ```text
//! cost        = usd_per_gpu_hour × P (hours)                  (nano-dollars)
//! utilisation = min(1, Σ latency_ms of its served requests / (P ms × capacity))
//! used        = round(cost × utilisation),   idle = cost − used
//! tenant t's share of used and of idle = its tokens on the pool / all tokens on it
//! ```
//!
//! Utilisation is Little's law: summed request time over the capacity's
//! request-time budget. Shares are split with the largest-remainder method
//! in integers, so they add up to `used` and `idle` exactly; a pool nobody
//! used charges its whole cost as idle to [`UNUSED`]. A tenant's total is
//! its direct (booked) cost plus its shares of used and idle capacity.
//! Sums saturate at the ends of `i64` rather than panic on absurd stored
//! values.
//!
//! The pools are every standing one of the configurations the report's
//! events name ([`standing`]), used or not: capacity is paid for whether
//! or not a request came, so a reserved block no request reached still
//! shows its whole amortised cost, idle, under [`UNUSED`] (a reserved
//! L40S block at USD 0.55 an hour: USD 13.20 a day), as its invoice
//! charges it.

use crate::configs::Registry;
use crate::money::{self, Nano};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// The tenant idle capacity of an unused pool is charged to.
pub const UNUSED: &str = "(unused capacity)";

/// One pool's amortisation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pool {
    pub destination: String,
    pub tier: String,
    pub cost: Nano,
    pub used: Nano,
    pub idle: Nano,
    pub utilisation: f64,
}

/// One tenant's bill.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Tenant {
    /// Booked marginal costs of its requests.
    pub direct: Nano,
    /// Its share of used pool capacity.
    pub used_capacity: Nano,
    /// Its share of idle pool capacity.
    pub idle_capacity: Nano,
    /// The sum of the three.
    pub total: Nano,
}

/// What the report gathers for one pool.
#[derive(Debug, Clone, Default)]
pub struct PoolUse {
    pub tier: String,
    pub usd_per_hour: f64,
    pub capacity: u32,
    pub busy_ms: i64,
    pub tokens: BTreeMap<String, u64>,
}

/// The chargeback.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Chargeback {
    pub period_ms: i64,
    pub pools: Vec<Pool>,
    pub tenants: BTreeMap<String, Tenant>,
}

impl Chargeback {
    /// The pool of `destination`, if it is charged.
    pub fn pool(&self, destination: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.destination == destination)
    }
}

/// One standing pool as configured, before any request is counted on it.
#[derive(Debug, Clone, Default)]
pub struct Standing {
    /// Utilisation where its latency penalty starts.
    pub knee: f64,
    /// Its use, with nothing used yet.
    pub usage: PoolUse,
}

/// Every standing pool (a destination of tier `inhouse` or `reserved`) of
/// the configurations in `last` (configuration id to its latest event's
/// time), by destination. Where two define one destination, the
/// definition of the configuration whose latest event is latest wins (as
/// for budgets), so a price changed by a new configuration charges the
/// new price.
pub fn standing(registry: &Registry, last: &HashMap<String, i64>) -> BTreeMap<String, Standing> {
    let mut configs: Vec<(&i64, &String)> = last.iter().map(|(c, t)| (t, c)).collect();
    configs.sort();
    let mut out = BTreeMap::new();
    for (_, id) in configs {
        let Some(setup) = registry.get(id) else {
            continue;
        };
        let cfg = &setup.config;
        for (d, m) in cfg.destinations.iter().zip(&cfg.models) {
            if !m.tier.is_sunk() {
                continue;
            }
            let usage = PoolUse {
                tier: m.tier.as_str().to_string(),
                usd_per_hour: m.usd_per_gpu_hour,
                capacity: m.capacity,
                ..PoolUse::default()
            };
            out.insert(
                d.name.clone(),
                Standing {
                    knee: m.knee,
                    usage,
                },
            );
        }
    }
    out
}

/// Split `amount` by `weights` exactly (largest remainder; ties to the
/// name that sorts first).
pub fn allocate(amount: Nano, weights: &BTreeMap<String, u64>) -> BTreeMap<String, Nano> {
    let total: u128 = weights.values().map(|w| u128::from(*w)).sum();
    if total == 0 {
        return BTreeMap::from([(UNUSED.to_string(), amount)]);
    }
    let mut out = BTreeMap::new();
    let mut rest: Vec<(u128, &String)> = Vec::new();
    let mut given: i128 = 0;
    let sign: i128 = if amount < 0 { -1 } else { 1 };
    let abs = i128::from(amount).unsigned_abs();
    for (name, w) in weights {
        let exact = abs * u128::from(*w);
        let share = (exact / total) as i128;
        given += share;
        rest.push((exact % total, name));
        out.insert(name.clone(), (sign * share) as Nano);
    }
    rest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let left = abs as i128 - given;
    for (_, name) in rest.iter().take(left.max(0) as usize) {
        if let Some(v) = out.get_mut(*name) {
            *v = v.saturating_add(sign as Nano);
        }
    }
    out
}

/// Build the chargeback from direct costs per tenant and pool use over a
/// period of `period_ms`.
pub fn build(
    direct: &BTreeMap<String, Nano>,
    pools: &BTreeMap<String, PoolUse>,
    period_ms: i64,
) -> Chargeback {
    let mut tenants: BTreeMap<String, Tenant> = direct
        .iter()
        .map(|(t, d)| {
            (
                t.clone(),
                Tenant {
                    direct: *d,
                    ..Tenant::default()
                },
            )
        })
        .collect();
    let mut out = Vec::new();
    for (name, p) in pools {
        let cost = money::standing(p.usd_per_hour, period_ms);
        let budget = period_ms.max(0) as f64 * f64::from(p.capacity.max(1));
        let utilisation = (p.busy_ms.max(0) as f64 / budget.max(1.0)).clamp(0.0, 1.0);
        let used = (cost as f64 * utilisation).round() as Nano;
        let idle = cost.saturating_sub(used);
        for (t, v) in allocate(used, &p.tokens) {
            let c = &mut tenants.entry(t).or_default().used_capacity;
            *c = c.saturating_add(v);
        }
        for (t, v) in allocate(idle, &p.tokens) {
            let c = &mut tenants.entry(t).or_default().idle_capacity;
            *c = c.saturating_add(v);
        }
        out.push(Pool {
            destination: name.clone(),
            tier: p.tier.clone(),
            cost,
            used,
            idle,
            utilisation,
        });
    }
    for t in tenants.values_mut() {
        t.total = t
            .direct
            .saturating_add(t.used_capacity)
            .saturating_add(t.idle_capacity);
    }
    Chargeback {
        period_ms,
        pools: out,
        tenants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_exact() {
        let w = BTreeMap::from([
            ("a".to_string(), 1),
            ("b".to_string(), 1),
            ("c".to_string(), 1),
        ]);
        let got = allocate(100, &w);
        assert_eq!(got.values().sum::<Nano>(), 100);
        assert_eq!(got["a"], 34);
        assert_eq!(allocate(7, &BTreeMap::new())[UNUSED], 7);
    }
}
