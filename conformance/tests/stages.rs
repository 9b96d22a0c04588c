//! Each stage of routing on its own ([`ace_flow::stage`]), over the
//! suite's reference host: what one stage does to the worker's feasible
//! set and to the shared store, and that what a stage keeps in the store
//! is seen by every worker (two workers here, one store, as two of
//! Envoy's workers share one). The four-host cases of `conformance.rs`
//! see the same stages from outside, through the whole flow.

#![allow(clippy::panic, clippy::indexing_slicing)] // a test fails by panicking

use ace_conformance::cases;
use ace_conformance::mock::Mock;
use ace_core::dispatch::Request;
use ace_flow::event::Event;
use ace_flow::flow::{Setup, Worker};
use ace_flow::headers::Pairs;
use ace_flow::prefix::HeldBuf;
use ace_flow::request;
use ace_flow::stage::{budget, identity, locality, Shape};

fn setup(json: &str) -> Setup {
    Setup::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

/// The event of a request with `headers`, as the flow captures it.
fn event(s: &Setup, headers: &[(&str, &str)], now: u64) -> Event {
    let pairs = Pairs::encode(headers.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
    request::capture(&s.config, pairs, now, [b'0'; 32]).event
}

/// A request with no body, at `now`.
fn shape(now: u64) -> Shape<'static> {
    Shape {
        raw: None,
        body_model: None,
        fingerprint: None,
        api: None,
        rewritable: false,
        routing: None,
        cacheable: None,
        carried: None,
        now,
    }
}

#[test]
fn identity_reads_the_tables_and_fails_closed() {
    let s = setup(&cases::fleet(""));
    let (mut m, mut w) = (Mock::new(&s), Worker::default());
    let now = m.now;
    let mut e = event(&s, &[("x-ace-data-class", "personal_eu")], now);
    identity::feasible(&s, &mut w, &mut m, &mut e, &shape(now)).expect("feasible");
    assert_eq!(w.lookup.mask[0], 0b01, "personal_eu: the EU only");
    let mut e = event(&s, &[("x-ace-data-class", "no-such-class")], now);
    let unknown = identity::feasible(&s, &mut w, &mut m, &mut e, &shape(now));
    assert!(
        unknown.is_err() || w.lookup.mask.iter().all(|m| *m == 0),
        "an unknown value opens no destination"
    );
    let mut e = event(&s, &[], now);
    let missing = identity::feasible(&s, &mut w, &mut m, &mut e, &shape(now));
    assert!(
        missing.is_err(),
        "a missing attribute is refused, never routed"
    );
}

#[test]
fn a_budget_booked_on_one_worker_counts_on_another() {
    let s = setup(&cases::budgeted());
    let mut m = Mock::new(&s);
    let (mut a, mut b) = (Worker::default(), Worker::default());
    let now = m.now;
    let headers = [("x-ace-data-class", "public"), ("x-ace-tenant", "team-b")];
    // team-b may use 2,500 tokens a minute: 2,000 on worker a...
    let mut e = event(&s, &headers, now);
    identity::feasible(&s, &mut a, &mut m, &mut e, &shape(now)).expect("feasible");
    let mut req = Request::untimed(1_500, 500, 0.0);
    let admitted = budget::admit(&s, &mut a, &mut m, &mut req, now)
        .unwrap_or_else(|r| panic!("refused: {r:?}"))
        .expect("team-b has a budget");
    let _hold = budget::reserve(&s, &mut a, &mut m, admitted, 0.0, now);
    // ...leave 500 for worker b, which reads the same store.
    let mut e = event(&s, &headers, now);
    identity::feasible(&s, &mut b, &mut m, &mut e, &shape(now)).expect("feasible");
    let mut req = Request::untimed(800, 200, 0.0);
    let refused = budget::admit(&s, &mut b, &mut m, &mut req, now);
    assert!(
        refused.is_err(),
        "the minute's tokens are spent across workers"
    );
}

#[test]
fn a_prompt_recorded_on_one_worker_is_held_for_another() {
    let s = setup(&cases::prefixed());
    let mut m = Mock::new(&s);
    let (mut a, mut b) = (Worker::default(), Worker::default());
    let now = m.now;
    let text = "You are a careful assistant. ".repeat(200);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{text}"}},{{"role":"user","content":"hi"}}]}}"#
    );
    let scanned = ace_flow::body::scan_request(body.as_bytes(), body.len()).expect("a body");
    let mut sh = shape(now);
    sh.fingerprint = Some(scanned.prefix);
    let headers = [("x-ace-data-class", "public")];
    let mut e = event(&s, &headers, now);
    identity::feasible(&s, &mut a, &mut m, &mut e, &sh).expect("feasible");
    let mut held = HeldBuf::default();
    let local = locality::held(&s, &mut a, &mut m, &e, &sh, &mut held).expect("locality on");
    assert!(!local.any, "nothing holds a prompt never sent");
    locality::record(&s, &mut a, &mut m, &mut e, &local, 1, &held, &sh);
    // Worker b reads the table worker a wrote.
    let mut e = event(&s, &headers, now + 1);
    sh.now = now + 1;
    identity::feasible(&s, &mut b, &mut m, &mut e, &sh).expect("feasible");
    let mut held = HeldBuf::default();
    let local = locality::held(&s, &mut b, &mut m, &e, &sh, &mut held).expect("locality on");
    assert!(local.any, "the destination sent the prompt holds it");
    assert!(
        held.cached[1] > 0 && held.cached[0] == 0,
        "{:?}",
        held.cached
    );
}
