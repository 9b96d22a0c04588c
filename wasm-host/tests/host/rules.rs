//! Envoy's availability rules and statuses, probed by a hand-written guest.
//!
//! The guest reports `<tag><status>` log lines, so each assertion names one
//! host call in one phase and the status Envoy gives there.

use ace_wasm_host::{Error, FilterModule, Vm};

/// `$report(tag, status)` logs two characters: the tag and `'0' + status`.
const PROBE: &str = r#"(module
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_property" (func $setprop (param i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_buffer_bytes" (func $setbuf (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
    (import "env" "proxy_define_metric" (func $def (param i32 i32 i32 i32) (result i32)))
    (data (i32.const 0) ":path")
    (data (i32.const 8) "x-new")
    (data (i32.const 16) "v")
    (data (i32.const 24) "nope")
    (data (i32.const 32) "plugin_name")
    (data (i32.const 48) "request\00path")
    (data (i32.const 64) "decision")
    (data (i32.const 80) "XY")
    (data (i32.const 88) "hits")
    (global $metric (mut i32) (i32.const 0))
    ;; ABI_AND_ALLOCATOR
    (func $report (param $tag i32) (param $st i32)
        (i32.store8 (i32.const 200) (local.get $tag))
        (i32.store8 (i32.const 201) (i32.add (i32.const 48) (local.get $st)))
        (drop (call $log (i32.const 2) (i32.const 200) (i32.const 2))))
    ;; logs the value the last call returned through (300, 304)
    (func $echo
        (drop (call $log (i32.const 2) (i32.load (i32.const 300)) (i32.load (i32.const 304)))))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32)
        ;; root context: no stream, so set_property is NotFound (1)
        (call $report (i32.const 82) (call $setprop (i32.const 64) (i32.const 8) (i32.const 80) (i32.const 2)))
        ;; a counter cannot be incremented by 0: BadArgument (2)
        (drop (call $def (i32.const 0) (i32.const 88) (i32.const 4) (i32.const 308)))
        (global.set $metric (i32.load (i32.const 308)))
        (call $report (i32.const 90) (call $inc (global.get $metric) (i64.const 0)))
        (call $report (i32.const 89) (call $inc (global.get $metric) (i64.const 2)))
        (call $report (i32.const 80) (call $prop (i32.const 32) (i32.const 11) (i32.const 300) (i32.const 304)))
        (call $echo)
        i32.const 1)
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (call $report (i32.const 65) (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 66) (call $add (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        (call $report (i32.const 67) (call $get (i32.const 0) (i32.const 24) (i32.const 4) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 81) (call $prop (i32.const 48) (i32.const 12) (i32.const 300) (i32.const 304)))
        (call $echo)
        (call $report (i32.const 83) (call $setprop (i32.const 64) (i32.const 8) (i32.const 80) (i32.const 2)))
        i32.const 0)
    (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32)
        ;; headers continued: single get and add are BadArgument, pairs Ok-empty
        (call $report (i32.const 68) (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 69) (call $add (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        (i32.store (i32.const 304) (i32.const 99))
        (call $report (i32.const 70) (call $pairs (i32.const 0) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 71) (i32.load (i32.const 304)))
        ;; the body: readable; replacing a middle slice is BadArgument
        (call $report (i32.const 72) (call $buf (i32.const 0) (i32.const 0) (i32.const 100) (i32.const 300) (i32.const 304)))
        (call $echo)
        (call $report (i32.const 73) (call $setbuf (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 80) (i32.const 2)))
        (call $report (i32.const 74) (call $setbuf (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 80) (i32.const 2)))
        ;; the plugin configuration is only readable in on_configure
        (call $report (i32.const 75) (call $buf (i32.const 7) (i32.const 0) (i32.const 100) (i32.const 300) (i32.const 304)))
        i32.const 0)
    (func (export "proxy_on_log") (param i32)
        ;; access-log phase: readable, missing is NotFound, writes BadArgument
        (call $report (i32.const 76) (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 77) (call $get (i32.const 0) (i32.const 24) (i32.const 4) (i32.const 300) (i32.const 304)))
        (call $report (i32.const 78) (call $add (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1))))
)"#;

/// Compiles one of the guests below, with the shared prelude spliced in.
fn load(guest: &str) -> Result<FilterModule, Error> {
    FilterModule::from_bytes(crate::common::wat_guest(guest).as_bytes())
}

fn lines(vm: &Vm) -> Vec<String> {
    vm.logs().iter().map(|l| l.message.clone()).collect()
}

#[test]
fn header_maps_follow_envoys_availability_rules() -> Result<(), Error> {
    let m = load(PROBE)?;
    // One VM's statuses: without the validation VM, whose counter
    // increments would count in the process-wide metric too.
    let mut vm = Vm::builder(&m)
        .plugin_name("probe")
        .validation_vm(false)
        .start()?;
    let root_logs = lines(&vm);
    // set_property on the root: NotFound; counter +0: BadArgument; +2: Ok.
    for want in ["R1", "Z2", "Y0", "P0", "probe"] {
        assert!(
            root_logs.contains(&want.to_string()),
            "{want} in {root_logs:?}"
        );
    }
    assert_eq!(vm.process().metric_value("hits"), Some(2));

    let mut s = vm.http_stream()?;
    s.send_request_headers([(":path", "/a?b"), (":method", "POST")], false)?;
    s.send_request_body("hello", true)?;
    assert_eq!(s.filter_state(&["decision"]), Some(&b"XY"[..]));
    assert_eq!(s.request_headers().get("x-new"), Some("v"));
    assert_eq!(s.forwarded_request_body(), b"XYello");
    s.finish()?;
    let got = lines(&vm);
    let want = [
        "A0", "B0", "C1", // in on_request_headers: Ok, Ok, NotFound
        "Q0", "/a?b", "S0", // request.path; set_property on a stream
        "D2", "E2", "F0", "G0", // after Continue: BadArgument x2, pairs Ok and empty
        "H0", "hello", "I2", "J0", // body readable; mid-slice edit refused; prefix replace ok
        "K1", // plugin configuration outside on_configure: NotFound
        "L0", "M1", "N2", // on_log: readable, NotFound, read-only
    ];
    for w in want {
        assert!(got.contains(&w.to_string()), "{w} missing from {got:?}");
    }
    Ok(())
}

/// Logs `xds.cluster_name`, `response.code_details` and `plugin_root_id`
/// in `on_response_headers`.
const ROUTED: &str = r#"(module
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
        (data (i32.const 0) "xds\00cluster_name")
    (data (i32.const 32) "response\00code_details")
    (data (i32.const 64) "plugin_root_id")
    ;; ABI_AND_ALLOCATOR
    (func $show (param $path i32) (param $len i32)
        (if (i32.eqz (call $prop (local.get $path) (local.get $len) (i32.const 300) (i32.const 304)))
            (then (drop (call $log (i32.const 2) (i32.load (i32.const 300)) (i32.load (i32.const 304)))))))
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
        (call $show (i32.const 0) (i32.const 16))
        (call $show (i32.const 32) (i32.const 21))
        (call $show (i32.const 64) (i32.const 14))
        i32.const 0))"#;

#[test]
fn properties_report_the_route_and_the_plugin() -> Result<(), Error> {
    use ace_wasm_host::{Request, Response, Route};
    let m = load(ROUTED)?;
    let mut vm = Vm::builder(&m).root_id("my-root").start()?;
    let route = Route::Cluster("pool-1".into());
    vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
    for want in ["pool-1", "via_upstream", "my-root"] {
        assert!(vm.logged(want), "{want} in {:?}", lines(&vm));
    }
    Ok(())
}

/// Rewrites request trailer `x-t` to `2`, and reports (as `T<status>`) a
/// get of request trailer `x-t` from `on_response_headers`, where Envoy no
/// longer offers the request trailers.
const TRAILERS: &str = r#"(module
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (import "env" "proxy_replace_header_map_value" (func $rep (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
        (data (i32.const 0) "x-t")
    (data (i32.const 8) "2")
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_request_trailers") (param i32 i32) (result i32)
        (drop (call $rep (i32.const 1) (i32.const 0) (i32.const 3) (i32.const 8) (i32.const 1)))
        i32.const 0)
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
        (i32.store8 (i32.const 200) (i32.const 84))
        (i32.store8 (i32.const 201) (i32.add (i32.const 48)
            (call $get (i32.const 1) (i32.const 0) (i32.const 3) (i32.const 300) (i32.const 304))))
        (drop (call $log (i32.const 2) (i32.const 200) (i32.const 2)))
        i32.const 0))"#;

#[test]
fn trailers_are_writable_in_their_callback_only() -> Result<(), Error> {
    use ace_wasm_host::{Request, Response, Route};
    let m = load(TRAILERS)?;
    let mut vm = Vm::builder(&m).start()?;
    let route = Route::Cluster("c".into());
    let req = Request::post("/").body("b").trailer("x-t", "1");
    let ex = vm.exchange(&route, req, |_| Some(Response::new(200)))?;
    let up = ex.upstream.unwrap_or_default();
    assert_eq!(up.trailers.get("x-t"), Some("2"));
    assert_eq!(up.body, b"b");
    assert!(vm.logged("T2"), "{:?}", lines(&vm));
    Ok(())
}
