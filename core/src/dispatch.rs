//! The decision: feasible AND healthy AND under cap, then the lowest
//! effective cost.
//!
//! ```text
//! for each destination d in the feasible bitmask (from the policy tables):
//!     skip d if its breaker is open (or half-open with its probe out)
//!     skip d if it is at its capacity cap (cut by 429s)
//!     marginal(d)  = tier cost curve at current load, + cold-load if not warm
//!     effective(d) = (marginal(d) + latency_value * queueing_delay(d)) * derate(d) * bias(d)
//! choose the lowest effective; ties go to the lower index
//! ```
//!
//! The result carries the chosen destination, the runner-up, the true
//! marginal cost (what the ledger books; bias and derate never touch it), the
//! all-pay-as-you-go counterfactual, and a reason code. Nothing allocates:
//! the inputs are borrowed slices and the output is a small `Copy` value.
//! Infeasible destinations are never looked at, so no cost, bias or health
//! state can make one win: compliance fails closed by construction.

use crate::cost::{CostModel, Tier};
use crate::health::{Health, HealthPolicy};

/// The fleet as the decision sees it: parallel slices, one entry per
/// destination, in table order.
#[derive(Clone, Copy, Debug)]
pub struct Fleet<'a> {
    /// Cost parameters (validated at load).
    pub models: &'a [CostModel],
    /// Current health.
    pub health: &'a [Health],
    /// Requests in flight now (summed over all workers).
    pub in_flight: &'a [u32],
    /// Health tunables.
    pub policy: &'a HealthPolicy,
}

/// The request's side of the decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// Estimated input tokens.
    pub tokens_in: u32,
    /// Estimated output tokens.
    pub tokens_out: u32,
    /// What a second of extra latency is worth for this request's class, USD.
    pub latency_usd_per_s: f64,
    /// Now, milliseconds (any monotonic epoch shared with the health state).
    pub now_ms: u64,
}

/// Why the destination was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Lowest effective cost among several candidates.
    Cheapest,
    /// The only candidate.
    OnlyOption,
    /// A cheaper feasible destination is tripped, throttled or full, so the
    /// request spilled along the merit order.
    Spill,
    /// The destination is half-open and this request is its probe.
    Probe,
}

impl Reason {
    /// Stable name for headers, events and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Cheapest => "cheapest",
            Reason::OnlyOption => "only_option",
            Reason::Spill => "spill",
            Reason::Probe => "half_open_probe",
        }
    }
}

/// Why nothing was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Policy allows no destination for this request.
    NoFeasibleDestination,
    /// Some are allowed, but every one is tripped, throttled or full.
    NoHealthyDestination,
}

impl Refusal {
    /// Stable name for error bodies, events and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::NoFeasibleDestination => "no_feasible_destination",
            Refusal::NoHealthyDestination => "no_healthy_destination",
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// Chosen destination index.
    pub index: usize,
    /// Next-best candidate, if any.
    pub runner_up: Option<usize>,
    /// True marginal cost of the request on the chosen destination, USD.
    pub marginal_usd: f64,
    /// The rank the choice won with (marginal + latency, x derate, x bias).
    pub effective_usd: f64,
    /// What the cheapest feasible pay-as-you-go destination would have
    /// charged at list price (`None` when the fleet has no feasible payg).
    pub counterfactual_usd: Option<f64>,
    /// The pay-as-you-go destination the counterfactual was priced on.
    pub counterfactual_index: Option<usize>,
    /// Why.
    pub reason: Reason,
}

/// Is bit `i` set in `mask`? Missing words read as zero (fail closed).
#[inline]
pub fn bit(mask: &[u64], i: usize) -> bool {
    mask.get(i / 64).is_some_and(|w| (w >> (i % 64)) & 1 == 1)
}

/// The effective cost of `model` for `req`, or `None` if it cannot take it
/// now. Returns (effective, marginal).
#[inline]
fn price(
    model: &CostModel,
    health: &Health,
    in_flight: u32,
    warm: bool,
    req: &Request,
    policy: &HealthPolicy,
) -> Option<(f64, f64)> {
    let cold = if warm { 0.0 } else { model.cold_load_usd };
    // The common case: healthy, uncut, not derated, under capacity.
    if health.is_pristine(req.now_ms) && (model.capacity == 0 || in_flight < model.capacity) {
        let marginal = model.rest_usd(req.tokens_in, req.tokens_out) + cold;
        let used = f64::from(in_flight) + 1.0;
        let delay = if model.capacity != 0 && used > model.knee * f64::from(model.capacity) {
            model.queueing_delay_s(in_flight, Some(model.capacity))
        } else {
            0.0
        };
        return Some((
            (marginal + req.latency_usd_per_s * delay) * model.bias,
            marginal,
        ));
    }
    if !health.admits(req.now_ms) {
        return None;
    }
    let cap = health.cap(model.capacity, req.now_ms);
    let marginal = model.marginal_usd(req.tokens_in, req.tokens_out, warm, in_flight, cap)?;
    let delay = model.queueing_delay_s(in_flight, cap.or(Some(model.capacity)));
    let effective =
        (marginal + req.latency_usd_per_s * delay) * health.derate(req.now_ms, policy) * model.bias;
    Some((effective, marginal))
}

/// Choose a destination for `req`.
///
/// `feasible` is the policy bitmask (bit i = destination i may serve this
/// request); `warm` says which destinations have the requested model loaded.
/// Both are read as zero past their end.
pub fn decide(
    fleet: &Fleet<'_>,
    feasible: &[u64],
    warm: &[u64],
    req: &Request,
) -> Result<Decision, Refusal> {
    let n = fleet.models.len();
    let mut any_feasible = false;
    // (index, effective, marginal)
    let mut best: Option<(usize, f64, f64)> = None;
    let mut second: Option<(usize, f64)> = None;
    let mut counterfactual: Option<(usize, f64)> = None;
    // Cheapest at-rest marginal among feasible destinations we had to skip.
    let mut skipped_cheapest: Option<f64> = None;

    for (word_index, &word) in feasible.iter().enumerate() {
        let mut w = word;
        while w != 0 {
            let d = word_index * 64 + w.trailing_zeros() as usize;
            w &= w - 1;
            if d >= n {
                break;
            }
            any_feasible = true;
            let (Some(model), Some(health)) = (fleet.models.get(d), fleet.health.get(d)) else {
                continue;
            };
            let is_warm = bit(warm, d);
            if model.tier == Tier::Payg {
                let list = model.rest_usd(req.tokens_in, req.tokens_out);
                if counterfactual.is_none_or(|(_, x)| list < x) {
                    counterfactual = Some((d, list));
                }
            }
            let in_flight = fleet.in_flight.get(d).copied().unwrap_or(0);
            match price(model, health, in_flight, is_warm, req, fleet.policy) {
                Some((eff, marg)) => match best {
                    Some((_, b, _)) if eff >= b => {
                        if second.is_none_or(|(_, s)| eff < s) {
                            second = Some((d, eff));
                        }
                    }
                    _ => {
                        second = best.map(|(i, e, _)| (i, e));
                        best = Some((d, eff, marg));
                    }
                },
                None => {
                    let cold = if is_warm { 0.0 } else { model.cold_load_usd };
                    let at_rest = model.rest_usd(req.tokens_in, req.tokens_out) + cold;
                    if skipped_cheapest.is_none_or(|x| at_rest < x) {
                        skipped_cheapest = Some(at_rest);
                    }
                }
            }
        }
    }

    let Some((index, effective_usd, marginal_usd)) = best else {
        return Err(if any_feasible {
            Refusal::NoHealthyDestination
        } else {
            Refusal::NoFeasibleDestination
        });
    };
    let probing = fleet
        .health
        .get(index)
        .is_some_and(|h| h.breaker(req.now_ms) == crate::health::Breaker::HalfOpen);
    let reason = if probing {
        Reason::Probe
    } else if skipped_cheapest.is_some_and(|c| c < marginal_usd) {
        Reason::Spill
    } else if second.is_some() {
        Reason::Cheapest
    } else {
        Reason::OnlyOption
    };
    Ok(Decision {
        index,
        runner_up: second.map(|(i, _)| i),
        marginal_usd,
        effective_usd,
        counterfactual_usd: counterfactual.map(|(_, c)| c),
        counterfactual_index: counterfactual.map(|(i, _)| i),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Outcome;
    use alloc::vec;
    use alloc::vec::Vec;

    fn owned(cap: u32) -> CostModel {
        CostModel {
            tier: Tier::InHouse,
            usd_per_input_token: 1e-8,
            usd_per_output_token: 1e-8,
            capacity: cap,
            ..CostModel::default()
        }
    }
    fn reserved(cap: u32) -> CostModel {
        CostModel {
            tier: Tier::Reserved,
            usd_per_input_token: 2e-8,
            usd_per_output_token: 2e-8,
            capacity: cap,
            ..CostModel::default()
        }
    }
    fn payg() -> CostModel {
        CostModel {
            tier: Tier::Payg,
            usd_per_input_token: 1e-6,
            usd_per_output_token: 4e-6,
            ..CostModel::default()
        }
    }
    const REQ: Request = Request {
        tokens_in: 1000,
        tokens_out: 200,
        latency_usd_per_s: 0.001,
        now_ms: 0,
    };

    struct World {
        models: Vec<CostModel>,
        health: Vec<Health>,
        in_flight: Vec<u32>,
        policy: HealthPolicy,
    }
    impl World {
        fn new(models: Vec<CostModel>) -> World {
            let n = models.len();
            World {
                models,
                health: vec![Health::default(); n],
                in_flight: vec![0; n],
                policy: HealthPolicy::default(),
            }
        }
        fn decide(&self, feasible: u64) -> Result<Decision, Refusal> {
            let fleet = Fleet {
                models: &self.models,
                health: &self.health,
                in_flight: &self.in_flight,
                policy: &self.policy,
            };
            decide(&fleet, &[feasible], &[u64::MAX], &REQ)
        }
    }

    #[test]
    fn owned_fills_to_its_knee_then_reserved_then_payg() {
        let mut w = World::new(vec![payg(), reserved(10), owned(10)]);
        let mut order = Vec::new();
        for _ in 0..25 {
            let d = w.decide(0b111).map(|d| d.index).unwrap_or(99);
            order.push(d);
            if let Some(x) = w.in_flight.get_mut(d) {
                *x += 1;
            }
        }
        // Owned first up to its knee (8 of 10), then reserved to its knee.
        assert_eq!(&order[..8], &[2; 8]);
        assert_eq!(&order[8..16], &[1; 8]);
        assert!(
            order[16..].contains(&0),
            "payg takes the overflow: {order:?}"
        );
        assert!(!order.contains(&99));
    }

    #[test]
    fn infeasible_destinations_are_never_chosen() {
        let w = World::new(vec![payg(), owned(10)]);
        assert_eq!(w.decide(0b01).map(|d| d.index), Ok(0));
        assert_eq!(w.decide(0), Err(Refusal::NoFeasibleDestination));
    }

    #[test]
    fn a_tripped_destination_spills_to_the_next_and_returns_after_cooldown() {
        let mut w = World::new(vec![payg(), owned(10)]);
        let p = w.policy;
        for _ in 0..3 {
            w.health[1].observe(Outcome::Failure, 0, &p);
        }
        let d = w.decide(0b11);
        assert_eq!(d.map(|d| (d.index, d.reason)), Ok((0, Reason::Spill)));
        assert_eq!(w.decide(0b10), Err(Refusal::NoHealthyDestination));
        let later = Request {
            now_ms: p.base_cooldown_ms,
            ..REQ
        };
        let fleet = Fleet {
            models: &w.models,
            health: &w.health,
            in_flight: &w.in_flight,
            policy: &w.policy,
        };
        let d = decide(&fleet, &[0b11], &[u64::MAX], &later);
        assert_eq!(d.map(|d| (d.index, d.reason)), Ok((1, Reason::Probe)));
    }

    #[test]
    fn bias_moves_the_rank_but_not_the_booked_cost() {
        let mut w = World::new(vec![reserved(10), owned(10)]);
        let unbiased = w.decide(0b11);
        assert_eq!(unbiased.map(|d| d.index), Ok(1));
        w.models[0].bias = 0.1;
        let d = w.decide(0b11);
        assert_eq!(d.map(|d| d.index), Ok(0));
        let booked = d.map(|d| d.marginal_usd).unwrap_or(f64::NAN);
        let true_cost = reserved(10)
            .marginal_usd(1000, 200, true, 0, Some(10))
            .unwrap_or(0.0);
        assert_eq!(booked, true_cost);
    }

    #[test]
    fn counterfactual_is_the_cheapest_feasible_payg_list_price() {
        let w = World::new(vec![payg(), owned(10)]);
        let d = w.decide(0b11);
        let expected = 1000.0 * 1e-6 + 200.0 * 4e-6;
        assert_eq!(d.map(|d| d.counterfactual_usd), Ok(Some(expected)));
        assert_eq!(w.decide(0b10).map(|d| d.counterfactual_usd), Ok(None));
    }

    #[test]
    fn cold_models_cost_their_load() {
        let mut a = owned(10);
        a.cold_load_usd = 1.0;
        let b = reserved(10);
        let w = World::new(vec![a, b]);
        let fleet = Fleet {
            models: &w.models,
            health: &w.health,
            in_flight: &w.in_flight,
            policy: &w.policy,
        };
        // Model warm only on destination 1: the reserved block wins.
        assert_eq!(
            decide(&fleet, &[0b11], &[0b10], &REQ).map(|d| d.index),
            Ok(1)
        );
        assert_eq!(
            decide(&fleet, &[0b11], &[0b11], &REQ).map(|d| d.index),
            Ok(0)
        );
    }
}
