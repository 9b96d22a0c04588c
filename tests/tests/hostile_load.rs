//! Hostile traffic at scale, in a real Envoy, against both builds: 2,000
//! concurrent connections, every request forging `x-ace-destination` toward
//! the non-EU destination, half of them EU personal data, while the
//! destinations' health flips under them. What must hold: no upstream ever
//! receives EU personal data outside the EU (read from what the upstreams
//! recorded, not from ACE's events), every request leaves exactly one event,
//! and every access-log line is one JSON object.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{
    destination_upstreams, require_envoy, residency_spec, start, tables_base64, Filter,
};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

const CONNECTIONS: usize = 2_000;

/// `sg-cheap` (bit 0, Singapore, cheapest), `eu-owned` (bit 1),
/// `eu-payg` (bit 2): personal_eu stays in the EU.
fn config() -> Value {
    let tables = tables_base64(&residency_spec(&["sg-cheap", "eu-owned", "eu-payg"], 0b001));
    json!({
        "destinations": [
            {"name": "sg-cheap", "cluster": "sg_cheap", "tier": "inhouse", "capacity": 4096,
             "usd_per_input_token": 1e-10, "usd_per_output_token": 1e-10},
            {"name": "eu-owned", "cluster": "eu_owned", "tier": "inhouse", "capacity": 4096,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9},
            {"name": "eu-payg", "cluster": "eu_payg", "tier": "payg",
             "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6}
        ],
        "tables_base64": tables,
        "body": {"read": true},
        "health": {"trip_after": 3, "base_cooldown_ms": 200, "max_cooldown_ms": 1000}
    })
}

fn thousands_of_hostile_connections_with_flipping_health(filter: Filter) {
    require_envoy();
    let config = config();
    let builder = filter.add_reading_body(EnvoyBuilder::new(), &config.to_string());
    let (builder, ups) = destination_upstreams(&config, builder);
    let [sg, eu, payg]: [Upstream; 3] = ups
        .try_into()
        .unwrap_or_else(|_| panic!("the fleet has three destinations"));
    let builder = builder.concurrency(2);
    let envoy = start(&filter.event_log(builder));
    let port = envoy.port();

    // Health flips while the load runs.
    let done = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let barrier = Barrier::new(CONNECTIONS);
    std::thread::scope(|scope| {
        let flipper = scope.spawn(|| {
            let mut i = 0u32;
            while !done.load(Ordering::Relaxed) {
                i += 1;
                eu.set_behavior(if i.is_multiple_of(3) {
                    Behavior::Status(503)
                } else {
                    Behavior::Ok
                });
                sg.set_behavior(if i.is_multiple_of(4) {
                    Behavior::Status(500)
                } else {
                    Behavior::Ok
                });
                std::thread::sleep(Duration::from_millis(50));
            }
            eu.set_behavior(Behavior::Ok);
            sg.set_behavior(Behavior::Ok);
        });
        let clients: Vec<_> = (0..CONNECTIONS)
            .map(|i| {
                let (answered, barrier) = (&answered, &barrier);
                std::thread::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn_scoped(scope, move || {
                        let class = if i.is_multiple_of(2) {
                            "personal_eu"
                        } else {
                            "public"
                        };
                        let req = Request::post_json(
                            "/v1/chat/completions",
                            &json!({"model": "m", "max_tokens": 8, "messages": []}),
                        )
                        .header("x-ace-data-class", class)
                        .header("x-ace-destination", "sg_cheap")
                        .header("x-request-id", "reused");
                        barrier.wait();
                        for _ in 0..2 {
                            if req.send(port).is_ok() {
                                answered.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                    .unwrap_or_else(|e| panic!("cannot start client {i}: {e}"))
            })
            .collect();
        for c in clients {
            let _ = c.join();
        }
        done.store(true, Ordering::Relaxed);
        let _ = flipper.join();
    });
    let answered = answered.load(Ordering::Relaxed);
    assert_eq!(answered, 2 * CONNECTIONS, "every request got an answer");

    // Zero leaks, as the upstreams saw them.
    let leaked = sg
        .requests()
        .iter()
        .filter(|r| r.header("x-ace-data-class") == Some("personal_eu"))
        .count();
    assert_eq!(leaked, 0, "EU personal data reached Singapore");

    // One event per request, each line one JSON object with its own id.
    let lines = envoy.wait_access_log(answered, Duration::from_secs(30));
    assert_eq!(lines.len(), answered, "requests sent = events logged");
    let mut ids = std::collections::HashSet::new();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
        assert!(v.is_object(), "{l}");
        assert!(
            ids.insert(v["event_id"].as_str().unwrap_or("").to_string()),
            "{l}"
        );
        if v["data_class"] == "personal_eu" {
            assert_ne!(v["destination"], "sg-cheap", "{l}");
        }
    }
    let served = sg.count() + eu.count() + payg.count();
    assert!(served > 0 && served <= answered, "{served}");
}

ace_tests::for_each_filter!(thousands_of_hostile_connections_with_flipping_health);
