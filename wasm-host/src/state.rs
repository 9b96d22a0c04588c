//! Per-VM host state: the data of one wasmtime `Store`.
//!
//! Everything a VM's host functions read or write lives here (and in the
//! shared [`Process`]), never in globals, so any number of VMs, and tests,
//! run side by side.

use crate::abi::{LogLevel, MetricType};
use crate::grpc::OpenGrpc;
use crate::headers::Headers;
use crate::http_call::{CallRequest, CallResponse, CallResult};
use crate::metadata::Metadata;
use crate::process::Process;
use std::collections::{BTreeMap, HashMap};
use wasmtime::{Memory, StoreLimits, TypedFunc};

/// One captured log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Level as the guest gave it (stdout is Info, stderr Error).
    pub level: LogLevel,
    /// The message, lossily decoded.
    pub message: String,
    /// Context id current when it was logged (0 outside any callback).
    pub context_id: u32,
}

/// A local response a filter sent (`send_http_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status code.
    pub status: u32,
    /// The headers the filter passed (Envoy adds `:status`,
    /// `content-length` and, for a non-empty body, `content-type` itself).
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
    /// Response code details (`%RESPONSE_CODE_DETAILS%`), spaces replaced by `_`.
    pub details: String,
    /// gRPC status, `None` for the SDK's -1.
    pub grpc_status: Option<i32>,
}

/// Connection and routing facts a stream's properties report.
///
/// Defaults describe a plain-text HTTP/1.1 connection from 127.0.0.1; set
/// what your filter reads.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// `source.address` (`ip:port`).
    pub source_address: String,
    /// `destination.address` (`ip:port`).
    pub destination_address: String,
    /// `connection.id`.
    pub connection_id: u64,
    /// `connection.mtls`.
    pub mtls: bool,
    /// `connection.requested_server_name` (SNI), empty if none.
    pub requested_server_name: String,
    /// `request.protocol`, e.g. `HTTP/1.1`.
    pub protocol: String,
    /// `xds.route_name`.
    pub route_name: String,
    /// `xds.virtual_host_name`.
    pub virtual_host_name: String,
    /// `xds.cluster_name`, once the router picked one.
    pub cluster_name: Option<String>,
    /// `upstream.address`, once connected.
    pub upstream_address: Option<String>,
    /// `response.code`, once a response exists.
    pub response_code: Option<u32>,
    /// `response.code_details`.
    pub response_code_details: Option<String>,
    /// `response.flags` bitmask.
    pub response_flags: u64,
    /// Dynamic metadata other filters set (`metadata` attribute):
    /// namespace → struct.
    pub dynamic_metadata: Metadata,
}

impl Default for StreamInfo {
    fn default() -> StreamInfo {
        StreamInfo {
            source_address: "127.0.0.1:40000".into(),
            destination_address: "127.0.0.1:10000".into(),
            connection_id: 1,
            mtls: false,
            requested_server_name: String::new(),
            protocol: "HTTP/1.1".into(),
            route_name: String::new(),
            virtual_host_name: String::new(),
            cluster_name: None,
            upstream_address: None,
            response_code: None,
            response_code_details: None,
            response_flags: 0,
            dynamic_metadata: Metadata::default(),
        }
    }
}

/// One direction of a stream (request or response), as Envoy's filter
/// manager sees it around this filter.
#[derive(Debug, Default)]
pub(crate) struct Half {
    pub headers: Headers,
    pub trailers: Headers,
    /// Body bytes the filter currently sees (buffered since a Pause).
    pub body: Vec<u8>,
    /// Body bytes that went past the filter.
    pub forwarded_body: Vec<u8>,
    /// Envoy's `request_headers_ != nullptr` (resp. response): readable and
    /// writable. Set by the headers callback and cleared only when it
    /// returns Continue: after a headers Pause the map stays the filter's
    /// even once a body or trailers Continue let the request go on.
    pub headers_open: bool,
    pub trailers_open: bool,
    pub body_open: bool,
    /// A callback returned Pause (or sent a local reply) and nothing resumed it.
    pub paused: bool,
    pub resumes: u32,
    pub end: bool,
}

impl Half {
    /// The filter let the buffered body through.
    pub fn forward_body(&mut self) {
        let body = std::mem::take(&mut self.body);
        self.forwarded_body.extend_from_slice(&body);
        self.body_open = false;
    }

    /// `continue_stream` took effect: iteration resumes past the filter.
    pub fn resume(&mut self) {
        if self.paused {
            self.paused = false;
            self.resumes += 1;
            self.headers_open = false;
            self.trailers_open = false;
            self.forward_body();
        }
    }
}

/// Which half of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Request,
    Response,
}

/// Where a stream stands.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    pub request: Half,
    pub response: Half,
    /// `on_log` runs: every map readable, none writable.
    pub access_log_phase: bool,
    pub local_response: Option<LocalResponse>,
    pub closed: bool,
    /// The response body the filter held outgrew the buffer limit.
    pub response_overflow: bool,
    /// Number of request-header mutations (each clears Envoy's route cache
    /// for ABI 0.2.1 modules).
    pub request_header_mutations: u32,
    pub filter_state: BTreeMap<Vec<u8>, Vec<u8>>,
    pub info: StreamInfo,
}

impl StreamState {
    pub fn half_mut(&mut self, side: Side) -> &mut Half {
        match side {
            Side::Request => &mut self.request,
            Side::Response => &mut self.response,
        }
    }
}

/// An action a host call asked for, applied after the callback returns
/// (Envoy's `addAfterVmCallAction`).
#[derive(Debug, Clone)]
pub(crate) enum Deferred {
    Continue(u32, Side),
    Close(u32),
    LocalResponse(u32, LocalResponse),
}

/// A defined metric, per VM id.
#[derive(Debug, Clone)]
pub(crate) struct MetricDef {
    pub kind: MetricType,
    pub name: String,
}

/// Static facts about the plugin and VM, set at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct PluginInfo {
    pub name: String,
    pub root_id: String,
    pub vm_id: String,
    pub vm_configuration: Vec<u8>,
    pub configuration: Vec<u8>,
    pub environment: Vec<(String, String)>,
}

/// The data of a VM's `Store`.
pub(crate) struct VmState {
    /// Calls from the guest into host functions (counted only when
    /// [`crate::VmBuilder::count_host_calls`] is set).
    pub host_calls: u64,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<i32, i32>>,
    pub process: Process,
    pub vm_instance: u64,
    pub plugin: PluginInfo,
    /// Virtual wall clock (ns since the Unix epoch) and monotonic clock.
    pub epoch_ns: u64,
    pub elapsed_ns: u64,
    pub rng: u64,
    pub logs: Vec<LogEntry>,
    pub log_level: LogLevel,
    pub root_id: u32,
    pub next_context_id: u32,
    /// Context whose callback is running (0: none).
    pub current: u32,
    pub effective: Option<u32>,
    pub streams: HashMap<u32, StreamState>,
    /// Plugin configuration bytes are readable only inside `on_configure`.
    pub configuring: bool,
    pub tick_period_ms: u64,
    pub next_tick_ns: Option<u64>,
    pub next_token: u32,
    pub pending_calls: BTreeMap<u32, CallRequest>,
    /// Pending callouts' timeouts: token → when (elapsed ns) it times out.
    pub call_deadlines: BTreeMap<u32, u64>,
    /// Answers of clusters with latency: token → (when, answer).
    pub call_answers: BTreeMap<u32, (u64, CallResult)>,
    /// The callout response being delivered (`on_http_call_response`).
    pub call_response: Option<CallResponse>,
    pub status: (u32, Vec<u8>),
    /// Open gRPC calls and streams by token.
    pub grpc: BTreeMap<u32, OpenGrpc>,
    pub next_grpc_call: u32,
    pub next_grpc_stream: u32,
    /// What a gRPC callback being delivered exposes: the message
    /// (`GrpcReceiveBuffer`) and the metadata maps.
    pub grpc_message: Option<Vec<u8>>,
    pub grpc_initial_metadata: Option<Headers>,
    pub grpc_trailing_metadata: Option<Headers>,
    pub metrics: HashMap<u32, MetricDef>,
    pub next_metric: u32,
    pub deferred: Vec<Deferred>,
    pub done_called: bool,
    /// Memory cap (wasmtime `ResourceLimiter`).
    pub limits: StoreLimits,
}

impl std::fmt::Debug for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmState")
            .field("plugin", &self.plugin)
            .field("root_id", &self.root_id)
            .field("streams", &self.streams.len())
            .field("logs", &self.logs.len())
            .finish_non_exhaustive()
    }
}

impl VmState {
    pub fn new(process: Process, plugin: PluginInfo, epoch_ns: u64, seed: u64) -> VmState {
        let vm_instance = process.new_vm_instance();
        VmState {
            host_calls: 0,
            memory: None,
            alloc: None,
            process,
            vm_instance,
            plugin,
            epoch_ns,
            elapsed_ns: 0,
            rng: seed | 1,
            logs: Vec::new(),
            log_level: LogLevel::Trace,
            root_id: 0,
            next_context_id: 1,
            current: 0,
            effective: None,
            streams: HashMap::new(),
            configuring: false,
            tick_period_ms: 0,
            next_tick_ns: None,
            next_token: 1,
            pending_calls: BTreeMap::new(),
            call_deadlines: BTreeMap::new(),
            call_answers: BTreeMap::new(),
            call_response: None,
            status: (0, Vec::new()),
            grpc: BTreeMap::new(),
            // Envoy's counters start at the kind's tag: 1 (calls), 2 (streams).
            next_grpc_call: 1,
            next_grpc_stream: 2,
            grpc_message: None,
            grpc_initial_metadata: None,
            grpc_trailing_metadata: None,
            metrics: HashMap::new(),
            next_metric: 0,
            deferred: Vec::new(),
            done_called: false,
            limits: StoreLimits::default(),
        }
    }

    /// The context host calls act on: the effective one if the guest set it.
    pub fn context(&self) -> u32 {
        self.effective.unwrap_or(self.current)
    }

    pub fn now_ns(&self) -> u64 {
        self.epoch_ns.saturating_add(self.elapsed_ns)
    }

    /// xorshift64*: deterministic bytes for `random_get`.
    pub fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn log(&mut self, level: LogLevel, message: String) {
        let context_id = self.context();
        self.logs.push(LogEntry {
            level,
            message,
            context_id,
        });
    }
}
