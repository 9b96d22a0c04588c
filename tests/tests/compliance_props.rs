//! Compliance fails closed, end to end: the example Cedar policies in
//! `policies/` are compiled into tables, and for random requests (every
//! attribute random, unknown values included), random cost models, random
//! loads and random health states, whatever the decision picks is a
//! destination that Cedar's own authorizer permits for that request.
//!
//! This composes the two halves proven elsewhere (tables == Cedar in
//! `ace policy verify` and the policy compiler's property test; choice within
//! the mask in the core's property test) into the one statement that
//! matters, checked against Cedar directly.

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{decide, Fleet, Request, Slate};
use ace_core::health::{Health, HealthPolicy, Outcome};
use ace_core::tables::Tables;
use proptest::prelude::*;
use std::sync::OnceLock;

struct Compiled {
    project: ace_policy::Project,
    tables: Vec<u8>,
}

fn compiled() -> &'static Compiled {
    static C: OnceLock<Compiled> = OnceLock::new();
    C.get_or_init(|| {
        let dir = ace_harness::workspace_root().join("policies");
        let project = ace_policy::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let tables = ace_policy::compile(&project)
            .unwrap_or_else(|e| panic!("{e}"))
            .bytes;
        Compiled { project, tables }
    })
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::InHouse),
        Just(Tier::Reserved),
        Just(Tier::Spot),
        Just(Tier::OnDemand),
        Just(Tier::Payg)
    ]
}

fn model() -> impl Strategy<Value = CostModel> {
    (tier(), 0.0..1e-5f64, 0.0..4e-5f64, 1u32..16, 0.2..4.0f64).prop_map(
        |(tier, i, o, cap, bias)| CostModel {
            tier,
            usd_per_input_token: i,
            usd_per_output_token: o,
            usd_per_gpu_hour: 3.0,
            tokens_per_second: 1000.0,
            capacity: if tier == Tier::Payg { 0 } else { cap },
            bias,
            ..CostModel::default()
        },
    )
}

fn health() -> impl Strategy<Value = Health> {
    proptest::collection::vec(0u8..3, 0..5).prop_map(|events| {
        let p = HealthPolicy::default();
        let mut h = Health::default();
        for e in events {
            let o = match e {
                0 => Outcome::Failure,
                1 => Outcome::Throttled {
                    retry_after_ms: Some(500),
                },
                _ => Outcome::Success {
                    latency_ms: 5_000,
                    slo_ms: Some(100),
                },
            };
            h.observe(o, 0, &p);
        }
        h
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_choice_is_permitted_by_cedar(
        raw_values in proptest::collection::vec(0u32..64, 8),
        models in proptest::collection::vec(model(), 64),
        healths in proptest::collection::vec(health(), 64),
        loads in proptest::collection::vec(0u32..20, 64),
        warm_bits in any::<u64>(),
        tokens_in in 1u32..10_000,
        tokens_out in 1u32..2_000,
        now_ms in 0u64..10_000,
    ) {
        let c = compiled();
        let tables = Tables::load(&c.tables).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let n = tables.destination_count();
        prop_assume!(n <= 64);
        // One value index per attribute, unknown (0) included.
        let idx: Vec<u32> = c
            .project
            .attributes
            .iter()
            .zip(&raw_values)
            .map(|(a, r)| r % (a.len() as u32 + 1))
            .collect();
        let mut mask = vec![0u64; tables.words()];
        tables.feasible(&idx, &mut mask).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let policy = HealthPolicy::default();
        let fleet = Fleet {
            models: &models[..n],
            health: &healths[..n],
            in_flight: &loads[..n],
            policy: &policy,
        };
        let req = Request { tokens_in, tokens_out, latency_usd_per_s: 0.002 };
        let mut slate = Slate::new(n);
        slate.refresh(&fleet, now_ms);
        if let Ok(decision) = decide(&slate, &mask, &[warm_bits], &req) {
            let context = c.project.context(&idx).map_err(TestCaseError::fail)?;
            let request = c
                .project
                .request_with(&idx, decision.index, context)
                .map_err(TestCaseError::fail)?;
            prop_assert!(
                c.project.allows(&request),
                "Cedar denies {} for {}",
                tables.destination_name(decision.index).unwrap_or("?"),
                c.project.describe(&idx)
            );
        }
    }
}

/// The property above is only as strong as the decisions it sees: over a
/// fixed sample of requests with a healthy fleet, most requests get a
/// destination, all of them Cedar-permitted, and requests that Cedar denies
/// everywhere are refused.
#[test]
fn a_healthy_fleet_serves_most_requests_and_only_where_cedar_allows() {
    let c = compiled();
    let tables = Tables::load(&c.tables).unwrap_or_else(|e| panic!("{e}"));
    let n = tables.destination_count();
    let models: Vec<CostModel> = (0..n)
        .map(|i| CostModel {
            tier: Tier::Payg,
            usd_per_input_token: 1e-6 * (1 + i) as f64,
            ..CostModel::default()
        })
        .collect();
    let healths = vec![Health::default(); n];
    let loads = vec![0u32; n];
    let policy = HealthPolicy::default();
    let fleet = Fleet {
        models: &models,
        health: &healths,
        in_flight: &loads,
        policy: &policy,
    };
    let req = Request {
        tokens_in: 100,
        tokens_out: 10,
        latency_usd_per_s: 0.0,
    };
    let mut slate = Slate::new(n);
    slate.refresh(&fleet, 0);
    let mut rng = ace_policy::verify::Rng(7);
    let (mut served, mut refused) = (0, 0);
    let mut mask = vec![0u64; tables.words()];
    for _ in 0..2_000 {
        // Known values only (1..=len): every request is a real one.
        let idx: Vec<u32> = c
            .project
            .attributes
            .iter()
            .map(|a| 1 + rng.below(a.len() as u64) as u32)
            .collect();
        tables
            .feasible(&idx, &mut mask)
            .unwrap_or_else(|e| panic!("{e}"));
        let context = c.project.context(&idx).unwrap_or_else(|e| panic!("{e}"));
        let allowed: Vec<bool> = (0..n)
            .map(|d| {
                let r = c.project.request_with(&idx, d, context.clone());
                c.project.allows(&r.unwrap_or_else(|e| panic!("{e}")))
            })
            .collect();
        match decide(&slate, &mask, &[u64::MAX], &req) {
            Ok(d) => {
                assert!(
                    allowed[d.index],
                    "chose a Cedar-denied destination for {}",
                    c.project.describe(&idx)
                );
                served += 1;
            }
            Err(_) => {
                assert!(
                    !allowed.contains(&true),
                    "refused although Cedar allows some destination"
                );
                refused += 1;
            }
        }
    }
    assert!(served > 200, "served {served}, refused {refused}");
    assert!(
        refused > 0,
        "the examples deny some requests everywhere (e.g. PHI to no BAA)"
    );
}
