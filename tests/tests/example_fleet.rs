//! The shipped example, end to end: `policies/` (Cedar schema, seven
//! policies, the fleet manifest) compiled by `ace plugin-config` into the
//! filter's configuration, loaded into a real Envoy in front of one local
//! upstream per destination (12, every tier, four jurisdictions). Residency
//! and BAA rules hold for every request, at any price, also when the
//! compliant destinations fail. Runs against the Wasm filter and the
//! dynamic module.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{destination_upstreams, require_envoy, start, Filter};
use serde_json::Value;
use std::collections::HashMap;

struct Fleet {
    envoy: Envoy,
    ups: Vec<Upstream>,
    /// destination name -> jurisdiction, certifications
    facts: HashMap<String, (String, Vec<String>)>,
}

fn fleet(filter: Filter) -> Fleet {
    require_envoy();
    let dir = ace_harness::workspace_root().join("policies");
    let mut config = ace_cli::plugin::build(&dir, false, false).unwrap_or_else(|e| panic!("{e:#}"));
    config["response_headers"] = serde_json::json!(true);
    let project = ace_policy::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let mut facts = HashMap::new();
    for d in &project.manifest.manifest.destinations {
        let d = d.as_ref();
        facts.insert(
            d.name.as_ref().clone(),
            (d.jurisdiction.clone(), d.certifications.clone()),
        );
    }
    let builder = filter.add_reading_body(EnvoyBuilder::new(), &config.to_string());
    let (b, ups) = destination_upstreams(&config, builder);
    Fleet {
        envoy: start(&b),
        ups,
        facts,
    }
}

fn send(f: &Fleet, tenant: &str, data_class: &str, model: &str) -> Response {
    Request::post_json("/v1/chat/completions", &serde_json::json!({"model": model}))
        .header("x-ace-tenant", tenant)
        .header("x-ace-data-class", data_class)
        .header("x-ace-latency-class", "interactive")
        .header("x-ace-tp-degree", "1")
        .header("x-ace-model", model)
        .send(f.envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

impl Fleet {
    fn jurisdiction(&self, r: &Response) -> Option<String> {
        let d = r.header("x-ace-destination")?;
        self.facts.get(d).map(|f| f.0.clone())
    }
}

fn the_example_policies_hold_in_envoy(filter: Filter) {
    let f = fleet(filter);
    // Public data for a cheap model: served, by some destination.
    let r = send(&f, "globex", "public", "llama-3.1-8b");
    assert_eq!(r.status, 200, "{}", r.text());

    // EU personal data: only EU destinations, for every model that has one.
    for _ in 0..5 {
        let r = send(&f, "northbank", "personal_eu", "llama-3.1-8b");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            f.jurisdiction(&r).as_deref(),
            Some("EU"),
            "{:?}",
            r.header("x-ace-destination")
        );
    }
    // PHI: only destinations with a HIPAA BAA.
    let r = send(&f, "acme-health", "phi", "llama-3.1-8b");
    if r.status == 200 {
        let d = r.header("x-ace-destination").unwrap_or("");
        let certs = &f.facts[d].1;
        assert!(
            certs.iter().any(|c| c == "hipaa_baa"),
            "PHI went to {d} without a BAA"
        );
    } else {
        assert_eq!(r.status, 503, "{}", r.text());
    }

    // Every EU destination goes down (connections close before an answer:
    // no tenant's input can cause that, so one tenant's requests trip them);
    // EU personal data is refused, never exported.
    for u in &f.ups {
        if f.facts.get(u.name()).map(|x| x.0.as_str()) == Some("EU") {
            u.set_behavior(Behavior::Close);
        }
    }
    let non_eu_before: usize = f
        .ups
        .iter()
        .filter(|u| f.facts.get(u.name()).map(|x| x.0.as_str()) != Some("EU"))
        .map(Upstream::count)
        .sum();
    let mut last = None;
    for _ in 0..30 {
        let r = send(&f, "northbank", "personal_eu", "llama-3.1-8b");
        if r.header("x-ace-destination").is_some() {
            assert_eq!(f.jurisdiction(&r).as_deref(), Some("EU"));
        }
        last = Some(r);
    }
    let last = last.unwrap_or_else(|| panic!("no response"));
    assert_eq!(last.status, 503, "{}", last.text());
    let body: Value = last.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["error"]["type"], "no_feasible_destination");
    let non_eu_after: usize = f
        .ups
        .iter()
        .filter(|u| f.facts.get(u.name()).map(|x| x.0.as_str()) != Some("EU"))
        .map(Upstream::count)
        .sum();
    assert_eq!(
        non_eu_before, non_eu_after,
        "EU personal data reached a non-EU upstream"
    );
}

ace_tests::for_each_filter!(the_example_policies_hold_in_envoy,);
