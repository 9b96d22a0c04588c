//! gRPC: imported by every SDK filter, not emulated. Each call logs a
//! warning and fails, so a filter that relies on gRPC shows it in a test.

use super::st;
use crate::abi::{LogLevel, Status};
use crate::memory::Cx;
use wasmtime::Result;

pub(super) fn proxy_grpc_call(
    mut c: Cx<'_>,
    _a: i32,
    _b: i32,
    _d: i32,
    _e: i32,
    _f: i32,
    _g: i32,
    _h: i32,
    _i: i32,
    _j: i32,
    _k: i32,
    _t: i32,
    _o: i32,
) -> Result<i32> {
    grpc_unsupported(&mut c)
}

pub(super) fn proxy_grpc_stream(
    mut c: Cx<'_>,
    _a: i32,
    _b: i32,
    _d: i32,
    _e: i32,
    _f: i32,
    _g: i32,
    _h: i32,
    _i: i32,
    _o: i32,
) -> Result<i32> {
    grpc_unsupported(&mut c)
}

pub(super) fn proxy_grpc_send(mut c: Cx<'_>, _t: i32, _p: i32, _l: i32, _e: i32) -> Result<i32> {
    grpc_unsupported(&mut c)
}

pub(super) fn proxy_grpc_cancel(mut c: Cx<'_>, _t: i32) -> Result<i32> {
    grpc_unsupported(&mut c)
}

pub(super) fn proxy_grpc_close(mut c: Cx<'_>, _t: i32) -> Result<i32> {
    grpc_unsupported(&mut c)
}

fn grpc_unsupported(c: &mut Cx<'_>) -> Result<i32> {
    c.data_mut().log(
        LogLevel::Warn,
        "ace-wasm-host: gRPC calls are not emulated".to_string(),
    );
    st(Status::InternalFailure)
}
