//! Nothing a control snapshot says can widen the feasible set: whatever
//! its names and figures (hostile ones included), a snapshot is rejected
//! whole or moves prices, load, capacity, drains and warmth only, and
//! every decision stays inside the policy's feasible mask.

use ace_config::Config;
use ace_core::dispatch::Request;
use ace_core::fleet::FleetState;
use ace_flow::control::{resolve, Outside, Rejected};
use ace_snapshot::{Drain, DrainReason, Load, Price, Report, Snapshot};
use proptest::prelude::*;

const NAMES: [&str; 6] = ["owned", "reserved", "spot", "ondemand", "api-a", "api-b"];

fn config() -> Config {
    Config::parse(
        br#"{"allow_no_policy":true,"control":{"cluster":"ace_control"},"destinations":[
        {"name":"owned","cluster":"c0","tier":"inhouse","capacity":4,
         "usd_per_input_token":1e-9,"usd_per_output_token":1e-9,"warm_models":["m1"]},
        {"name":"reserved","cluster":"c1","tier":"reserved","capacity":4,
         "usd_per_input_token":1e-9,"usd_per_output_token":1e-9},
        {"name":"spot","cluster":"c2","tier":"spot","usd_per_gpu_hour":2.0,"tokens_per_second":500},
        {"name":"ondemand","cluster":"c3","tier":"ondemand","usd_per_gpu_hour":4.0,"tokens_per_second":500},
        {"name":"api-a","cluster":"c4","tier":"payg","usd_per_input_token":1e-6,"usd_per_output_token":2e-6},
        {"name":"api-b","cluster":"c5","tier":"payg","usd_per_input_token":3e-6,"usd_per_output_token":6e-6}]}"#,
    )
    .unwrap()
}

fn figure() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-0.0),
        Just(-1e-6),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::MAX),
        0.0..1e-3f64,
    ]
}

fn report() -> impl Strategy<Value = Report> {
    let name = prop_oneof![
        4 => prop::sample::select(NAMES.to_vec()).prop_map(str::to_string),
        1 => "[a-z-]{1,12}",
    ];
    (
        name,
        prop::option::of((
            any::<u32>(),
            any::<u32>(),
            0u16..=1000,
            any::<bool>(),
            any::<u64>(),
        )),
        prop::option::of(any::<u32>()),
        prop::option::of((figure(), figure())),
        prop::option::of(figure()),
        prop::option::of(any::<u64>()),
        prop::option::of(prop::collection::vec("m[0-9]", 0..3)),
    )
        .prop_map(
            |(name, load, capacity, price, hourly, drain, warm)| Report {
                name,
                load: load.map(|(running, waiting, kv_permille, stale, scraped_ms)| Load {
                    running,
                    waiting,
                    kv_permille,
                    stale,
                    scraped_ms: if stale { scraped_ms } else { 0 },
                }),
                capacity,
                price: price.map(|(i, o)| Price {
                    usd_per_input_token: i,
                    usd_per_output_token: o,
                }),
                usd_per_hour: hourly,
                drain: drain.map(|until_ms| Drain {
                    until_ms,
                    reason: DrainReason::Eviction,
                }),
                warm,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn no_snapshot_widens_the_feasible_set(
        reports in prop::collection::vec(report(), 0..8),
        feasible in 0u64..64,
        model in prop::option::of("m[0-9]"),
        now in 0u64..10_000_000,
        stale in any::<bool>(),
    ) {
        let cfg = config();
        let control = cfg.control.clone().unwrap();
        let snapshot = Snapshot { version: 1, generated_ms: 0, reports, budgets: Vec::new() };
        let mut state = FleetState::new(cfg.destinations.len());
        state.reprice_all(&cfg.models, &cfg.health, now);
        let mut outside = Outside::new(&cfg);
        match resolve(&cfg, &snapshot) {
            Ok(resolved) => {
                // Resolution only ever names configured destinations.
                prop_assert!(snapshot.reports.iter().all(|r| NAMES.contains(&r.name.as_str())));
                prop_assert_eq!(resolved.lives.len(), cfg.destinations.len());
                outside.accept(resolved, now);
            }
            Err(Rejected::Unknown { name }) => {
                prop_assert!(!NAMES.contains(&name.as_str()));
            }
            Err(_) => {}
        }
        if stale {
            outside.age(&control, 0, now.saturating_add(control.stale_after_ms + 1));
        }
        outside.apply_to(&mut state, &cfg, now);
        let mask = [feasible];
        let req = Request::untimed(100, 100, 0.0);
        for _ in 0..4 {
            let warm = outside.warmth.mask(model.as_deref());
            match state.decide(&mask, warm, &req, now) {
                Ok(d) => {
                    prop_assert!(d.index < NAMES.len());
                    prop_assert!(feasible & (1 << d.index) != 0, "decided {} outside {:#b}", d.index, feasible);
                    prop_assert!(d.cost_of(100, 100).is_finite());
                    state.reprice(d.index, &cfg.models, &cfg.health, now);
                }
                Err(_) => break,
            }
        }
        if feasible == 0 {
            prop_assert!(state.decide(&mask, outside.warmth.mask(None), &req, now).is_err());
        }
    }
}
