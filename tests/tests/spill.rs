//! Spill is merit order, in a real Envoy: owned capacity fills to its knee,
//! then reserved, then pay-as-you-go; a failing destination trips and its
//! traffic spills to the next-cheapest until the cool-down ends; a 429 with
//! `retry-after` takes a destination out of the running for that long.
//! Health is shared by Envoy's workers (shared data for the Wasm filter,
//! process memory for the dynamic module), so what one worker sees holds
//! for all (Envoy runs two workers here). Every test runs against both.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

fn dest(name: &str, tier: &str, capacity: u32, usd_in: f64, usd_out: f64) -> Value {
    json!({"name": name, "cluster": name, "tier": tier, "capacity": capacity,
           "usd_per_input_token": usd_in, "usd_per_output_token": usd_out})
}

/// Owned, reserved and pay-as-you-go with ample capacity and the given
/// trip threshold and first cool-down.
fn three_tiers(trip_after: u32, base_cooldown_ms: u64) -> Value {
    json!({
        "allow_no_policy": true,
        "response_headers": true,
        "destinations": [
            dest("payg", "payg", 0, 2.5e-6, 1e-5),
            dest("reserved", "reserved", 16, 5e-9, 5e-9),
            dest("owned", "inhouse", 16, 1e-9, 1e-9)
        ],
        "health": {"trip_after": trip_after, "base_cooldown_ms": base_cooldown_ms}
    })
}

fn start_fleet(filter: Filter, config: Value, ups: &[&Upstream]) -> Envoy {
    require_envoy();
    let mut b = filter.add(EnvoyBuilder::new(), &config.to_string());
    for u in ups {
        b = b.cluster(u.name(), u.port());
    }
    start(&b)
}

fn chat(envoy: &Envoy) -> Response {
    Request::post_json(
        "/v1/chat/completions",
        &json!({"model": "m", "messages": []}),
    )
    .send(envoy.port())
    .unwrap_or_else(|e| panic!("request failed: {e}"))
}

fn served_by(r: &Response) -> String {
    format!(
        "{}/{}",
        r.header("x-ace-destination").unwrap_or("-"),
        r.header("x-ace-reason").unwrap_or("-")
    )
}

fn owned_fills_to_its_knee_then_reserved_then_payg(filter: Filter) {
    let (owned, reserved, payg) = (upstream("owned"), upstream("reserved"), upstream("payg"));
    for u in [&owned, &reserved, &payg] {
        u.set_behavior(Behavior::Slow(Duration::from_millis(2500)));
    }
    // Capacity 4 with the knee at 0.75: three requests before queueing bites.
    let mut o = dest("owned", "inhouse", 4, 1e-9, 1e-9);
    o["knee"] = json!(0.75);
    let mut r = dest("reserved", "reserved", 4, 5e-9, 5e-9);
    r["knee"] = json!(0.75);
    let config = json!({"allow_no_policy": true, "response_headers": true, "destinations": [dest("payg", "payg", 0, 2.5e-6, 1e-5), r, o]});
    let envoy = start_fleet(filter, config, &[&owned, &reserved, &payg]);

    let port = envoy.port();
    let clients: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(40 * i));
                Request::post_json("/v1/chat/completions", &json!({"model": "m"}))
                    .send(port)
                    .map(|r| (r.status, served_by(&r)))
            })
        })
        .collect();
    let results: Vec<_> = clients.into_iter().map(|c| c.join()).collect();
    for r in &results {
        match r {
            Ok(Ok((200, _))) => {}
            other => panic!("every request must be served: {other:?}"),
        }
    }
    assert_eq!(owned.count(), 3, "owned fills to its knee (3 of 4)");
    assert_eq!(reserved.count(), 3, "then reserved to its knee");
    assert_eq!(payg.count(), 6, "pay-as-you-go takes the rest");
    assert_eq!(owned.max_in_flight(), 3);
}

/// A streamed answer's headers come at its first token, but the sequence
/// holds its place in the server's batch until its last: the slot is the
/// request's until the stream ends, so owned capacity still fills to its
/// knee and no further.
fn a_streamed_answer_holds_its_slot_until_its_last_byte(filter: Filter) {
    let (owned, payg) = (upstream("owned"), upstream("payg"));
    for u in [&owned, &payg] {
        u.set_behavior(Behavior::Stream {
            first: Duration::from_millis(20),
            per_in_flight: Duration::ZERO,
            rest: Duration::from_millis(2500),
        });
    }
    let mut o = dest("owned", "inhouse", 4, 1e-9, 1e-9);
    o["knee"] = json!(0.75);
    let config = json!({"allow_no_policy": true, "response_headers": true,
                        "destinations": [dest("payg", "payg", 0, 2.5e-6, 1e-5), o]});
    let envoy = start_fleet(filter, config, &[&owned, &payg]);
    let port = envoy.port();
    let clients: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100 * i));
                Request::post_json(
                    "/v1/chat/completions",
                    &json!({"model": "m", "stream": true}),
                )
                .send(port)
                .map(|r| (r.status, served_by(&r), r.text()))
            })
        })
        .collect();
    for c in clients {
        match c.join() {
            Ok(Ok((200, _, body))) => assert!(body.contains("[DONE]"), "{body}"),
            other => panic!("every request must be served whole: {other:?}"),
        }
    }
    assert_eq!(
        owned.count(),
        3,
        "owned fills to its knee (3 of 4), streams and all"
    );
    assert_eq!(payg.count(), 5, "pay-as-you-go takes the rest");
    // All five were sent while the first three still streamed.
    assert_eq!(owned.max_in_flight(), 3);
}

fn a_failing_destination_trips_spills_and_returns_after_the_cooldown(filter: Filter) {
    let (owned, reserved, payg) = (upstream("owned"), upstream("reserved"), upstream("payg"));
    let config = three_tiers(3, 2000);
    let envoy = start_fleet(filter, config, &[&owned, &reserved, &payg]);
    assert_eq!(served_by(&chat(&envoy)), "owned/cheapest");

    owned.set_behavior(Behavior::Status(503));
    for i in 0..3 {
        let r = chat(&envoy);
        assert_eq!(r.status, 503, "failure {i} passes through to the client");
        assert_eq!(r.header("x-upstream"), Some("owned"));
    }
    // Tripped: the next-cheapest takes the traffic, on every worker.
    for _ in 0..6 {
        let r = chat(&envoy);
        assert_eq!(r.status, 200);
        assert_eq!(served_by(&r), "reserved/spill");
    }
    assert_eq!(owned.count(), 4, "no request reaches a tripped destination");

    owned.set_behavior(Behavior::Ok);
    std::thread::sleep(Duration::from_millis(2200));
    let probe = chat(&envoy);
    assert_eq!(served_by(&probe), "owned/half_open_probe");
    assert_eq!(probe.status, 200);
    assert_eq!(
        served_by(&chat(&envoy)),
        "owned/cheapest",
        "closed again after the probe"
    );
    assert!(
        envoy.log().contains("destination owned: Tripped"),
        "{}",
        envoy.log()
    );
}

fn refused_connections_trip_the_destination(filter: Filter) {
    let (reserved, payg) = (upstream("reserved"), upstream("payg"));
    // Nothing listens on this port: Envoy answers 503 (UF) locally.
    let dead_port = ace_harness::free_port().unwrap_or_else(|e| panic!("{e}"));
    require_envoy();
    let config = three_tiers(2, 60000);
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &config.to_string())
            .cluster("owned", dead_port)
            .cluster("reserved", reserved.port())
            .cluster("payg", payg.port()),
    );
    for _ in 0..2 {
        assert_eq!(chat(&envoy).status, 503);
    }
    for _ in 0..4 {
        let r = chat(&envoy);
        assert_eq!((r.status, served_by(&r).as_str()), (200, "reserved/spill"));
    }
    assert_eq!(reserved.count(), 4);
}

fn a_429_with_retry_after_takes_the_destination_out_for_that_long(filter: Filter) {
    let (cheap, dear) = (upstream("payg-cheap"), upstream("payg-dear"));
    let config = json!({"allow_no_policy": true, "response_headers": true, "destinations": [
        dest("payg-dear", "payg", 0, 5e-6, 2e-5),
        dest("payg-cheap", "payg", 0, 1e-6, 4e-6)
    ]});
    let envoy = start_fleet(filter, config, &[&cheap, &dear]);
    assert_eq!(served_by(&chat(&envoy)), "payg-cheap/cheapest");

    cheap.set_behavior(Behavior::RateLimited { retry_after_s: 2 });
    let throttled = chat(&envoy);
    assert_eq!(throttled.status, 429);
    assert_eq!(throttled.header("retry-after"), Some("2"));
    cheap.set_behavior(Behavior::Ok);
    for _ in 0..5 {
        assert_eq!(served_by(&chat(&envoy)), "payg-dear/spill");
    }
    assert_eq!(cheap.count(), 2);
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(
        served_by(&chat(&envoy)),
        "payg-cheap/cheapest",
        "back after retry-after"
    );
}

ace_tests::for_each_filter!(
    owned_fills_to_its_knee_then_reserved_then_payg,
    a_streamed_answer_holds_its_slot_until_its_last_byte,
    a_failing_destination_trips_spills_and_returns_after_the_cooldown,
    refused_connections_trip_the_destination,
    a_429_with_retry_after_takes_the_destination_out_for_that_long,
);
