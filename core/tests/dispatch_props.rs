//! Properties of the decision over random fleets, feasibility masks, loads
//! and health states:
//!
//! 1. the choice is always in the feasible mask (compliance fails closed:
//!    no cost, bias or health state can pick an infeasible destination);
//! 2. it admits the request (breaker not open, under its cap);
//! 3. its effective cost is the minimum over all feasible, admitting
//!    destinations, recomputed here independently from the cost model, and
//!    ties go to the lowest index;
//! 4. a refusal happens exactly when no feasible destination admits;
//! 5. no external signal (a drain, a load report, a capacity or price
//!    change, however hostile) makes an infeasible destination chosen;
//! 6. no latency signal (answers' times to first byte however hostile,
//!    any class target, lateness refused or not) makes an infeasible
//!    destination chosen, nor a refusal other than the one feasibility
//!    and health give when nothing is open;
//! 7. pricing one destination after it changed ([`Slate::refresh_one`]),
//!    and the time-dependent ones before deciding ([`Slate::refresh_timed`]),
//!    gives the same slate as pricing them all, at any later time.

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{bit, decide, decide_held, Fleet, Held, Refusal, Request, Slate};
use ace_core::fleet::{FleetState, Signal};
use ace_core::health::{Health, HealthPolicy, Outcome};
use proptest::prelude::*;

fn tier() -> impl Strategy<Value = Tier> {
    proptest::sample::select(Tier::ALL.to_vec())
}

fn model() -> impl Strategy<Value = CostModel> {
    (
        tier(),
        0.0..1e-5f64,
        0.0..4e-5f64,
        0.5..8.0f64,
        100.0..5000.0f64,
        1u32..32,
        0.3..1.0f64,
        0.0..0.05f64,
        prop_oneof![Just(1.0), 0.2..3.0f64],
        proptest::option::of(0.0..1e-5f64),
    )
        .prop_map(
            |(tier, i, o, gpu_h, tps, cap, knee, cold, bias, over)| CostModel {
                tier,
                usd_per_input_token: i,
                usd_per_output_token: o,
                usd_per_gpu_hour: gpu_h,
                tokens_per_second: tps,
                eviction_premium: 0.2,
                overage_usd_per_token: over,
                capacity: if tier == Tier::Payg { 0 } else { cap },
                knee,
                service_ms: 800.0,
                ttft_ms: 0.0,
                cold_load_usd: cold,
                bias,
            },
        )
}

/// A health state reached by a random history of outcomes.
fn health() -> impl Strategy<Value = Health> {
    proptest::collection::vec((0u8..5, 0u64..20_000, 0u64..3_000), 0..8).prop_map(|events| {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        for (kind, at, extra) in events {
            let o = match kind {
                0 => Outcome::Failure { tenant: 0 },
                1 => Outcome::Throttled {
                    retry_after_ms: Some(extra),
                },
                2 => Outcome::Success {
                    latency_ms: extra,
                    slo_ms: Some(1_000),
                    headroom: None,
                },
                // A provider's rate-limit figures, anything from nothing
                // left to all of it.
                3 => Outcome::Success {
                    latency_ms: 1,
                    slo_ms: None,
                    headroom: Some(ace_core::health::Headroom {
                        left: extra as f64 / 2_000.0 - 0.25,
                        reset_ms: extra,
                    }),
                },
                _ => {
                    h.on_dispatch(at);
                    continue;
                }
            };
            h.observe(o, at, &p);
        }
        h
    })
}

/// Models, health, in-flight counts, feasibility mask, warm mask.
type World = (Vec<CostModel>, Vec<Health>, Vec<u32>, Vec<u64>, Vec<u64>);

fn world() -> impl Strategy<Value = World> {
    (1usize..150).prop_flat_map(|n| {
        let words = n.div_ceil(64);
        (
            proptest::collection::vec(model(), n),
            proptest::collection::vec(health(), n),
            proptest::collection::vec(0u32..40, n),
            proptest::collection::vec(any::<u64>(), words),
            proptest::collection::vec(any::<u64>(), words),
        )
    })
}

/// The effective cost, recomputed from the public model API.
fn effective(
    m: &CostModel,
    h: &Health,
    in_flight: u32,
    warm: bool,
    r: &Request,
    now_ms: u64,
    p: &HealthPolicy,
) -> Option<f64> {
    if !h.admits(now_ms) {
        return None;
    }
    let cap = h.cap(m.capacity, now_ms);
    let limited = h.provider_limited(now_ms);
    let marginal = m.marginal_usd(r.tokens_in, r.tokens_out, warm, in_flight, cap, limited)?;
    let delay = m.queueing_delay_s(in_flight, cap.or(Some(m.capacity)));
    Some((marginal + r.latency_usd_per_s * delay) * (h.derate(now_ms, p) * m.bias))
}

/// A signal as a hostile or broken control service might send it.
fn signal() -> impl Strategy<Value = Signal> {
    let price = prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::MAX),
        0.0..1e-3f64
    ];
    prop_oneof![
        any::<u64>().prop_map(|until_ms| Signal::Drain { until_ms }),
        (any::<u32>(), any::<Option<u64>>())
            .prop_map(|(requests, until_ms)| Signal::Load { requests, until_ms }),
        any::<u32>().prop_map(|slots| Signal::Capacity { slots }),
        price
            .clone()
            .prop_map(|usd_per_hour| Signal::HourlyPrice { usd_per_hour }),
        (price.clone(), price).prop_map(|(i, o)| Signal::Price {
            usd_per_input_token: i,
            usd_per_output_token: o,
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn no_signal_widens_the_feasible_set(
        (models, health, in_flight, feasible, warm) in world(),
        signals in proptest::collection::vec((any::<usize>(), signal()), 0..40),
        now_ms in 0u64..30_000,
    ) {
        let policy = HealthPolicy::default();
        let mut state = FleetState::new(models.len());
        state.health = health;
        state.in_flight = in_flight;
        for (d, s) in signals {
            // Refused signals (no such destination, a bad price) change nothing.
            let _ = state.apply(d % (models.len() + 2), s);
        }
        state.reprice_all(&models, &policy, now_ms);
        let req = Request::untimed(100, 100, 0.001);
        for _ in 0..8 {
            match state.decide(&feasible, &warm, &req, now_ms) {
                Ok(d) => {
                    prop_assert!(bit(&feasible, d.index), "a signal widened the feasible set");
                    prop_assert!(d.marginal_usd.is_finite() && d.marginal_usd >= 0.0);
                    state.reprice(d.index, &models, &policy, now_ms);
                }
                Err(r) => {
                    let any = (0..models.len()).any(|d| bit(&feasible, d));
                    prop_assert!(any || r == Refusal::NoFeasibleDestination);
                    break;
                }
            }
        }
    }

    #[test]
    fn no_latency_signal_widens_the_feasible_set(
        (models, health, in_flight, feasible, warm) in world(),
        answers in proptest::collection::vec((any::<usize>(), prop_oneof![0u8..8, any::<u8>()], prop_oneof![0u64..10_000_000, Just(0), Just(u64::MAX)], prop_oneof![0u32..4, Just(u32::MAX)]), 0..400),
        target_ms in proptest::option::of(1u32..5_000),
        late_usd in prop_oneof![Just(0.0), 0.0..1.0f64, Just(1e300)],
        refuse_late in any::<bool>(),
        trip_tenants in 1u8..=2,
        now_ms in 0u64..30_000,
    ) {
        let policy = HealthPolicy { trip_tenants, ..HealthPolicy::default() };
        let mut state = FleetState::new(models.len());
        state.health = health;
        state.in_flight = in_flight;
        for (d, band, ttft_ms, tenant) in answers {
            state.learn(d % (models.len() + 2), band, ttft_ms, tenant, &policy);
        }
        state.reprice_all(&models, &policy, now_ms);
        let req = Request {
            ttft_target_s: target_ms.map_or(f64::INFINITY, |t| f64::from(t) / 1000.0),
            late_usd,
            refuse_late,
            ..Request::untimed(500, 200, 0.01)
        };
        let open_feasible = (0..models.len()).any(|d| bit(&feasible, d) && state.slate.is_open(d));
        match state.decide(&feasible, &warm, &req, now_ms) {
            Ok(d) => {
                prop_assert!(bit(&feasible, d.index), "a latency signal widened the feasible set");
                prop_assert!(state.slate.is_open(d.index));
                prop_assert!(!(refuse_late && d.late), "served late a class that refuses it");
            }
            Err(Refusal::NoTimelyDestination) => {
                prop_assert!(refuse_late && open_feasible);
            }
            Err(r) => {
                prop_assert!(!open_feasible, "refused ({r:?}) with an open feasible destination");
                let any = (0..models.len()).any(|d| bit(&feasible, d));
                prop_assert_eq!(r, if any { Refusal::NoHealthyDestination } else { Refusal::NoFeasibleDestination });
            }
        }
    }

    /// Prefix locality moves the rank and the estimate, never the
    /// candidates: with any held tokens and seconds (hostile values
    /// included), the choice is feasible and open, a request refused
    /// without them is refused alike, and the booked estimate is never
    /// negative nor above the plain decision's on the same destination.
    #[test]
    fn no_held_prefix_widens_the_feasible_set(
        (models, health, in_flight, feasible, warm) in world(),
        tokens in proptest::collection::vec(prop_oneof![0.0..40_000.0f64, Just(f64::NAN), Just(f64::INFINITY), Just(-1e9), Just(1e300)], 0..20),
        seconds in proptest::collection::vec(prop_oneof![0.0..10.0f64, Just(f64::NAN), Just(f64::INFINITY), Just(-5.0)], 0..20),
        target_ms in proptest::option::of(1u32..5_000),
        refuse_late in any::<bool>(),
        now_ms in 0u64..30_000,
    ) {
        let policy = HealthPolicy::default();
        let fleet = Fleet { models: &models, health: &health, in_flight: &in_flight, live: &[], learned: &[], policy: &policy };
        let mut slate = Slate::new(models.len());
        slate.refresh(&fleet, now_ms);
        let req = Request {
            ttft_target_s: target_ms.map_or(f64::INFINITY, |t| f64::from(t) / 1000.0),
            late_usd: 0.05,
            refuse_late,
            ..Request::untimed(8_000, 200, 0.01)
        };
        let held = Held { tokens: &tokens, seconds: &seconds };
        let with = decide_held(&slate, &feasible, &warm, &req, &[], held);
        let without = decide(&slate, &feasible, &warm, &req);
        match with {
            Ok(d) => {
                prop_assert!(bit(&feasible, d.index), "a held prefix widened the feasible set");
                prop_assert!(slate.is_open(d.index), "a held prefix opened a closed destination");
                prop_assert!(d.marginal_usd.is_finite() && d.marginal_usd >= 0.0, "{d:?}");
                prop_assert!(d.held_tokens >= 0.0 && d.held_tokens <= 8_000.0);
                let mut only = vec![0u64; d.index / 64 + 1];
                only[d.index / 64] = 1u64 << (d.index % 64);
                let plain = decide(&slate, &only, &warm, &req);
                if let Ok(p) = plain {
                    prop_assert!(d.marginal_usd <= p.marginal_usd + 1e-12, "{d:?} {p:?}");
                }
            }
            Err(r) => {
                // Only lateness may differ: held seconds can make a rung
                // timely, never a closed or infeasible one a candidate.
                match without {
                    Err(w) => prop_assert!(r == w || (r == Refusal::NoTimelyDestination && w == Refusal::NoTimelyDestination)),
                    Ok(_) => prop_assert!(false, "refused ({r:?}) with held prefixes, served without"),
                }
            }
        }
    }

    /// A soft budget's ceiling on the booked cost only removes candidates:
    /// whatever its value (hostile ones included), a choice is feasible,
    /// open and within the ceiling, and costs what the plain decision on
    /// that destination books; a request refused without the ceiling is
    /// refused with it.
    #[test]
    fn no_ceiling_widens_the_feasible_set(
        (models, health, in_flight, feasible, warm) in world(),
        max_usd in prop_oneof![0.0..0.05f64, Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(0.0)],
        now_ms in 0u64..30_000,
    ) {
        let policy = HealthPolicy::default();
        let fleet = Fleet { models: &models, health: &health, in_flight: &in_flight, live: &[], learned: &[], policy: &policy };
        let mut slate = Slate::new(models.len());
        slate.refresh(&fleet, now_ms);
        let plain = Request::untimed(8_000, 200, 0.01);
        let capped = Request { max_usd, ..plain };
        let with = decide(&slate, &feasible, &warm, &capped);
        let without = decide(&slate, &feasible, &warm, &plain);
        match with {
            Ok(d) => {
                prop_assert!(bit(&feasible, d.index), "a ceiling widened the feasible set");
                prop_assert!(slate.is_open(d.index), "a ceiling opened a closed destination");
                prop_assert!(d.marginal_usd <= max_usd, "{d:?} above {max_usd}");
                let mut only = vec![0u64; d.index / 64 + 1];
                only[d.index / 64] = 1u64 << (d.index % 64);
                let alone = decide(&slate, &only, &warm, &plain).unwrap();
                prop_assert_eq!(d.marginal_usd, alone.marginal_usd);
                prop_assert!(without.is_ok());
            }
            Err(r) => {
                if let Err(w) = without {
                    prop_assert_eq!(r, w, "the same refusal without a ceiling");
                } else {
                    prop_assert!(matches!(r, Refusal::NoAffordableDestination | Refusal::NoTimelyDestination), "{r:?}");
                }
            }
        }
    }

    #[test]
    fn choice_is_feasible_admitting_and_cheapest(
        (models, health, in_flight, feasible, warm) in world(),
        tokens_in in 1u32..20_000,
        tokens_out in 1u32..4_000,
        now_ms in 0u64..30_000,
        latency in 0.0..0.01f64,
    ) {
        for m in &models {
            prop_assert!(m.validate().is_ok());
        }
        let policy = HealthPolicy::default();
        let fleet = Fleet { models: &models, health: &health, in_flight: &in_flight, live: &[], learned: &[], policy: &policy };
        let req = Request::untimed(tokens_in, tokens_out, latency);
        let mut slate = Slate::new(models.len());
        slate.refresh(&fleet, now_ms);
        let costs: Vec<Option<f64>> = (0..models.len())
            .map(|d| {
                if !bit(&feasible, d) {
                    return None;
                }
                effective(&models[d], &health[d], in_flight[d], bit(&warm, d), &req, now_ms, &policy)
            })
            .collect();
        let best = costs
            .iter()
            .enumerate()
            .filter_map(|(d, c)| c.map(|c| (d, c)))
            .fold(None, |acc: Option<(usize, f64)>, (d, c)| match acc {
                Some((_, b)) if c >= b => acc,
                _ => Some((d, c)),
            });
        match decide(&slate, &feasible, &warm, &req) {
            Ok(decision) => {
                prop_assert!(bit(&feasible, decision.index), "chose an infeasible destination");
                prop_assert!(health[decision.index].admits(now_ms), "chose a tripped destination");
                let (d, c) = best.ok_or_else(|| TestCaseError::fail("chose while the oracle found none"))?;
                // The minimum, up to rounding: the decision adds the cold-load
                // term after ranking, the oracle before, so two destinations
                // within an ulp of each other may order either way.
                let tol = 1e-12 * c.abs().max(1e-300);
                let chosen = costs[decision.index].ok_or_else(|| TestCaseError::fail("chose a closed destination"))?;
                prop_assert!(chosen - c <= tol, "chose {} at {chosen}, oracle {d} at {c}", decision.index);
                prop_assert!(decision.index == d || (chosen - c).abs() <= tol);
                prop_assert!((decision.effective_usd - c).abs() <= tol);
                if let Some(r) = decision.runner_up {
                    prop_assert!(bit(&feasible, r) && r != d);
                }
            }
            Err(refusal) => {
                prop_assert!(best.is_none(), "refused ({refusal:?}) but {best:?} was available");
                let any_feasible = (0..models.len()).any(|d| bit(&feasible, d));
                let expected = if any_feasible { Refusal::NoHealthyDestination } else { Refusal::NoFeasibleDestination };
                prop_assert_eq!(refusal, expected);
            }
        }
    }

    #[test]
    fn pricing_one_destination_matches_pricing_all(
        (models, mut health, mut in_flight, _, _) in world(),
        pick in any::<usize>(),
        change in 0u8..4,
        now_ms in 0u64..30_000,
        later in 0u64..5_000,
    ) {
        let policy = HealthPolicy::default();
        let mut slate = Slate::new(models.len());
        {
            let fleet = Fleet { models: &models, health: &health, in_flight: &in_flight, live: &[], learned: &[], policy: &policy };
            slate.refresh(&fleet, now_ms);
        }
        let d = pick % models.len();
        match change {
            0 => in_flight[d] += 1,
            1 => in_flight[d] = in_flight[d].saturating_sub(1),
            2 => { health[d].observe(Outcome::Failure { tenant: 0 }, now_ms, &policy); }
            _ => { health[d].observe(Outcome::Throttled { retry_after_ms: Some(later) }, now_ms, &policy); }
        }
        let fleet = Fleet { models: &models, health: &health, in_flight: &in_flight, live: &[], learned: &[], policy: &policy };
        slate.refresh_one(&fleet, d, now_ms);
        let mut full = Slate::new(models.len());
        full.refresh(&fleet, now_ms);
        prop_assert_eq!(&slate, &full);
        // Time passes with no change: cool-downs end, throttles lift,
        // derates decay.
        let then = now_ms + later;
        slate.refresh_timed(&fleet, then);
        full.refresh(&fleet, then);
        prop_assert_eq!(slate, full);
    }
}
