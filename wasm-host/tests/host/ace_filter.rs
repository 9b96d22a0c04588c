//! ACE's own filter (crate `ace-filter`) on the host.

use crate::common::{ace_config, module};
use ace_wasm_host::{Action, Error, Request, Response, Route, Vm};

#[test]
fn routes_to_the_cheapest_destination() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(ace_config()).start()?;
    let mut s = vm.http_stream()?;
    let action = s.send_request_headers([(":path", "/v1/chat"), (":method", "POST")], false)?;
    assert_eq!(action, Action::Continue);
    assert_eq!(
        s.request_headers().get("x-ace-destination"),
        Some("cluster_b")
    );
    assert!(s.route_cache_clears() > 0);
    s.send_response_headers([(":status", "200")], true)?;
    assert_eq!(s.response_headers().get("x-ace-destination"), Some("gpu-b"));
    assert!(s.response_headers().contains("x-ace-reason"));
    s.finish()?;
    assert!(vm.logged("configured 2 destinations"));
    Ok(())
}

#[test]
fn clients_cannot_choose_the_destination() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(ace_config()).start()?;
    let route = Route::ClusterHeader("x-ace-destination".into());
    let ex = vm.exchange(
        &route,
        Request::post("/v1/chat")
            .header("x-ace-destination", "cluster_a")
            .body("{}"),
        |up| Some(Response::new(200).body(up.cluster.clone())),
    )?;
    let up = ex.upstream.unwrap_or_default();
    assert_eq!(up.cluster, "cluster_b");
    assert_eq!(up.headers.get_all("x-ace-destination"), vec!["cluster_b"]);
    assert_eq!(up.body, b"{}");
    let r = ex.response.unwrap_or_default();
    assert_eq!(r.text(), "cluster_b");
    assert_eq!(r.headers.get("x-ace-destination"), Some("gpu-b"));
    Ok(())
}

#[test]
fn a_bad_configuration_is_rejected_with_the_field_named() {
    let m = module("ace-filter");
    let r = Vm::builder(&m)
        .configuration(r#"{"destinations":[{"name":"a","cluster":"c","price_usd":-1}]}"#)
        .start();
    assert!(matches!(r, Err(Error::Rejected { .. })), "{r:?}");
}

#[test]
fn the_last_good_configuration_survives_a_bad_update() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(ace_config()).start()?;
    let r = vm.reconfigure("{");
    assert!(matches!(r, Err(Error::Rejected { .. })), "{r:?}");
    assert!(vm.logged("invalid ACE plugin configuration"));
    let route = Route::ClusterHeader("x-ace-destination".into());
    let ex = vm.exchange(&route, Request::get("/"), |_| Some(Response::new(204)))?;
    assert_eq!(
        ex.upstream.map(|u| u.cluster),
        Some("cluster_b".to_string())
    );
    Ok(())
}

#[test]
fn many_requests_do_not_grow_memory_without_bound() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(ace_config()).start()?;
    let route = Route::ClusterHeader("x-ace-destination".into());
    for _ in 0..50 {
        vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
    }
    let after_warmup = vm.memory_size();
    for _ in 0..500 {
        vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
    }
    assert_eq!(vm.memory_size(), after_warmup, "linear memory grew");
    Ok(())
}

/// Two in-house destinations; `cheap` is cheaper per token but has only
/// `m1` resident and a cold load that costs more than the difference.
const WARMTH: &str = r#"{"response_headers":true,"destinations":[
    {"name":"cheap","cluster":"c_cheap","tier":"inhouse","capacity":10,
     "usd_per_input_token":1e-9,"cold_load_usd":0.5,"warm_models":["m1"]},
    {"name":"dear","cluster":"c_dear","tier":"inhouse","capacity":10,
     "usd_per_input_token":1e-6}]}"#;

fn routed_to(vm: &mut Vm, headers: &[(&str, &[u8])]) -> Result<Option<String>, Error> {
    let mut s = vm.http_stream()?;
    let mut all: Vec<(&str, &[u8])> = vec![(":path", b"/v1/chat"), (":method", b"POST")];
    all.extend_from_slice(headers);
    s.send_request_headers(all.into_iter().collect::<ace_wasm_host::Headers>(), true)?;
    let to = s
        .request_headers()
        .get("x-ace-destination")
        .map(str::to_string);
    s.send_response_headers([(":status", "200")], true)?;
    s.finish()?;
    Ok(to)
}

#[test]
fn a_cold_model_pays_its_load_and_a_warm_one_does_not() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(WARMTH).start()?;
    let warm = routed_to(&mut vm, &[("x-ace-model", b"m1")])?;
    assert_eq!(warm.as_deref(), Some("c_cheap"));
    let cold = routed_to(&mut vm, &[("x-ace-model", b"m2")])?;
    assert_eq!(cold.as_deref(), Some("c_dear"), "m2 is cold on `cheap`");
    // No model named: no cold load can be attributed.
    assert_eq!(routed_to(&mut vm, &[])?.as_deref(), Some("c_cheap"));
    Ok(())
}

#[test]
fn a_header_that_is_not_utf8_is_an_unknown_value_not_a_trap() -> Result<(), Error> {
    let m = module("ace-filter");
    let mut vm = Vm::builder(&m).configuration(WARMTH).start()?;
    let to = routed_to(
        &mut vm,
        &[("x-ace-model", b"m1\xff\xfe"), ("x-ace-tenant", b"\xc3")],
    )?;
    // The model matches no warm list, so `cheap` is cold.
    assert_eq!(to.as_deref(), Some("c_dear"));
    // The VM is still alive.
    assert_eq!(
        routed_to(&mut vm, &[("x-ace-model", b"m1")])?.as_deref(),
        Some("c_cheap")
    );
    Ok(())
}
