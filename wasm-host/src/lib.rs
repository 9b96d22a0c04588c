//! # ace-wasm-host
//!
//! A proxy-wasm ABI 0.2.1 host on wasmtime, for testing HTTP filters
//! without Envoy, and faithful to Envoy 1.40 where a filter can tell.
//!
//! ## Why it exists
//!
//! The proxy-wasm community's wasmtime test framework is unpublished, keeps
//! its state in globals (tests run one at a time) and serves only
//! `wasm32-unknown-unknown` builds. This crate keeps every VM's state in its
//! wasmtime `Store`, shares only what Envoy shares (through a [`Process`]),
//! serves `wasm32-wasip1` and `wasm32-unknown-unknown` builds, and answers
//! every host call with the status Envoy would give, because the Rust SDK
//! panics on any other and a test host that is kinder than Envoy hides
//! crashes.
//!
//! ## Contents
//!
//! - [`FilterModule`]: compile once; an import the host lacks fails the
//!   load with its name ([`Error::MissingImports`]).
//! - [`Vm`] / [`VmBuilder`]: one Envoy VM with its plugin: configuration,
//!   `vm_id`, clusters, virtual clock ([`Vm::advance`] fires ticks).
//! - [`HttpStream`]: deliver headers, body chunks and trailers callback by
//!   callback and look at the result (headers as they stand, local reply,
//!   pauses, filter state).
//! - [`Vm::exchange`]: one whole request as Envoy's filter manager drives
//!   it, through to an upstream closure; returns what the client and the
//!   upstream observed ([`Exchange`]).
//! - [`Process`]: shared data (with CAS), shared queues, metrics and
//!   clusters shared by several VMs.
//! - gRPC clusters ([`Process::add_grpc_cluster_with`]): a server
//!   function from [`GrpcEvent`]s to [`GrpcReply`]s, or driven by hand
//!   ([`Vm::reply_grpc`]); Envoy's statuses for resets and timeouts.
//! - [`Metadata`]: dynamic metadata set before the filter runs, read
//!   through `get_property(["metadata", ...])` as Envoy serialises it.
//! - [`abi`]: statuses, enums and the pair serialization.
//!
//! ## Design notes
//!
//! - Host functions are defined one by one on a wasmtime `Linker`; nothing
//!   is stubbed implicitly. WASI is Envoy's subset, implemented here, with
//!   a virtual clock and seeded randomness so runs are deterministic.
//! - Envoy's deferred actions (continue, close, local reply) are applied
//!   after the callback returns; callout responses and queue notifications
//!   are delivered only between callbacks ([`Vm::settle`]).
//! - Header-map availability follows Envoy's `getMap`/`getConstMap`: a map
//!   outside its phase reads as empty pairs, and single gets and every
//!   write return `BadArgument` (which the SDK turns into a panic, as in
//!   Envoy).
//! - [`Vm::exchange`] follows what the differential suite observed in
//!   Envoy 1.40: an HTTP/1 request body arrives as its data and then an
//!   empty end-of-stream frame (so a filter that pauses sees
//!   `on_request_body(n, false)` then `on_request_body(n, true)`), local
//!   replies get `content-type: text/plain` only if the filter set none, and
//!   callouts carry `x-envoy-internal` and `x-envoy-expected-rq-timeout-ms`.
//! - A trap marks the VM failed ([`Vm::failure`]); later calls return
//!   [`Error::Failed`], as Envoy stops using a failed VM.
//!
//! ## Example
//!
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

/// Defines each listed host function on a `Linker` under its own name in
/// `$module`, and records `(module, name)` so that loading can name every
/// import the host lacks.
macro_rules! define_imports {
    ($linker:expr, $defined:expr, $module:expr, [$($f:ident),* $(,)?]) => {{
        $(
            $linker.func_wrap($module, stringify!($f), $f)?;
            $defined.insert(($module.to_string(), stringify!($f).to_string()));
        )*
    }};
}
pub(crate) use define_imports;

pub mod abi;
mod error;
mod exchange;
mod grpc;
mod headers;
mod http_call;
mod imports;
mod memory;
mod message;
mod metadata;
mod module;
mod process;
mod properties;
mod state;
mod vm;
mod wasi;

pub use abi::{Action, LogLevel, MetricType, Status};
pub use error::Error;
pub use exchange::{Exchange, Route};
pub use grpc::{GrpcEvent, GrpcHandler, GrpcReply, GrpcRequest};
pub use headers::Headers;
pub use http_call::{CallRequest, CallResponse, CallResult};
pub use message::{Request, Response, UpstreamRequest};
pub use metadata::{Metadata, MetadataValue};
pub use module::FilterModule;
pub use process::{MetricValue, Process, Responder};
pub use state::{LocalResponse, LogEntry, StreamInfo};
pub use vm::{HttpStream, Vm, VmBuilder, DEFAULT_BUFFER_LIMIT};
/// The wasmtime this crate uses, e.g. to build an engine with fuel for
/// [`FilterModule::with_engine`].
pub use wasmtime;
