//! `benches/dynamic-floor`, the Envoy dynamic module behind `envoy-load
//! --only dynfloor`, really does in Envoy 1.40 what its measurement claims:
//! it loads (ABI v0.2.0), routes every request by the header it sets, and
//! leaves its event in filter state, where the access log reads it. A
//! benchmark of calls that silently failed would measure nothing.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_tests::{require_envoy, start, upstream};
use serde_json::json;
use std::time::Duration;

#[test]
fn dynamic_floor_module_routes_by_its_header_and_logs_its_event() {
    require_envoy();
    let lib =
        ace_harness::dylib::build("ace-bench-dynamic-floor").unwrap_or_else(|e| panic!("{e}"));
    let (owned, other) = (upstream("owned"), upstream("other"));
    let envoy = start(
        &EnvoyBuilder::new()
            .http_filter(ace_harness::dylib::http_filter_json(&lib, "floor", None))
            .cluster("owned", owned.port())
            .cluster("other", other.port())
            .access_log_line("%FILTER_STATE(ace_event:PLAIN)%"),
    );
    for i in 0..3 {
        let resp = Request::post_json("/v1/chat/completions", &json!({"n": i}))
            .header("x-ace-destination", "other")
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
    }
    assert_eq!(owned.count(), 3, "routed by the module's header");
    assert_eq!(other.count(), 0, "the client's header was replaced");
    let lines = envoy.wait_access_log(3, Duration::from_secs(10));
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        assert_eq!(line.len(), 300, "the 300-byte event: {line}");
        assert!(line.bytes().all(|b| b == b'x'), "{line}");
    }
}
