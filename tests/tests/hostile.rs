//! Hostile input, in a real Envoy, against both builds: what an attacker
//! (or a careless client, or a lying upstream) sends, and what ACE does.
//!
//! The leak check never trusts ACE's own event: it reads what each upstream
//! actually received. The fleet puts the cheapest destination, `sg-cheap`,
//! outside the EU and on a GPU too small for the large model, so any request
//! that slips past feasibility lands there and shows.

use ace_core::tables::{AttributeSpec, FactorKind, FactorSpec};
use ace_harness::client::Request;
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_tests::{
    destination_upstreams, require_envoy, residency_spec, start, tables_base64, upstream, Filter,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Destinations in table order: bit 0 `sg-cheap` (Singapore, small GPU,
/// cheapest), bit 1 `eu-owned`, bit 2 `eu-payg`.
const SG: u64 = 0b001;
const ALL: u64 = 0b111;

/// Values (bytewise order, 0 is unknown): data_class 1 personal_eu,
/// 2 public; model 1 large, 2 small; tenant 1 a, 2 b. Without `model`
/// when `with_model` is false (so the body is not read unless it is JSON).
fn tables(with_model: bool) -> String {
    let attribute = |name: &str, values: [&str; 2]| AttributeSpec {
        name: name.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    };
    let forbid = |a: u32, rows: Vec<u64>| FactorSpec {
        kind: FactorKind::Forbid,
        attributes: vec![a],
        rows,
    };
    // Unknown values fail closed; personal_eu stays in the EU; unknown
    // tenants go nowhere; the large model does not fit the small GPU.
    let mut spec = residency_spec(&["sg-cheap", "eu-owned", "eu-payg"], SG);
    spec.attributes.push(attribute("tenant", ["a", "b"]));
    spec.factors.push(forbid(1, vec![ALL, 0, 0]));
    if with_model {
        spec.attributes.push(attribute("model", ["large", "small"]));
        spec.factors.push(forbid(2, vec![ALL, SG, 0]));
    }
    tables_base64(&spec)
}

fn config() -> Value {
    config_reading(true)
}

/// The fleet's configuration; its tables decide on the model if
/// `with_model`.
fn config_reading(with_model: bool) -> Value {
    json!({
        "destinations": [
            {"name": "sg-cheap", "cluster": "sg_cheap", "tier": "inhouse", "capacity": 64,
             "usd_per_input_token": 1e-10, "usd_per_output_token": 1e-10},
            {"name": "eu-owned", "cluster": "eu_owned", "tier": "inhouse", "capacity": 64,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9, "slo_ms": 400},
            {"name": "eu-payg", "cluster": "eu_payg", "tier": "payg",
             "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6}
        ],
        "tables_base64": tables(with_model),
        "body": {"read": true, "max_bytes": 65536},
        "max_context_tokens": 131072,
        "health": {"trip_after": 3, "base_cooldown_ms": 60000}
    })
}

struct Fleet {
    envoy: Envoy,
    sg: Upstream,
    eu: Upstream,
    payg: Upstream,
}

impl Fleet {
    fn start(filter: Filter, config: &Value) -> Fleet {
        Fleet::start_with(filter, config, |b| b)
    }

    fn start_with(
        filter: Filter,
        config: &Value,
        more: impl FnOnce(EnvoyBuilder) -> EnvoyBuilder,
    ) -> Fleet {
        require_envoy();
        let builder = filter.add_reading_body(EnvoyBuilder::new(), &config.to_string());
        let (builder, ups) = destination_upstreams(config, builder);
        let [sg, eu, payg]: [Upstream; 3] = ups
            .try_into()
            .unwrap_or_else(|_| panic!("the fleet has three destinations"));
        let envoy = start(&more(filter.event_log(builder)));
        Fleet {
            envoy,
            sg,
            eu,
            payg,
        }
    }

    fn total(&self) -> usize {
        self.sg.count() + self.eu.count() + self.payg.count()
    }

    /// The events logged so far (at least `n`), each a JSON object.
    fn events(&self, n: usize) -> Vec<Value> {
        self.envoy
            .wait_access_log(n, Duration::from_secs(10))
            .iter()
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| panic!("an access-log line is not a JSON object: {l:?}"))
            })
            .collect()
    }
}

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

fn post(fleet: &Fleet, body: &Value, headers: &[(&str, &str)]) -> ace_harness::client::Response {
    let mut r = Request::post_json("/v1/chat/completions", body);
    for (k, v) in headers {
        r = r.header(k, v);
    }
    r.send(fleet.envoy.port())
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

const EU_A: [(&str, &str); 2] = [("x-ace-data-class", "personal_eu"), ("x-ace-tenant", "a")];

/// HTTP/2 with a body and trailers while the filter holds the headers to
/// read the body: routed by ACE (never by the client's own
/// `x-ace-destination`), personal data stays in the EU.
fn http2_trailers_never_release_a_request_undecided(filter: Filter) {
    let fleet = Fleet::start(filter, &config());
    for _ in 0..3 {
        ace_tests::post_h2_with_trailer(
            fleet.envoy.port(),
            &[
                ("x-ace-data-class", "personal_eu"),
                ("x-ace-tenant", "a"),
                ("x-ace-destination", "sg_cheap"),
            ],
            &chat("small"),
        );
    }
    assert_eq!(fleet.sg.count(), 0, "personal_eu data reached Singapore");
    assert_eq!(fleet.eu.count(), 3, "each request was routed by ACE");
    for e in fleet.events(3) {
        assert_eq!(e["destination"], "eu-owned", "{e}");
        assert_eq!(e["status"], 200, "{e}");
    }
}

/// The header and the body naming different models: refused, naming both;
/// no upstream sees it.
fn a_header_and_a_body_that_disagree_on_the_model_are_refused(filter: Filter) {
    let fleet = Fleet::start(filter, &config());
    let r = post(
        &fleet,
        &chat("large"),
        &[("x-ace-model", "small"), EU_A[0], EU_A[1]],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json().unwrap_or_default();
    assert_eq!(v["error"]["type"], "model_conflict");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("small") && message.contains("large"),
        "{message}"
    );
    // The large model with the public class: the small GPU may not take it.
    let r = post(
        &fleet,
        &chat("large"),
        &[
            ("x-ace-model", "large"),
            ("x-ace-data-class", "public"),
            EU_A[1],
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(fleet.sg.count(), 0, "the large model reached the small GPU");
    // A body with `model` twice: which one the upstream takes is a guess.
    let twice = br#"{"model":"small","model":"large","max_tokens":4}"#;
    let r = Request {
        body: twice.to_vec(),
        ..Request::post_json("/v1/chat/completions", &json!({}))
    }
    .header("x-ace-model", "small")
    .header("x-ace-data-class", "public")
    .header("x-ace-tenant", "a")
    .send(fleet.envoy.port())
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(fleet.sg.count(), 0);
    // A JSON body sent as text/plain is read all the same.
    let r = Request {
        headers: vec![("content-type".into(), "text/plain".into())],
        ..Request::post_json("/v1/chat/completions", &chat("large"))
    }
    .header("x-ace-data-class", "public")
    .header("x-ace-tenant", "a")
    .send(fleet.envoy.port())
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(fleet.sg.count(), 0, "text/plain smuggled the large model");
}

/// A policy header sent twice with different values fails closed, in
/// either order.
fn a_repeated_policy_header_fails_closed(filter: Filter) {
    let fleet = Fleet::start(filter, &config());
    for (first, second) in [("public", "personal_eu"), ("personal_eu", "public")] {
        let r = post(
            &fleet,
            &chat("small"),
            &[
                ("x-ace-data-class", first),
                ("x-ace-data-class", second),
                ("x-ace-tenant", "a"),
            ],
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.json().unwrap_or_default()["error"]["type"],
            "conflicting_attribute"
        );
    }
    assert_eq!(fleet.total(), 0);
}

/// A destination pointed at another destination's cluster, or no tables:
/// the configuration is refused, naming the field; with the explicit
/// opt-out it starts, warns, and counts what it routes without policy.
fn a_configuration_that_undoes_the_tables_is_refused(filter: Filter) {
    require_envoy();
    let mut swapped = config();
    swapped["destinations"][1]["cluster"] = json!("sg_cheap");
    let mut missing = config();
    missing.as_object_mut().map(|o| o.remove("tables_base64"));
    for (bad, field) in [
        (&swapped, "destinations[1].cluster"),
        (&missing, "tables_base64"),
    ] {
        let up = upstream("only");
        let builder = filter
            .add_reading_body(EnvoyBuilder::new(), &bad.to_string())
            .cluster("sg_cheap", up.port())
            .cluster("eu_owned", up.port())
            .cluster("eu_payg", up.port());
        match builder.start() {
            Ok(envoy) => {
                // Envoy may start with the filter refusing: then no request
                // may reach an upstream.
                let r = Request::get("/").send(envoy.port());
                assert!(
                    r.is_ok_and(|r| r.status >= 500),
                    "a bad configuration served"
                );
                assert_eq!(up.count(), 0);
                assert!(
                    envoy.log().contains(field),
                    "Envoy's log names {field}: {}",
                    envoy.log()
                );
            }
            Err(e) => assert!(e.to_string().contains(field), "{e}"),
        }
    }
    let mut opted_out = missing.clone();
    opted_out["allow_no_policy"] = json!(true);
    let fleet = Fleet::start(filter, &opted_out);
    assert_eq!(post(&fleet, &chat("small"), &[]).status, 200);
    if filter == Filter::Wasm {
        // (A dynamic module's log lines do not reach the harness's log file.)
        assert!(
            fleet
                .envoy
                .wait_log("allow_no_policy", Duration::from_secs(5)),
            "warned"
        );
    }
    let stat = filter.stat("ace.requests_without_policy");
    assert_eq!(
        fleet.envoy.wait_stat(&stat, 1, Duration::from_secs(5)),
        Some(1),
        "{stat} counts it"
    );
}

/// A client that uploads its body slowly does not derate the destination:
/// latency for health starts when the upstream has the whole request.
fn a_slow_upload_does_not_derate_the_destination(filter: Filter) {
    // Tables that do not read the model: a body that is not JSON is not
    // read, and the request is routed at its headers.
    let mut cfg = config_reading(false);
    cfg["destinations"][1]["slo_ms"] = json!(200);
    let fleet = Fleet::start(filter, &cfg);
    for _ in 0..3 {
        // Not JSON, so routed at the headers; the body then trickles in.
        let mut s =
            TcpStream::connect(("127.0.0.1", fleet.envoy.port())).unwrap_or_else(|e| panic!("{e}"));
        let body = "x".repeat(64);
        let head = format!(
            "POST /upload HTTP/1.1\r\nhost: a\r\nconnection: close\r\ncontent-type: application/octet-stream\r\n\
             x-ace-data-class: personal_eu\r\nx-ace-tenant: a\r\nx-ace-model: small\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        for chunk in body.as_bytes().chunks(16) {
            std::thread::sleep(Duration::from_millis(150));
            s.write_all(chunk).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
    for e in fleet.events(3) {
        assert_eq!(e["destination"], "eu-owned");
        assert_eq!(
            e["slo_met"], true,
            "the upload's 450 ms are not the destination's: {e}"
        );
    }
    assert_eq!(fleet.envoy.stat(&filter.stat("ace.derates")), Some(0));
}

/// One tenant whose requests make the server fail trips nothing for the
/// others; failures from a second tenant do.
fn one_tenants_poisoned_inputs_do_not_trip_the_destination_for_others(filter: Filter) {
    let fleet = Fleet::start(filter, &config());
    fleet.eu.set_behavior(Behavior::Status(500));
    let eu_b = [("x-ace-data-class", "personal_eu"), ("x-ace-tenant", "b")];
    for _ in 0..8 {
        assert_eq!(post(&fleet, &chat("small"), &EU_A).status, 500);
    }
    fleet.eu.set_behavior(Behavior::Ok);
    let r = post(&fleet, &chat("small"), &eu_b);
    assert_eq!(r.status, 200);
    assert_eq!(fleet.eu.count(), 9, "tenant b still gets the owned pool");
    assert_eq!(fleet.payg.count(), 0);
    assert_eq!(fleet.envoy.stat(&filter.stat("ace.trips")), Some(0));
    // Both tenants failing: the destination trips, and b spills to payg.
    fleet.eu.set_behavior(Behavior::Status(500));
    for headers in [&EU_A, &eu_b, &EU_A] {
        post(&fleet, &chat("small"), headers);
    }
    fleet.eu.set_behavior(Behavior::Ok);
    let r = post(&fleet, &chat("small"), &eu_b);
    assert_eq!(r.status, 200);
    assert_eq!(fleet.payg.count(), 1, "tripped: spilled to eu-payg");
    assert_eq!(fleet.sg.count(), 0);
}

/// A client's huge `max_tokens` and an upstream's huge or duplicated usage
/// claim book no more than the bounds; counters equal the events.
fn money_is_bounded_by_what_was_asked(filter: Filter) {
    let fleet = Fleet::start(filter, &config());
    let huge = json!({"model": "small", "max_tokens": 4294967295u64, "messages": []});
    // Personal EU data goes to eu-owned, whose answers claim absurd usage.
    fleet.eu.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body:
            json!({"usage": {"prompt_tokens": 4294967295u64, "completion_tokens": 4294967295u64}})
                .to_string()
                .into_bytes(),
    });
    assert_eq!(post(&fleet, &huge, &EU_A).status, 200);
    assert_eq!(post(&fleet, &chat("small"), &EU_A).status, 200);
    fleet.eu.set_behavior(Behavior::Respond {
        status: 200,
        headers: vec![],
        body: br#"{"usage":{"prompt_tokens":3,"completion_tokens":2},"usage":{"prompt_tokens":99999}}"#
            .to_vec(),
    });
    assert_eq!(post(&fleet, &chat("small"), &EU_A).status, 200);
    let events = fleet.events(3);
    // The claimed input is capped at the context window, the output at the
    // request's max_tokens (16) or, with max_tokens absurd, the window.
    assert_eq!(events[0]["tokens_in"], 131072, "{}", events[0]);
    assert_eq!(events[0]["tokens_out"], 131072);
    assert_eq!(events[0]["usage_capped"], true);
    assert_eq!(events[1]["tokens_out"], 16, "{}", events[1]);
    assert_eq!(events[1]["usage_capped"], true);
    // The duplicated usage is not read: the estimate stands, flagged.
    assert_eq!(events[2]["tokens_estimated"], true, "{}", events[2]);
    let nano = |v: &Value| (v.as_f64().unwrap_or(0.0) * 1e9).round() as u64;
    let booked: u64 = events.iter().map(|e| nano(&e["marginal_usd"])).sum();
    let counter = filter.stat("ace.booked_nano_usd");
    fleet
        .envoy
        .wait_stat(&counter, booked, Duration::from_secs(5));
    let got = fleet.envoy.stat(&counter).unwrap_or(0);
    // Each event's amount rounds to the nano-dollar on its own.
    assert!(
        got.abs_diff(booked) <= 3,
        "counter {got} against events {booked}"
    );
    assert!(got < 1_000_000, "bounded: {got} nano-USD");
}

/// Requests Envoy rejects before any filter (bad header bytes, oversized
/// headers) log nothing; Envoy's own 413 for a body over its buffer limit
/// while ACE held the request is logged with its real status; a reused
/// `x-request-id` still gives each event its own id.
fn the_event_log_is_one_json_object_per_request_with_unique_ids(filter: Filter) {
    let mut cfg = config();
    cfg["body"]["max_bytes"] = json!(4 * 1024 * 1024);
    let fleet = Fleet::start_with(filter, &cfg, |b| b.per_connection_buffer_limit(64 * 1024));
    // Codec rejects.
    for raw in [
        &b"GET / HTTP/1.1\r\nhost: a\r\nx-bad: a\x01b\r\n\r\n"[..],
        format!(
            "GET / HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n",
            "y".repeat(100 * 1024)
        )
        .as_bytes(),
    ] {
        let mut s =
            TcpStream::connect(("127.0.0.1", fleet.envoy.port())).unwrap_or_else(|e| panic!("{e}"));
        let _ = s.write_all(raw);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(
            out.starts_with(b"HTTP/1.1 4"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
    // Three requests with one x-request-id.
    for _ in 0..3 {
        let r = post(
            &fleet,
            &chat("small"),
            &[EU_A[0], EU_A[1], ("x-request-id", "same")],
        );
        assert_eq!(r.status, 200);
    }
    // A body over Envoy's buffer limit while ACE holds the headers.
    let big = json!({"model": "small", "messages": [{"role": "user", "content": "z".repeat(200 * 1024)}]});
    let r = post(&fleet, &big, &EU_A);
    assert_eq!(r.status, 413, "{}", r.text());
    let events = fleet.events(4);
    assert_eq!(events.len(), 4, "no line for the codec rejects: {events:?}");
    let ids: std::collections::HashSet<String> = events
        .iter()
        .map(|e| e["event_id"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(ids.len(), 4, "unique event ids: {events:?}");
    assert!(ids.iter().all(|i| i.len() == 32));
    assert_eq!(events[0]["request_id"], "same");
    assert_eq!(events[0]["schema"], "ace.event/2");
    assert_eq!(
        (events[3]["status"].clone(), events[3]["reason"].clone()),
        (json!(413), json!("envoy_reply")),
        "{}",
        events[3]
    );
}

ace_tests::for_each_filter!(
    http2_trailers_never_release_a_request_undecided,
    a_header_and_a_body_that_disagree_on_the_model_are_refused,
    a_repeated_policy_header_fails_closed,
    a_configuration_that_undoes_the_tables_is_refused,
    a_slow_upload_does_not_derate_the_destination,
    one_tenants_poisoned_inputs_do_not_trip_the_destination_for_others,
    money_is_bounded_by_what_was_asked,
    the_event_log_is_one_json_object_per_request_with_unique_ids,
);
