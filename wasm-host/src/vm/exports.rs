//! The guest's callbacks, looked up and typed once when the VM starts.

use crate::error::Error;
use crate::state::VmState;
use wasmtime::{Instance, Store, TypedFunc};

pub(super) type F1 = Option<TypedFunc<i32, ()>>;
pub(super) type F1R = Option<TypedFunc<i32, i32>>;
pub(super) type F2 = Option<TypedFunc<(i32, i32), ()>>;
pub(super) type F2R = Option<TypedFunc<(i32, i32), i32>>;
pub(super) type F3R = Option<TypedFunc<(i32, i32, i32), i32>>;
pub(super) type F3 = Option<TypedFunc<(i32, i32, i32), ()>>;
pub(super) type F5 = Option<TypedFunc<(i32, i32, i32, i32, i32), ()>>;

/// The callbacks, typed once at start. A missing export is a no-op, as in
/// cpp-host.
pub(super) struct Exports {
    pub(super) context_create: F2,
    pub(super) vm_start: F2R,
    pub(super) configure: F2R,
    pub(super) tick: F1,
    pub(super) queue_ready: F2,
    pub(super) request_headers: F3R,
    pub(super) request_body: F3R,
    pub(super) request_trailers: F2R,
    pub(super) response_headers: F3R,
    pub(super) response_body: F3R,
    pub(super) response_trailers: F2R,
    pub(super) http_call_response: F5,
    pub(super) grpc_initial_metadata: F3,
    pub(super) grpc_receive: F3,
    pub(super) grpc_trailing_metadata: F3,
    pub(super) grpc_close: F3,
    pub(super) done: F1R,
    pub(super) log: F1,
    pub(super) delete: F1,
}

pub(super) fn typed<P, R>(
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
    pub(super) fn new(i: &Instance, s: &mut Store<VmState>) -> Result<Exports, Error> {
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
            grpc_initial_metadata: typed(i, s, "proxy_on_grpc_receive_initial_metadata")?,
            grpc_receive: typed(i, s, "proxy_on_grpc_receive")?,
            grpc_trailing_metadata: typed(i, s, "proxy_on_grpc_receive_trailing_metadata")?,
            grpc_close: typed(i, s, "proxy_on_grpc_close")?,
            done: typed(i, s, "proxy_on_done")?,
            log: typed(i, s, "proxy_on_log")?,
            delete: typed(i, s, "proxy_on_delete")?,
        })
    }
}
