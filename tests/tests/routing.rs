//! Model routing and the response cache in a real Envoy, both builds: a
//! request for a model class is served by the cheapest model the tables
//! allow and the upstream receives the rewritten body; a tenant whose
//! policy forbids substitution gets the model it named; a repeated
//! deterministic request is answered from the cache and a sampled one is
//! not; an entry is never served to another tenant or data class, nor to
//! a tenant the policy keeps out of the cache; checked hits are compared
//! and false hits counted.

use ace_core::tables::{AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{for_each_filter, require_envoy, start, tables_base64, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

/// Attribute positions in [`spec`].
const TENANT: u32 = 0;
const MODEL: u32 = 1;
const SUBSTITUTED: u32 = 2;
const CACHED: u32 = 3;
const DATA_CLASS: u32 = 4;

/// Two destinations: `big-api` (pay-as-you-go, serves `gpt-big`) and
/// `small-owned` (in-house, serves `llama-small`). Tenants `acme` and
/// `strict` may be answered from the cache, `other` may not; `strict` may
/// never be served another model than it named (the forbid on
/// `substituted`); nobody gets a cached answer a substitute produced;
/// unknown values of anything fail closed.
fn spec() -> TableSpec {
    let attr = |name: &str, values: &[&str]| AttributeSpec {
        name: name.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    };
    let all = 0b11u64;
    // Rows of a factor keyed by [tenant, flag]: tenant digit (0 unknown,
    // 1 acme, 2 other, 3 strict) times flag digit (0 unknown, 1 false,
    // 2 true); `forbidden(t)` says whether tenant t may not have the flag.
    let by_tenant_and_flag = |forbidden: &dyn Fn(usize) -> bool| -> Vec<u64> {
        let mut rows = Vec::new();
        for t in 0..4 {
            for f in 0..3 {
                let deny = t == 0 || f == 0 || (f == 2 && forbidden(t));
                rows.push(if deny { all } else { 0 });
            }
        }
        rows
    };
    TableSpec {
        destinations: vec![
            DestinationSpec::new("big-api", "big_api"),
            DestinationSpec::new("small-owned", "small_owned"),
        ],
        attributes: vec![
            attr("tenant", &["acme", "other", "strict"]),
            attr("model", &["gpt-big", "llama-small"]),
            attr("substituted", &["false", "true"]),
            attr("cached", &["false", "true"]),
            attr("data_class", &["internal", "public"]),
        ],
        factors: vec![
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![MODEL],
                rows: vec![0, 0b01, 0b10],
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![TENANT, SUBSTITUTED],
                rows: by_tenant_and_flag(&|t| t == 3),
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![TENANT, CACHED],
                rows: by_tenant_and_flag(&|t| t == 2),
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![DATA_CLASS],
                rows: vec![all, 0, 0],
            },
            // No cached answer from a substitute ([substituted, cached]
            // both true), for anyone.
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![SUBSTITUTED, CACHED],
                rows: (0..9)
                    .map(|i| {
                        let (s, c) = (i / 3, i % 3);
                        if s == 0 || c == 0 || (s == 2 && c == 2) {
                            all
                        } else {
                            0
                        }
                    })
                    .collect(),
            },
        ],
    }
}

fn config(check_fraction: f64) -> Value {
    json!({
        "response_headers": true,
        "body": {"read": true},
        "tables_base64": tables_base64(&spec()),
        "destinations": [
            {"name": "big-api", "cluster": "big_api", "tier": "payg",
             "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
            {"name": "small-owned", "cluster": "small_owned", "tier": "inhouse",
             "capacity": 8, "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8}
        ],
        "model_routing": {"classes": {"chat": ["gpt-big", "llama-small"]}},
        "cache": {"slots": 64, "check_fraction": check_fraction}
    })
}

struct Fleet {
    envoy: Envoy,
    big: Upstream,
    small: Upstream,
}

impl Fleet {
    fn start(filter: Filter, config: &Value) -> Fleet {
        require_envoy();
        let (big, small) = (upstream("big_api"), upstream("small_owned"));
        let b = filter
            .add_reading_body(EnvoyBuilder::new(), &config.to_string())
            .cluster("big_api", big.port())
            .cluster("small_owned", small.port())
            // One worker: every `check_fraction`-th hit is per worker.
            .concurrency(1);
        let envoy = start(&filter.event_log(b));
        Fleet { envoy, big, small }
    }

    fn send(&self, tenant: &str, data_class: &str, body: &Value) -> Response {
        Request::post_json("/v1/chat/completions", body)
            .header("x-ace-tenant", tenant)
            .header("x-ace-data-class", data_class)
            .send(self.envoy.port())
            .unwrap_or_else(|e| panic!("request failed: {e}"))
    }

    fn events(&self, n: usize) -> Vec<Value> {
        self.envoy
            .wait_access_log(n, Duration::from_secs(10))
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn body_model(r: &ace_harness::upstream::Recorded) -> String {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}"));
    v["model"].as_str().unwrap_or("").to_string()
}

fn a_class_is_served_by_the_cheapest_permitted_model(filter: Filter) {
    let fleet = Fleet::start(filter, &config(0.0));
    let ask = |tenant: &str, model: &str| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        fleet.send(tenant, "public", &body)
    };
    // The class: the in-house model is far cheaper than the API.
    let r = ask("acme", "chat");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ace-destination"), Some("small-owned"));
    assert_eq!(r.header("x-ace-model-served"), Some("llama-small"));
    // A member, for a tenant that allows substitution: the same.
    let r = ask("acme", "gpt-big");
    assert_eq!(r.header("x-ace-destination"), Some("small-owned"));
    assert_eq!(r.header("x-ace-model-served"), Some("llama-small"));
    let received = fleet.small.requests();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert_eq!(
            body_model(r),
            "llama-small",
            "the upstream reads the rewritten body"
        );
        let length: usize = r
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert_eq!(length, r.body.len(), "content-length follows the rewrite");
    }
    // A tenant whose policy forbids substitution gets what it named.
    for _ in 0..3 {
        let r = ask("strict", "gpt-big");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-ace-destination"), Some("big-api"));
        assert_eq!(r.header("x-ace-model-served"), Some("gpt-big"));
    }
    assert_eq!(fleet.big.count(), 3);
    assert!(fleet
        .big
        .requests()
        .iter()
        .all(|r| body_model(r) == "gpt-big"));
    let events = fleet.events(5);
    let pairs: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["model_requested"].as_str().unwrap_or("").to_string(),
                e["model_served"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        &pairs[..3],
        &[
            ("chat".into(), "llama-small".into()),
            ("gpt-big".into(), "llama-small".into()),
            ("gpt-big".into(), "gpt-big".into())
        ]
    );
    // The substituted request books against the API's price for the
    // model it named.
    let cf = events[1]["counterfactual_usd"].as_f64().unwrap_or(0.0);
    let booked = events[1]["marginal_usd"].as_f64().unwrap_or(1.0);
    assert!(cf > 100.0 * booked, "{:?}", events[1]);
    let stat = filter.stat("ace.model_substitutions");
    assert_eq!(
        fleet.envoy.wait_stat(&stat, 2, Duration::from_secs(5)),
        Some(2)
    );
}

fn deterministic(content: &str) -> Value {
    json!({"model": "llama-small", "temperature": 0,
           "messages": [{"role": "user", "content": content}]})
}

fn a_repeated_deterministic_request_is_served_from_cache_for_its_tenant_only(filter: Filter) {
    let fleet = Fleet::start(filter, &config(0.0));
    let first = fleet.send("acme", "public", &deterministic("what is 2+2?"));
    assert_eq!(first.status, 200, "{}", first.text());
    let again = fleet.send("acme", "public", &deterministic("what is 2+2?"));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.body, first.body, "the stored answer");
    assert_eq!(
        fleet.small.count(),
        1,
        "the repeat never reached the upstream"
    );
    // Sampling: never from the cache.
    let sampled = json!({"model": "llama-small", "messages": [{"role": "user", "content": "hi"}]});
    fleet.send("acme", "public", &sampled);
    fleet.send("acme", "public", &sampled);
    assert_eq!(fleet.small.count(), 3, "a sampled request is never cached");
    // Another tenant, another data class: the entry is not theirs.
    fleet.send("strict", "public", &deterministic("what is 2+2?"));
    assert_eq!(fleet.small.count(), 4, "another tenant misses");
    fleet.send("acme", "internal", &deterministic("what is 2+2?"));
    assert_eq!(fleet.small.count(), 5, "another data class misses");
    // A tenant the policy keeps out of the cache: its own repeat goes
    // upstream too.
    fleet.send("other", "public", &deterministic("what is 2+2?"));
    fleet.send("other", "public", &deterministic("what is 2+2?"));
    assert_eq!(
        fleet.small.count(),
        7,
        "no cache for a tenant that did not opt in"
    );
    // And each of them hits its own entry on a repeat.
    fleet.send("strict", "public", &deterministic("what is 2+2?"));
    fleet.send("acme", "internal", &deterministic("what is 2+2?"));
    assert_eq!(fleet.small.count(), 7);
    let events = fleet.events(10);
    let cached: Vec<bool> = events.iter().map(|e| e["cached"] == json!(true)).collect();
    assert_eq!(
        cached,
        [false, true, false, false, false, false, false, false, true, true]
    );
    let hit = &events[1];
    assert_eq!(hit["reason"], "cache_hit");
    assert_eq!(
        hit["destination"], "small-owned",
        "the destination that produced it"
    );
    assert_eq!(hit["marginal_usd"].as_f64(), Some(0.0));
    let stat = filter.stat("ace.cache.hits");
    assert_eq!(
        fleet.envoy.wait_stat(&stat, 3, Duration::from_secs(5)),
        Some(3)
    );
}

fn checked_hits_count_false_hits(filter: Filter) {
    // Every hit checked.
    let fleet = Fleet::start(filter, &config(1.0));
    let ask = || fleet.send("acme", "public", &deterministic("capital of France?"));
    assert_eq!(ask().status, 200);
    let same = ask();
    assert_eq!(same.status, 200);
    assert_eq!(
        fleet.small.count(),
        2,
        "the checked hit went upstream as well"
    );
    // The upstream now says something else: the next check is a false hit.
    fleet.small.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: br#"{"choices":[{"message":{"content":"Lyon"}}]}"#.to_vec(),
    });
    let fresh = ask();
    assert_eq!(fresh.status, 200);
    assert!(
        fresh.text().contains("Lyon"),
        "the fresh answer is served: {}",
        fresh.text()
    );
    let checks = filter.stat("ace.cache.checks");
    let false_hits = filter.stat("ace.cache.false_hits");
    assert_eq!(
        fleet.envoy.wait_stat(&checks, 2, Duration::from_secs(5)),
        Some(2)
    );
    assert_eq!(
        fleet
            .envoy
            .wait_stat(&false_hits, 1, Duration::from_secs(5)),
        Some(1)
    );
    let events = fleet.events(3);
    let flags: Vec<(String, bool)> = events
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["cache_false_hit"] == json!(true),
            )
        })
        .collect();
    assert_ne!(flags[0].0, "cache_check", "the first was a miss");
    assert_eq!(
        flags[1..],
        [
            ("cache_check".to_string(), false),
            ("cache_check".to_string(), true)
        ]
    );
}

fn streams_are_cached_whole_or_not_at_all(filter: Filter) {
    let mut cfg = config(0.0);
    cfg["cache"]["max_entry_bytes"] = json!(1024);
    let fleet = Fleet::start(filter, &cfg);
    let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"Par\"}}]}\n\n\
                  data: {\"choices\":[{\"delta\":{\"content\":\"is\"}}]}\n\ndata: [DONE]\n\n";
    fleet.small.set_behavior(Behavior::sse(stream));
    let ask = |content: &str| {
        let mut body = deterministic(content);
        body["stream"] = json!(true);
        fleet.send("acme", "public", &body)
    };
    let first = ask("stream it");
    assert_eq!(first.status, 200);
    let again = ask("stream it");
    assert_eq!(again.status, 200);
    assert_eq!(
        fleet.small.count(),
        1,
        "the whole stream was stored and replayed"
    );
    assert_eq!(again.text(), stream);
    assert_eq!(again.header("content-type"), Some("text/event-stream"));
    // A stream past the bound is not stored at all.
    let long = format!(
        "{}data: [DONE]\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"xxxxxxxxxxxxxxxx\"}}]}\n\n".repeat(40)
    );
    fleet.small.set_behavior(Behavior::sse(&long));
    assert_eq!(ask("a long one").status, 200);
    assert_eq!(ask("a long one").status, 200);
    assert_eq!(
        fleet.small.count(),
        3,
        "too long to store: both went upstream"
    );
}

/// Checks count only where there is an answer to compare: a checked hit
/// answered 5xx upstream is no check; one whose fresh answer outgrows the
/// cache is a false hit, and its entry is dropped.
fn a_check_counts_only_what_it_compared(filter: Filter) {
    let mut cfg = config(1.0);
    cfg["cache"]["max_entry_bytes"] = json!(1024);
    let fleet = Fleet::start(filter, &cfg);
    let ask = || fleet.send("acme", "public", &deterministic("compare me"));
    assert_eq!(ask().status, 200, "stored");
    fleet.small.set_behavior(Behavior::Status(503));
    assert_eq!(ask().status, 503, "a checked hit answered upstream");
    let long = format!(
        "{{\"choices\":[{{\"message\":{{\"content\":\"{}\"}}}}]}}",
        "x".repeat(2000)
    );
    fleet.small.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: long.into_bytes(),
    });
    assert_eq!(
        ask().status,
        200,
        "a checked hit whose answer is too long to store"
    );
    fleet.small.set_behavior(Behavior::Ok);
    assert_eq!(ask().status, 200, "the entry was dropped: a miss");
    assert_eq!(fleet.small.count(), 4);
    let events = fleet.events(4);
    let seen: Vec<(String, bool)> = events
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["cache_false_hit"] == json!(true),
            )
        })
        .collect();
    let checks: Vec<bool> = seen.iter().map(|(r, _)| r == "cache_check").collect();
    assert_eq!(checks, [false, false, true, false], "{seen:?}");
    assert!(seen[2].1, "the outgrown answer is a false hit: {seen:?}");
    let stat = |name: &str| {
        fleet
            .envoy
            .wait_stat(&filter.stat(name), 1, Duration::from_secs(5))
    };
    assert_eq!(stat("ace.cache.checks"), Some(1));
    assert_eq!(stat("ace.cache.false_hits"), Some(1));
}

/// An encoded answer (here gzip) is never stored: replayed without its
/// `content-encoding`, it would be garbage to every client.
fn encoded_answers_are_not_cached(filter: Filter) {
    let fleet = Fleet::start(filter, &config(0.0));
    fleet.small.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![("content-encoding".into(), "gzip".into())],
        body: vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3],
    });
    for _ in 0..2 {
        let r = fleet.send("acme", "public", &deterministic("zip it"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some("gzip"));
    }
    assert_eq!(fleet.small.count(), 2, "both went upstream");
    let events = fleet.events(2);
    assert!(
        events.iter().all(|e| e["cached"] == json!(false)),
        "{events:?}"
    );
}

/// A request that cannot be routed (HTTP/2 trailers end it after its body
/// has gone on) still has a cached answer checked against the model it
/// named: an entry a substitute produced is a cached substitute, which the
/// policy forbids, so it goes upstream to the model named.
fn a_cached_substitute_is_checked_as_one_when_routing_is_off(filter: Filter) {
    let fleet = Fleet::start(filter, &config(0.0));
    let body = deterministic("substitute me");
    let mut named_big = body.clone();
    named_big["model"] = json!("gpt-big");
    let r = fleet.send("acme", "public", &named_big);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-ace-model-served"), Some("llama-small"));
    assert_eq!(
        fleet.small.count(),
        1,
        "served by the substitute, and stored"
    );
    ace_tests::post_h2_with_trailer(
        fleet.envoy.port(),
        &[("x-ace-tenant", "acme"), ("x-ace-data-class", "public")],
        &named_big,
    );
    assert_eq!(
        (fleet.small.count(), fleet.big.count()),
        (1, 1),
        "not the cached substitute: the model named, upstream"
    );
    let events = fleet.events(2);
    assert_eq!(events[1]["cached"], json!(false), "{:?}", events[1]);
    assert_eq!(events[1]["destination"], "big-api", "{:?}", events[1]);
}

for_each_filter!(
    a_check_counts_only_what_it_compared,
    encoded_answers_are_not_cached,
    a_cached_substitute_is_checked_as_one_when_routing_is_off,
    a_class_is_served_by_the_cheapest_permitted_model,
    a_repeated_deterministic_request_is_served_from_cache_for_its_tenant_only,
    checked_hits_count_false_hits,
    streams_are_cached_whole_or_not_at_all,
);
