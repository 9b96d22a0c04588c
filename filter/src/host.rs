//! Envoy's host calls, as results that never panic.
//!
//! The proxy-wasm SDK's `hostcalls` wrappers (and its logger) panic on any
//! status they do not expect, and in a filter a panic is an abort that
//! kills the worker's VM: every request on that worker then fails until
//! Envoy restarts the VM. Envoy does not return those statuses today where
//! this filter calls, but a host upgrade or another host could, so every
//! call the filter makes goes through here instead: the status arrives as
//! the raw number (an unknown number is not a valid `Status` value, so it
//! is never read as one) and comes back as a [`Result`]. Calls that return
//! data take ownership of the host's copy the way the SDK does: the host
//! allocated it through this module's `proxy_on_memory_allocate` (the
//! SDK's, a `Vec<u8>` of exactly that size, leaked).

use ace_flow::headers::Pairs;
use proxy_wasm::types::{BufferType, LogLevel, MapType, Status};

#[link(wasm_import_module = "env")]
extern "C" {
    #[link_name = "proxy_log"]
    fn log_raw(level: u32, message: *const u8, message_size: usize) -> u32;
    #[link_name = "proxy_get_current_time_nanoseconds"]
    fn current_time_raw(time: *mut u64) -> u32;
    #[link_name = "proxy_set_tick_period_milliseconds"]
    fn set_tick_period_raw(period: u32) -> u32;
    #[link_name = "proxy_get_buffer_bytes"]
    fn buffer_raw(
        buffer: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    #[link_name = "proxy_set_buffer_bytes"]
    fn set_buffer_raw(
        buffer: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    #[link_name = "proxy_get_header_map_pairs"]
    fn header_pairs_raw(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    #[link_name = "proxy_replace_header_map_value"]
    fn replace_header_raw(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    #[link_name = "proxy_remove_header_map_value"]
    fn remove_header_raw(map: u32, key: *const u8, key_size: usize) -> u32;
    #[link_name = "proxy_get_property"]
    fn property_raw(
        path: *const u8,
        path_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> u32;
    #[link_name = "proxy_set_property"]
    fn set_property_raw(
        path: *const u8,
        path_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    #[link_name = "proxy_get_shared_data"]
    fn shared_data_raw(
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    #[link_name = "proxy_set_shared_data"]
    fn set_shared_data_raw(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    #[link_name = "proxy_send_local_response"]
    fn local_response_raw(
        status_code: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    #[link_name = "proxy_define_metric"]
    fn define_metric_raw(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    #[link_name = "proxy_increment_metric"]
    fn increment_metric_raw(id: u32, offset: i64) -> u32;
    #[link_name = "proxy_record_metric"]
    fn record_metric_raw(id: u32, value: u64) -> u32;
    #[link_name = "proxy_set_effective_context"]
    fn set_effective_context_raw(context_id: u32) -> u32;
}

/// A raw status as a result; numbers the ABI does not define are
/// internal failures.
fn check(code: u32) -> Result<(), Status> {
    Err(match code {
        0 => return Ok(()),
        1 => Status::NotFound,
        2 => Status::BadArgument,
        3 => Status::SerializationFailure,
        4 => Status::ParseFailure,
        7 => Status::Empty,
        8 => Status::CasMismatch,
        _ => Status::InternalFailure,
    })
}

/// Take ownership of a host-allocated copy.
///
/// # Safety
/// `data` is null or was allocated by the host through this module's
/// `proxy_on_memory_allocate` for exactly `size` bytes, and is not owned
/// by anything else.
unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { Vec::from_raw_parts(data, size, size) }
    }
}

/// Log `message` at `level`.
pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    // SAFETY: the slice outlives the call; the host only reads it.
    check(unsafe { log_raw(level as u32, message.as_ptr(), message.len()) })
}

/// The host's clock, nanoseconds since the Unix epoch.
pub fn current_time_ns() -> Result<u64, Status> {
    let mut t = 0u64;
    // SAFETY: the host writes one u64 to a valid location.
    check(unsafe { current_time_raw(&mut t) })?;
    Ok(t)
}

/// Call the root context's `on_tick` every `period_ms`.
pub fn set_tick_period(period_ms: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    check(unsafe { set_tick_period_raw(period_ms) })
}

/// Up to `max` bytes of buffer `kind` from `start`; empty when there is
/// none.
pub fn buffer(kind: BufferType, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the host writes a pointer and a size to valid locations.
    let code = unsafe { buffer_raw(kind as u32, start, max, &mut data, &mut size) };
    match check(code) {
        // SAFETY: see `take`.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(Status::NotFound | Status::Empty) => Ok(Vec::new()),
        Err(s) => Err(s),
    }
}

/// Replace bytes `start..start + size` of buffer `kind` with `data`
/// (Envoy replaces a prefix from 0, or appends).
pub fn set_buffer(kind: BufferType, start: usize, size: usize, data: &[u8]) -> Result<(), Status> {
    // SAFETY: the slice outlives the call; the host only reads it.
    check(unsafe { set_buffer_raw(kind as u32, start, size, data.as_ptr(), data.len()) })
}

/// Header map `map`, in one call (see [`ace_flow::headers`]).
pub fn header_pairs(map: MapType) -> Result<Pairs, Status> {
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the host writes a pointer and a size to valid locations.
    check(unsafe { header_pairs_raw(map as u32, &mut data, &mut size) })?;
    // SAFETY: see `take`.
    Ok(Pairs::from_encoded(unsafe { take(data, size) }))
}

/// Set header `key` of `map` to `value`, replacing every earlier value.
pub fn replace_header(map: MapType, key: &str, value: &str) -> Result<(), Status> {
    // SAFETY: the slices outlive the call; the host only reads them.
    check(unsafe {
        replace_header_raw(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Remove every value of header `key` from `map`.
pub fn remove_header(map: MapType, key: &str) -> Result<(), Status> {
    // SAFETY: the slice outlives the call; the host only reads it.
    check(unsafe { remove_header_raw(map as u32, key.as_ptr(), key.len()) })
}

/// The property at `path` (segments such as `["response", "code"]`), or
/// `None` when Envoy has none there.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    // The ABI's path: the segments, each followed by a NUL.
    let mut encoded = Vec::with_capacity(path.iter().map(|p| p.len() + 1).sum());
    for p in path {
        encoded.extend_from_slice(p.as_bytes());
        encoded.push(0);
    }
    encoded.pop();
    let (mut data, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the slice outlives the call; the host writes a pointer and a
    // size to valid locations.
    let code = unsafe { property_raw(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    match check(code) {
        // SAFETY: see `take`.
        Ok(()) => Ok(Some(unsafe { take(data, size) })),
        Err(Status::NotFound | Status::Empty) => Ok(None),
        Err(s) => Err(s),
    }
}

/// Set filter state `wasm.<path>` (one path segment) to `value`.
pub fn set_property(path: &[u8], value: &[u8]) -> Result<(), Status> {
    // SAFETY: the slices outlive the call; the host only reads them.
    check(unsafe { set_property_raw(path.as_ptr(), path.len(), value.as_ptr(), value.len()) })
}

/// Shared-data entry `key` and its compare-and-swap value; `(None, None)`
/// when there is no such entry.
pub fn shared_data(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    let (mut data, mut size, mut cas) = (std::ptr::null_mut(), 0usize, 0u32);
    // SAFETY: the host writes a pointer, a size and a u32 to valid locations.
    let code = unsafe { shared_data_raw(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match check(code) {
        // SAFETY: see `take`.
        Ok(()) => Ok((Some(unsafe { take(data, size) }), Some(cas))),
        Err(Status::NotFound) => Ok((None, None)),
        Err(s) => Err(s),
    }
}

/// Write shared-data entry `key`; with `cas`, only if the entry still
/// carries that value (else `Err(Status::CasMismatch)`).
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    // SAFETY: the slices outlive the call; the host only reads them.
    check(unsafe {
        set_shared_data_raw(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// Answer the request from the filter: `status`, `headers`, `body`.
pub fn send_local_response(
    status: u32,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), Status> {
    let headers = Pairs::encode(headers.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
    let headers = headers.as_bytes();
    // SAFETY: the slices outlive the call; the host only reads them. A null
    // details pointer with size 0 is the ABI's "no details".
    check(unsafe {
        local_response_raw(
            status,
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// Define counter `name`; returns its id.
pub fn define_counter(name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: the slice outlives the call; the host writes one u32.
    // Metric type 0 is a counter.
    check(unsafe { define_metric_raw(0, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Define gauge `name`; returns its id.
pub fn define_gauge(name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: the slice outlives the call; the host writes one u32.
    // Metric type 1 is a gauge.
    check(unsafe { define_metric_raw(1, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Set metric `id` (a gauge) to `value`.
pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: no pointers.
    check(unsafe { record_metric_raw(id, value) })
}

/// Add `offset` to metric `id`.
pub fn increment_metric(id: u32, offset: i64) -> Result<(), Status> {
    // SAFETY: no pointers.
    check(unsafe { increment_metric_raw(id, offset) })
}

/// Make the host calls that follow, until the current callback returns,
/// act on context `context_id` (a root context acting on one of its
/// streams from a tick). `BadArgument` when the host has no such context
/// (the stream ended).
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    check(unsafe { set_effective_context_raw(context_id) })
}

/// A `log` logger over [`log()`] that drops what the host refuses.
#[derive(Debug)]
pub struct Logger;

/// The filter's logger.
pub static LOGGER: Logger = Logger;

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        // A log line the host will not take is not worth a dead VM.
        let _ = log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

/// Install [`LOGGER`] at `level`, and a panic hook that logs the panic
/// (a panic is a bug: the log line is the only trace it leaves).
pub fn init_logging(level: log::LevelFilter) {
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| {
            let _ = log(LogLevel::Critical, &info.to_string());
        }));
    }
    log::set_max_level(level);
}
