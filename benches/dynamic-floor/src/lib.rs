//! ACE's host calls, made from an Envoy dynamic module instead of Wasm.
//!
//! Why this exists: inside Envoy's V8, each proxy-wasm call that returns
//! data costs about 10k instructions (V8 re-enters the module to allocate
//! the copy), and a Wasm filter making only ACE's eight host calls already
//! adds about 21 µs p50 over a no-op Wasm filter (BENCHMARKS.md). Envoy
//! 1.40 also loads native filters, "dynamic modules" (`dlopen`, a C ABI,
//! `envoy.filters.http.dynamic_modules`), whose calls into Envoy are plain
//! function calls that hand out pointers into Envoy's own buffers. This
//! module does what `benches/minimal-filter` does with `ace-calls`, per
//! request: read every request header, read the clock, claim an in-flight
//! slot (an atomic here: a native module shares the process's memory, so it
//! needs no shared-data call), set the routing header and clear the route
//! cache; read the response status and the clock; read the response body;
//! write a 300-byte event to filter state. `envoy-load --only dynfloor`
//! runs it.
//!
//! Only a measuring tool: it decides nothing. The prototypes are Envoy
//! 1.40's (`source/extensions/dynamic_modules/abi/abi.h`, ABI "v0.2.0");
//! the ABI changes between Envoy releases, so this module is built for
//! 1.40 only.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// A buffer Envoy owns: valid until the hook returns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

/// A buffer the module owns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &'static [u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }
}

/// One header, pointing into Envoy's header map.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHeader {
    key_ptr: *const c_char,
    key_length: usize,
    value_ptr: *const c_char,
    value_length: usize,
}

/// Envoy's handle for one stream's filter, valid until its destroy hook.
/// (A transparent wrapper: passed exactly as the pointer it holds.)
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct FilterEnvoy(*mut c_void);
type FilterModule = *const c_void;
type ConfigEnvoy = *mut c_void;
type ConfigModule = *const c_void;

// `envoy_dynamic_module_type_http_header_type` and `..._http_body_type`.
const REQUEST_HEADER: u32 = 0;
const RESPONSE_HEADER: u32 = 2;
const RECEIVED_RESPONSE_BODY: u32 = 2;
// Every `..._status_Continue` is 0.
const CONTINUE: u32 = 0;

extern "C" {
    fn envoy_dynamic_module_callback_http_get_headers_size(f: FilterEnvoy, kind: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        f: FilterEnvoy,
        kind: u32,
        out: *mut EnvoyHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_header(
        f: FilterEnvoy,
        kind: u32,
        key: ModuleBuffer,
        out: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        f: FilterEnvoy,
        kind: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_clear_route_cache(f: FilterEnvoy);
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(f: FilterEnvoy, kind: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        f: FilterEnvoy,
        kind: u32,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        f: FilterEnvoy,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
}

/// In-flight requests: what ACE keeps in shared data, here process memory.
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// Bytes seen, so the reads cannot be optimised away.
static SEEN: AtomicU64 = AtomicU64::new(0);
/// A stand-in for ACE's event line.
static EVENT: [u8; 300] = [b'x'; 300];
/// Non-null handles: the module keeps no per-filter state.
static CONFIG: u8 = 0;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    c"v0.2.0".as_ptr()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config: ConfigEnvoy,
    _name: EnvoyBuffer,
    _value: EnvoyBuffer,
) -> ConfigModule {
    std::ptr::addr_of!(CONFIG).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_config: ConfigModule) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ConfigModule,
    _filter: FilterEnvoy,
) -> FilterModule {
    config
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    f: FilterEnvoy,
    _m: FilterModule,
    _end_of_stream: bool,
) -> u32 {
    let mut headers = [EnvoyHeader {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    }; 64];
    // SAFETY: `f` is Envoy's live filter handle for this hook; the array
    // has room for the count Envoy reports (capped at 64).
    let read = unsafe {
        let n = envoy_dynamic_module_callback_http_get_headers_size(f, REQUEST_HEADER);
        if n <= headers.len() {
            envoy_dynamic_module_callback_http_get_headers(f, REQUEST_HEADER, headers.as_mut_ptr());
            headers.iter().take(n).map(|h| h.value_length as u64).sum()
        } else {
            0
        }
    };
    SEEN.fetch_add(read ^ now_ns(), Ordering::Relaxed);
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
    // SAFETY: as above; the key and value are static.
    unsafe {
        envoy_dynamic_module_callback_http_set_header(
            f,
            REQUEST_HEADER,
            ModuleBuffer::of(b"x-ace-destination"),
            ModuleBuffer::of(b"owned"),
        );
        envoy_dynamic_module_callback_http_clear_route_cache(f);
    }
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    f: FilterEnvoy,
    _m: FilterModule,
    _end_of_stream: bool,
) -> u32 {
    let mut status = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    // SAFETY: Envoy's live handle; `status` outlives the call.
    unsafe {
        envoy_dynamic_module_callback_http_get_header(
            f,
            RESPONSE_HEADER,
            ModuleBuffer::of(b":status"),
            &mut status,
            0,
            std::ptr::null_mut(),
        );
    }
    SEEN.fetch_add(status.length as u64 ^ now_ns(), Ordering::Relaxed);
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    f: FilterEnvoy,
    _m: FilterModule,
    end_of_stream: bool,
) -> u32 {
    let mut chunks = [EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    }; 16];
    // SAFETY: Envoy's live handle; room for the count Envoy reports.
    let bytes: u64 = unsafe {
        let n = envoy_dynamic_module_callback_http_get_body_chunks_size(f, RECEIVED_RESPONSE_BODY);
        if n <= chunks.len() {
            envoy_dynamic_module_callback_http_get_body_chunks(
                f,
                RECEIVED_RESPONSE_BODY,
                chunks.as_mut_ptr(),
            );
            chunks.iter().take(n).map(|c| c.length as u64).sum()
        } else {
            0
        }
    };
    SEEN.fetch_add(bytes, Ordering::Relaxed);
    if end_of_stream {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    f: FilterEnvoy,
    _m: FilterModule,
) {
    // SAFETY: Envoy's live handle; key and value are static.
    unsafe {
        envoy_dynamic_module_callback_http_set_filter_state_bytes(
            f,
            ModuleBuffer::of(b"ace_event"),
            ModuleBuffer::of(&EVENT),
        );
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_m: FilterModule) {}

// The hooks Envoy 1.40 requires of every HTTP filter module, unused here.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _f: FilterEnvoy,
    _m: FilterModule,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _f: FilterEnvoy,
    _m: FilterModule,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _f: FilterEnvoy,
    _m: FilterModule,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _f: FilterEnvoy,
    _m: FilterModule,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _f: FilterEnvoy,
    _m: FilterModule,
    _stream_id: u64,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _f: FilterEnvoy,
    _m: FilterModule,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _f: FilterEnvoy,
    _m: FilterModule,
    _stream_id: u64,
    _trailers: *mut EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _f: FilterEnvoy,
    _m: FilterModule,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _f: FilterEnvoy,
    _m: FilterModule,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _f: FilterEnvoy,
    _m: FilterModule,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _f: FilterEnvoy,
    _m: FilterModule,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _f: FilterEnvoy,
    _m: FilterModule,
) {
}
