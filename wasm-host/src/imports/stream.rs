//! Stream control (continue, close, local reply: deferred until the
//! callback returns, as in Envoy) and stream properties.

use super::st;
use crate::abi::{decode_pairs, split_path, Status};
use crate::memory::{give, read, Cx};
use crate::properties;
use crate::state::{Deferred, LocalResponse, Side};
use wasmtime::Result;

pub(super) fn proxy_continue_stream(mut c: Cx<'_>, ty: i32) -> Result<i32> {
    let s = c.data_mut();
    let ctx = s.context();
    let is_stream = s.streams.contains_key(&ctx);
    match ty {
        0 if is_stream => s.deferred.push(Deferred::Continue(ctx, Side::Request)),
        1 if is_stream => s.deferred.push(Deferred::Continue(ctx, Side::Response)),
        // Envoy: without stream callbacks (a root context) it is a no-op.
        0 | 1 => {}
        _ => return st(Status::BadArgument),
    }
    st(Status::Ok)
}

pub(super) fn proxy_close_stream(mut c: Cx<'_>, ty: i32) -> Result<i32> {
    let s = c.data_mut();
    let ctx = s.context();
    match ty {
        0 | 1 => {
            if s.streams.contains_key(&ctx) {
                s.deferred.push(Deferred::Close(ctx));
            }
            st(Status::Ok)
        }
        _ => st(Status::BadArgument),
    }
}

pub(super) fn proxy_send_local_response(
    mut c: Cx<'_>,
    code: i32,
    dp: i32,
    dl: i32,
    bp: i32,
    bl: i32,
    hp: i32,
    hl: i32,
    grpc: i32,
) -> Result<i32> {
    let (Some(details), Some(body), Some(hdrs)) =
        (read(&c, dp, dl), read(&c, bp, bl), read(&c, hp, hl))
    else {
        return st(Status::InvalidMemoryAccess);
    };
    let Some(pairs) = decode_pairs(&hdrs) else {
        return st(Status::BadArgument);
    };
    let s = c.data_mut();
    let ctx = s.context();
    if s.streams.contains_key(&ctx) {
        let details = String::from_utf8_lossy(&details)
            .chars()
            .map(|ch| if ch.is_whitespace() { '_' } else { ch })
            .collect();
        let reply = LocalResponse {
            status: code as u32,
            headers: pairs.into_iter().collect(),
            body,
            details,
            grpc_status: (0..=16).contains(&grpc).then_some(grpc),
        };
        s.deferred.push(Deferred::LocalResponse(ctx, reply));
    }
    st(Status::Ok)
}

pub(super) fn proxy_get_property(mut c: Cx<'_>, pp: i32, pl: i32, rp: i32, rs: i32) -> Result<i32> {
    let Some(path) = read(&c, pp, pl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let segments = split_path(&path);
    match properties::resolve(c.data(), &segments) {
        Ok(v) => give(&mut c, &v, rp, rs).map(Status::code),
        Err(s) => st(s),
    }
}

pub(super) fn proxy_set_property(mut c: Cx<'_>, pp: i32, pl: i32, vp: i32, vl: i32) -> Result<i32> {
    let (Some(path), Some(value)) = (read(&c, pp, pl), read(&c, vp, vl)) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data_mut();
    let ctx = s.context();
    // Envoy stores filter state on the stream; a root context has none.
    match s.streams.get_mut(&ctx) {
        Some(stream) => {
            stream.filter_state.insert(path, value);
            st(Status::Ok)
        }
        None => st(Status::NotFound),
    }
}
