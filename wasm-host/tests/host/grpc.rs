//! gRPC calls and streams on the host alone: a cluster answered by hand,
//! timeouts on the virtual clock, and statuses for tokens that are not
//! open (the differential suite checks the same against Envoy).

use crate::common::module;
use ace_wasm_host::{Error, GrpcEvent, GrpcReply, Headers, Request, Route, Vm};
use std::time::Duration;

fn route() -> Route {
    Route::Cluster("backend".into())
}

#[test]
fn a_call_answered_by_hand_resumes_with_its_message() -> Result<(), Error> {
    let m = module("ace-example-grpc-callout");
    let mut vm = Vm::builder(&m).grpc_cluster("grpc").start()?;
    let mut s = vm.http_stream()?;
    s.send_request_headers(Request::get("/call").headers, true)?;
    assert!(s.request_paused());
    let id = s.id();
    let calls = vm.grpc_calls();
    let [(req, sent)] = calls.as_slice() else {
        panic!("one call open, got {calls:?}");
    };
    assert_eq!(
        (req.token, req.service.as_str(), req.method.as_str()),
        (5, "test.Echo", "Say")
    );
    assert_eq!(req.headers.get(":path"), Some("/test.Echo/Say"));
    assert_eq!(req.headers.get("x-meta"), Some("m1"));
    assert_eq!(req.headers.get("grpc-timeout"), Some("5000m"));
    assert_eq!(
        sent,
        &vec![
            GrpcEvent::Open,
            GrpcEvent::Message(b"hello".to_vec()),
            GrpcEvent::HalfClose
        ]
    );
    let token = req.token;
    vm.reply_grpc(
        token,
        vec![
            GrpcReply::InitialMetadata(Headers::new()),
            GrpcReply::Message(b"hi back".to_vec()),
            GrpcReply::Close {
                status: 0,
                message: String::new(),
                trailing_metadata: Headers::new(),
            },
        ],
    )?;
    let s = vm.stream(id)?;
    let reply = s
        .local_response()
        .cloned()
        .unwrap_or_else(|| panic!("no reply"));
    assert_eq!(reply.status, 200);
    assert_eq!(
        String::from_utf8_lossy(&reply.body),
        "call response: status 0, 7 bytes\nmessage: hi back"
    );
    assert!(vm.grpc_calls().is_empty(), "the call is over");
    assert!(vm.reply_grpc(token, vec![GrpcReply::Reset]).is_err());
    Ok(())
}

#[test]
fn a_call_times_out_on_the_virtual_clock_as_in_envoy() -> Result<(), Error> {
    let m = module("ace-example-grpc-callout");
    let mut vm = Vm::builder(&m).grpc_cluster("grpc").start()?;
    // The exchange moves the clock to the deadline: nothing answers.
    let req = Request::get("/call").header("x-grpc-timeout-ms", "250");
    let ex = vm.exchange(&route(), req, |_| None)?;
    let r = ex.response.unwrap_or_default();
    assert_eq!(r.headers.get("x-grpc-status"), Some("14"));
    assert_eq!(
        r.headers.get("x-grpc-message"),
        Some("upstream request timeout{response_timeout}")
    );
    assert!(ex.upstream.is_none());
    Ok(())
}

#[test]
fn an_unknown_grpc_cluster_is_a_parse_failure() -> Result<(), Error> {
    let m = module("ace-example-grpc-callout");
    let mut vm = Vm::builder(&m).start()?;
    let ex = vm.exchange(&route(), Request::get("/call"), |_| None)?;
    let r = ex.response.unwrap_or_default();
    assert_eq!(r.status(), 500);
    assert_eq!(r.text(), "dispatch failed: ParseFailure");
    Ok(())
}

#[test]
fn a_stream_gets_every_callback_in_order() -> Result<(), Error> {
    let m = module("ace-example-grpc-callout");
    let mut vm = Vm::builder(&m)
        .grpc_cluster_with("grpc", |_, event| match event {
            GrpcEvent::Open => vec![GrpcReply::InitialMetadata(Headers::from_pairs(&[(
                "x-a", "1",
            )]))],
            GrpcEvent::Message(m) => vec![GrpcReply::Message(m.to_ascii_uppercase())],
            GrpcEvent::HalfClose => vec![GrpcReply::Close {
                status: 3,
                message: "bad".into(),
                trailing_metadata: Headers::new(),
            }],
        })
        .start()?;
    let req = Request::get("/s")
        .header("x-grpc-mode", "stream")
        .header("x-grpc-message", "a,b");
    let ex = vm.exchange(&route(), req, |_| None)?;
    let r = ex.response.unwrap_or_default();
    assert_eq!(r.headers.get("x-grpc-status"), Some("3"));
    assert_eq!(r.headers.get("x-grpc-message"), Some("bad{via_upstream}"));
    assert_eq!(
        r.text(),
        "send a: Ok(())\nsend b: Ok(())\nclose_grpc_stream: Ok(())\n\
         initial metadata (4): :status=200;content-type=application/grpc;x-a=1;x-envoy-upstream-service-time=<ms>\n\
         message (1): A\nmessage (1): B\n\
         trailing metadata (2): grpc-status=3;grpc-message=bad\nclose: status 3"
    );
    Ok(())
}

#[test]
fn cancelled_calls_are_gone_and_a_stream_token_is_checked() -> Result<(), Error> {
    let m = module("ace-example-grpc-callout");
    let mut vm = Vm::builder(&m).grpc_cluster("grpc").start()?;
    let req = Request::get("/c").header("x-grpc-mode", "cancel");
    let ex = vm.exchange(&route(), req, |_| Some(ace_wasm_host::Response::new(200)))?;
    let up = ex.upstream.unwrap_or_default();
    assert_eq!(up.headers.get("x-grpc-cancel"), Some("Ok(())"));
    assert_eq!(up.headers.get("x-grpc-cancel-again"), Some("Err(NotFound)"));
    assert!(vm.grpc_calls().is_empty());
    vm.advance(Duration::from_secs(10))?;
    assert!(vm.failure().is_none());
    Ok(())
}
