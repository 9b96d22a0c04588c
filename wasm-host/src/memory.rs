//! Moving bytes across the boundary, defensively.
//!
//! Every pointer and length comes from the guest, so every access is
//! bounds-checked and a bad one becomes `InvalidMemoryAccess` for the guest,
//! never a host panic. Results go back the way cpp-host sends them: the
//! host asks the guest's allocator for exactly `len` bytes (the SDK adopts
//! the block with `Vec::from_raw_parts` and frees it itself), and an empty
//! result is `(0, 0)` without any allocation.

use crate::abi::Status;
use crate::state::VmState;
use wasmtime::Caller;

pub(crate) type Cx<'a> = Caller<'a, VmState>;

/// Reads `len` bytes at `ptr`, or `None` if out of bounds (or no memory).
pub(crate) fn read(caller: &Cx<'_>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let mem = caller.data().memory?;
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    mem.data(caller).get(start..end).map(|s| s.to_vec())
}

/// Writes bytes at `ptr`, or `None` if out of bounds.
pub(crate) fn write(caller: &mut Cx<'_>, ptr: i32, bytes: &[u8]) -> Option<()> {
    let mem = caller.data().memory?;
    let start = ptr as u32 as usize;
    let end = start.checked_add(bytes.len())?;
    mem.data_mut(caller)
        .get_mut(start..end)?
        .copy_from_slice(bytes);
    Some(())
}

pub(crate) fn write_u32(caller: &mut Cx<'_>, ptr: i32, v: u32) -> Option<()> {
    write(caller, ptr, &v.to_le_bytes())
}

pub(crate) fn write_u64(caller: &mut Cx<'_>, ptr: i32, v: u64) -> Option<()> {
    write(caller, ptr, &v.to_le_bytes())
}

/// Copies `bytes` into a fresh guest allocation and stores its pointer and
/// size at `ptr_ptr` / `size_ptr`. A trap inside the allocator propagates.
pub(crate) fn give(
    caller: &mut Cx<'_>,
    bytes: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> wasmtime::Result<Status> {
    if bytes.is_empty() {
        return Ok(store_pair(caller, 0, 0, ptr_ptr, size_ptr));
    }
    let Ok(len) = i32::try_from(bytes.len()) else {
        return Ok(Status::InvalidMemoryAccess);
    };
    let Some(alloc) = caller.data().alloc.clone() else {
        return Ok(Status::InternalFailure);
    };
    let at = alloc.call(&mut *caller, len)?;
    if at == 0 || write(caller, at, bytes).is_none() {
        return Ok(Status::InvalidMemoryAccess);
    }
    Ok(store_pair(caller, at as u32, len as u32, ptr_ptr, size_ptr))
}

fn store_pair(caller: &mut Cx<'_>, at: u32, len: u32, ptr_ptr: i32, size_ptr: i32) -> Status {
    match (
        write_u32(caller, ptr_ptr, at),
        write_u32(caller, size_ptr, len),
    ) {
        (Some(()), Some(())) => Status::Ok,
        _ => Status::InvalidMemoryAccess,
    }
}
