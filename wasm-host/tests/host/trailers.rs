//! Request and response trailers after a filter paused to read the body,
//! as Envoy 1.40 delivers them (checked by the differential suite).

use crate::common::module;
use ace_wasm_host::{Error, Request, Response, Route, Vm};

#[test]
fn trailers_release_a_request_held_by_a_headers_pause() -> Result<(), Error> {
    let m = module("ace-example-callback-log");
    let mut vm = Vm::builder(&m)
        .configuration("pause")
        .allow_on_headers_stop_iteration(true)
        .start()?;
    let route = Route::Cluster("backend".into());
    // Over HTTP/2, as the differential suite sends trailers (an HTTP/1
    // client would not get the response's).
    let request = Request::post("/t")
        .http2()
        .body("hello")
        .trailer("x-client-trailer", "c1");
    let ex = vm.exchange(&route, request, |_| {
        Some(
            Response::new(200)
                .body("hello")
                .trailer("x-up-trailer", "t1"),
        )
    })?;
    let up = ex.upstream.unwrap_or_default();
    assert_eq!(up.body, b"hello");
    assert_eq!(up.headers.get("x-at-request-trailers"), Some("1"));
    assert_eq!(up.trailers.get("x-client-trailer"), Some("c1"));
    assert_eq!(up.trailers.get("x-filter-trailer"), Some("1"));
    let r = ex.response.unwrap_or_default();
    assert_eq!(
        r.headers.get("x-request-callbacks"),
        Some("rqh(false) rqb(5,false) rqt(1,0)")
    );
    assert_eq!(r.headers.get("x-at-response-trailers"), Some("1"));
    assert_eq!(r.body, b"hello");
    assert_eq!(
        r.trailers.get("x-response-callbacks"),
        Some("rsh(false,0) rsb(5,false) rst(1,0)")
    );
    Ok(())
}
