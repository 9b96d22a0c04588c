//! The dynamic module's control poller in a real Envoy 1.40: the same
//! `libace_dynamic.so` loaded twice, as the HTTP filter and as the
//! `envoy.bootstrap.dynamic_modules` extension that polls a control
//! service through cluster `ace_control` on Envoy's main thread.
//!
//! The control service here is a fake (`ace_harness::control::FakeControl`): `GET /v1/snapshot`
//! answers the snapshot it holds (`ace_snapshot::encode`) with its ETag, or
//! 304 when `If-None-Match` matches, and counts what it serves; it can be
//! stopped (connections closed, port refused) and started again on the
//! same port. Two upstreams: `cheap` wins the merit order unless drained.

use ace_harness::client::Request;
use ace_harness::control::{FakeControl, Served};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::Upstream;
use ace_snapshot::{Drain, DrainReason, Report};
use ace_tests::{ace_dynamic_lib, now_ms, require_envoy, snapshot, start, upstream};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTERVAL_MS: u64 = 500;
const STALE_AFTER_MS: u64 = 1500;

/// The `control` object both the filter and the poller take.
fn control_json() -> serde_json::Value {
    json!({"cluster": "ace_control", "interval_ms": INTERVAL_MS, "stale_after_ms": STALE_AFTER_MS})
}

fn filter_config() -> String {
    json!({
        "allow_no_policy": true,
        "control": control_json(),
        "destinations": [
            {"name": "cheap", "cluster": "cheap", "tier": "payg",
             "usd_per_input_token": 1e-6, "usd_per_output_token": 1e-6},
            {"name": "dear", "cluster": "dear", "tier": "payg",
             "usd_per_input_token": 2e-6, "usd_per_output_token": 2e-6}
        ]
    })
    .to_string()
}

/// The poller's metric `name` as Envoy's `/stats` lists it.
fn stat(name: &str) -> String {
    format!("dynamicmodulescustom.{name}")
}

/// A report draining `name` for a minute.
fn drained(name: &str) -> Report {
    Report {
        name: name.to_string(),
        drain: Some(Drain {
            until_ms: now_ms() + 60_000,
            reason: DrainReason::Operator,
        }),
        ..Report::default()
    }
}

/// Envoy with ACE as filter and poller, its two upstreams, and the fake
/// control service serving `first`.
struct Rig {
    envoy: Envoy,
    cheap: Upstream,
    dear: Upstream,
    control: FakeControl,
}

fn rig(concurrency: u32, first: Vec<u8>) -> Rig {
    require_envoy();
    let lib = ace_dynamic_lib();
    let served = Arc::new(Served::default());
    *served.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = first;
    let control = FakeControl::start(served, 0);
    let (cheap, dear) = (upstream("cheap"), upstream("dear"));
    let envoy = start(
        &EnvoyBuilder::new()
            .concurrency(concurrency)
            .bootstrap_extension(ace_harness::dylib::control_poller_json(
                &lib,
                &control_json(),
            ))
            .http_filter(ace_harness::dylib::http_filter_json(
                &lib,
                "ace",
                Some(&filter_config()),
            ))
            .cluster("cheap", cheap.port())
            .cluster("dear", dear.port())
            .cluster("ace_control", control.port),
    );
    Rig {
        envoy,
        cheap,
        dear,
        control,
    }
}

impl Rig {
    /// Send one request; which upstream served it.
    fn send(&self, i: usize) -> &'static str {
        let (cheap, dear) = (self.cheap.count(), self.dear.count());
        let resp = Request::post_json("/v1/chat/completions", &json!({"n": i}))
            .send(self.envoy.port())
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
        if self.cheap.count() > cheap {
            "cheap"
        } else if self.dear.count() > dear {
            "dear"
        } else {
            panic!("request {i} reached neither upstream")
        }
    }

    /// Send requests until one lands on `want`, for at most `within`; how
    /// long it took.
    fn until_routed_to(&self, want: &str, within: Duration) -> Option<Duration> {
        let t = Instant::now();
        let mut i = 0;
        while t.elapsed() <= within {
            if self.send(i) == want {
                return Some(t.elapsed());
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Send requests until one lands on `want`, within two intervals (and
    /// a margin); how long it took, or fail saying that `what` did not
    /// happen.
    fn moves_to(&self, want: &str, what: &str) -> Duration {
        let within = Duration::from_millis(2 * INTERVAL_MS + 300);
        self.until_routed_to(want, within)
            .unwrap_or_else(|| panic!("{what} within {within:?}:\n{}", self.envoy.log()))
    }

    /// Send requests, each of which must land on `on`, until `done` holds;
    /// fail if it does not within `within`.
    fn keep_sending(&self, on: &str, within: Duration, done: impl Fn(&Rig) -> bool) {
        let t = Instant::now();
        let mut i = 0;
        while !done(self) {
            assert!(
                t.elapsed() < within,
                "not done after {within:?}:\n{}",
                self.envoy.log()
            );
            assert_eq!(self.send(i), on, "request {i} went elsewhere");
            i += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stat(&self, name: &str) -> Option<u64> {
        self.envoy.stat(&stat(name))
    }

    /// Wait until the poller has polled at least once.
    fn wait_first_poll(&self) {
        let t = Instant::now();
        while self.control.requests() == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the poller never polled:\n{}",
                self.envoy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn exactly_one_poll_per_interval_with_four_workers() {
    let rig = rig(4, snapshot(1, vec![]));
    rig.wait_first_poll();
    let before = rig.control.requests();
    let window = Duration::from_millis(5_000);
    std::thread::sleep(window);
    let polls = rig.control.requests() - before;
    let expected = (window.as_millis() as u64 / INTERVAL_MS) as usize;
    eprintln!("{polls} polls in {window:?} at {INTERVAL_MS} ms, 4 workers");
    assert!(
        (expected - 1..=expected + 1).contains(&polls),
        "one poll per interval per Envoy: {polls} in {window:?}, expected {expected}"
    );
    // An unchanged snapshot costs a 304: every poll but the first.
    let (all, not_modified) = (
        rig.control.requests(),
        rig.control.served.not_modified.load(Ordering::SeqCst),
    );
    assert_eq!(not_modified, all - 1, "{all} polls");
    let counted = rig.stat("ace.control.polls").unwrap_or(0) as usize;
    assert!(
        counted >= all && counted <= all + 1,
        "ace.control.polls {counted} against {all} served (one may be in flight)"
    );
    assert_eq!(rig.stat("ace.control.snapshots"), Some(1));
    assert_eq!(rig.stat("ace.control.errors"), Some(0));
}

#[test]
fn a_drain_moves_traffic_to_the_other_destination_within_two_intervals() {
    let rig = rig(2, snapshot(1, vec![]));
    rig.wait_first_poll();
    for i in 0..3 {
        assert_eq!(rig.send(i), "cheap", "the merit order's first");
    }
    rig.control.set(snapshot(2, vec![drained("cheap")]));
    let took = rig.moves_to("dear", "the drain did not move traffic");
    eprintln!("drain took effect after {took:?}");
    for i in 0..10 {
        assert_eq!(rig.send(i), "dear", "every worker took the drain");
    }
    assert_eq!(rig.stat("ace.control.snapshots"), Some(2));
}

#[test]
fn losing_the_service_keeps_traffic_and_raises_the_age_and_a_restart_is_picked_up() {
    let mut rig = rig(2, snapshot(1, vec![]));
    rig.wait_first_poll();
    let port = rig.control.port;
    let served = rig.control.served.clone();
    rig.control.stop();
    // Traffic flows on the last snapshot.
    let lost = Instant::now();
    let gone = Duration::from_millis(STALE_AFTER_MS + 2 * INTERVAL_MS);
    rig.keep_sending("cheap", gone * 2, |_| lost.elapsed() >= gone);
    let age = rig.stat("ace.control.age_ms").unwrap_or(0);
    assert!(
        age > STALE_AFTER_MS,
        "the age gauge rises while the service is gone: {age} ms"
    );
    assert_eq!(rig.stat("ace.control.stale"), Some(1));
    let errors = rig.stat("ace.control.errors").unwrap_or(0);
    assert!(errors >= 2, "failed polls counted: {errors}");
    let log = rig.envoy.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("control poll through cluster `ace_control`"))
        .count();
    assert!(
        (1..errors as usize).contains(&lines),
        "a lasting problem is logged once, not per poll: {lines} lines for {errors} errors:\n{log}"
    );
    // Restarted on the same port with news: picked up, no Envoy restart.
    *served.snapshot.lock().unwrap_or_else(|p| p.into_inner()) =
        snapshot(2, vec![drained("cheap")]);
    rig.control = FakeControl::start(served, port);
    let took = rig.moves_to("dear", "the restarted service was not picked up");
    eprintln!("restarted service picked up after {took:?}");
    std::thread::sleep(Duration::from_millis(INTERVAL_MS + 100));
    let age = rig.stat("ace.control.age_ms").unwrap_or(u64::MAX);
    assert!(age <= 2 * INTERVAL_MS, "fresh again: age {age} ms");
    assert_eq!(rig.stat("ace.control.stale"), Some(0));
    assert!(rig
        .envoy
        .log()
        .contains("control service answers again through cluster `ace_control`"));
}

#[test]
fn a_snapshot_naming_an_unknown_destination_changes_nothing() {
    let rig = rig(2, snapshot(1, vec![]));
    rig.wait_first_poll();
    // Would drain `cheap` if it were taken.
    rig.control
        .set(snapshot(2, vec![drained("cheap"), drained("ghost")]));
    // Each fleet resolves a new snapshot on its next request; the
    // rejection names the destination, and traffic stays where it was.
    let within = Duration::from_millis(4 * INTERVAL_MS);
    rig.keep_sending("cheap", within, |rig| {
        rig.envoy.log().contains("destination `ghost`")
    });
    for i in 0..10 {
        assert_eq!(
            rig.send(i),
            "cheap",
            "the rejected snapshot changed nothing"
        );
    }
    // The last good one stays; the next good one is taken.
    rig.control.set(snapshot(3, vec![drained("cheap")]));
    rig.moves_to("dear", "a good snapshot after a rejected one was not taken");
}
