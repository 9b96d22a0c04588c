//! Configuring a VM and starting it the way Envoy does.

use super::exports::{typed, Exports};
use super::Vm;
use crate::abi::LogLevel;
use crate::error::Error;
use crate::grpc::{GrpcEvent, GrpcReply, GrpcRequest};
use crate::http_call::{CallRequest, CallResult};
use crate::metadata::MetadataValue;
use crate::module::FilterModule;
use crate::process::Process;
use crate::state::{PluginInfo, StreamInfo, VmState};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wasmtime::{Store, StoreLimitsBuilder};

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
    validation_vm: bool,
    buffer_limit: u32,
}

/// Envoy's default `per_connection_buffer_limit_bytes`: 1 MiB.
pub const DEFAULT_BUFFER_LIMIT: u32 = 1024 * 1024;

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
    /// Makes a cluster that answers through a function take `latency` of
    /// virtual time ([`Process::set_cluster_latency`]).
    pub fn cluster_latency(self, name: &str, latency: Duration) -> Self {
        self.process.set_cluster_latency(name, latency);
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
    /// Declares a gRPC cluster whose calls and streams the test answers by
    /// hand ([`Vm::reply_grpc`]).
    pub fn grpc_cluster(self, name: &str) -> Self {
        self.process.add_grpc_cluster(name);
        self
    }
    /// Declares a gRPC cluster whose server is `handler` (see
    /// [`Process::add_grpc_cluster_with`]).
    pub fn grpc_cluster_with(
        self,
        name: &str,
        handler: impl Fn(&GrpcRequest, &GrpcEvent) -> Vec<GrpcReply> + Send + Sync + 'static,
    ) -> Self {
        self.process.add_grpc_cluster_with(name, handler);
        self
    }
    /// Dynamic metadata every stream starts with (what a filter before
    /// this one set): `get_property(["metadata", "filter_metadata", ns,
    /// key])`. A request's own ([`crate::Request::dynamic_metadata`]) is
    /// added on top.
    pub fn dynamic_metadata(
        mut self,
        ns: &str,
        key: &str,
        value: impl Into<MetadataValue>,
    ) -> Self {
        self.info.dynamic_metadata.set(ns, key, value);
        self
    }
    /// `PluginConfig.allow_on_headers_stop_iteration` (Envoy >= 1.35): a
    /// Pause in `on_request_headers` lets body callbacks through, instead
    /// of stopping everything (what [`Vm::exchange`] emulates).
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Whether `start` first runs the throwaway VM Envoy configures once per
    /// plugin configuration (default on). Envoy (proxy-wasm-cpp-host's
    /// configuration canary) instantiates a VM, runs `on_vm_start` and
    /// `on_configure` on it to validate the configuration, and destroys it
    /// without `on_done` or `on_delete`; only then do the VMs that serve
    /// (the main thread's, one per worker) start. Its shared data, metrics
    /// and logs stay. Turn it off for the second and later VMs of one
    /// simulated Envoy (VMs sharing a [`Process`] and a configuration).
    pub fn validation_vm(mut self, on: bool) -> Self {
        self.validation_vm = on;
        self
    }
    /// The listener's `per_connection_buffer_limit_bytes` (Envoy's default
    /// 1 MiB; 0: no limit): how much body a filter may hold with a body
    /// Pause. Over it, a request gets Envoy's local 413 `Payload Too
    /// Large`, and a response whose headers already left is reset (see
    /// [`Vm::exchange`]). A route's `per_request_buffer_limit_bytes` does
    /// not bind a filter that buffers before routing (checked in Envoy
    /// 1.40), so there is no per-route knob.
    pub fn per_connection_buffer_limit_bytes(mut self, bytes: u32) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// Instantiates, initializes and configures the VM: `_initialize`,
    /// root context, `on_vm_start`, `on_configure`; first on a validation VM
    /// that is then dropped (see [`VmBuilder::validation_vm`]).
    pub fn start(self) -> Result<Vm, Error> {
        let validation_logs = if self.validation_vm {
            let canary = self.boot(false)?;
            canary.store.data().logs.clone()
        } else {
            Vec::new()
        };
        let mut vm = self.boot(true)?;
        vm.validation_logs = validation_logs;
        Ok(vm)
    }

    /// One VM through Envoy's start sequence; `serving`: deliver what its
    /// start caused (callouts, queue notifications), which a validation VM
    /// never lives to see.
    fn boot(&self, serving: bool) -> Result<Vm, Error> {
        let epoch_ns = self
            .epoch
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut state = VmState::new(
            self.process.clone(),
            self.plugin.clone(),
            epoch_ns,
            self.seed,
        );
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
            instance,
            exports,
            failed: None,
            info: self.info.clone(),
            allow_stop_iteration: self.allow_on_headers_stop_iteration,
            fuel: self.fuel,
            fuel_consumed: 0,
            buffer_limit: self.buffer_limit,
            validation_logs: Vec::new(),
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
        vm.configure_root(serving)?;
        Ok(vm)
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
            validation_vm: true,
            buffer_limit: DEFAULT_BUFFER_LIMIT,
        }
    }
}
