//! The proxy-wasm adapter: Envoy's Wasm callbacks in, the steps of
//! [`crate::request`] and the core's decision, the routing header out.
//!
//! Request path: bring this worker's mirror of the fleet's shared state
//! (health and in-flight counts that every worker updates) up to date; ask
//! the core for the destination with the lowest effective cost; claim a
//! slot on it with a compare-and-swap; write its Envoy cluster into the
//! destination header, replacing any value a client sent (clients never
//! choose). Envoy re-selects the route because this module speaks ABI
//! 0.2.1 (the proxy-wasm Rust SDK 0.2's), for which Envoy clears the route
//! cache on every request-header mutation; modules speaking a later ABI
//! must call the `clear_route_cache` foreign function themselves (about
//! 2 µs of Envoy CPU). The wasm-host test `filter_speaks_abi_0_2_1` fails
//! if an SDK upgrade changes the ABI.
//!
//! Response path: classify the outcome (5xx and Envoy's local replies for
//! refused connections and timeouts are failures, 429 is throttling, a slow
//! answer past the SLO derates) and fold it into the shared health.
//!
//! The request's event is written once, in `on_log`, which Envoy runs
//! before its access loggers (the real-Envoy event tests hold it to that).
//!
//! Inside Envoy a host call costs far more than the Wasm code around it
//! (`BENCHMARKS.md`), so the per-request path makes as few as it can: no
//! shared-data read when this worker's copy is known to be current, one
//! clock read per phase, each header map read in one call ([`crate::headers`]),
//! one filter-state write, counters handed over on the tick.
//!
//! The filter must never panic (a panic kills the worker's VM): every host
//! call goes through [`host`], whose results carry Envoy's status instead
//! of the SDK wrappers' panics on statuses they do not expect, and a
//! failure is logged and answered.

use crate::config::Config;
use crate::event::{self, Event};
use crate::headers::Pairs;
use crate::request::{self, Counters, EventIds, Lookup, Refused};
use crate::state::{Mirror, Synced};
use crate::usage::UsageScanner;
use crate::{body, host};
use ace_core::dispatch::{self, Decision};
use ace_core::health::Outcome;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType, Status};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

/// Compare-and-swap attempts before giving up on a shared-state update.
const CAS_ATTEMPTS: usize = 32;

/// How often a worker hands its counts to Envoy and, when idle, pays the
/// in-flight releases it owes (ms).
const TICK_MS: u32 = 500;

proxy_wasm::main! {{
    host::init_logging(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(AceRoot { plugin: None })
    });
}}

/// Everything a request needs, built once per configuration.
#[derive(Debug)]
struct Plugin {
    config: Config,
    /// Shared-data key of the fleet state.
    state_key: String,
    /// The compiled policy tables, borrowed zero-copy.
    tables: Option<ace_core::tables::Tables<'static>>,
    /// Per-request buffers for the feasibility lookup.
    lookup: RefCell<Lookup>,
    /// Reused buffers (one VM is single-threaded).
    scratch: RefCell<Scratch>,
    /// The event's JSON line, rewritten in place for every write.
    event_line: RefCell<Vec<u8>>,
    /// The counters, and counts not yet handed to Envoy.
    metrics: Metrics,
    /// Destination names, shared with each request's event.
    names: Vec<Arc<str>>,
    /// This VM's event ids.
    ids: RefCell<EventIds>,
}

/// Proxy-wasm counters ([`Counters`]), shown by Envoy as `wasmcustom.ace.*`
/// (Prometheus output strips the namespace).
///
/// Counts are kept in the VM and handed to Envoy on the worker's tick
/// (every [`TICK_MS`]), not per request: an increment is a host call, and the
/// few a request made were a measurable share of its cost in Envoy
/// (`BENCHMARKS.md`). Envoy's counters therefore lag by at most one tick;
/// what is pending when a configuration is replaced is handed over when
/// its last request ends.
#[derive(Debug, Default)]
struct Metrics {
    /// Envoy's metric id per counter (0 when it could not be defined).
    ids: Vec<u32>,
    /// Counts not yet handed to Envoy, per counter.
    pending: RefCell<Vec<u64>>,
}

impl Metrics {
    fn define(config: &Config) -> Metrics {
        let ids: Vec<u32> = Counters::names(config)
            .iter()
            .map(|name| match host::define_counter(name) {
                Ok(id) => id,
                Err(s) => {
                    log::warn!("cannot define metric {name}: {s:?}");
                    0
                }
            })
            .collect();
        let pending = RefCell::new(vec![0; ids.len()]);
        Metrics { ids, pending }
    }

    /// Count `n` more on counter `c` (handed to Envoy at the next
    /// [`Metrics::flush`]).
    fn add(&self, c: usize, n: u64) {
        if let Some(p) = self.pending.borrow_mut().get_mut(c) {
            *p = p.saturating_add(n);
        }
    }

    /// Hand the pending counts to Envoy (Envoy wants positive deltas).
    fn flush(&self) {
        let mut pending = self.pending.borrow_mut();
        for (&id, p) in self.ids.iter().zip(pending.iter_mut()) {
            if *p > 0 && id != 0 {
                let _ = host::increment_metric(id, (*p).min(i64::MAX as u64) as i64);
            }
            *p = 0;
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.flush();
    }
}

#[derive(Debug)]
struct Scratch {
    mirror: Mirror,
}

/// The plugin (root) context: holds the validated configuration.
#[derive(Debug)]
struct AceRoot {
    plugin: Option<Rc<Plugin>>,
}

impl Context for AceRoot {}

impl RootContext for AceRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match host::buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(b) => b,
            Err(status) => {
                log::error!("cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        match Config::parse(&bytes) {
            Ok(config) => {
                log::info!("{}", config.summary());
                if config.no_policy {
                    log::warn!(
                        "allow_no_policy: routing without policy tables, every destination is feasible for every request (counted in ace.requests_without_policy)"
                    );
                }
                if config.retry_next {
                    log::warn!(
                        "retry_next is ignored: only the dynamic module can run a request again; failures spill from the next request"
                    );
                }
                let n = config.destinations.len();
                let state_key = format!("ace.fleet.{:016x}", config.fingerprint);
                let metrics = Metrics::define(&config);
                self.plugin = Some(Rc::new(Plugin {
                    metrics,
                    names: config.names(),
                    state_key,
                    scratch: RefCell::new(Scratch {
                        mirror: Mirror::new(n),
                    }),
                    event_line: RefCell::new(Vec::with_capacity(1024)),
                    tables: config.tables(),
                    lookup: RefCell::new(Lookup::new(&config)),
                    ids: RefCell::new(EventIds::new(request::random_u64())),
                    config,
                }));
                // Hands counts to Envoy, and pays owed in-flight releases
                // when the worker goes idle.
                if let Err(s) = host::set_tick_period(TICK_MS) {
                    log::warn!("cannot set the tick period: {s:?}");
                }
                true
            }
            Err(e) => {
                // Refuse this configuration; Envoy keeps the last good one.
                log::error!("{e}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(plugin) = &self.plugin else {
            return;
        };
        plugin.metrics.flush();
        // An idle worker pays the in-flight releases it owes.
        if plugin.scratch.borrow().mirror.owes() {
            if let Err(s) = plugin.update(now_ms(), |_| (None, ())) {
                log::warn!("cannot update the shared fleet state: {s:?}");
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AceStream {
            plugin: self.plugin.clone(),
            ..AceStream::default()
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Per-request state.
#[derive(Debug, Default)]
struct AceStream {
    plugin: Option<Rc<Plugin>>,
    /// `content-length`, if sent.
    content_length: Option<usize>,
    /// Holding the request headers until the body has been read.
    waiting_for_body: bool,
    /// The decision and when it was made (ms).
    chosen: Option<(Decision, u64)>,
    /// Whether the outcome was folded into the shared state.
    settled: bool,
    /// The request's event, written to filter state once, in `on_log`.
    event: Option<Event>,
    /// Token usage in the response, when it is being looked for.
    usage: Option<UsageScanner>,
    /// The request's own output budget (`max_tokens`), if its body gave one.
    max_output: Option<u32>,
    /// The whole request (headers, body, trailers) has passed the filter.
    request_done: bool,
}

impl Context for AceStream {}

/// The host's clock in ms since the Unix epoch (0 if it cannot be read).
fn now_ms() -> u64 {
    host::current_time_ns().map_or(0, |ns| ns / 1_000_000)
}

impl Plugin {
    /// Read-modify-write the shared fleet state. `f` sees this worker's
    /// mirror, current at `now`; it returns the one destination it changed
    /// (if any), which is written back with a compare-and-swap.
    ///
    /// The first attempt skips the read when the mirror knows the entry's
    /// CAS value (see [`crate::state`]): the write then succeeds only if the
    /// mirror was current. Otherwise, and after a failed write, it reads,
    /// syncs and runs `f` again on the fresh state. An answer that writes
    /// nothing (a refusal) is never given from an unverified mirror.
    fn update<T>(
        &self,
        now: u64,
        mut f: impl FnMut(&mut Mirror) -> (Option<usize>, T),
    ) -> Result<T, Status> {
        let (models, policy) = (&self.config.models, &self.config.health);
        let mut scratch = self.scratch.borrow_mut();
        let mirror = &mut scratch.mirror;
        for attempt in 0..CAS_ATTEMPTS {
            let trusted = if attempt == 0 {
                mirror.known_cas(now)
            } else {
                None
            };
            let (mut bytes, cas) = match trusted {
                Some(cas) => {
                    mirror.advance(models, policy, now);
                    (mirror.known_entry(), Some(cas))
                }
                None => {
                    let (current, cas) = host::shared_data(&self.state_key)?;
                    let synced = mirror.sync(current.as_deref(), models, policy, now);
                    if synced == Synced::Repaired {
                        log::warn!(
                            "shared fleet state had an unexpected layout; starting those parts fresh"
                        );
                    }
                    mirror.read_with(cas, synced, now);
                    (current.unwrap_or_default(), cas)
                }
            };
            mirror.apply_owed(models, policy, now);
            let (changed, out) = f(mirror);
            if !mirror.has_changes(changed) {
                mirror.recycle(bytes);
                if trusted.is_some() {
                    continue; // verify against a fresh read
                }
                return Ok(out);
            }
            mirror.write_changes(changed, &mut bytes);
            let stored = host::set_shared_data(&self.state_key, &bytes, cas);
            match stored {
                Ok(()) => {
                    mirror.stored_changes(changed, &bytes, models, policy, now);
                    mirror.stored_with(cas, now);
                    mirror.recycle(bytes);
                    return Ok(out);
                }
                Err(e) => {
                    mirror.lost_changes(changed);
                    mirror.forget_cas();
                    mirror.recycle(bytes);
                    if e != Status::CasMismatch {
                        return Err(e);
                    }
                }
            }
        }
        Err(Status::CasMismatch)
    }
}

impl AceStream {
    /// Route on the buffered body: `body_size` bytes are buffered, all of
    /// it if `whole`, else at least that many (a body past the bound, or
    /// one whose trailers came before its end was seen).
    fn route_on_body(&mut self, plugin: &Rc<Plugin>, body_size: usize, whole: bool) -> Action {
        self.waiting_for_body = false;
        let max = plugin.config.max_body_bytes;
        let bytes = match host::buffer(BufferType::HttpRequestBody, 0, body_size.min(max + 1)) {
            Ok(b) => b,
            Err(s) => {
                log::warn!("cannot read the request body: {s:?}");
                Vec::new()
            }
        };
        let total = if whole {
            body_size
        } else if bytes.len() <= max {
            bytes.len()
        } else {
            bytes.len().max(max + 1)
        };
        let bytes = bytes.get(..max.min(bytes.len())).unwrap_or(&[]);
        match body::scan_request(bytes, total) {
            Ok(b) => self.route(plugin, Some(&b), now_ms()),
            Err(e) => {
                if let Some(refused) = request::body_refusal(&plugin.config, &e) {
                    return self.send_refusal(&refused);
                }
                self.content_length = Some(total);
                self.route(plugin, None, now_ms())
            }
        }
    }

    fn reply_json(
        &mut self,
        status: u32,
        kind: &'static str,
        reason: &'static str,
        message: &str,
    ) -> Action {
        self.send_refusal(&Refused {
            status,
            kind,
            reason,
            message: message.to_string(),
        })
    }

    /// Answer the request locally with `refused`'s JSON error.
    fn send_refusal(&mut self, refused: &Refused) -> Action {
        if let Some(e) = self.event.as_mut() {
            e.finish(refused.status, refused.reason);
        }
        if let Err(s) = host::send_local_response(
            refused.status,
            &[("content-type", "application/json")],
            &refused.body(),
        ) {
            log::error!("cannot send local reply: {s:?}");
        }
        Action::Pause
    }

    /// Write the event to filter state (`wasm.ace_event`) for the access log.
    fn write_event(&self) {
        let (Some(e), Some(plugin)) = (&self.event, &self.plugin) else {
            return;
        };
        let mut line = plugin.event_line.borrow_mut();
        e.write_json(&mut line);
        if let Err(s) = host::set_property(event::PROPERTY.as_bytes(), &line) {
            log::warn!("cannot write the request event: {s:?}");
        }
    }

    /// Feasibility, then merit order, then the routing header. Runs from
    /// the headers callback, or from the body callback once the body is read.
    fn route(&mut self, plugin: &Rc<Plugin>, body: Option<&body::RequestBody>, now: u64) -> Action {
        let cfg = &plugin.config;
        let conflict = self
            .event
            .as_ref()
            .and_then(|e| request::model_conflict(e, body));
        if let Some(refused) = conflict {
            return self.send_refusal(&refused);
        }
        self.max_output = body.and_then(|b| b.max_output_tokens);
        let Some(event) = self.event.as_mut() else {
            return self.reply_json(500, "internal", "internal", "request not captured");
        };
        let req = request::plan(cfg, event, body, self.content_length, now);
        // Feasibility first: the compiled Cedar tables, per request.
        let mut lookup = plugin.lookup.borrow_mut();
        let body_model = body.and_then(|b| b.model.as_deref());
        if let Err(refused) = request::feasible(
            cfg,
            plugin.tables.as_ref(),
            event,
            body_model,
            trusted_value,
            &mut lookup,
        ) {
            drop(lookup);
            return self.send_refusal(&refused);
        }
        let warm = cfg.warmth.mask(event.text(&event.model_requested));
        let feasible = &lookup.mask;
        let decided = plugin.update(now, |m| {
            match dispatch::decide(&m.slate, feasible, warm, &req) {
                Ok(d) => {
                    if let Some(f) = m.in_flight.get_mut(d.index) {
                        *f = f.saturating_add(1);
                    }
                    if let Some(h) = m.health.get_mut(d.index) {
                        h.on_dispatch(now);
                    }
                    (Some(d.index), Ok(d))
                }
                Err(r) => (None, Err(r)),
            }
        });
        drop(lookup);
        let decision = match decided {
            Ok(Ok(d)) => d,
            Ok(Err(refusal)) => {
                plugin.metrics.add(Counters::NO_DESTINATION, 1);
                return self.send_refusal(&Refused::no_destination(refusal));
            }
            Err(s) => {
                log::warn!("cannot read the shared fleet state: {s:?}");
                return self.reply_json(503, "internal", "shared_state", "fleet state unavailable");
            }
        };
        self.chosen = Some((decision, now));
        let m = &plugin.metrics;
        for (counter, n) in Counters::decided(&decision) {
            m.add(counter, n);
        }
        if cfg.no_policy {
            m.add(Counters::WITHOUT_POLICY, 1);
        }
        let Some(dest) = cfg.destinations.get(decision.index) else {
            self.settle(None, None);
            return self.reply_json(500, "internal", "internal", "decision index out of range");
        };
        if let Some(e) = self.event.as_mut() {
            request::record(e, cfg, &plugin.names, &decision);
            if self.request_done {
                e.sent_ms = now;
            }
        }
        if let Err(s) = host::replace_header(
            MapType::HttpRequestHeaders,
            &cfg.destination_header,
            &dest.cluster,
        ) {
            log::warn!("cannot set destination header: {s:?}");
            self.settle(None, None);
            return self.reply_json(
                500,
                "internal",
                "internal",
                "cannot set the destination header",
            );
        }
        // No `clear_route_cache` call: for ABI 0.2.1 Envoy clears the route
        // cache on the header change (see the module docs).
        Action::Continue
    }

    /// Fold the request's outcome into the shared state (once). `now` is
    /// the caller's clock reading, if it has one (each read is a host call).
    fn settle(&mut self, outcome: Option<Outcome>, now: Option<u64>) {
        if self.settled {
            return;
        }
        self.settled = true;
        let (Some(plugin), Some((decision, _))) = (self.plugin.as_ref(), self.chosen) else {
            return;
        };
        let now = now.unwrap_or_else(now_ms);
        let policy = plugin.config.health;
        let d = decision.index;
        // A quiet ending on a destination with nothing to recover only
        // releases a slot: owe it to the next write instead of writing now
        // (see `state`).
        if is_quiet(outcome) {
            let mut scratch = plugin.scratch.borrow_mut();
            let calm = scratch
                .mirror
                .health
                .get(d)
                .is_some_and(|h| h.is_pristine(now) && h.consecutive_failures() == 0);
            if calm {
                scratch.mirror.owe_release(d);
                return;
            }
        }
        let result = plugin.update(now, |m| {
            if let Some(f) = m.in_flight.get_mut(d) {
                *f = f.saturating_sub(1);
            }
            let mut change = None;
            if let (Some(h), Some(o)) = (m.health.get_mut(d), outcome) {
                change = Some(h.observe(o, now, &policy));
            }
            (Some(d), change)
        });
        let m = &plugin.metrics;
        if let Some(c) = Counters::destination_outcome(d, outcome) {
            m.add(c, 1);
        }
        match result {
            Ok(Some(change)) => {
                if let Some(c) = Counters::change(change) {
                    m.add(c, 1);
                }
                if change != ace_core::health::Change::None {
                    let name = plugin
                        .config
                        .destinations
                        .get(d)
                        .map_or("?", |x| x.name.as_str());
                    log::info!("destination {name}: {change:?}");
                }
            }
            Ok(None) => {}
            Err(s) => log::warn!("cannot update the shared fleet state: {s:?}"),
        }
    }
}

/// A verified attribute's value, read from Envoy: dynamic metadata (a
/// claim `jwt_authn` verified) or the mTLS peer certificate.
fn trusted_value(source: &crate::config::Trusted) -> Option<Vec<u8>> {
    use crate::config::Trusted;
    let read = match source {
        Trusted::Metadata { namespace, path } => {
            let mut full: Vec<&str> = vec!["metadata", "filter_metadata", namespace];
            full.extend(path.iter().map(String::as_str));
            host::property(&full)
        }
        Trusted::Peer(field) => host::property(&["connection", field.property()]),
    };
    match read {
        Ok(v) => v.filter(|v| !v.is_empty()),
        Err(s) => {
            // Unreadable is missing: the policy then refuses or restricts.
            log::warn!("cannot read a verified attribute source: {s:?}");
            None
        }
    }
}

/// Whether a request ending with `outcome` (`None`: the client went away)
/// changes its destination's health, or only releases its slot.
fn is_quiet(outcome: Option<Outcome>) -> bool {
    match outcome {
        None => true,
        Some(Outcome::Success { latency_ms, slo_ms }) => slo_ms.is_none_or(|s| latency_ms <= s),
        Some(_) => false,
    }
}

impl HttpContext for AceStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, eos: bool) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return self.reply_json(
                503,
                "not_configured",
                "not_configured",
                "the ACE filter has no valid configuration",
            );
        };
        plugin.metrics.add(Counters::REQUESTS, 1);
        // Clients never choose: a destination header they sent is replaced
        // in `route` (a replace drops every earlier value) or, when the
        // request is refused, never reaches an upstream.
        //
        // Capture what later phases need while the headers are readable,
        // all of them in one host call.
        let headers = host::header_pairs(MapType::HttpRequestHeaders).unwrap_or_else(|s| {
            // Every attribute is then unknown: policy fails closed.
            log::warn!("cannot read the request headers: {s:?}");
            Pairs::default()
        });
        // Before anything can pause the request: a client's destination
        // header, and its headers for attributes with verified sources, go.
        for name in request::forbidden_headers(&plugin.config, &headers) {
            if let Err(s) = host::remove_header(MapType::HttpRequestHeaders, name) {
                log::warn!("cannot remove the client's {name}: {s:?}");
                return self.reply_json(
                    500,
                    "internal",
                    "internal",
                    "cannot remove a header the client may not send",
                );
            }
        }
        let now = now_ms();
        let id = plugin.ids.borrow_mut().next_id();
        let head = request::capture(&plugin.config, headers, now, id);
        let wants_body = head.wants_body(&plugin.config, eos);
        self.content_length = head.content_length;
        self.event = Some(head.event);
        self.request_done = eos;
        if wants_body {
            // Hold the headers (StopIteration under
            // allow_on_headers_stop_iteration) until the body is read.
            self.waiting_for_body = true;
            return Action::Pause;
        }
        self.route(&plugin, None, now)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.waiting_for_body {
            if end_of_stream {
                // The upstream now has the whole request: health latency
                // starts here, not at the decision (a slow upload is the
                // client's, not the destination's).
                self.request_done = true;
                if let Some(e) = self.event.as_mut().filter(|_| self.chosen.is_some()) {
                    e.sent_ms = now_ms();
                }
            }
            return Action::Continue;
        }
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let max = plugin.config.max_body_bytes;
        if !end_of_stream && body_size < max {
            return Action::Pause; // buffer more
        }
        self.request_done = end_of_stream;
        self.route_on_body(&plugin, body_size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Trailers end the request. Held for its body, it is routed now on
        // what was buffered: returning Continue here would otherwise
        // release it to Envoy's router undecided.
        self.request_done = true;
        if self.waiting_for_body {
            let Some(plugin) = self.plugin.clone() else {
                return Action::Pause;
            };
            let size = plugin.config.max_body_bytes.saturating_add(1);
            return self.route_on_body(&plugin, size, false);
        }
        if let Some(e) = self.event.as_mut().filter(|_| self.chosen.is_some()) {
            e.sent_ms = now_ms();
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        let (Some(plugin), Some((decision, started))) = (self.plugin.clone(), self.chosen) else {
            return Action::Continue;
        };
        let headers = host::header_pairs(MapType::HttpResponseHeaders).unwrap_or_else(|s| {
            log::warn!("cannot read the response headers: {s:?}");
            Pairs::default()
        });
        let [status, retry_after, content_type, upstream_time] = headers.find([
            ":status",
            "retry-after",
            "content-type",
            request::UPSTREAM_TIME_HEADER,
        ]);
        let status = crate::headers::number::<u32>(status).unwrap_or(0);
        let cfg = &plugin.config;
        let slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
        let now = now_ms();
        let (sent, tenant) = self
            .event
            .as_ref()
            .map_or((0, 1), |e| (e.sent_ms, e.tenant_key));
        // From when the upstream had the whole request; from the decision
        // if it answered before the request ended.
        let latency_ms = now.saturating_sub(if sent > 0 { sent } else { started });
        let outcome = request::outcome(
            status,
            retry_after,
            upstream_time.is_some(),
            tenant,
            latency_ms,
            slo_ms,
        );
        self.settle(Some(outcome), Some(now));
        if let Some(e) = self.event.as_mut() {
            e.latency_ms = latency_ms;
            e.finish(status, decision.reason.as_str());
        }
        if (200..300).contains(&status) {
            let sse = crate::headers::has(content_type, "text/event-stream");
            self.usage = Some(UsageScanner::new(sse));
        }
        if cfg.response_headers {
            let mut cost = event::UsdBuffer::default();
            for (k, v) in request::response_headers(cfg, &decision, &mut cost)
                .into_iter()
                .flatten()
            {
                let _ = host::replace_header(MapType::HttpResponseHeaders, k, v);
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Never pause here: streams must flow. Each call sees the new chunk.
        if let Some(scanner) = self.usage.as_mut() {
            if body_size > 0 {
                if let Ok(chunk) = host::buffer(BufferType::HttpResponseBody, 0, body_size) {
                    scanner.feed(&chunk);
                }
            }
            if end_of_stream {
                let found = scanner.finish();
                self.usage = None;
                if let (Some(u), Some(plugin), Some((decision, _)), Some(e)) = (
                    found,
                    self.plugin.as_ref(),
                    self.chosen,
                    self.event.as_mut(),
                ) {
                    request::book_usage(e, &plugin.config, &decision, u, self.max_output);
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // The client went away before any response: free the slot and
        // blame no one. The event keeps status 0 unless a response was seen.
        self.settle(None, None);
        if let Some(e) = self.event.as_mut().filter(|e| e.status == 0) {
            // Envoy may have answered itself without the filter seeing the
            // answer (a 413 for a body over its buffer limit while the
            // filter held the request): log what the client got.
            let code = host::property(&["response", "code"])
                .ok()
                .flatten()
                .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                .map_or(0, u64::from_le_bytes);
            match u32::try_from(code) {
                Ok(code) if code > 0 => e.finish(code, "envoy_reply"),
                _ => e.finish(0, "client_gone"),
            }
        }
        if let (Some(plugin), Some(e)) = (&self.plugin, &self.event) {
            for (counter, n) in Counters::booked(e) {
                plugin.metrics.add(counter, n);
            }
        }
        // Envoy runs this before its access loggers: the one write of the
        // request's event, with everything the request turned out to be.
        self.write_event();
    }
}
