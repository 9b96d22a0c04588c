//! The whole request flow, step by step, on the suite's reference host
//! ([`ace_conformance::mock::Mock`]): the cases that look inside the flow
//! (a request held mid-way, the fleet's slots, a re-run), which the
//! four-host cases of `conformance.rs` see only from outside. The
//! real-Envoy suites in `tests/` run the same flow inside both builds.
//!
//! Upstreams are scripted, keyed by the cluster the flow chose.

#![allow(clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use ace_config::Config;
use ace_conformance::mock::Mock;
use ace_conformance::Answer;
use ace_core::health::Outcome;
use ace_flow::counters::{Counter, Fleet};
use ace_flow::flow::{Flow, Setup, Verdict, Worker};
use serde_json::Value;
use std::cell::RefCell;

/// Owned GPUs in the EU (2 slots, cheap), a pay-as-you-go API in the US.
/// `personal_eu` data may only go to the EU.
fn setup(extra: &str) -> Setup {
    setup_with(r#"{"read":true}"#, extra)
}

/// [`setup`] with body settings `body`: the conformance suite's fleet.
fn setup_with(body: &str, extra: &str) -> Setup {
    let json = ace_conformance::cases::fleet_with(body, extra);
    Setup::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

/// A request as a client sends it.
#[derive(Clone, Debug, Default)]
struct Req {
    headers: Vec<(&'static str, String)>,
    body: Vec<Vec<u8>>,
}

fn req(data_class: &str) -> Req {
    Req {
        headers: vec![("x-ace-data-class", data_class.to_string())],
        body: vec![],
    }
}

/// One request in flight: its flow, and where it stopped.
struct InFlight {
    flow: Flow,
    verdict: Verdict,
    /// The cluster the flow chose, as the upstream sees it.
    cluster: Option<String>,
}

/// Run `r`'s request path: headers, then each body chunk.
fn start(s: &Setup, w: &RefCell<Worker>, m: &mut Mock, r: &Req) -> InFlight {
    m.headers = r
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    if !r.body.is_empty() {
        let len: usize = r.body.iter().map(Vec::len).sum();
        m.headers.push(("content-length".into(), len.to_string()));
        m.headers
            .push(("content-type".into(), "application/json".into()));
    }
    m.response.clear();
    let mut flow = Flow::new();
    let mut verdict = flow.on_request_headers(s, w, m, r.body.is_empty());
    for (i, chunk) in r.body.iter().enumerate() {
        if verdict == Verdict::Answered {
            break;
        }
        m.chunk = chunk.clone();
        let last = i + 1 == r.body.len();
        verdict = flow.on_request_body(s, w, m, last);
    }
    assert_ne!(verdict, Verdict::Hold, "a whole request is never left held");
    let cluster = (verdict == Verdict::Continue)
        .then(|| m.header("x-ace-destination").map(str::to_string))
        .flatten();
    InFlight {
        flow,
        verdict,
        cluster,
    }
}

/// Finish `f` with the upstream's `answer` (none: the client went away),
/// `took` ms after it was sent.
fn finish(
    s: &Setup,
    w: &RefCell<Worker>,
    m: &mut Mock,
    mut f: InFlight,
    answer: Option<Answer>,
    took: u64,
) {
    m.now += took;
    if let (Some(a), Some(_)) = (answer, &f.cluster) {
        m.response = a
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        m.response.push((":status".into(), a.status.to_string()));
        assert_eq!(f.flow.on_response_headers(s, m), Verdict::Continue);
        let n = a.body.len();
        for (i, chunk) in a.body.into_iter().enumerate() {
            m.chunk = chunk;
            f.flow.on_response_body(s, m, i + 1 == n);
        }
    }
    f.flow.on_complete(s, w, m);
}

/// One whole request, the upstream answering by cluster.
fn send(
    s: &Setup,
    w: &RefCell<Worker>,
    m: &mut Mock,
    r: &Req,
    upstream: impl Fn(&str) -> Answer,
) -> Value {
    let before = m.events.len();
    let f = start(s, w, m, r);
    let answer = f.cluster.as_deref().map(&upstream);
    finish(s, w, m, f, answer, 5);
    assert_eq!(m.events.len(), before + 1, "exactly one event per request");
    m.events[before].clone()
}

fn ok(_: &str) -> Answer {
    Answer::ok(r#"{"choices":[]}"#)
}

#[test]
fn personal_data_stays_in_the_eu_and_is_refused_when_the_eu_is_down() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    // Fill the owned slots: personal data waits for nothing, it is refused.
    let a = start(&s, &w, &mut m, &req("personal_eu"));
    let b = start(&s, &w, &mut m, &req("personal_eu"));
    assert_eq!(a.cluster.as_deref(), Some("eu_owned"));
    assert_eq!(b.cluster.as_deref(), Some("eu_owned"));
    let e = send(&s, &w, &mut m, &req("personal_eu"), ok);
    assert_eq!(e["status"], 503, "{e}");
    assert_eq!(e["reason"], "no_healthy_destination");
    assert_eq!(e["upstream_ms"], Value::Null, "no upstream answered");
    let (status, body) = m.replies.last().cloned().unwrap_or_else(|| panic!());
    assert_eq!(status, 503);
    assert_eq!(body["error"]["type"], "no_feasible_destination");
    // Public data spills to the API meanwhile.
    let e = send(&s, &w, &mut m, &req("public"), ok);
    assert_eq!(e["destination"], "us-api", "{e}");
    assert_eq!(
        e["upstream_ms"], 3,
        "the upstream's own time, from Envoy's header"
    );
    finish(&s, &w, &mut m, a, Some(ok("")), 5);
    finish(&s, &w, &mut m, b, Some(ok("")), 5);
    assert_eq!(m.fleet.in_flight, vec![0, 0], "every slot released");
    assert_eq!(m.counters[Counter::from(Fleet::NoDestination).index()], 1);
    assert_eq!(m.counters[Counter::from(Fleet::Requests).index()], 4);
}

#[test]
fn attributes_that_are_missing_or_unknown_fail_closed() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let e = send(&s, &w, &mut m, &Req::default(), ok);
    assert_eq!(e["status"], 400, "{e}");
    assert_eq!(m.replies[0].1["error"]["type"], "missing_attribute");
    let e = send(&s, &w, &mut m, &req("secret"), ok);
    assert_eq!(e["status"], 503, "an unknown class matches no permit: {e}");
    assert_eq!(e["reason"], "no_feasible_destination");
    // A repeated policy header with another value is refused.
    let mut twice = req("personal_eu");
    twice.headers.push(("x-ace-data-class", "public".into()));
    let e = send(&s, &w, &mut m, &twice, ok);
    assert_eq!(e["status"], 400, "{e}");
    assert_eq!(e["reason"], "conflicting_attribute");
}

#[test]
fn a_client_never_chooses_the_destination() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let mut forged = req("personal_eu");
    forged.headers.push(("x-ace-destination", "us_api".into()));
    let f = start(&s, &w, &mut m, &forged);
    assert_eq!(f.cluster.as_deref(), Some("eu_owned"));
    let values = m
        .headers
        .iter()
        .filter(|(k, _)| k == "x-ace-destination")
        .count();
    assert_eq!(values, 1, "the forged value is gone, not added to");
    finish(&s, &w, &mut m, f, Some(ok("")), 1);
    // A forged re-run mark is removed and ignored.
    m.can_rerun = true;
    let mut mark = req("public");
    mark.headers
        .push(("x-ace-retry", "0123456789abcdef.0".into()));
    let e = send(&s, &w, &mut m, &mark, ok);
    assert_eq!(e["reason"], "cheapest", "{e}");
    assert_eq!(m.header("x-ace-retry"), None, "removed before the upstream");
    assert_eq!(m.counters[Counter::from(Fleet::Retries).index()], 0);
}

#[test]
fn failures_trip_then_a_probe_closes_the_breaker() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let failing = |c: &str| {
        if c == "eu_owned" {
            Answer::status(503)
        } else {
            ok(c)
        }
    };
    for _ in 0..3 {
        let e = send(&s, &w, &mut m, &req("public"), failing);
        assert_eq!(e["destination"], "eu-owned");
        assert_eq!(e["status"], 503);
    }
    assert_eq!(m.counters[Counter::from(Fleet::Trips).index()], 1);
    let e = send(&s, &w, &mut m, &req("public"), failing);
    assert_eq!(e["destination"], "us-api", "spilled past the trip: {e}");
    // Personal data has nowhere else: refused while the EU is tripped.
    let e = send(&s, &w, &mut m, &req("personal_eu"), failing);
    assert_eq!(e["status"], 503);
    // After the cooldown one probe goes to the EU; its success closes it.
    m.now += 1_500;
    let e = send(&s, &w, &mut m, &req("public"), ok);
    assert_eq!(e["destination"], "eu-owned", "half-open probe: {e}");
    let e = send(&s, &w, &mut m, &req("public"), ok);
    assert_eq!(e["destination"], "eu-owned", "closed again: {e}");
    let fails = Counter::outcome(0, Some(Outcome::Failure { tenant: 0 }));
    assert_eq!(fails.map(|c| m.counters[c.index()]), Some(3));
}

#[test]
fn envoys_own_5xx_counts_as_a_failure_blamed_on_no_tenant() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let refused = |_: &str| Answer {
        headers: vec![],
        ..Answer::status(503)
    };
    for _ in 0..3 {
        send(&s, &w, &mut m, &req("public"), refused);
    }
    assert_eq!(m.counters[Counter::from(Fleet::Trips).index()], 1);
}

#[test]
fn a_slow_answer_derates_and_a_429_cuts_the_cap() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    // Past the SLO (1,000 ms on the EU): derated.
    let f = start(&s, &w, &mut m, &req("public"));
    assert_eq!(f.cluster.as_deref(), Some("eu_owned"));
    finish(&s, &w, &mut m, f, Some(ok("")), 5_000);
    assert_eq!(m.counters[Counter::from(Fleet::Derates).index()], 1);
    let e = m.events.last().cloned().unwrap_or_default();
    assert_eq!(e["slo_met"], false, "{e}");
    let throttled = |_: &str| Answer {
        headers: vec![
            ("retry-after", "2".into()),
            ("x-envoy-upstream-service-time", "1".into()),
        ],
        ..Answer::status(429)
    };
    let e = send(&s, &w, &mut m, &req("personal_eu"), throttled);
    assert_eq!(e["status"], 429);
    assert_eq!(m.counters[Counter::from(Fleet::CapCuts).index()], 1);
    let throttled_on = Counter::outcome(
        0,
        Some(Outcome::Throttled {
            retry_after_ms: None,
        }),
    );
    assert_eq!(throttled_on.map(|c| m.counters[c.index()]), Some(1));
    // The cap moved left, from 2 slots to 1: with one request in flight
    // the EU is full; public data spills, personal data is refused.
    let held = start(&s, &w, &mut m, &req("personal_eu"));
    assert_eq!(held.cluster.as_deref(), Some("eu_owned"));
    let e = send(&s, &w, &mut m, &req("public"), ok);
    assert_eq!(e["destination"], "us-api", "{e}");
    let e = send(&s, &w, &mut m, &req("personal_eu"), ok);
    assert_eq!(e["status"], 503, "{e}");
    finish(&s, &w, &mut m, held, Some(ok("")), 1);
}

#[test]
fn usage_from_json_and_from_a_stream_is_booked_at_the_decisions_prices() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let json = |_: &str| {
        Answer::ok(r#"{"id":"x","usage":{"prompt_tokens":1200,"completion_tokens":345}}"#)
    };
    let e = send(&s, &w, &mut m, &req("public"), json);
    assert_eq!(
        (&e["tokens_in"], &e["tokens_out"], &e["tokens_estimated"]),
        (&Value::from(1200), &Value::from(345), &Value::from(false)),
        "{e}"
    );
    let sse = |_: &str| Answer {
        status: 200,
        headers: vec![
            ("content-type", "text/event-stream".into()),
            ("x-envoy-upstream-service-time", "1".into()),
        ],
        // The usage object split across chunks.
        body: vec![
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n".to_vec(),
            b"data: {\"choices\":[],\"usage\":{\"prompt_tok".to_vec(),
            b"ens\":7,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n".to_vec(),
        ],
        took_ms: 5,
    };
    let e = send(&s, &w, &mut m, &req("public"), sse);
    assert_eq!(
        (&e["tokens_in"], &e["tokens_out"]),
        (&Value::from(7), &Value::from(9)),
        "{e}"
    );
    // Booked at the EU's own per-token prices.
    let usd = e["marginal_usd"].as_f64().unwrap_or(-1.0);
    assert!((usd - 16.0 * 1e-8).abs() < 1e-12, "{usd}");
    // The counterfactual is the API's list price for the same tokens.
    let cf = e["counterfactual_usd"].as_f64().unwrap_or(-1.0);
    assert!((cf - (7.0 * 2e-6 + 9.0 * 8e-6)).abs() < 1e-12, "{cf}");
    let booked = m.counters[Counter::from(Fleet::BookedNanoUsd).index()];
    assert_eq!(booked, 15_450 + 160, "counters book what the events say");
}

#[test]
fn a_held_body_decides_the_estimate_and_a_conflicting_model_is_refused() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let mut r = req("public");
    r.body = vec![
        br#"{"model":"llama","max_tokens":"#.to_vec(),
        br#"77,"messages":[]}"#.to_vec(),
    ];
    let e = send(&s, &w, &mut m, &r, ok);
    assert_eq!(e["model_requested"], "llama", "{e}");
    assert_eq!(e["tokens_out"], 77);
    r.headers.push(("x-ace-model", "gpt".into()));
    let e = send(&s, &w, &mut m, &r, ok);
    assert_eq!(e["status"], 400, "{e}");
    assert_eq!(e["reason"], "model_conflict");
}

#[test]
fn a_body_past_the_bound_routes_on_its_size() {
    let s = setup_with(r#"{"read":true,"max_bytes":64}"#, "");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let mut r = req("public");
    r.body = vec![vec![b'x'; 40], vec![b'y'; 40], vec![b'z'; 4000]];
    let f = start(&s, &w, &mut m, &r);
    assert_eq!(
        f.verdict,
        Verdict::Continue,
        "routed once the bound is read"
    );
    finish(&s, &w, &mut m, f, Some(ok("")), 1);
    let e = m.events.last().cloned().unwrap_or_default();
    assert_eq!(e["status"], 200, "{e}");
}

#[test]
fn a_client_that_leaves_releases_its_slot_and_blames_no_one() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let f = start(&s, &w, &mut m, &req("personal_eu"));
    finish(&s, &w, &mut m, f, None, 1);
    let e = m.events.last().cloned().unwrap_or_default();
    assert_eq!(
        (&e["status"], &e["reason"]),
        (&Value::from(0), &Value::from("client_gone"))
    );
    assert_eq!(m.fleet.in_flight, vec![0, 0]);
    assert_eq!(m.counters[Counter::from(Fleet::Trips).index()], 0);
}

#[test]
fn no_policy_is_refused_unless_asked_for_and_then_counted() {
    let no_tables = r#"{"destinations":[{"name":"a","cluster":"a"}]}"#;
    let err = Config::parse(no_tables.as_bytes()).err().map(|e| e.field);
    assert_eq!(err.as_deref(), Some("tables_base64"));
    let cfg =
        Config::parse(br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"a"}]}"#)
            .unwrap_or_else(|e| panic!("{e}"));
    let s = Setup::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let e = send(&s, &w, &mut m, &Req::default(), ok);
    assert_eq!(e["destination"], "a", "{e}");
    assert_eq!(m.counters[Counter::from(Fleet::WithoutPolicy).index()], 1);
}

#[test]
fn retry_next_reruns_a_failed_request_once_without_the_failed_destination() {
    let s = setup(r#","retry_next":true"#);
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    // A host that cannot re-run answers the failure; the next request
    // spills instead.
    let f = start(&s, &w, &mut m, &req("public"));
    m.response = vec![(":status".into(), "503".into())];
    let mut flow = f.flow;
    assert_eq!(flow.on_response_headers(&s, &mut m), Verdict::Continue);
    flow.on_complete(&s, &w, &mut m);
    // One that can asks for a re-run, marked with its token.
    m.can_rerun = true;
    let before = m.events.len();
    let f = start(&s, &w, &mut m, &req("public"));
    assert_eq!(f.cluster.as_deref(), Some("eu_owned"));
    m.response = vec![(":status".into(), "503".into())];
    let mut first = f.flow;
    assert_eq!(first.on_response_headers(&s, &mut m), Verdict::Rerun);
    assert!(m.superseded);
    assert!(m.header("x-ace-retry").is_some());
    // Envoy re-runs the request with its headers as they are now.
    let mut again = Flow::new();
    assert_eq!(
        again.on_request_headers(&s, &w, &mut m, true),
        Verdict::Continue
    );
    assert_eq!(
        m.header("x-ace-destination"),
        Some("us_api"),
        "not the one that failed"
    );
    assert_eq!(m.header("x-ace-retry"), None, "the mark goes no further");
    m.response = vec![(":status".into(), "200".into())];
    assert_eq!(again.on_response_headers(&s, &mut m), Verdict::Continue);
    first.on_complete(&s, &w, &mut m);
    again.on_complete(&s, &w, &mut m);
    assert_eq!(m.events.len(), before + 1, "one event for the request");
    let e = &m.events[before];
    assert_eq!(
        (&e["destination"], &e["reason"]),
        (&Value::from("us-api"), &Value::from("retry"))
    );
    assert_eq!(m.counters[Counter::from(Fleet::Retries).index()], 1);
    // A re-run that fails is answered, never run a third time.
    let f = start(&s, &w, &mut m, &req("public"));
    m.response = vec![(":status".into(), "503".into())];
    let mut first = f.flow;
    assert_eq!(first.on_response_headers(&s, &mut m), Verdict::Rerun);
    let mut again = Flow::new();
    again.on_request_headers(&s, &w, &mut m, true);
    m.response = vec![(":status".into(), "503".into())];
    assert_eq!(again.on_response_headers(&s, &mut m), Verdict::Continue);
}
