//! Scene 7: model routing and the response cache, on the example fleet and
//! policies. A request for a large model is served by a cheaper model of
//! its class where the tenant's policy allows it (the upstream receives
//! the rewritten body); Northbank's contract and PHI keep the model named;
//! a repeated deterministic request is answered from the cache for a
//! tenant that opted in, never for one that did not.

use super::ledger::{self, Mark};
use super::Module;
use ace_cli::outln;
use ace_harness::client::{Request, Response};
use anyhow::{anyhow, Context};
use serde_json::{json, Value};
use std::time::Duration;

/// The example fleet's configuration (`ace plugin-config`: model routing
/// from the manifest's classes and cost factors) with the response cache
/// on, every fourth hit checked against the upstream.
pub fn config(dir: &std::path::Path) -> anyhow::Result<Value> {
    let mut config = ace_cli::plugin::build(dir, false, true)?;
    if config.get("model_routing").is_none() {
        return Err(anyhow!("{} declares no [[model_classes]]", dir.display()));
    }
    config["response_headers"] = json!(true);
    config["cache"] = json!({"check_fraction": 0.25});
    Ok(config)
}

/// Play the scene, in a ledger window after `after`'s (scene 5's, whose
/// tenants it shares); returns its configuration and Envoy's access log
/// of ACE events.
pub fn scene(module: &Module, after: Mark) -> anyhow::Result<(Value, Vec<String>)> {
    outln!("\nscene 7: model routing and the response cache, rungs of the same merit order, gated by\n         the Cedar policies (substitution_*.cedar, cache_*.cedar)");
    let dir = ace_harness::workspace_root().join("policies");
    let config = config(&dir)?;
    let (envoy, ups) = super::fleet_envoy(module, &config)?;
    ledger::window_for(
        "scene 7's tenants (those of scene 5) are judged apart from scene 5",
        Duration::from_secs(3),
        Some(after),
    );
    let ask = |tenant: &str, class: &str, body: &Value| -> anyhow::Result<Response> {
        Request::post_json("/v1/chat/completions", body)
            .header("x-ace-tenant", tenant)
            .header("x-ace-data-class", class)
            .header("x-ace-latency-class", "interactive")
            .header("x-ace-tp-degree", "1")
            .send(envoy.port())
            .context("request")
    };
    let received = |dest: &str| {
        ups.iter()
            .find(|u| u.name() == dest)
            .and_then(|u| u.requests().last().cloned())
            .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
            .and_then(|b| b["model"].as_str().map(str::to_string))
            .unwrap_or_else(|| "-".to_string())
    };
    let mut n = 0usize;
    let mut show = |what: &str, r: &Response| {
        n += 1;
        let dest = r.header("x-ace-destination").unwrap_or("(the cache)");
        let model = r.header("x-ace-model-served").unwrap_or("-");
        let body_model = if r.header("x-ace-destination").is_some() {
            received(dest)
        } else {
            "-".to_string()
        };
        outln!(
            "  {what:<46} -> {dest:<17} serves {model:<14} upstream body model {body_model:<14} {}",
            r.status
        );
    };
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Summarise the memo."}]});
    for (tenant, class, model, note) in [
        ("globex", "public", "gpt-4o", "(may substitute)"),
        ("globex", "public", "chat-small", "(a class)"),
        (
            "northbank",
            "internal",
            "gpt-4o",
            "(contract: no substitution)",
        ),
        ("acme-health", "phi", "gpt-4o", "(PHI: no substitution)"),
    ] {
        let r = ask(tenant, class, &chat(model))?;
        show(&format!("{tenant}, {class}, {model} {note}"), &r);
    }
    let deterministic = json!({"model": "llama-3.1-8b", "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    for (tenant, class, note) in [
        ("globex", "public", "(opted in)"),
        ("globex", "public", "(again: from the cache)"),
        ("globex", "public", "(again)"),
        ("globex", "public", "(again)"),
        ("northbank", "internal", "(not opted in)"),
        ("northbank", "internal", "(again: still upstream)"),
        ("globex", "personal_eu", "(personal data: never cached)"),
        ("globex", "personal_eu", "(again)"),
    ] {
        let r = ask(tenant, class, &deterministic)?;
        show(&format!("{tenant}, {class}, temperature 0 {note}"), &r);
    }
    let lines = envoy.wait_access_log(n, Duration::from_secs(10));
    let cached = lines
        .iter()
        .filter(|l| l.contains("\"cached\":true"))
        .count();
    let substituted = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["model_served"] != e["model_requested"])
        .count();
    let checked = lines
        .iter()
        .filter(|l| l.contains("\"reason\":\"cache_check\""))
        .count();
    outln!(
        "  {substituted} requests served by another model of their class, {cached} answered from the\n  \
         cache, {checked} hits checked against the upstream as well (cache.check_fraction 0.25)"
    );
    Ok((config, lines))
}
