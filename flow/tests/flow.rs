//! The whole request flow through a mock host: what every adapter must do
//! alike, checked without Envoy (the real-Envoy suites in `tests/` run the
//! same flow inside both builds).
//!
//! The mock keeps the fleet in one [`FleetState`] (as the dynamic module
//! does), answers from scripted upstreams keyed by the cluster the flow
//! chose, and records every local reply, counter and event line.

#![allow(clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use ace_config::{Config, Trusted};
use ace_core::fleet::FleetState;
use ace_core::health::Outcome;
use ace_core::tables::{encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use ace_flow::control::Outside;
use ace_flow::flow::{FleetAnswer, FleetOp, FleetUnavailable, Flow, Host, Setup, Verdict, Worker};
use ace_flow::headers::Pairs;
use ace_flow::request::Counters;
use base64::Engine;
use serde_json::Value;
use std::cell::RefCell;

/// Owned GPUs in the EU (2 slots, cheap), a pay-as-you-go API in the US.
/// `personal_eu` data may only go to the EU.
fn setup(extra: &str) -> Setup {
    setup_with(r#"{"read":true}"#, extra)
}

/// [`setup`] with body settings `body`.
fn setup_with(body: &str, extra: &str) -> Setup {
    let spec = TableSpec {
        destinations: vec![
            DestinationSpec {
                name: "eu-owned".into(),
                cluster: "eu_owned".into(),
            },
            DestinationSpec {
                name: "us-api".into(),
                cluster: "us_api".into(),
            },
        ],
        attributes: vec![AttributeSpec {
            name: "data_class".into(),
            values: vec!["personal_eu".into(), "public".into()],
        }],
        factors: vec![
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![0b11],
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![0],
                // Value 0 is the unknown one: forbidden everywhere;
                // personal_eu: not the US; public: nothing.
                rows: vec![0b11, 0b10, 0],
            },
        ],
    };
    let tables = base64::engine::general_purpose::STANDARD
        .encode(encode(&spec).unwrap_or_else(|e| panic!("{e}")));
    let json = format!(
        r#"{{"destinations":[
            {{"name":"eu-owned","cluster":"eu_owned","tier":"inhouse","capacity":2,
              "usd_per_input_token":1e-8,"usd_per_output_token":1e-8,"slo_ms":1000}},
            {{"name":"us-api","cluster":"us_api","tier":"payg",
              "usd_per_input_token":2e-6,"usd_per_output_token":8e-6}}],
          "tables_base64":"{tables}",
          "body":{body},
          "health":{{"trip_after":3,"base_cooldown_ms":1000}}{extra}}}"#
    );
    Setup::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

/// What a scripted upstream answers.
#[derive(Clone, Debug)]
struct Answer {
    status: u32,
    headers: Vec<(&'static str, String)>,
    body: Vec<Vec<u8>>,
}

impl Answer {
    fn ok(body: &str) -> Answer {
        Answer {
            status: 200,
            headers: vec![
                ("content-type", "application/json".into()),
                ("x-envoy-upstream-service-time", "3".into()),
            ],
            body: vec![body.as_bytes().to_vec()],
        }
    }

    fn status(status: u32) -> Answer {
        Answer {
            status,
            headers: vec![("x-envoy-upstream-service-time", "1".into())],
            body: vec![],
        }
    }
}

/// The mock host: one per fleet; its per-request fields are reset by
/// [`Mock::request`].
struct Mock {
    now: u64,
    ids: u64,
    fleet: FleetState,
    /// What the control service said (tests apply snapshots to it).
    outside: Outside,
    setup_models: Vec<ace_core::cost::CostModel>,
    policy: ace_core::health::HealthPolicy,
    counters: Vec<u64>,
    events: Vec<Value>,
    /// This request's headers, as the upstream will see them.
    headers: Vec<(String, String)>,
    /// The body chunk of the current body callback.
    chunk: Vec<u8>,
    /// The response headers of the current request.
    response: Vec<(String, String)>,
    /// Local replies sent.
    replies: Vec<(u32, Value)>,
    /// Metadata a verified source reads.
    metadata: Option<Vec<u8>>,
    /// Whether this host can run a request again, and whether it marked
    /// the current run superseded.
    can_rerun: bool,
    superseded: bool,
}

impl Mock {
    fn new(setup: &Setup) -> Mock {
        let cfg = &setup.config;
        let mut fleet = FleetState::new(cfg.destinations.len());
        fleet.reprice_all(&cfg.models, &cfg.health, 0);
        Mock {
            now: 1_000,
            ids: 0,
            fleet,
            outside: Outside::new(cfg),
            setup_models: cfg.models.clone(),
            policy: cfg.health,
            counters: vec![0; Counters::names(cfg).len()],
            events: vec![],
            headers: vec![],
            chunk: vec![],
            response: vec![],
            replies: vec![],
            metadata: None,
            can_rerun: false,
            superseded: false,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Host for Mock {
    fn now_ms(&mut self) -> u64 {
        self.now
    }

    fn next_event_id(&mut self) -> [u8; 32] {
        self.ids += 1;
        ace_flow::request::event_id(7, self.ids)
    }

    fn request_headers(&mut self) -> Pairs {
        Pairs::encode(
            self.headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_bytes())),
        )
    }

    fn remove_request_header(&mut self, name: &str) -> bool {
        self.headers.retain(|(k, _)| k != name);
        true
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> bool {
        self.remove_request_header(name);
        self.headers.push((name.to_string(), value.to_string()));
        true
    }

    fn clear_route_cache(&mut self) {}

    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize {
        let take = room.min(self.chunk.len());
        into.extend_from_slice(&self.chunk[..take]);
        self.chunk.len()
    }

    fn trusted(&mut self, _source: &Trusted) -> Option<Vec<u8>> {
        self.metadata.clone()
    }

    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        f(self
            .response
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_bytes()))
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        self.response.retain(|(k, _)| k != name);
        self.response.push((name.to_string(), value.to_string()));
    }

    fn response_body(&mut self, mut f: impl FnMut(&[u8])) {
        f(&self.chunk);
    }

    fn send_local(&mut self, status: u32, body: &[u8], _details: &str) -> bool {
        let v = serde_json::from_slice(body).unwrap_or_else(|e| panic!("reply not JSON: {e}"));
        self.replies.push((status, v));
        true
    }

    fn envoy_response_code(&mut self) -> Option<u32> {
        None
    }

    fn write_event(&mut self, line: &[u8]) -> bool {
        let v = serde_json::from_slice(line).unwrap_or_else(|e| panic!("event not JSON: {e}"));
        self.events.push(v);
        true
    }

    fn count(&mut self, counter: usize, n: u64) {
        self.counters[counter] += n;
    }

    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable> {
        let warmth = &self.outside.warmth;
        Ok(op.run(
            &mut self.fleet,
            warmth,
            &self.setup_models,
            &self.policy,
            now_ms,
        ))
    }

    fn can_rerun(&self) -> bool {
        self.can_rerun
    }

    fn replayable(&mut self, _bytes: usize) -> bool {
        true
    }

    fn mark_superseded(&mut self, superseded: bool) {
        self.superseded = superseded;
    }
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
    assert_eq!(m.counters[Counters::NO_DESTINATION], 1);
    assert_eq!(m.counters[Counters::REQUESTS], 4);
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
    assert_eq!(m.counters[Counters::RETRIES], 0);
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
    assert_eq!(m.counters[Counters::TRIPS], 1);
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
    let fails = Counters::destination_outcome(0, Some(Outcome::Failure { tenant: 0 }));
    assert_eq!(fails.map(|c| m.counters[c]), Some(3));
}

#[test]
fn envoys_own_5xx_counts_as_a_failure_blamed_on_no_tenant() {
    let s = setup("");
    let w = RefCell::new(Worker::default());
    let mut m = Mock::new(&s);
    let refused = |_: &str| Answer {
        status: 503,
        headers: vec![],
        body: vec![],
    };
    for _ in 0..3 {
        send(&s, &w, &mut m, &req("public"), refused);
    }
    assert_eq!(m.counters[Counters::TRIPS], 1);
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
    assert_eq!(m.counters[Counters::DERATES], 1);
    let e = m.events.last().cloned().unwrap_or_default();
    assert_eq!(e["slo_met"], false, "{e}");
    let throttled = |_: &str| Answer {
        status: 429,
        headers: vec![
            ("retry-after", "2".into()),
            ("x-envoy-upstream-service-time", "1".into()),
        ],
        body: vec![],
    };
    let e = send(&s, &w, &mut m, &req("personal_eu"), throttled);
    assert_eq!(e["status"], 429);
    assert_eq!(m.counters[Counters::CAP_CUTS], 1);
    let throttled_on = Counters::destination_outcome(
        0,
        Some(Outcome::Throttled {
            retry_after_ms: None,
        }),
    );
    assert_eq!(throttled_on.map(|c| m.counters[c]), Some(1));
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
    let booked = m.counters[Counters::BOOKED_NANO_USD];
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
    assert_eq!(m.counters[Counters::TRIPS], 0);
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
    assert_eq!(m.counters[Counters::WITHOUT_POLICY], 1);
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
    assert_eq!(m.counters[Counters::RETRIES], 1);
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
