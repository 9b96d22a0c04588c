//! Criterion benches for ace-wasm-host.
//!
//! - `instantiate/*`: a fresh VM from a compiled module (instantiate,
//!   `_initialize`, root context, `on_vm_start`, `on_configure`).
//! - `request/boundary`: one request through a filter that does nothing
//!   (context create, `on_request_headers`, `on_response_headers`,
//!   `on_log`/`on_done`/`on_delete`): the cost of crossing the Wasm boundary
//!   and the host's bookkeeping.
//! - `request/ace-filter`: the same calls through ACE's filter; minus the
//!   boundary, that is the filter's own work.
//! - `request/ace-filter-fleet`: the example fleet (`policies/`: twelve
//!   destinations and compiled Cedar tables) routing a request that sends
//!   every attribute, with a JSON response reporting usage: the policy
//!   path, which `request/ace-filter` (three destinations, no tables) skips.
//! - `request/ace-filter-exchange`: a whole request with Envoy's emulation.
//! - `hostcall/get_header_x100`: one `on_request_headers` making 100
//!   `proxy_get_header_map_value` calls.
//!
//! A/B: `cargo bench -p ace-wasm-host -- --save-baseline main`, change,
//! then `cargo bench -p ace-wasm-host -- --baseline main`. CI only checks
//! the benches run: `cargo test -p ace-wasm-host --benches`.

#[path = "../tests/common/mod.rs"]
mod common;

use ace_wasm_host::{FilterModule, Headers, Request, Response, Route, Vm};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

/// A filter that answers every callback at once.
const NOOP: &str = r#"(module
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) i32.const 0)
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) i32.const 0)
    (func (export "proxy_on_done") (param i32) (result i32) i32.const 1)
    (func (export "proxy_on_log") (param i32))
    (func (export "proxy_on_delete") (param i32)))"#;

/// A filter whose `on_request_headers` reads `:path` 100 times.
const GETS: &str = r#"(module
    (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
    (memory (export "memory") 2)
    (data (i32.const 0) ":path")
    (global $heap (mut i32) (i32.const 65536))
    (func (export "proxy_abi_version_0_2_1"))
    ;; a bump allocator that resets per request: enough for a bench
    (func (export "proxy_on_memory_allocate") (param i32) (result i32) (local $p i32)
        (local.set $p (global.get $heap))
        (global.set $heap (i32.add (global.get $heap) (local.get 0)))
        (local.get $p))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (local $i i32)
        (global.set $heap (i32.const 65536))
        (loop $l
            (drop (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 64) (i32.const 68)))
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (br_if $l (i32.lt_u (local.get $i) (i32.const 100))))
        i32.const 0))"#;

fn request_headers() -> [(&'static str, &'static str); 6] {
    [
        (":authority", "ace.test"),
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("content-length", "512"),
    ]
}

/// A request the example fleet's policy tables route: every attribute
/// sent, values the tables know.
fn fleet_request_headers() -> Headers {
    let attributes = [
        ("x-ace-tenant", "globex"),
        ("x-ace-data-class", "public"),
        ("x-ace-model", "llama-3.1-70b"),
        ("x-ace-latency-class", "interactive"),
        ("x-ace-tp-degree", "1"),
    ];
    request_headers().into_iter().chain(attributes).collect()
}

/// The example fleet (`policies/`: twelve destinations, compiled Cedar
/// tables), as `ace plugin-config policies` prints it.
fn fleet_config() -> String {
    common::example_fleet_config(false)
}

/// The fleet request, with a JSON response that reports usage.
fn one_fleet_request(vm: &mut Vm) {
    let Ok(mut s) = vm.http_stream() else { return };
    let _ = black_box(s.send_request_headers(fleet_request_headers(), false));
    let _ = black_box(s.send_response_headers(
        [(":status", "200"), ("content-type", "application/json")],
        false,
    ));
    let _ = black_box(s.send_response_body(
        br#"{"usage":{"prompt_tokens":30,"completion_tokens":12}}"#,
        true,
    ));
    let _ = s.finish();
}

fn one_request(vm: &mut Vm) {
    let Ok(mut s) = vm.http_stream() else { return };
    let _ = black_box(s.send_request_headers(request_headers(), false));
    let _ = black_box(s.send_response_headers([(":status", "200")], true));
    let _ = s.finish();
}

fn benches(c: &mut Criterion) {
    let ace = common::module("ace-filter");
    let config = common::ace_config();
    let noop = FilterModule::from_bytes(common::wat_guest(NOOP).as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let gets = FilterModule::from_bytes(GETS.as_bytes()).unwrap_or_else(|e| panic!("{e}"));

    let mut g = c.benchmark_group("instantiate");
    g.bench_function("noop", |b| {
        b.iter(|| black_box(Vm::builder(&noop).start().map(|vm| vm.root_id())))
    });
    g.bench_function("ace-filter", |b| {
        b.iter(|| {
            black_box(
                Vm::builder(&ace)
                    .configuration(config)
                    .start()
                    .map(|vm| vm.root_id()),
            )
        })
    });
    g.finish();

    let mut g = c.benchmark_group("request");
    let mut vm = Vm::builder(&noop).start().unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("boundary", |b| b.iter(|| one_request(&mut vm)));
    let mut vm = Vm::builder(&ace)
        .configuration(config)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("ace-filter", |b| b.iter(|| one_request(&mut vm)));
    let mut fleet_vm = Vm::builder(&ace)
        .configuration(fleet_config())
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    {
        // Routed, not refused: otherwise this would time the refusal.
        let mut s = fleet_vm.http_stream().unwrap_or_else(|e| panic!("{e}"));
        let _ = s.send_request_headers(fleet_request_headers(), false);
        assert!(
            s.local_response().is_none() && s.request_headers().get("x-ace-destination").is_some(),
            "the example fleet must route the bench request"
        );
        let _ = s.finish();
    }
    g.bench_function("ace-filter-fleet", |b| {
        b.iter(|| one_fleet_request(&mut fleet_vm))
    });
    let route = Route::ClusterHeader("x-ace-destination".into());
    g.bench_function("ace-filter-exchange", |b| {
        b.iter(|| {
            black_box(vm.exchange(&route, Request::post("/v1/chat"), |_| {
                Some(Response::new(200))
            }))
        })
    });
    g.finish();

    let mut g = c.benchmark_group("hostcall");
    let mut vm = Vm::builder(&gets).start().unwrap_or_else(|e| panic!("{e}"));
    g.bench_function("get_header_x100", |b| {
        b.iter(|| {
            let Ok(mut s) = vm.http_stream() else { return };
            let _ = black_box(s.send_request_headers(request_headers(), true));
            let _ = s.finish();
        })
    });
    g.finish();
}

criterion_group!(host, benches);
criterion_main!(host);
