//! A re-run starts from the client's request (`retry_next`, the dynamic
//! module; red team round 3, issue 50). Envoy's `recreate_stream` runs a
//! request again from its header map as the failed attempt left it, and
//! the router's upstream filters write into that same map: the key
//! Envoy's `credential_injector` injects for the failed destination, the
//! path and authority ACE set for it. ACE puts the client's request back
//! before asking for the re-run, and carries over what Envoy does not:
//! the client's body where ACE rewrote it, and what the first run
//! verified (a filter before ACE may have consumed the header).

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{static_cluster, Envoy, EnvoyBuilder};
use ace_harness::provider::{Ca, Errors, Limits, Provider, Spec};
use ace_harness::upstream::Behavior;
use ace_tests::{require_envoy, residency_spec, start, tables_base64, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

/// The client's own key, which only the pass-through gateway accepts.
const CLIENT_KEY: &str = "Bearer sk-client-own";

/// The route buffers request bodies (a retry policy), as
/// `envoy/envoy-dynamic.yaml` ships it for `retry_next`.
fn buffering_route() -> Value {
    json!({"cluster_header": "x-ace-destination", "timeout": "10s",
           "retry_policy": {"retry_on": "reset", "num_retries": 1}})
}

fn spec(name: &str, host: Option<&str>, credential: (&str, &str), paths: &[&str]) -> Spec {
    Spec {
        name: name.into(),
        host: host.map(str::to_string),
        credential: (credential.0.into(), credential.1.into()),
        paths: paths.iter().map(|p| p.to_string()).collect(),
        models: vec!["gpt-4o".into()],
        errors: Errors::OpenAi,
        limits: Limits::None,
    }
}

/// A first rung whose cluster injects its own key (Envoy's credential
/// injector, `envoy/providers.yaml`), failing; then a gateway that passes
/// the client's credentials through (`pass_credentials`), on a plain
/// cluster, accepting only the client's own key.
struct Fleet {
    envoy: Envoy,
    first: Provider,
    gateway: Provider,
    _ca: Ca,
    _secrets: tempfile::TempDir,
}

/// `first` as the first rung (its destination's `upstream` table is
/// `first_upstream`), the gateway second.
fn fleet(first: Spec, first_upstream: Value) -> Fleet {
    require_envoy();
    let filter = Filter::Dynamic;
    let ca = Ca::new();
    let secrets = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let gateway = Provider::start(
        spec(
            "gateway",
            None,
            ("authorization", CLIENT_KEY),
            &["/v1/chat/completions"],
        ),
        &ca,
    );
    let first = Provider::start(first, &ca);
    let config = json!({
        "allow_no_policy": true,
        "response_headers": true,
        "retry_next": true,
        "body": {"read": true},
        "health": {"trip_after": 100, "base_cooldown_ms": 60000},
        "destinations": [
            {"name": "first", "cluster": "first", "tier": "inhouse", "capacity": 16,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9,
             "upstream": first_upstream},
            {"name": "gateway", "cluster": "gateway", "tier": "payg",
             "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5,
             "upstream": {"pass_credentials": true}}
        ]
    });
    let envoy = start(
        &filter
            .add(EnvoyBuilder::new(), &config.to_string())
            .node("ace-test", "ace-test")
            .route(buffering_route())
            .cluster_json(first.cluster("first", &ca, secrets.path()))
            .cluster_json(static_cluster("gateway", gateway.port()))
            .access_log_line(filter.event_log_line())
            .access_log_filter(crate::retry::superseded_runs_unlogged()),
    );
    Fleet {
        envoy,
        first,
        gateway,
        _ca: ca,
        _secrets: secrets,
    }
}

fn post(envoy: &Envoy, model: &str) -> Response {
    Request::post_json(
        "/v1/chat/completions",
        &json!({"model": model, "messages": [{"role": "user", "content": "hello"}]}),
    )
    .header("authorization", CLIENT_KEY)
    .header("x-client-trace", "t-1")
    .send(envoy.port())
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The first rung fails the next `n` requests: each is re-run and
/// answered by the gateway.
fn fail_and_rerun(f: &Fleet, n: u64) {
    f.first.fail_next(n);
    for _ in 0..n {
        let r = post(&f.envoy, "gpt-4o");
        assert_eq!(
            (r.status, r.header("x-upstream"), r.header("x-ace-reason")),
            (200, Some("gateway"), Some("retry")),
            "{}",
            r.text()
        );
    }
}

/// Every request the gateway got is the client's, as the client sent it:
/// its key, its path and authority, its model name, its own headers; and
/// the gateway refused none.
fn the_gateway_got_the_clients_requests(f: &Fleet, n: usize) {
    assert!(
        f.gateway.rejected().is_empty(),
        "the gateway refused a credential: {:?}",
        f.gateway.rejected()
    );
    let got = f.gateway.accepted();
    assert_eq!(got.len(), n, "{got:?}");
    for r in &got {
        assert_eq!(r.header("authorization"), Some(CLIENT_KEY), "{r:?}");
        assert_eq!(r.header("api-key"), None, "{r:?}");
        assert_eq!(r.path, "/v1/chat/completions", "{r:?}");
        assert_eq!(r.header("x-client-trace"), Some("t-1"), "{r:?}");
        assert_eq!(r.header("x-ace-retry"), None, "{r:?}");
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        assert_eq!(body["model"], "gpt-4o", "the client's model name: {body}");
        assert_eq!(body["messages"][0]["content"], "hello");
    }
}

/// Row (critical, dynamic): "`retry_next` re-runs a failed request from
/// the headers of the failed attempt, including the key the failed
/// destination's cluster injected (Envoy's `credential_injector` upstream
/// filter). When the next destination passes client credentials, it
/// receives the failed destination's provider key, and the client's own
/// key is gone." An owned vLLM destination with an injected key and no
/// `upstream` table answers 5xx; the next rung is a `pass_credentials`
/// gateway; three re-runs.
#[test]
fn a_rerun_never_carries_the_failed_destinations_injected_key() {
    let f = fleet(
        spec(
            "vllm",
            None,
            ("authorization", "Bearer sk-owned-vllm"),
            &["/v1/chat/completions"],
        ),
        json!({}),
    );
    fail_and_rerun(&f, 3);
    // The first rung got its own key, injected over the client's.
    assert_eq!(f.first.rejected().len(), 0, "{:?}", f.first.rejected());
    the_gateway_got_the_clients_requests(&f, 3);
    let lines = f.envoy.wait_access_log(3, Duration::from_secs(5));
    for l in &lines {
        assert!(!l.contains("sk-owned-vllm"), "no key in an event: {l}");
    }
}

/// Row (low, dynamic): "`retry_next` never re-runs a request that failed
/// at a destination with `upstream` paths, authority or model names
/// (every provider in `envoy/providers.yaml`)." And item 8's "a re-run
/// onto a pass-through destination after a TLS provider": an
/// Azure-OpenAI-like deployment (TLS to its own name, its `api-key`
/// injected, its deployment path, authority and model name) fails; the
/// re-run reaches the gateway as the client sent it.
#[test]
fn a_provider_that_fails_is_rerun_and_the_next_rung_gets_the_clients_request() {
    let path = "/openai/deployments/gpt4o-dep/chat/completions?api-version=2024-10-21";
    let mut azure = spec(
        "azure",
        Some("contoso.openai.azure.test"),
        ("api-key", "azure-key"),
        &[path],
    );
    azure.models = vec!["gpt4o-dep".into()];
    azure.errors = Errors::Azure;
    let f = fleet(
        azure,
        json!({"authority": "contoso.openai.azure.test",
               "paths": {"chat_completions": path},
               "models": {"gpt-4o": "gpt4o-dep"}}),
    );
    fail_and_rerun(&f, 2);
    the_gateway_got_the_clients_requests(&f, 2);
    for r in f.gateway.accepted() {
        assert_eq!(
            r.header("host"),
            Some("ace.test"),
            "not Azure's name: {r:?}"
        );
    }
    // With the provider well again, it is the first rung, addressed as it
    // expects.
    let r = post(&f.envoy, "gpt-4o");
    assert_eq!((r.status, r.header("x-upstream")), (200, Some("azure")));
    let got = f.first.accepted();
    let last = got
        .last()
        .unwrap_or_else(|| panic!("nothing reached Azure"));
    assert_eq!(last.path, path);
    assert_eq!(last.header("authorization"), None, "{last:?}");
}

/// Row (medium, dynamic): "A re-run goes through the chain without what
/// the first pass consumed: a tenant verified from a header the authn
/// filter removes (as `jwt_authn` does by default) is missing, and the
/// client gets 400 `missing_attribute` for an upstream 503." The data
/// class comes from a verified source, metadata that a filter before ACE
/// publishes from a header it removes; personal data may only go to the
/// two EU destinations, the first of which fails.
#[test]
fn a_rerun_keeps_what_the_first_run_verified() {
    require_envoy();
    let filter = Filter::Dynamic;
    let (sg, eu_a, eu_b) = (upstream("sg"), upstream("eu-a"), upstream("eu-b"));
    eu_a.set_behavior(Behavior::Status(503));
    let dest = |name: &str, usd: f64| {
        json!({"name": name, "cluster": name.replace('-', "_"), "tier": "inhouse",
               "capacity": 16, "usd_per_input_token": usd, "usd_per_output_token": usd})
    };
    let config = json!({
        "retry_next": true,
        "response_headers": true,
        "health": {"trip_after": 100, "base_cooldown_ms": 60000},
        "destinations": [dest("sg", 1e-10), dest("eu-a", 1e-9), dest("eu-b", 2e-9)],
        "tables_base64": tables_base64(&residency_spec(&["sg", "eu-a", "eu-b"], 0b001)),
        "attribute_sources": {"data_class": {"metadata": {"namespace": "ace.identity",
                                                          "path": ["data_class"]}}}
    });
    // What an authentication filter does: verify, publish, consume.
    let consume = json!({
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": [{"header": "x-verified-class", "remove": true,
                "on_header_present": {"metadata_namespace": "ace.identity",
                                      "key": "data_class", "type": "STRING"}}]
        }
    });
    let envoy = start(
        &filter
            .event_log(filter.add(
                EnvoyBuilder::new().http_filter(consume),
                &config.to_string(),
            ))
            .route(buffering_route())
            .cluster("sg", sg.port())
            .cluster("eu_a", eu_a.port())
            .cluster("eu_b", eu_b.port()),
    );
    let r = Request::post_json("/v1/chat/completions", &json!({"model": "m"}))
        .header("x-verified-class", "personal_eu")
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (r.status, r.header("x-upstream"), r.header("x-ace-reason")),
        (200, Some("eu-b"), Some("retry")),
        "{}",
        r.text()
    );
    assert_eq!((sg.count(), eu_a.count(), eu_b.count()), (0, 1, 1));
    let lines = envoy.wait_access_log(2, Duration::from_secs(5));
    let last: Value = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["reason"] == "retry")
        .unwrap_or_else(|| panic!("no re-run event in {lines:?}"));
    assert_eq!(
        (&last["data_class"], &last["destination"]),
        (&json!("personal_eu"), &json!("eu-b")),
        "{last}"
    );
}
