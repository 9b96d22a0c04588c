//! HTTP callouts: what the filter dispatches (with the headers Envoy's
//! async client adds) and the status of the last one.

use super::{st, written};
use crate::abi::{decode_pairs, Status};
use crate::headers::Headers;
use crate::http_call::CallRequest;
use crate::memory::{give, read, write_u32, Cx};
use std::time::Duration;
use wasmtime::Result;

pub(super) fn proxy_http_call(
    mut c: Cx<'_>,
    up: i32,
    ul: i32,
    hp: i32,
    hl: i32,
    bp: i32,
    bl: i32,
    tp: i32,
    tl: i32,
    timeout: i32,
    out: i32,
) -> Result<i32> {
    let (Some(cluster), Some(hdrs), Some(body), Some(trls)) = (
        read(&c, up, ul),
        read(&c, hp, hl),
        read(&c, bp, bl),
        read(&c, tp, tl),
    ) else {
        return st(Status::InvalidMemoryAccess);
    };
    if timeout < 0 {
        return st(Status::BadArgument);
    }
    let cluster = String::from_utf8_lossy(&cluster).into_owned();
    if c.data().process.cluster(&cluster).is_none() {
        return st(Status::BadArgument);
    }
    let mut headers: Headers = decode_pairs(&hdrs)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let trailers: Headers = decode_pairs(&trls)
        .unwrap_or_default()
        .into_iter()
        .collect();
    if !(headers.contains(":path") && headers.contains(":method") && headers.contains(":authority"))
    {
        return st(Status::BadArgument);
    }
    // What Envoy's async client adds before the cluster sees the call.
    if !body.is_empty() {
        headers.set("content-length", body.len().to_string());
    }
    if timeout > 0 {
        headers.set("x-envoy-expected-rq-timeout-ms", timeout.to_string());
    }
    headers.set("x-envoy-internal", "true");
    let s = c.data_mut();
    let token = s.next_token;
    s.next_token = s.next_token.wrapping_add(1).max(1);
    let context_id = s.context();
    if timeout > 0 {
        let deadline = s.elapsed_ns.saturating_add(timeout as u64 * 1_000_000);
        s.call_deadlines.insert(token, deadline);
    }
    s.pending_calls.insert(
        token,
        CallRequest {
            token,
            cluster,
            headers,
            body,
            trailers,
            timeout: (timeout > 0).then(|| Duration::from_millis(timeout as u64)),
            context_id,
        },
    );
    written(write_u32(&mut c, out, token))
}

pub(super) fn proxy_get_status(mut c: Cx<'_>, code_ptr: i32, pp: i32, sp: i32) -> Result<i32> {
    let (code, msg) = c.data().status.clone();
    if write_u32(&mut c, code_ptr, code).is_none() {
        return st(Status::InvalidMemoryAccess);
    }
    give(&mut c, &msg, pp, sp).map(Status::code)
}
