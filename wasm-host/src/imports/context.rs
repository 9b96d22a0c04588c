//! The effective context, `proxy_done` and the foreign functions.

use super::st;
use crate::abi::{LogLevel, Status};
use crate::memory::{read, Cx};
use wasmtime::Result;

pub(super) fn proxy_set_effective_context(mut c: Cx<'_>, ctx: i32) -> Result<i32> {
    let s = c.data_mut();
    let ctx = ctx as u32;
    if ctx == s.root_id || s.streams.contains_key(&ctx) {
        s.effective = Some(ctx);
        st(Status::Ok)
    } else {
        st(Status::BadArgument)
    }
}

pub(super) fn proxy_done(mut c: Cx<'_>) -> Result<i32> {
    c.data_mut().done_called = true;
    st(Status::Ok)
}

pub(super) fn proxy_call_foreign_function(
    mut c: Cx<'_>,
    np: i32,
    nl: i32,
    _ap: i32,
    _al: i32,
    _rp: i32,
    _rs: i32,
) -> Result<i32> {
    let Some(name) = read(&c, np, nl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data_mut();
    match name.as_slice() {
        b"clear_route_cache" => {
            let ctx = s.context();
            if let Some(stream) = s.streams.get_mut(&ctx) {
                stream.request_header_mutations += 1;
            }
            st(Status::Ok)
        }
        // Registered in Envoy 1.40, not emulated here: say so loudly.
        b"set_envoy_filter_state"
        | b"declare_property"
        | b"compress"
        | b"uncompress"
        | b"verify_signature"
        | b"expr_create"
        | b"expr_evaluate"
        | b"expr_delete" => {
            let msg = format!(
                "ace-wasm-host: foreign function {} is not emulated",
                String::from_utf8_lossy(&name)
            );
            s.log(LogLevel::Warn, msg);
            st(Status::InternalFailure)
        }
        _ => st(Status::NotFound),
    }
}
