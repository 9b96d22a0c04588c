//! The event spine in a real Envoy: exactly one parseable NDJSON event per
//! request in the access log, served or refused, with every field the ledger
//! needs; and ACE's counters visible in Envoy's stats. Runs against the Wasm
//! filter and the dynamic module.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Behavior;
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

fn one_parseable_event_per_request_with_every_field(filter: Filter) {
    require_envoy();
    let (owned, payg) = (upstream("owned"), upstream("payg"));
    let config = json!({"allow_no_policy": true, "response_headers": true, "destinations": [
        {"name": "payg", "cluster": "payg", "tier": "payg",
         "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
        {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 8,
         "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8, "slo_ms": 5000}
    ], "health": {"trip_after": 2, "base_cooldown_ms": 60000}});
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &config.to_string())
            .cluster("owned", owned.port())
            .cluster("payg", payg.port())
            .access_log_line(filter.event_log_line()),
    );
    let send = || {
        Request::post_json(
            "/v1/chat/completions",
            &json!({"model": "llama", "messages": []}),
        )
        .header("x-ace-tenant", "acme")
        .header("x-ace-data-class", "eu-personal")
        .header("x-ace-model", "llama")
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
    };
    let statuses: Vec<u16> = (0..3).map(|_| send().status).collect();
    assert_eq!(statuses, [200, 200, 200]);
    // Make the owned pool fail twice (trip), then the payg API too: 503s.
    owned.set_behavior(Behavior::Status(500));
    payg.set_behavior(Behavior::Status(500));
    for _ in 0..4 {
        send();
    }
    let refused = send();
    assert_eq!(refused.status, 503);
    let err = refused.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(err["error"]["type"], "no_feasible_destination");
    assert_eq!(err["error"]["reason"], "no_healthy_destination");

    let lines = envoy.wait_access_log(8, Duration::from_secs(10));
    assert_eq!(
        lines.len(),
        8,
        "one line per request:\n{}",
        lines.join("\n")
    );
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for e in &events {
        // Every field of the one definition, and no other; a price the
        // control service set (kind `Rate`) only where it set one (none
        // here: no control service).
        let mut keys: Vec<&str> = e
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let mut fields: Vec<&str> = ace_flow::schema::FIELDS
            .iter()
            .filter(|f| f.kind != ace_flow::schema::Kind::Rate)
            .map(|f| f.name)
            .collect();
        keys.sort_unstable();
        fields.sort_unstable();
        assert_eq!(keys, fields, "in {e}");
        assert_eq!(e["schema"], "ace.event/2");
        assert_eq!(e["tenant"], "acme");
        assert_eq!(e["data_class"], "eu-personal");
        assert_eq!(e["model_requested"], "llama");
        assert!(e["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    }
    let first = &events[0];
    assert_eq!(first["destination"], "owned");
    assert_eq!(first["tier"], "inhouse");
    assert_eq!(first["status"], 200);
    assert_eq!(first["reason"], "cheapest");
    assert_eq!(first["slo_met"], true);
    assert!(
        first["upstream_ms"].as_u64().is_some(),
        "Envoy's upstream service time: {first}"
    );
    let booked = first["marginal_usd"].as_f64().unwrap_or(f64::NAN);
    let counterfactual = first["counterfactual_usd"].as_f64().unwrap_or(f64::NAN);
    assert!(
        booked > 0.0 && booked < counterfactual,
        "{booked} vs {counterfactual}"
    );
    let last = &events[7];
    assert_eq!(last["status"], 503);
    assert_eq!(last["reason"], "no_healthy_destination");
    assert_eq!(last["destination"], Value::Null);
    assert_eq!(last["upstream_ms"], Value::Null, "no upstream answered");

    // The counters reach Envoy's stats (handed over on the filter's
    // 0.5 s tick).
    for (name, want) in [
        ("ace.requests", 8),
        ("ace.no_destination", 1),
        ("ace.trips", 2),
        ("ace.destination.owned.tier.inhouse.requests", 5),
    ] {
        let name = filter.stat(name);
        assert_eq!(
            envoy.wait_stat(&name, want, Duration::from_secs(5)),
            Some(want),
            "{name}"
        );
    }
    // ... and Envoy's Prometheus endpoint, where they are scraped.
    let prom = envoy
        .admin("/stats/prometheus")
        .unwrap_or_else(|e| panic!("/stats/prometheus: {e}"))
        .text();
    let want = format!("{}{{}} 8", filter.prometheus("ace_requests"));
    assert!(
        prom.lines().any(|l| l == want),
        "no `{want}` in /stats/prometheus:\n{prom}"
    );
}

ace_tests::for_each_filter!(one_parseable_event_per_request_with_every_field,);
