//! Envoy's limits and lifecycle around a filter, without Envoy: buffer
//! limits, callout timeouts on the virtual clock, and the validation VM.
//! The differential suite (`tests/differential/fidelity.rs`) checked each
//! against Envoy 1.40.

use crate::common::module;
use ace_wasm_host::{CallResponse, Error, Request, Response, Route, Vm, DEFAULT_BUFFER_LIMIT};
use std::time::Duration;

fn backend() -> Route {
    Route::Cluster("backend".into())
}

/// The body-rewrite example holds request and response bodies to the end.
fn buffering_vm(limit: Option<u32>) -> Result<Vm, Error> {
    let m = module("ace-example-body-rewrite");
    let b = Vm::builder(&m).allow_on_headers_stop_iteration(true);
    match limit {
        Some(l) => b.per_connection_buffer_limit_bytes(l),
        None => b,
    }
    .start()
}

#[test]
fn a_held_request_over_the_limit_gets_a_local_413() -> Result<(), Error> {
    let mut vm = buffering_vm(None)?;
    let limit = DEFAULT_BUFFER_LIMIT as usize;
    let fits = vm.exchange(
        &backend(),
        Request::post("/").body(vec![b'a'; limit]),
        |_| Some(Response::new(200)),
    )?;
    let sent = fits.upstream.map(|u| u.body.len());
    assert_eq!(sent, Some(limit), "exactly the limit passes");
    let over = vm.exchange(
        &backend(),
        Request::post("/").body(vec![b'a'; limit + 1]),
        |_| Some(Response::new(200)),
    )?;
    assert!(over.upstream.is_none());
    let r = over.response.unwrap_or_default();
    assert_eq!((r.status(), r.text().as_str()), (413, "Payload Too Large"));
    assert_eq!(
        over.local_reply.map(|l| l.details),
        Some("request_payload_too_large".into())
    );
    Ok(())
}

#[test]
fn the_listener_limit_is_configurable() -> Result<(), Error> {
    let mut vm = buffering_vm(Some(100))?;
    let ex = vm.exchange(&backend(), Request::post("/").body(vec![b'a'; 101]), |_| {
        Some(Response::new(200))
    })?;
    assert_eq!(ex.response.map(|r| r.status()), Some(413));
    let mut unlimited = buffering_vm(Some(0))?;
    let body = vec![b'a'; 3 * DEFAULT_BUFFER_LIMIT as usize];
    let ex = unlimited.exchange(&backend(), Request::post("/").body(body), |_| {
        Some(Response::new(200))
    })?;
    assert_eq!(ex.response.map(|r| r.status()), Some(200), "0 is no limit");
    Ok(())
}

#[test]
fn a_held_response_over_the_limit_is_reset_after_its_headers() -> Result<(), Error> {
    let mut vm = buffering_vm(None)?;
    let big = vec![b'a'; DEFAULT_BUFFER_LIMIT as usize * 9 / 4];
    let ex = vm.exchange(&backend(), Request::get("/"), |_| {
        Some(Response::new(200).body(big.clone()))
    })?;
    assert!(ex.reset && ex.response.is_none(), "{ex:?}");
    let headers = ex.headers_before_reset.unwrap_or_default();
    assert_eq!(headers.get(":status"), Some("200"));
    let fits = vec![b'a'; DEFAULT_BUFFER_LIMIT as usize];
    let ex = vm.exchange(&backend(), Request::get("/"), |_| {
        Some(Response::new(200).body(fits.clone()))
    })?;
    assert_eq!(ex.response.map(|r| r.body.len()), Some(fits.len()));
    Ok(())
}

#[test]
fn a_response_over_the_limit_with_its_headers_held_gets_a_500() -> Result<(), Error> {
    let mut vm = Vm::builder(&module("ace-example-callback-log"))
        .configuration("pause")
        .allow_on_headers_stop_iteration(true)
        .start()?;
    let big = vec![b'a'; DEFAULT_BUFFER_LIMIT as usize + 1];
    let ex = vm.exchange(&backend(), Request::get("/"), |_| {
        Some(Response::new(200).body(big.clone()))
    })?;
    let r = ex.response.unwrap_or_default();
    assert_eq!(
        (r.status(), r.text().as_str()),
        (500, "Internal Server Error")
    );
    Ok(())
}

#[test]
fn a_callout_times_out_on_the_virtual_clock_with_envoys_504() -> Result<(), Error> {
    let mut vm = Vm::builder(&module("ace-example-http-callout"))
        .configuration("authz 1000")
        .cluster("authz")
        .start()?;
    let mut s = vm.http_stream()?;
    s.send_request_headers([(":path", "/"), ("x-user", "ann")], true)?;
    s.vm().advance(Duration::from_millis(999))?;
    assert_eq!(s.vm().pending_http_calls().len(), 1, "not yet");
    s.vm().advance(Duration::from_millis(1))?;
    assert!(s.vm().pending_http_calls().is_empty());
    let reply = s.local_response().cloned();
    assert_eq!(
        reply.map(|l| (l.status, l.body)),
        Some((403, b"denied by authz (504)".to_vec()))
    );
    Ok(())
}

#[test]
fn an_exchange_waits_for_a_slow_cluster_or_its_timeout() -> Result<(), Error> {
    let mut vm = Vm::builder(&module("ace-example-http-callout"))
        .configuration("authz 1000")
        .cluster_with("authz", |_| CallResponse::new(200).body("ann").into())
        .cluster_latency("authz", Duration::from_millis(1500))
        .start()?;
    let t0 = vm.now();
    let ex = vm.exchange(
        &backend(),
        Request::get("/").header("x-user", "ann"),
        |_| Some(Response::new(200)),
    )?;
    assert_eq!(
        ex.response.map(|r| r.status()),
        Some(403),
        "the timeout came first"
    );
    assert_eq!(
        vm.now().duration_since(t0).ok(),
        Some(Duration::from_secs(1))
    );
    vm.process()
        .set_cluster_latency("authz", Duration::from_millis(500));
    let ex = vm.exchange(
        &backend(),
        Request::get("/").header("x-user", "ann"),
        |_| Some(Response::new(200)),
    )?;
    let up = ex.upstream.unwrap_or_default();
    assert_eq!(up.headers.get("x-authz-user"), Some("ann"));
    assert_eq!(
        vm.now().duration_since(t0).ok(),
        Some(Duration::from_millis(1500))
    );
    // The answer that lost to the timeout never arrives.
    vm.advance(Duration::from_secs(5))?;
    Ok(())
}

#[test]
fn a_validation_vm_configures_first_and_is_dropped() -> Result<(), Error> {
    let m = module("ace-example-header-rewrite");
    let vm = Vm::builder(&m).configuration("x").start()?;
    let stamped = |logs: &[ace_wasm_host::LogEntry]| {
        logs.iter()
            .filter(|l| l.message.contains("header-rewrite: stamping x"))
            .count()
    };
    assert_eq!(stamped(vm.validation_logs()), 1);
    assert_eq!(stamped(vm.logs()), 1);
    let worker = Vm::builder(&m)
        .process(vm.process())
        .configuration("x")
        .validation_vm(false)
        .start()?;
    assert!(worker.validation_logs().is_empty());
    Ok(())
}
