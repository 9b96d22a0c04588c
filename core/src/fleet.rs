//! The fleet's live state: per destination, its health and the requests in
//! flight on it, and the slate priced from them.
//!
//! Why one type: both hosts keep this state, in different places. The
//! dynamic module keeps one per process behind a mutex; the Wasm filter
//! keeps a copy per worker VM and syncs it through Envoy's shared data
//! (`ace_filter::state`). What a claim, a release and an outcome do to it
//! is the same either way and is written once, here; the hosts differ
//! only in where the bytes live and how they are kept in step.
//!
//! Pricing is incremental: a change to one destination reprices that one
//! ([`FleetState::reprice`]), and time-dependent prices (a trip ending, a
//! cap recovering) are brought up to date with [`FleetState::advance`]
//! before a decision. The methods that change a destination do not
//! reprice it themselves, because the Wasm host reprices once after its
//! write reaches the shared entry; each says so.

use crate::cost::CostModel;
use crate::dispatch::{self, Decision, Fleet, Refusal, Request, Slate};
use crate::health::{Change, Health, HealthPolicy, Outcome};
use alloc::vec;
use alloc::vec::Vec;

/// Health, load and prices of every destination.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetState {
    /// Health per destination.
    pub health: Vec<Health>,
    /// Requests in flight per destination (over every worker).
    pub in_flight: Vec<u32>,
    /// The fleet priced from `health` and `in_flight`.
    pub slate: Slate,
}

impl FleetState {
    /// `n` destinations, every one healthy and idle, not yet priced (call
    /// [`FleetState::reprice_all`]).
    pub fn new(n: usize) -> FleetState {
        FleetState {
            health: vec![Health::default(); n],
            in_flight: vec![0; n],
            slate: Slate::new(n),
        }
    }

    /// Number of destinations.
    pub fn len(&self) -> usize {
        self.health.len()
    }

    /// Whether there are no destinations.
    pub fn is_empty(&self) -> bool {
        self.health.is_empty()
    }

    /// The slate (mutable) and the fleet as pricing sees it.
    fn priced<'a>(
        &'a mut self,
        models: &'a [CostModel],
        policy: &'a HealthPolicy,
    ) -> (&'a mut Slate, Fleet<'a>) {
        let view = Fleet {
            models,
            health: &self.health,
            in_flight: &self.in_flight,
            policy,
        };
        (&mut self.slate, view)
    }

    /// Price every destination at `now_ms`.
    pub fn reprice_all(&mut self, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        let (slate, view) = self.priced(models, policy);
        slate.refresh(&view, now_ms);
    }

    /// Reprice destination `d` after a change to it.
    pub fn reprice(&mut self, d: usize, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        let (slate, view) = self.priced(models, policy);
        slate.refresh_one(&view, d, now_ms);
    }

    /// Reprice the destinations whose price moves with time (a trip or a
    /// cap that ends, a derate that decays), for a decision at `now_ms`.
    pub fn advance(&mut self, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        let (slate, view) = self.priced(models, policy);
        slate.refresh_timed(&view, now_ms);
    }

    /// The cheapest of the `feasible` destinations that is open, and a slot
    /// claimed on it (its in-flight count and half-open probe). The slate
    /// must be current at `now_ms` ([`FleetState::advance`]); the chosen
    /// destination is not repriced.
    pub fn decide(
        &mut self,
        feasible: &[u64],
        warm: &[u64],
        req: &Request,
        now_ms: u64,
    ) -> Result<Decision, Refusal> {
        let d = dispatch::decide(&self.slate, feasible, warm, req)?;
        self.claim(d.index, now_ms);
        Ok(d)
    }

    /// Claim a slot on destination `d` (not repriced).
    pub fn claim(&mut self, d: usize, now_ms: u64) {
        if let Some(f) = self.in_flight.get_mut(d) {
            *f = f.saturating_add(1);
        }
        if let Some(h) = self.health.get_mut(d) {
            h.on_dispatch(now_ms);
        }
    }

    /// Release `n` slots on destination `d` (not repriced).
    pub fn release(&mut self, d: usize, n: u32) {
        if let Some(f) = self.in_flight.get_mut(d) {
            *f = f.saturating_sub(n);
        }
    }

    /// A request on `d` ended with `outcome` (`None`: the client went
    /// away, blame no one): release its slot and fold the outcome into
    /// `d`'s health (not repriced).
    pub fn settle(
        &mut self,
        d: usize,
        outcome: Option<Outcome>,
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> Change {
        self.release(d, 1);
        match (self.health.get_mut(d), outcome) {
            (Some(h), Some(o)) => h.observe(o, now_ms, policy),
            _ => Change::None,
        }
    }

    /// Whether a request on `d` ending with `outcome` changes nothing but
    /// the in-flight count: it ended quietly (the client left, or a
    /// success within its SLO) on a destination with nothing to recover.
    pub fn is_quiet(&self, d: usize, outcome: Option<Outcome>, now_ms: u64) -> bool {
        let quiet = match outcome {
            None => true,
            Some(Outcome::Success { latency_ms, slo_ms }) => slo_ms.is_none_or(|s| latency_ms <= s),
            Some(_) => false,
        };
        quiet
            && self
                .health
                .get(d)
                .is_some_and(|h| h.is_pristine(now_ms) && h.consecutive_failures() == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Tier;

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

    const REQ: Request = Request {
        tokens_in: 10,
        tokens_out: 10,
        latency_usd_per_s: 0.0,
    };

    /// A slate priced from scratch for `s`'s health and load.
    fn from_scratch(s: &FleetState, m: &[CostModel], p: &HealthPolicy, now: u64) -> Slate {
        let mut fresh = s.clone();
        fresh.reprice_all(m, p, now);
        fresh.slate
    }

    #[test]
    fn claims_and_settles_keep_the_counts_and_the_prices_exact() {
        let (m, p) = (models(3), HealthPolicy::default());
        let mut s = FleetState::new(3);
        s.reprice_all(&m, &p, 0);
        let all = [0b111u64];
        let mut open = [0usize; 3];
        for t in 0..30u64 {
            s.advance(&m, &p, t);
            let d = s.decide(&all, &all, &REQ, t).map(|d| d.index);
            let Ok(d) = d else { continue };
            s.reprice(d, &m, &p, t);
            open[d] += 1;
            // Destination 0 fails, the others succeed: its trip moves
            // the next requests on, its probe brings it back.
            if d == 0 {
                s.settle(d, Some(Outcome::Failure { tenant: 0 }), &p, t);
            } else {
                s.settle(
                    d,
                    Some(Outcome::Success {
                        latency_ms: 1,
                        slo_ms: None,
                    }),
                    &p,
                    t,
                );
            }
            s.reprice(d, &m, &p, t);
            assert_eq!(s.slate, from_scratch(&s, &m, &p, t), "step {t}");
        }
        assert_eq!(s.in_flight, vec![0, 0, 0], "every slot released");
        assert!(open[0] > 0 && open[1] > 0, "{open:?}: spilled after trips");
    }

    #[test]
    fn a_tripped_destination_is_skipped_until_its_probe() {
        let (m, p) = (models(2), HealthPolicy::default());
        let mut s = FleetState::new(2);
        s.reprice_all(&m, &p, 0);
        let all = [0b11u64];
        for _ in 0..p.trip_after {
            s.claim(0, 1);
            let change = s.settle(0, Some(Outcome::Failure { tenant: 0 }), &p, 1);
            s.reprice(0, &m, &p, 1);
            if change != Change::None {
                assert!(matches!(change, Change::Tripped { .. }), "{change:?}");
            }
        }
        s.advance(&m, &p, 2);
        assert_eq!(s.decide(&all, &all, &REQ, 2).map(|d| d.index), Ok(1));
        assert_eq!(
            s.decide(&[0b01], &all, &REQ, 2).map(|d| d.index),
            Err(Refusal::NoHealthyDestination),
            "nothing feasible is open: refused, never widened"
        );
    }

    #[test]
    fn only_calm_endings_are_quiet() {
        let p = HealthPolicy::default();
        let mut s = FleetState::new(1);
        let ok = Some(Outcome::Success {
            latency_ms: 5,
            slo_ms: Some(10),
        });
        let slow = Some(Outcome::Success {
            latency_ms: 50,
            slo_ms: Some(10),
        });
        assert!(s.is_quiet(0, None, 0));
        assert!(s.is_quiet(0, ok, 0));
        assert!(!s.is_quiet(0, slow, 0));
        assert!(!s.is_quiet(0, Some(Outcome::Failure { tenant: 0 }), 0));
        s.settle(0, Some(Outcome::Failure { tenant: 0 }), &p, 0);
        assert!(!s.is_quiet(0, ok, 0), "a failure run to clear");
        assert!(!s.is_quiet(9, None, 0), "no such destination");
    }
}
