//! Failing closed where Envoy would let a request hang (issue 50, item 7),
//! in a real Envoy: the Wasm filter reading bodies under a filter
//! configuration without `allow_on_headers_stop_iteration`.
//!
//! Envoy gives a Wasm module no way to read that setting (its property
//! paths expose the plugin's name, root id and VM id, never its
//! `PluginConfig`), so the filter cannot refuse to start. It finds out at
//! the first request it holds for its body: Envoy has received body bytes
//! (`request.total_size` past the headers) that never reached the filter.
//! That request and every later one the filter would hold are answered 503
//! naming the setting, and the finding is logged once.
//!
//! The control service's row of the same item is in its own tests
//! (`control/tests/connections.rs`): it needs no Envoy.

use ace_harness::client::Request;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::Upstream;
use ace_tests::{ace_filter_wasm, require_envoy, start, upstream, Filter};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The setting the refusal and the log must name.
const KNOB: &str = "allow_on_headers_stop_iteration";

/// One destination, no policy, reading bodies: every JSON request with a
/// body is held until its body is read.
fn config() -> String {
    json!({
        "allow_no_policy": true,
        "response_headers": true,
        "destinations": [
            {"name": "gpu", "cluster": "gpu", "tier": "inhouse", "capacity": 64,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9}
        ],
        "body": {"read": true}
    })
    .to_string()
}

/// Envoy with the Wasm filter, `allow_on_headers_stop_iteration` as
/// `knob` says (absent when false), one worker (so "logged once" is one
/// line).
fn fleet(knob: bool) -> (Envoy, Upstream) {
    require_envoy();
    let gpu = upstream("gpu");
    let builder = EnvoyBuilder::new()
        .concurrency(1)
        .cluster("gpu", gpu.port());
    let builder = if knob {
        Filter::Wasm.add_reading_body(builder, &config())
    } else {
        builder.wasm_filter(&ace_filter_wasm(), &config())
    };
    (start(&builder), gpu)
}

fn chat() -> Request {
    let body =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let mut r = Request::post_json("/v1/chat/completions", &body);
    // Long enough that a hang shows as a failed read, not a slow pass.
    r.timeout = Duration::from_secs(20);
    r
}

/// Row (medium, Wasm): "with body reading on and a bootstrap without
/// `allow_on_headers_stop_iteration`, every request hangs to the idle
/// timeout (504 after 6 s) instead of the filter refusing to start."
///
/// Every request the filter holds for its body is answered 503 naming the
/// setting and where it goes; the finding is logged once; a request
/// without a body, which the filter never holds, is still served.
#[test]
fn a_held_request_without_the_knob_is_refused_naming_it_never_left_hanging() {
    let (envoy, gpu) = fleet(false);
    for n in 0..2 {
        let r = chat()
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("request {n} was left hanging: {e}"));
        let text = r.text();
        assert_eq!(r.status, 503, "request {n}: {text}");
        assert!(
            text.contains(KNOB) && text.contains("PluginConfig"),
            "request {n}: the refusal names neither the setting nor where it goes: {text}"
        );
    }
    // No body: the filter routes on the headers alone, knob or not.
    let r = Request::get("/v1/models")
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.status, r.header("x-upstream")), (200, Some("gpu")));
    assert_eq!(
        gpu.requests().len(),
        1,
        "a held request reached the upstream"
    );
    // Envoy writes its log file in batches.
    envoy.wait_log(KNOB, Duration::from_secs(30));
    let log = envoy.log();
    let lines = log.lines().filter(|l| l.contains(KNOB)).count();
    assert_eq!(lines, 1, "the finding is not logged once:\n{log}");
}

/// The same rule leaves a slow client alone when Envoy has the setting:
/// its headers wait, with nothing of its body received, longer than the
/// filter waits before it concludes; its body then arrives and it is
/// served.
#[test]
fn a_slow_body_under_the_knob_is_served_not_refused() {
    let (envoy, gpu) = fleet(true);
    let body = json!({"model": "m", "max_tokens": 8, "messages": []}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", envoy.port())).unwrap_or_else(|e| panic!("{e}"));
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap_or_else(|e| panic!("{e}"));
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: ace\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_secs(4));
    s.write_all(body.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "a slow client was refused: {answer}"
    );
    assert_eq!(gpu.requests().len(), 1);
    assert!(!envoy.log().contains(KNOB), "{}", envoy.log());
}
