//! ace-dynamic-abi: Envoy 1.40's HTTP dynamic-module ABI ("v0.2.0"), the
//! part ACE uses, and safe wrappers over it.
//!
//! The prototypes follow `source/extensions/dynamic_modules/abi/abi.h` of
//! Envoy 1.40 and were checked against the 1.40 release binary's exported
//! symbols and their argument registers. The ABI changes between Envoy
//! releases, so this module is built for 1.40 (the Envoy `make setup`
//! installs); another Envoy may warn about the version or refuse to load it.
//!
//! Two users: `ace-dynamic` (ACE itself) and `benches/dynamic-floor` (a
//! measuring module that makes only ACE's calls). The declarations are
//! public ([`raw`]) for the bench, which calls them exactly as it measures;
//! ACE uses the wrappers: [`Filter`] (one stream's handle, valid from
//! Envoy's `filter_new` to `destroy`) and [`ConfigHandle`] (valid during
//! `config_new`), whose methods take and return Rust slices. Buffers Envoy
//! hands out point into its own memory and are valid until the hook that
//! read them returns; the wrappers keep them inside a closure or copy them.
//! [`unused_http_hooks!`] defines the hooks Envoy requires of every HTTP
//! filter module that neither user needs.
//!
//! [`bootstrap`] is the bootstrap-extension side (`envoy.bootstrap.dynamic_modules`):
//! main-thread timers, HTTP callouts and metrics, for ACE's control poller;
//! [`unused_bootstrap_hooks!`] defines the bootstrap hooks it does not use.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod bootstrap;

use raw::*;
use std::ffi::{c_char, c_void};

/// A buffer Envoy owns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    /// A null buffer, for Envoy to fill.
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, or nothing for a null pointer.
    ///
    /// # Safety
    /// `self` must come from Envoy, and the hook that received it must not
    /// have returned.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: Envoy's buffer, valid for the caller's hook (above).
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.length) }
    }
}

/// A buffer the module owns, lent to Envoy for one call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const c_char,
    length: usize,
}

impl ModuleBuffer {
    /// Lend `bytes` (they must outlive the call they are passed to).
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
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
    pub key: EnvoyBuffer,
    pub value: EnvoyBuffer,
}

impl EnvoyHeader {
    /// An empty entry, for arrays Envoy fills.
    pub const EMPTY: EnvoyHeader = EnvoyHeader {
        key: EnvoyBuffer::EMPTY,
        value: EnvoyBuffer::EMPTY,
    };
}

/// One header the module owns (for local replies).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHeader {
    key: ModuleBuffer,
    value: ModuleBuffer,
}

/// Envoy's handle for one stream's filter. Only Envoy makes one (it is a
/// hook's argument; [`Filter::from_raw`] is unsafe), so safe code cannot
/// forge a handle and pass Envoy a pointer it never gave out.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct Filter(*mut c_void);

/// Envoy's handle for a filter configuration being created; like
/// [`Filter`], only Envoy makes one.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct ConfigHandle(*mut c_void);

/// The module's object for a configuration or a stream, as Envoy holds it.
pub type ModulePtr = *const c_void;

/// Which header map (`envoy_dynamic_module_type_http_header_type`).
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum HeaderMap {
    Request = 0,
    Response = 2,
}

/// Which body (`envoy_dynamic_module_type_http_body_type`): the chunk this
/// hook received.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum Body {
    ReceivedRequest = 0,
    BufferedRequest = 1,
    ReceivedResponse = 2,
}

/// `..._on_http_filter_request_headers_status` and its siblings.
pub mod status {
    /// Every `Continue` is 0.
    pub const CONTINUE: u32 = 0;
    /// Request headers: hold them (until a body hook continues).
    pub const STOP_ITERATION: u32 = 1;
    /// Request body: hold it and let Envoy buffer it.
    pub const STOP_AND_BUFFER: u32 = 1;
    /// Request body: stop, keeping nothing (after a local reply).
    pub const STOP_NO_BUFFER: u32 = 3;
}

/// `envoy_dynamic_module_type_log_level`.
#[repr(u32)]
#[derive(Debug, Clone, Copy)]
pub enum LogLevel {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// The C declarations, as Envoy 1.40 exports them.
pub mod raw {
    use super::{ConfigHandle, EnvoyBuffer, EnvoyHeader, Filter, ModuleBuffer, ModuleHeader};

    extern "C" {
        pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
        pub fn envoy_dynamic_module_callback_http_get_headers_size(f: Filter, kind: u32) -> usize;
        pub fn envoy_dynamic_module_callback_http_get_headers(
            f: Filter,
            kind: u32,
            out: *mut EnvoyHeader,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_get_header(
            f: Filter,
            kind: u32,
            key: ModuleBuffer,
            out: *mut EnvoyBuffer,
            index: usize,
            optional_size: *mut usize,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_set_header(
            f: Filter,
            kind: u32,
            key: ModuleBuffer,
            value: ModuleBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_add_header(
            f: Filter,
            kind: u32,
            key: ModuleBuffer,
            value: ModuleBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_clear_route_cache(f: Filter);
        pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(
            f: Filter,
            namespace: ModuleBuffer,
            key: ModuleBuffer,
            value: bool,
        );
        pub fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
            f: Filter,
            attribute: u32,
            out: *mut u64,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_get_metadata_string(
            f: Filter,
            source: u32,
            namespace: ModuleBuffer,
            key: ModuleBuffer,
            out: *mut EnvoyBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_filter_recreate_stream(
            f: Filter,
            headers: *const ModuleHeader,
            headers_len: usize,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
            f: Filter,
            kind: u32,
        ) -> usize;
        pub fn envoy_dynamic_module_callback_http_get_body_chunks(
            f: Filter,
            kind: u32,
            out: *mut EnvoyBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_get_body_size(f: Filter, kind: u32) -> usize;
        pub fn envoy_dynamic_module_callback_http_drain_body(
            f: Filter,
            kind: u32,
            bytes: usize,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_append_body(
            f: Filter,
            kind: u32,
            data: ModuleBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_send_response(
            f: Filter,
            status: u32,
            headers: *const ModuleHeader,
            headers_len: usize,
            body: ModuleBuffer,
            details: ModuleBuffer,
        );
        pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
            f: Filter,
            key: ModuleBuffer,
            value: ModuleBuffer,
        ) -> bool;
        pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
            c: ConfigHandle,
            name: ModuleBuffer,
            label_names: *const ModuleBuffer,
            label_names_len: usize,
            id: *mut usize,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
            f: Filter,
            id: usize,
            label_values: *const ModuleBuffer,
            label_values_len: usize,
            value: u64,
        ) -> u32;
    }
}

/// Let Envoy write `n` entries into `scratch` through `get` (which gets a
/// pointer with room for `n` and says whether it wrote them); the vector
/// then holds them, or nothing if Envoy did not write.
fn fill<T>(scratch: &mut Vec<T>, n: usize, get: impl FnOnce(*mut T) -> bool) {
    scratch.clear();
    scratch.reserve(n);
    if n > 0 && get(scratch.as_mut_ptr()) {
        // SAFETY: room for `n` was reserved, and Envoy initialised all `n`
        // (it returned true).
        unsafe { scratch.set_len(n) }
    }
}

/// Write `message` to Envoy's log (component `dynamic_modules`).
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: a plain call; the message outlives it.
    unsafe { envoy_dynamic_module_callback_log(level as u32, ModuleBuffer::of(message.as_bytes())) }
}

impl ConfigHandle {
    /// Define counter `name`; its id for [`Filter::increment_counter`], or
    /// Envoy's error code.
    pub fn define_counter(self, name: &str) -> Result<usize, u32> {
        // SAFETY: `self` is live during `config_new`, the only caller.
        unsafe {
            define_unlabelled(
                self,
                envoy_dynamic_module_callback_http_filter_config_define_counter,
                name,
            )
        }
    }

    /// Wrap Envoy's pointer.
    ///
    /// # Safety
    /// `p` is the configuration handle Envoy passed to the
    /// `config_new` hook that is running now.
    pub unsafe fn from_raw(p: *mut c_void) -> ConfigHandle {
        ConfigHandle(p)
    }
}

/// The (name, value) pairs of a header map Envoy filled in
/// [`Filter::with_headers`] (they exist only inside its closure, while the
/// hook that read them runs) or [`Filter::headers_into`].
#[derive(Debug, Clone)]
pub struct HeaderPairs<'h>(std::slice::Iter<'h, EnvoyHeader>);

impl<'h> HeaderPairs<'h> {
    /// The pairs of `headers`, filled by [`Filter::headers_into`].
    ///
    /// # Safety
    /// Only inside the hook that filled them, and only while their map is
    /// unchanged since: Envoy's buffers move when the map changes.
    pub unsafe fn over(headers: &'h [EnvoyHeader]) -> HeaderPairs<'h> {
        HeaderPairs(headers.iter())
    }
}

impl<'h> Iterator for HeaderPairs<'h> {
    type Item = (&'h [u8], &'h [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let h = self.0.next()?;
        // SAFETY: Envoy's buffers; a `HeaderPairs` lives only inside
        // `with_headers`'s closure, before the hook returns.
        Some(unsafe { (h.key.bytes(), h.value.bytes()) })
    }
}

impl Filter {
    /// Every header of `map`, as (name, value) pairs borrowed from Envoy,
    /// handed to `f` (they are valid only inside the hook). `scratch` holds
    /// the list between requests so reading allocates nothing once warm.
    pub fn with_headers<T>(
        self,
        map: HeaderMap,
        scratch: &mut Vec<EnvoyHeader>,
        f: impl FnOnce(HeaderPairs<'_>) -> T,
    ) -> T {
        self.headers_into(map, scratch);
        f(HeaderPairs(scratch.iter()))
    }

    /// Every header of `map` into `into`, as Envoy's buffers, in one call
    /// and without copying a byte: for a hook that looks up several
    /// headers (one `get_header` costs Envoy a key copy and a scan of the
    /// map each time). Read them with [`HeaderPairs::over`], inside this
    /// hook and before the map changes.
    pub fn headers_into(self, map: HeaderMap, into: &mut Vec<EnvoyHeader>) {
        let map = map as u32;
        // SAFETY: `self` is live for this hook.
        let n = unsafe { envoy_dynamic_module_callback_http_get_headers_size(self, map) };
        // SAFETY: as above; `fill` hands a pointer with room for `n`.
        fill(into, n, |out| unsafe {
            envoy_dynamic_module_callback_http_get_headers(self, map, out)
        });
    }

    /// Set header `name` of `map` to `value`, replacing every earlier value.
    pub fn set_header(self, map: HeaderMap, name: &str, value: &str) -> bool {
        // SAFETY: `self` is live; Envoy copies key and value.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self,
                map as u32,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    /// Add `value` to header `name` of `map`, keeping its earlier values.
    pub fn add_header(self, map: HeaderMap, name: &str, value: &str) -> bool {
        // SAFETY: `self` is live; Envoy copies key and value.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(
                self,
                map as u32,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    /// Remove every value of header `name` from `map` (Envoy removes the
    /// header when the value pointer is null).
    pub fn remove_header(self, map: HeaderMap, name: &str) -> bool {
        // SAFETY: `self` is live; Envoy copies the key.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self,
                map as u32,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer {
                    ptr: std::ptr::null(),
                    length: 0,
                },
            )
        }
    }

    /// The status Envoy sent the client (attribute `response.code`), if it
    /// sent one: also Envoy's own replies that no filter saw, such as its
    /// 413 for a body over the buffer limit.
    pub fn response_code(self) -> Option<u64> {
        /// `envoy_dynamic_module_type_attribute_id_ResponseCode`.
        const RESPONSE_CODE: u32 = 15;
        let mut out = 0u64;
        // SAFETY: `self` is live; Envoy writes one integer to `out`.
        let found = unsafe {
            raw::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                self,
                RESPONSE_CODE,
                &mut out,
            )
        };
        found.then_some(out).filter(|c| *c > 0)
    }

    /// The string value of the request's dynamic metadata
    /// `namespace`.`key` (a top-level key: what another filter, such as
    /// `ext_authz` or `set_metadata`, published), passed to `f`; `None`
    /// when there is none or it is not a string.
    pub fn with_metadata_string<T>(
        self,
        namespace: &str,
        key: &str,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Option<T> {
        /// `envoy_dynamic_module_type_metadata_source_Dynamic`.
        const DYNAMIC: u32 = 0;
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: the buffers outlive the call; Envoy writes one buffer
        // descriptor to `out`, valid until the hook returns.
        let found = unsafe {
            raw::envoy_dynamic_module_callback_http_get_metadata_string(
                self,
                DYNAMIC,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        // SAFETY: Envoy's buffer, valid for this hook.
        found.then(|| f(unsafe { out.bytes() }))
    }

    /// Set dynamic metadata `namespace`.`key` to `value` (what access-log
    /// `metadata_filter`s and `%DYNAMIC_METADATA%` read).
    pub fn set_metadata_bool(self, namespace: &str, key: &str, value: bool) {
        // SAFETY: `self` is live; Envoy copies namespace and key.
        unsafe {
            envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(
                self,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                value,
            )
        }
    }

    /// Make Envoy select the route again (after the routing header changed).
    pub fn clear_route_cache(self) {
        // SAFETY: `self` is live.
        unsafe { envoy_dynamic_module_callback_http_clear_route_cache(self) }
    }

    /// Tear this stream's filter chain down and run the request through it
    /// again, as Envoy does for an internal redirect (headers as they are
    /// now, the body if Envoy buffered it). False when Envoy cannot (the
    /// request is not complete, or a response has started).
    pub fn recreate_stream(self) -> bool {
        // SAFETY: `self` is live; no headers are passed.
        unsafe {
            envoy_dynamic_module_callback_http_filter_recreate_stream(self, std::ptr::null(), 0)
        }
    }

    /// Hand each chunk of `body` to `f`.
    pub fn for_each_chunk(
        self,
        body: Body,
        scratch: &mut Vec<EnvoyBuffer>,
        mut f: impl FnMut(&[u8]),
    ) {
        let body = body as u32;
        // SAFETY: `self` is live for this hook.
        let n = unsafe { envoy_dynamic_module_callback_http_get_body_chunks_size(self, body) };
        // SAFETY: as above; `fill` hands a pointer with room for `n`.
        fill(scratch, n, |out| unsafe {
            envoy_dynamic_module_callback_http_get_body_chunks(self, body, out)
        });
        for chunk in scratch.iter() {
            // SAFETY: Envoy's buffer, read before this hook returns.
            f(unsafe { chunk.bytes() });
        }
    }

    /// Replace the held request body (what Envoy buffered so far and the
    /// chunk this hook received) with `body`; false if Envoy refused.
    pub fn replace_request_body(self, body: &[u8]) -> bool {
        let mut ok = true;
        for kind in [Body::BufferedRequest, Body::ReceivedRequest] {
            let kind = kind as u32;
            // SAFETY: `self` is live for this hook; no pointers.
            let size = unsafe { envoy_dynamic_module_callback_http_get_body_size(self, kind) };
            if size > 0 {
                // SAFETY: as above.
                ok &= unsafe { envoy_dynamic_module_callback_http_drain_body(self, kind, size) };
            }
        }
        // SAFETY: `self` is live; Envoy copies the bytes.
        ok && unsafe {
            envoy_dynamic_module_callback_http_append_body(
                self,
                Body::ReceivedRequest as u32,
                ModuleBuffer::of(body),
            )
        }
    }

    /// Replace the response body chunk this hook received with `bytes`.
    pub fn replace_received_response(self, bytes: &[u8]) -> bool {
        let kind = Body::ReceivedResponse as u32;
        // SAFETY: `self` is live for this hook; no pointers.
        let size = unsafe { envoy_dynamic_module_callback_http_get_body_size(self, kind) };
        // SAFETY: as above.
        let drained =
            size == 0 || unsafe { envoy_dynamic_module_callback_http_drain_body(self, kind, size) };
        // SAFETY: `self` is live; Envoy copies the bytes.
        drained
            && (bytes.is_empty()
                || unsafe {
                    envoy_dynamic_module_callback_http_append_body(
                        self,
                        kind,
                        ModuleBuffer::of(bytes),
                    )
                })
    }

    /// Answer the request locally: `status`, a JSON `body`, and `details`
    /// for Envoy's response-code details (what `%RESPONSE_CODE_DETAILS%`
    /// logs).
    pub fn send_json(self, status: u32, body: &[u8], details: &str) {
        self.send(status, "application/json", body, details)
    }

    /// [`Self::send_json`] with `extra` headers (at most seven).
    pub fn send_json_with(self, status: u32, body: &[u8], details: &str, extra: &[(&str, &str)]) {
        self.send_with(status, "application/json", body, details, extra);
    }

    /// Answer the request locally with `body` of type `content_type`.
    pub fn send(self, status: u32, content_type: &str, body: &[u8], details: &str) {
        self.send_with(status, content_type, body, details, &[]);
    }

    /// Answer the request locally with `body` of type `content_type` and
    /// `extra` headers (at most seven).
    pub fn send_with(
        self,
        status: u32,
        content_type: &str,
        body: &[u8],
        details: &str,
        extra: &[(&str, &str)],
    ) {
        let empty = ModuleHeader {
            key: ModuleBuffer::of(b""),
            value: ModuleBuffer::of(b""),
        };
        let mut headers = [empty; 8];
        headers[0] = ModuleHeader {
            key: ModuleBuffer::of(b"content-type"),
            value: ModuleBuffer::of(content_type.as_bytes()),
        };
        let mut n = 1;
        for (slot, (k, v)) in headers.iter_mut().skip(1).zip(extra) {
            *slot = ModuleHeader {
                key: ModuleBuffer::of(k.as_bytes()),
                value: ModuleBuffer::of(v.as_bytes()),
            };
            n += 1;
        }
        // SAFETY: `self` is live; Envoy copies headers, body and details.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self,
                status,
                headers.as_ptr(),
                n,
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            )
        }
    }

    /// Store `value` in the stream's filter state under `key` (the access
    /// log reads it with `%FILTER_STATE(key:PLAIN)%`).
    pub fn set_filter_state(self, key: &str, value: &[u8]) -> bool {
        // SAFETY: `self` is live; Envoy copies key and value.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }

    /// Add `n` to counter `id` (from [`ConfigHandle::define_counter`] on
    /// this stream's configuration).
    pub fn increment_counter(self, id: usize, n: u64) {
        // SAFETY: `self` is live; no labels. An unknown id is an error
        // code, not a crash.
        unsafe {
            envoy_dynamic_module_callback_http_filter_increment_counter(
                self,
                id,
                std::ptr::null(),
                0,
                n,
            );
        }
    }

    /// Wrap Envoy's pointer.
    ///
    /// # Safety
    /// `p` is the filter handle Envoy passed to a hook of a stream that is
    /// still live, used only during Envoy's call of that stream's hooks.
    pub unsafe fn from_raw(p: *mut c_void) -> Filter {
        Filter(p)
    }
}

/// Define metric `name` without labels through Envoy's `define` callback
/// (an HTTP filter's or a bootstrap extension's); its id, or Envoy's
/// error code.
///
/// # Safety
/// `handle` must be live for `define` (the hook that received it has not
/// returned, or Envoy's lifetime rules for it hold).
pub(crate) unsafe fn define_unlabelled<H>(
    handle: H,
    define: unsafe extern "C" fn(H, ModuleBuffer, *const ModuleBuffer, usize, *mut usize) -> u32,
    name: &str,
) -> Result<usize, u32> {
    let mut id = 0usize;
    // SAFETY: the caller's contract; no labels; `id` outlives the call.
    let r = unsafe {
        define(
            handle,
            ModuleBuffer::of(name.as_bytes()),
            std::ptr::null(),
            0,
            &mut id,
        )
    };
    if r == 0 {
        Ok(id)
    } else {
        Err(r)
    }
}

/// Define, as no-ops, the HTTP filter hooks Envoy 1.40 requires of every
/// module that ACE's modules do not use: response trailers, HTTP callouts
/// and streams, scheduled events and downstream watermarks. Use once, at a
/// cdylib's root.
#[macro_export]
macro_rules! unused_http_hooks {
    () => {
        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
        ) -> u32 {
            $crate::status::CONTINUE
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _callout_id: u64,
            _result: u32,
            _headers: *mut $crate::EnvoyHeader,
            _headers_size: usize,
            _body_chunks: *mut $crate::EnvoyBuffer,
            _body_chunks_size: usize,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _stream_id: u64,
            _headers: *mut $crate::EnvoyHeader,
            _headers_size: usize,
            _end_stream: bool,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _stream_id: u64,
            _data: *const $crate::EnvoyBuffer,
            _data_count: usize,
            _end_stream: bool,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _stream_id: u64,
            _trailers: *mut $crate::EnvoyHeader,
            _trailers_size: usize,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _stream_id: u64,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _stream_id: u64,
            _reason: u32,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
            _event_id: u64,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
            _envoy: $crate::Filter,
            _m: $crate::ModulePtr,
        ) {
        }
    };
}
