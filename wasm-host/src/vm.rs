//! A VM: one wasmtime `Store` + instance, with its plugin (root) context,
//! driven through Envoy's lifecycle.
//!
//! Envoy's order is reproduced: `_initialize` (or `_start`), then
//! `on_context_create(root, 0)`, `on_vm_start`, `on_configure`; streams get
//! `on_context_create(stream, root)` and their header/body/trailer
//! callbacks, then `on_log`, `on_done`, `on_delete` (the access log runs
//! before filters are destroyed). Effects Envoy defers until a callback
//! returns (continue, close, local reply) are applied after it returns, and
//! asynchronous events (callout responses, queue notifications, ticks) are
//! delivered only between callbacks, never inside one.

use crate::abi::{Action, LogLevel};
use crate::error::Error;
use crate::headers::Headers;
use crate::http_call::{CallRequest, CallResponse, CallResult};
use crate::module::FilterModule;
use crate::process::{ClusterBehaviour, MetricValue, Process};
use crate::state::{
    Deferred, Half, LocalResponse, LogEntry, PluginInfo, Side, StreamInfo, StreamState, VmState,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::{Instance, Store, StoreLimitsBuilder, TypedFunc};

type F1 = Option<TypedFunc<i32, ()>>;
type F1R = Option<TypedFunc<i32, i32>>;
type F2 = Option<TypedFunc<(i32, i32), ()>>;
type F2R = Option<TypedFunc<(i32, i32), i32>>;
type F3R = Option<TypedFunc<(i32, i32, i32), i32>>;
type F5 = Option<TypedFunc<(i32, i32, i32, i32, i32), ()>>;

/// The callbacks, typed once at start. A missing export is a no-op, as in
/// cpp-host.
struct Exports {
    context_create: F2,
    vm_start: F2R,
    configure: F2R,
    tick: F1,
    queue_ready: F2,
    request_headers: F3R,
    request_body: F3R,
    request_trailers: F2R,
    response_headers: F3R,
    response_body: F3R,
    response_trailers: F2R,
    http_call_response: F5,
    done: F1R,
    log: F1,
    delete: F1,
}

fn typed<P, R>(
    instance: &Instance,
    store: &mut Store<VmState>,
    name: &str,
) -> Result<Option<TypedFunc<P, R>>, Error>
where
    P: wasmtime::WasmParams,
    R: wasmtime::WasmResults,
{
    match instance.get_func(&mut *store, name) {
        None => Ok(None),
        Some(f) => f
            .typed::<P, R>(&*store)
            .map(Some)
            .map_err(|e| Error::BadExport {
                name: name.to_string(),
                reason: format!("{e:#}"),
            }),
    }
}

impl Exports {
    fn new(i: &Instance, s: &mut Store<VmState>) -> Result<Exports, Error> {
        Ok(Exports {
            context_create: typed(i, s, "proxy_on_context_create")?,
            vm_start: typed(i, s, "proxy_on_vm_start")?,
            configure: typed(i, s, "proxy_on_configure")?,
            tick: typed(i, s, "proxy_on_tick")?,
            queue_ready: typed(i, s, "proxy_on_queue_ready")?,
            request_headers: typed(i, s, "proxy_on_request_headers")?,
            request_body: typed(i, s, "proxy_on_request_body")?,
            request_trailers: typed(i, s, "proxy_on_request_trailers")?,
            response_headers: typed(i, s, "proxy_on_response_headers")?,
            response_body: typed(i, s, "proxy_on_response_body")?,
            response_trailers: typed(i, s, "proxy_on_response_trailers")?,
            http_call_response: typed(i, s, "proxy_on_http_call_response")?,
            done: typed(i, s, "proxy_on_done")?,
            log: typed(i, s, "proxy_on_log")?,
            delete: typed(i, s, "proxy_on_delete")?,
        })
    }
}

/// Configures and starts a [`Vm`]. Obtain one from [`Vm::builder`].
#[derive(Debug)]
pub struct VmBuilder<'m> {
    module: &'m FilterModule,
    process: Process,
    plugin: PluginInfo,
    epoch: SystemTime,
    seed: u64,
    log_level: LogLevel,
    info: StreamInfo,
    allow_on_headers_stop_iteration: bool,
    memory_limit: Option<usize>,
    fuel: Option<u64>,
    count_host_calls: bool,
}

impl<'m> VmBuilder<'m> {
    /// Counts the guest's calls into host functions ([`Vm::host_calls`]).
    /// Inside Envoy a host call costs far more than the Wasm around it, so
    /// this count, like fuel, is a load-independent cost to compare builds
    /// by. Off by default: the hook runs on every call.
    pub fn count_host_calls(mut self) -> Self {
        self.count_host_calls = true;
        self
    }
    /// Caps the guest's linear memory; growing past it fails the guest's
    /// allocation (an SDK filter then traps, as it would on a real OOM).
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = Some(bytes);
        self
    }
    /// Gives every callback this much fuel, so a runaway guest traps
    /// instead of hanging the test; [`Vm::fuel_consumed`] then counts the
    /// work done, deterministically. The module must come from an engine
    /// with fuel enabled ([`FilterModule::with_engine`] with
    /// `wasmtime::Config::consume_fuel(true)`), or `start` fails.
    pub fn fuel_per_callback(mut self, fuel: u64) -> Self {
        self.fuel = Some(fuel);
        self
    }
    /// Runs the VM in this process (shares its data, queues, metrics and
    /// clusters with other VMs of the process). Default: a fresh process.
    pub fn process(mut self, process: &Process) -> Self {
        self.process = process.clone();
        self
    }
    /// The plugin configuration, read by `on_configure`.
    pub fn configuration(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.plugin.configuration = bytes.into();
        self
    }
    /// `vm_config.configuration`, read by `on_vm_start`.
    pub fn vm_configuration(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.plugin.vm_configuration = bytes.into();
        self
    }
    /// `vm_config.vm_id`: the shared-data and queue namespace. Default `""`.
    pub fn vm_id(mut self, id: &str) -> Self {
        self.plugin.vm_id = id.to_string();
        self
    }
    /// The plugin `root_id` (property `plugin_root_id`).
    pub fn root_id(mut self, id: &str) -> Self {
        self.plugin.root_id = id.to_string();
        self
    }
    /// The plugin `name` (property `plugin_name`).
    pub fn plugin_name(mut self, name: &str) -> Self {
        self.plugin.name = name.to_string();
        self
    }
    /// An environment variable (`vm_config.environment_variables`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.plugin
            .environment
            .push((key.to_string(), value.to_string()));
        self
    }
    /// Wall-clock time at the start of the virtual clock. Default: 2026-01-01.
    pub fn clock(mut self, at: SystemTime) -> Self {
        self.epoch = at;
        self
    }
    /// Seed of `random_get`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// What `proxy_get_log_level` reports (Envoy's default: info). Every
    /// line is captured whatever the level.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.log_level = level;
        self
    }
    /// Connection and routing facts every stream's properties report.
    pub fn stream_info(mut self, info: StreamInfo) -> Self {
        self.info = info;
        self
    }
    /// Declares a cluster whose callouts the test completes by hand.
    pub fn cluster(self, name: &str) -> Self {
        self.process.add_cluster(name);
        self
    }
    /// Declares a cluster that answers its callouts with `script`, in order
    /// (then `Reset`).
    pub fn cluster_script(self, name: &str, script: Vec<CallResult>) -> Self {
        self.process.add_cluster_script(name, script);
        self
    }
    /// Declares a cluster that answers callouts through `respond`.
    pub fn cluster_with(
        self,
        name: &str,
        respond: impl Fn(&CallRequest) -> CallResult + Send + Sync + 'static,
    ) -> Self {
        self.process.add_cluster_with(name, respond);
        self
    }
    /// `PluginConfig.allow_on_headers_stop_iteration` (Envoy >= 1.35): a
    /// Pause in `on_request_headers` lets body callbacks through, instead
    /// of stopping everything (what [`Vm::exchange`] emulates).
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Instantiates, initializes and configures the VM: `_initialize`,
    /// root context, `on_vm_start`, `on_configure`.
    pub fn start(self) -> Result<Vm, Error> {
        let epoch_ns = self
            .epoch
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut state = VmState::new(self.process, self.plugin, epoch_ns, self.seed);
        state.log_level = self.log_level;
        if let Some(limit) = self.memory_limit {
            state.limits = StoreLimitsBuilder::new().memory_size(limit).build();
        }
        let mut store = Store::new(&self.module.engine, state);
        store.limiter(|s| &mut s.limits);
        if self.count_host_calls {
            store.call_hook(|mut s, hook| {
                if matches!(hook, wasmtime::CallHook::CallingHost) {
                    s.data_mut().host_calls += 1;
                }
                Ok(())
            });
        }
        if let Some(fuel) = self.fuel {
            store.set_fuel(fuel).map_err(|e| {
                Error::Instantiate(format!("fuel needs an engine with consume_fuel: {e:#}"))
            })?;
        }
        let instance = self
            .module
            .pre
            .instantiate(&mut store)
            .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        let memory = instance.get_memory(&mut store, "memory");
        if memory.is_none() {
            return Err(Error::BadExport {
                name: "memory".into(),
                reason: "the module exports no memory".into(),
            });
        }
        let alloc = match typed::<i32, i32>(&instance, &mut store, "malloc")? {
            Some(f) => Some(f),
            None => typed::<i32, i32>(&instance, &mut store, "proxy_on_memory_allocate")?,
        };
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        let exports = Exports::new(&instance, &mut store)?;
        let mut vm = Vm {
            store,
            exports,
            failed: None,
            info: self.info,
            allow_stop_iteration: self.allow_on_headers_stop_iteration,
            fuel: self.fuel,
            fuel_consumed: 0,
        };
        let init = match typed::<(), ()>(&instance, &mut vm.store, "_initialize")? {
            Some(f) => Some(("_initialize", f)),
            None => typed::<(), ()>(&instance, &mut vm.store, "_start")?.map(|f| ("_start", f)),
        };
        if let Some((name, f)) = init {
            vm.call_void(name, 0, Some(f), |f, s| f.call(s, ()))?;
            // cpp-host then runs a `main`, if the module also exports one.
            if name == "_initialize" {
                if let Some(f) = typed::<(), i32>(&instance, &mut vm.store, "__main_void")? {
                    vm.call_ret("__main_void", 0, Some(f), 0, |f, s| f.call(s, ()))?;
                } else if let Some(f) = typed::<(i32, i32), i32>(&instance, &mut vm.store, "main")?
                {
                    vm.call_ret("main", 0, Some(f), 0, |f, s| f.call(s, (0, 0)))?;
                }
            }
        }
        let root = vm.alloc_context();
        vm.store.data_mut().root_id = root;
        let cc = vm.exports.context_create.clone();
        vm.call_void("proxy_on_context_create", root, cc, |f, s| {
            f.call(s, (root as i32, 0))
        })?;
        let vm_cfg_len = vm.store.data().plugin.vm_configuration.len() as i32;
        let f = vm.exports.vm_start.clone();
        let ok = vm.call_ret("proxy_on_vm_start", root, f, 1, |f, s| {
            f.call(s, (root as i32, vm_cfg_len))
        })?;
        if ok == 0 {
            return Err(Error::Rejected {
                callback: "proxy_on_vm_start".into(),
            });
        }
        vm.configure_root()?;
        Ok(vm)
    }
}

/// One Envoy Wasm VM (a worker's, or the main thread's) running one plugin.
///
/// All state is in the VM's store and its [`Process`]; VMs are independent
/// unless they share a process.
pub struct Vm {
    store: Store<VmState>,
    exports: Exports,
    failed: Option<String>,
    info: StreamInfo,
    allow_stop_iteration: bool,
    fuel: Option<u64>,
    fuel_consumed: u64,
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
    /// Starts configuring a VM for `module`.
    pub fn builder(module: &FilterModule) -> VmBuilder<'_> {
        VmBuilder {
            module,
            process: Process::new(),
            plugin: PluginInfo::default(),
            // 2026-01-01T00:00:00Z
            epoch: UNIX_EPOCH + Duration::from_secs(1_767_225_600),
            seed: 0x5eed,
            log_level: LogLevel::Info,
            info: StreamInfo::default(),
            allow_on_headers_stop_iteration: false,
            memory_limit: None,
            fuel: None,
            count_host_calls: false,
        }
    }

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

    fn check<T>(&mut self, callback: &str, r: wasmtime::Result<T>) -> Result<T, Error> {
        r.map_err(|e| {
            let critical = self
                .store
                .data()
                .logs
                .iter()
                .rev()
                .find(|l| l.level == LogLevel::Critical)
                .map(|l| format!(" (guest log: {})", l.message))
                .unwrap_or_default();
            let message = format!("{e:#}{critical}");
            self.failed = Some(format!("{callback}: {message}"));
            Error::Trap {
                callback: callback.to_string(),
                message,
            }
        })
    }

    fn enter(&mut self, ctx: u32) -> Result<(), Error> {
        if let Some(f) = &self.failed {
            return Err(Error::Failed(f.clone()));
        }
        if let Some(fuel) = self.fuel {
            // Cannot fail: start() checked the engine meters fuel.
            let _ = self.store.set_fuel(fuel);
        }
        let s = self.store.data_mut();
        s.current = ctx;
        s.effective = None;
        Ok(())
    }

    fn leave(&mut self) {
        if let Some(fuel) = self.fuel {
            let left = self.store.get_fuel().unwrap_or(fuel);
            self.fuel_consumed += fuel.saturating_sub(left);
        }
        let s = self.store.data_mut();
        s.current = 0;
        s.effective = None;
    }

    fn call_void<F: Clone>(
        &mut self,
        name: &str,
        ctx: u32,
        f: Option<F>,
        run: impl FnOnce(&F, &mut Store<VmState>) -> wasmtime::Result<()>,
    ) -> Result<(), Error> {
        self.enter(ctx)?;
        let r = match &f {
            Some(f) => run(f, &mut self.store),
            None => Ok(()),
        };
        self.leave();
        self.check(name, r)
    }

    fn call_ret<F: Clone>(
        &mut self,
        name: &str,
        ctx: u32,
        f: Option<F>,
        default: i32,
        run: impl FnOnce(&F, &mut Store<VmState>) -> wasmtime::Result<i32>,
    ) -> Result<i32, Error> {
        self.enter(ctx)?;
        let r = match &f {
            Some(f) => run(f, &mut self.store),
            None => Ok(default),
        };
        self.leave();
        self.check(name, r)
    }

    fn configure_root(&mut self) -> Result<(), Error> {
        let root = self.root_id();
        let len = self.store.data().plugin.configuration.len() as i32;
        self.store.data_mut().configuring = true;
        let f = self.exports.configure.clone();
        let r = self.call_ret("proxy_on_configure", root, f, 1, |f, s| {
            f.call(s, (root as i32, len))
        });
        self.store.data_mut().configuring = false;
        let ok = r?;
        self.settle()?;
        if ok == 0 {
            return Err(Error::Rejected {
                callback: "proxy_on_configure".into(),
            });
        }
        Ok(())
    }

    /// Delivers a new plugin configuration to the running root context
    /// (`on_configure`); `Err(Rejected)` if the filter refuses it.
    pub fn reconfigure(&mut self, bytes: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.store.data_mut().plugin.configuration = bytes.into();
        self.configure_root()
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

    /// The tick period the filter set (`None` if off).
    pub fn tick_period(&self) -> Option<Duration> {
        let ms = self.store.data().tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Current virtual wall-clock time.
    pub fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.store.data().now_ns())
    }

    /// Advances the virtual clock, firing `on_tick` once per elapsed period
    /// (each at its due time), and delivering what those ticks cause.
    pub fn advance(&mut self, by: Duration) -> Result<(), Error> {
        let target = self
            .store
            .data()
            .elapsed_ns
            .saturating_add(by.as_nanos() as u64);
        loop {
            let s = self.store.data();
            match s.next_tick_ns {
                Some(due) if due <= target => {
                    let period = s.tick_period_ms * 1_000_000;
                    let s = self.store.data_mut();
                    s.elapsed_ns = due;
                    s.next_tick_ns = Some(due + period.max(1));
                    let root = s.root_id;
                    let f = self.exports.tick.clone();
                    self.call_void("proxy_on_tick", root, f, |f, st| f.call(st, root as i32))?;
                    self.settle()?;
                }
                _ => break,
            }
        }
        self.store.data_mut().elapsed_ns = target;
        Ok(())
    }

    // ---- callouts ----

    /// Callouts dispatched and not yet answered, oldest first.
    pub fn pending_http_calls(&self) -> Vec<CallRequest> {
        self.store.data().pending_calls.values().cloned().collect()
    }

    /// Answers a pending callout: the filter's `on_http_call_response` runs
    /// on the root context with the response's header, body and trailer
    /// sizes (`n_headers == 0` for [`CallResult::Reset`]).
    pub fn complete_http_call(&mut self, token: u32, result: CallResult) -> Result<(), Error> {
        if self.store.data_mut().pending_calls.remove(&token).is_none() {
            return Err(Error::Unknown(format!("http call token {token}")));
        }
        self.deliver_call(token, result)?;
        self.settle()
    }

    fn deliver_call(&mut self, token: u32, result: CallResult) -> Result<(), Error> {
        let (resp, status) = match result {
            CallResult::Response(r) => (r, (0, Vec::new())),
            CallResult::Reset => (CallResponse::default(), (14, b"reset".to_vec())),
        };
        let (nh, nb, nt) = (
            resp.headers.len() as i32,
            resp.body.len() as i32,
            resp.trailers.len() as i32,
        );
        let s = self.store.data_mut();
        s.status = status;
        s.call_response = Some(resp);
        let root = s.root_id;
        let f = self.exports.http_call_response.clone();
        let r = self.call_void("proxy_on_http_call_response", root, f, |f, st| {
            f.call(st, (root as i32, token as i32, nh, nb, nt))
        });
        self.store.data_mut().call_response = None;
        r?;
        self.apply_deferred();
        Ok(())
    }

    /// Delivers what is due between callbacks until nothing is: deferred
    /// actions, callouts to clusters that answer by function, and queue
    /// notifications addressed to this VM. Called after every callback;
    /// call it yourself after another VM enqueued to this one's queue.
    pub fn settle(&mut self) -> Result<(), Error> {
        self.apply_deferred();
        loop {
            let auto: Vec<(u32, ClusterBehaviour, CallRequest)> = {
                let s = self.store.data();
                s.pending_calls
                    .values()
                    .filter_map(|c| match s.process.cluster(&c.cluster) {
                        Some(b @ ClusterBehaviour::Respond(_)) => Some((c.token, b, c.clone())),
                        _ => None,
                    })
                    .collect()
            };
            let ready = {
                let s = self.store.data();
                s.process.take_ready(s.vm_instance)
            };
            if auto.is_empty() && ready.is_empty() {
                return Ok(());
            }
            for (token, behaviour, request) in auto {
                self.store.data_mut().pending_calls.remove(&token);
                if let ClusterBehaviour::Respond(f) = behaviour {
                    let result = f(&request);
                    self.deliver_call(token, result)?;
                }
            }
            for (root, queue) in ready {
                let f = self.exports.queue_ready.clone();
                self.call_void("proxy_on_queue_ready", root, f, |f, st| {
                    f.call(st, (root as i32, queue as i32))
                })?;
                self.apply_deferred();
            }
        }
    }

    fn apply_deferred(&mut self) {
        let deferred = std::mem::take(&mut self.store.data_mut().deferred);
        for d in deferred {
            let streams = &mut self.store.data_mut().streams;
            match d {
                Deferred::Continue(id, side) => {
                    if let Some(st) = streams.get_mut(&id) {
                        st.half_mut(side).resume();
                    }
                }
                Deferred::Close(id) => {
                    if let Some(st) = streams.get_mut(&id) {
                        st.closed = true;
                    }
                }
                Deferred::LocalResponse(id, reply) => {
                    if let Some(st) = streams.get_mut(&id) {
                        if st.local_response.is_none() {
                            st.local_response = Some(reply);
                        }
                    }
                }
            }
        }
    }

    // ---- streams ----

    /// Opens an HTTP stream: `on_context_create(stream, root)`.
    pub fn http_stream(&mut self) -> Result<HttpStream<'_>, Error> {
        let id = self.alloc_context();
        let root = self.root_id();
        let info = self.info.clone();
        self.store.data_mut().streams.insert(
            id,
            StreamState {
                info,
                ..StreamState::default()
            },
        );
        let f = self.exports.context_create.clone();
        self.call_void("proxy_on_context_create", id, f, |f, s| {
            f.call(s, (id as i32, root as i32))
        })?;
        Ok(HttpStream { vm: self, id })
    }

    /// Returns to an open stream by id.
    pub fn stream(&mut self, id: u32) -> Result<HttpStream<'_>, Error> {
        if !self.store.data().streams.contains_key(&id) {
            return Err(Error::Unknown(format!("stream {id}")));
        }
        Ok(HttpStream { vm: self, id })
    }

    pub(crate) fn stream_state(&self, id: u32) -> Option<&StreamState> {
        self.store.data().streams.get(&id)
    }

    pub(crate) fn stream_state_mut(&mut self, id: u32) -> Option<&mut StreamState> {
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

    fn stream_callback(
        &mut self,
        name: &str,
        id: u32,
        f: F3R,
        a: i32,
        b: i32,
    ) -> Result<Action, Error> {
        let r = self.call_ret(name, id, f, 0, |f, s| f.call(s, (id as i32, a, b)))?;
        Ok(Action::from_i32(r))
    }

    fn stream_callback2(&mut self, name: &str, id: u32, f: F2R, a: i32) -> Result<Action, Error> {
        let r = self.call_ret(name, id, f, 0, |f, s| f.call(s, (id as i32, a)))?;
        Ok(Action::from_i32(r))
    }
}

/// A handle on one HTTP stream of a [`Vm`]: send it what Envoy would, then
/// look at what the filter did.
///
/// These calls invoke the callbacks directly, in the order you make them;
/// [`Vm::exchange`] drives a whole request the way Envoy's filter manager
/// does (pauses, buffering, local replies, the upstream).
pub struct HttpStream<'vm> {
    vm: &'vm mut Vm,
    id: u32,
}

impl std::fmt::Debug for HttpStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpStream").field("id", &self.id).finish()
    }
}

impl<'vm> HttpStream<'vm> {
    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Current virtual wall-clock time.
    pub fn now(&self) -> SystemTime {
        self.vm.now()
    }

    /// The VM, e.g. to complete a callout or read logs mid-stream.
    pub fn vm(&mut self) -> &mut Vm {
        self.vm
    }

    fn st(&self) -> &StreamState {
        // INVARIANT: a handle exists only for a stream in the map, and only
        // `finish` (which consumes the handle) removes it.
        static EMPTY: std::sync::OnceLock<StreamState> = std::sync::OnceLock::new();
        self.vm
            .stream_state(self.id)
            .unwrap_or_else(|| EMPTY.get_or_init(StreamState::default))
    }

    fn st_mut(&mut self) -> Result<&mut StreamState, Error> {
        let id = self.id;
        self.vm
            .stream_state_mut(id)
            .ok_or_else(|| Error::Unknown(format!("stream {id}")))
    }

    /// Sets the connection and routing facts the stream's properties report.
    pub fn set_info(&mut self, info: StreamInfo) -> Result<(), Error> {
        self.st_mut()?.info = info;
        Ok(())
    }

    /// Changes some of the stream's facts (e.g. the cluster once routed).
    pub fn update_info(&mut self, f: impl FnOnce(&mut StreamInfo)) -> Result<(), Error> {
        f(&mut self.st_mut()?.info);
        Ok(())
    }

    /// The stream's connection and routing facts.
    pub fn info(&self) -> &StreamInfo {
        &self.st().info
    }

    /// Delivers request headers (`on_request_headers`). The returned action
    /// is the filter's; a local reply or a pause shows in
    /// [`HttpStream::local_response`] / [`HttpStream::request_paused`].
    pub fn send_request_headers(
        &mut self,
        headers: impl Into<Headers>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_headers(Side::Request, headers.into(), end_of_stream)
    }

    /// Delivers a request body chunk (`on_request_body`). After a Pause the
    /// next call sees the whole buffered body, as with Envoy's
    /// StopIterationAndBuffer.
    pub fn send_request_body(
        &mut self,
        chunk: impl AsRef<[u8]>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_body(Side::Request, chunk.as_ref(), end_of_stream)
    }

    /// Delivers request trailers (`on_request_trailers`).
    pub fn send_request_trailers(&mut self, trailers: impl Into<Headers>) -> Result<Action, Error> {
        self.send_trailers(Side::Request, trailers.into())
    }

    /// Delivers response headers (`on_response_headers`).
    pub fn send_response_headers(
        &mut self,
        headers: impl Into<Headers>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_headers(Side::Response, headers.into(), end_of_stream)
    }

    /// Delivers a response body chunk (`on_response_body`), buffering after
    /// a Pause like the request side.
    pub fn send_response_body(
        &mut self,
        chunk: impl AsRef<[u8]>,
        end_of_stream: bool,
    ) -> Result<Action, Error> {
        self.send_body(Side::Response, chunk.as_ref(), end_of_stream)
    }

    /// Delivers response trailers (`on_response_trailers`).
    pub fn send_response_trailers(
        &mut self,
        trailers: impl Into<Headers>,
    ) -> Result<Action, Error> {
        self.send_trailers(Side::Response, trailers.into())
    }

    /// After a callback: a Continue (without a local reply) lets the half
    /// go on past the filter; anything else holds it. Then deferred actions
    /// and events run.
    fn after(
        &mut self,
        side: Side,
        action: Action,
        passed: impl FnOnce(&mut Half),
    ) -> Result<Action, Error> {
        let local = self.vm.local_reply_queued(self.id);
        let half = self.st_mut()?.half_mut(side);
        if action == Action::Continue && !local {
            passed(half);
        } else {
            half.paused = true;
        }
        self.vm.settle()?;
        Ok(action)
    }

    fn send_headers(&mut self, side: Side, headers: Headers, end: bool) -> Result<Action, Error> {
        let n = headers.len() as i32;
        let st = self.st_mut()?;
        if side == Side::Response {
            st.info.response_code = headers.get(":status").and_then(|s| s.parse().ok());
        }
        let half = st.half_mut(side);
        half.headers = headers;
        half.headers_open = true;
        half.end = end;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_headers",
                self.vm.exports.request_headers.clone(),
            ),
            Side::Response => (
                "proxy_on_response_headers",
                self.vm.exports.response_headers.clone(),
            ),
        };
        let action = self.vm.stream_callback(name, self.id, f, n, end as i32)?;
        self.after(side, action, |h| h.headers_open = false)
    }

    fn send_body(&mut self, side: Side, chunk: &[u8], end: bool) -> Result<Action, Error> {
        let half = self.st_mut()?.half_mut(side);
        half.body.extend_from_slice(chunk);
        half.body_open = true;
        half.end = end;
        let size = half.body.len() as i32;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_body",
                self.vm.exports.request_body.clone(),
            ),
            Side::Response => (
                "proxy_on_response_body",
                self.vm.exports.response_body.clone(),
            ),
        };
        let action = self
            .vm
            .stream_callback(name, self.id, f, size, end as i32)?;
        // A Continue here releases headers held by a headers Pause, but the
        // header map stays the filter's (Envoy clears `request_headers_`
        // only when `on_request_headers` itself returns Continue).
        self.after(side, action, |h| {
            h.paused = false;
            h.forward_body();
        })
    }

    fn send_trailers(&mut self, side: Side, trailers: Headers) -> Result<Action, Error> {
        let n = trailers.len() as i32;
        let half = self.st_mut()?.half_mut(side);
        half.trailers = trailers;
        half.trailers_open = true;
        half.end = true;
        let (name, f) = match side {
            Side::Request => (
                "proxy_on_request_trailers",
                self.vm.exports.request_trailers.clone(),
            ),
            Side::Response => (
                "proxy_on_response_trailers",
                self.vm.exports.response_trailers.clone(),
            ),
        };
        let action = self.vm.stream_callback2(name, self.id, f, n)?;
        // A Continue releases whatever the filter held (headers after a
        // headers Pause, a buffered body): Envoy's filter manager resumes
        // iteration, so the upstream gets headers, body and trailers. The
        // header map stays writable, as after a body Continue.
        self.after(side, action, |h| {
            h.trailers_open = false;
            h.paused = false;
            h.forward_body();
        })
    }

    /// Ends the stream: `on_log` (every map read-only), `on_done`,
    /// `on_delete`. The stream's data is gone afterwards.
    pub fn finish(self) -> Result<(), Error> {
        let id = self.id;
        let vm = self.vm;
        if let Some(st) = vm.stream_state_mut(id) {
            st.access_log_phase = true;
        }
        let f = vm.exports.log.clone();
        vm.call_void("proxy_on_log", id, f, |f, s| f.call(s, id as i32))?;
        if let Some(st) = vm.stream_state_mut(id) {
            st.access_log_phase = false;
        }
        let f = vm.exports.done.clone();
        vm.call_ret("proxy_on_done", id, f, 1, |f, s| f.call(s, id as i32))?;
        let f = vm.exports.delete.clone();
        vm.call_void("proxy_on_delete", id, f, |f, s| f.call(s, id as i32))?;
        vm.store.data_mut().streams.remove(&id);
        vm.settle()
    }

    // ---- observations ----

    /// The request headers as they stand (what goes upstream once the
    /// request continues).
    pub fn request_headers(&self) -> &Headers {
        &self.st().request.headers
    }
    /// The request trailers as they stand.
    pub fn request_trailers(&self) -> &Headers {
        &self.st().request.trailers
    }
    /// The response headers as they stand (what the client gets).
    pub fn response_headers(&self) -> &Headers {
        &self.st().response.headers
    }
    /// The response trailers as they stand.
    pub fn response_trailers(&self) -> &Headers {
        &self.st().response.trailers
    }
    /// Request body bytes that went past the filter (upstream-bound).
    pub fn forwarded_request_body(&self) -> &[u8] {
        &self.st().request.forwarded_body
    }
    /// Response body bytes that went past the filter (client-bound).
    pub fn forwarded_response_body(&self) -> &[u8] {
        &self.st().response.forwarded_body
    }
    /// Request body bytes the filter is holding (buffered after a Pause).
    pub fn buffered_request_body(&self) -> &[u8] {
        &self.st().request.body
    }
    /// Response body bytes the filter is holding.
    pub fn buffered_response_body(&self) -> &[u8] {
        &self.st().response.body
    }
    /// The local reply the filter sent, if any.
    pub fn local_response(&self) -> Option<&LocalResponse> {
        self.st().local_response.as_ref()
    }
    /// Whether the request is held by the filter (a Pause not yet resumed).
    pub fn request_paused(&self) -> bool {
        self.st().request.paused
    }
    /// Whether the response is held by the filter.
    pub fn response_paused(&self) -> bool {
        self.st().response.paused
    }
    /// How often the filter resumed the request (`resume_http_request`).
    pub fn request_resumes(&self) -> u32 {
        self.st().request.resumes
    }
    /// Whether the filter reset the stream (`reset_http_request/response`).
    pub fn closed(&self) -> bool {
        self.st().closed
    }
    /// How many times the filter changed request headers or called
    /// `clear_route_cache` (each clears Envoy's route cache for ABI 0.2.1).
    pub fn route_cache_clears(&self) -> u32 {
        self.st().request_header_mutations
    }
    /// A value the filter stored with `set_property` (Envoy filter state
    /// `wasm.<path>`); `path` segments joined by NUL.
    pub fn filter_state(&self, path: &[&str]) -> Option<&[u8]> {
        let key = path.join("\0");
        self.st()
            .filter_state
            .get(key.as_bytes())
            .map(Vec::as_slice)
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>, const N: usize> From<[(K, V); N]> for Headers {
    fn from(pairs: [(K, V); N]) -> Headers {
        pairs.into_iter().collect()
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> From<Vec<(K, V)>> for Headers {
    fn from(pairs: Vec<(K, V)>) -> Headers {
        pairs.into_iter().collect()
    }
}

impl From<&Headers> for Headers {
    fn from(h: &Headers) -> Headers {
        h.clone()
    }
}

// VMs, modules and processes move between threads (one VM per test
// thread, or per simulated worker).
const _: () = {
    fn assert_send<T: Send>() {}
    fn assert_send_sync<T: Send + Sync>() {}
    #[allow(dead_code)]
    fn check() {
        assert_send::<Vm>();
        assert_send_sync::<FilterModule>();
        assert_send_sync::<Process>();
    }
};
