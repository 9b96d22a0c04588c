//! The control rules of `ace_flow::control`, one case each, through the
//! one consumer every host feeds ([`Consumer`]): what is in force, whether
//! the service counts as heard, and when the snapshot goes stale.

use ace_config::Config;
use ace_core::fleet::FleetState;
use ace_flow::control::{
    etag, Answered, Consumer, Delivery, Metric, Poller, Rejected, Reply, Transport, Verdict,
};
use ace_snapshot::{Drain, DrainReason, Load, Report, Snapshot};

/// Polls every 1 s, stale after 3 s, held loads priced for 2 s.
fn config() -> Config {
    Config::parse(
        br#"{"allow_no_policy":true,
            "control":{"cluster":"ace_control","interval_ms":1000,"stale_after_ms":3000,"held_load_ms":2000},
            "destinations":[
            {"name":"owned","cluster":"c0","tier":"inhouse","capacity":8,
             "usd_per_input_token":1e-9,"usd_per_output_token":1e-9},
            {"name":"api","cluster":"c1","tier":"payg",
             "usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#,
    )
    .unwrap()
}

/// A snapshot `version` reporting `capacity` slots and `running`
/// requests on `owned`, and anything in `extra`.
fn bytes(version: u64, capacity: u32, running: u32, extra: Vec<Report>) -> Vec<u8> {
    let owned = Report {
        name: "owned".into(),
        capacity: Some(capacity),
        load: Some(Load {
            running,
            ..Load::default()
        }),
        ..Report::default()
    };
    let mut reports = vec![owned];
    reports.extend(extra);
    ace_snapshot::encode(&Snapshot {
        version,
        generated_ms: 0,
        reports,
        budgets: Vec::new(),
    })
    .unwrap()
}

fn snap(bytes: &[u8], at_ms: u64) -> Delivery<'_> {
    Delivery::Snapshot { bytes, at_ms }
}

fn unchanged(etag: &str, at_ms: u64) -> Delivery<'_> {
    Delivery::Unchanged { etag, at_ms }
}

fn tag(bytes: &[u8]) -> String {
    ace_snapshot::etag(bytes).unwrap()
}

/// What `owned` is priced with under what is in force at `now`.
fn owned(c: &Consumer, cfg: &Config, now: u64) -> (Option<u32>, u32) {
    let mut state = FleetState::new(2);
    c.apply_to(&mut state, cfg, now);
    (state.live[0].capacity, state.live[0].reported_load)
}

#[test]
fn a_rejected_snapshot_keeps_the_last_good_one_and_does_not_reset_staleness() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let good = bytes(1, 6, 4, vec![]);
    assert_eq!(c.deliver(&cfg, snap(&good, 100), 100).0, Verdict::Accepted);
    // Undecodable bytes, and a figure a signal refuses.
    let garbage = b"not a snapshot".to_vec();
    let mut bad_price = Report {
        name: "api".into(),
        usd_per_hour: Some(-1.0),
        ..Report::default()
    };
    bad_price.price = None;
    let refused = ace_snapshot::encode(&Snapshot {
        version: 2,
        generated_ms: 0,
        reports: vec![bad_price],
        budgets: Vec::new(),
    });
    let mut bad = vec![garbage];
    if let Ok(b) = refused {
        bad.push(b); // the wire format may refuse it first: then one case
    }
    for (i, b) in bad.iter().enumerate() {
        let at = 1_000 + i as u64 * 1_000;
        let (v, _) = c.deliver(&cfg, snap(b, at), at);
        assert!(matches!(v, Verdict::Refused { first: true, .. }), "{v:?}");
        // Sent again: refused, but neither logged nor counted again.
        let (v, _) = c.deliver(&cfg, snap(b, at + 10), at + 10);
        assert!(matches!(v, Verdict::Refused { first: false, .. }), "{v:?}");
    }
    assert_eq!(c.outside().version, Some(1), "the last good one stays");
    assert_eq!(owned(&c, &cfg, 2_000), (Some(6), 4));
    // Not heard: stale 3 s after the good one, however much bad came.
    let (_, changed) = c.deliver(&cfg, snap(&bad[0], 3_100), 3_100);
    assert!(!changed && !c.stale());
    let (_, changed) = c.deliver(&cfg, snap(&bad[0], 3_101), 3_101);
    assert!(changed && c.stale(), "stale like a dead service");
    assert_eq!(
        owned(&c, &cfg, 3_101),
        (Some(6), 0),
        "loads dropped, the rest kept"
    );
}

#[test]
fn an_unknown_destination_rejects_the_whole_snapshot() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let good = bytes(1, 6, 4, vec![]);
    c.deliver(&cfg, snap(&good, 100), 100);
    let drain = Report {
        name: "ghost".into(),
        drain: Some(Drain {
            until_ms: u64::MAX,
            reason: DrainReason::Operator,
        }),
        ..Report::default()
    };
    let ghost = bytes(2, 1, 0, vec![drain]);
    let (v, changed) = c.deliver(&cfg, snap(&ghost, 200), 200);
    assert_eq!(
        v,
        Verdict::Refused {
            why: Rejected::Unknown {
                name: "ghost".into()
            },
            first: true
        }
    );
    assert!(!changed);
    assert_eq!(owned(&c, &cfg, 200), (Some(6), 4), "not even `owned` moved");
}

#[test]
fn a_304_is_hearing_only_for_the_snapshot_in_force() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    // Before any snapshot, a 304 is not hearing.
    assert_eq!(
        c.deliver(&cfg, unchanged("", 500), 500).0,
        Verdict::NotHeard
    );
    let good = bytes(1, 6, 4, vec![]);
    c.deliver(&cfg, snap(&good, 1_000), 1_000);
    assert_eq!(c.etag(), Some(tag(&good)));
    let ghost = bytes(
        2,
        1,
        0,
        vec![Report {
            name: "ghost".into(),
            ..Report::default()
        }],
    );
    assert!(matches!(
        c.deliver(&cfg, snap(&ghost, 1_500), 1_500).0,
        Verdict::Refused { .. }
    ));
    // A 304 for the rejected one (a host that sent its ETag): not heard.
    assert_eq!(
        c.deliver(&cfg, unchanged(&tag(&ghost), 2_000), 2_000).0,
        Verdict::NotHeard
    );
    assert_eq!(c.outside().heard_ms, 1_000);
    c.deliver(&cfg, unchanged(&tag(&ghost), 4_001), 4_001);
    assert!(
        c.stale(),
        "304s for a rejected snapshot do not keep it fresh"
    );
    // A 304 for the one in force: heard, fresh again.
    let (v, changed) = c.deliver(&cfg, unchanged(&tag(&good), 4_100), 4_100);
    assert_eq!(v, Verdict::Heard);
    assert!(changed && !c.stale());
    // The same bytes sent in full: heard, not taken again.
    assert_eq!(c.deliver(&cfg, snap(&good, 4_200), 4_200).0, Verdict::Heard);
    assert_eq!(c.outside().heard_ms, 4_200);
}

#[test]
fn a_lower_version_not_seen_before_is_taken_at_once() {
    // The service restarted with its clock stepped back (or another
    // replica, clock behind): versions are compared for equality.
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    c.deliver(&cfg, snap(&bytes(1_000_000, 6, 4, vec![]), 1_000), 1_000);
    let restarted = bytes(900_000, 3, 1, vec![]);
    let (v, changed) = c.deliver(&cfg, snap(&restarted, 1_500), 1_500);
    assert!(v == Verdict::Accepted && changed);
    assert_eq!(c.outside().version, Some(900_000));
    assert_eq!(owned(&c, &cfg, 1_500), (Some(3), 1));
}

#[test]
fn a_replayed_snapshot_is_refused_while_fresh_and_taken_once_stale() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let old = bytes(999_000, 2, 0, vec![]);
    let newer = bytes(1_000_000, 6, 4, vec![]);
    c.deliver(&cfg, snap(&old, 500), 500);
    c.deliver(&cfg, snap(&newer, 1_000), 1_000);
    // The replaced one replayed between real answers never wins.
    let (v, changed) = c.deliver(&cfg, snap(&old, 1_500), 1_500);
    assert_eq!(
        v,
        Verdict::Refused {
            why: Rejected::Replayed {
                version: 999_000,
                in_force: 1_000_000
            },
            first: true
        }
    );
    assert!(!changed);
    c.deliver(&cfg, unchanged(&tag(&newer), 2_000), 2_000);
    assert!(matches!(
        c.deliver(&cfg, snap(&old, 4_500), 4_500).0,
        Verdict::Refused { first: false, .. }
    ));
    assert_eq!(c.outside().version, Some(1_000_000));
    assert_eq!(c.outside().heard_ms, 2_000, "a replay is not hearing");
    // Only the replay comes: taken once the one in force is stale (3 s
    // after it was last heard at 2 000), as the only answer there is.
    assert!(matches!(
        c.deliver(&cfg, snap(&old, 5_000), 5_000).0,
        Verdict::Refused { .. }
    ));
    assert_eq!(
        c.deliver(&cfg, snap(&old, 5_001), 5_001).0,
        Verdict::Accepted
    );
    assert_eq!(c.outside().version, Some(999_000));
    assert!(!c.stale());
    assert_eq!(owned(&c, &cfg, 5_001), (Some(2), 0));
}

#[test]
fn a_replay_heard_as_a_304_is_taken_once_stale() {
    // The dynamic module's poller sends the ETag of the last bytes it got,
    // so a refused replay comes back as 304s for it.
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let older = bytes(40, 2, 0, vec![]);
    let newer = bytes(50, 6, 4, vec![]);
    c.deliver(&cfg, snap(&older, 500), 500);
    c.deliver(&cfg, snap(&newer, 1_000), 1_000);
    assert!(matches!(
        c.deliver(&cfg, snap(&older, 2_000), 2_000).0,
        Verdict::Refused { .. }
    ));
    assert_eq!(
        c.deliver(&cfg, unchanged(&tag(&older), 3_000), 3_000).0,
        Verdict::NotHeard
    );
    assert_eq!(
        c.deliver(&cfg, unchanged(&tag(&older), 4_001), 4_001).0,
        Verdict::Accepted
    );
    assert_eq!(c.outside().version, Some(40));
}

#[test]
fn the_same_version_with_other_bytes_is_taken() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    c.deliver(&cfg, snap(&bytes(7, 6, 4, vec![]), 1_000), 1_000);
    let other = bytes(7, 2, 0, vec![]);
    assert_eq!(
        c.deliver(&cfg, snap(&other, 1_100), 1_100).0,
        Verdict::Accepted
    );
    assert_eq!(c.etag(), Some(tag(&other)));
}

#[test]
fn a_relayed_replay_is_taken_as_the_poller_took_it() {
    let cfg = config();
    let mut worker = Consumer::new(&cfg, 0);
    let older = bytes(40, 2, 0, vec![]);
    worker.deliver(&cfg, snap(&older, 500), 500);
    worker.deliver(&cfg, snap(&bytes(50, 6, 4, vec![]), 1_000), 1_000);
    let relayed = Delivery::Relayed {
        bytes: &older,
        at_ms: 1_100,
    };
    assert_eq!(worker.deliver(&cfg, relayed, 1_200).0, Verdict::Accepted);
}

#[test]
fn stale_then_fresh_again() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    // Never heard: the age counts from the start.
    assert!(!c.age(3_000));
    assert!(c.age(3_001) && c.stale());
    assert_eq!(c.age_ms(3_001), 3_001);
    let good = bytes(1, 6, 4, vec![]);
    let (v, changed) = c.deliver(&cfg, snap(&good, 3_500), 3_500);
    assert!(v == Verdict::Accepted && changed && !c.stale());
    assert!(c.age(6_501), "stale again 3 s after");
    assert_eq!(owned(&c, &cfg, 6_501), (Some(6), 0));
    let (v, changed) = c.deliver(&cfg, unchanged(&tag(&good), 7_000), 7_000);
    assert!(v == Verdict::Heard && changed && !c.stale());
    assert_eq!(owned(&c, &cfg, 7_000), (Some(6), 4), "loads priced again");
    assert_eq!(c.age_ms(7_400), 400);
}

#[test]
fn a_held_load_is_priced_for_held_load_ms_from_its_scrape() {
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let held = Report {
        name: "owned".into(),
        load: Some(Load {
            running: 5,
            waiting: 2,
            stale: true,
            scraped_ms: 10_000,
            ..Load::default()
        }),
        ..Report::default()
    };
    let b = ace_snapshot::encode(&Snapshot {
        version: 1,
        generated_ms: 10_500,
        reports: vec![held],
        budgets: Vec::new(),
    })
    .unwrap();
    c.deliver(&cfg, snap(&b, 10_500), 10_500);
    let mut state = FleetState::new(2);
    c.apply_to(&mut state, &cfg, 10_500);
    assert_eq!(state.live[0].reported_load_at(11_999), 7);
    assert_eq!(
        state.live[0].reported_load_at(12_000),
        0,
        "held_load_ms = 2 000"
    );
}

#[test]
fn the_poller_delivers_what_the_transport_brought() {
    #[derive(Default)]
    struct T {
        sent: Vec<Vec<(String, String)>>,
        errors: u64,
    }
    impl Transport for T {
        fn send(&mut self, _: &str, h: &[(&str, &str)], _: u64) -> Result<u64, String> {
            let h = h.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            self.sent.push(h.collect());
            Ok(self.sent.len() as u64)
        }
        fn count(&mut self, m: Metric, n: u64) {
            if m == Metric::Errors {
                self.errors += n;
            }
        }
    }
    let cfg = config();
    let mut c = Consumer::new(&cfg, 0);
    let mut p = Poller::new(cfg.control.clone().unwrap());
    let mut t = T::default();
    let ok = |body: &[u8]| Reply::Answer {
        status: Some(200),
        body: body.to_vec(),
    };
    let good = bytes(1, 6, 4, vec![]);
    p.poll(&mut t, c.etag().as_deref(), 0);
    assert!(!t.sent[0].iter().any(|(k, _)| k == "if-none-match"));
    let got = p.answer(&mut t, 1, ok(&good)).unwrap();
    assert_eq!(c.deliver(&cfg, got.delivery(100), 100).0, Verdict::Accepted);
    // The host sends the ETag of the snapshot in force.
    p.poll(&mut t, c.etag().as_deref(), 1_000);
    assert!(t.sent[1].contains(&(
        "if-none-match".into(),
        etag(1, ace_snapshot::checksum(&good).unwrap())
    )));
    // The same bytes again (a service ignoring If-None-Match): heard.
    let got = p.answer(&mut t, 2, ok(&good)).unwrap();
    assert_eq!(got, Answered::Snapshot(good.clone()));
    assert_eq!(p.last_etag(), Some(tag(&good).as_str()));
    assert_eq!(
        c.deliver(&cfg, got.delivery(1_100), 1_100).0,
        Verdict::Heard
    );
    // A failed poll delivers nothing and is counted.
    p.poll(&mut t, c.etag().as_deref(), 2_000);
    assert_eq!(p.answer(&mut t, 3, Reply::Failed("reset".into())), None);
    assert_eq!(t.errors, 1);
    // A poll that never returns is given up after timeout + interval.
    p.poll(&mut t, None, 3_000);
    assert!(!p.poll(&mut t, None, 3_000 + 1_000 + 1_000));
    assert!(p.poll(&mut t, None, 3_000 + 1_000 + 1_001));
    assert_eq!(t.errors, 2);
}
