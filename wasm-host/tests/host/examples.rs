//! The three example filters, as stories.

use crate::common::module;
use ace_wasm_host::{
    Action, CallResponse, CallResult, Error, MetricValue, Request, Response, Route, Status, Vm,
};

#[test]
fn header_rewrite_rewrites_both_ways() -> Result<(), Error> {
    let m = module("ace-example-header-rewrite");
    let mut vm = Vm::builder(&m).configuration("tests").start()?;
    let mut s = vm.http_stream()?;
    let action = s.send_request_headers(
        [
            (":method", "GET"),
            (":path", "/old/x?q=1"),
            ("x-debug", "1"),
        ],
        true,
    )?;
    assert_eq!(action, Action::Continue);
    assert_eq!(s.request_headers().get(":path"), Some("/new/x?q=1"));
    assert_eq!(s.request_headers().get("x-rewritten-by"), Some("tests"));
    assert!(!s.request_headers().contains("x-debug"));
    assert!(s.route_cache_clears() > 0);
    s.send_response_headers([(":status", "200"), ("x-internal-secret", "s")], true)?;
    assert_eq!(s.response_headers().get("x-powered-by"), Some("proxy-wasm"));
    assert!(!s.response_headers().contains("x-internal-secret"));
    s.finish()?;
    assert!(vm.logged("/old/x?q=1 -> /new/x?q=1"));
    Ok(())
}

#[test]
fn local_auth_replies_401_without_the_token() -> Result<(), Error> {
    let m = module("ace-example-local-auth");
    let mut vm = Vm::builder(&m).configuration("s3cret").start()?;
    let route = Route::Cluster("backend".into());
    let denied = vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
    assert!(
        denied.upstream.is_none(),
        "the upstream must not be reached"
    );
    let reply = denied.response.clone().unwrap_or_default();
    assert_eq!(reply.status(), 401);
    assert_eq!(reply.headers.get("www-authenticate"), Some("Bearer"));
    assert_eq!(reply.headers.get("x-auth-checked"), Some("1"));
    assert_eq!(reply.text(), r#"{"error":"unauthorized"}"#);

    let ok = vm.exchange(
        &route,
        Request::get("/").header("authorization", "Bearer s3cret"),
        |_| Some(Response::new(200).body("hi")),
    )?;
    let up = ok.upstream.unwrap_or_default();
    assert!(!up.headers.contains("authorization"));
    assert_eq!(ok.response.map(|r| r.text()), Some("hi".to_string()));
    assert_eq!(vm.metric("auth_denied"), Some(MetricValue::Counter(1)));
    assert_eq!(vm.metric("auth_allowed"), Some(MetricValue::Counter(1)));
    Ok(())
}

#[test]
fn local_auth_rejects_an_empty_configuration() {
    let m = module("ace-example-local-auth");
    let r = Vm::builder(&m).start();
    assert!(
        matches!(r, Err(Error::Rejected { ref callback }) if callback == "proxy_on_configure"),
        "{r:?}"
    );
}

#[test]
fn http_callout_pauses_until_the_cluster_answers() -> Result<(), Error> {
    let m = module("ace-example-http-callout");
    let mut vm = Vm::builder(&m).cluster("authz").start()?;
    let mut s = vm.http_stream()?;
    let action = s.send_request_headers([(":path", "/"), ("x-user", "ann")], true)?;
    assert_eq!(action, Action::Pause);
    let calls = s.vm().pending_http_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "authz");
    assert_eq!(calls[0].header(":path"), Some("/check?user=ann"));
    let token = calls[0].token;
    s.vm()
        .complete_http_call(token, CallResponse::new(200).body("ann@corp").into())?;
    assert!(!s.request_paused());
    assert_eq!(s.request_resumes(), 1);
    assert_eq!(s.request_headers().get("x-authz-user"), Some("ann@corp"));
    Ok(())
}

#[test]
fn http_callout_maps_denials_and_failures_to_local_replies() -> Result<(), Error> {
    let m = module("ace-example-http-callout");
    let mut vm = Vm::builder(&m)
        .cluster_with("authz", |req| match req.header(":path") {
            Some("/check?user=bob") => CallResult::Reset,
            _ => CallResponse::new(401).into(),
        })
        .start()?;
    let route = Route::Cluster("backend".into());
    let denied = vm.exchange(&route, Request::get("/").header("x-user", "eve"), |_| {
        Some(Response::new(200))
    })?;
    let r = denied.response.unwrap_or_default();
    assert_eq!(
        (r.status(), r.text().as_str()),
        (403, "denied by authz (401)")
    );
    let failed = vm.exchange(&route, Request::get("/").header("x-user", "bob"), |_| {
        Some(Response::new(200))
    })?;
    assert_eq!(failed.response.map(|r| r.status()), Some(503));
    Ok(())
}

#[test]
fn dispatching_to_an_unknown_cluster_is_bad_argument() -> Result<(), Error> {
    // Envoy answers BadArgument; the filter logs it and replies 500.
    let m = module("ace-example-http-callout");
    let mut vm = Vm::builder(&m).configuration("nowhere").start()?;
    let mut s = vm.http_stream()?;
    s.send_request_headers([(":path", "/")], true)?;
    assert_eq!(s.local_response().map(|l| l.status), Some(500));
    assert!(vm.logged(&format!("{:?}", Status::BadArgument)));
    Ok(())
}

#[test]
fn a_scripted_cluster_answers_in_order() -> Result<(), Error> {
    let m = module("ace-example-http-callout");
    let mut vm = Vm::builder(&m)
        .cluster_script(
            "authz",
            vec![
                CallResponse::new(200).body("ann").into(),
                CallResponse::new(503).into(),
            ],
        )
        .start()?;
    let route = Route::Cluster("backend".into());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let ex = vm.exchange(&route, Request::get("/"), |_| Some(Response::new(204)))?;
        statuses.push(ex.response.map(|r| r.status()).unwrap_or(0));
    }
    // 200 lets the request through; 503 is a denial; then the script is
    // exhausted and the call fails (503 "authz unavailable").
    assert_eq!(statuses, vec![204, 403, 503]);
    Ok(())
}

#[test]
fn body_rewrite_sees_the_body_as_envoy_delivers_it() -> Result<(), Error> {
    let m = module("ace-example-body-rewrite");
    let mut vm = Vm::builder(&m)
        .allow_on_headers_stop_iteration(true)
        .start()?;
    let route = Route::Cluster("backend".into());
    let ex = vm.exchange(
        &route,
        Request::post("/").body("hello, buffered world"),
        |_| Some(Response::new(200).body("from upstream")),
    )?;
    // As logged by Envoy 1.40 for the same request: the data, then the end
    // of stream as an empty frame, each seeing the whole buffered body.
    assert!(vm.logged("request body, 21 bytes, end_of_stream=false"));
    assert!(vm.logged("request body, 21 bytes, end_of_stream=true"));
    assert_eq!(
        ex.upstream
            .and_then(|u| u.headers.get("x-body-bytes").map(str::to_string)),
        Some("21".to_string())
    );
    assert_eq!(
        ex.response.map(|r| r.text()),
        Some("from UPSTREAM".to_string())
    );
    Ok(())
}
