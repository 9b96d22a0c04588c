//! ACE's own filter (crate `ace-filter`) on the host.

use crate::common::{ace_config, module};
use ace_wasm_host::{Action, Error, Process, Request, Response, Route, Vm};

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

/// The filter relies on Envoy clearing the route cache when it sets the
/// destination header, which Envoy does for ABI 0.2.1 modules and not for
/// later ones (see `ace_filter`'s module docs). If an SDK upgrade changes
/// the ABI, this fails: then call the `clear_route_cache` foreign function
/// after setting the header.
#[test]
fn filter_speaks_abi_0_2_1() {
    assert_eq!(module("ace-filter").abi_version(), "0.2.1");
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
            .header("x-ace-destination", "cluster_c")
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
const WARMTH: &str = r#"{"allow_no_policy":true,"response_headers":true,"destinations":[
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

/// `owned` takes two requests at a time; `payg` is dear and unlimited.
const TWO_WORKERS: &str = r#"{"allow_no_policy":true,"response_headers":true,"destinations":[
    {"name":"owned","cluster":"c_owned","tier":"inhouse","capacity":2,"knee":1.0,
     "usd_per_input_token":1e-9},
    {"name":"payg","cluster":"c_payg","tier":"payg","usd_per_input_token":1e-5}],
    "health":{"trip_after":1,"base_cooldown_ms":60000}}"#;

/// Opens a request on `vm` and leaves it in flight; returns its stream id
/// and where it was routed.
fn open(vm: &mut Vm) -> Result<(u32, Option<String>), Error> {
    let mut s = vm.http_stream()?;
    s.send_request_headers([(":path", "/v1/chat"), (":method", "POST")], true)?;
    let to = s
        .request_headers()
        .get("x-ace-destination")
        .map(str::to_string);
    Ok((s.id(), to))
}

/// Two workers (VMs of one process, one `vm_id`) see each other's claims
/// and trips. Each worker skips the shared-data read while it knows the
/// entry's CAS value; after the other worker writes, that write fails and
/// the worker reads: it must never decide on the stale copy.
#[test]
fn two_workers_see_each_others_claims_and_trips() -> Result<(), Error> {
    let m = module("ace-filter");
    let process = Process::new();
    let worker = || {
        Vm::builder(&m)
            .process(&process)
            .vm_id("ace")
            .configuration(TWO_WORKERS)
            .start()
    };
    let (mut a, mut b) = (worker()?, worker()?);
    let (a1, to) = open(&mut a)?;
    assert_eq!(to.as_deref(), Some("c_owned"));
    let (_, to) = open(&mut b)?;
    assert_eq!(to.as_deref(), Some("c_owned"), "B read A's claim: 1 of 2");
    // A's copy still shows one request on `owned`; B's claim filled it.
    let (a2, to) = open(&mut a)?;
    assert_eq!(to.as_deref(), Some("c_payg"), "A must see B's claim");
    // A's first request ends in a 503: `owned` trips (trip_after 1).
    let mut s = a.stream(a1)?;
    s.send_response_headers([(":status", "503")], true)?;
    s.finish()?;
    let mut s = a.stream(a2)?;
    s.send_response_headers([(":status", "200")], true)?;
    s.finish()?;
    // B last wrote before the trip; its next request must not use `owned`.
    let (_, to) = open(&mut b)?;
    assert_eq!(to.as_deref(), Some("c_payg"), "B must see A's trip");
    Ok(())
}

/// A worker that alone writes the shared state reads it once, not once
/// per request: its own writes tell it the entry's CAS value.
#[test]
fn a_lone_worker_does_not_read_the_shared_state_per_request() -> Result<(), Error> {
    let m = module("ace-filter");
    let process = Process::new();
    let mut vm = Vm::builder(&m)
        .process(&process)
        .configuration(TWO_WORKERS)
        .start()?;
    let route = Route::ClusterHeader("x-ace-destination".into());
    for _ in 0..20 {
        let ex = vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
        assert_eq!(ex.upstream.map(|u| u.cluster).as_deref(), Some("c_owned"));
    }
    let reads = process.shared_data_reads();
    assert!(reads <= 2, "{reads} shared-data reads for 20 requests");
    Ok(())
}

/// A host that fails any one call, with any status (numbers the ABI does
/// not define included), never kills the filter's VM: every call goes
/// through `ace_filter::host`'s results, not the SDK's wrappers, which
/// panic on a status they do not expect. The filter answers instead
/// (a refused configuration, a 5xx, a missing event line).
#[test]
fn a_failing_host_call_never_traps_the_filter() -> Result<(), String> {
    let m = module("ace-filter");
    let calls = [
        "proxy_log",
        "proxy_get_current_time_nanoseconds",
        "proxy_set_tick_period_milliseconds",
        "proxy_get_buffer_bytes",
        "proxy_get_header_map_pairs",
        "proxy_replace_header_map_value",
        "proxy_set_property",
        "proxy_get_shared_data",
        "proxy_set_shared_data",
        "proxy_send_local_response",
        "proxy_define_metric",
        "proxy_increment_metric",
    ];
    for name in calls {
        for status in [1u32, 2, 3, 8, 10, 12, 99] {
            let at = |e: Error| format!("{name} answering {status}: {e}");
            let failing = m.with_failing_import(name, status).map_err(at)?;
            let mut vm = match Vm::builder(&failing).configuration(ace_config()).start() {
                Ok(vm) => vm,
                // The configuration could not be read: refused, not a trap.
                Err(Error::Rejected { .. }) => continue,
                Err(e) => return Err(at(e)),
            };
            for _ in 0..3 {
                let mut s = vm.http_stream().map_err(at)?;
                s.send_request_headers(
                    [
                        (":path", "/v1/chat"),
                        (":method", "POST"),
                        ("x-request-id", "r-1"),
                    ],
                    true,
                )
                .map_err(at)?;
                s.send_response_headers([(":status", "200")], false)
                    .map_err(at)?;
                s.send_response_body(br#"{"usage":{"prompt_tokens":3}}"#, true)
                    .map_err(at)?;
                s.finish().map_err(at)?;
            }
            // A tick hands the counters over.
            vm.advance(std::time::Duration::from_secs(1)).map_err(at)?;
            if let Some(f) = vm.failure() {
                return Err(format!("{name} answering {status}: the VM failed: {f}"));
            }
        }
    }
    Ok(())
}
