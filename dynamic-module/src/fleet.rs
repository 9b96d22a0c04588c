//! The fleet's live state (health and in-flight counts per destination),
//! shared by every Envoy worker in process memory.
//!
//! A dynamic module is native code in Envoy's own process, so the workers
//! share one [`Fleet`] behind a mutex: a trip seen by one worker holds for
//! all at once, with none of the Wasm filter's shared-data round trips or
//! compare-and-swap retries (`ace_filter::state`). The lock is held for a
//! decision (tens of nanoseconds of arithmetic) or one outcome, never across
//! a call into Envoy.
//!
//! State outlives a configuration update: configurations with the same
//! destination set ([`ace_filter::config::Config::fingerprint`]) share one
//! fleet through a process-wide registry, so pushing new prices does not
//! forget that a destination is tripped. The Wasm filter gets the same from
//! keying its shared-data entry by the fingerprint.

use ace_core::cost::CostModel;
use ace_core::dispatch::{Decision, Refusal, Request};
use ace_core::fleet::FleetState;
use ace_core::health::{Change, HealthPolicy, Outcome};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The process's state of one fleet (see [`FleetState`]), behind its lock.
#[derive(Debug)]
pub struct Fleet(Mutex<FleetState>);

/// Every live fleet, by configuration fingerprint.
static REGISTRY: Mutex<Vec<(u64, Weak<Fleet>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic cannot happen while the lock is held (the crate denies the
    // panicking constructs), but a poisoned lock still holds good data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fleet {
    /// The fleet for configuration `fingerprint`: the live one if another
    /// configuration with that destination set has it, else a fresh one
    /// (every destination healthy and idle). Either way priced with
    /// `models` at `now`.
    pub fn shared(
        fingerprint: u64,
        models: &[CostModel],
        policy: &HealthPolicy,
        now: u64,
    ) -> Arc<Fleet> {
        let mut registry = lock(&REGISTRY);
        registry.retain(|(_, w)| w.strong_count() > 0);
        let found = registry
            .iter()
            .find(|(f, _)| *f == fingerprint)
            .and_then(|(_, w)| w.upgrade())
            .filter(|f| lock(&f.0).len() == models.len());
        let fleet = found.unwrap_or_else(|| {
            let fleet = Arc::new(Fleet(Mutex::new(FleetState::new(models.len()))));
            registry.push((fingerprint, Arc::downgrade(&fleet)));
            fleet
        });
        lock(&fleet.0).reprice_all(models, policy, now);
        fleet
    }

    /// Decide at `now` among the `feasible` destinations, and claim a slot
    /// on the one chosen.
    pub fn dispatch(
        &self,
        models: &[CostModel],
        policy: &HealthPolicy,
        now: u64,
        feasible: &[u64],
        warm: &[u64],
        req: &Request,
    ) -> Result<Decision, Refusal> {
        let mut f = lock(&self.0);
        f.advance(models, policy, now);
        let d = f.decide(feasible, warm, req, now)?;
        f.reprice(d.index, models, policy, now);
        Ok(d)
    }

    /// Release destination `d`'s slot and fold in the request's outcome
    /// (`None`: the client went away, blame no one).
    pub fn settle(
        &self,
        models: &[CostModel],
        policy: &HealthPolicy,
        d: usize,
        outcome: Option<Outcome>,
        now: u64,
    ) -> Change {
        let mut f = lock(&self.0);
        let change = f.settle(d, outcome, policy, now);
        f.reprice(d, models, policy, now);
        change
    }

    /// Requests in flight per destination.
    pub fn in_flight(&self) -> Vec<u32> {
        lock(&self.0).in_flight.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ace_core::cost::Tier;

    fn models(n: usize) -> Vec<CostModel> {
        (0..n)
            .map(|i| CostModel {
                tier: Tier::Payg,
                usd_per_input_token: 1e-6 * (i + 1) as f64,
                usd_per_output_token: 1e-6 * (i + 1) as f64,
                ..CostModel::default()
            })
            .collect()
    }

    #[test]
    fn a_trip_seen_once_holds_for_every_configuration_of_that_fleet() {
        let (m, p) = (models(2), HealthPolicy::default());
        let a = Fleet::shared(7, &m, &p, 0);
        let b = Fleet::shared(7, &m, &p, 0);
        assert!(Arc::ptr_eq(&a, &b), "same destination set, same state");
        let other = Fleet::shared(8, &m, &p, 0);
        assert!(!Arc::ptr_eq(&a, &other));
        let req = Request {
            tokens_in: 10,
            tokens_out: 10,
            latency_usd_per_s: 0.0,
        };
        let all = [0b11u64];
        for _ in 0..p.trip_after {
            let d = a.dispatch(&m, &p, 1, &all, &all, &req).unwrap();
            assert_eq!(d.index, 0, "the cheaper one until it trips");
            a.settle(&m, &p, 0, Some(Outcome::Failure { tenant: 0 }), 1);
        }
        let d = b.dispatch(&m, &p, 2, &all, &all, &req).unwrap();
        assert_eq!(d.index, 1, "tripped for the other configuration too");
        b.settle(&m, &p, 1, None, 2);
        assert_eq!(b.in_flight(), vec![0, 0], "every slot released");
    }
}
