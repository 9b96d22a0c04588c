//! The walking skeleton, end to end in a real Envoy: the filter (built from
//! source in this run) picks the cheapest destination, writes its cluster
//! into `x-ace-destination`, and Envoy's `cluster_header` route sends the
//! request there. Client-supplied destination headers are ignored. Runs
//! against the Wasm filter and the dynamic module.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::json;
use std::time::Duration;

fn three_destination_config() -> String {
    json!({"allow_no_policy": true, "response_headers": true, "destinations": [
        {"name": "payg-api", "cluster": "payg_api", "tier": "payg",
         "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
        {"name": "owned-gpu", "cluster": "owned_gpu", "tier": "inhouse", "capacity": 64,
         "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8},
        {"name": "reserved", "cluster": "reserved_ptu", "tier": "reserved", "capacity": 64,
         "usd_per_input_token": 5e-8, "usd_per_output_token": 5e-8}
    ]})
    .to_string()
}

fn request_arrives_at_the_upstream_the_filter_chose(filter: Filter) {
    require_envoy();
    let (payg, owned, reserved) = (upstream("payg"), upstream("owned"), upstream("reserved"));
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &three_destination_config())
            .cluster("payg_api", payg.port())
            .cluster("owned_gpu", owned.port())
            .cluster("reserved_ptu", reserved.port()),
    );

    for i in 0..5 {
        let resp = Request::post_json("/v1/chat/completions", &json!({"model": "m", "n": i}))
            // A client trying to choose its own destination is ignored,
            // however many times it says so.
            .header("x-ace-destination", "payg_api")
            .header("x-ace-destination", "reserved_ptu")
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        assert_eq!(resp.header("x-upstream"), Some("owned"), "request {i}");
        assert_eq!(resp.header("x-ace-destination"), Some("owned-gpu"));
        assert_eq!(resp.header("x-ace-reason"), Some("cheapest"));
    }

    assert_eq!(
        owned.count(),
        5,
        "every request reaches the cheapest upstream"
    );
    assert_eq!(payg.count(), 0, "the client's header must not route");
    assert_eq!(reserved.count(), 0);
    for r in owned.requests() {
        let dests: Vec<_> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "x-ace-destination")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(
            dests,
            ["owned_gpu"],
            "exactly one destination header, set by the filter"
        );
        assert_eq!(r.path, "/v1/chat/completions");
    }
}

fn malformed_plugin_configuration_names_the_field_without_a_trap(filter: Filter) {
    require_envoy();
    let up = upstream("only");
    let bad = json!({"destinations": [
        {"name": "only", "cluster": "only", "usd_per_input_token": 1e-6},
        {"name": "second", "cluster": "only", "usd_per_input_token": "cheap"}
    ]})
    .to_string();
    let builder = filter
        .add(EnvoyBuilder::new(), &bad)
        .cluster("only", up.port());
    // A static listener whose filter rejects its configuration makes
    // Envoy refuse the configuration: it must exit (or never become ready)
    // with our error naming the field in its log.
    let log = match builder.start() {
        Ok(envoy) => {
            assert!(
                envoy.wait_log(
                    "destinations[1].usd_per_input_token",
                    Duration::from_secs(10)
                ),
                "Envoy started; its log must name the bad field"
            );
            envoy.log()
        }
        Err(e) => e.log,
    };
    assert!(
        log.contains("invalid ACE plugin configuration at `destinations[1].usd_per_input_token`"),
        "Envoy's log must name the bad field:\n{log}"
    );
    for sign in [
        "panicked",
        "wasm trap",
        "unreachable",
        "Function: proxy_on_configure failed",
    ] {
        assert!(
            !log.contains(sign),
            "no trap or panic expected, found {sign:?}:\n{log}"
        );
    }
    assert_eq!(up.count(), 0);
}

/// Re-runs the routing test in a child process whose PATH has no `envoy`:
/// it must fail, and say that Envoy is missing and how to install it.
#[test]
fn without_envoy_on_path_the_test_fails_naming_envoy_and_setup() {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<_> = std::env::split_paths(&path)
        .filter(|d| !d.join("envoy").exists())
        .collect();
    let new_path = std::env::join_paths(kept).unwrap_or_default();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "walking_skeleton::wasm::request_arrives_at_the_upstream_the_filter_chose",
            "--nocapture",
        ])
        .env("PATH", new_path)
        .env_remove("ACE_ENVOY")
        .output()
        .unwrap_or_else(|e| panic!("cannot re-run the test binary: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "must fail without envoy:\n{text}");
    assert!(text.contains("`envoy` was not found on PATH"), "{text}");
    assert!(text.contains("make setup"), "{text}");
    assert!(text.contains("1 failed"), "{text}");
}

ace_tests::for_each_filter!(
    request_arrives_at_the_upstream_the_filter_chose,
    malformed_plugin_configuration_names_the_field_without_a_trap,
);
