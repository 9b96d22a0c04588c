//! Feasibility first, in a real Envoy: compiled policy tables gate every
//! request before cost is considered. The tables here encode the
//! `eu_residency` rule of `policies/` (EU personal data only to EU
//! jurisdictions); `ace policy verify` proves such tables equal Cedar, and
//! the core's property test proves the choice never leaves the mask. This
//! test shows the gate holding in Envoy even when every EU destination is
//! failing: the answer is a 503 with a JSON error, never a US destination.
//! Every test runs against the Wasm filter and the dynamic module.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{require_envoy, residency_spec, start, tables_base64, upstream, Filter};
use serde_json::{json, Value};

/// (name, tier, jurisdiction, capacity, USD per input token, per output token)
const FLEET: [(&str, &str, &str, u32, f64, f64); 5] = [
    ("us-owned", "inhouse", "US", 16, 1e-9, 1e-9),
    ("eu-reserved", "reserved", "EU", 16, 3e-9, 3e-9),
    ("eu-ondemand", "ondemand", "EU", 16, 0.0, 0.0),
    ("us-payg", "payg", "US", 0, 1e-6, 4e-6),
    ("eu-payg", "payg", "EU", 0, 2e-6, 8e-6),
];

/// Tables for: permit everything; forbid `data_class == personal_eu` unless
/// the destination is in the EU; an unknown data class goes nowhere.
fn eu_residency_tables() -> String {
    let names: Vec<&str> = FLEET.iter().map(|d| d.0).collect();
    let non_eu: u64 = FLEET
        .iter()
        .enumerate()
        .filter(|(_, d)| d.2 != "EU")
        .fold(0, |m, (i, _)| m | (1 << i));
    tables_base64(&residency_spec(&names, non_eu))
}

fn config(on_missing: &str) -> Value {
    let dests: Vec<Value> = FLEET
        .iter()
        .map(|(name, tier, _, cap, usd_in, usd_out)| {
            let mut d = json!({"name": name, "cluster": name.replace('-', "_"), "tier": tier,
                "capacity": cap, "usd_per_input_token": usd_in, "usd_per_output_token": usd_out});
            if *tier == "ondemand" {
                d["usd_per_gpu_hour"] = json!(2.0);
                d["tokens_per_second"] = json!(2000.0);
            }
            d
        })
        .collect();
    json!({
        "response_headers": true,
        "destinations": dests,
        "tables_base64": eu_residency_tables(),
        "on_missing_attribute": on_missing,
        "health": {"trip_after": 2, "base_cooldown_ms": 60000}
    })
}

fn fleet(filter: Filter, on_missing: &str) -> (Envoy, Vec<Upstream>) {
    require_envoy();
    let ups: Vec<Upstream> = FLEET.iter().map(|d| upstream(d.0)).collect();
    let mut b = filter.add(EnvoyBuilder::new(), &config(on_missing).to_string());
    for (d, u) in FLEET.iter().zip(&ups) {
        b = b.cluster(&d.0.replace('-', "_"), u.port());
    }
    (start(&b), ups)
}

fn send(envoy: &Envoy, data_class: Option<&str>) -> Response {
    let mut r = Request::post_json("/v1/chat/completions", &json!({"model": "m"}));
    if let Some(c) = data_class {
        r = r.header("x-ace-data-class", c);
    }
    r.send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

fn us_requests(ups: &[Upstream]) -> usize {
    FLEET
        .iter()
        .zip(ups)
        .filter(|(d, _)| d.2 != "EU")
        .map(|(_, u)| u.count())
        .sum()
}

fn eu_personal_data_never_leaves_the_eu_even_when_every_eu_destination_fails(filter: Filter) {
    let (envoy, ups) = fleet(filter, "reject");
    // Public data goes to the cheapest destination, which is in the US.
    assert_eq!(
        send(&envoy, Some("public")).header("x-ace-destination"),
        Some("us-owned")
    );
    // EU personal data goes to the cheapest EU destination.
    let r = send(&envoy, Some("personal_eu"));
    assert_eq!(
        r.header("x-ace-destination"),
        Some("eu-reserved"),
        "{}",
        r.text()
    );
    let us_before = us_requests(&ups);

    // Every EU destination fails: each trips after two failures.
    for (d, u) in FLEET.iter().zip(&ups) {
        if d.2 == "EU" {
            u.set_behavior(Behavior::Status(503));
        }
    }
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let r = send(&envoy, Some("personal_eu"));
        if let Some(dest) = r.header("x-ace-destination") {
            assert!(dest.starts_with("eu-"), "EU personal data reached {dest}");
        }
        statuses.push(r.status);
    }
    let last = send(&envoy, Some("personal_eu"));
    assert_eq!(
        last.status, 503,
        "all EU destinations tripped: {statuses:?}"
    );
    let body = last.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["error"]["type"], "no_feasible_destination");
    assert_eq!(
        us_requests(&ups),
        us_before,
        "no EU personal data request reached the US"
    );

    // Public data still flows to the US meanwhile.
    assert_eq!(send(&envoy, Some("public")).status, 200);
}

fn unknown_values_fail_closed_and_missing_attributes_are_refused_by_name(filter: Filter) {
    let (envoy, ups) = fleet(filter, "reject");
    let unknown = send(&envoy, Some("top-secret"));
    assert_eq!(unknown.status, 503);
    let body = unknown.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["error"]["reason"], "no_feasible_destination");

    let missing = send(&envoy, None);
    assert_eq!(missing.status, 400);
    let body = missing.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["error"]["type"], "missing_attribute");
    assert_eq!(body["error"]["reason"], "data_class");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("x-ace-data-class")));
    assert_eq!(ups.iter().map(Upstream::count).sum::<usize>(), 0);
}

fn in_restrict_mode_a_missing_attribute_is_treated_as_unknown(filter: Filter) {
    let (envoy, ups) = fleet(filter, "restrict");
    let r = send(&envoy, None);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(ups.iter().map(Upstream::count).sum::<usize>(), 0);
}

ace_tests::for_each_filter!(
    eu_personal_data_never_leaves_the_eu_even_when_every_eu_destination_fails,
    unknown_values_fail_closed_and_missing_attributes_are_refused_by_name,
    in_restrict_mode_a_missing_attribute_is_treated_as_unknown,
);
