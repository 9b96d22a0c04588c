//! Envoy 1.40's bootstrap-extension ABI (`envoy.bootstrap.dynamic_modules`),
//! the part ACE's control poller uses: the extension configuration's
//! handle ([`Config`]) with its metrics, HTTP callouts and init signal,
//! main-thread [`Timer`]s, and a callout's [`Response`].
//!
//! Checked against the 1.40 release binary: every callback is exported
//! (`nm -D`), and the argument registers of `http_callout`,
//! `config_define_counter`/`_gauge`, `config_increment_counter`,
//! `config_set_gauge`, `timer_new`/`_enable`/`_delete` and
//! `config_signal_init_complete` match these declarations (`objdump -d`
//! on each entry: `http_callout` takes the cluster name in `rdx:rcx`, the
//! headers in `r8`/`r9` as 32-byte entries, the body at `16(%rbp)` and the
//! timeout at `32(%rbp)`; `timer_enable` passes `rsi` on as milliseconds).
//! The hooks Envoy calls take their arguments as the 1.40 Rust SDK linked
//! into the same binary reads them (`hickory_dns_static_*` symbols).
//!
//! 1.40 resolves all seventeen bootstrap hooks when it loads the
//! extension and refuses the configuration if any is missing (tried: each
//! left out in turn fails with "Failed to resolve symbol ..."), so a module
//! defines those it does not use as no-ops ([`crate::unused_bootstrap_hooks!`]).
//! Envoy registers an init target for every bootstrap extension that holds
//! all traffic until [`Config::signal_init_complete`].

use crate::{EnvoyBuffer, EnvoyHeader, ModuleBuffer, ModuleHeader};
use raw::*;
use std::ffi::c_void;
use std::fmt;

/// Envoy's `config_define_counter` and `config_define_gauge`.
type Define =
    unsafe extern "C" fn(Config, ModuleBuffer, *const ModuleBuffer, usize, *mut usize) -> u32;
/// Envoy's `config_increment_counter` and `config_set_gauge`.
type Update = unsafe extern "C" fn(Config, usize, *const ModuleBuffer, usize, u64) -> u32;

/// Envoy's handle for a bootstrap extension's configuration, valid from
/// the `config_new` hook that received it until `config_destroy`. Only
/// Envoy makes one ([`Config::from_raw`] is unsafe). Every call must be
/// made on Envoy's main thread, where all bootstrap hooks run.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct Config(*mut c_void);

/// A main-thread timer; deleted when dropped. When it fires, Envoy calls
/// the `timer_fired` hook with its [`Timer::id`].
#[derive(Debug)]
pub struct Timer(*mut c_void);

/// Why Envoy could not start a callout
/// (`envoy_dynamic_module_type_http_callout_init_result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalloutInit {
    /// `:method`, `:path` or `host` is missing.
    MissingRequiredHeaders,
    /// No such cluster (or, before the server is initialized, no cluster
    /// manager yet).
    ClusterNotFound,
    /// The callout id is in use.
    DuplicateCalloutId,
    /// Envoy could not create the request, or it ended at once (no
    /// healthy host).
    CannotCreateRequest,
    /// A code this module does not know.
    Other(u32),
}

impl CalloutInit {
    fn of(code: u32) -> CalloutInit {
        match code {
            1 => CalloutInit::MissingRequiredHeaders,
            2 => CalloutInit::ClusterNotFound,
            3 => CalloutInit::DuplicateCalloutId,
            4 => CalloutInit::CannotCreateRequest,
            c => CalloutInit::Other(c),
        }
    }
}

impl fmt::Display for CalloutInit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalloutInit::MissingRequiredHeaders => f.write_str("a required header is missing"),
            CalloutInit::ClusterNotFound => f.write_str("no such cluster in Envoy's configuration"),
            CalloutInit::DuplicateCalloutId => f.write_str("duplicate callout id"),
            CalloutInit::CannotCreateRequest => {
                f.write_str("Envoy cannot create the request (no healthy host?)")
            }
            CalloutInit::Other(c) => write!(f, "Envoy's code {c}"),
        }
    }
}

/// How a callout ended (`envoy_dynamic_module_type_http_callout_result`):
/// with a response (perhaps Envoy's own, such as a 503 when the cluster
/// cannot connect or a 504 on the timeout), or without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalloutResult {
    /// A response arrived.
    Success,
    /// The stream was reset.
    Reset,
    /// The response was larger than Envoy buffers.
    ExceedResponseBufferLimit,
    /// A code this module does not know.
    Other(u32),
}

impl CalloutResult {
    /// The result Envoy passed to the `http_callout_done` hook.
    pub fn of(code: u32) -> CalloutResult {
        match code {
            0 => CalloutResult::Success,
            1 => CalloutResult::Reset,
            2 => CalloutResult::ExceedResponseBufferLimit,
            c => CalloutResult::Other(c),
        }
    }
}

impl fmt::Display for CalloutResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CalloutResult::Success => f.write_str("answered"),
            CalloutResult::Reset => f.write_str("the stream was reset"),
            CalloutResult::ExceedResponseBufferLimit => {
                f.write_str("the response exceeded Envoy's buffer limit")
            }
            CalloutResult::Other(c) => write!(f, "Envoy's code {c}"),
        }
    }
}

/// The C declarations, as Envoy 1.40 exports them.
pub mod raw {
    use super::Config;
    use crate::{ModuleBuffer, ModuleHeader};
    use std::ffi::c_void;

    extern "C" {
        pub fn envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(
            c: Config,
        );
        pub fn envoy_dynamic_module_callback_bootstrap_extension_http_callout(
            c: Config,
            callout_id_out: *mut u64,
            cluster: ModuleBuffer,
            headers: *const ModuleHeader,
            headers_len: usize,
            body: ModuleBuffer,
            timeout_ms: u64,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_config_define_counter(
            c: Config,
            name: ModuleBuffer,
            label_names: *const ModuleBuffer,
            label_names_len: usize,
            id: *mut usize,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_config_increment_counter(
            c: Config,
            id: usize,
            label_values: *const ModuleBuffer,
            label_values_len: usize,
            value: u64,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_config_define_gauge(
            c: Config,
            name: ModuleBuffer,
            label_names: *const ModuleBuffer,
            label_names_len: usize,
            id: *mut usize,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_config_set_gauge(
            c: Config,
            id: usize,
            label_values: *const ModuleBuffer,
            label_values_len: usize,
            value: u64,
        ) -> u32;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_timer_new(
            c: Config,
        ) -> *mut c_void;
        pub fn envoy_dynamic_module_callback_bootstrap_extension_timer_enable(
            t: *mut c_void,
            delay_ms: u64,
        );
        pub fn envoy_dynamic_module_callback_bootstrap_extension_timer_delete(t: *mut c_void);
    }
}

impl Config {
    /// Wrap Envoy's pointer.
    ///
    /// # Safety
    /// `p` is the configuration handle Envoy passed to a bootstrap hook,
    /// and the configuration is not destroyed while the wrapper is used.
    pub unsafe fn from_raw(p: *mut c_void) -> Config {
        Config(p)
    }

    /// Let Envoy serve traffic: its init target for this extension is
    /// done. Call once.
    pub fn signal_init_complete(self) {
        // SAFETY: a live configuration, on the main thread.
        unsafe {
            envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(self)
        }
    }

    /// Define counter `name` (only in `config_new`: Envoy freezes metric
    /// creation after it); its id, or Envoy's error code.
    pub fn define_counter(self, name: &str) -> Result<usize, u32> {
        self.define(
            envoy_dynamic_module_callback_bootstrap_extension_config_define_counter,
            name,
        )
    }

    /// Define gauge `name` (only in `config_new`); its id, or Envoy's
    /// error code.
    pub fn define_gauge(self, name: &str) -> Result<usize, u32> {
        self.define(
            envoy_dynamic_module_callback_bootstrap_extension_config_define_gauge,
            name,
        )
    }

    /// Add `n` to counter `id`.
    pub fn increment_counter(self, id: usize, n: u64) {
        self.update(
            envoy_dynamic_module_callback_bootstrap_extension_config_increment_counter,
            id,
            n,
        )
    }

    /// Set gauge `id` to `value`.
    pub fn set_gauge(self, id: usize, value: u64) {
        self.update(
            envoy_dynamic_module_callback_bootstrap_extension_config_set_gauge,
            id,
            value,
        )
    }

    /// Define a metric without labels through Envoy's `define`.
    fn define(self, define: Define, name: &str) -> Result<usize, u32> {
        // SAFETY: a live configuration (this handle's contract).
        unsafe { crate::define_unlabelled(self, define, name) }
    }

    /// Change metric `id` (no labels) by `value` through Envoy's `update`.
    fn update(self, update: Update, id: usize, value: u64) {
        // SAFETY: a live configuration; no labels. An unknown id is an
        // error code, not a crash.
        unsafe {
            update(self, id, std::ptr::null(), 0, value);
        }
    }

    /// Send a body-less request through `cluster` (only once the server is
    /// initialized: before, Envoy has no cluster manager and answers
    /// [`CalloutInit::ClusterNotFound`]). `headers` must hold `:method`,
    /// `:path` and `host` (or `:authority`). The answer comes to the
    /// `http_callout_done` hook with the id returned here.
    ///
    /// Envoy may complete the request inside this call (a local reply,
    /// such as no healthy host) and call `http_callout_done` before it
    /// returns, with an id the caller has not seen yet; it then returns
    /// [`CalloutInit::CannotCreateRequest`]. A hook must not assume this
    /// call has returned.
    pub fn http_callout(
        self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u64, CalloutInit> {
        let headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader {
                key: ModuleBuffer::of(k.as_bytes()),
                value: ModuleBuffer::of(v.as_bytes()),
            })
            .collect();
        let mut id = 0u64;
        // SAFETY: a live configuration on the main thread; Envoy copies
        // the cluster name and headers; `id` outlives the call.
        let r = unsafe {
            envoy_dynamic_module_callback_bootstrap_extension_http_callout(
                self,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::of(&[]),
                timeout_ms,
            )
        };
        if r == 0 {
            Ok(id)
        } else {
            Err(CalloutInit::of(r))
        }
    }

    /// A new timer on the main thread, not armed; `None` if Envoy gave
    /// none.
    pub fn timer(self) -> Option<Timer> {
        // SAFETY: a live configuration, on the main thread.
        let t = unsafe { envoy_dynamic_module_callback_bootstrap_extension_timer_new(self) };
        (!t.is_null()).then_some(Timer(t))
    }
}

impl Timer {
    /// Fire once, `delay_ms` from now (re-arming an armed timer resets it).
    pub fn enable(&self, delay_ms: u64) {
        // SAFETY: a live timer (deleted only on drop), on the main thread.
        unsafe { envoy_dynamic_module_callback_bootstrap_extension_timer_enable(self.0, delay_ms) }
    }

    /// The id Envoy passes to `timer_fired` for this timer.
    pub fn id(&self) -> usize {
        self.0 as usize
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: made by `timer_new`, deleted once. Envoy's timer holds a
        // weak reference to its configuration, so deleting it after the
        // configuration is gone is safe.
        unsafe { envoy_dynamic_module_callback_bootstrap_extension_timer_delete(self.0) }
    }
}

/// A callout's response as the `http_callout_done` hook received it:
/// Envoy's buffers, valid until the hook returns.
#[derive(Debug, Clone, Copy)]
pub struct Response<'a> {
    headers: &'a [EnvoyHeader],
    body: &'a [EnvoyBuffer],
}

impl<'a> Response<'a> {
    /// Wrap the hook's arguments (null pointers or zero counts: none).
    ///
    /// # Safety
    /// The pointers and counts are those Envoy passed to the
    /// `http_callout_done` hook that is running now, and the value does not
    /// outlive it.
    pub unsafe fn from_raw(
        headers: *const EnvoyHeader,
        headers_len: usize,
        body: *const EnvoyBuffer,
        body_len: usize,
    ) -> Response<'a> {
        let headers = if headers.is_null() || headers_len == 0 {
            &[][..]
        } else {
            // SAFETY: Envoy's array of `headers_len` entries (above).
            unsafe { std::slice::from_raw_parts(headers, headers_len) }
        };
        let body = if body.is_null() || body_len == 0 {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(body, body_len) }
        };
        Response { headers, body }
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers.iter().find_map(|h| {
            // SAFETY: Envoy's buffers, valid for the hook (`from_raw`).
            let (k, v) = unsafe { (h.key.bytes(), h.value.bytes()) };
            k.eq_ignore_ascii_case(name.as_bytes()).then_some(v)
        })
    }

    /// The body, in Envoy's chunks.
    pub fn body(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        // SAFETY: as `header`.
        self.body.iter().map(|b| unsafe { b.bytes() })
    }
}

/// Define, as no-ops, the bootstrap hooks Envoy 1.40 requires of every
/// bootstrap extension module that ACE does not use: worker-thread start,
/// drain, scheduled events, file watches, admin handlers, and cluster and
/// listener changes. Use once, at a cdylib's root.
#[macro_export]
macro_rules! unused_bootstrap_hooks {
    () => {
        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_worker_thread_initialized(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_drain_started(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_scheduled(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _event_id: u64,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_file_changed(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _path: $crate::EnvoyBuffer,
            _events: u32,
        ) {
        }

        /// No admin handler is registered, so Envoy never calls this.
        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_admin_request(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _method: $crate::EnvoyBuffer,
            _path: $crate::EnvoyBuffer,
            _body: $crate::EnvoyBuffer,
        ) -> u32 {
            404
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_add_or_update(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _name: $crate::EnvoyBuffer,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_removal(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _name: $crate::EnvoyBuffer,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_add_or_update(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _name: $crate::EnvoyBuffer,
        ) {
        }

        #[no_mangle]
        pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_removal(
            _envoy: *mut ::std::ffi::c_void,
            _m: $crate::ModulePtr,
            _name: $crate::EnvoyBuffer,
        ) {
        }
    };
}
