//! Body and configuration buffers, as Envoy's `Context::getBuffer` offers
//! them.

use super::st;
use crate::abi::{BufferType, Status};
use crate::memory::{give, read, write_u32, Cx};
use crate::state::VmState;
use wasmtime::Result;

pub(super) fn proxy_get_buffer_bytes(
    mut c: Cx<'_>,
    ty: i32,
    start: i32,
    max: i32,
    pp: i32,
    sp: i32,
) -> Result<i32> {
    let Some(ty) = BufferType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(buf) = buffer(c.data(), ty) else {
        return st(Status::NotFound);
    };
    let (start, max) = (start as u32 as usize, max as u32 as usize);
    if start.checked_add(max).is_none() {
        return st(Status::BadArgument);
    }
    let end = start.saturating_add(max).min(buf.len());
    let slice = buf.get(start..end).unwrap_or_default().to_vec();
    give(&mut c, &slice, pp, sp).map(Status::code)
}

pub(super) fn proxy_set_buffer_bytes(
    mut c: Cx<'_>,
    ty: i32,
    start: i32,
    size: i32,
    ptr: i32,
    len: i32,
) -> Result<i32> {
    let Some(ty) = BufferType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(data) = read(&c, ptr, len) else {
        return st(Status::InvalidMemoryAccess);
    };
    let Some(buf) = buffer_mut(c.data_mut(), ty) else {
        return st(Status::NotFound);
    };
    let (start, size) = (start as u32 as usize, size as u32 as usize);
    // Envoy's Buffer::copyFrom: replace a prefix, or append; nothing else.
    if start == 0 {
        let drained = size.min(buf.len());
        buf.drain(..drained);
        buf.splice(0..0, data);
    } else if start >= buf.len() {
        buf.extend_from_slice(&data);
    } else {
        return st(Status::BadArgument);
    }
    st(Status::Ok)
}

pub(super) fn proxy_get_buffer_status(
    mut c: Cx<'_>,
    ty: i32,
    size_ptr: i32,
    flags_ptr: i32,
) -> Result<i32> {
    let Some(ty) = BufferType::from_i32(ty) else {
        return st(Status::BadArgument);
    };
    let Some(len) = buffer(c.data(), ty).map(|b| b.len()) else {
        return st(Status::NotFound);
    };
    match (
        write_u32(&mut c, size_ptr, len as u32),
        write_u32(&mut c, flags_ptr, 0),
    ) {
        (Some(()), Some(())) => st(Status::Ok),
        _ => st(Status::InvalidMemoryAccess),
    }
}

/// The buffer readable now, following Envoy's `Context::getBuffer`.
fn buffer(s: &VmState, ty: BufferType) -> Option<&[u8]> {
    match ty {
        BufferType::VmConfiguration => Some(&s.plugin.vm_configuration),
        BufferType::PluginConfiguration if s.configuring => Some(&s.plugin.configuration),
        BufferType::HttpCallResponseBody => s.call_response.as_ref().map(|r| r.body.as_slice()),
        BufferType::GrpcReceiveBuffer => s.grpc_message.as_deref(),
        // Envoy always offers a stream's body buffers; outside the body
        // callbacks they read as empty (observed: Ok, not NotFound).
        BufferType::RequestBody => {
            let st = s.streams.get(&s.context())?;
            Some(if st.request.body_open {
                &st.request.body[..]
            } else {
                &[]
            })
        }
        BufferType::ResponseBody => {
            let st = s.streams.get(&s.context())?;
            Some(if st.response.body_open {
                &st.response.body[..]
            } else {
                &[]
            })
        }
        _ => None,
    }
}

fn buffer_mut(s: &mut VmState, ty: BufferType) -> Option<&mut Vec<u8>> {
    let ctx = s.context();
    match ty {
        BufferType::HttpCallResponseBody => s.call_response.as_mut().map(|r| &mut r.body),
        BufferType::GrpcReceiveBuffer => s.grpc_message.as_mut(),
        BufferType::RequestBody => {
            let st = s.streams.get_mut(&ctx)?;
            st.request.body_open.then_some(&mut st.request.body)
        }
        BufferType::ResponseBody => {
            let st = s.streams.get_mut(&ctx)?;
            st.response.body_open.then_some(&mut st.response.body)
        }
        _ => None,
    }
}
