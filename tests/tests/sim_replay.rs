//! The simulator's ACE is the filter's ACE: a decision log recorded in
//! front of a real Envoy (the example fleet, both builds, upstreams that
//! fail and throttle for a while) replayed through `ace_sim`'s ACE policy,
//! request by request with the recorded times and answers, gives the same
//! destination, and the same substituted model, for every request. The
//! same log, replayed in shadow mode (`ace sim --shadow`), runs every
//! policy on the requests it holds.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_harness::upstream::Behavior;
use ace_sim::policy::ace::{replay, Recorded, Replayed};
use ace_tests::{destination_upstreams, require_envoy, start, upstream, Filter};
use serde_json::Value;
use std::time::Duration;

/// A request as sent: its headers and body.
type Sent = (Vec<(String, String)>, Vec<u8>);

/// (tenant, data class, latency class, model, tp degree)
const MIX: [(&str, &str, &str, &str, &str); 10] = [
    ("globex", "public", "interactive", "llama-3.1-8b", "1"),
    ("acme-health", "phi", "interactive", "llama-3.1-70b", "2"),
    ("northbank", "personal_eu", "standard", "llama-3.1-70b", "2"),
    ("eu-gov", "personal_eu", "batch", "mistral-small", "1"),
    ("globex", "internal", "interactive", "gpt-4o-mini", "1"),
    ("initech", "confidential", "standard", "qwen2.5-72b", "2"),
    ("research-lab", "public", "batch", "llama-3.1-405b", "8"),
    (
        "northbank",
        "confidential",
        "interactive",
        "llama-3.1-8b",
        "1",
    ),
    ("acme-health", "internal", "standard", "llama-3.1-8b", "1"),
    ("initech", "internal", "interactive", "llama-3.1-8b", "1"),
];

fn decisions_replay_identically(filter: Filter) {
    require_envoy();
    let dir = ace_harness::workspace_root().join("policies");
    let config = ace_cli::plugin::build(&dir, false, true).unwrap_or_else(|e| panic!("{e:#}"));
    let text = config.to_string();
    let builder = filter.event_log(filter.add_reading_body(EnvoyBuilder::new(), &text));
    let (b, ups) = destination_upstreams(&config, builder);
    // One worker: the simulator is one host with one view of the fleet. With
    // two, a Wasm worker owes the shared fleet state the slots its quiet
    // answers released until its next write, so a request on the other
    // worker can find a destination busier than the simulator does (a
    // different choice in about one run in six).
    let envoy = start(&b.concurrency(1));
    let set = |name: &str, behavior: Behavior| {
        for u in &ups {
            if u.name() == name {
                u.set_behavior(behavior.clone());
            }
        }
    };
    let mut sent: Vec<Sent> = Vec::new();
    let n = 120;
    for i in 0..n {
        // A phase where the cheap owned and reserved capacity fails or
        // throttles, so that health moves the choices.
        match i {
            30 => {
                set("us-inhouse-h100", Behavior::Status(503));
                set(
                    "eu-reserved-a100",
                    Behavior::RateLimited { retry_after_s: 2 },
                );
            }
            60 => {
                set("us-inhouse-h100", Behavior::Ok);
                set("eu-reserved-a100", Behavior::Ok);
                set("eu-inhouse-h100", Behavior::Status(500));
            }
            90 => set("eu-inhouse-h100", Behavior::Ok),
            _ => {}
        }
        let (tenant, dc, lc, model, tp) = MIX[i % MIX.len()];
        let body = serde_json::json!({
            "model": model,
            "max_tokens": 64 + 32 * (i % 7),
            "messages": [{"role": "user", "content": "x".repeat(200 * (i % 11))}],
        });
        let headers: Vec<(String, String)> = [
            ("x-ace-tenant", tenant),
            ("x-ace-data-class", dc),
            ("x-ace-latency-class", lc),
            ("x-ace-tp-degree", tp),
            ("x-ace-model", model),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut r = Request::post_json("/v1/chat/completions", &body);
        for (k, v) in &headers {
            r = r.header(k, v);
        }
        let bytes = body.to_string().into_bytes();
        r.send(envoy.port())
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        let mut all = headers;
        all.push(("content-type".into(), "application/json".into()));
        all.push(("content-length".into(), bytes.len().to_string()));
        sent.push((all, bytes));
    }
    let lines = envoy.wait_access_log(n, Duration::from_secs(20));
    assert_eq!(lines.len(), n, "one event per request");
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let log: Vec<Recorded> = events
        .iter()
        .zip(&sent)
        .map(|(e, (headers, body))| Recorded {
            time_ms: e["time_ms"].as_u64().unwrap_or(0),
            headers: headers.clone(),
            body: body.clone(),
            status: e["status"].as_u64().unwrap_or(0) as u16,
            latency_ms: e["latency_ms"].as_u64().unwrap_or(0),
        })
        .collect();
    let recorded: Vec<Replayed> = events
        .iter()
        .map(|e| Replayed {
            destination: e["destination"].as_str().map(str::to_string),
            substituted: (e["model_served"] != e["model_requested"])
                .then(|| e["model_served"].as_str().map(str::to_string))
                .flatten(),
        })
        .collect();
    let failures = events
        .iter()
        .filter(|e| e["status"].as_u64() != Some(200))
        .count();
    assert!(failures > 0, "the run had failures for health to act on");
    let setup = ace_flow::Setup::parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let replayed = replay(setup, &log);
    for (i, (r, s)) in recorded.iter().zip(&replayed).enumerate() {
        assert_eq!(
            r, s,
            "request {i}: Envoy chose {r:?}, the simulator {s:?} ({})",
            lines[i]
        );
    }
    shadow_mode_runs_every_policy_on_the_log(&lines, &dir);
    let distinct: std::collections::BTreeSet<_> = recorded
        .iter()
        .filter_map(|r| r.destination.as_ref())
        .collect();
    assert!(
        recorded.iter().any(|r| r.substituted.is_some()),
        "the log has model-routed requests"
    );
    assert!(
        distinct.len() >= 4,
        "the log exercises several destinations: {distinct:?}"
    );
}

#[test]
fn wasm_decisions_replay_identically_in_the_simulator() {
    decisions_replay_identically(Filter::Wasm);
}

#[test]
fn dynamic_module_decisions_replay_identically_in_the_simulator() {
    decisions_replay_identically(Filter::Dynamic);
}

/// Shadow mode on the real-Envoy log `lines`: every request, with the
/// attributes it was sent with, under every policy.
fn shadow_mode_runs_every_policy_on_the_log(lines: &[String], policies: &std::path::Path) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("access.log");
    // An access log as Envoy writes it, with a line the filter left empty.
    std::fs::write(&log, lines.join("\n") + "\n-\n").unwrap_or_else(|e| panic!("{e}"));
    let (sim, read) =
        ace_cli::shadow::simulation(policies, &[log], ace_sim::slo::Targets::default(), 1)
            .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(read.logged.len(), lines.len(), "one request per event line");
    assert_eq!(read.skipped, 1, "the `-` line is counted, not fatal");
    assert_eq!(sim.reqs.len(), lines.len());
    let tenants: std::collections::BTreeSet<&str> =
        sim.profiles.iter().map(|p| p.tenant.as_str()).collect();
    let expected: std::collections::BTreeSet<&str> = MIX.iter().map(|m| m.0).collect();
    assert_eq!(
        tenants, expected,
        "the requests keep the tenants they were sent with"
    );
    for kind in ace_sim::PolicyKind::ALL {
        let m = sim
            .run(kind, 1, None, &|_| {})
            .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        assert_eq!(m.requests, lines.len() as u64, "{}", kind.name());
        if kind.name().starts_with("ace") || kind.name().ends_with("-compliant") {
            assert_eq!(
                m.violations,
                0,
                "{} sends nothing where policy forbids",
                kind.name()
            );
        }
    }
}

/// Row: "`ace sim --shadow` counts every request sent to a destination that
/// renames its model (`upstream.models`) as a Cedar violation (the check
/// uses the upstream's name, not the catalogue id): on a real log where
/// every decision was allowed it prints 'ACE has no compliance violation:
/// NOT met'." A real Envoy's log of requests to the owned GPUs, which know
/// llama-3.1-8b as `meta-llama/Llama-3.1-8B-Instruct`, and to an API:
/// replayed in shadow mode, ACE sends nothing where policy forbids.
#[test]
fn shadow_mode_judges_a_renamed_model_by_its_catalogue_id() {
    require_envoy();
    let upstream_name = "meta-llama/Llama-3.1-8B-Instruct";
    let fleet = crate::budgets::fleet_toml();
    let fleet = fleet.split("[[budgets]]").next().unwrap_or_default().replacen(
        "capacity = 64\n",
        &format!("capacity = 64\n[destinations.upstream]\nmodels = {{ \"llama-3.1-8b\" = \"{upstream_name}\" }}\n"),
        1,
    );
    assert!(fleet.contains(upstream_name));
    let dir = crate::budgets::policy_dir(&fleet);
    let config =
        ace_cli::plugin::build(dir.path(), false, true).unwrap_or_else(|e| panic!("{e:#}"));
    let (owned, api) = (upstream("eu_owned"), upstream("us_api"));
    crate::budgets::answering(&owned, 100, 50);
    crate::budgets::answering(&api, 2_000, 1_000);
    let filter = Filter::Wasm;
    let envoy = start(
        &filter
            .event_log(filter.add_reading_body(EnvoyBuilder::new(), &config.to_string()))
            .cluster("eu_owned", owned.port())
            .cluster("us_api", api.port()),
    );
    let n = 12;
    for i in 0..n {
        let tenant = ["globex", "northbank", "acme-health"][i % 3];
        let model = if i % 4 == 3 { "gpt-4o" } else { "llama-3.1-8b" };
        let r = crate::budgets::ask(&envoy, tenant, model);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let renamed = owned
        .requests()
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains(upstream_name))
        .count();
    assert!(
        renamed > 0,
        "the owned GPUs got their own name for the model"
    );
    let lines = envoy.wait_access_log(n, Duration::from_secs(20));
    assert_eq!(lines.len(), n, "one event per request");
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = tmp.path().join("access.log");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let (sim, _) =
        ace_cli::shadow::simulation(dir.path(), &[log], ace_sim::slo::Targets::default(), 1)
            .unwrap_or_else(|e| panic!("{e:#}"));
    for kind in ace_sim::PolicyKind::ALL
        .into_iter()
        .filter(|k| k.name().starts_with("ace"))
    {
        let m = sim
            .run(kind, 1, None, &|_| {})
            .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        println!(
            "{}: {} requests, {} violations",
            kind.name(),
            m.requests,
            m.violations
        );
        assert_eq!(m.requests, n as u64);
        assert_eq!(
            m.violations,
            0,
            "{} sends nothing where policy forbids (every decision on the log was allowed)",
            kind.name()
        );
    }
}
