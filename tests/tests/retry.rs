//! Retrying on the next feasible destination within the same request
//! (`"retry_next": true`, the dynamic module): when the chosen destination
//! fails before any byte reaches the client, Envoy runs the request again
//! through its filter chain, ACE excludes the destination that failed and
//! decides again (feasibility first, as always), and the client gets the
//! next destination's answer, with one event for the request. A request
//! Envoy cannot replay whole (its body was not buffered because the route
//! has no retry policy) is not retried: the failure reaches the client and
//! spill applies from the next request.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

/// The access-log filter `envoy/envoy-dynamic.yaml` ships: drop the line of
/// a run that ACE replaced by its retry (dynamic metadata
/// `ace.superseded`), so each request logs one event.
pub(crate) fn superseded_runs_unlogged() -> Value {
    let yaml =
        std::fs::read_to_string(ace_harness::workspace_root().join("envoy/envoy-dynamic.yaml"))
            .unwrap_or_else(|e| panic!("envoy/envoy-dynamic.yaml: {e}"));
    let doc: Value = serde_yaml_ng::from_str(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let log = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["access_log"][0];
    assert!(
        log["filter"].is_object(),
        "envoy-dynamic.yaml's access log has the filter: {log}"
    );
    log["filter"].clone()
}

struct Fleet {
    envoy: Envoy,
    owned: Upstream,
    reserved: Upstream,
}

/// Owned (cheapest, failing with 503), reserved, payg; the route buffers
/// request bodies (a retry policy) when `buffering`.
fn fleet(buffering: bool) -> Fleet {
    fleet_with_owned_at(buffering, None)
}

/// Like [`fleet`], with the owned cluster pointing at `owned_port` instead
/// of the owned upstream when given.
fn fleet_with_owned_at(buffering: bool, owned_port: Option<u16>) -> Fleet {
    require_envoy();
    let filter = Filter::Dynamic;
    let (owned, reserved, payg) = (upstream("owned"), upstream("reserved"), upstream("payg"));
    let dest = |name: &str, tier: &str, cap: u32, usd: f64| {
        json!({"name": name, "cluster": name, "tier": tier, "capacity": cap,
               "usd_per_input_token": usd, "usd_per_output_token": usd})
    };
    let config = json!({
        "allow_no_policy": true,
        "response_headers": true,
        "retry_next": true,
        "destinations": [dest("payg", "payg", 0, 2.5e-6), dest("reserved", "reserved", 16, 5e-9),
                         dest("owned", "inhouse", 16, 1e-9)],
        "health": {"trip_after": 10, "base_cooldown_ms": 60000}
    });
    let mut route = json!({"cluster_header": "x-ace-destination", "timeout": "10s"});
    if buffering {
        route["retry_policy"] = json!({"retry_on": "reset", "num_retries": 1});
    }
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &config.to_string())
            .route(route)
            .cluster("owned", owned_port.unwrap_or(owned.port()))
            .cluster("reserved", reserved.port())
            .cluster("payg", payg.port())
            .access_log_line(filter.event_log_line())
            .access_log_filter(superseded_runs_unlogged()),
    );
    owned.set_behavior(Behavior::Status(503));
    Fleet {
        envoy,
        owned,
        reserved,
    }
}

fn post(f: &Fleet, body: &Value) -> Response {
    Request::post_json("/v1/chat/completions", body)
        .send(f.envoy.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn events(envoy: &Envoy, n: usize) -> Vec<Value> {
    envoy.wait_access_log(n, Duration::from_secs(5));
    // Any extra line would have been written with the others.
    std::thread::sleep(Duration::from_millis(200));
    let lines = envoy.access_log_lines();
    assert_eq!(lines.len(), n, "one event per request: {lines:#?}");
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_failed_attempt_is_retried_once_on_the_next_destination_in_the_same_request() {
    let f = fleet(true);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
    let r = post(&f, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-upstream"), Some("reserved"));
    assert_eq!(r.header("x-ace-reason"), Some("retry"));
    assert_eq!((f.owned.count(), f.reserved.count()), (1, 1));
    let got = &f.reserved.requests()[0];
    assert_eq!(
        serde_json::from_slice::<Value>(&got.body).ok(),
        Some(body),
        "the body is replayed whole"
    );
    assert!(
        got.headers.iter().all(|(k, _)| k != "x-ace-retry"),
        "the retry mark stays inside Envoy"
    );
    // A request without a body retries too.
    let g = Request::get("/v1/models")
        .send(f.envoy.port())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((g.status, g.header("x-upstream")), (200, Some("reserved")));
    assert_eq!((f.owned.count(), f.reserved.count()), (2, 2));

    for (stat, want) in [("ace.requests", 2), ("ace.retries", 2)] {
        let name = Filter::Dynamic.stat(stat);
        assert_eq!(
            f.envoy.wait_stat(&name, want, Duration::from_secs(5)),
            Some(want),
            "{name}"
        );
    }
    let ev = events(&f.envoy, 2);
    for e in &ev {
        assert_eq!(
            (
                e["destination"].as_str(),
                e["reason"].as_str(),
                e["status"].as_u64()
            ),
            (Some("reserved"), Some("retry"), Some(200)),
            "{e}"
        );
    }
}

#[test]
fn a_forged_retry_mark_is_removed_and_ignored() {
    let f = fleet(true);
    f.owned.set_behavior(Behavior::Ok);
    // Without the process's token the mark cannot steer a request away
    // from the cheapest destination (index 2, owned).
    let r = Request::post_json("/v1/chat/completions", &json!({"model": "m"}))
        .header("x-ace-retry", "0000000000000000.2")
        .send(f.envoy.port())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (r.status, r.header("x-upstream"), r.header("x-ace-reason")),
        (200, Some("owned"), Some("cheapest"))
    );
    let got = &f.owned.requests()[0];
    assert!(got.headers.iter().all(|(k, _)| k != "x-ace-retry"));
}

#[test]
fn without_a_buffered_body_the_failure_reaches_the_client_and_the_next_request_spills() {
    let f = fleet(false);
    let body = json!({"model": "m", "messages": []});
    let r = post(&f, &body);
    assert_eq!(
        (r.status, r.header("x-upstream")),
        (503, Some("owned")),
        "not retried: Envoy does not hold the body"
    );
    assert_eq!((f.owned.count(), f.reserved.count()), (1, 0));
    let ev = events(&f.envoy, 1);
    assert_eq!(ev[0]["status"], 503);
}

#[test]
fn a_refused_connection_is_retried_on_the_next_destination() {
    // Nothing listens there: Envoy answers 503 itself (its own retry, on
    // the same cluster, fails too), and ACE runs the request again.
    let dead = ace_harness::free_port().unwrap_or_else(|e| panic!("{e}"));
    let f = fleet_with_owned_at(true, Some(dead));
    let r = post(&f, &json!({"model": "m", "messages": []}));
    assert_eq!(
        (r.status, r.header("x-upstream"), r.header("x-ace-reason")),
        (200, Some("reserved"), Some("retry")),
        "{}",
        r.text()
    );
    assert_eq!(events(&f.envoy, 1)[0]["destination"], "reserved");
}
