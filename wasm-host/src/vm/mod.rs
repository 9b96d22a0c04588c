//! A VM: one wasmtime `Store` + instance, with its plugin (root) context,
//! driven through Envoy's lifecycle.
//!
//! Envoy's order is reproduced: `_initialize` (or `_start`), then
//! `on_context_create(root, 0)`, `on_vm_start`, `on_configure` (first on a
//! validation VM that is then dropped, because Envoy validates each plugin
//! configuration that way and a filter's start-up side effects show it); streams get
//! `on_context_create(stream, root)` and their header/body/trailer
//! callbacks, then `on_log`, `on_done`, `on_delete` (the access log runs
//! before filters are destroyed). Effects Envoy defers until a callback
//! returns (continue, close, local reply) are applied after it returns, and
//! asynchronous events (callout responses, queue notifications, ticks) are
//! delivered only between callbacks, never inside one.

mod builder;
mod call;
mod events;
mod exports;
mod grpc;
mod stream;

pub use builder::{VmBuilder, DEFAULT_BUFFER_LIMIT};
pub use stream::HttpStream;

use crate::process::{MetricValue, Process};
use crate::state::{Deferred, LogEntry, StreamInfo, StreamState, VmState};
use exports::Exports;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::Store;

/// One Envoy Wasm VM (a worker's, or the main thread's) running one plugin.
///
/// All state is in the VM's store and its [`Process`]; VMs are independent
/// unless they share a process.
pub struct Vm {
    store: Store<VmState>,
    instance: wasmtime::Instance,
    exports: Exports,
    failed: Option<String>,
    info: StreamInfo,
    allow_stop_iteration: bool,
    fuel: Option<u64>,
    fuel_consumed: u64,
    /// `per_connection_buffer_limit_bytes` (0: none).
    buffer_limit: u32,
    /// What the validation VM logged before it was dropped.
    validation_logs: Vec<LogEntry>,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("state", self.store.data())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Vm {
    /// Fuel the guest burned so far (0 unless
    /// [`VmBuilder::fuel_per_callback`] is set): a deterministic measure of
    /// the work a filter does, e.g. per request.
    pub fn fuel_consumed(&self) -> u64 {
        self.fuel_consumed
    }

    /// Calls from the guest into host functions so far (0 unless
    /// [`VmBuilder::count_host_calls`] is set).
    pub fn host_calls(&self) -> u64 {
        self.store.data().host_calls
    }

    fn alloc_context(&mut self) -> u32 {
        let s = self.store.data_mut();
        let id = s.next_context_id;
        s.next_context_id += 1;
        id
    }

    /// The root (plugin) context id.
    pub fn root_id(&self) -> u32 {
        self.store.data().root_id
    }

    /// The process this VM belongs to.
    pub fn process(&self) -> &Process {
        &self.store.data().process
    }

    /// Why the VM failed, if a callback trapped.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Every captured log line (`proxy_log`, stdout, stderr), in order.
    pub fn logs(&self) -> &[LogEntry] {
        &self.store.data().logs
    }

    /// What the validation VM logged while Envoy validated the
    /// configuration on it (see [`VmBuilder::validation_vm`]): in Envoy's
    /// log these lines come first.
    pub fn validation_logs(&self) -> &[LogEntry] {
        &self.validation_logs
    }

    /// Whether some log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.logs().iter().any(|l| l.message.contains(needle))
    }

    /// Forgets the captured logs.
    pub fn clear_logs(&mut self) {
        self.store.data_mut().logs.clear();
    }

    /// A metric of this VM's process by the name the filter defined.
    pub fn metric(&self, name: &str) -> Option<MetricValue> {
        self.process().metric(name)
    }

    /// The guest's linear memory size in bytes (it never shrinks; watch it
    /// grow across requests to find leaks).
    pub fn memory_size(&self) -> usize {
        self.store
            .data()
            .memory
            .map(|m| m.data_size(&self.store))
            .unwrap_or(0)
    }

    /// The value of the global the module exports as `name`, if there is
    /// one and it is an `i64`: e.g. the counters of a build instrumented
    /// for profiling (the `fuel` example's `ACE_FUEL_PROFILE`).
    pub fn exported_i64(&mut self, name: &str) -> Option<i64> {
        self.instance
            .get_global(&mut self.store, name)
            .and_then(|g| g.get(&mut self.store).i64())
    }

    /// The tick period the filter set (`None` if off).
    pub fn tick_period(&self) -> Option<Duration> {
        let ms = self.store.data().tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Current virtual wall-clock time.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.store.data().now_ns())
    }

    fn stream_state(&self, id: u32) -> Option<&StreamState> {
        self.store.data().streams.get(&id)
    }

    fn stream_state_mut(&mut self, id: u32) -> Option<&mut StreamState> {
        self.store.data_mut().streams.get_mut(&id)
    }

    /// Whether the callback that just returned sent a local reply (still
    /// deferred: it applies after the callback, as in Envoy).
    fn local_reply_queued(&self, id: u32) -> bool {
        self.store
            .data()
            .deferred
            .iter()
            .any(|d| matches!(d, Deferred::LocalResponse(i, _) if *i == id))
    }

    pub(crate) fn allow_stop_iteration(&self) -> bool {
        self.allow_stop_iteration
    }
}

// VMs, modules and processes move between threads (one VM per test
// thread, or per simulated worker).
const _: fn() = || {
    fn assert_send<T: Send>() {}
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send::<Vm>();
    assert_send_sync::<crate::FilterModule>();
    assert_send_sync::<Process>();
};
