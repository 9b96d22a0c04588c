//! Streamed responses are booked with their real usage: a request streams
//! server-sent events through a real Envoy with ACE, the stream's last
//! event reports usage, and the ledger, ingesting Envoy's access log,
//! books exactly those tokens at the destination's price (gateways are
//! known to log streamed requests at zero spend). Runs against the Wasm
//! filter and the dynamic module.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Behavior;
use ace_ledger::window::Rules;
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::json;
use std::time::Duration;

fn a_streamed_response_is_booked_with_the_usage_it_reported(filter: Filter) {
    require_envoy();
    let (owned, payg) = (upstream("owned"), upstream("payg"));
    let config = json!({"allow_no_policy": true, "destinations": [
        {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 8,
         "usd_per_input_token": 1e-8, "usd_per_output_token": 2e-8},
        {"name": "payg", "cluster": "payg", "tier": "payg",
         "usd_per_input_token": 1e-6, "usd_per_output_token": 4e-6}
    ]})
    .to_string();
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &config)
            .cluster("owned", owned.port())
            .cluster("payg", payg.port())
            .access_log_line(filter.event_log_line()),
    );
    let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
               data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":345}}\n\n\
               data: [DONE]\n\n";
    owned.set_behavior(Behavior::sse(sse));
    let r = Request::post_json(
        "/v1/chat/completions",
        &json!({"model": "m", "stream": true}),
    )
    .header("x-ace-tenant", "acme")
    .send(envoy.port())
    .unwrap_or_else(|e| panic!("request failed: {e}"));
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), sse);
    let lines = envoy.wait_access_log(1, Duration::from_secs(10));
    assert_eq!(lines.len(), 1, "{lines:?}");

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut ledger = crate::bills::ledger_of(&dir.path().join("l.sqlite"), &config, &lines);
    let report = ledger
        .report(&Rules::default())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let owned_line = &report.by_tier["inhouse"];
    assert_eq!(
        owned_line.tokens,
        1200 + 345,
        "the stream's usage, not an estimate"
    );
    assert_eq!(report.estimated_tokens, 0);
    // 1200 × 1e-8 + 345 × 2e-8 = 1.89e-5 USD; pay-as-you-go 1200 × 1e-6 +
    // 345 × 4e-6 = 2.58e-3 USD.
    assert_eq!(report.booked, 18_900);
    assert_eq!(report.counterfactual, 2_580_000);
    assert_eq!(report.savings.utilisation, 2_580_000 - 18_900);
}

ace_tests::for_each_filter!(a_streamed_response_is_booked_with_the_usage_it_reported,);
