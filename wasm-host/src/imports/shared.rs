//! Shared data (with compare-and-swap) and shared queues, kept by the
//! VM's [`Process`](crate::Process) under its `vm_id`.

use super::{st, written};
use crate::abi::Status;
use crate::memory::{give, read, write_u32, Cx};
use wasmtime::Result;

pub(super) fn proxy_get_shared_data(
    mut c: Cx<'_>,
    kp: i32,
    kl: i32,
    vp: i32,
    vs: i32,
    casp: i32,
) -> Result<i32> {
    let Some(key) = read(&c, kp, kl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data();
    s.process.count_shared_data_read();
    let Some((value, cas)) = s.process.shared_data(&s.plugin.vm_id, &key) else {
        return st(Status::NotFound);
    };
    let status = give(&mut c, &value, vp, vs)?;
    if status != Status::Ok {
        return st(status);
    }
    written(write_u32(&mut c, casp, cas))
}

pub(super) fn proxy_set_shared_data(
    c: Cx<'_>,
    kp: i32,
    kl: i32,
    vp: i32,
    vl: i32,
    cas: i32,
) -> Result<i32> {
    let (Some(key), Some(value)) = (read(&c, kp, kl), read(&c, vp, vl)) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data();
    match s
        .process
        .set_shared_data(&s.plugin.vm_id, &key, &value, cas as u32)
    {
        Ok(()) => st(Status::Ok),
        Err(e) => st(e),
    }
}

pub(super) fn proxy_register_shared_queue(
    mut c: Cx<'_>,
    np: i32,
    nl: i32,
    out: i32,
) -> Result<i32> {
    let Some(name) = read(&c, np, nl) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data();
    let token = s
        .process
        .register_queue(&s.plugin.vm_id, &name, (s.vm_instance, s.root_id));
    written(write_u32(&mut c, out, token))
}

pub(super) fn proxy_resolve_shared_queue(
    mut c: Cx<'_>,
    vp: i32,
    vl: i32,
    np: i32,
    nl: i32,
    out: i32,
) -> Result<i32> {
    let (Some(vm_id), Some(name)) = (read(&c, vp, vl), read(&c, np, nl)) else {
        return st(Status::InvalidMemoryAccess);
    };
    let s = c.data();
    let vm_id = if vm_id.is_empty() {
        s.plugin.vm_id.clone()
    } else {
        String::from_utf8_lossy(&vm_id).into_owned()
    };
    let Some(token) = s.process.resolve_queue(&vm_id, &name) else {
        return st(Status::NotFound);
    };
    written(write_u32(&mut c, out, token))
}

pub(super) fn proxy_enqueue_shared_queue(c: Cx<'_>, token: i32, vp: i32, vl: i32) -> Result<i32> {
    let Some(value) = read(&c, vp, vl) else {
        return st(Status::InvalidMemoryAccess);
    };
    match c.data().process.enqueue(token as u32, &value) {
        Ok(()) => st(Status::Ok),
        Err(e) => st(e),
    }
}

pub(super) fn proxy_dequeue_shared_queue(
    mut c: Cx<'_>,
    token: i32,
    pp: i32,
    sp: i32,
) -> Result<i32> {
    match c.data().process.dequeue(token as u32) {
        Ok(v) => give(&mut c, &v, pp, sp).map(Status::code),
        Err(e) => st(e),
    }
}
