//! The `env.proxy_*` host functions: ABI 0.2.1 with Envoy's behaviour.
//!
//! Each function decodes its arguments defensively (see [`crate::memory`]),
//! acts on the current (or effective) context, and answers with the status
//! Envoy would give, because the SDK panics on any other. Effects that
//! Envoy defers until the callback returns (continue, close, local reply)
//! are queued in [`VmState::deferred`].
//!
//! One function per host call, named as the guest imports it, grouped by
//! what it touches; [`define`] lists them all.
#![allow(
    clippy::too_many_arguments,
    reason = "a host call takes the arguments the ABI passes"
)]

mod buffers;
mod callouts;
mod context;
mod grpc;
mod log_time;
mod maps;
mod metrics;
mod shared;
mod stream;

use buffers::*;
use callouts::*;
use context::*;
use grpc::*;
use log_time::*;
use maps::*;
use metrics::*;
use shared::*;
use stream::*;

use crate::abi::Status;
use crate::state::VmState;
use std::collections::HashSet;
use wasmtime::{Linker, Result};

/// Registers every host function on `linker`, recording each name in
/// `defined` (used to name missing imports).
pub(crate) fn define(
    linker: &mut Linker<VmState>,
    defined: &mut HashSet<(String, String)>,
) -> Result<()> {
    crate::define_imports!(
        linker,
        defined,
        "env",
        [
            // log_time: logging, the clock, the tick timer
            proxy_log,
            proxy_get_log_level,
            proxy_get_current_time_nanoseconds,
            proxy_set_tick_period_milliseconds,
            // buffers
            proxy_get_buffer_bytes,
            proxy_set_buffer_bytes,
            proxy_get_buffer_status,
            // maps: header and trailer maps
            proxy_get_header_map_pairs,
            proxy_set_header_map_pairs,
            proxy_get_header_map_value,
            proxy_add_header_map_value,
            proxy_replace_header_map_value,
            proxy_remove_header_map_value,
            proxy_get_header_map_size,
            // stream: stream control and properties
            proxy_continue_stream,
            proxy_close_stream,
            proxy_send_local_response,
            proxy_get_property,
            proxy_set_property,
            // shared: shared data and queues
            proxy_get_shared_data,
            proxy_set_shared_data,
            proxy_register_shared_queue,
            proxy_resolve_shared_queue,
            proxy_enqueue_shared_queue,
            proxy_dequeue_shared_queue,
            // callouts
            proxy_http_call,
            proxy_get_status,
            // context: effective context, done, foreign functions
            proxy_set_effective_context,
            proxy_done,
            proxy_call_foreign_function,
            // metrics
            proxy_define_metric,
            proxy_increment_metric,
            proxy_record_metric,
            proxy_get_metric,
            // grpc: calls and streams
            proxy_grpc_call,
            proxy_grpc_stream,
            proxy_grpc_send,
            proxy_grpc_cancel,
            proxy_grpc_close,
        ]
    );
    Ok(())
}

/// `Ok` if an out-parameter write landed, `InvalidMemoryAccess` if not.
fn written(w: Option<()>) -> Result<i32> {
    st(if w.is_some() {
        Status::Ok
    } else {
        Status::InvalidMemoryAccess
    })
}

/// Status as the `i32` the guest receives.
fn st(s: Status) -> Result<i32> {
    Ok(s.code())
}
