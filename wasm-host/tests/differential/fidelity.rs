//! Envoy's mechanics around a filter, checked in Envoy 1.40 and on the
//! host: buffer limits, callout timeouts, the VM lifecycle and the order
//! of headers a filter replaced, added or removed.
//!
//! What Envoy did, and so what these pin down: a request body held past
//! the listener's `per_connection_buffer_limit_bytes` (1 MiB by default)
//! gets a local 413 `Payload Too Large` and never reaches the upstream;
//! exactly the limit passes. A held response past it is reset after its
//! headers left (the client sees a broken body). A route's
//! `per_request_buffer_limit_bytes` does not bind a filter that buffers
//! before routing. A callout past its timeout gets Envoy's 504 `upstream
//! request timeout` as its response. `on_vm_start` and `on_configure` run
//! once per VM: a validation VM, the main thread's, one per worker.

use super::{case, differential_with, Group, Guest, Setup};
use ace_harness::upstream::Behavior;
use std::time::Duration;

/// A body of `n` bytes, alive for the whole test binary (cases hold `&'static str`).
fn body(n: usize) -> &'static str {
    Box::leak("b".repeat(n).into_boxed_str())
}

const MIB: usize = 1024 * 1024;

/// An upstream answering 200 with a text body of `n` bytes.
fn text_upstream(n: usize) -> Behavior {
    Behavior::Respond {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: body(n).as_bytes().to_vec(),
    }
}

/// A group of a hand-written guest without configuration.
fn wat_group(
    guest: Guest,
    clusters: Vec<(&'static str, Behavior)>,
    cases: Vec<super::Case>,
) -> Group {
    Group {
        package: guest,
        configuration: "",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters,
        cases,
    }
}

fn buffering(clusters: Vec<(&'static str, Behavior)>, cases: Vec<super::Case>) -> Group {
    Group {
        package: Guest::Package("ace-example-body-rewrite"),
        configuration: "upstream",
        cluster_header: None,
        allow_stop_iteration: true,
        clusters,
        cases,
    }
}

#[test]
fn request_buffer_limits_match_envoy() {
    differential_with(
        buffering(
            vec![("backend", Behavior::Ok)],
            vec![
                case("a buffered request of exactly 1 MiB", "POST", "/b").body(body(MIB)),
                case("a buffered request 1 KiB over 1 MiB", "POST", "/b").body(body(MIB + 1024)),
            ],
        ),
        Setup::default(),
    );
}

/// The body-rewrite filter holding an upstream response of `n` bytes.
fn held_response(name: &'static str, n: usize) {
    differential_with(
        buffering(
            vec![("backend", text_upstream(n))],
            vec![case(name, "GET", "/b")],
        ),
        Setup::default(),
    );
}

#[test]
fn response_buffer_limits_match_envoy() {
    held_response("a buffered 2.25 MiB response", MIB * 9 / 4);
}

#[test]
fn response_just_under_the_buffer_limit_matches_envoy() {
    held_response("a buffered response of exactly 1 MiB", MIB);
}

#[test]
fn a_configured_listener_buffer_limit_matches_envoy() {
    differential_with(
        buffering(
            vec![("backend", Behavior::Ok)],
            vec![
                case("64 KiB under a 64 KiB listener limit", "POST", "/b").body(body(64 * 1024)),
                case("one byte over it", "POST", "/b").body(body(64 * 1024 + 1)),
            ],
        ),
        Setup {
            envoy: Some(|b| b.per_connection_buffer_limit(64 * 1024)),
            host: Some(|b| b.per_connection_buffer_limit_bytes(64 * 1024)),
            ..Setup::default()
        },
    );
}

#[test]
fn a_route_buffer_limit_does_not_bind_a_filter_before_routing_like_envoy() {
    differential_with(
        buffering(
            vec![("backend", Behavior::Ok)],
            vec![case("40 KB over a 32 KiB route limit", "POST", "/b").body(body(40_000))],
        ),
        Setup {
            envoy: Some(|b| b.route_field("per_request_buffer_limit_bytes", 32768.into())),
            ..Setup::default()
        },
    );
}

#[test]
fn a_held_response_over_the_limit_with_its_headers_held_matches_envoy() {
    let big = text_upstream(MIB * 9 / 4);
    differential_with(
        Group {
            package: Guest::Package("ace-example-callback-log"),
            configuration: "pause",
            cluster_header: None,
            allow_stop_iteration: true,
            clusters: vec![("backend", big)],
            cases: vec![case("headers and body held, 2.25 MiB", "GET", "/b")],
        },
        Setup::default(),
    );
}

#[test]
fn a_callout_timeout_matches_envoy() {
    differential_with(
        Group {
            package: Guest::Package("ace-example-http-callout"),
            configuration: "authz 1000",
            cluster_header: None,
            allow_stop_iteration: false,
            clusters: vec![
                ("backend", Behavior::Ok),
                ("authz", Behavior::Slow(Duration::from_millis(1500))),
            ],
            cases: vec![
                case("the callout outlives its 1 s timeout", "GET", "/x").header("x-user", "ann")
            ],
        },
        Setup::default(),
    );
}

/// Calls cluster `authz` with a 1 s timeout and copies what the callout's
/// response looked like into the held request's headers (`x-call-*`, or
/// `!<status>` for a missing header), then lets the request go on.
const CALLOUT_PROBE: &str = r#"(module
    (import "env" "proxy_http_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
    (import "env" "proxy_continue_stream" (func $cont (param i32) (result i32)))
    (data (i32.const 2048) "\03\00\00\00\07\00\00\00\03\00\00\00\05\00\00\00\05\00\00\00\0a\00\00\00\05\00\00\00:method\00GET\00:path\00/slow\00:authority\00authz\00")
    (data (i32.const 2200) "authz")
    (data (i32.const 1024) ":status")
    (data (i32.const 1040) "content-type")
    (data (i32.const 1056) "content-length")
    (data (i32.const 1088) "x-call-status")
    (data (i32.const 1104) "x-call-content-type")
    (data (i32.const 1136) "x-call-content-length")
    (data (i32.const 1168) "x-call-headers")
    (data (i32.const 1184) "x-call-body-size")
    (data (i32.const 1216) "x-call-body")
    (global $stream (mut i32) (i32.const 0))
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    ;; adds request header (name $n, length $l) = two decimal digits of $v
    (func $num (param $n i32) (param $l i32) (param $v i32)
        (i32.store8 (i32.const 500) (i32.add (i32.const 48) (i32.div_u (local.get $v) (i32.const 10))))
        (i32.store8 (i32.const 501) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10))))
        (drop (call $add (i32.const 0) (local.get $n) (local.get $l) (i32.const 500) (i32.const 2))))
    ;; copies callout response header $k (length $kl) into request header $n
    (func $copy (param $k i32) (param $kl i32) (param $n i32) (param $l i32) (local $st i32)
        (local.set $st (call $get (i32.const 6) (local.get $k) (local.get $kl) (i32.const 300) (i32.const 304)))
        (if (i32.eqz (local.get $st))
            (then (drop (call $add (i32.const 0) (local.get $n) (local.get $l)
                (i32.load (i32.const 300)) (i32.load (i32.const 304)))))
            (else
                (i32.store8 (i32.const 400) (i32.const 33))
                (i32.store8 (i32.const 401) (i32.add (i32.const 48) (local.get $st)))
                (drop (call $add (i32.const 0) (local.get $n) (local.get $l) (i32.const 400) (i32.const 2))))))
    (func (export "proxy_on_request_headers") (param $id i32) (param i32 i32) (result i32)
        (global.set $stream (local.get $id))
        (drop (call $call (i32.const 2200) (i32.const 5) (i32.const 2048) (i32.const 69)
            (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1000) (i32.const 600)))
        i32.const 1)
    (func (export "proxy_on_http_call_response") (param i32 i32) (param $nh i32) (param $nb i32) (param i32)
        (drop (call $eff (global.get $stream)))
        (call $num (i32.const 1168) (i32.const 14) (local.get $nh))
        (call $num (i32.const 1184) (i32.const 16) (local.get $nb))
        (call $copy (i32.const 1024) (i32.const 7) (i32.const 1088) (i32.const 13))
        (call $copy (i32.const 1040) (i32.const 12) (i32.const 1104) (i32.const 19))
        (call $copy (i32.const 1056) (i32.const 14) (i32.const 1136) (i32.const 21))
        (if (i32.eqz (call $buf (i32.const 4) (i32.const 0) (local.get $nb) (i32.const 300) (i32.const 304)))
            (then (drop (call $add (i32.const 0) (i32.const 1216) (i32.const 11)
                (i32.load (i32.const 300)) (i32.load (i32.const 304))))))
        (drop (call $cont (i32.const 0)))))"#;

#[test]
fn a_callout_timeout_response_matches_envoy() {
    differential_with(
        wat_group(
            Guest::Wat("callout-probe", CALLOUT_PROBE),
            vec![
                ("backend", Behavior::Ok),
                ("authz", Behavior::Slow(Duration::from_millis(1500))),
            ],
            vec![case("what a timed-out callout answers", "GET", "/p")],
        ),
        Setup::default(),
    );
}

/// Counts `on_vm_start` and `on_configure` in shared data (one ASCII
/// digit each, compare-and-swapped: worker VMs start concurrently), logs every root-context callback, and reports the counts
/// and this VM's own starts as response headers.
const LIFECYCLE: &str = r#"(module
    (import "env" "proxy_get_shared_data" (func $sget (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_shared_data" (func $sset (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (data (i32.const 0) "starts")
    (data (i32.const 8) "configures")
    (data (i32.const 32) "x-starts")
    (data (i32.const 48) "x-configures")
    (data (i32.const 64) "x-this-vm")
    (data (i32.const 80) "lifecycle: vm start")
    (data (i32.const 112) "lifecycle: configure")
    (data (i32.const 144) "lifecycle: root done")
    (data (i32.const 176) "lifecycle: root delete")
    (global $mine (mut i32) (i32.const 48))
    (global $root (mut i32) (i32.const -1))
    ;; ABI_AND_ALLOCATOR
    (func $count (param $k i32) (param $kl i32) (result i32)
        (if (result i32)
            (i32.eqz (call $sget (local.get $k) (local.get $kl) (i32.const 300) (i32.const 304) (i32.const 308)))
            (then (i32.load8_u (i32.load (i32.const 300))))
            (else (i32.const 48))))
    ;; read, add one, write back with the read's CAS; again on a mismatch
    ;; (two workers' VMs start at the same time)
    (func $bump (param $k i32) (param $kl i32)
        (loop $again
            (i32.store (i32.const 308) (i32.const 0))
            (i32.store8 (i32.const 400) (i32.add (call $count (local.get $k) (local.get $kl)) (i32.const 1)))
            (br_if $again (i32.ne
                (call $sset (local.get $k) (local.get $kl) (i32.const 400) (i32.const 1) (i32.load (i32.const 308)))
                (i32.const 0)))))
    (func $report (param $n i32) (param $nl i32) (param $digit i32)
        (i32.store8 (i32.const 404) (local.get $digit))
        (drop (call $add (i32.const 2) (local.get $n) (local.get $nl) (i32.const 404) (i32.const 1))))
    (func (export "proxy_on_context_create") (param $id i32) (param $parent i32)
        (if (i32.eqz (local.get $parent)) (then (global.set $root (local.get $id)))))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32)
        (call $bump (i32.const 0) (i32.const 6))
        (global.set $mine (i32.add (global.get $mine) (i32.const 1)))
        (drop (call $log (i32.const 2) (i32.const 80) (i32.const 19)))
        i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32)
        (call $bump (i32.const 8) (i32.const 10))
        (drop (call $log (i32.const 2) (i32.const 112) (i32.const 20)))
        i32.const 1)
    (func (export "proxy_on_done") (param $id i32) (result i32)
        (if (i32.eq (local.get $id) (global.get $root))
            (then (drop (call $log (i32.const 2) (i32.const 144) (i32.const 20)))))
        i32.const 1)
    (func (export "proxy_on_delete") (param $id i32)
        (if (i32.eq (local.get $id) (global.get $root))
            (then (drop (call $log (i32.const 2) (i32.const 176) (i32.const 22))))))
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
        (call $report (i32.const 32) (i32.const 8) (call $count (i32.const 0) (i32.const 6)))
        (call $report (i32.const 48) (i32.const 12) (call $count (i32.const 8) (i32.const 10)))
        (call $report (i32.const 64) (i32.const 9) (global.get $mine))
        i32.const 0))"#;

/// The lifecycle guest in an Envoy with `workers` worker threads.
fn vm_starts(workers: u32) {
    differential_with(
        wat_group(
            Guest::Wat("lifecycle", LIFECYCLE),
            vec![("backend", Behavior::Ok)],
            vec![case("starts and configures so far", "GET", "/")],
        ),
        Setup {
            workers: Some(workers),
            ..Setup::default()
        },
    );
}

#[test]
fn vm_starts_with_one_worker_match_envoy() {
    // The validation VM, the main thread's and the worker's: 3.
    vm_starts(1);
}

#[test]
fn vm_starts_with_two_workers_match_envoy() {
    vm_starts(2);
}

/// Replaces, adds and removes request and response headers.
const HEADER_ORDER: &str = r#"(module
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_replace_header_map_value" (func $rep (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_remove_header_map_value" (func $rm (param i32 i32 i32) (result i32)))
    (data (i32.const 0) "x-a")
    (data (i32.const 8) "x-b")
    (data (i32.const 16) "x-c")
    (data (i32.const 24) "x-new")
    (data (i32.const 32) "wasm")
    (data (i32.const 40) "content-type")
    (data (i32.const 56) "x-upstream")
    (data (i32.const 72) "x-added")
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        ;; replace x-a (sent twice), add a second x-c, remove x-b, replace absent x-new
        (drop (call $rep (i32.const 0) (i32.const 0) (i32.const 3) (i32.const 32) (i32.const 4)))
        (drop (call $add (i32.const 0) (i32.const 16) (i32.const 3) (i32.const 32) (i32.const 4)))
        (drop (call $rm (i32.const 0) (i32.const 8) (i32.const 3)))
        (drop (call $rep (i32.const 0) (i32.const 24) (i32.const 5) (i32.const 32) (i32.const 4)))
        i32.const 0)
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
        ;; replace content-type, remove x-upstream, add x-added, replace absent x-a
        (drop (call $rep (i32.const 2) (i32.const 40) (i32.const 12) (i32.const 32) (i32.const 4)))
        (drop (call $rm (i32.const 2) (i32.const 56) (i32.const 10)))
        (drop (call $add (i32.const 2) (i32.const 72) (i32.const 7) (i32.const 32) (i32.const 4)))
        (drop (call $rep (i32.const 2) (i32.const 0) (i32.const 3) (i32.const 32) (i32.const 4)))
        i32.const 0))"#;

#[test]
fn header_order_after_edits_matches_envoy() {
    differential_with(
        wat_group(
            Guest::Wat("header-order", HEADER_ORDER),
            vec![(
                "backend",
                Behavior::Respond {
                    status: 200,
                    headers: vec![
                        ("content-type".into(), "text/plain".into()),
                        ("x-z".into(), "last".into()),
                    ],
                    body: b"ok".to_vec(),
                },
            )],
            vec![case("replace, add and remove", "GET", "/h")
                .header("x-a", "1")
                .header("x-b", "2")
                .header("x-a", "1b")
                .header("x-c", "3")
                .header("x-z", "4")
                .ordered()],
        ),
        Setup::default(),
    );
}
