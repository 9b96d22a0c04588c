//! The proxy-wasm adapter: Envoy's Wasm callbacks mapped onto the request
//! flow ([`ace_flow::flow`]), which it drives through its [`Host`]
//! implementation. Nothing here decides anything about a request.
//!
//! Routing: the flow writes the chosen cluster into the destination
//! header, replacing any value a client sent (clients never choose).
//! Envoy re-selects the route because this module speaks ABI 0.2.1 (the
//! proxy-wasm Rust SDK 0.2's), for which Envoy clears the route cache on
//! every request-header mutation; modules speaking a later ABI must call
//! the `clear_route_cache` foreign function themselves (about 2 µs of
//! Envoy CPU). The wasm-host test `filter_speaks_abi_0_2_1` fails if an
//! SDK upgrade changes the ABI.
//!
//! The fleet's shared state: each worker VM keeps a mirror of it
//! ([`crate::state`]) and claims and settles with compare-and-swap writes
//! to one Envoy shared-data entry.
//!
//! The request's event is written once, in `on_log`, which Envoy runs
//! before its access loggers (the real-Envoy event tests hold it to that).
//!
//! Inside Envoy a host call costs far more than the Wasm code around it
//! (`BENCHMARKS.md`), so the per-request path makes as few as it can: no
//! shared-data read when this worker's copy is known to be current, one
//! clock read per phase, each header map read in one call ([`ace_flow::headers`]),
//! one filter-state write, counters handed over on the tick.
//!
//! The filter must never panic (a panic kills the worker's VM): every host
//! call goes through [`host`], whose results carry Envoy's status instead
//! of the SDK wrappers' panics on statuses they do not expect, and a
//! failure is logged and answered.

use crate::host;
use crate::state::{Mirror, Synced};
use crate::stop_iteration::{self, Knob, Watch};
use ace_core::health::Change;
use ace_flow::budget;
use ace_flow::config::{Config, Control, Trusted};
use ace_flow::control::{self, Answered, Consumer, Delivery, Heard, Metric, Reply};
use ace_flow::counters::Counter;
use ace_flow::flow::{
    self, Can, FleetAnswer, FleetOp, FleetUnavailable, Flow, Host, Setup, Verdict, Worker,
};
use ace_flow::headers::{Pairs, Span};
use ace_flow::request;
use ace_flow::store::{Expect, Version, Written};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, MapType, Status};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// Compare-and-swap attempts before giving up on a shared-state update.
const CAS_ATTEMPTS: usize = 32;

/// How often a worker hands its counts to Envoy and, when idle, pays the
/// in-flight releases it owes (ms).
const TICK_MS: u32 = 500;

proxy_wasm::main! {{
    host::init_logging(log::LevelFilter::Info);
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> {
        Box::new(AceRoot { plugin: None, id })
    });
}}

/// Everything a request needs, built once per configuration.
#[derive(Debug)]
struct Plugin {
    setup: Setup,
    /// Shared-data key of the fleet state.
    state_key: String,
    /// This worker's copy of the fleet state (one VM is single-threaded).
    mirror: RefCell<Mirror>,
    /// What the control service said, as this VM's consumer took it
    /// ([`ace_flow::control`] has the rules).
    outside: RefCell<Consumer>,
    /// Polling the control service, when configured.
    poller: Option<RefCell<Poller>>,
    /// Reused per-request buffers.
    worker: RefCell<Worker>,
    /// The counters, and counts not yet handed to Envoy.
    metrics: Metrics,
    /// Whether Envoy hands a held request's body to the filter
    /// ([`stop_iteration`]), and the requests watched until it is known.
    watch: RefCell<Watch>,
    /// The watched requests a tick checks, reused.
    due: RefCell<Vec<u32>>,
}

/// Proxy-wasm counters ([`Counter`]), shown by Envoy as `wasmcustom.ace.*`
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
        let ids: Vec<u32> = Counter::names(config)
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

/// The plugin (root) context: holds the validated configuration.
#[derive(Debug)]
struct AceRoot {
    plugin: Option<Rc<Plugin>>,
    /// Its context id.
    id: u32,
}

impl Context for AceRoot {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body_size: usize, _: usize) {
        if let Some(plugin) = &self.plugin {
            plugin.control_answer(token, headers, body_size, now_ms());
        }
    }
}

impl RootContext for AceRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match host::buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(b) => b,
            Err(status) => {
                log::error!("cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        match Setup::parse(&bytes) {
            Ok(setup) => {
                setup.announce(false);
                let config = &setup.config;
                let now = now_ms();
                // Ticks twice per poll interval, so a poll is late by at
                // most half of one.
                let period = config.control.as_ref().map_or(TICK_MS, |c| {
                    let half = u32::try_from(c.interval_ms / 2).unwrap_or(TICK_MS);
                    TICK_MS.min(half).max(50)
                });
                self.plugin = Some(Rc::new(Plugin {
                    metrics: Metrics::define(config),
                    state_key: format!("ace.fleet.{:016x}", config.fingerprint),
                    mirror: RefCell::new(Mirror::new(config.destinations.len())),
                    outside: RefCell::new(Consumer::new(config, now)),
                    poller: config
                        .control
                        .clone()
                        .map(|c| RefCell::new(Poller::new(c, config.fingerprint))),
                    worker: RefCell::new(Worker::default()),
                    watch: RefCell::new(Watch::new()),
                    due: RefCell::new(Vec::new()),
                    setup,
                }));
                // Hands counts to Envoy, pays owed in-flight releases when
                // the worker goes idle, and polls the control service.
                if let Err(s) = host::set_tick_period(period) {
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
        // The SDK's own call, which registers the token for the answer's
        // dispatch (statuses other than the ones Envoy documents for it
        // would panic in the SDK; Envoy gives BadArgument for a missing
        // cluster, which is handled).
        plugin.tick_control(now_ms(), |cluster, headers, timeout| {
            self.dispatch_http_call(cluster, headers, None, vec![], timeout)
        });
        // An idle worker pays the in-flight releases it owes.
        if plugin.mirror.borrow().owes() {
            if let Err(s) = plugin.update(now_ms(), |_| (None, ())) {
                log::warn!("cannot update the shared fleet state: {s:?}");
            }
        }
        // Last: it may make later host calls of this tick act on a stream.
        plugin.check_holds(self.id, now_ms());
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AceStream {
            plugin: self.plugin.clone(),
            flow: Flow::new(),
            body_seen: 0,
            id: context_id,
            held: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The host's clock in ms since the Unix epoch (0 if it cannot be read).
fn now_ms() -> u64 {
    host::current_time_ns().map_or(0, |ns| ns / 1_000_000)
}

/// Envoy's `request.total_size` of the current (or effective) stream: the
/// request headers' bytes and every body byte Envoy received, whether or
/// not it reached the filter. `None` when the host has no such property.
fn total_size() -> Option<u64> {
    let bytes = host::property(&["request", "total_size"]).ok().flatten()?;
    let n = i64::from_le_bytes(<[u8; 8]>::try_from(bytes.as_slice()).ok()?);
    u64::try_from(n).ok()
}

/// Answer the current (or effective) stream 503: Envoy does not hand it
/// its body ([`stop_iteration`]).
fn refuse_unread_body() {
    let body = request::error_body(
        "misconfigured",
        stop_iteration::REASON,
        stop_iteration::MESSAGE,
    );
    let json = [("content-type", "application/json")];
    if let Err(s) = host::send_local_response(503, &json, &body) {
        log::error!("cannot send local reply: {s:?}");
    }
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
        let cfg = &self.setup.config;
        let (models, policy) = (&cfg.models, &cfg.health);
        let mut mirror = self.mirror.borrow_mut();
        let mirror = &mut *mirror;
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

/// Polling the control service from this worker: one poll per interval
/// per Envoy, by whichever worker takes the lease in shared data first;
/// the poller's consumer decides, and only a snapshot it took is stored in
/// shared data for the other workers, which relay it to their own
/// consumer once per version and checksum ([`ace_flow::control`] has the
/// rules and the transport steps; here only the lease and the bytes).
#[derive(Debug)]
struct Poller {
    /// The transport's state (the poll in flight, problems logged once).
    poll: control::Poller,
    /// Shared-data keys: the lease, what was heard, the snapshot's bytes.
    lease_key: String,
    heard_key: String,
    snapshot_key: String,
    /// Until when another worker holds the lease, as last read: no need
    /// to read it again before then.
    lease_until: u64,
    /// When to read the shared record of what was heard next (every half
    /// interval: a new snapshot reaches this worker within one).
    next_read_ms: u64,
    /// The last problem reading shared data, so that it is logged once.
    problem: Option<String>,
    /// Envoy's metric id per [`Metric::ALL`] entry (0: not defined).
    ids: [u32; 5],
}

/// The Wasm side of [`control::Transport`]: the SDK's call, and counters.
struct Calls<'a, F> {
    ids: &'a [u32; 5],
    call: Option<F>,
}

fn metric_id(ids: &[u32; 5], metric: Metric) -> u32 {
    let i = Metric::ALL.iter().position(|m| *m == metric);
    i.and_then(|i| ids.get(i)).copied().unwrap_or(0)
}

impl<F> control::Transport for Calls<'_, F>
where
    F: FnOnce(&str, Vec<(&str, &str)>, Duration) -> Result<u32, Status>,
{
    fn send(
        &mut self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Result<u64, String> {
        let call = self.call.take().ok_or("one call per tick")?;
        match call(cluster, headers.to_vec(), Duration::from_millis(timeout_ms)) {
            Ok(token) => Ok(u64::from(token)),
            Err(s) => Err(format!(
                "{s:?} (is the cluster defined in Envoy's configuration?)"
            )),
        }
    }

    fn count(&mut self, metric: Metric, n: u64) {
        let id = metric_id(self.ids, metric);
        if id != 0 {
            let _ = host::increment_metric(id, n.min(i64::MAX as u64) as i64);
        }
    }
}

/// A transport that sends nothing (for answers): counters only.
type Counts<'a> = Calls<'a, fn(&str, Vec<(&str, &str)>, Duration) -> Result<u32, Status>>;

impl Poller {
    fn new(control: Control, fingerprint: u64) -> Poller {
        let key = |what: &str| format!("ace.control.{fingerprint:016x}.{what}");
        let ids = Metric::ALL.map(|m| {
            let id = if m.is_counter() {
                host::define_counter(m.name())
            } else {
                host::define_gauge(m.name())
            };
            id.unwrap_or_else(|s| {
                log::warn!("cannot define metric {}: {s:?}", m.name());
                0
            })
        });
        Poller {
            lease_key: key("lease"),
            heard_key: key("heard"),
            snapshot_key: key("snapshot"),
            lease_until: 0,
            next_read_ms: 0,
            problem: None,
            ids,
            poll: control::Poller::new(control),
        }
    }

    /// Log a shared-data problem unless it is the one logged last.
    fn trouble(&mut self, problem: String) {
        if self.problem.as_deref() != Some(problem.as_str()) {
            log::warn!("{problem}");
            self.problem = Some(problem);
        }
    }
}

impl Plugin {
    /// On each tick, while Envoy's `allow_on_headers_stop_iteration` is
    /// unknown: ask Envoy, for each request held long enough, whether its
    /// body arrived without reaching the filter; once it did, refuse every
    /// held request ([`stop_iteration`]). Acts on those streams through
    /// the effective context, given back to the root (`root`) after.
    fn check_holds(&self, root: u32, now: u64) {
        let (Ok(mut watch), Ok(mut due)) = (self.watch.try_borrow_mut(), self.due.try_borrow_mut())
        else {
            return;
        };
        if watch.knob() == Knob::Allowed {
            return;
        }
        watch.due(now, &mut due);
        let mut switched = false;
        for &context in due.iter() {
            if host::set_effective_context(context).is_err() {
                watch.ended(context); // gone
                continue;
            }
            switched = true;
            if watch.observed(context, total_size()) {
                break;
            }
        }
        if watch.log_once() {
            log::error!(
                "{}; refusing with 503 every request this worker would hold for its body",
                stop_iteration::MESSAGE
            );
        }
        for context in watch.take_stuck() {
            if host::set_effective_context(context).is_ok() {
                switched = true;
                refuse_unread_body();
            }
        }
        if switched {
            let _ = host::set_effective_context(root);
        }
    }

    /// On each tick: take what another worker stored, age the snapshot,
    /// and poll if this worker wins the lease.
    fn tick_control(
        &self,
        now: u64,
        call: impl FnOnce(&str, Vec<(&str, &str)>, Duration) -> Result<u32, Status>,
    ) {
        let Some(poller) = &self.poller else {
            return;
        };
        let mut p = poller.borrow_mut();
        let mut changed = false;
        if now >= p.next_read_ms {
            p.next_read_ms = now.saturating_add(p.poll.control().interval_ms / 2);
            changed |= self.relay(&mut p, now);
        }
        let mut consumer = self.outside.borrow_mut();
        changed |= consumer.age(now);
        let gauge = |m, v| {
            let id = metric_id(&p.ids, m);
            if id != 0 {
                let _ = host::record_metric(id, v);
            }
        };
        gauge(Metric::AgeMs, consumer.age_ms(now));
        gauge(Metric::Stale, u64::from(consumer.stale()));
        if changed {
            consumer.apply_to(&mut self.mirror.borrow_mut().state, &self.setup.config, now);
        }
        drop(consumer);
        if p.poll.pending().is_none() {
            self.poll(&mut p, now, call);
        }
    }

    /// Relay what the poller stored to this worker's consumer: the stored
    /// snapshot if it is not the one in force, else that the service was
    /// heard (when). Returns whether what is in force changed.
    fn relay(&self, p: &mut Poller, now: u64) -> bool {
        let heard = match host::shared_data(&p.heard_key) {
            Ok((Some(bytes), _)) => Heard::decode(&bytes),
            _ => None,
        };
        let Some(heard) = heard else {
            return false;
        };
        let cfg = &self.setup.config;
        let mut consumer = self.outside.borrow_mut();
        if consumer.holds(heard.version, heard.checksum) {
            let delivery = Delivery::Unchanged {
                etag: &heard.etag,
                at_ms: heard.at_ms,
            };
            return consumer.deliver(cfg, delivery, now).1;
        }
        match host::shared_data(&p.snapshot_key) {
            Ok((Some(bytes), _)) => {
                let delivery = Delivery::Relayed {
                    bytes: &bytes,
                    at_ms: heard.at_ms,
                };
                consumer.deliver(cfg, delivery, now).1
            }
            Ok((None, _)) => false,
            Err(s) => {
                drop(consumer);
                p.trouble(format!("cannot read the control snapshot: {s:?}"));
                false
            }
        }
    }

    /// Poll the control service if the lease is free (one poll per
    /// interval per Envoy, whichever worker ticks first), with the ETag of
    /// the snapshot in force as the poller stored it.
    fn poll(
        &self,
        p: &mut Poller,
        now: u64,
        call: impl FnOnce(&str, Vec<(&str, &str)>, Duration) -> Result<u32, Status>,
    ) {
        if now < p.lease_until {
            return; // held by another worker, as last read
        }
        let Ok((lease, cas)) = host::shared_data(&p.lease_key) else {
            return;
        };
        if !control::lease::is_free(lease.as_deref(), now) {
            p.lease_until = control::lease::until(lease.as_deref()).unwrap_or(0);
            return;
        }
        let taken = control::lease::taken(now, p.poll.control().interval_ms);
        if host::set_shared_data(&p.lease_key, &taken, cas.or(Some(0))).is_err() {
            return; // another worker took it
        }
        // This worker's consumer takes what the last poller stored first,
        // so that the ETag it sends is the one in force, and a 304 for it
        // is heard.
        if self.relay(p, now) {
            let consumer = self.outside.borrow();
            consumer.apply_to(&mut self.mirror.borrow_mut().state, &self.setup.config, now);
        }
        let etag = self.outside.borrow().etag();
        let mut calls = Calls {
            ids: &p.ids,
            call: Some(call),
        };
        p.poll.poll(&mut calls, etag.as_deref(), now);
    }

    /// The answer to this worker's poll `token`.
    fn control_answer(&self, token: u32, headers: usize, body_size: usize, now: u64) {
        let Some(poller) = &self.poller else {
            return;
        };
        let mut p = poller.borrow_mut();
        if p.poll.pending() != Some(u64::from(token)) {
            return;
        }
        let status = (headers > 0)
            .then(|| host::header_pairs(MapType::HttpCallResponseHeaders).ok())
            .flatten()
            .and_then(|h| ace_flow::headers::number::<u32>(h.get(":status")));
        let reply = match status {
            None => Reply::Failed(format!(
                "no answer within {} ms, or no healthy host",
                p.poll.control().timeout_ms
            )),
            Some(200) => Reply::Answer {
                status,
                body: host::buffer(BufferType::HttpCallResponseBody, 0, body_size)
                    .unwrap_or_default(),
            },
            Some(_) => Reply::Answer {
                status,
                body: Vec::new(),
            },
        };
        let ids = p.ids;
        let mut counts: Counts<'_> = Calls {
            ids: &ids,
            call: None,
        };
        let Some(answered) = p.poll.answer(&mut counts, u64::from(token), reply) else {
            return;
        };
        let cfg = &self.setup.config;
        let mut consumer = self.outside.borrow_mut();
        let (verdict, changed) = consumer.deliver(cfg, answered.delivery(now), now);
        use control::{Transport, Verdict};
        let stored = match (&verdict, &answered) {
            (Verdict::Accepted, Answered::Snapshot(bytes)) => {
                counts.count(Metric::Snapshots, 1);
                Some(host::set_shared_data(&p.snapshot_key, bytes, None))
            }
            (Verdict::Heard, _) => Some(Ok(())),
            (Verdict::Refused { first: true, .. }, _) => {
                counts.count(Metric::Errors, 1);
                None
            }
            // A 304 is only ever for the ETag sent, the one in force: it
            // cannot bring a snapshot to store.
            _ => None,
        };
        // What the other workers relay: the snapshot in force and when the
        // service was last heard, only ever a snapshot this consumer took.
        if let Some(stored) = stored {
            let heard = Heard {
                version: consumer.version.unwrap_or_default(),
                checksum: consumer.checksum.unwrap_or_default(),
                at_ms: consumer.heard_ms,
                etag: consumer.etag().unwrap_or_default(),
            };
            let stored =
                stored.and_then(|()| host::set_shared_data(&p.heard_key, &heard.encode(), None));
            if let Err(s) = stored {
                drop(consumer);
                p.trouble(format!("cannot store the control snapshot: {s:?}"));
                return;
            }
        }
        if changed {
            consumer.apply_to(&mut self.mirror.borrow_mut().state, cfg, now);
        }
    }
}

/// Per-request state: the flow, and what the Wasm host needs of it.
#[derive(Debug)]
struct AceStream {
    plugin: Option<Rc<Plugin>>,
    flow: Flow,
    /// Request body bytes already read from Envoy's buffer.
    body_seen: usize,
    /// Its context id.
    id: u32,
    /// Whether its headers were held for its body.
    held: bool,
}

impl Context for AceStream {}

impl Drop for AceStream {
    fn drop(&mut self) {
        if self.held {
            if let Some(mut w) = self
                .plugin
                .as_ref()
                .and_then(|p| p.watch.try_borrow_mut().ok())
            {
                w.ended(self.id);
            }
        }
    }
}

/// The proxy-wasm host for one callback of one request.
struct Wasm<'a> {
    plugin: &'a Plugin,
    /// The body size this callback reported (Envoy's whole buffer while
    /// the request is held; the new chunk otherwise).
    body_size: usize,
    /// Request body bytes already read (see [`AceStream::body_seen`]).
    body_seen: &'a mut usize,
    /// The response headers, read once when first needed, and where the
    /// ones the flow reads ([`flow::RESPONSE_HEADERS`]) are in them.
    response: Option<(Pairs, [Option<Span>; flow::RESPONSE_HEADERS.len()])>,
}

impl Host for Wasm<'_> {
    fn now_ms(&mut self) -> u64 {
        now_ms()
    }

    fn request_headers(&mut self) -> Pairs {
        host::header_pairs(MapType::HttpRequestHeaders).unwrap_or_else(|s| {
            log::warn!("cannot read the request headers: {s:?}");
            Pairs::default()
        })
    }

    fn remove_request_header(&mut self, name: &str) -> bool {
        host::remove_header(MapType::HttpRequestHeaders, name)
            .map_err(|s| log::warn!("cannot remove request header {name}: {s:?}"))
            .is_ok()
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> bool {
        host::replace_header(MapType::HttpRequestHeaders, name, value)
            .map_err(|s| log::warn!("cannot set request header {name}: {s:?}"))
            .is_ok()
    }

    fn clear_route_cache(&mut self) {
        // Nothing to do: for ABI 0.2.1 Envoy clears the route cache on the
        // header change (see the module docs).
    }

    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize {
        // While the request is held, Envoy's buffer holds the whole body so
        // far: read what is new since the last callback.
        let arrived = self.body_size.saturating_sub(*self.body_seen);
        let want = arrived.min(room);
        if want > 0 {
            match host::buffer(BufferType::HttpRequestBody, *self.body_seen, want) {
                Ok(bytes) if into.is_empty() => *into = bytes,
                Ok(bytes) => into.extend_from_slice(&bytes),
                Err(s) => log::warn!("cannot read the request body: {s:?}"),
            }
        }
        *self.body_seen = self.body_size;
        arrived
    }

    fn trusted(&mut self, source: &Trusted) -> Option<Vec<u8>> {
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

    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        // One host call and one pass over the map for every header the
        // flow reads.
        let (pairs, known) = self.response.get_or_insert_with(|| {
            let pairs = host::header_pairs(MapType::HttpResponseHeaders).unwrap_or_else(|s| {
                log::warn!("cannot read the response headers: {s:?}");
                Pairs::default()
            });
            let known = pairs
                .find(flow::RESPONSE_HEADERS)
                .map(|v| v.and_then(|v| pairs.span(v)));
            (pairs, known)
        });
        match flow::RESPONSE_HEADERS.iter().position(|n| *n == name) {
            Some(i) => f(known.get(i).copied().flatten().and_then(|s| pairs.at(s))),
            None => f(pairs.get(name)),
        }
    }

    fn each_response_header(&mut self, mut f: impl FnMut(&[u8], &[u8])) {
        // The map as read once (`response_header` reads it).
        self.response_header(":status", |_| ());
        if let Some((pairs, _)) = &self.response {
            for (k, v) in pairs.iter() {
                f(k, v);
            }
        }
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        if let Err(s) = host::replace_header(MapType::HttpResponseHeaders, name, value) {
            log::warn!("cannot set response header {name}: {s:?}");
        }
    }

    fn response_body(&mut self, mut f: impl FnMut(&[u8])) {
        if self.body_size > 0 {
            match host::buffer(BufferType::HttpResponseBody, 0, self.body_size) {
                Ok(chunk) => f(&chunk),
                Err(s) => log::warn!("cannot read the response body: {s:?}"),
            }
        }
    }

    fn send_local(
        &mut self,
        status: u32,
        content_type: &str,
        body: &[u8],
        _details: &str,
        extra: &[(&str, &str)],
    ) -> bool {
        let mut headers = [("content-type", content_type); 8];
        let mut n = 1;
        for (slot, h) in headers.iter_mut().skip(1).zip(extra) {
            *slot = *h;
            n += 1;
        }
        let headers = headers.get(..n).unwrap_or_default();
        host::send_local_response(status, headers, body)
            .map_err(|s| log::error!("cannot send local reply: {s:?}"))
            .is_ok()
    }

    fn envoy_response_code(&mut self) -> Option<u32> {
        let bytes = host::property(&["response", "code"]).ok().flatten()?;
        let code = u64::from_le_bytes(<[u8; 8]>::try_from(bytes.as_slice()).ok()?);
        u32::try_from(code).ok()
    }

    fn write_event(&mut self, line: &[u8]) -> bool {
        host::set_property(ace_flow::event::PROPERTY.as_bytes(), line)
            .map_err(|s| log::warn!("cannot write the request event: {s:?}"))
            .is_ok()
    }

    fn count(&mut self, counter: Counter, n: u64) {
        self.plugin.metrics.add(counter.index(), n);
    }

    fn fleet(
        &mut self,
        now_ms: u64,
        mut op: FleetOp<'_, '_>,
    ) -> Result<FleetAnswer, FleetUnavailable> {
        // A quiet ending only releases a slot: owe it to the next write
        // instead of writing now (see `state`).
        {
            let mut mirror = self.plugin.mirror.borrow_mut();
            if op.is_noop(&mirror.state, now_ms) {
                return Ok(FleetAnswer::Settled(Change::None));
            }
            // What this worker learned stays in its own copy.
            if op.is_local() {
                let outside = self.plugin.outside.borrow();
                let (changed, answer) = op.apply(&mut mirror.state, &outside.warmth, now_ms);
                if let Some(d) = changed {
                    let cfg = &self.plugin.setup.config;
                    mirror.state.reprice(d, &cfg.models, &cfg.health, now_ms);
                }
                return Ok(answer);
            }
            if let Some(d) = op.quiet_release(&mirror.state, now_ms) {
                mirror.owe_release(d);
                return Ok(FleetAnswer::Settled(Change::None));
            }
        }
        let outside = self.plugin.outside.borrow();
        self.plugin
            .update(now_ms, |m| op.apply(&mut m.state, &outside.warmth, now_ms))
            .map_err(|s| {
                log::warn!("cannot read or write the shared fleet state: {s:?}");
                FleetUnavailable
            })
    }

    fn can(&self) -> Can {
        Can {
            replace_request_body: true,
            replace_response_body: true,
        }
    }

    fn replace_response_chunk(&mut self, bytes: &[u8]) -> bool {
        // Each response body callback sees only its new chunk (the filter
        // never pauses a response): that chunk is what is replaced.
        match host::set_buffer(BufferType::HttpResponseBody, 0, self.body_size, bytes) {
            Ok(()) => true,
            Err(s) => {
                log::warn!("cannot replace a response chunk: {s:?}");
                false
            }
        }
    }

    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        // The request is held with its whole body in Envoy's buffer, and
        // its headers are not yet sent: both can change.
        let replaced = host::set_buffer(BufferType::HttpRequestBody, 0, self.body_size, body)
            .and_then(|()| {
                let len = body.len().to_string();
                host::replace_header(MapType::HttpRequestHeaders, "content-length", &len)
            });
        match replaced {
            Ok(()) => true,
            Err(s) => {
                log::warn!("cannot replace the request body: {s:?}");
                false
            }
        }
    }

    fn budget_reading(&mut self, b: u16) -> budget::Reading {
        self.plugin.outside.borrow().budget(b)
    }

    fn shared_get(&mut self, key: &str, into: &mut Vec<u8>) -> Option<Version> {
        match host::shared_data(key) {
            Ok((Some(bytes), cas)) => {
                if into.is_empty() {
                    *into = bytes;
                } else {
                    into.extend_from_slice(&bytes);
                }
                // Envoy's CAS counts from 1; a value without one is still
                // there, and a write to it replaces it unconditionally.
                Some(cas.unwrap_or(0))
            }
            Ok((None, _)) => None,
            Err(s) => {
                log::warn!("cannot read shared data `{key}`: {s:?}");
                None
            }
        }
    }

    fn shared_set(&mut self, key: &str, value: &[u8], expect: Expect) -> Written {
        // Envoy creates a missing entry whatever the CAS, and refuses to
        // overwrite one whose CAS is not the one given (0: no check). Its
        // CAS counter starts at 1 and never reaches `u32::MAX` in
        // practice, so that value stands for "only if absent".
        let cas = match expect {
            Expect::Any => None,
            Expect::Absent => Some(u32::MAX),
            Expect::Version(v) => Some(v),
        };
        match host::set_shared_data(key, value, cas) {
            Ok(()) => Written::Stored,
            Err(Status::CasMismatch) => Written::Raced,
            Err(s) => {
                log::warn!("cannot write shared data `{key}`: {s:?}");
                Written::Failed
            }
        }
    }
}

impl AceStream {
    /// Run `f` with the flow, this callback's host and the plugin; `None`
    /// when there is no valid configuration.
    fn with<T>(
        &mut self,
        body_size: usize,
        f: impl FnOnce(&mut Flow, &Plugin, &mut Wasm<'_>) -> T,
    ) -> Option<T> {
        let plugin = self.plugin.clone()?;
        let mut host = Wasm {
            plugin: &plugin,
            body_size,
            body_seen: &mut self.body_seen,
            response: None,
        };
        Some(f(&mut self.flow, &plugin, &mut host))
    }
}

impl AceStream {
    /// The headers are held for the body: unless Envoy is known not to
    /// hand the body over (then 503, [`stop_iteration`]), watched until it
    /// is known whether it does.
    fn hold_for_body(&mut self) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Pause;
        };
        let Ok(mut watch) = plugin.watch.try_borrow_mut() else {
            return Action::Pause;
        };
        match watch.knob() {
            Knob::Allowed => {}
            Knob::Missing => refuse_unread_body(),
            Knob::Unknown => {
                let size = if watch.wants_size() {
                    total_size()
                } else {
                    None
                };
                watch.held(self.id, now_ms(), size);
                self.held = true;
            }
        }
        Action::Pause
    }

    /// A body or trailers callback: if the headers were held, Envoy hands
    /// the body over.
    fn body_arrived(&mut self) {
        if std::mem::take(&mut self.held) {
            if let Some(mut w) = self
                .plugin
                .as_ref()
                .and_then(|p| p.watch.try_borrow_mut().ok())
            {
                w.body_arrived();
                w.ended(self.id);
            }
        }
    }
}

/// Envoy's action for a request-path verdict.
fn action(v: Verdict) -> Action {
    match v {
        Verdict::Continue | Verdict::Rerun => Action::Continue,
        // Under allow_on_headers_stop_iteration, a pause from the headers
        // callback holds the headers until the body is read.
        Verdict::Hold | Verdict::Answered => Action::Pause,
    }
}

impl HttpContext for AceStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, eos: bool) -> Action {
        let verdict = self.with(0, |flow, p, host| {
            flow.on_request_headers(&p.setup, &p.worker, host, eos)
        });
        match verdict {
            None => {
                let refused = flow::not_configured();
                let json = [("content-type", "application/json")];
                if let Err(s) = host::send_local_response(refused.status, &json, &refused.body()) {
                    log::error!("cannot send local reply: {s:?}");
                }
                Action::Pause
            }
            Some(Verdict::Hold) => self.hold_for_body(),
            Some(v) => action(v),
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_arrived();
        let v = self.with(body_size, |flow, p, host| {
            flow.on_request_body(&p.setup, &p.worker, host, end_of_stream)
        });
        v.map_or(Action::Continue, action)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.body_arrived();
        let v = self.with(0, |flow, p, host| {
            flow.on_request_trailers(&p.setup, &p.worker, host)
        });
        v.map_or(Action::Pause, action)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        self.with(0, |flow, p, host| flow.on_response_headers(&p.setup, host));
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Never pause here: streams must flow. Each call sees the new chunk.
        self.with(body_size, |flow, p, host| {
            flow.on_response_body(&p.setup, host, end_of_stream)
        });
        Action::Continue
    }

    fn on_log(&mut self) {
        // Envoy runs this before its access loggers: the one write of the
        // request's event, with everything the request turned out to be.
        self.with(0, |flow, p, host| {
            flow.on_complete(&p.setup, &p.worker, host)
        });
    }
}
