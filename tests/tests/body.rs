//! Reading the OpenAI-style body before routing, in a real Envoy (the Wasm
//! filter with `allow_on_headers_stop_iteration`, and the dynamic module):
//! the filter holds the headers, reads
//! `model` and `max_tokens` from the body, and still routes by header (so
//! Envoy re-selects the route after the body callback). Token usage in the
//! response, JSON or server-sent events, replaces the estimates in the event.

use ace_harness::client::Request;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{permit_tables, require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

/// Two destinations; `big-gpu` serves models `large` and `small`,
/// `small-gpu` only `small`. Value indices: 0 unknown, 1 large, 2 small.
fn model_tables() -> String {
    permit_tables(
        &["small-gpu", "big-gpu"],
        "model",
        &["large", "small"],
        &[0, 0b10, 0b11],
    )
}

fn fleet(filter: Filter) -> (Envoy, Upstream, Upstream) {
    require_envoy();
    let (small, big) = (upstream("small-gpu"), upstream("big-gpu"));
    let config = json!({
        "response_headers": true,
        "destinations": [
            {"name": "small-gpu", "cluster": "small_gpu", "tier": "inhouse", "capacity": 8,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9},
            {"name": "big-gpu", "cluster": "big_gpu", "tier": "payg",
             "usd_per_input_token": 1e-6, "usd_per_output_token": 4e-6}
        ],
        "tables_base64": model_tables(),
        "body": {"read": true, "max_bytes": 65536}
    });
    let envoy = start(
        &filter
            .add_reading_body(EnvoyBuilder::new(), &config.to_string())
            .cluster("small_gpu", small.port())
            .cluster("big_gpu", big.port())
            .access_log_line(filter.event_log_line()),
    );
    (envoy, small, big)
}

fn chat(envoy: &Envoy, body: Value) -> ace_harness::client::Response {
    Request::post_json("/v1/chat/completions", &body)
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

fn the_model_in_the_body_decides_feasibility_and_the_body_arrives_intact(filter: Filter) {
    let (envoy, small, big) = fleet(filter);
    let large = json!({"model": "large", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    let r = chat(&envoy, large.clone());
    assert_eq!(
        (r.status, r.header("x-upstream")),
        (200, Some("big-gpu")),
        "{}",
        r.text()
    );
    let r = chat(&envoy, json!({"model": "small", "messages": []}));
    assert_eq!(r.header("x-upstream"), Some("small-gpu"));
    // The upstream got the body byte for byte.
    let got = big.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(
        serde_json::from_slice::<Value>(&got[0].body).ok(),
        Some(large)
    );
    // Unknown model: fails closed. Unparseable body with the model needed: 400.
    assert_eq!(chat(&envoy, json!({"model": "gpt-9"})).status, 503);
    let bad = Request {
        body: b"{not json".to_vec(),
        ..Request::post_json("/v1/chat/completions", &json!({}))
    }
    .send(envoy.port())
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(
        bad.json().ok().map(|v| v["error"]["type"].clone()),
        Some(json!("bad_request_body"))
    );
    assert_eq!(small.count() + big.count(), 2);
}

/// A body several times the read bound (64 KiB here) reaches the filter in
/// many chunks. The filter does not guess from a cut body: when the policy
/// decides on the model, the part it did not read could name another model
/// to the upstream, so the request is refused (413, naming the setting to
/// raise) whether or not `x-ace-model` names one, and no upstream sees it.
fn a_body_past_the_read_bound_is_refused_when_the_policy_reads_the_model(filter: Filter) {
    let (envoy, small, big) = fleet(filter);
    let filler = "x".repeat(300 * 1024);
    let body = json!({"model": "small", "messages": [{"role": "user", "content": filler}]});
    for header in [None, Some("small")] {
        let mut req = Request::post_json("/v1/chat/completions", &body);
        if let Some(m) = header {
            req = req.header("x-ace-model", m);
        }
        let r = req
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        assert_eq!(r.status, 413, "{}", r.text());
        let message = r.json().ok().map(|v| v["error"]["message"].clone());
        assert!(
            message
                .as_ref()
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains("body.max_bytes")),
            "the error names the fix: {message:?}"
        );
    }
    assert_eq!(small.count() + big.count(), 0);
}

fn usage_in_json_and_sse_responses_replaces_the_estimates(filter: Filter) {
    let (envoy, small, _big) = fleet(filter);
    small.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: json!({"id": "1", "usage": {"prompt_tokens": 42, "completion_tokens": 7}})
            .to_string()
            .into_bytes(),
    });
    assert_eq!(
        chat(&envoy, json!({"model": "small", "max_tokens": 500})).status,
        200
    );
    let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
               data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":13}}\n\n\
               data: [DONE]\n\n";
    small.set_behavior(Behavior::sse(sse));
    let r = chat(&envoy, json!({"model": "small", "stream": true}));
    assert_eq!(r.text(), sse, "the stream passes through untouched");
    let lines = envoy.wait_access_log(2, Duration::from_secs(10));
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (
            events[0]["tokens_in"].clone(),
            events[0]["tokens_out"].clone()
        ),
        (json!(42), json!(7))
    );
    assert_eq!(events[0]["tokens_estimated"], false);
    assert_eq!(events[0]["model_requested"], "small");
    let booked = events[0]["marginal_usd"].as_f64().unwrap_or(f64::NAN);
    assert!((booked - 49.0 * 1e-9).abs() < 1e-15, "{booked}");
    let counterfactual = events[0]["counterfactual_usd"].as_f64().unwrap_or(f64::NAN);
    assert!(
        (counterfactual - (42.0 * 1e-6 + 7.0 * 4e-6)).abs() < 1e-12,
        "{counterfactual}"
    );
    assert_eq!(
        (
            events[1]["tokens_in"].clone(),
            events[1]["tokens_out"].clone()
        ),
        (json!(11), json!(13))
    );
}

ace_tests::for_each_filter!(
    a_body_past_the_read_bound_is_refused_when_the_policy_reads_the_model,
    the_model_in_the_body_decides_feasibility_and_the_body_arrives_intact,
    usage_in_json_and_sse_responses_replaces_the_estimates,
);
