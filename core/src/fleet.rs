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
//! What the world outside the proxy reports (a drain or an eviction
//! notice, the model server's load, a capacity or price change) arrives as
//! a [`Signal`] and is kept per destination in [`Live`]; pricing reads it
//! with health and load. A signal can close a destination or move its
//! price, never make it feasible: feasibility is the policy tables' alone.
//!
//! Pricing is incremental: a change to one destination reprices that one
//! ([`FleetState::reprice`]), and time-dependent prices (a trip ending, a
//! cap recovering) are brought up to date with [`FleetState::advance`]
//! before a decision. The methods that change a destination do not
//! reprice it themselves, because the Wasm host reprices once after its
//! write reaches the shared entry; each says so.

use crate::cost::CostModel;
use crate::dispatch::{self, Decision, Fleet, Held, Refusal, Request, Slate};
use crate::health::{Change, Health, HealthPolicy, Outcome};
use crate::latency::Learned;
pub use crate::signal::{Live, Signal, SignalError};
use alloc::vec;
use alloc::vec::Vec;

/// Health, load and prices of every destination.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetState {
    /// Health per destination.
    pub health: Vec<Health>,
    /// Requests in flight per destination (over every worker).
    pub in_flight: Vec<u32>,
    /// What the control service says of each destination ([`Live`]).
    pub live: Vec<Live>,
    /// Each destination's time to first token as this copy of the state
    /// has learned it from answers ([`Learned`]; never shared between
    /// copies).
    pub learned: Vec<Learned>,
    /// The fleet priced from `health`, `in_flight` and `live`.
    pub slate: Slate,
}

impl FleetState {
    /// `n` destinations, every one healthy and idle, not yet priced (call
    /// [`FleetState::reprice_all`]).
    pub fn new(n: usize) -> FleetState {
        FleetState {
            health: vec![Health::default(); n],
            in_flight: vec![0; n],
            live: vec![Live::default(); n],
            learned: vec![Learned::default(); n],
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
    #[inline]
    fn priced<'a>(
        &'a mut self,
        models: &'a [CostModel],
        policy: &'a HealthPolicy,
    ) -> (&'a mut Slate, Fleet<'a>) {
        let view = Fleet {
            models,
            health: &self.health,
            in_flight: &self.in_flight,
            live: &self.live,
            learned: &self.learned,
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
    #[inline]
    pub fn reprice(&mut self, d: usize, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        let (slate, view) = self.priced(models, policy);
        slate.refresh_one(&view, d, now_ms);
    }

    /// Reprice the destinations whose price moves with time (a trip or a
    /// cap that ends, a derate that decays), for a decision at `now_ms`.
    #[inline]
    pub fn advance(&mut self, models: &[CostModel], policy: &HealthPolicy, now_ms: u64) {
        let (slate, view) = self.priced(models, policy);
        slate.refresh_timed(&view, now_ms);
    }

    /// The cheapest of the `feasible` destinations that is open, and a slot
    /// claimed on it (its in-flight count and half-open probe). The slate
    /// must be current at `now_ms` ([`FleetState::advance`]); the chosen
    /// destination is not repriced.
    #[inline]
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

    /// [`FleetState::decide`] with each destination's token prices scaled
    /// by `scale` ([`dispatch::decide_scaled`]: model routing).
    #[inline]
    pub fn decide_scaled(
        &mut self,
        feasible: &[u64],
        warm: &[u64],
        scale: &[f64],
        req: &Request,
        now_ms: u64,
    ) -> Result<Decision, Refusal> {
        let d = dispatch::decide_scaled(&self.slate, feasible, warm, req, scale)?;
        self.claim(d.index, now_ms);
        Ok(d)
    }

    /// [`FleetState::decide_scaled`] with what each destination already
    /// holds of the request's prompt ([`dispatch::decide_held`]).
    #[inline]
    pub fn decide_held(
        &mut self,
        feasible: &[u64],
        warm: &[u64],
        scale: &[f64],
        held: Held<'_>,
        req: &Request,
        now_ms: u64,
    ) -> Result<Decision, Refusal> {
        let d = dispatch::decide_held(&self.slate, feasible, warm, req, scale, held)?;
        self.claim(d.index, now_ms);
        Ok(d)
    }

    /// The prices the control service set on destination `d`: what a
    /// request decided there now is priced with.
    #[inline]
    pub fn live_prices(&self, d: usize) -> LivePrices {
        self.live
            .get(d)
            .map_or(LivePrices::default(), |l| LivePrices {
                usd_per_token: l.usd_per_token,
                usd_per_hour: l.usd_per_hour,
            })
    }

    /// Claim a slot on destination `d` (not repriced).
    #[inline]
    pub fn claim(&mut self, d: usize, now_ms: u64) {
        if let Some(f) = self.in_flight.get_mut(d) {
            *f = f.saturating_add(1);
        }
        if let Some(h) = self.health.get_mut(d) {
            h.on_dispatch(now_ms);
        }
    }

    /// Release `n` slots on destination `d` (not repriced).
    #[inline]
    pub fn release(&mut self, d: usize, n: u32) {
        if let Some(f) = self.in_flight.get_mut(d) {
            *f = f.saturating_sub(n);
        }
    }

    /// A request on `d` ended with `outcome` (`None`: the client went
    /// away, blame no one): release its slot and fold the outcome into
    /// `d`'s health (not repriced).
    #[inline]
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

    /// An answer on `d` came back with `outcome` while its request goes on
    /// (a success still streaming): fold the outcome into `d`'s health and
    /// keep the slot, which [`FleetState::settle`] releases when the
    /// request ends (not repriced).
    #[inline]
    pub fn observe(
        &mut self,
        d: usize,
        outcome: Outcome,
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> Change {
        self.health
            .get_mut(d)
            .map_or(Change::None, |h| h.observe(outcome, now_ms, policy))
    }

    /// Learn from an answer on `d`: its time to first byte, `ttft_ms`, for a
    /// request sent in load band `band` by `tenant` ([`Learned::observe`];
    /// not repriced). Returns whether the estimate moved.
    #[inline]
    pub fn learn(
        &mut self,
        d: usize,
        band: u8,
        ttft_ms: u64,
        tenant: u32,
        policy: &HealthPolicy,
    ) -> bool {
        self.learned
            .get_mut(d)
            .is_some_and(|l| l.observe(band, ttft_ms, tenant, policy.trip_tenants, &policy.learn))
    }

    /// Fold `signal` about destination `d` in (not repriced). Signals move
    /// prices, capacity and openness, never feasibility.
    pub fn apply(&mut self, d: usize, signal: Signal) -> Result<(), SignalError> {
        self.live
            .get_mut(d)
            .ok_or(SignalError::NoSuchDestination(d))?
            .apply(signal)
    }

    /// Whether a request on `d` ending with `outcome` changes nothing but
    /// the in-flight count: it ended quietly (the client left, or a
    /// success within its SLO) on a destination with nothing to recover.
    #[inline]
    pub fn is_quiet(
        &self,
        d: usize,
        outcome: Option<Outcome>,
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> bool {
        let quiet = match outcome {
            None => true,
            Some(Outcome::Success {
                latency_ms,
                slo_ms,
                headroom,
            }) => {
                slo_ms.is_none_or(|s| latency_ms <= s)
                    // Nothing left always changes health (see `Health`).
                    && headroom.is_none_or(|h| h.left > 0.0 && h.left >= policy.headroom_low)
            }
            Some(_) => false,
        };
        quiet
            && self
                .health
                .get(d)
                .is_some_and(|h| h.is_pristine(now_ms) && h.consecutive_failures() == 0)
    }
}

/// A destination's prices as the control service set them, where it set
/// them: what a request decided on them was priced with, for its event to
/// carry and the ledger to book in place of the configuration's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LivePrices {
    /// Per input and output token, USD (in-house, reserved and
    /// pay-as-you-go destinations).
    pub usd_per_token: Option<(f64, f64)>,
    /// Per hour of the destination's GPUs, USD (spot and on-demand).
    pub usd_per_hour: Option<f64>,
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

    const REQ: Request = Request::untimed(10, 10, 0.0);

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
                        headroom: None,
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
            headroom: None,
        });
        let slow = Some(Outcome::Success {
            latency_ms: 50,
            slo_ms: Some(10),
            headroom: None,
        });
        assert!(s.is_quiet(0, None, &p, 0));
        assert!(s.is_quiet(0, ok, &p, 0));
        assert!(!s.is_quiet(0, slow, &p, 0));
        let figures = |left| {
            Some(Outcome::Success {
                latency_ms: 5,
                slo_ms: None,
                headroom: Some(crate::health::Headroom { left, reset_ms: 0 }),
            })
        };
        assert!(s.is_quiet(0, figures(0.5), &p, 0));
        assert!(!s.is_quiet(0, figures(0.05), &p, 0));
        let none_low = HealthPolicy {
            headroom_low: 0.0,
            ..p
        };
        assert!(
            !s.is_quiet(0, figures(0.0), &none_low, 0),
            "nothing left is never quiet"
        );
        assert!(!s.is_quiet(0, Some(Outcome::Failure { tenant: 0 }), &p, 0));
        s.settle(0, Some(Outcome::Failure { tenant: 0 }), &p, 0);
        assert!(!s.is_quiet(0, ok, &p, 0), "a failure run to clear");
        assert!(!s.is_quiet(9, None, &p, 0), "no such destination");
    }

    #[test]
    fn a_drain_closes_a_destination_until_it_ends() {
        let (m, p) = (models(2), HealthPolicy::default());
        let mut s = FleetState::new(2);
        s.reprice_all(&m, &p, 0);
        let all = [0b11u64];
        assert_eq!(s.apply(0, Signal::Drain { until_ms: 100 }), Ok(()));
        s.reprice(0, &m, &p, 0);
        s.advance(&m, &p, 50);
        assert_eq!(s.decide(&all, &all, &REQ, 50).map(|d| d.index), Ok(1));
        s.advance(&m, &p, 100);
        assert_eq!(
            s.decide(&all, &all, &REQ, 100).map(|d| d.index),
            Ok(0),
            "open again when the drain ends, with no other change"
        );
    }

    /// Owned GPUs with four slots and an API, priced at 0.
    fn owned_then_api() -> (Vec<CostModel>, HealthPolicy, FleetState) {
        let (mut m, p) = (models(2), HealthPolicy::default());
        m[0].tier = Tier::InHouse;
        m[0].capacity = 4;
        let mut s = FleetState::new(2);
        s.reprice_all(&m, &p, 0);
        (m, p, s)
    }

    #[test]
    fn load_capacity_and_price_signals_move_the_merit_order() {
        let (mut m, p, mut s) = owned_then_api();
        let all = [0b11u64];
        // The server reports itself full: the owned destination is skipped.
        assert_eq!(
            s.apply(
                0,
                Signal::Load {
                    requests: 4,
                    until_ms: None
                }
            ),
            Ok(())
        );
        s.reprice(0, &m, &p, 0);
        assert_eq!(s.decide(&all, &all, &REQ, 0).map(|d| d.index), Ok(1));
        s.release(1, 1);
        // More GPUs: room again.
        assert_eq!(s.apply(0, Signal::Capacity { slots: 8 }), Ok(()));
        s.reprice(0, &m, &p, 0);
        assert_eq!(s.decide(&all, &all, &REQ, 0).map(|d| d.index), Ok(0));
        s.release(0, 1);
        // Every GPU taken away: closed, not unlimited.
        assert_eq!(s.apply(0, Signal::Capacity { slots: 0 }), Ok(()));
        s.reprice(0, &m, &p, 0);
        assert_eq!(s.decide(&all, &all, &REQ, 0).map(|d| d.index), Ok(1));
        s.release(1, 1);
        // A price cut on the API books the new price.
        let cut = Signal::Price {
            usd_per_input_token: 1e-9,
            usd_per_output_token: 1e-9,
        };
        assert_eq!(s.apply(1, cut), Ok(()));
        s.reprice(1, &m, &p, 0);
        let d = s.decide(&[0b10], &all, &REQ, 0);
        assert_eq!(d.map(|d| d.cost_of(10, 10)), Ok(20.0 * 1e-9));
        s.release(1, 1);
        // A destination bought by the GPU-hour: its hourly price moves
        // its per-token price, and its per-token fields do not.
        m[1].tier = Tier::Spot;
        m[1].tokens_per_second = 1000.0;
        m[1].usd_per_gpu_hour = 36.0;
        s.reprice(1, &m, &p, 0);
        let before = s.decide(&[0b10], &all, &REQ, 0).map(|d| d.cost_of(10, 10));
        s.release(1, 1);
        let hourly = Signal::HourlyPrice { usd_per_hour: 3.6 };
        assert_eq!(s.apply(1, hourly), Ok(()));
        s.reprice(1, &m, &p, 0);
        let after = s.decide(&[0b10], &all, &REQ, 0).map(|d| d.cost_of(10, 10));
        let (Ok(before), Ok(after)) = (before, after) else {
            panic!("the spot destination must stay open");
        };
        assert!((after - before / 10.0).abs() < 1e-15, "{before} -> {after}");
    }

    #[test]
    fn held_load_is_priced_until_its_end_then_only_our_own_count() {
        let (m, p, mut s) = owned_then_api();
        let all = [0b11u64];
        // Held figures (the server stopped answering): full until 1,000.
        let held = Signal::Load {
            requests: 4,
            until_ms: Some(1_000),
        };
        assert_eq!(s.apply(0, held), Ok(()));
        s.reprice(0, &m, &p, 500);
        assert!(s.live[0].depends_on_time(500));
        assert_eq!(s.decide(&all, &all, &REQ, 500).map(|d| d.index), Ok(1));
        s.release(1, 1);
        // Past the end, with no new signal: `advance` alone drops them.
        s.advance(&m, &p, 1_000);
        assert!(!s.live[0].depends_on_time(1_000));
        assert_eq!(s.decide(&all, &all, &REQ, 1_000).map(|d| d.index), Ok(0));
        // Current figures never expire.
        let current = Signal::Load {
            requests: 4,
            until_ms: None,
        };
        assert_eq!(s.apply(0, current), Ok(()));
        assert!(!s.live[0].depends_on_time(u64::MAX - 1));
        assert_eq!(s.live[0].reported_load_at(u64::MAX), 4);
    }

    #[test]
    fn bad_signals_are_refused_and_change_nothing() {
        let mut s = FleetState::new(1);
        let before = s.clone();
        assert_eq!(
            s.apply(
                3,
                Signal::Load {
                    requests: 1,
                    until_ms: None
                }
            ),
            Err(SignalError::NoSuchDestination(3))
        );
        for bad in [f64::NAN, -1.0, f64::INFINITY] {
            let price = Signal::Price {
                usd_per_input_token: bad,
                usd_per_output_token: 0.0,
            };
            assert_eq!(s.apply(0, price), Err(SignalError::BadPrice));
            let hourly = Signal::HourlyPrice { usd_per_hour: bad };
            assert_eq!(s.apply(0, hourly), Err(SignalError::BadPrice));
        }
        assert_eq!(s, before);
    }
}
