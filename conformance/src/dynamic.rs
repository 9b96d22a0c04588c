//! The dynamic module (`ace-dynamic`, linked as an rlib) under a fake of
//! Envoy 1.40's dynamic-module ABI: no Envoy, the module's own hooks
//! called in Envoy's order, and Envoy's callbacks answered from memory.
//!
//! The callbacks (`envoy_dynamic_module_callback_*`, declared in
//! `dynamic-module/abi/src/lib.rs` and `abi/src/bootstrap.rs`) are symbols
//! the module calls and Envoy exports. A test binary defines them with
//! [`fake_envoy_callbacks!`](crate::fake_envoy_callbacks) (the binary's own object is linked whole, so
//! the module's references resolve to them); each forwards to a function
//! here. Every handle Envoy would pass is a pointer to this fake's own
//! state: a [`Stream`] per request, the process-wide [`Fake`] (counters,
//! callouts, the timer) per test thread.
//!
//! What Envoy does at each hook, as this fake plays it (Envoy 1.40,
//! `source/extensions/filters/http/dynamic_modules/filter.cc` and
//! `source/extensions/bootstrap/dynamic_modules/extension.cc`, the ABI of
//! `source/extensions/dynamic_modules/abi/abi.h` that `dynamic-module/abi`
//! follows):
//!
//! - start-up: the bootstrap extension's `config_new` (the poller's
//!   `{"control": ...}`; it defines its metrics and signals init),
//!   `extension_new`, then `server_initialized` once the clusters exist
//!   (the poller makes its timer and polls at once);
//! - the HTTP filter's `config_new` (the plugin configuration; counters
//!   are defined here and only here);
//! - per request: `filter_new`, `request_headers` (end of stream when there
//!   is no body); for a body, `request_body` with the data and then an
//!   empty end-of-stream frame (what Envoy does for HTTP/1, as the
//!   wasm-host's differential suite observed), where a `StopAndBuffer`
//!   moves the received chunk into the buffered body; a local reply
//!   (`send_response`) is sent back through the filter's
//!   `response_headers` and `response_body`, as Envoy's local replies pass
//!   the encoder filters; else the upstream's answer goes through
//!   `response_headers` and `response_body`; then `stream_complete`
//!   (before the access log reads filter state) and `filter_destroy`;
//! - the poller's timer: `timer_fired` each interval, its callout answered
//!   through `http_callout_done` (a reset when the service is down).
//!
//! The module keeps process-wide state (the published snapshot, the fleet
//! registry, its clock under feature `test-support`): drivers run one at a
//! time ([`DynamicDriver`] holds a process lock) and each starts from a
//! fresh published slot.

use crate::mock::request_headers;
use crate::{Answer, Driver, HostKind, Req, Seen, Service, T0};
use ace_dynamic::test_support;
use ace_dynamic_abi::{ConfigHandle, EnvoyBuffer, EnvoyHeader, Filter, ModulePtr};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

/// A buffer the module lends (`ModuleBuffer`'s layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    /// Start.
    pub ptr: *const u8,
    /// Length.
    pub len: usize,
}

impl Buf {
    /// The bytes (none for a null pointer).
    ///
    /// # Safety
    /// The module's buffer, during the callback that received it.
    pub unsafe fn bytes<'a>(self) -> Option<&'a [u8]> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: the module lends `len` bytes for the call.
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }
}

/// A header the module lends (`ModuleHeader`'s layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Hdr {
    /// Name.
    pub key: Buf,
    /// Value.
    pub value: Buf,
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// One request as the fake Envoy holds it; its address is the `Filter`
/// handle.
#[derive(Debug, Default)]
pub struct Stream {
    request: Pairs,
    response: Pairs,
    /// The request chunk of the current body hook.
    received_request: Vec<u8>,
    /// The request body Envoy buffered (after `StopAndBuffer`).
    buffered_request: Vec<u8>,
    /// The response chunk of the current body hook.
    received_response: Vec<u8>,
    local: Option<(u32, Vec<u8>, crate::HeaderList)>,
    filter_state: HashMap<Vec<u8>, Vec<u8>>,
}

/// The fake Envoy's process state, per test thread.
#[derive(Debug, Default)]
pub struct Fake {
    /// HTTP filter counters, by id.
    counters: Vec<(String, u64)>,
    /// Bootstrap metrics, by id.
    metrics: Vec<(String, u64)>,
    /// Callouts sent and not answered: id and `if-none-match`.
    callouts: Vec<(u64, Option<String>)>,
    next_callout: u64,
}

thread_local! {
    static FAKE: RefCell<Fake> = RefCell::new(Fake::default());
}

fn fake<T>(f: impl FnOnce(&mut Fake) -> T) -> T {
    FAKE.with(|x| f(&mut x.borrow_mut()))
}

/// # Safety
/// `f` is a handle this fake made ([`DynamicDriver`]'s streams).
unsafe fn stream<'a>(f: *mut c_void) -> &'a mut Stream {
    // SAFETY: the caller's contract; the driver does not touch the stream
    // while a hook runs.
    unsafe { &mut *f.cast::<Stream>() }
}

fn pairs_of(s: &mut Stream, kind: u32) -> &mut Pairs {
    if kind == 0 {
        &mut s.request
    } else {
        &mut s.response
    }
}

fn body_of(s: &mut Stream, kind: u32) -> &mut Vec<u8> {
    match kind {
        0 => &mut s.received_request,
        1 => &mut s.buffered_request,
        _ => &mut s.received_response,
    }
}

fn envoy_buffer(b: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: b.as_ptr().cast(),
        length: b.len(),
    }
}

/// The callbacks' bodies, called by [`fake_envoy_callbacks!`](crate::fake_envoy_callbacks)'s symbols.
/// Each is `unsafe`: its pointers are the module's, valid for the call.
#[allow(clippy::missing_safety_doc, missing_docs)]
pub mod cb {
    use super::*;

    pub unsafe fn get_headers_size(f: *mut c_void, kind: u32) -> usize {
        // SAFETY: a handle this fake made.
        pairs_of(unsafe { stream(f) }, kind).len()
    }

    pub unsafe fn get_headers(f: *mut c_void, kind: u32, out: *mut EnvoyHeader) -> bool {
        // SAFETY: a handle this fake made; `out` has room for every header.
        let p = pairs_of(unsafe { stream(f) }, kind);
        for (i, (k, v)) in p.iter().enumerate() {
            let h = EnvoyHeader {
                key: envoy_buffer(k),
                value: envoy_buffer(v),
            };
            // SAFETY: room for `p.len()` entries (the module asked the size).
            unsafe { out.add(i).write(h) };
        }
        true
    }

    pub unsafe fn get_header(
        f: *mut c_void,
        kind: u32,
        key: Buf,
        out: *mut EnvoyBuffer,
        index: usize,
        count: *mut usize,
    ) -> bool {
        // SAFETY: the module's key, a handle this fake made.
        let key = unsafe { key.bytes() }.unwrap_or_default();
        let p = pairs_of(unsafe { stream(f) }, kind);
        let values: Vec<&Vec<u8>> = p
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
            .collect();
        if !count.is_null() {
            // SAFETY: the module's out-parameter.
            unsafe { count.write(values.len()) };
        }
        match values.get(index) {
            Some(v) => {
                // SAFETY: the module's out-parameter.
                unsafe { out.write(envoy_buffer(v)) };
                true
            }
            None => false,
        }
    }

    pub unsafe fn set_header(f: *mut c_void, kind: u32, key: Buf, value: Buf) -> bool {
        // SAFETY: the module's buffers, a handle this fake made.
        let (key, value) = unsafe { (key.bytes().unwrap_or_default().to_vec(), value.bytes()) };
        let p = pairs_of(unsafe { stream(f) }, kind);
        p.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
        if let Some(v) = value {
            p.push((key, v.to_vec()));
        }
        true
    }

    pub unsafe fn add_header(f: *mut c_void, kind: u32, key: Buf, value: Buf) -> bool {
        // SAFETY: the module's buffers, a handle this fake made.
        let (key, value) = unsafe { (key.bytes().unwrap_or_default().to_vec(), value.bytes()) };
        let p = pairs_of(unsafe { stream(f) }, kind);
        match value {
            Some(v) => p.push((key, v.to_vec())),
            None => return false,
        }
        true
    }

    pub unsafe fn body_chunks_size(f: *mut c_void, kind: u32) -> usize {
        // SAFETY: a handle this fake made.
        usize::from(!body_of(unsafe { stream(f) }, kind).is_empty())
    }

    pub unsafe fn body_chunks(f: *mut c_void, kind: u32, out: *mut EnvoyBuffer) -> bool {
        // SAFETY: a handle this fake made; room for the one chunk.
        let b = body_of(unsafe { stream(f) }, kind);
        if !b.is_empty() {
            unsafe { out.write(envoy_buffer(b)) };
        }
        true
    }

    pub unsafe fn body_size(f: *mut c_void, kind: u32) -> usize {
        // SAFETY: a handle this fake made.
        body_of(unsafe { stream(f) }, kind).len()
    }

    pub unsafe fn drain_body(f: *mut c_void, kind: u32, n: usize) -> bool {
        // SAFETY: a handle this fake made.
        let b = body_of(unsafe { stream(f) }, kind);
        b.drain(..n.min(b.len()));
        true
    }

    pub unsafe fn append_body(f: *mut c_void, kind: u32, data: Buf) -> bool {
        // SAFETY: the module's buffer, a handle this fake made.
        let data = unsafe { data.bytes() }.unwrap_or_default().to_vec();
        body_of(unsafe { stream(f) }, kind).extend_from_slice(&data);
        true
    }

    pub unsafe fn send_response(f: *mut c_void, status: u32, h: *const Hdr, n: usize, body: Buf) {
        // SAFETY: the module's buffer, a handle this fake made.
        let body = unsafe { body.bytes() }.unwrap_or_default().to_vec();
        let pairs: &[Hdr] = if h.is_null() || n == 0 {
            &[]
        } else {
            // SAFETY: the module lends `n` headers for the call.
            unsafe { std::slice::from_raw_parts(h, n) }
        };
        let text = |b: Buf| {
            // SAFETY: the module's buffers, during the call.
            String::from_utf8_lossy(unsafe { b.bytes() }.unwrap_or_default()).into_owned()
        };
        let headers = pairs.iter().map(|p| (text(p.key), text(p.value))).collect();
        unsafe { stream(f) }.local = Some((status, body, headers));
    }

    pub unsafe fn set_filter_state(f: *mut c_void, key: Buf, value: Buf) -> bool {
        // SAFETY: the module's buffers, a handle this fake made.
        let (k, v) = unsafe { (key.bytes(), value.bytes()) };
        let (k, v) = (
            k.unwrap_or_default().to_vec(),
            v.unwrap_or_default().to_vec(),
        );
        unsafe { stream(f) }.filter_state.insert(k, v);
        true
    }

    pub unsafe fn define(bootstrap: bool, name: Buf, id: *mut usize) -> u32 {
        // SAFETY: the module's buffer and out-parameter.
        let name =
            String::from_utf8_lossy(unsafe { name.bytes() }.unwrap_or_default()).into_owned();
        let i = fake(|x| {
            let list = if bootstrap {
                &mut x.metrics
            } else {
                &mut x.counters
            };
            list.push((name, 0));
            list.len() - 1
        });
        unsafe { id.write(i) };
        0
    }

    pub fn update(bootstrap: bool, id: usize, value: u64, set: bool) -> u32 {
        fake(|x| {
            let list = if bootstrap {
                &mut x.metrics
            } else {
                &mut x.counters
            };
            match list.get_mut(id) {
                Some((_, v)) if set => *v = value,
                Some((_, v)) => *v += value,
                None => return 1,
            }
            0
        })
    }

    pub unsafe fn http_callout(id_out: *mut u64, headers: *const Hdr, n: usize) -> u32 {
        let mut etag = None;
        for i in 0..n {
            // SAFETY: the module's array of `n` headers.
            let h = unsafe { headers.add(i).read() };
            let (k, v) = unsafe { (h.key.bytes(), h.value.bytes()) };
            if k == Some(b"if-none-match") {
                etag = v.map(|v| String::from_utf8_lossy(v).into_owned());
            }
        }
        let id = fake(|x| {
            x.next_callout += 1;
            x.callouts.push((x.next_callout, etag));
            x.next_callout
        });
        // SAFETY: the module's out-parameter.
        unsafe { id_out.write(id) };
        0
    }
}

/// Define Envoy's dynamic-module callbacks in this binary, over the fake
/// ([`cb`]). Use once, in the test binary that drives `ace-dynamic`.
#[macro_export]
macro_rules! fake_envoy_callbacks {
    () => {
        mod fake_envoy_callbacks {
            #![allow(clippy::missing_safety_doc, unsafe_op_in_unsafe_fn)]
            use ace_dynamic_abi::{EnvoyBuffer, EnvoyHeader};
            use std::ffi::c_void;
            use $crate::dynamic::{cb, Buf, Hdr};

            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_log(_level: u32, _message: Buf) {}
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(f: *mut c_void, kind: u32) -> usize {
                cb::get_headers_size(f, kind)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers(f: *mut c_void, kind: u32, out: *mut EnvoyHeader) -> bool {
                cb::get_headers(f, kind, out)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_header(f: *mut c_void, kind: u32, key: Buf, out: *mut EnvoyBuffer, index: usize, count: *mut usize) -> bool {
                cb::get_header(f, kind, key, out, index, count)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_set_header(f: *mut c_void, kind: u32, key: Buf, value: Buf) -> bool {
                cb::set_header(f, kind, key, value)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_add_header(f: *mut c_void, kind: u32, key: Buf, value: Buf) -> bool {
                cb::add_header(f, kind, key, value)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_clear_route_cache(_f: *mut c_void) {}
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(_f: *mut c_void, _ns: Buf, _key: Buf, _value: bool) {}
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_int(_f: *mut c_void, _attribute: u32, _out: *mut u64) -> bool {
                false
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_get_metadata_string(_f: *mut c_void, _source: u32, _ns: Buf, _key: Buf, _out: *mut EnvoyBuffer) -> bool {
                false
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_filter_recreate_stream(_f: *mut c_void, _h: *const Hdr, _n: usize) -> bool {
                false
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(f: *mut c_void, kind: u32) -> usize {
                cb::body_chunks_size(f, kind)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(f: *mut c_void, kind: u32, out: *mut EnvoyBuffer) -> bool {
                cb::body_chunks(f, kind, out)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_size(f: *mut c_void, kind: u32) -> usize {
                cb::body_size(f, kind)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_drain_body(f: *mut c_void, kind: u32, n: usize) -> bool {
                cb::drain_body(f, kind, n)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_append_body(f: *mut c_void, kind: u32, data: Buf) -> bool {
                cb::append_body(f, kind, data)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_send_response(f: *mut c_void, status: u32, h: *const Hdr, n: usize, body: Buf, _details: Buf) {
                cb::send_response(f, status, h, n, body)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_set_filter_state_bytes(f: *mut c_void, key: Buf, value: Buf) -> bool {
                cb::set_filter_state(f, key, value)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(_c: *mut c_void, name: Buf, _l: *const Buf, _n: usize, id: *mut usize) -> u32 {
                cb::define(false, name, id)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_http_filter_increment_counter(_f: *mut c_void, id: usize, _l: *const Buf, _n: usize, value: u64) -> u32 {
                cb::update(false, id, value, false)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(_c: *mut c_void) {}
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_http_callout(_c: *mut c_void, id: *mut u64, _cluster: Buf, h: *const Hdr, n: usize, _body: Buf, _timeout_ms: u64) -> u32 {
                cb::http_callout(id, h, n)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_config_define_counter(_c: *mut c_void, name: Buf, _l: *const Buf, _n: usize, id: *mut usize) -> u32 {
                cb::define(true, name, id)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_config_increment_counter(_c: *mut c_void, id: usize, _l: *const Buf, _n: usize, value: u64) -> u32 {
                cb::update(true, id, value, false)
            }
            #[no_mangle]
            pub unsafe extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_config_define_gauge(_c: *mut c_void, name: Buf, _l: *const Buf, _n: usize, id: *mut usize) -> u32 {
                cb::define(true, name, id)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_config_set_gauge(_c: *mut c_void, id: usize, _l: *const Buf, _n: usize, value: u64) -> u32 {
                cb::update(true, id, value, true)
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_timer_new(_c: *mut c_void) -> *mut c_void {
                // Any non-null handle: the fake fires the one timer itself.
                std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
            }
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_timer_enable(_t: *mut c_void, _delay_ms: u64) {}
            #[no_mangle]
            pub extern "C" fn envoy_dynamic_module_callback_bootstrap_extension_timer_delete(_t: *mut c_void) {}
        }
    };
}

/// One driver at a time per process: the module's state is process-wide.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A request in flight: its stream and the module's object for it.
#[derive(Debug)]
struct InFlight {
    stream: Box<Stream>,
    module: ModulePtr,
    upstream: Option<String>,
}

/// The dynamic module under the fake Envoy, behind the [`Driver`] trait.
#[derive(Debug)]
pub struct DynamicDriver {
    now: u64,
    config: ModulePtr,
    poller: Option<(ModulePtr, ModulePtr, u64)>,
    service: Service,
    flows: HashMap<u64, InFlight>,
    next: u64,
    _one: MutexGuard<'static, ()>,
}

/// A handle for the module: a pointer this fake recognises.
fn handle(s: &mut Stream) -> Filter {
    // SAFETY: the fake's own stream, live while the module uses it.
    unsafe { Filter::from_raw((s as *mut Stream).cast()) }
}

impl DynamicDriver {
    /// The module running `config` (and, when it has a `control` object,
    /// the control poller with it).
    pub fn new(config: &str) -> DynamicDriver {
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        FAKE.with(|x| *x.borrow_mut() = Fake::default());
        test_support::reset_published();
        test_support::set_clock(T0);
        let json: serde_json::Value = serde_json::from_str(config).unwrap();
        let mut poller = None;
        if let Some(control) = json.get("control") {
            let poller_config = serde_json::json!({ "control": control }).to_string();
            let interval = control["interval_ms"].as_u64().unwrap_or(1_000);
            // SAFETY: the fake's handle (never dereferenced by the fake).
            let handle =
                unsafe { ace_dynamic_abi::bootstrap::Config::from_raw(std::ptr::null_mut()) };
            let c = ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_config_new(
                handle,
                envoy_buffer(b"ace_control"),
                envoy_buffer(poller_config.as_bytes()),
            );
            assert!(!c.is_null(), "the poller refused its configuration");
            let e = ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_new(
                c,
                std::ptr::null_mut(),
            );
            poller = Some((c, e, interval));
        }
        // SAFETY: the fake's handle (never dereferenced by the fake).
        let handle = unsafe { ConfigHandle::from_raw(std::ptr::null_mut()) };
        let c = ace_dynamic::envoy_dynamic_module_on_http_filter_config_new(
            handle,
            envoy_buffer(b"ace"),
            envoy_buffer(config.as_bytes()),
        );
        assert!(!c.is_null(), "the module refused the configuration");
        let mut d = DynamicDriver {
            now: T0,
            config: c,
            poller,
            service: Service::Down,
            flows: HashMap::new(),
            next: 0,
            _one: one,
        };
        if let Some((_, e, _)) = d.poller {
            ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_server_initialized(
                std::ptr::null_mut(),
                e,
            );
            d.answer_callouts();
        }
        d
    }

    /// Answer every callout in flight as the service does now.
    fn answer_callouts(&mut self) {
        let Some((_, e, _)) = self.poller else {
            return;
        };
        let callouts = fake(|x| std::mem::take(&mut x.callouts));
        for (id, if_none_match) in callouts {
            let (status, etag, body): (u32, Option<String>, Vec<u8>) = match &self.service {
                Service::Down => (0, None, vec![]),
                Service::NotModified => (304, None, vec![]),
                Service::Serves(b) => {
                    let etag = ace_snapshot::etag(b);
                    if etag.is_some() && etag == if_none_match {
                        (304, etag, vec![])
                    } else {
                        (200, etag, b.clone())
                    }
                }
            };
            let status_text = status.to_string();
            let mut headers = vec![EnvoyHeader {
                key: envoy_buffer(b":status"),
                value: envoy_buffer(status_text.as_bytes()),
            }];
            if let Some(t) = &etag {
                headers.push(EnvoyHeader {
                    key: envoy_buffer(b"etag"),
                    value: envoy_buffer(t.as_bytes()),
                });
            }
            let chunks = [envoy_buffer(&body)];
            test_support::set_clock(self.now);
            if status == 0 {
                // Reset: no response.
                ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
                    std::ptr::null_mut(),
                    e,
                    id,
                    1,
                    std::ptr::null(),
                    0,
                    std::ptr::null(),
                    0,
                );
            } else {
                ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
                    std::ptr::null_mut(),
                    e,
                    id,
                    0,
                    headers.as_ptr(),
                    headers.len(),
                    chunks.as_ptr(),
                    usize::from(!body.is_empty()),
                );
            }
        }
    }

    fn at(&self) {
        test_support::set_clock(self.now);
    }
}

impl Drop for DynamicDriver {
    fn drop(&mut self) {
        for (_, mut f) in self.flows.drain() {
            let h = handle(&mut f.stream);
            ace_dynamic::envoy_dynamic_module_on_http_filter_stream_complete(h, f.module);
            ace_dynamic::envoy_dynamic_module_on_http_filter_destroy(f.module);
        }
        ace_dynamic::envoy_dynamic_module_on_http_filter_config_destroy(self.config);
        if let Some((c, e, _)) = self.poller.take() {
            ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_shutdown(
                std::ptr::null_mut(),
                e,
                None,
                std::ptr::null_mut(),
            );
            ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_destroy(e);
            ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_config_destroy(c);
        }
        test_support::set_clock(0);
    }
}

impl Driver for DynamicDriver {
    fn kind(&self) -> HostKind {
        HostKind::Dynamic
    }

    fn now(&self) -> u64 {
        self.now
    }

    fn open(&mut self, req: &Req) -> u64 {
        self.at();
        let mut s = Box::new(Stream {
            request: request_headers(req)
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
            ..Stream::default()
        });
        let h = handle(&mut s);
        let m = ace_dynamic::envoy_dynamic_module_on_http_filter_new(self.config, h);
        assert!(!m.is_null());
        let mut status = ace_dynamic::envoy_dynamic_module_on_http_filter_request_headers(
            h,
            m,
            req.body.is_empty(),
        );
        let frames: Vec<(&[u8], bool)> = req
            .body
            .iter()
            .map(|c| (c.as_slice(), false))
            .chain((!req.body.is_empty()).then_some((&b""[..], true)))
            .collect();
        for (chunk, end) in frames {
            if s.local.is_some() {
                break;
            }
            s.received_request = chunk.to_vec();
            let h = handle(&mut s);
            status = ace_dynamic::envoy_dynamic_module_on_http_filter_request_body(h, m, end);
            if status == ace_dynamic_abi::status::STOP_AND_BUFFER {
                let r = std::mem::take(&mut s.received_request);
                s.buffered_request.extend_from_slice(&r);
            }
        }
        let upstream = if s.local.is_some() {
            None
        } else {
            assert_eq!(status, 0, "a whole request is never left held");
            s.request
                .iter()
                .find(|(k, _)| k == b"x-ace-destination")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        self.next += 1;
        self.flows.insert(
            self.next,
            InFlight {
                stream: s,
                module: m,
                upstream,
            },
        );
        self.next
    }

    fn upstream(&self, id: u64) -> Option<String> {
        self.flows.get(&id).and_then(|f| f.upstream.clone())
    }

    fn sent(&self, id: u64) -> Option<Vec<(String, String)>> {
        let f = self.flows.get(&id)?;
        f.upstream.as_ref()?;
        Some(
            f.stream
                .request
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(v).into_owned(),
                    )
                })
                .collect(),
        )
    }

    fn close(&mut self, id: u64, answer: &Answer) -> Seen {
        let mut f = self.flows.remove(&id).expect("a request in flight");
        let mut seen = Seen::default();
        let (status, headers, body): (u32, Vec<(String, String)>, Vec<Vec<u8>>) =
            match f.stream.local.clone() {
                Some((status, body, headers)) => {
                    seen.reply = serde_json::from_slice(&body).ok();
                    (status, headers, vec![body])
                }
                None => {
                    self.now += answer.took_ms;
                    (
                        answer.status,
                        answer
                            .headers
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.clone()))
                            .collect(),
                        answer.body.clone(),
                    )
                }
            };
        self.at();
        f.stream.response = std::iter::once((":status".to_string(), status.to_string()))
            .chain(headers)
            .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
            .collect();
        let h = handle(&mut f.stream);
        ace_dynamic::envoy_dynamic_module_on_http_filter_response_headers(
            h,
            f.module,
            body.is_empty(),
        );
        for (i, chunk) in body.iter().enumerate() {
            f.stream.received_response.clone_from(chunk);
            let h = handle(&mut f.stream);
            ace_dynamic::envoy_dynamic_module_on_http_filter_response_body(
                h,
                f.module,
                i + 1 == body.len(),
            );
        }
        let h = handle(&mut f.stream);
        ace_dynamic::envoy_dynamic_module_on_http_filter_stream_complete(h, f.module);
        ace_dynamic::envoy_dynamic_module_on_http_filter_destroy(f.module);
        seen.status = status;
        seen.headers = Some(
            f.stream
                .response
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(v).into_owned(),
                    )
                })
                .collect(),
        );
        let line = f
            .stream
            .filter_state
            .get(ace_dynamic::EVENT_KEY.as_bytes())
            .unwrap_or_else(|| panic!("no event in filter state"));
        seen.event = serde_json::from_slice(line).unwrap();
        seen.upstream = f.upstream;
        seen
    }

    fn service(&mut self, service: Service) {
        self.service = service;
    }

    fn advance(&mut self, ms: u64) {
        let end = self.now + ms;
        if let Some((_, e, interval)) = self.poller {
            // The timer, armed for the interval at every firing, fires at
            // each multiple of it since start-up.
            let mut next = (self.now - T0) / interval * interval + interval + T0;
            while next <= end {
                self.now = next;
                self.at();
                ace_dynamic::poller::envoy_dynamic_module_on_bootstrap_extension_timer_fired(
                    std::ptr::null_mut(),
                    e,
                    std::ptr::null_mut(),
                );
                self.answer_callouts();
                next += interval;
            }
        }
        self.now = end;
        self.at();
    }

    fn counter(&mut self, name: &str) -> Option<u64> {
        Some(fake(|x| {
            x.counters
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, v)| *v)
        }))
    }
}
