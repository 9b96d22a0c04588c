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
//! the same steps ([`ace_filter::request`]), the same decision core, the
//! same event line and counters. Only the plumbing differs:
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
//! A configuration that does not parse is refused (Envoy rejects it and
//! keeps the last good one) with a log line naming the problem. Nothing
//! here may panic: a panic would unwind into Envoy, which aborts it.

pub mod fleet;

use ace_core::dispatch::Decision;
use ace_core::health::Outcome;
use ace_core::tables::Tables;
use ace_dynamic_abi::{
    self as abi, Body, ConfigHandle, EnvoyBuffer, EnvoyHeader, Filter, HeaderMap, LogLevel,
    ModulePtr,
};
use ace_filter::body::{self, RequestBody};
use ace_filter::config::Config;
use ace_filter::config::Trusted;
use ace_filter::event::{self, Event};
use ace_filter::headers::{self, Pairs};
use ace_filter::request::{self, Counters, Lookup, Refused};
use ace_filter::usage::UsageScanner;
use fleet::Fleet;
use std::cell::RefCell;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

/// Filter-state key of the request's event.
pub const EVENT_KEY: &str = "ace_event";

/// The request header that marks ACE's own retry (`retry_next`): this
/// process's token and the index of the destination that failed. A value
/// without the token (a client's) is removed and ignored.
pub const RETRY_HEADER: &str = "x-ace-retry";

/// Dynamic metadata (namespace, key) set on a run that ACE replaced by a
/// retry: its access-log line carries no event, and an access-log
/// `metadata_filter` on it drops the line (`envoy/envoy-dynamic.yaml`).
pub const SUPERSEDED: (&str, &str) = ("ace", "superseded");

/// The event's and `x-ace-reason`'s reason for a retried request.
const RETRY_REASON: &str = "retry";

/// A random token for this process, so that clients cannot forge a retry
/// mark (and steer requests away from a destination).
fn retry_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // `RandomState` is seeded from the operating system's randomness.
    *TOKEN.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    })
}

/// This process's next event id (see [`request::EventIds`]): the random
/// token as the prefix, one counter shared by every worker.
fn next_event_id() -> [u8; 32] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    request::event_id(retry_token(), NEXT.fetch_add(1, Ordering::Relaxed))
}

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

/// The failed destination a retry mark names, if the mark is ours.
fn retry_of(value: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(value).ok()?;
    let (token, index) = text.trim().split_once('.')?;
    if u64::from_str_radix(token, 16).ok()? != retry_token() {
        return None;
    }
    index.parse().ok()
}

/// Everything a request needs, built once per configuration and shared by
/// every worker.
#[derive(Debug)]
struct Shared {
    config: Config,
    /// The compiled policy tables, borrowed zero-copy.
    tables: Option<Tables<'static>>,
    /// Destination names, shared with each request's event.
    names: Vec<Arc<str>>,
    /// Health and load, shared with every configuration of this fleet.
    fleet: Arc<Mutex<Fleet>>,
    /// Envoy's id per counter ([`Counters`] order); `None` if Envoy refused
    /// to define it.
    counters: Vec<Option<usize>>,
}

/// Per-worker buffers, reused so that a warm worker allocates little per
/// request.
#[derive(Debug, Default)]
struct Scratch {
    headers: Vec<EnvoyHeader>,
    chunks: Vec<EnvoyBuffer>,
    lookup: Lookup,
    event_line: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> Option<T> {
    SCRATCH
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| f(&mut s)))
        .ok()
        .flatten()
}

fn now_ms() -> u64 {
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
    log::info!("{}", config.summary());
    if config.no_policy {
        log::warn!(
            "allow_no_policy: routing without policy tables, every destination is feasible for every request (counted in ace.requests_without_policy)"
        );
    }
    // Envoy freezes counter creation after this hook: define them all now.
    let counters = Counters::names(&config)
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
        fleet: Fleet::shared(config.fingerprint, &config.models, &config.health, now_ms()),
        tables: config.tables(),
        names: config.names(),
        counters,
        config,
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
    Box::into_raw(Box::new(Stream::new(shared, envoy))).cast()
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, |s| {
        s.on_request_headers(end_of_stream)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, |s| s.on_request_body(end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: Filter,
    s: ModulePtr,
) -> u32 {
    stream(s).map_or(abi::status::CONTINUE, Stream::on_request_trailers)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: Filter,
    s: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    let after = match stream(s) {
        Some(s) => s.on_response_headers(),
        None => return abi::status::CONTINUE,
    };
    match after {
        After::Status(status) => status,
        After::Recreate => {
            // No reference to the stream is held across this call: when
            // Envoy re-runs the request it tears this stream down inside
            // the call (its `stream_complete` and `destroy` hooks run), so
            // the stream must not be touched after a success.
            if envoy.recreate_stream() {
                abi::status::STOP_ITERATION
            } else {
                stream(s).map_or(abi::status::CONTINUE, Stream::not_recreated)
            }
        }
    }
}

/// What the response-headers hook does after the stream has looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Return this status to Envoy.
    Status(u32),
    /// Ask Envoy to run the request again (`retry_next`).
    Recreate,
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: Filter,
    s: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    if let Some(s) = stream(s) {
        s.on_response_body(end_of_stream);
    }
    abi::status::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: Filter,
    s: ModulePtr,
) {
    if let Some(s) = stream(s) {
        s.on_complete();
    }
}

/// Per-request state.
#[derive(Debug)]
struct Stream {
    shared: Arc<Shared>,
    envoy: Filter,
    /// `content-length`, if sent.
    content_length: Option<usize>,
    /// The request body read so far (at most `max_body_bytes`), while the
    /// headers are held for it.
    body: Option<Vec<u8>>,
    /// The decision and when it was made (ms).
    chosen: Option<(Decision, u64)>,
    /// Whether the outcome was folded into the fleet state.
    settled: bool,
    /// The request's event, written to filter state once, at the end.
    event: Option<Event>,
    /// Token usage in the response, when it is being looked for.
    usage: Option<UsageScanner>,
    /// This request is ACE's retry of one whose destination failed: that
    /// destination (index) is not a candidate.
    retry_of: Option<usize>,
    /// The event, set aside while Envoy re-runs the request (see
    /// [`Stream::prepare_retry`]).
    parked: Option<Event>,
    /// The response's status and latency, while a re-run is asked for.
    answered: Option<(u32, u64)>,
    /// Request body bytes seen so far (while the body is read for routing,
    /// and, under `retry_next`, after it).
    request_bytes: usize,
    /// Whether the whole request (headers, body, no trailers) has been
    /// seen: only then can it be run again.
    request_complete: bool,
    /// The request's own output budget (`max_tokens`), if its body gave one.
    max_output: Option<u32>,
}

impl Stream {
    fn new(shared: Arc<Shared>, envoy: Filter) -> Stream {
        Stream {
            shared,
            envoy,
            content_length: None,
            body: None,
            chosen: None,
            settled: false,
            event: None,
            usage: None,
            retry_of: None,
            parked: None,
            answered: None,
            request_bytes: 0,
            request_complete: false,
            max_output: None,
        }
    }

    fn count(&self, counter: usize, n: u64) {
        if let Some(Some(id)) = self.shared.counters.get(counter) {
            if n > 0 {
                self.envoy.increment_counter(*id, n);
            }
        }
    }

    fn on_request_headers(&mut self, end_of_stream: bool) -> u32 {
        self.request_complete = end_of_stream;
        // Clients never choose: a destination header they sent is replaced
        // in `route`, or the request is refused and reaches no upstream.
        let envoy = self.envoy;
        let pairs = with_scratch(|s| {
            envoy.with_headers(HeaderMap::Request, &mut s.headers, |pairs| {
                Pairs::encode(pairs)
            })
        })
        // No scratch (never expected): every attribute is then unknown,
        // and policy fails closed.
        .unwrap_or_default();
        // Before anything can pause the request: a client's destination
        // header, and its headers for attributes with verified sources, go.
        for name in request::forbidden_headers(&self.shared.config, &pairs) {
            envoy.remove_header(HeaderMap::Request, name);
        }
        let now = now_ms();
        let head = request::capture(&self.shared.config, pairs, now, next_event_id());
        if let Some(value) = head.event.headers.get(RETRY_HEADER) {
            // Ours (it carries this process's token) or a client's: either
            // way it goes no further than here.
            self.retry_of = retry_of(value);
            envoy.remove_header(HeaderMap::Request, RETRY_HEADER);
        }
        self.count(
            if self.retry_of.is_some() {
                Counters::RETRIES
            } else {
                Counters::REQUESTS
            },
            1,
        );
        let wants_body = head.wants_body(&self.shared.config, end_of_stream);
        self.content_length = head.content_length;
        self.event = Some(head.event);
        if wants_body {
            // Hold the headers until the body is read.
            self.body = Some(Vec::new());
            return abi::status::STOP_ITERATION;
        }
        self.route(None, now)
    }

    fn on_request_body(&mut self, end_of_stream: bool) -> u32 {
        self.request_complete = end_of_stream;
        if end_of_stream && self.chosen.is_some() {
            // The upstream now has the whole request: health latency starts
            // here (a slow upload is the client's, not the destination's).
            if let Some(e) = self.event.as_mut() {
                e.sent_ms = now_ms();
            }
        }
        let Some(mut buf) = self.body.take() else {
            if self.shared.config.retry_next {
                // A retry must know the body is whole where Envoy keeps it.
                let (envoy, mut n) = (self.envoy, 0usize);
                with_scratch(|s| {
                    envoy.for_each_chunk(Body::ReceivedRequest, &mut s.chunks, |c| {
                        n = n.saturating_add(c.len())
                    })
                });
                self.request_bytes = self.request_bytes.saturating_add(n);
            }
            return abi::status::CONTINUE;
        };
        let max = self.shared.config.max_body_bytes;
        let envoy = self.envoy;
        let mut size = self.request_bytes;
        with_scratch(|s| {
            envoy.for_each_chunk(Body::ReceivedRequest, &mut s.chunks, |chunk| {
                size = size.saturating_add(chunk.len());
                let room = max.saturating_sub(buf.len());
                buf.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
            })
        });
        self.request_bytes = size;
        if !end_of_stream && size < max {
            self.body = Some(buf);
            return abi::status::STOP_AND_BUFFER; // buffer more
        }
        // The whole body, or as much as the bound allows (then the
        // scanner knows it was cut).
        let total = if end_of_stream {
            size
        } else {
            size.max(max + 1)
        };
        match self.route_on_body(&buf, total) {
            abi::status::CONTINUE => abi::status::CONTINUE,
            _ => abi::status::STOP_NO_BUFFER,
        }
    }

    fn on_request_trailers(&mut self) -> u32 {
        // A retry would drop the trailers: none for this request.
        self.request_complete = false;
        // Trailers end the body: route on what was read.
        let Some(buf) = self.body.take() else {
            if let Some(e) = self.event.as_mut().filter(|_| self.chosen.is_some()) {
                e.sent_ms = now_ms();
            }
            return abi::status::CONTINUE;
        };
        let total = self.request_bytes;
        match self.route_on_body(&buf, total) {
            abi::status::CONTINUE => abi::status::CONTINUE,
            _ => abi::status::STOP_ITERATION,
        }
    }

    fn route_on_body(&mut self, buf: &[u8], total: usize) -> u32 {
        let now = now_ms();
        match body::scan_request(buf, total) {
            Ok(b) => self.route(Some(&b), now),
            Err(e) => {
                if let Some(refused) = request::body_refusal(&self.shared.config, &e) {
                    return self.refuse(&refused);
                }
                // The body only refines the estimate: fall back to its size.
                self.content_length = Some(total);
                self.route(None, now)
            }
        }
    }

    /// Answer locally with `refused`'s JSON error.
    fn refuse(&mut self, refused: &Refused) -> u32 {
        if let Some(e) = self.event.as_mut() {
            e.finish(refused.status, refused.reason);
        }
        self.envoy
            .send_json(refused.status, &refused.body(), refused.reason);
        abi::status::STOP_ITERATION
    }

    /// Answer 500: something that should not happen did; it is logged, and
    /// the request reaches no destination.
    fn internal(&mut self, message: &str) -> u32 {
        log::error!("answering 500: {message}");
        self.refuse(&Refused {
            status: 500,
            kind: "internal",
            reason: "internal",
            message: message.to_string(),
        })
    }

    /// Feasibility, then merit order, then the routing header.
    fn route(&mut self, body: Option<&RequestBody>, now: u64) -> u32 {
        let shared = Arc::clone(&self.shared);
        let cfg = &shared.config;
        let conflict = self
            .event
            .as_ref()
            .and_then(|e| request::model_conflict(e, body));
        if let Some(refused) = conflict {
            return self.refuse(&refused);
        }
        self.max_output = body.and_then(|b| b.max_output_tokens);
        let envoy = self.envoy;
        let Some(event) = self.event.as_mut() else {
            return self.internal("request not captured");
        };
        let req = request::plan(cfg, event, body, self.content_length, now);
        let body_model = body.and_then(|b| b.model.as_deref());
        let excluded = self.retry_of;
        let trusted = |source: &Trusted| match source {
            Trusted::Metadata { namespace, path } => {
                let key = path.first()?;
                envoy
                    .with_metadata_string(namespace, key, <[u8]>::to_vec)
                    .filter(|v| !v.is_empty())
            }
            // Refused at configuration (see `unreadable_source`).
            Trusted::Peer(_) => None,
        };
        // Feasibility first (the compiled Cedar tables), then the decision
        // on the shared fleet, with this worker's lookup buffers.
        let decided = with_scratch(|s| {
            request::feasible(
                cfg,
                shared.tables.as_ref(),
                event,
                body_model,
                trusted,
                &mut s.lookup,
            )?;
            if let Some(d) = excluded {
                // The destination that just failed this request.
                if let Some(w) = s.lookup.mask.get_mut(d / 64) {
                    *w &= !(1u64 << (d % 64));
                }
            }
            let warm = cfg.warmth.mask(event.text(&event.model_requested));
            Ok(Fleet::dispatch(
                &shared.fleet,
                &cfg.models,
                &cfg.health,
                now,
                &s.lookup.mask,
                warm,
                &req,
            ))
        });
        let decision = match decided {
            Some(Ok(Ok(d))) => d,
            Some(Ok(Err(refusal))) => {
                self.count(Counters::NO_DESTINATION, 1);
                return self.refuse(&Refused::no_destination(refusal));
            }
            Some(Err(refused)) => return self.refuse(&refused),
            None => return self.internal("no per-worker buffers"),
        };
        self.chosen = Some((decision, now));
        for (counter, n) in Counters::decided(&decision) {
            self.count(counter, n);
        }
        if cfg.no_policy {
            self.count(Counters::WITHOUT_POLICY, 1);
        }
        let Some(dest) = cfg.destinations.get(decision.index) else {
            self.settle(None, now);
            return self.internal("decision index out of range");
        };
        let request_complete = self.request_complete;
        if let Some(e) = self.event.as_mut() {
            request::record(e, cfg, &shared.names, &decision);
            if excluded.is_some() {
                e.reason = RETRY_REASON;
            }
            if request_complete {
                e.sent_ms = now;
            }
        }
        if !self
            .envoy
            .set_header(HeaderMap::Request, &cfg.destination_header, &dest.cluster)
        {
            self.settle(None, now);
            return self.internal("cannot set the destination header");
        }
        self.envoy.clear_route_cache();
        abi::status::CONTINUE
    }

    /// Fold the request's outcome into the fleet state (once).
    fn settle(&mut self, outcome: Option<Outcome>, now: u64) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let Some((decision, _)) = self.chosen else {
            return;
        };
        let d = decision.index;
        let cfg = &self.shared.config;
        let change = Fleet::settle(
            &self.shared.fleet,
            &cfg.models,
            &cfg.health,
            d,
            outcome,
            now,
        );
        if let Some(c) = Counters::destination_outcome(d, outcome) {
            self.count(c, 1);
        }
        if let Some(c) = Counters::change(change) {
            self.count(c, 1);
        }
        if change != ace_core::health::Change::None {
            let name = cfg.destinations.get(d).map_or("?", |x| x.name.as_str());
            log::info!("destination {name}: {change:?}");
        }
    }

    /// The response's headers: what they mean for the destination's
    /// health, then either the rest of the response's handling or, under
    /// `retry_next`, a request to run the request again.
    fn on_response_headers(&mut self) -> After {
        let Some((decision, started)) = self.chosen else {
            return After::Status(abi::status::CONTINUE);
        };
        let envoy = self.envoy;
        let status = envoy.with_header(HeaderMap::Response, ":status", |v| {
            headers::number::<u32>(v).unwrap_or(0)
        });
        let cfg = &self.shared.config;
        let slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
        let now = now_ms();
        let (sent, tenant) = self
            .event
            .as_ref()
            .map_or((0, 1), |e| (e.sent_ms, e.tenant_key));
        // From when the upstream had the whole request; from the decision
        // if it answered before the request ended.
        let latency_ms = now.saturating_sub(if sent > 0 { sent } else { started });
        let upstream = matches!(status, 500..=599)
            && envoy.with_header(HeaderMap::Response, request::UPSTREAM_TIME_HEADER, |v| {
                v.is_some()
            });
        let outcome = if status == 429 {
            envoy.with_header(HeaderMap::Response, "retry-after", |v| {
                request::outcome(status, v, upstream, tenant, latency_ms, slo_ms)
            })
        } else {
            request::outcome(status, None, upstream, tenant, latency_ms, slo_ms)
        };
        // Only when the decision had a runner-up: with none, a re-run could
        // only refuse.
        let retry = matches!(outcome, Outcome::Failure { .. })
            && cfg.retry_next
            && decision.runner_up.is_some();
        self.settle(Some(outcome), now);
        if retry && self.prepare_retry(decision.index) {
            self.answered = Some((status, latency_ms));
            return After::Recreate;
        }
        self.respond(status, latency_ms);
        After::Status(abi::status::CONTINUE)
    }

    /// The rest of a response's handling: the event's status, the usage
    /// scan, the operator headers.
    fn respond(&mut self, status: u32, latency_ms: u64) {
        let Some((decision, _)) = self.chosen else {
            return;
        };
        let reason = if self.retry_of.is_some() {
            RETRY_REASON
        } else {
            decision.reason.as_str()
        };
        if let Some(e) = self.event.as_mut() {
            e.latency_ms = latency_ms;
            e.finish(status, reason);
        }
        let envoy = self.envoy;
        if (200..300).contains(&status) {
            let sse = envoy.with_header(HeaderMap::Response, "content-type", |v| {
                headers::has(v, "text/event-stream")
            });
            self.usage = Some(UsageScanner::new(sse));
        }
        let cfg = &self.shared.config;
        if cfg.response_headers {
            let mut cost = event::UsdBuffer::default();
            for (k, v) in request::response_headers(cfg, &decision, &mut cost)
                .into_iter()
                .flatten()
            {
                let v = if k == request::RESPONSE_REASON_HEADER {
                    reason
                } else {
                    v
                };
                envoy.set_header(HeaderMap::Response, k, v);
            }
        }
    }

    /// Whether Envoy can run this request again whole: it is complete, and
    /// any body it had is all in Envoy's buffer (the router buffers the
    /// body when the route has a retry policy; without one the body
    /// streamed through and is gone, and a re-run would wait for it).
    fn replayable(&self) -> bool {
        if !self.request_complete {
            return false;
        }
        if self.request_bytes == 0 {
            return true;
        }
        let (envoy, mut held) = (self.envoy, 0usize);
        with_scratch(|s| {
            envoy.for_each_chunk(Body::BufferedRequest, &mut s.chunks, |c| {
                held = held.saturating_add(c.len())
            })
        });
        held == self.request_bytes
    }

    /// Get ready to run the request again, once, without destination
    /// `failed`: mark it with this process's retry token and the failed
    /// destination, mark this run superseded (its access-log line can be
    /// filtered out, see [`SUPERSEDED`]) and park its event (the new run
    /// writes the request's one event). False, with nothing changed, when
    /// this was a retry already or Envoy cannot replay the request whole.
    fn prepare_retry(&mut self, failed: usize) -> bool {
        if self.retry_of.is_some() {
            return false;
        }
        if !self.replayable() {
            log::debug!("not retrying: Envoy does not hold the whole request to run it again");
            return false;
        }
        let mark = format!("{:016x}.{failed}", retry_token());
        if !self
            .envoy
            .set_header(HeaderMap::Request, RETRY_HEADER, &mark)
        {
            return false;
        }
        self.envoy
            .set_metadata_bool(SUPERSEDED.0, SUPERSEDED.1, true);
        self.parked = self.event.take();
        true
    }

    /// Envoy refused to run the request again: undo
    /// [`Stream::prepare_retry`] and let this answer through.
    fn not_recreated(&mut self) -> u32 {
        self.envoy.remove_header(HeaderMap::Request, RETRY_HEADER);
        self.envoy
            .set_metadata_bool(SUPERSEDED.0, SUPERSEDED.1, false);
        self.event = self.parked.take();
        if let Some((status, latency_ms)) = self.answered.take() {
            self.respond(status, latency_ms);
        }
        abi::status::CONTINUE
    }

    fn on_response_body(&mut self, end_of_stream: bool) {
        // Never hold the response: streams must flow. Each call sees the
        // new chunk.
        let Some(scanner) = self.usage.as_mut() else {
            return;
        };
        let envoy = self.envoy;
        with_scratch(|s| {
            envoy.for_each_chunk(Body::ReceivedResponse, &mut s.chunks, |c| scanner.feed(c))
        });
        if end_of_stream {
            let found = scanner.finish();
            self.usage = None;
            if let (Some(u), Some((decision, _)), Some(e)) =
                (found, self.chosen, self.event.as_mut())
            {
                request::book_usage(e, &self.shared.config, &decision, u, self.max_output);
            }
        }
    }

    fn on_complete(&mut self) {
        // The client went away before any response: free the slot and
        // blame no one.
        self.settle(None, now_ms());
        let envoy = self.envoy;
        let Some(e) = self.event.as_mut() else {
            return;
        };
        if e.status == 0 {
            // Envoy may have answered itself without the filter seeing the
            // answer (a 413 for a body over its buffer limit while the
            // filter held the request): log what the client got.
            match envoy.response_code().and_then(|c| u32::try_from(c).ok()) {
                Some(code) => e.finish(code, "envoy_reply"),
                None => e.finish(0, "client_gone"),
            }
        }
        let booked = Counters::booked(e);
        for (counter, n) in booked {
            self.count(counter, n);
        }
        let Some(e) = self.event.as_ref() else {
            return;
        };
        // Envoy runs this before its access loggers: the one write of the
        // request's event.
        let envoy = self.envoy;
        with_scratch(|s| {
            e.write_json(&mut s.event_line);
            if !envoy.set_filter_state(EVENT_KEY, &s.event_line) {
                log::warn!("cannot write the request event");
            }
        });
    }
}

// The hooks Envoy 1.40 requires of every HTTP filter module, unused here.
ace_dynamic_abi::unused_http_hooks!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_processs_retry_mark_names_a_destination() {
        let ours = format!("{:016x}.2", retry_token());
        assert_eq!(retry_of(ours.as_bytes()), Some(2));
        assert_eq!(retry_of(format!(" {ours} ").as_bytes()), Some(2));
        let forged = format!("{:016x}.2", retry_token() ^ 1);
        assert_eq!(retry_of(forged.as_bytes()), None);
        for junk in [
            &b""[..],
            b".",
            b"2",
            b"zz.2",
            b"\xff\xfe.1",
            ours.trim_end_matches('2').as_bytes(),
        ] {
            assert_eq!(retry_of(junk), None, "{junk:?}");
        }
    }
}
