//! Shared data and queues across VMs of one process.

use ace_wasm_host::{Error, FilterModule, Process, Vm};

/// A guest that, on each tick, reads key "k" with its CAS, then writes
/// "v" with that CAS, logging the write's status. Two VMs that both read
/// before either writes reproduce Envoy's race: the second write is stale.
const CAS_GUEST: &str = r#"(module
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_shared_data" (func $get (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_shared_data" (func $set (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 0) "k")
    (data (i32.const 8) "v")
    (data (i32.const 32) "status=0status=1status=8")
    (global $cas (mut i32) (i32.const 0))
    (global $phase (mut i32) (i32.const 0))
    (func (export "proxy_abi_version_0_2_1"))
    (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 4096)
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32)
        (drop (call $tick (i32.const 1000)))
        i32.const 1)
    ;; odd ticks read, even ticks write
    (func (export "proxy_on_tick") (param i32) (local $st i32)
        (if (i32.eqz (global.get $phase))
            (then
                (drop (call $get (i32.const 0) (i32.const 1) (i32.const 100) (i32.const 104) (i32.const 108)))
                (global.set $cas (i32.load (i32.const 108)))
                (global.set $phase (i32.const 1)))
            (else
                (local.set $st (call $set (i32.const 0) (i32.const 1) (i32.const 8) (i32.const 1) (global.get $cas)))
                (drop (call $log (i32.const 2)
                    (i32.add (i32.const 32) (i32.mul (i32.const 8)
                        (select (i32.const 2) (local.get $st) (i32.eq (local.get $st) (i32.const 8)))))
                    (i32.const 8)))
                (global.set $phase (i32.const 0)))))
)"#;

#[test]
fn a_stale_cas_gets_the_mismatch_status_across_two_vms() -> Result<(), Error> {
    let m = FilterModule::from_bytes(CAS_GUEST.as_bytes())?;
    let process = Process::new();
    process
        .set_shared_data("workers", b"k", b"initial", 0)
        .map_err(|s| Error::Unknown(format!("{s:?}")))?;
    let mut a = Vm::builder(&m).process(&process).vm_id("workers").start()?;
    let mut b = Vm::builder(&m).process(&process).vm_id("workers").start()?;
    let second = std::time::Duration::from_secs(1);
    // Both read the same CAS...
    a.advance(second)?;
    b.advance(second)?;
    // ...A writes first and wins; B's CAS is now stale.
    a.advance(second)?;
    b.advance(second)?;
    assert!(a.logged("status=0"), "{:?}", a.logs());
    assert!(b.logged("status=8"), "{:?}", b.logs());
    assert_eq!(
        process.shared_data("workers", b"k").map(|(v, _)| v),
        Some(b"v".to_vec())
    );
    // Another vm_id is another namespace.
    assert_eq!(process.shared_data("", b"k"), None);
    Ok(())
}

/// Registers queue "q" in on_configure (logs the token's validity), and on
/// each tick enqueues "msg" to the queue resolved under vm_id "shared".
/// `on_queue_ready` dequeues and logs what it got.
const QUEUE_GUEST: &str = r#"(module
    (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
    (import "env" "proxy_register_shared_queue" (func $reg (param i32 i32 i32) (result i32)))
    (import "env" "proxy_resolve_shared_queue" (func $res (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_enqueue_shared_queue" (func $enq (param i32 i32 i32) (result i32)))
    (import "env" "proxy_dequeue_shared_queue" (func $deq (param i32 i32 i32) (result i32)))
    (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))
    (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))
    (memory (export "memory") 1)
    (data (i32.const 0) "q")
    (data (i32.const 8) "shared")
    (data (i32.const 16) "msg")
    (data (i32.const 24) "ready:")
    (data (i32.const 40) "empty")
    (global $next (mut i32) (i32.const 8192))
    (func (export "proxy_abi_version_0_2_1"))
    (func (export "proxy_on_memory_allocate") (param i32) (result i32) (local $p i32)
        (local.set $p (global.get $next))
        (global.set $next (i32.add (global.get $next) (local.get 0)))
        (local.get $p))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32)
        ;; configuration "consumer" (8 bytes) registers; anything else produces
        (if (i32.eq (local.get 1) (i32.const 8))
            (then (drop (call $reg (i32.const 0) (i32.const 1) (i32.const 200))))
            (else (drop (call $tick (i32.const 10)))))
        i32.const 1)
    (func (export "proxy_on_tick") (param i32)
        (if (i32.eqz (call $res (i32.const 8) (i32.const 6) (i32.const 0) (i32.const 1) (i32.const 204)))
            (then (drop (call $enq (i32.load (i32.const 204)) (i32.const 16) (i32.const 3))))))
    (func (export "proxy_on_queue_ready") (param i32 i32)
        (if (i32.eqz (call $deq (local.get 1) (i32.const 208) (i32.const 212)))
            (then
                (drop (call $log (i32.const 2) (i32.load (i32.const 208)) (i32.load (i32.const 212))))))
        ;; a second dequeue finds nothing: Empty (7)
        (if (i32.eq (call $deq (local.get 1) (i32.const 208) (i32.const 212)) (i32.const 7))
            (then (drop (call $log (i32.const 2) (i32.const 40) (i32.const 5))))))
)"#;

#[test]
fn a_queue_notifies_its_registrant_in_another_vm() -> Result<(), Error> {
    let m = FilterModule::from_bytes(QUEUE_GUEST.as_bytes())?;
    let process = Process::new();
    let mut consumer = Vm::builder(&m)
        .process(&process)
        .vm_id("shared")
        .configuration("consumer")
        .start()?;
    let mut producer = Vm::builder(&m)
        .process(&process)
        .vm_id("shared")
        .configuration("producer!")
        .start()?;
    producer.advance(std::time::Duration::from_millis(10))?;
    assert!(
        !consumer.logged("msg"),
        "delivered only when the consumer runs"
    );
    consumer.settle()?;
    assert!(consumer.logged("msg"), "{:?}", consumer.logs());
    assert!(consumer.logged("empty"));
    assert!(!producer.logged("msg"));
    Ok(())
}
