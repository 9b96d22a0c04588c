//! Header and trailer maps, readable and writable in the phases Envoy's
//! `getMap`/`getConstMap` allow.

use super::{st, written};
use crate::abi::{decode_pairs, MapType, Status};
use crate::headers::Headers;
use crate::memory::{give, read, write_u32, Cx};
use crate::state::VmState;
use wasmtime::Result;

pub(super) fn proxy_get_header_map_pairs(mut c: Cx<'_>, ty: i32, pp: i32, sp: i32) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    // Envoy: an unavailable map reads as empty, with Ok.
    let bytes = match map(c.data(), ty) {
        Some(m) if !m.is_empty() => m.encode(),
        _ => Vec::new(),
    };
    give(&mut c, &bytes, pp, sp).map(Status::code)
}

pub(super) fn proxy_set_header_map_pairs(
    mut c: Cx<'_>,
    ty: i32,
    ptr: i32,
    len: i32,
) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(bytes) = read(&c, ptr, len) else {
        return st(Status::InvalidMemoryAccess);
    };
    let Some(pairs) = decode_pairs(&bytes) else {
        return st(Status::BadArgument);
    };
    match map_mut(c.data_mut(), ty) {
        Some(m) => {
            m.replace_all(pairs);
            st(Status::Ok)
        }
        None => st(Status::BadArgument),
    }
}

pub(super) fn proxy_get_header_map_value(
    mut c: Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
    pp: i32,
    sp: i32,
) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(key) = read(&c, kp, kl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let value = match map(c.data(), ty) {
        None => return st(Status::BadArgument),
        Some(m) => match m.get_bytes(&key) {
            None => return st(Status::NotFound),
            Some(v) => v.to_vec(),
        },
    };
    give(&mut c, &value, pp, sp).map(Status::code)
}

pub(super) fn proxy_add_header_map_value(
    mut c: Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
    vp: i32,
    vl: i32,
) -> Result<i32> {
    edit_map(&mut c, ty, kp, kl, Some((vp, vl)), |m, k, v| m.add(k, v))
}

pub(super) fn proxy_replace_header_map_value(
    mut c: Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
    vp: i32,
    vl: i32,
) -> Result<i32> {
    edit_map(&mut c, ty, kp, kl, Some((vp, vl)), |m, k, v| m.set(k, v))
}

pub(super) fn proxy_remove_header_map_value(
    mut c: Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
) -> Result<i32> {
    edit_map(&mut c, ty, kp, kl, None, |m, k, _| m.remove(k))
}

pub(super) fn proxy_get_header_map_size(mut c: Cx<'_>, ty: i32, out: i32) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(size) = map(c.data(), ty).map(Headers::byte_size) else {
        return st(Status::BadArgument);
    };
    written(write_u32(&mut c, out, size as u32))
}

fn edit_map(
    c: &mut Cx<'_>,
    ty: i32,
    kp: i32,
    kl: i32,
    value: Option<(i32, i32)>,
    f: impl FnOnce(&mut Headers, &[u8], &[u8]),
) -> Result<i32> {
    let Some(ty) = MapType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(key) = read(c, kp, kl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let value = match value {
        Some((vp, vl)) => match read(c, vp, vl) {
            Some(v) => v,
            None => return st(Status::InvalidMemoryAccess),
        },
        None => Vec::new(),
    };
    match map_mut(c.data_mut(), ty) {
        Some(m) => {
            f(m, &key, &value);
            st(Status::Ok)
        }
        None => st(Status::BadArgument),
    }
}

/// The map readable now, following Envoy's `Context::getConstMap`.
fn map(s: &VmState, ty: MapType) -> Option<&Headers> {
    match ty {
        MapType::HttpCallResponseHeaders => return s.call_response.as_ref().map(|r| &r.headers),
        MapType::HttpCallResponseTrailers => return s.call_response.as_ref().map(|r| &r.trailers),
        MapType::GrpcReceiveInitialMetadata => return s.grpc_initial_metadata.as_ref(),
        MapType::GrpcReceiveTrailingMetadata => return s.grpc_trailing_metadata.as_ref(),
        _ => {}
    }
    let st = s.streams.get(&s.context())?;
    let log = st.access_log_phase;
    match ty {
        MapType::RequestHeaders if st.request.headers_open || log => Some(&st.request.headers),
        MapType::RequestTrailers if st.request.trailers_open && !log => Some(&st.request.trailers),
        MapType::ResponseHeaders if st.response.headers_open || log => Some(&st.response.headers),
        MapType::ResponseTrailers if st.response.trailers_open || log => {
            Some(&st.response.trailers)
        }
        _ => None,
    }
}

/// The map writable now (`Context::getMap`): never in the access-log phase.
fn map_mut(s: &mut VmState, ty: MapType) -> Option<&mut Headers> {
    match ty {
        MapType::HttpCallResponseHeaders => {
            return s.call_response.as_mut().map(|r| &mut r.headers)
        }
        MapType::HttpCallResponseTrailers => {
            return s.call_response.as_mut().map(|r| &mut r.trailers)
        }
        MapType::GrpcReceiveInitialMetadata => return s.grpc_initial_metadata.as_mut(),
        MapType::GrpcReceiveTrailingMetadata => return s.grpc_trailing_metadata.as_mut(),
        _ => {}
    }
    let ctx = s.context();
    let st = s.streams.get_mut(&ctx)?;
    if st.access_log_phase {
        return None;
    }
    match ty {
        MapType::RequestHeaders if st.request.headers_open => {
            // ABI 0.2.1: any request-header change clears the route cache.
            st.request_header_mutations += 1;
            Some(&mut st.request.headers)
        }
        MapType::RequestTrailers if st.request.trailers_open => Some(&mut st.request.trailers),
        MapType::ResponseHeaders if st.response.headers_open => Some(&mut st.response.headers),
        MapType::ResponseTrailers if st.response.trailers_open => Some(&mut st.response.trailers),
        _ => None,
    }
}
