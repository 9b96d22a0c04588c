//! ACE's Wasm filter polling the control service (`ace control serve`)
//! through an Envoy cluster: several workers of one Envoy, one poll per
//! interval, and what a snapshot may and may not change.

use crate::common::module;
use ace_snapshot::{Drain, DrainReason, Price, Report, Snapshot};
use ace_wasm_host::{
    CallResponse, CallResult, Error, MetricValue, Process, Request, Response, Route, Vm,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Two destinations: `owned` (cheap while it has room) and `api`; the
/// control service at cluster `ace_control`, polled every second.
const CONFIG: &str = r#"{"allow_no_policy":true,
    "control":{"cluster":"ace_control","token":"s3cret","interval_ms":1000,"stale_after_ms":3000},
    "destinations":[
    {"name":"owned","cluster":"c_owned","tier":"inhouse","capacity":100,
     "usd_per_input_token":1e-9,"usd_per_output_token":1e-9},
    {"name":"api","cluster":"c_api","tier":"payg",
     "usd_per_input_token":1e-6,"usd_per_output_token":1e-6}]}"#;

/// The fake control service: the snapshot it serves (or a failure) and
/// the polls it saw.
#[derive(Default)]
struct Service {
    snapshot: Option<Snapshot>,
    fail: bool,
    polls: u32,
    full: u32,
    /// Answer every poll "not modified", as a service with nothing to
    /// say yet may.
    not_modified_only: bool,
    authorized: bool,
}

type Shared = Arc<Mutex<Service>>;

fn answer(service: &Shared, call: &ace_wasm_host::CallRequest) -> CallResult {
    let mut s = service.lock().unwrap();
    s.polls += 1;
    s.authorized = call.header("authorization") == Some("Bearer s3cret");
    if s.fail {
        return CallResult::Reset;
    }
    if s.not_modified_only {
        return CallResponse::new(304).into();
    }
    let Some(snapshot) = &s.snapshot else {
        return CallResponse::new(503).into();
    };
    let bytes = ace_snapshot::encode(snapshot).unwrap();
    let etag = ace_snapshot::etag(&bytes).unwrap();
    if call.header("if-none-match") == Some(etag.as_str()) {
        return CallResponse::new(304).header("etag", &etag).into();
    }
    s.full += 1;
    CallResponse::new(200)
        .header("etag", &etag)
        .body(bytes)
        .into()
}

fn start(process: &Process, service: &Shared, clock: SystemTime) -> Result<Vm, Error> {
    let s = service.clone();
    Vm::builder(&module("ace-filter"))
        .process(process)
        .vm_id("ace")
        .clock(clock)
        .cluster_with("ace_control", move |call| answer(&s, call))
        .configuration(CONFIG)
        .start()
}

/// Where the next request goes, or the refusal's status.
fn route(vm: &mut Vm) -> Result<String, Error> {
    let r = Route::ClusterHeader("x-ace-destination".into());
    let ex = vm.exchange(&r, Request::post("/v1/chat").body("{}"), |_| {
        Some(Response::new(200))
    })?;
    Ok(match ex.upstream {
        Some(u) => u.cluster,
        None => format!("refused {}", ex.response.map_or(0, |r| r.status())),
    })
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn gauge(process: &Process, name: &str) -> Option<i64> {
    match process.metric(name)? {
        MetricValue::Gauge(v) => Some(v),
        _ => None,
    }
}

fn report(name: &str) -> Report {
    Report {
        name: name.to_string(),
        ..Report::default()
    }
}

/// Snapshot `version` with `reports`, as the service serves it.
fn snapshot(version: u64, reports: Vec<Report>) -> Snapshot {
    Snapshot {
        version,
        generated_ms: 0,
        reports,
        budgets: Vec::new(),
    }
}

#[test]
fn one_poll_per_interval_however_many_workers() -> Result<(), Error> {
    let clock = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let service: Shared = Arc::default();
    service.lock().unwrap().snapshot = Some(snapshot(1, vec![report("owned")]));
    let process = Process::new();
    let mut workers = [
        start(&process, &service, clock)?,
        start(&process, &service, clock)?,
        start(&process, &service, clock)?,
    ];
    // Ten seconds, every worker ticking (each at 500 ms).
    for _ in 0..100 {
        for w in &mut workers {
            w.advance(Duration::from_millis(100))?;
        }
    }
    let s = service.lock().unwrap();
    assert_eq!(s.polls, 10, "one poll per second per Envoy, not per worker");
    assert_eq!(s.full, 1, "the unchanged snapshot came back as 304s");
    assert!(s.authorized, "the token went as a bearer credential");
    assert_eq!(process.metric_value("ace.control.polls"), Some(10));
    assert_eq!(gauge(&process, "ace.control.stale"), Some(0));
    Ok(())
}

/// A service that answers "not modified" for the snapshot in force is
/// alive for every worker, not only the one whose poll it answered; one
/// that has never sent a snapshot is not heard by a 304 (the rules in
/// `ace_flow::control`), so it goes stale like a silent one.
#[test]
fn not_modified_for_the_snapshot_in_force_keeps_every_worker_fresh() -> Result<(), Error> {
    let clock = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let service: Shared = Arc::default();
    service.lock().unwrap().snapshot = Some(snapshot(1, vec![report("owned")]));
    let process = Process::new();
    let mut workers = [
        start(&process, &service, clock)?,
        start(&process, &service, clock)?,
    ];
    for _ in 0..20 {
        for w in &mut workers {
            w.advance(Duration::from_millis(100))?;
        }
    }
    assert_eq!(service.lock().unwrap().full, 1, "the snapshot was taken");
    // From now on every answer is a bare 304 (no ETag header): unchanged
    // for the ETag the poll sent, which is the snapshot in force.
    service.lock().unwrap().not_modified_only = true;
    for _ in 0..200 {
        for w in &mut workers {
            w.advance(Duration::from_millis(100))?;
        }
    }
    assert!(service.lock().unwrap().polls >= 19, "polled throughout");
    for w in &workers {
        let stale: Vec<_> = w
            .logs()
            .iter()
            .filter(|l| l.message.contains("stale"))
            .collect();
        assert!(stale.is_empty(), "{stale:?}");
    }
    assert_eq!(gauge(&process, "ace.control.stale"), Some(0));
    Ok(())
}

#[test]
fn not_modified_before_any_snapshot_is_not_hearing() -> Result<(), Error> {
    let clock = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let service: Shared = Arc::default();
    service.lock().unwrap().not_modified_only = true;
    let process = Process::new();
    let mut workers = [
        start(&process, &service, clock)?,
        start(&process, &service, clock)?,
    ];
    for _ in 0..50 {
        for w in &mut workers {
            w.advance(Duration::from_millis(100))?;
        }
    }
    assert!(service.lock().unwrap().polls >= 4, "polled throughout");
    for w in &workers {
        let stale = w
            .logs()
            .iter()
            .filter(|l| l.message.contains("stale"))
            .count();
        assert_eq!(stale, 1, "each worker says once that it heard nothing");
    }
    assert_eq!(gauge(&process, "ace.control.stale"), Some(1));
    // Traffic still flows on the configuration alone.
    assert_eq!(route(&mut workers[0])?, "c_owned");
    Ok(())
}

#[test]
fn a_drain_and_a_price_move_traffic_and_nothing_else_can() -> Result<(), Error> {
    let clock = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let service: Shared = Arc::default();
    let process = Process::new();
    let mut a = start(&process, &service, clock)?;
    let mut b = start(&process, &service, clock)?;
    assert_eq!(route(&mut a)?, "c_owned");
    let set = |reports: Vec<Report>, version: u64| {
        service.lock().unwrap().snapshot = Some(snapshot(version, reports))
    };
    let step = |a: &mut Vm, b: &mut Vm| -> Result<(), Error> {
        for _ in 0..2 {
            a.advance(Duration::from_millis(1000))?;
            b.advance(Duration::from_millis(1000))?;
        }
        Ok(())
    };
    // An eviction notice on the owned pool: both workers drain it within
    // two intervals.
    let mut owned = report("owned");
    owned.drain = Some(Drain {
        until_ms: ms(clock) + 60_000,
        reason: DrainReason::Eviction,
    });
    set(vec![owned], 1);
    step(&mut a, &mut b)?;
    assert_eq!(route(&mut a)?, "c_api");
    assert_eq!(route(&mut b)?, "c_api");
    // Lifted, and the API's price cut below the owned pool's.
    let mut api = report("api");
    api.price = Some(Price {
        usd_per_input_token: 1e-12,
        usd_per_output_token: 1e-12,
    });
    set(vec![report("owned"), api.clone()], 2);
    step(&mut a, &mut b)?;
    assert_eq!(route(&mut a)?, "c_api", "the cheaper price wins");
    // A snapshot naming a destination this configuration lacks (priced at
    // zero, to tempt) is rejected whole: the last good one stays.
    let mut secret = report("eu-secret");
    secret.price = Some(Price::default());
    set(vec![report("owned"), secret], 3);
    step(&mut a, &mut b)?;
    assert_eq!(route(&mut a)?, "c_api", "version 2 still in force");
    assert_eq!(route(&mut b)?, "c_api");
    assert!(
        a.logged("eu-secret") || b.logged("eu-secret"),
        "the rejection names the destination"
    );
    // Back to configured prices.
    set(vec![report("owned")], 4);
    step(&mut a, &mut b)?;
    assert_eq!(route(&mut a)?, "c_owned");
    assert_eq!(route(&mut b)?, "c_owned");
    Ok(())
}

#[test]
fn losing_the_service_keeps_traffic_flowing_and_marks_the_snapshot_stale() -> Result<(), Error> {
    let clock = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let service: Shared = Arc::default();
    let mut owned = report("owned");
    owned.drain = Some(Drain {
        until_ms: ms(clock) + 3_600_000,
        reason: DrainReason::Operator,
    });
    service.lock().unwrap().snapshot = Some(snapshot(1, vec![owned]));
    let process = Process::new();
    let mut vm = start(&process, &service, clock)?;
    vm.advance(Duration::from_secs(2))?;
    assert_eq!(route(&mut vm)?, "c_api");
    service.lock().unwrap().fail = true;
    vm.advance(Duration::from_secs(2))?;
    assert_eq!(gauge(&process, "ace.control.stale"), Some(0));
    vm.advance(Duration::from_secs(3))?;
    assert_eq!(gauge(&process, "ace.control.stale"), Some(1));
    assert!(gauge(&process, "ace.control.age_ms").unwrap_or(0) > 3000);
    assert!(vm.logged("stale"));
    assert_eq!(route(&mut vm)?, "c_api", "the last snapshot's drain holds");
    // The service comes back: picked up with no restart.
    service.lock().unwrap().fail = false;
    vm.advance(Duration::from_secs(2))?;
    assert_eq!(gauge(&process, "ace.control.stale"), Some(0));
    assert!(gauge(&process, "ace.control.age_ms").unwrap_or(i64::MAX) < 1500);
    Ok(())
}

#[test]
fn a_refused_poll_names_the_fix_once() -> Result<(), Error> {
    let process = Process::new();
    let mut vm = Vm::builder(&module("ace-filter"))
        .process(&process)
        .cluster_with("ace_control", |_| CallResponse::new(401).into())
        .configuration(CONFIG)
        .start()?;
    vm.advance(Duration::from_secs(5))?;
    let lines = vm
        .logs()
        .iter()
        .filter(|l| l.message.contains("control.token"))
        .count();
    assert_eq!(lines, 1, "logged once, not once per poll");
    assert!(process.metric_value("ace.control.errors").unwrap_or(0) >= 4);
    assert_eq!(
        route(&mut vm)?,
        "c_owned",
        "traffic flows on the configuration"
    );
    Ok(())
}
