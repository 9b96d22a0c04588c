//! ace-dynamic: ACE as an Envoy dynamic module, a native shared library
//! (`libace_dynamic.so`) that Envoy 1.40 loads with
//! `envoy.filters.http.dynamic_modules`.
//!
//! Why a second adapter: inside Envoy's V8, each proxy-wasm host call that
//! returns data re-enters the Wasm module, and the Wasm filter's host calls
//! alone cost about 20 µs p50 per request (`BENCHMARKS.md`). A dynamic
//! module calls Envoy with plain function calls that hand out pointers into
//! Envoy's own buffers, and shares the process's memory, so the fleet state
//! needs no shared-data round trips. The Wasm filter stays what Istio's
//! WasmPlugin loads; this is for proxies you configure yourself.
//!
//! It is the same filter: the same configuration (`ace plugin-config`),
//! the same request flow ([`ace_flow::flow`], which this crate drives
//! through its [`Host`] implementation), the same decision core, the same
//! event line and counters. Only the plumbing differs:
//!
//! - request headers: the whole map is read once and encoded as
//!   [`Pairs`], which the attribute resolver and the event already read;
//! - routing: the destination header is set (replacing what the client
//!   sent) and the route cache cleared, so Envoy re-selects the route;
//! - the fleet's health and in-flight counts live in process memory
//!   ([`fleet`]), shared by all workers;
//! - the event goes to filter state `ace_event` in `stream_complete`, which
//!   Envoy runs before its access loggers: log it with
//!   `%FILTER_STATE(ace_event:PLAIN)%`;
//! - counters are Envoy's, defined with the configuration and counted as
//!   they happen.
//!
//! One thing only this build can do: `"retry_next": true` runs a request
//! whose destination failed again, once, on the next feasible destination,
//! within the same request (Envoy's `recreate_stream`; see
//! `dynamic-module/README.md`). Envoy tears the failed run down inside that
//! call, so the hook makes it with no reference to the stream held.
//!
//! The same library is also the control poller: a bootstrap extension
//! (`envoy.bootstrap.dynamic_modules`) that fetches the control service's
//! snapshot once per interval on Envoy's main thread and publishes it to
//! every fleet ([`poller`], [`published`]).
//!
//! A configuration that does not parse is refused (Envoy rejects it and
//! keeps the last good one) with a log line naming the problem. Nothing
//! here may panic: a panic would unwind into Envoy, which aborts it.
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod fleet;
pub mod poller;
pub mod published;
#[cfg(feature = "test-support")]
pub mod test_support;

use ace_config::{Config, Trusted};
use ace_dynamic_abi::{
    self as abi, Body, ConfigHandle, EnvoyBuffer, EnvoyHeader, Filter, HeaderMap, HeaderPairs,
    LogLevel, ModulePtr,
};
use ace_flow::budget;
use ace_flow::counters::Counter;
use ace_flow::flow::{
    Can, FleetAnswer, FleetOp, FleetUnavailable, Flow, Host, Setup, Verdict, Worker,
};
use ace_flow::headers::Pairs;
use ace_flow::store;
use fleet::Fleet;
use std::cell::RefCell;
use std::ffi::c_char;
use std::sync::Arc;

/// Filter-state key of the request's event.
pub const EVENT_KEY: &str = "ace_event";

pub use ace_flow::flow::RETRY_HEADER;

/// Dynamic metadata (namespace, key) set on a run that ACE replaced by a
/// retry: its access-log line carries no event, and an access-log
/// `metadata_filter` on it drops the line (`envoy/envoy-dynamic.yaml`).
pub const SUPERSEDED: (&str, &str) = ("ace", "superseded");

/// What this build cannot read of `cfg`'s verified attribute sources: the
/// dynamic-module ABI reads a metadata namespace's top-level string keys
/// and not (yet, here) the peer certificate.
fn unreadable_source(cfg: &Config) -> Option<String> {
    let p = cfg.policy.as_ref()?;
    p.attributes.iter().find_map(|a| match a.trusted.as_ref()? {
        Trusted::Metadata { path, .. } if path.len() == 1 => None,
        Trusted::Metadata { .. } => Some(format!(
            "attribute_sources.{}.metadata.path: the dynamic module reads one top-level key of a metadata namespace (a path of one key), such as ext_authz publishes; the Wasm filter reads nested paths (jwt_authn's payload)",
            a.name
        )),
        Trusted::Peer(_) => Some(format!(
            "attribute_sources.{}.peer: the dynamic module does not read the peer certificate; use the Wasm filter, or publish the identity as metadata",
            a.name
        )),
    })
}

/// Everything a request needs, built once per configuration and shared by
/// every worker.
#[derive(Debug)]
struct Shared {
    setup: Setup,
    /// Health and load, shared with every configuration of this fleet.
    fleet: Arc<Fleet>,
    /// Envoy's id per counter ([`Counter::index`] order); `None` if Envoy refused
    /// to define it.
    counters: Vec<Option<usize>>,
}

/// The store every worker and configuration of this Envoy shares
/// ([`ace_flow::store`]): the response cache, prefix locality's table,
/// the budgets' counters. Keys carry a configuration's fingerprint where a
/// value is that configuration's, a budget's name where it outlives a
/// reload.
static STORE: store::Memory = store::Memory::new();

/// What a re-run takes over from the run it replaces, shared by every
/// worker and configuration (Envoy starts the re-run inside the failed
/// run's `recreate_stream`, on the same worker).
static PARKING: ace_flow::rerun::Parking = ace_flow::rerun::Parking::new();

/// Per-worker buffers, reused so that a warm worker allocates little per
/// request.
#[derive(Debug, Default)]
struct Scratch {
    headers: Vec<EnvoyHeader>,
    chunks: Vec<EnvoyBuffer>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static WORKER: RefCell<Worker> = RefCell::new(Worker::default());
}

/// `f` on this worker's scratch buffers (fresh ones if the thread's are
/// gone, in its teardown, or in use, which is never expected).
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    with_local(&SCRATCH, |s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// `f` with this worker's request buffers.
fn with_worker<T>(f: impl FnOnce(&RefCell<Worker>) -> T) -> T {
    with_local(&WORKER, f)
}

/// `f` on thread-local `key`, or on a fresh value when the thread's is
/// gone (its teardown): never a panic.
fn with_local<V: Default + 'static, T>(
    key: &'static std::thread::LocalKey<V>,
    f: impl FnOnce(&V) -> T,
) -> T {
    if key.try_with(|_| ()).is_err() {
        return f(&V::default());
    }
    // Cannot fail: the value was there a moment ago on this thread, and
    // only the thread's end removes it.
    key.with(f)
}

fn now_ms() -> u64 {
    #[cfg(feature = "test-support")]
    if let Some(now) = test_support::clock() {
        return now;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Forwards the `log` records of `ace-filter`'s steps to Envoy's log.
#[derive(Debug)]
struct EnvoyLogger;

impl log::Log for EnvoyLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Error => LogLevel::Error,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Info => LogLevel::Info,
            log::Level::Debug | log::Level::Trace => LogLevel::Debug,
        };
        abi::log(level, &format!("ace: {}", record.args()));
    }

    fn flush(&self) {}
}

static LOGGER: EnvoyLogger = EnvoyLogger;

/// Envoy's first call: the ABI version this module speaks.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
    c"v0.2.0".as_ptr()
}

/// A filter configuration: parse and validate it once. Null refuses it.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    handle: ConfigHandle,
    _name: EnvoyBuffer,
    value: EnvoyBuffer,
) -> ModulePtr {
    // SAFETY: Envoy's buffer, valid during this hook.
    let bytes = unsafe { value.bytes() };
    let config = match Config::parse(bytes) {
        Ok(c) => c,
        Err(e) => {
            log::error!("refusing the configuration: {e}");
            return std::ptr::null();
        }
    };
    if let Some(problem) = unreadable_source(&config) {
        log::error!("refusing the configuration: invalid ACE plugin configuration at {problem}");
        return std::ptr::null();
    }
    let setup = match Setup::new(config) {
        Ok(s) => s,
        Err(e) => {
            log::error!("refusing the configuration: {e}");
            return std::ptr::null();
        }
    };
    setup.announce(true);
    let config = &setup.config;
    // Envoy freezes counter creation after this hook: define them all now.
    let counters = Counter::names(config)
        .iter()
        .map(|name| match handle.define_counter(name) {
            Ok(id) => Some(id),
            Err(code) => {
                log::warn!("cannot define counter {name} (Envoy's code {code})");
                None
            }
        })
        .collect();
    let shared = Shared {
        fleet: Fleet::shared(config, now_ms()),
        counters,
        setup,
    };
    Arc::into_raw(Arc::new(shared)).cast()
}

/// The configuration is gone from Envoy; streams still running keep it.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ModulePtr) {
    if !config.is_null() {
        // SAFETY: made by `Arc::into_raw` in `config_new`, released once.
        drop(unsafe { Arc::from_raw(config.cast::<Shared>()) });
    }
}

/// A new stream.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ModulePtr,
    envoy: Filter,
) -> ModulePtr {
    if config.is_null() {
        return std::ptr::null();
    }
    let shared = {
        // SAFETY: a live `Arc<Shared>` from `config_new` (Envoy destroys a
        // configuration only after its last `filter_new`); cloned, not taken.
        let borrowed =
            unsafe { std::mem::ManuallyDrop::new(Arc::from_raw(config.cast::<Shared>())) };
        Arc::clone(&borrowed)
    };
    Box::into_raw(Box::new(Stream {
        shared,
        envoy,
        flow: Flow::new(),
    }))
    .cast()
}

/// The stream is done; Envoy will not call it again.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(stream: ModulePtr) {
    if !stream.is_null() {
        // SAFETY: made by `Box::into_raw` in `filter_new`, freed once.
        drop(unsafe { Box::from_raw(stream.cast_mut().cast::<Stream>()) });
    }
}

/// The stream behind Envoy's pointer.
fn stream<'a>(s: ModulePtr) -> Option<&'a mut Stream> {
    // SAFETY: a live `Box<Stream>` from `filter_new`; Envoy calls one
    // stream's hooks one at a time, on its worker.
    unsafe { s.cast_mut().cast::<Stream>().as_mut() }
}

/// Envoy's status for a request-path verdict; `held` is the status that
/// holds the request for more body.
fn status(v: Verdict, held: u32, stopped: u32) -> u32 {
    match v {
        Verdict::Continue | Verdict::Rerun => abi::status::CONTINUE,
        Verdict::Hold => held,
        Verdict::Answered => stopped,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, |s| {
        let v = s.run(|flow, setup, worker, host| {
            flow.on_request_headers(setup, worker, host, end_of_stream)
        });
        // Hold the headers until the body is read.
        status(v, abi::status::STOP_ITERATION, abi::status::STOP_ITERATION)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, |s| {
        let v = s.run(|flow, setup, worker, host| {
            flow.on_request_body(setup, worker, host, end_of_stream)
        });
        status(v, abi::status::STOP_AND_BUFFER, abi::status::STOP_NO_BUFFER)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: Filter,
    s: ModulePtr,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, |s| {
        let v = s.run(|flow, setup, worker, host| flow.on_request_trailers(setup, worker, host));
        status(v, abi::status::STOP_ITERATION, abi::status::STOP_ITERATION)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: Filter,
    s: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    let Some(stream_now) = stream(s) else {
        return abi::status::CONTINUE;
    };
    let v = stream_now.run(|flow, setup, _, host| flow.on_response_headers(setup, host));
    if v != Verdict::Rerun {
        return abi::status::CONTINUE;
    }
    // No reference to the stream is held across this call: when Envoy
    // re-runs the request it tears this stream down inside the call (its
    // `stream_complete` and `destroy` hooks run), so the stream must not be
    // touched after a success.
    if envoy.recreate_stream() {
        abi::status::STOP_ITERATION
    } else {
        stream(s).map_or(abi::status::CONTINUE, |s| {
            s.run(|flow, setup, _, host| flow.not_rerun(setup, host));
            abi::status::CONTINUE
        })
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    // Never hold the response: streams must flow.
    if let Some(s) = stream(s) {
        s.run(|flow, setup, _, host| flow.on_response_body(setup, host, end_of_stream));
    }
    abi::status::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: Filter,
    s: ModulePtr,
) {
    if let Some(s) = stream(s) {
        s.run(|flow, setup, worker, host| flow.on_complete(setup, worker, host));
    }
}

/// Per-request state: the flow, and Envoy's handle on the stream.
#[derive(Debug)]
struct Stream {
    shared: Arc<Shared>,
    envoy: Filter,
    flow: Flow,
}

impl Stream {
    /// Run `f` with the flow, the configuration, this worker's buffers and
    /// the host.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Flow, &Setup, &RefCell<Worker>, &mut Dynamic<'_>) -> T,
    ) -> T {
        let mut host = Dynamic {
            shared: &self.shared,
            envoy: self.envoy,
            response: Vec::new(),
            response_read: false,
        };
        with_worker(|w| f(&mut self.flow, &self.shared.setup, w, &mut host))
    }
}

/// The dynamic-module host for one callback of one request.
struct Dynamic<'a> {
    shared: &'a Shared,
    envoy: Filter,
    /// The response headers as Envoy's buffers, read in one call when the
    /// flow first asks for one in this callback (it asks for three or
    /// four; each `get_header` costs Envoy a key copy and a scan), and
    /// read again after the flow changes the map, whose buffers may move.
    /// The list is this worker's scratch, handed back on drop.
    response: Vec<EnvoyHeader>,
    /// Whether `response` holds the map as it is now.
    response_read: bool,
}

impl Drop for Dynamic<'_> {
    fn drop(&mut self) {
        if self.response.capacity() > 0 {
            let mut list = std::mem::take(&mut self.response);
            list.clear();
            with_scratch(|s| {
                if s.headers.capacity() < list.capacity() {
                    s.headers = list;
                }
            });
        }
    }
}

impl Host for Dynamic<'_> {
    fn now_ms(&mut self) -> u64 {
        now_ms()
    }

    fn request_headers(&mut self) -> Pairs {
        let envoy = self.envoy;
        with_scratch(|s| {
            envoy.with_headers(HeaderMap::Request, &mut s.headers, |pairs| {
                Pairs::encode(pairs)
            })
        })
    }

    fn remove_request_header(&mut self, name: &str) -> bool {
        self.envoy.remove_header(HeaderMap::Request, name)
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> bool {
        self.envoy.set_header(HeaderMap::Request, name, value)
    }

    fn add_request_header(&mut self, name: &str, value: &str) -> bool {
        self.envoy.add_header(HeaderMap::Request, name, value)
    }

    fn clear_route_cache(&mut self) {
        self.envoy.clear_route_cache();
    }

    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize {
        let (envoy, mut arrived) = (self.envoy, 0usize);
        let limit = into.len().saturating_add(room);
        with_scratch(|s| {
            envoy.for_each_chunk(Body::ReceivedRequest, &mut s.chunks, |chunk| {
                arrived = arrived.saturating_add(chunk.len());
                let take = limit.saturating_sub(into.len()).min(chunk.len());
                into.extend_from_slice(chunk.get(..take).unwrap_or_default());
            })
        });
        arrived
    }

    fn trusted(&mut self, source: &Trusted) -> Option<Vec<u8>> {
        match source {
            Trusted::Metadata { namespace, path } => {
                let key = path.first()?;
                self.envoy
                    .with_metadata_string(namespace, key, <[u8]>::to_vec)
                    .filter(|v| !v.is_empty())
            }
            // Refused at configuration (see `unreadable_source`).
            Trusted::Peer(_) => None,
        }
    }

    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        if !self.response_read {
            if self.response.capacity() == 0 {
                self.response = with_scratch(|s| std::mem::take(&mut s.headers));
            }
            self.envoy
                .headers_into(HeaderMap::Response, &mut self.response);
            self.response_read = true;
        }
        // SAFETY: read in this callback (a `Dynamic` lives for one), and
        // read again after every change this host makes to the map.
        let mut pairs = unsafe { HeaderPairs::over(&self.response) };
        f(pairs.find(|(k, _)| *k == name.as_bytes()).map(|(_, v)| v))
    }

    fn each_response_header(&mut self, mut f: impl FnMut(&[u8], &[u8])) {
        // The map as read once (`response_header` reads it).
        self.response_header(":status", |_| ());
        // SAFETY: as in `response_header`.
        for (k, v) in unsafe { HeaderPairs::over(&self.response) } {
            f(k, v);
        }
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        self.envoy.set_header(HeaderMap::Response, name, value);
        self.response_read = false;
    }

    fn response_body(&mut self, f: impl FnMut(&[u8])) {
        let envoy = self.envoy;
        with_scratch(|s| envoy.for_each_chunk(Body::ReceivedResponse, &mut s.chunks, f));
    }

    fn send_local(
        &mut self,
        status: u32,
        content_type: &str,
        body: &[u8],
        details: &str,
        headers: &[(&str, &str)],
    ) -> bool {
        self.envoy
            .send_with(status, content_type, body, details, headers);
        true
    }

    fn envoy_response_code(&mut self) -> Option<u32> {
        self.envoy
            .response_code()
            .and_then(|c| u32::try_from(c).ok())
    }

    fn write_event(&mut self, line: &[u8]) -> bool {
        self.envoy.set_filter_state(EVENT_KEY, line)
    }

    fn count(&mut self, counter: Counter, n: u64) {
        if let Some(Some(id)) = self.shared.counters.get(counter.index()) {
            if n > 0 {
                self.envoy.increment_counter(*id, n);
            }
        }
    }

    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable> {
        let cfg = &self.shared.setup.config;
        Ok(self.shared.fleet.run(cfg, now_ms, op))
    }

    fn can(&self) -> Can {
        Can {
            replace_request_body: true,
            replace_response_body: true,
        }
    }

    fn replace_response_chunk(&mut self, bytes: &[u8]) -> bool {
        self.envoy.replace_received_response(bytes)
    }

    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        // Held: the body is in Envoy's buffer and the headers are not
        // yet sent.
        self.envoy.replace_request_body(body)
            && self.envoy.set_header(
                HeaderMap::Request,
                "content-length",
                &body.len().to_string(),
            )
    }

    fn budget_reading(&mut self, b: u16) -> budget::Reading {
        let now = self.now_ms();
        self.shared.fleet.budget(now, b)
    }

    fn shared_get(&mut self, key: &str, into: &mut Vec<u8>) -> Option<store::Version> {
        STORE.get(key, into)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], expect: store::Expect) -> store::Written {
        STORE.set(key, value, expect)
    }

    fn parking(&self) -> Option<&ace_flow::rerun::Parking> {
        Some(&PARKING)
    }

    /// Envoy can run the request again whole when its body is all in
    /// Envoy's buffer (the router buffers the body when the route has a
    /// retry policy; without one the body streamed through and is gone,
    /// and a re-run would wait for it).
    fn replayable(&mut self, bytes: usize) -> bool {
        let (envoy, mut held) = (self.envoy, 0usize);
        with_scratch(|s| {
            envoy.for_each_chunk(Body::BufferedRequest, &mut s.chunks, |c| {
                held = held.saturating_add(c.len())
            })
        });
        held == bytes
    }

    fn mark_superseded(&mut self, superseded: bool) {
        self.envoy
            .set_metadata_bool(SUPERSEDED.0, SUPERSEDED.1, superseded);
    }
}

// The hooks Envoy 1.40 requires of every HTTP filter module, unused here.
ace_dynamic_abi::unused_http_hooks!();
