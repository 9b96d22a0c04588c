//! Usage read from every shape the providers document (issue 50, item 2),
//! in a real Envoy, both builds: a fake provider streams exactly what the
//! provider's documentation shows (the fixtures in
//! `flow/tests/fixtures/usage/`, each citing its page), event by event,
//! each event its own HTTP chunk, and the request's one event must book
//! the provider's counts: input (cache reads and writes included), output,
//! cache reads, cache writes, not estimated. An answer whose usage cannot
//! be read keeps the request's estimate, its output bounded by the
//! request's own `max_output_tokens`, and is counted in
//! `ace.usage.unread`.

use ace_harness::client::Request;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{require_envoy, start, upstream, Filter};
use serde_json::{json, Value};
use std::time::Duration;

/// One pay-as-you-go provider behind ACE, bodies read, cached input
/// priced apart.
fn fleet(filter: Filter) -> (Envoy, Upstream) {
    require_envoy();
    let provider = upstream("provider");
    let config = json!({
        "allow_no_policy": true,
        "body": {"read": true, "max_bytes": 65536},
        "destinations": [
            {"name": "provider", "cluster": "provider", "tier": "payg",
             "usd_per_input_token": 3e-6, "usd_per_output_token": 1.5e-5,
             "cached_input_factor": 0.1, "cache_write_factor": 1.25}
        ]
    });
    let envoy = start(
        &filter
            .add_reading_body(EnvoyBuilder::new(), &config.to_string())
            .cluster("provider", provider.port())
            .access_log_line(filter.event_log_line()),
    );
    (envoy, provider)
}

/// The payload of fixture `name` (its citation header stripped).
fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../flow/tests/fixtures/usage")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match text.split_once("# ----\n") {
        Some((_, payload)) => payload.to_string(),
        None => panic!("{name}: no `# ----` line ends its header"),
    }
}

/// `text` with `from` replaced by `to`, which must be there once.
fn with(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "`{from}` once in the fixture"
    );
    text.replacen(from, to, 1)
}

/// The provider streams `stream` as a server-sent event stream, one event
/// (up to its blank line) per HTTP chunk.
fn streams(provider: &Upstream, stream: &str) {
    let mut chunks = Vec::new();
    let mut rest = stream;
    while let Some(end) = rest.find("\n\n") {
        let (event, after) = rest.split_at(end + 2);
        chunks.push(event.as_bytes().to_vec());
        rest = after;
    }
    chunks.push(rest.as_bytes().to_vec());
    provider.set_behavior(Behavior::Chunks {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        chunks,
        gap: Duration::from_millis(5),
    });
}

/// Send `body` to `path`; the client reads the whole stream.
fn send(envoy: &Envoy, path: &str, body: &Value) -> String {
    let r = Request::post_json(path, body)
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// The `n`th event line (from 1).
fn event(envoy: &Envoy, n: usize) -> Value {
    let lines = envoy.wait_access_log(n, Duration::from_secs(10));
    let line = lines
        .get(n - 1)
        .unwrap_or_else(|| panic!("{n} event lines, got {lines:?}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// What an event booked: (tokens_in, tokens_out, tokens_cache_read,
/// tokens_cache_write, tokens_estimated).
fn booked(e: &Value) -> (Value, Value, Value, Value, Value) {
    (
        e["tokens_in"].clone(),
        e["tokens_out"].clone(),
        e["tokens_cache_read"].clone(),
        e["tokens_cache_write"].clone(),
        e["tokens_estimated"].clone(),
    )
}

/// Row: "A streamed Responses API answer is booked at the estimate: its
/// usage sits in `response.completed`'s `response.usage`, never read;
/// `max_output_tokens` is not read either." `POST /v1/responses
/// {"stream":true,"max_output_tokens":64}`, the provider streaming the
/// Responses API reference's own "Streaming" example with its usage set to
/// 5,000 in (4,096 cached) / 60 out: the event must book 5,000 / 60, 4,096
/// cached, not estimated (before: 21 / 256, estimated). The same stream
/// ending in the reference's `response.incomplete` event instead (its
/// `usage` null) keeps the estimate, its output the request's 64 (before:
/// 256, the configured default), counted as unread.
fn a_streamed_responses_api_answer_books_its_response_usage(filter: Filter) {
    let (envoy, provider) = fleet(filter);
    let documented = fixture("openai-responses-stream.sse");
    let documented_usage = r#""usage":{"input_tokens":37,"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}"#;
    let row = with(
        &documented,
        documented_usage,
        r#""usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096},"output_tokens":60,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5060}"#,
    );
    streams(&provider, &row);
    let request =
        json!({"model": "gpt-4o", "input": "Hello!", "stream": true, "max_output_tokens": 64});
    assert_eq!(
        send(&envoy, "/v1/responses", &request),
        row,
        "the stream passes untouched"
    );
    assert_eq!(
        booked(&event(&envoy, 1)),
        (json!(5000), json!(60), json!(4096), json!(0), json!(false)),
        "the event books response.completed's response.usage"
    );

    // The same answer ending as the reference's `response.incomplete`
    // example (in one line, as a stream carries it): its usage is null.
    let completed_at = documented
        .find("event: response.completed")
        .unwrap_or_else(|| panic!("the fixture ends in response.completed"));
    let incomplete: Value =
        serde_json::from_str(&fixture("openai-responses-event-incomplete.json"))
            .unwrap_or_else(|e| panic!("{e}"));
    let unread = format!(
        "{}event: response.incomplete\ndata: {incomplete}\n\n",
        &documented[..completed_at]
    );
    streams(&provider, &unread);
    send(&envoy, "/v1/responses", &request);
    let e = event(&envoy, 2);
    assert_eq!(
        (e["tokens_out"].clone(), e["tokens_estimated"].clone()),
        (json!(64), json!(true)),
        "no usage: the estimate stands, its output the request's max_output_tokens: {e}"
    );
    assert_eq!(
        envoy.wait_stat(&filter.stat("ace.usage.unread"), 1, Duration::from_secs(5)),
        Some(1),
        "an answer whose usage was not read is counted"
    );
}

/// Row: "A streamed Anthropic answer shaped as Anthropic's streaming docs
/// show it (input and cache counts in `message_start`'s `message.usage`,
/// `message_delta` with only `output_tokens`) is booked with 0 input, 0
/// cache reads and writes, not flagged as estimated." The provider streams
/// the "Streaming Messages" page's basic example, first as published (25
/// in, 15 out), then with the row's counts in `message_start` (input
/// 3,000, cache read 2,000, write 500) and 50 in `message_delta`: the
/// event must book 5,500 in (Anthropic counts cache reads and writes apart
/// from `input_tokens`), 2,000 read, 500 written, 50 out, not estimated
/// (before: 0 in, 0 read, 0 written).
fn a_streamed_anthropic_answer_books_message_start_and_message_delta(filter: Filter) {
    let (envoy, provider) = fleet(filter);
    let documented = fixture("anthropic-stream-basic.sse");
    let request = json!({"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": true,
                         "messages": [{"role": "user", "content": "Hello"}]});
    streams(&provider, &documented);
    assert_eq!(send(&envoy, "/v1/messages", &request), documented);
    assert_eq!(
        booked(&event(&envoy, 1)),
        (json!(25), json!(15), json!(0), json!(0), json!(false)),
        "the docs' example as published"
    );

    let row = with(
        &documented,
        r#""usage": {"input_tokens": 25, "output_tokens": 1}"#,
        r#""usage": {"input_tokens": 3000, "cache_creation_input_tokens": 500, "cache_read_input_tokens": 2000, "output_tokens": 1}"#,
    );
    let row = with(
        &row,
        r#""usage": {"output_tokens": 15}"#,
        r#""usage": {"output_tokens": 50}"#,
    );
    streams(&provider, &row);
    send(&envoy, "/v1/messages", &request);
    let e = event(&envoy, 2);
    assert_eq!(
        booked(&e),
        (
            json!(5500),
            json!(50),
            json!(2000),
            json!(500),
            json!(false)
        ),
        "input and cache counts from message_start, output from message_delta: {e}"
    );
    // Priced as the destination prices cache reads and writes.
    let want = (3000.0 + 2000.0 * 0.1 + 500.0 * 1.25) * 3e-6 + 50.0 * 1.5e-5;
    let got = e["marginal_usd"].as_f64().unwrap_or(f64::NAN);
    assert!((got - want).abs() < 1e-12, "booked {got}, want {want}");
}

ace_tests::for_each_filter!(
    a_streamed_responses_api_answer_books_its_response_usage,
    a_streamed_anthropic_answer_books_message_start_and_message_delta,
);
