//! ace-filter: ACE's proxy-wasm HTTP filter for Envoy.
//!
//! A thin adapter: it turns Envoy callbacks into inputs for `ace-core`, and
//! the core's answer into a routing header. All decisions live in the core;
//! all parsing happens once, in `on_configure`.
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
//! clock read per phase, each header map read in one call ([`headers`]),
//! one filter-state write, counters handed over on the tick.
//!
//! The filter must never panic (a panic kills the worker's VM): every host
//! call goes through [`host`], whose results carry Envoy's status instead
//! of the SDK wrappers' panics on statuses they do not expect, and a
//! failure is logged and answered.

pub mod attributes;
pub mod body;
pub mod config;
pub mod event;
pub mod headers;
pub mod host;
pub mod state;
pub mod usage;

use ace_core::dispatch::{self, Decision, Request};
use ace_core::health::Outcome;
use body::RequestBody;
use config::Config;
use event::{Event, Text};
use headers::Pairs;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType, Status};
use state::{Mirror, Synced};
use std::cell::RefCell;
use std::rc::Rc;
use usage::{Usage, UsageScanner};

/// Response header naming the destination that served the request.
pub const RESPONSE_DESTINATION_HEADER: &str = "x-ace-destination";
/// Response header with the decision's reason code.
pub const RESPONSE_REASON_HEADER: &str = "x-ace-reason";
/// Response header with the destination's tier.
pub const RESPONSE_TIER_HEADER: &str = "x-ace-tier";
/// Response header with the booked (true marginal) cost, USD.
pub const RESPONSE_COST_HEADER: &str = "x-ace-cost-usd";

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
    /// Every destination: the feasible mask when there is no policy.
    all: Vec<u64>,
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
    names: Vec<Rc<str>>,
}

/// Proxy-wasm counters, shown by Envoy as `wasmcustom.ace.*` (Prometheus
/// output strips the namespace). Dollars are counted in nano-USD.
///
/// Counts are kept in the VM and handed to Envoy on the worker's tick
/// (every [`TICK_MS`]), not per request: an increment is a host call, and the
/// few a request made were a measurable share of its cost in Envoy
/// (`BENCHMARKS.md`). Envoy's counters therefore lag by at most one tick;
/// what is pending when a configuration is replaced is handed over when
/// its last request ends.
#[derive(Debug, Default)]
struct Metrics {
    requests: Counter,
    no_destination: Counter,
    trips: Counter,
    cap_cuts: Counter,
    derates: Counter,
    booked_nano_usd: Counter,
    counterfactual_nano_usd: Counter,
    /// Per destination: (requests, failures, throttled).
    per_destination: Vec<(Counter, Counter, Counter)>,
    /// Envoy's metric id per counter (0 when it could not be defined).
    ids: Vec<u32>,
    /// Counts not yet handed to Envoy, per counter.
    pending: RefCell<Vec<u64>>,
}

/// A counter's slot in [`Metrics`].
#[derive(Debug, Clone, Copy, Default)]
struct Counter(usize);

impl Metrics {
    fn define(config: &Config) -> Metrics {
        let mut ids = Vec::new();
        let mut counter = |name: &str| {
            ids.push(match host::define_counter(name) {
                Ok(id) => id,
                Err(s) => {
                    log::warn!("cannot define metric {name}: {s:?}");
                    0
                }
            });
            Counter(ids.len() - 1)
        };
        let requests = counter("ace.requests");
        let no_destination = counter("ace.no_destination");
        let trips = counter("ace.trips");
        let cap_cuts = counter("ace.cap_cuts");
        let derates = counter("ace.derates");
        let booked_nano_usd = counter("ace.booked_nano_usd");
        let counterfactual_nano_usd = counter("ace.counterfactual_nano_usd");
        let per_destination = config
            .destinations
            .iter()
            .zip(&config.models)
            .map(|(d, m)| {
                let base = format!("ace.destination.{}.tier.{}", d.name, m.tier.as_str());
                (
                    counter(&format!("{base}.requests")),
                    counter(&format!("{base}.failures")),
                    counter(&format!("{base}.throttled")),
                )
            })
            .collect();
        let pending = RefCell::new(vec![0; ids.len()]);
        Metrics {
            requests,
            no_destination,
            trips,
            cap_cuts,
            derates,
            booked_nano_usd,
            counterfactual_nano_usd,
            per_destination,
            ids,
            pending,
        }
    }

    /// Count `n` more on `c` (handed to Envoy at the next [`Metrics::flush`]).
    fn add(&self, c: Counter, n: u64) {
        if let Some(p) = self.pending.borrow_mut().get_mut(c.0) {
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

fn nano_usd(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        // Rounds half up (usd > 0); the cast saturates.
        (usd * 1e9 + 0.5) as u64
    } else {
        0
    }
}

#[derive(Debug)]
struct Lookup {
    /// One value index per table attribute.
    values: Vec<u32>,
    /// The feasible-destination bitmask.
    mask: Vec<u64>,
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
                let n = config.destinations.len();
                log::info!(
                    "configured {n} destinations, routing header {}, {}",
                    config.destination_header,
                    match &config.policy {
                        Some(p) =>
                            format!("policy tables reading {} attributes", p.attributes.len()),
                        None => "no policy tables: every destination is feasible".to_string(),
                    }
                );
                let state_key = format!("ace.fleet.{:016x}", config.fingerprint);
                let metrics = Metrics::define(&config);
                self.plugin = Some(Rc::new(Plugin {
                    metrics,
                    names: config
                        .destinations
                        .iter()
                        .map(|d| d.name.as_str().into())
                        .collect(),
                    state_key,
                    scratch: RefCell::new(Scratch {
                        mirror: Mirror::new(n),
                    }),
                    event_line: RefCell::new(Vec::with_capacity(1024)),
                    all: vec![u64::MAX; n.div_ceil(64)],
                    tables: config
                        .policy
                        .as_ref()
                        .and_then(|p| ace_core::tables::Tables::load(p.tables).ok()),
                    lookup: RefCell::new(Lookup {
                        values: vec![0; config.policy.as_ref().map_or(0, |p| p.attributes.len())],
                        mask: vec![0; n.div_ceil(64)],
                    }),
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
    /// CAS value (see [`state`]): the write then succeeds only if the
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
    fn reply_json(
        &mut self,
        status: u32,
        kind: &str,
        reason: &'static str,
        message: &str,
    ) -> Action {
        self.finish_event(status, reason);
        // By hand: `serde_json::json!` cost ~30,000 Wasm instructions here,
        // on the path that refusals (and floods of them) take.
        let mut body = Vec::with_capacity(96 + message.len());
        body.extend_from_slice(b"{\"error\":{\"type\":");
        event::string(&mut body, kind.as_bytes());
        body.extend_from_slice(b",\"reason\":");
        event::string(&mut body, reason.as_bytes());
        body.extend_from_slice(b",\"message\":");
        event::string(&mut body, message.as_bytes());
        body.extend_from_slice(b"}}");
        if let Err(s) =
            host::send_local_response(status, &[("content-type", "application/json")], &body)
        {
            log::error!("cannot send local reply: {s:?}");
        }
        Action::Pause
    }

    /// Record the final status and reason (the event is written in `on_log`).
    fn finish_event(&mut self, status: u32, reason: &'static str) {
        if let Some(e) = self.event.as_mut() {
            e.status = status;
            e.reason = reason;
            if let Some(slo) = e.slo_ms {
                e.slo_met =
                    Some(status != 0 && status < 500 && status != 429 && e.latency_ms <= slo);
            }
        }
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
    fn route(&mut self, plugin: &Rc<Plugin>, body: Option<&RequestBody>, now: u64) -> Action {
        let cfg = &plugin.config;
        let tokens_in = body
            .map(|b| b.tokens_in)
            .unwrap_or_else(|| self.content_length.map_or(1, body::estimate_tokens));
        let tokens_out = body
            .and_then(|b| b.max_output_tokens)
            .unwrap_or(cfg.default_output_tokens);
        if let Some(e) = self.event.as_mut() {
            e.time_ms = now;
            e.tokens_in = tokens_in;
            e.tokens_out = tokens_out;
            if e.model_requested.is_none() {
                e.model_requested = body.and_then(|b| b.model.clone()).map(Text::Owned);
            }
        }
        let event = self.event.as_ref();
        let req = Request {
            tokens_in,
            tokens_out,
            latency_usd_per_s: cfg.latency_value(event.and_then(|e| e.text(&e.latency_class))),
        };
        // Which destinations have the requested model resident.
        let warm = cfg
            .warmth
            .mask(event.and_then(|e| e.text(&e.model_requested)));
        // Feasibility first: the compiled Cedar tables, per request.
        let mut lookup = plugin.lookup.borrow_mut();
        let Lookup { values, mask } = &mut *lookup;
        match (&plugin.tables, &cfg.policy) {
            (Some(tables), Some(policy)) => {
                let body_model = body.and_then(|b| b.model.as_deref());
                // The request's header buffer, kept by its event (a
                // request without one has no headers: every value missing).
                let none = Pairs::default();
                let headers = event.map_or(&none, |e| &e.headers);
                if let Err(a) = attributes::resolve(tables, policy, headers, body_model, values) {
                    let message = format!(
                        "this request needs the `{}` attribute; send it in the `{}` header",
                        a.name, a.header
                    );
                    let reason = attribute_reason(&a.name);
                    drop(lookup);
                    return self.reply_json(400, "missing_attribute", reason, &message);
                }
                if let Err(e) = tables.feasible(values, mask) {
                    // Fail closed: no mask, no destination.
                    log::error!("feasibility lookup failed: {e}");
                    mask.iter_mut().for_each(|w| *w = 0);
                }
            }
            _ => mask.iter_mut().zip(&plugin.all).for_each(|(m, a)| *m = *a),
        }
        let feasible = &*mask;
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
                plugin.metrics.add(plugin.metrics.no_destination, 1);
                return self.reply_json(
                    503,
                    "no_feasible_destination",
                    refusal.as_str(),
                    "no destination that may serve this request is healthy and under its cap",
                );
            }
            Err(s) => {
                log::warn!("cannot read the shared fleet state: {s:?}");
                return self.reply_json(503, "internal", "shared_state", "fleet state unavailable");
            }
        };
        self.chosen = Some((decision, now));
        let m = &plugin.metrics;
        m.add(m.booked_nano_usd, nano_usd(decision.marginal_usd));
        m.add(
            m.counterfactual_nano_usd,
            nano_usd(decision.counterfactual_usd.unwrap_or(0.0)),
        );
        if let Some((requests, _, _)) = m.per_destination.get(decision.index) {
            m.add(*requests, 1);
        }
        let Some(dest) = cfg.destinations.get(decision.index) else {
            self.settle(None, None);
            return self.reply_json(500, "internal", "internal", "decision index out of range");
        };
        if let Some(e) = self.event.as_mut() {
            e.destination = plugin.names.get(decision.index).cloned();
            e.tier = cfg.models.get(decision.index).map(|m| m.tier.as_str());
            e.slo_ms = dest.slo_ms;
            e.marginal_usd = decision.marginal_usd;
            e.counterfactual_usd = decision.counterfactual_usd;
            e.reason = decision.reason.as_str();
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

    /// Once actual usage is known, book the request on it: tokens and both
    /// costs are recomputed from the destination's and the counterfactual's
    /// cost models at list (unloaded) prices.
    fn book_usage(&mut self, usage: Usage) {
        let (Some(plugin), Some((decision, _)), Some(e)) =
            (self.plugin.as_ref(), self.chosen, self.event.as_mut())
        else {
            return;
        };
        e.tokens_in = usage.input;
        e.tokens_out = usage.output;
        e.tokens_estimated = false;
        let price = |i: usize| {
            plugin
                .config
                .models
                .get(i)
                .and_then(|m| m.marginal_usd(usage.input, usage.output, true, 0, None))
        };
        if let Some(c) = price(decision.index) {
            e.marginal_usd = c;
        }
        if let Some(c) = decision.counterfactual_index.and_then(price) {
            e.counterfactual_usd = Some(c);
        }
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
        // A quiet ending (success within the SLO, or the client gone) on a
        // destination with nothing to recover only releases a slot: owe it
        // to the next write instead of writing now (see `state`).
        let quiet = match outcome {
            None => true,
            Some(Outcome::Success { latency_ms, slo_ms }) => slo_ms.is_none_or(|s| latency_ms <= s),
            Some(_) => false,
        };
        if quiet {
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
        if let Some((_, failures, throttled)) = m.per_destination.get(d) {
            match outcome {
                Some(Outcome::Failure) => m.add(*failures, 1),
                Some(Outcome::Throttled { .. }) => m.add(*throttled, 1),
                _ => {}
            }
        }
        match result {
            Ok(Some(change)) if change != ace_core::health::Change::None => {
                use ace_core::health::Change;
                match change {
                    Change::Tripped { .. } => m.add(m.trips, 1),
                    Change::CapCut { .. } => m.add(m.cap_cuts, 1),
                    Change::Derated { .. } => m.add(m.derates, 1),
                    Change::Recovered | Change::None => {}
                }
                let name = plugin
                    .config
                    .destinations
                    .get(d)
                    .map_or("?", |x| x.name.as_str());
                log::info!("destination {name}: {change:?}");
            }
            Ok(_) => {}
            Err(s) => log::warn!("cannot update the shared fleet state: {s:?}"),
        }
    }
}

/// The refusal reason for a missing attribute (a static string per known
/// attribute, so the hot path does not allocate one).
fn attribute_reason(name: &str) -> &'static str {
    match name {
        "tenant" => "tenant",
        "data_class" => "data_class",
        "model" => "model",
        "latency_class" => "latency_class",
        "tp_degree" => "tp_degree",
        _ => "attribute",
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
        let cfg = &plugin.config;
        plugin.metrics.add(plugin.metrics.requests, 1);
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
        let [model, tenant, data_class, latency_class, request_id, length, content_type] = headers
            .find([
                "x-ace-model",
                "x-ace-tenant",
                "x-ace-data-class",
                "x-ace-latency-class",
                "x-request-id",
                "content-length",
                "content-type",
            ]);
        self.content_length = headers::number(length);
        let json = headers::has(content_type, "json");
        // The event points into the header buffer instead of copying.
        let span = |v: Option<&[u8]>| v.and_then(|v| headers.span(v)).map(Text::Header);
        let (model, tenant, data_class, latency_class, request_id) = (
            span(model),
            span(tenant),
            span(data_class),
            span(latency_class),
            span(request_id),
        );
        let now = now_ms();
        self.event = Some(Event {
            schema: event::SCHEMA,
            headers,
            request_id,
            time_ms: now,
            tenant,
            data_class,
            latency_class,
            model_requested: model,
            destination: None,
            tier: None,
            tokens_in: 0,
            tokens_out: 0,
            tokens_estimated: true,
            status: 0,
            latency_ms: 0,
            slo_ms: None,
            slo_met: None,
            marginal_usd: 0.0,
            counterfactual_usd: None,
            reason: "",
        });
        let has_body = !eos && self.content_length != Some(0);
        if cfg.read_body && has_body && json {
            // Hold the headers (StopIteration under
            // allow_on_headers_stop_iteration) until the body is read.
            self.waiting_for_body = true;
            return Action::Pause;
        }
        self.route(&plugin, None, now)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.waiting_for_body {
            return Action::Continue;
        }
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let max = plugin.config.max_body_bytes;
        if !end_of_stream && body_size < max {
            return Action::Pause; // buffer more
        }
        self.waiting_for_body = false;
        let bytes = match host::buffer(BufferType::HttpRequestBody, 0, body_size.min(max)) {
            Ok(b) => b,
            Err(s) => {
                log::warn!("cannot read the request body: {s:?}");
                Vec::new()
            }
        };
        let total = if end_of_stream {
            body_size
        } else {
            body_size.max(max + 1)
        };
        match body::scan_request(&bytes, total) {
            Ok(b) => self.route(&plugin, Some(&b), now_ms()),
            Err(e) => {
                let needs_model = plugin
                    .config
                    .policy
                    .as_ref()
                    .is_some_and(|p| p.attributes.iter().any(|a| a.name == "model"));
                let model_in_header = self
                    .event
                    .as_ref()
                    .is_some_and(|e| e.model_requested.is_some());
                if needs_model && !model_in_header {
                    return self.reply_json(
                        400,
                        "bad_request_body",
                        "bad_request_body",
                        &e.to_string(),
                    );
                }
                // The body only refines the estimate: fall back to its size.
                self.content_length = Some(body_size);
                self.route(&plugin, None, now_ms())
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        let (Some(plugin), Some((decision, started))) = (self.plugin.clone(), self.chosen) else {
            return Action::Continue;
        };
        let headers = host::header_pairs(MapType::HttpResponseHeaders).unwrap_or_else(|s| {
            log::warn!("cannot read the response headers: {s:?}");
            Pairs::default()
        });
        let [status, retry_after, content_type] =
            headers.find([":status", "retry-after", "content-type"]);
        let status = headers::number::<u32>(status).unwrap_or(0);
        let dest = plugin.config.destinations.get(decision.index);
        let now = now_ms();
        let latency_ms = now.saturating_sub(started);
        let outcome = match status {
            429 => Outcome::Throttled {
                retry_after_ms: headers::number::<u64>(retry_after).map(|s| s.saturating_mul(1000)),
            },
            500..=599 | 0 => Outcome::Failure,
            _ => Outcome::Success {
                latency_ms,
                slo_ms: dest.and_then(|d| d.slo_ms),
            },
        };
        self.settle(Some(outcome), Some(now));
        if let Some(e) = self.event.as_mut() {
            e.latency_ms = latency_ms;
        }
        self.finish_event(status, decision.reason.as_str());
        if (200..300).contains(&status) {
            let sse = headers::has(content_type, "text/event-stream");
            self.usage = Some(UsageScanner::new(sse));
        }
        if let Some(dest) = dest.filter(|_| plugin.config.response_headers) {
            let tier = plugin
                .config
                .models
                .get(decision.index)
                .map_or("?", |m| m.tier.as_str());
            let mut cost = event::UsdBuffer::default();
            let cost = cost.format(decision.marginal_usd);
            for (k, v) in [
                (RESPONSE_DESTINATION_HEADER, dest.name.as_str()),
                (RESPONSE_REASON_HEADER, decision.reason.as_str()),
                (RESPONSE_TIER_HEADER, tier),
                (RESPONSE_COST_HEADER, cost),
            ] {
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
                if let Some(u) = found {
                    self.book_usage(u);
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        // The client went away before any response: free the slot and
        // blame no one. The event keeps status 0 unless a response was seen.
        self.settle(None, None);
        if self.event.as_ref().is_some_and(|e| e.status == 0) {
            self.finish_event(0, "client_gone");
        }
        // Envoy runs this before its access loggers: the one write of the
        // request's event, with everything the request turned out to be.
        self.write_event();
    }
}
