//! ACE's host calls, made from an Envoy dynamic module instead of Wasm.
//!
//! Why this exists: inside Envoy's V8, each proxy-wasm call that returns
//! data costs about 10k instructions (V8 re-enters the module to allocate
//! the copy), and a Wasm filter making only ACE's eight host calls already
//! adds most of the Wasm ACE's latency over a no-op Wasm filter
//! (BENCHMARKS.md, "Envoy: latency", the `floor` variant). Envoy
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

use ace_dynamic_abi::raw::*;
use ace_dynamic_abi::{EnvoyBuffer, EnvoyHeader, Filter as FilterEnvoy, ModuleBuffer, ModulePtr};
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

type FilterModule = ModulePtr;
type ConfigEnvoy = *mut c_void;
type ConfigModule = ModulePtr;

// `envoy_dynamic_module_type_http_header_type` and `..._http_body_type`.
const REQUEST_HEADER: u32 = 0;
const RESPONSE_HEADER: u32 = 2;
const RECEIVED_RESPONSE_BODY: u32 = 2;
const CONTINUE: u32 = ace_dynamic_abi::status::CONTINUE;

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
    let mut headers = [EnvoyHeader::EMPTY; 64];
    // SAFETY: `f` is Envoy's live filter handle for this hook; the array
    // has room for the count Envoy reports (capped at 64).
    let read = unsafe {
        let n = envoy_dynamic_module_callback_http_get_headers_size(f, REQUEST_HEADER);
        if n <= headers.len() {
            envoy_dynamic_module_callback_http_get_headers(f, REQUEST_HEADER, headers.as_mut_ptr());
            headers.iter().take(n).map(|h| h.value.length as u64).sum()
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
    let mut status = EnvoyBuffer::EMPTY;
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
    let mut chunks = [EnvoyBuffer::EMPTY; 16];
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

ace_dynamic_abi::unused_http_hooks!();
