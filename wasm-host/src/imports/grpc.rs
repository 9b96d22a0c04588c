//! gRPC calls and streams, with Envoy's statuses and tokens.
//!
//! Envoy (`context.cc`): a target that is not a serialized `GrpcService`
//! is a cluster name, and an unknown cluster is `ParseFailure` (kept from
//! ABI 0.1 so SDKs need not change); tokens come from one counter per kind
//! stepping by 4, whose low two bits say the kind (1 a call, 2 a stream),
//! so a call token handed to `proxy_grpc_send` is `BadArgument`; `close`
//! on a call cancels it, on a stream half-closes it; `cancel` drops either
//! (a stream is reset). What the filter sends reaches the server only after
//! the callback returns.

use super::st;
use crate::abi::{decode_pairs, Status};
use crate::grpc::{GrpcEvent, GrpcRequest, OpenGrpc};
use crate::headers::Headers;
use crate::memory::{read, write_u32, Cx};
use crate::state::VmState;
use std::time::Duration;
use wasmtime::Result;

const KIND_MASK: u32 = 0x3;
const KIND_CALL: u32 = 1;
const KIND_STREAM: u32 = 2;
const TOKEN_STEP: u32 = 4;

/// The headers Envoy's gRPC async client sends (observed by the
/// differential suite), then the filter's initial metadata.
fn request_headers(
    cluster: &str,
    service: &str,
    method: &str,
    metadata: Vec<(Vec<u8>, Vec<u8>)>,
    timeout_ms: Option<u32>,
) -> Headers {
    let mut h = Headers::new();
    h.add(":method", "POST");
    h.add(":path", format!("/{service}/{method}"));
    h.add(":authority", cluster);
    h.add(":scheme", "http");
    h.add("content-type", "application/grpc");
    h.add("te", "trailers");
    if let Some(ms) = timeout_ms {
        h.add("grpc-timeout", format!("{ms}m"));
        h.add("x-envoy-expected-rq-timeout-ms", ms.to_string());
    }
    h.add("x-envoy-internal", "true");
    for (k, v) in metadata {
        h.add(k, v);
    }
    h
}

/// Reads the target, service, method and metadata; `Err` is the status.
fn open(
    c: &mut Cx<'_>,
    args: [(i32, i32); 4],
    stream: bool,
    timeout_ms: Option<u32>,
) -> Result<GrpcRequest, Status> {
    let mut parts = Vec::with_capacity(4);
    for (p, l) in args {
        parts.push(read(c, p, l).ok_or(Status::InvalidMemoryAccess)?);
    }
    let metadata = decode_pairs(&parts[3]).ok_or(Status::BadArgument)?;
    let cluster = String::from_utf8_lossy(&parts[0]).into_owned();
    let s = c.data();
    if s.process.grpc_cluster(&cluster).is_none() && s.process.cluster(&cluster).is_none() {
        return Err(Status::ParseFailure);
    }
    let service = String::from_utf8_lossy(&parts[1]).into_owned();
    let method = String::from_utf8_lossy(&parts[2]).into_owned();
    Ok(GrpcRequest {
        token: 0,
        headers: request_headers(&cluster, &service, &method, metadata, timeout_ms),
        cluster,
        service,
        method,
        timeout: timeout_ms.map(|ms| Duration::from_millis(u64::from(ms))),
        stream,
        context_id: s.context(),
    })
}

fn next_token(s: &mut VmState, kind: u32) -> u32 {
    let counter = if kind == KIND_CALL {
        &mut s.next_grpc_call
    } else {
        &mut s.next_grpc_stream
    };
    *counter = counter.wrapping_add(TOKEN_STEP);
    *counter
}

fn register(s: &mut VmState, mut request: GrpcRequest, unsent: Vec<GrpcEvent>) -> u32 {
    let kind = if request.stream {
        KIND_STREAM
    } else {
        KIND_CALL
    };
    let token = next_token(s, kind);
    request.token = token;
    let deadline_ns = request
        .timeout
        .map(|t| s.elapsed_ns.saturating_add(t.as_nanos() as u64));
    let local_closed = !request.stream;
    s.grpc.insert(
        token,
        OpenGrpc {
            request,
            sent: unsent.clone(),
            unsent,
            local_closed,
            remote_closed: false,
            response: None,
            headers_received: false,
            deadline_ns,
        },
    );
    token
}

pub(super) fn proxy_grpc_call(
    mut c: Cx<'_>,
    up: i32,
    ul: i32,
    sp: i32,
    sl: i32,
    mp: i32,
    ml: i32,
    hp: i32,
    hl: i32,
    bp: i32,
    bl: i32,
    timeout: i32,
    out: i32,
) -> Result<i32> {
    let Some(message) = read(&c, bp, bl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let timeout_ms = (timeout != 0).then_some(timeout as u32);
    let request = match open(
        &mut c,
        [(up, ul), (sp, sl), (mp, ml), (hp, hl)],
        false,
        timeout_ms,
    ) {
        Ok(r) => r,
        Err(s) => return st(s),
    };
    let events = vec![
        GrpcEvent::Open,
        GrpcEvent::Message(message),
        GrpcEvent::HalfClose,
    ];
    open_and_give(&mut c, request, events, out)
}

pub(super) fn proxy_grpc_stream(
    mut c: Cx<'_>,
    up: i32,
    ul: i32,
    sp: i32,
    sl: i32,
    mp: i32,
    ml: i32,
    hp: i32,
    hl: i32,
    out: i32,
) -> Result<i32> {
    let request = match open(&mut c, [(up, ul), (sp, sl), (mp, ml), (hp, hl)], true, None) {
        Ok(r) => r,
        Err(s) => return st(s),
    };
    open_and_give(&mut c, request, vec![GrpcEvent::Open], out)
}

/// Registers the call and writes its token to `out`; a token the guest
/// cannot receive leaves nothing open.
fn open_and_give(
    c: &mut Cx<'_>,
    request: GrpcRequest,
    events: Vec<GrpcEvent>,
    out: i32,
) -> Result<i32> {
    let token = register(c.data_mut(), request, events);
    match write_u32(c, out, token) {
        Some(()) => st(Status::Ok),
        None => {
            c.data_mut().grpc.remove(&token);
            st(Status::InvalidMemoryAccess)
        }
    }
}

fn push(open: &mut OpenGrpc, event: GrpcEvent) {
    open.sent.push(event.clone());
    open.unsent.push(event);
}

pub(super) fn proxy_grpc_send(mut c: Cx<'_>, token: i32, p: i32, l: i32, end: i32) -> Result<i32> {
    let token = token as u32;
    if token & KIND_MASK != KIND_STREAM {
        return st(Status::BadArgument);
    }
    let Some(message) = read(&c, p, l) else {
        return st(Status::InvalidMemoryAccess);
    };
    let Some(open) = c.data_mut().grpc.get_mut(&token) else {
        return st(Status::NotFound);
    };
    // Envoy hands the message to its stream even after a close; the
    // stream drops it. The server never sees it.
    if !open.local_closed && !open.remote_closed {
        push(open, GrpcEvent::Message(message));
        if end != 0 {
            open.local_closed = true;
            push(open, GrpcEvent::HalfClose);
        }
    }
    st(Status::Ok)
}

pub(super) fn proxy_grpc_cancel(mut c: Cx<'_>, token: i32) -> Result<i32> {
    let token = token as u32;
    match token & KIND_MASK {
        KIND_CALL | KIND_STREAM => match c.data_mut().grpc.remove(&token) {
            Some(_) => st(Status::Ok),
            None => st(Status::NotFound),
        },
        _ => st(Status::BadArgument),
    }
}

pub(super) fn proxy_grpc_close(mut c: Cx<'_>, token: i32) -> Result<i32> {
    let token = token as u32;
    let grpc = &mut c.data_mut().grpc;
    match token & KIND_MASK {
        KIND_CALL => match grpc.remove(&token) {
            Some(_) => st(Status::Ok),
            None => st(Status::NotFound),
        },
        KIND_STREAM => match grpc.get_mut(&token) {
            Some(open) if open.remote_closed => {
                grpc.remove(&token);
                st(Status::Ok)
            }
            Some(open) => {
                if !open.local_closed {
                    open.local_closed = true;
                    push(open, GrpcEvent::HalfClose);
                }
                st(Status::Ok)
            }
            None => st(Status::NotFound),
        },
        _ => st(Status::BadArgument),
    }
}
