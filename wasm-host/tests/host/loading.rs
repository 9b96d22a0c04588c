//! Loading rules and misbehaving guests.

use ace_wasm_host::{Error, FilterModule, Vm};

/// A minimal ABI 0.2.1 module in WAT, with extra imports spliced in.
fn wat(extra_imports: &str, body: &str) -> String {
    format!(
        r#"(module
            (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
            {extra_imports}
            (memory (export "memory") 1)
            (data (i32.const 16) "hello from wat")
            (func (export "proxy_abi_version_0_2_1"))
            (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
            (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
            (func (export "proxy_on_configure") (param i32 i32) (result i32)
                (drop (call $log (i32.const 2) (i32.const 16) (i32.const 14)))
                i32.const 1)
            {body}
        )"#
    )
}

#[test]
fn an_unimplemented_import_fails_loading_with_its_name() {
    let src = wat(
        r#"(import "env" "proxy_frobnicate" (func (param i32) (result i32)))
           (import "wasi_snapshot_preview1" "sock_accept" (func (param i32 i32 i32) (result i32)))"#,
        "",
    );
    let err = FilterModule::from_bytes(src.as_bytes()).err();
    assert_eq!(
        err,
        Some(Error::MissingImports(vec![
            "env.proxy_frobnicate".to_string(),
            "wasi_snapshot_preview1.sock_accept".to_string()
        ]))
    );
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("env.proxy_frobnicate"), "{text}");
}

#[test]
fn a_module_without_the_abi_marker_is_refused() {
    let err = FilterModule::from_bytes(b"(module (memory (export \"memory\") 1))").err();
    assert!(matches!(err, Some(Error::UnsupportedAbi(_))), "{err:?}");
}

#[test]
fn a_hand_written_module_starts_and_logs() -> Result<(), Error> {
    let m = FilterModule::from_bytes(wat("", "").as_bytes())?;
    assert_eq!(m.abi_version(), "0.2.1");
    let vm = Vm::builder(&m).start()?;
    assert!(vm.logged("hello from wat"));
    Ok(())
}

#[test]
fn a_trap_fails_the_vm_and_later_calls_say_so() -> Result<(), Error> {
    let body = r#"(func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable)"#;
    let m = FilterModule::from_bytes(wat("", body).as_bytes())?;
    let mut vm = Vm::builder(&m).start()?;
    let mut s = vm.http_stream()?;
    let r = s.send_request_headers([(":path", "/")], true);
    assert!(
        matches!(r, Err(Error::Trap { ref callback, .. }) if callback == "proxy_on_request_headers"),
        "{r:?}"
    );
    assert!(vm.failure().is_some());
    assert!(matches!(vm.http_stream().err(), Some(Error::Failed(_))));
    Ok(())
}

#[test]
fn out_of_bounds_pointers_are_statuses_not_host_panics() -> Result<(), Error> {
    // proxy_log with a pointer past memory: InvalidMemoryAccess (6) comes
    // back; the module stores it where the test can see it through a log.
    let body = r#"
        (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
            (if (i32.ne (call $log (i32.const 2) (i32.const 0x7fffffff) (i32.const 100)) (i32.const 6))
                (then unreachable))
            i32.const 0)"#;
    let m = FilterModule::from_bytes(wat("", body).as_bytes())?;
    let mut vm = Vm::builder(&m).start()?;
    let mut s = vm.http_stream()?;
    s.send_request_headers([(":path", "/")], true)?;
    Ok(())
}

#[test]
fn fuel_turns_a_runaway_guest_into_a_trap() -> Result<(), Error> {
    let body = r#"(func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (loop $forever (br $forever))
        i32.const 0)"#;
    let engine = ace_wasm_host::wasmtime::Engine::new(
        ace_wasm_host::wasmtime::Config::new().consume_fuel(true),
    )
    .map_err(|e| Error::Instantiate(e.to_string()))?;
    let m = FilterModule::with_engine(&engine, wat("", body).as_bytes())?;
    let mut vm = Vm::builder(&m).fuel_per_callback(1_000_000).start()?;
    let before = vm.fuel_consumed();
    assert!(before > 0, "on_configure burned some fuel");
    let mut s = vm.http_stream()?;
    let r = s.send_request_headers([(":path", "/")], true);
    assert!(matches!(r, Err(Error::Trap { .. })), "{r:?}");
    // Fuel without an engine that meters it is a clear error.
    let plain = FilterModule::from_bytes(wat("", "").as_bytes())?;
    let err = Vm::builder(&plain).fuel_per_callback(10).start().err();
    assert!(matches!(err, Some(Error::Instantiate(_))), "{err:?}");
    Ok(())
}

#[test]
fn a_memory_limit_refuses_growth_past_it() -> Result<(), Error> {
    // Grows by 4 pages (256 KiB): -1 under a 128 KiB cap, and the guest traps on it.
    let body = r#"(func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (if (i32.eq (memory.grow (i32.const 4)) (i32.const -1)) (then unreachable))
        i32.const 0)"#;
    let m = FilterModule::from_bytes(wat("", body).as_bytes())?;
    let mut capped = Vm::builder(&m).memory_limit(128 * 1024).start()?;
    let mut s = capped.http_stream()?;
    assert!(s.send_request_headers([(":path", "/")], true).is_err());
    let mut free = Vm::builder(&m).start()?;
    let mut s = free.http_stream()?;
    s.send_request_headers([(":path", "/")], true)?;
    Ok(())
}

#[test]
fn an_exchange_with_a_trapping_filter_fails_closed() -> Result<(), Error> {
    use ace_wasm_host::{Request, Response, Route};
    let body = r#"(func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable)"#;
    let m = FilterModule::from_bytes(wat("", body).as_bytes())?;
    let mut vm = Vm::builder(&m).start()?;
    let route = Route::Cluster("c".into());
    for _ in 0..2 {
        let ex = vm.exchange(&route, Request::get("/"), |_| Some(Response::new(200)))?;
        assert_eq!(ex.response.map(|r| r.status()), Some(503));
        assert!(ex.upstream.is_none());
        assert!(ex
            .vm_failure
            .is_some_and(|f| f.contains("proxy_on_request_headers")));
    }
    Ok(())
}
