//! A Wasm HTTP filter written against the proxy-wasm ABI directly (no SDK)
//! that exports only the per-request callbacks ACE's filter uses. Two
//! modes, chosen by the plugin configuration:
//!
//! - empty: it does nothing. `envoy-load --only minimal` runs it as the
//!   "minimal Wasm filter": what Envoy's Wasm plumbing costs a filter that
//!   sees each request's headers, body, response and end, and nothing more.
//!   The SDK-built no-op (`benches/noop-filter`) also pays for the
//!   callbacks the SDK exports whether or not a filter uses them
//!   (`proxy_on_done`, `proxy_on_delete`, ...): Envoy calls a callback only
//!   when the module exports it.
//! - `ace-calls`: it makes exactly the host calls ACE's filter makes on a
//!   routed request that succeeds (read the request headers, the clock, claim a
//!   slot in shared data, set the routing header; read the response headers
//!   and the clock; read the response body; write the event to filter
//!   state), with no logic around them. `envoy-load --only floor` runs it
//!   as the "ACE's host calls only" variant: the cost in Envoy of any
//!   filter that does ACE's job through this ABI, before its own code.

use std::cell::Cell;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_set_property(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
}

// ABI enums (proxy-wasm 0.2.1).
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const RESPONSE_BODY: u32 = 1;
const PLUGIN_CONFIGURATION: u32 = 7;

thread_local! {
    /// Whether this VM was configured with `ace-calls`.
    static ACE_CALLS: Cell<bool> = const { Cell::new(false) };
}

/// Take ownership of a host copy (allocated by
/// [`proxy_on_memory_allocate`]) and free it.
fn free(data: *mut u8, size: usize) {
    if !data.is_null() && size > 0 {
        // SAFETY: the host allocated exactly `size` bytes through
        // `proxy_on_memory_allocate`, a `Vec<u8>` of that capacity.
        drop(unsafe { Vec::from_raw_parts(data, size, size) });
    }
}

/// Read a header map or buffer with `f` and free the copy.
fn read(f: impl FnOnce(*mut *mut u8, *mut usize) -> u32) {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    f(&mut data, &mut size);
    free(data, size);
}

fn now() {
    let mut t = 0u64;
    // SAFETY: the host writes one u64.
    unsafe { proxy_get_current_time_nanoseconds(&mut t) };
}

fn ace_calls() -> bool {
    ACE_CALLS.with(Cell::get)
}

/// The ABI this module speaks (Envoy looks for this export).
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host asks for guest memory to copy data into.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut v: Vec<u8> = Vec::with_capacity(size);
    let p = v.as_mut_ptr();
    std::mem::forget(v);
    p
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(_context_id: u32, _root_context_id: u32) {}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_context_id: u32, _size: usize) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(_context_id: u32, size: usize) -> u32 {
    let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the host writes a pointer and a size.
    unsafe { proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, size, &mut data, &mut len) };
    let calls = !data.is_null() && {
        // SAFETY: the host copied `len` bytes to `data`.
        let config = unsafe { std::slice::from_raw_parts(data, len) };
        config == b"ace-calls"
    };
    free(data, len);
    ACE_CALLS.with(|c| c.set(calls));
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_context_id: u32, _headers: usize, _eos: u32) -> u32 {
    if ace_calls() {
        // SAFETY (all calls here): pointers to live locals and slices.
        read(|d, s| unsafe { proxy_get_header_map_pairs(REQUEST_HEADERS, d, s) });
        now();
        let (key, slot) = (b"ace.floor", [0u8; 64]);
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), slot.as_ptr(), slot.len(), 0) };
        let (name, value) = (b"x-ace-destination", b"owned");
        unsafe {
            proxy_replace_header_map_value(
                REQUEST_HEADERS,
                name.as_ptr(),
                name.len(),
                value.as_ptr(),
                value.len(),
            )
        };
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(_context_id: u32, _size: usize, _eos: u32) -> u32 {
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_context_id: u32, _headers: usize, _eos: u32) -> u32 {
    if ace_calls() {
        read(|d, s| unsafe { proxy_get_header_map_pairs(RESPONSE_HEADERS, d, s) });
        now();
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(_context_id: u32, size: usize, _eos: u32) -> u32 {
    if ace_calls() && size > 0 {
        read(|d, s| unsafe { proxy_get_buffer_bytes(RESPONSE_BODY, 0, size, d, s) });
    }
    0
}

#[no_mangle]
pub extern "C" fn proxy_on_log(_context_id: u32) {
    if ace_calls() {
        let (path, event) = (b"ace_event", [b'x'; 300]);
        unsafe { proxy_set_property(path.as_ptr(), path.len(), event.as_ptr(), event.len()) };
    }
}
