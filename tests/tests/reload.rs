//! A new configuration swaps in whole, and a bad one is refused while the
//! last good one keeps routing, in a real Envoy. The filter's configuration
//! arrives by ECDS (from a file Envoy watches, as it would from a control
//! plane), and is replaced twice: by one that does not parse (Envoy's log
//! names the field; requests still go where the first configuration sends
//! them), then by one with new prices (requests follow the new merit
//! order). Runs against the Wasm filter and the dynamic module.

use ace_harness::client::Request;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Two pay-as-you-go destinations, `a` at `usd_a` per token and `b` at
/// `usd_b`.
fn prices(usd_a: Value, usd_b: f64) -> String {
    json!({"allow_no_policy": true, "response_headers": true, "destinations": [
        {"name": "a", "cluster": "a", "tier": "payg",
         "usd_per_input_token": usd_a, "usd_per_output_token": 1e-6},
        {"name": "b", "cluster": "b", "tier": "payg",
         "usd_per_input_token": usd_b, "usd_per_output_token": 1e-6}
    ]})
    .to_string()
}

/// Publish `config` as ECDS version `version`.
fn publish(path: &Path, filter: Filter, version: u32, config: &str) {
    let entry = filter.filter_json(config);
    ace_harness::envoy::publish_ecds(path, &json!("ace"), &entry["typed_config"], version)
        .unwrap_or_else(|e| panic!("{e}"));
}

fn served_by(envoy: &Envoy) -> String {
    let r = Request::post_json("/v1/chat/completions", &json!({"model": "m"}))
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-upstream").unwrap_or("-").to_string()
}

fn a_bad_configuration_is_refused_and_the_last_good_one_keeps_routing(filter: Filter) {
    require_envoy();
    let (a, b) = (upstream("a"), upstream("b"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ecds = dir.path().join("ace-ecds.json");
    publish(&ecds, filter, 1, &prices(json!(1e-6), 2e-6));
    let type_url = filter.filter_json("{}")["typed_config"]["@type"].clone();
    let envoy = start(
        &EnvoyBuilder::new()
            .node("ace-test", "ace-test")
            .http_filter(json!({
                "name": "ace",
                "config_discovery": {
                    "config_source": ace_harness::envoy::ecds_config_source(&ecds),
                    "type_urls": [type_url]
                }
            }))
            .cluster("a", a.port())
            .cluster("b", b.port()),
    );
    assert_eq!(served_by(&envoy), "a", "a is cheaper under version 1");

    publish(&ecds, filter, 2, &prices(json!("cheap"), 2e-6));
    assert!(
        envoy.wait_log(
            "invalid ACE plugin configuration at `destinations[0].usd_per_input_token`",
            Duration::from_secs(10)
        ),
        "the refusal names the field:\n{}",
        envoy.log()
    );
    for _ in 0..5 {
        assert_eq!(served_by(&envoy), "a", "version 1 still routes");
    }

    publish(&ecds, filter, 3, &prices(json!(3e-6), 2e-6));
    let deadline = Instant::now() + Duration::from_secs(10);
    while served_by(&envoy) != "b" {
        assert!(
            Instant::now() < deadline,
            "version 3 (b cheaper) never took effect:\n{}",
            envoy.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..5 {
        assert_eq!(served_by(&envoy), "b", "version 3 routes every request");
    }
}

ace_tests::for_each_filter!(a_bad_configuration_is_refused_and_the_last_good_one_keeps_routing);
