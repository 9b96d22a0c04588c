//! ACE, through the very code the filter runs: each request goes through
//! [`ace_flow::flow::Flow`] (capture, the compiled Cedar tables, the
//! merit-order decision on the fleet state, the response's health
//! outcome, usage, the event) over a simulated [`Host`], exactly as the
//! Wasm filter and the dynamic module drive it inside Envoy. There is no
//! second implementation of ACE's choices to drift from the first.
//!
//! The host plays the dynamic module's part (`retry_next`: a failed
//! request is run again, once, without the destination that failed) with
//! one process-wide [`FleetState`], and the control service's: every
//! [`CONTROL_INTERVAL_MS`](crate::engine::CONTROL_INTERVAL_MS) it publishes a snapshot of the simulated fleet
//! (each GPU server's running and waiting requests, spot prices, eviction
//! notices as drains, resident models), which goes through the wire format
//! and the filter's one consumer of control answers
//! ([`ace_flow::control::Consumer`]) into the fleet state, as a poll
//! would. Requests are sent as clients send them: the attribute headers
//! and an OpenAI-style streamed chat body; answers come back as a model
//! server's (status, `text/event-stream`, the first token's event with the
//! headers, a final usage chunk at the end of the stream).

use crate::engine::{Answered, Next, Policy, Route, World, EPOCH_MS};
use crate::metrics::Booking;
use ace_config::{Config, Trusted};
use ace_core::cost::Tier;
use ace_core::fleet::FleetState;
use ace_flow::control::{Consumer, Delivery};
use ace_flow::flow::{
    Can, FleetAnswer, FleetOp, FleetUnavailable, Flow, Host, Setup, Verdict, Worker,
};
use ace_flow::headers::Pairs;
use ace_flow::store;
use ace_snapshot::{Drain, DrainReason, Load, Report, Snapshot};
use std::cell::RefCell;
use std::collections::HashMap;

/// A streamed answer's first event: its first token.
const FIRST_EVENT: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";

/// The simulated Envoy around the flow.
#[derive(Debug)]
struct SimHost {
    now_ms: u64,
    fleet: FleetState,
    /// What the simulated control service said, as the filter's consumer
    /// takes it ([`ace_flow::control`] has the rules).
    outside: Consumer,
    /// The request headers of the callback in progress.
    headers: Vec<(String, String)>,
    /// What a re-run takes over from the run it replaces.
    parking: ace_flow::rerun::Parking,
    /// The request body chunk of the callback in progress.
    chunk: Vec<u8>,
    /// The response headers of the callback in progress.
    response: Vec<(&'static str, String)>,
    /// The response body chunk in progress.
    response_chunk: Vec<u8>,
    /// The last local reply's status.
    reply: Option<u32>,
    /// Event lines written.
    events: Vec<u8>,
    /// Whether events are kept.
    keep_events: bool,
    /// The lines of the request being completed, to price.
    pending: Vec<u8>,
    /// The body the upstream receives when the flow replaced it (model
    /// routing).
    served_body: Option<Vec<u8>>,
    /// The store the flow keeps shared state in (the dynamic module's,
    /// in memory).
    store: ace_flow::store::Memory,
}

impl SimHost {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The host during one callback: its state and the configuration.
#[derive(Debug)]
struct Envoy<'a> {
    h: &'a mut SimHost,
    cfg: &'a Config,
}

impl Host for Envoy<'_> {
    fn now_ms(&mut self) -> u64 {
        self.h.now_ms
    }

    fn request_headers(&mut self) -> Pairs {
        Pairs::encode(
            self.h
                .headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_bytes())),
        )
    }

    fn remove_request_header(&mut self, name: &str) -> bool {
        self.h.headers.retain(|(k, _)| k != name);
        true
    }

    fn set_request_header(&mut self, name: &str, value: &str) -> bool {
        self.remove_request_header(name);
        self.h.headers.push((name.to_string(), value.to_string()));
        true
    }

    fn clear_route_cache(&mut self) {}

    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize {
        let take = room.min(self.h.chunk.len());
        into.extend_from_slice(self.h.chunk.get(..take).unwrap_or_default());
        self.h.chunk.len()
    }

    fn trusted(&mut self, _source: &Trusted) -> Option<Vec<u8>> {
        None
    }

    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R {
        f(self
            .h
            .response
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_bytes()))
    }

    fn set_response_header(&mut self, _name: &str, _value: &str) {}

    fn each_response_header(&mut self, mut f: impl FnMut(&[u8], &[u8])) {
        for (k, v) in &self.h.response {
            f(k.as_bytes(), v.as_bytes());
        }
    }

    fn response_body(&mut self, mut f: impl FnMut(&[u8])) {
        f(&self.h.response_chunk);
    }

    fn send_local(
        &mut self,
        status: u32,
        _content_type: &str,
        _body: &[u8],
        _details: &str,
        _headers: &[(&str, &str)],
    ) -> bool {
        self.h.reply = Some(status);
        true
    }

    fn envoy_response_code(&mut self) -> Option<u32> {
        None
    }

    fn write_event(&mut self, line: &[u8]) -> bool {
        self.h.pending.extend_from_slice(line);
        self.h.pending.push(b'\n');
        if self.h.keep_events {
            self.h.events.extend_from_slice(line);
            self.h.events.push(b'\n');
        }
        true
    }

    fn count(&mut self, _counter: ace_flow::counters::Counter, _n: u64) {}

    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable> {
        let cfg = self.cfg;
        let h = &mut *self.h;
        // The snapshot in force ages between deliveries, as in every host
        // that polls (`ace_flow::control::Consumer`).
        if cfg.control.is_some() && h.outside.age(now_ms) {
            h.outside.apply_to(&mut h.fleet, cfg, now_ms);
        }
        Ok(op.run(
            &mut h.fleet,
            &h.outside.outside().warmth,
            &cfg.models,
            &cfg.health,
            now_ms,
        ))
    }

    fn can(&self) -> Can {
        Can {
            replace_request_body: true,
            replace_response_body: false,
        }
    }

    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        self.h.served_body = Some(body.to_vec());
        self.set_request_header("content-length", &body.len().to_string())
    }

    fn budget_reading(&mut self, b: u16) -> ace_flow::budget::Reading {
        self.h.outside.budget(b)
    }

    fn shared_get(&mut self, key: &str, into: &mut Vec<u8>) -> Option<store::Version> {
        self.h.store.get(key, into)
    }

    fn shared_set(&mut self, key: &str, value: &[u8], expect: store::Expect) -> store::Written {
        self.h.store.set(key, value, expect)
    }

    fn parking(&self) -> Option<&ace_flow::rerun::Parking> {
        self.cfg.retry_next.then_some(&self.h.parking)
    }

    fn replayable(&mut self, _bytes: usize) -> bool {
        true
    }
}

/// One request's flows: the first run and, after a failure, ACE's re-run.
#[derive(Debug, Default)]
struct InFlight {
    flows: Vec<Flow>,
    /// Response headers reached the flow in progress.
    answered: bool,
    /// Input tokens its upstream read from its prompt cache.
    cached: u32,
}

/// ACE over the simulated fleet.
#[derive(Debug)]
pub struct Ace {
    setup: Setup,
    worker: RefCell<Worker>,
    host: Option<SimHost>,
    flows: HashMap<u32, InFlight>,
    /// The model each request in flight is served by, when substituted.
    served: HashMap<u32, String>,
    /// The books of each request completed and not yet asked for.
    booked: HashMap<u32, Booking>,
    /// What pricing remembers of the configuration.
    memo: ace_pricing::Memo,
    /// Destination index of each configured cluster name.
    clusters: HashMap<String, usize>,
    version: u64,
    /// Padding for request bodies (a prompt's bytes).
    pad: String,
    control: bool,
    body: Vec<u8>,
}

/// Bytes per prompt token in a request body (English text runs about 4).
pub const BYTES_PER_TOKEN: usize = 4;

/// The bytes of a message around its content.
const MESSAGE_FRAME: &[u8] = b"{\"role\":\"user\",\"content\":\"\"}";

/// The messages of a prompt of `prompt` tokens in `blocks` (keys), into
/// `out`, comma-separated: one message per block, its content named by
/// the block and padded so that the message is the block's tokens times
/// [`BYTES_PER_TOKEN`] bytes (the filter's estimate, bytes over four, reads
/// [`crate::trace::BLOCK_TOKENS`] tokens a whole block; the last one holds
/// what is left of `prompt`). Two prompts' messages are the same bytes up
/// to where their blocks differ, so the filter's fingerprint chain matches
/// exactly where the trace's prefixes do.
pub fn block_messages(
    out: &mut Vec<u8>,
    blocks: impl Iterator<Item = u64>,
    prompt: u32,
    pad: &str,
) {
    let mut left = prompt;
    for (i, b) in blocks.enumerate() {
        let tokens = left.min(crate::trace::BLOCK_TOKENS);
        left -= tokens;
        if i > 0 {
            out.push(b',');
        }
        let label = format!("block {b:x} ");
        let want = (tokens as usize * BYTES_PER_TOKEN)
            .saturating_sub(MESSAGE_FRAME.len())
            .max(label.len());
        out.extend_from_slice(b"{\"role\":\"user\",\"content\":\"");
        out.extend_from_slice(label.as_bytes());
        let fill = (want - label.len()).min(pad.len());
        out.extend_from_slice(pad.get(..fill).unwrap_or_default().as_bytes());
        out.extend_from_slice(b"\"}");
    }
}

impl Ace {
    /// ACE with the filter configuration built as `setup`; `events`: keep the event
    /// lines; `control`: publish snapshots (off: the fleet state sees only
    /// ACE's own requests, as without a control service).
    pub fn new(setup: Setup, events: bool, control: bool) -> Ace {
        Ace::with_run(setup, events, control, 0)
    }

    /// [`Ace::new`] for run `run` (its event ids start with it).
    pub fn with_run(setup: Setup, events: bool, control: bool, run: u64) -> Ace {
        let cfg = &setup.config;
        let mut fleet = FleetState::new(cfg.destinations.len());
        fleet.reprice_all(&cfg.models, &cfg.health, EPOCH_MS);
        let host = SimHost {
            now_ms: EPOCH_MS,
            fleet,
            outside: Consumer::new(cfg, EPOCH_MS),
            headers: Vec::new(),
            parking: ace_flow::rerun::Parking::new(),
            chunk: Vec::new(),
            response: Vec::new(),
            response_chunk: Vec::new(),
            reply: None,
            events: Vec::new(),
            keep_events: events,
            pending: Vec::new(),
            served_body: None,
            store: store::Memory::deterministic([0x5eed, 0xace]),
        };
        let clusters = cfg
            .destinations
            .iter()
            .enumerate()
            .map(|(i, d)| (d.cluster.clone(), i))
            .collect();
        Ace {
            // This run's ids (policy and seed), so that runs booked into
            // one ledger never share an id.
            worker: RefCell::new(Worker::with_event_ids(run)),
            host: Some(host),
            flows: HashMap::new(),
            served: HashMap::new(),
            booked: HashMap::new(),
            memo: ace_pricing::Memo::default(),
            clusters,
            version: 0,
            pad: "x".repeat(64 * 1024),
            control,
            body: Vec::new(),
            setup,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.setup.config
    }

    /// Run `f` on the host at `now` (ms into the run).
    fn with_host<R>(
        &mut self,
        now: u64,
        f: impl FnOnce(&Setup, &RefCell<Worker>, &mut Envoy<'_>) -> R,
    ) -> Option<R> {
        let h = self.host.as_mut()?;
        h.now_ms = EPOCH_MS + now;
        let mut envoy = Envoy {
            h,
            cfg: &self.setup.config,
        };
        Some(f(&self.setup, &self.worker, &mut envoy))
    }

    /// The request headers and body of request `r`, as a client sends it.
    fn request(&mut self, w: &World<'_>, r: u32) {
        let req = w.req(r);
        let Some(p) = w.profile(r) else { return };
        self.body.clear();
        self.body.extend_from_slice(b"{\"model\":\"");
        self.body.extend_from_slice(p.model.as_bytes());
        if req.blocks.is_empty() {
            let prompt = (req.prompt as usize * BYTES_PER_TOKEN).min(self.pad.len());
            self.body.extend_from_slice(
                b"\",\"stream\":true,\"max_tokens\":1024,\"messages\":[{\"role\":\"user\",\"content\":\"",
            );
            self.body
                .extend_from_slice(self.pad.get(..prompt).unwrap_or_default().as_bytes());
            self.body.extend_from_slice(b"\"}]}");
        } else {
            self.body
                .extend_from_slice(b"\",\"stream\":true,\"max_tokens\":1024,\"messages\":[");
            block_messages(&mut self.body, w.blocks(r), req.prompt, &self.pad);
            self.body.extend_from_slice(b"]}");
        }
        if let Some(h) = self.host.as_mut() {
            h.headers.clear();
            h.headers.extend(p.headers.iter().cloned());
            h.headers
                .push(("content-type".into(), "application/json".into()));
            h.headers
                .push(("content-length".into(), self.body.len().to_string()));
            h.headers
                .push((":path".into(), "/v1/chat/completions".into()));
            h.headers.push((":method".into(), "POST".into()));
        }
    }

    /// Run the request path of a new flow for the current headers and
    /// body: where it goes.
    fn run_request(&mut self, now: u64) -> (Flow, Route) {
        let body = std::mem::take(&mut self.body);
        let out = self.with_host(now, |setup, worker, host| {
            host.h.reply = None;
            let mut flow = Flow::new();
            let mut v = flow.on_request_headers(setup, worker, host, body.is_empty());
            if v == Verdict::Hold {
                host.h.chunk.clear();
                host.h.chunk.extend_from_slice(&body);
                v = flow.on_request_body(setup, worker, host, true);
            }
            let to = match v {
                Verdict::Answered => Err(host.h.reply.unwrap_or(500) as u16),
                _ => Ok(host
                    .h
                    .header(&setup.config.destination_header)
                    .map(str::to_string)),
            };
            (flow, to)
        });
        self.body = body;
        match out {
            Some((flow, Ok(Some(cluster)))) => {
                let route = self
                    .clusters
                    .get(&cluster)
                    .map_or(Route::Refuse(500), |d| Route::To(*d));
                (flow, route)
            }
            Some((flow, Err(status))) => (flow, Route::Refuse(status)),
            Some((flow, Ok(None))) => (flow, Route::Refuse(500)),
            None => (Flow::new(), Route::Refuse(500)),
        }
    }

    /// Finish every flow of request `r` (its event is written).
    fn complete(&mut self, now: u64, r: u32) {
        self.served.remove(&r);
        let Some(f) = self.flows.remove(&r) else {
            return;
        };
        self.with_host(now, |setup, worker, host| {
            for mut flow in f.flows {
                flow.on_complete(setup, worker, host);
            }
        });
        // Priced as the ledger prices the lines the flow just wrote.
        let Some(h) = self.host.as_mut() else { return };
        let mut booking = Booking::default();
        for line in h.pending.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<ace_pricing::Facts>(line) {
                Ok(facts) => booking.add(
                    facts.served(),
                    self.memo.price(&facts, &self.setup, &self.setup.config.id),
                ),
                Err(_) => booking.unpriced += 1,
            }
        }
        h.pending.clear();
        self.booked.entry(r).or_default().merge(booking);
    }

    /// The snapshot the control service would publish now.
    fn snapshot(&mut self, w: &World<'_>) -> Snapshot {
        self.version += 1;
        let cfg = &self.setup.config;
        let reports =
            w.up.iter()
                .zip(&cfg.destinations)
                .map(|(u, d)| Report {
                    name: d.name.clone(),
                    // A committed block is a provider's deployment: no
                    // metrics page for the control service to scrape. Its
                    // use of the commitment reaches ACE only in band, on
                    // its answers (`answered`), as Azure sends it.
                    load: u
                        .p
                        .slots
                        .filter(|_| d.tier != Tier::Reserved)
                        .map(|_| Load {
                            running: u.running,
                            waiting: u.queue.len() as u32,
                            kv_permille: 0,
                            stale: false,
                            scraped_ms: 0,
                        }),
                    // A GPU-hour price feed moves what capacity bought by
                    // the hour costs; owned and reserved capacity's hourly
                    // figure is standing cost, which prices no request.
                    usd_per_hour: (d.usd_per_gpu_hour > 0.0 && !d.tier.is_sunk())
                        .then(|| d.usd_per_gpu_hour * u.price_factor(w.now)),
                    drain: u.notice(w.now).map(|until| Drain {
                        until_ms: EPOCH_MS + until,
                        reason: DrainReason::Eviction,
                    }),
                    warm: u
                        .p
                        .slots
                        .filter(|_| d.tier != Tier::Reserved)
                        .map(|_| u.resident.clone()),
                    ..Report::default()
                })
                .collect();
        Snapshot {
            version: self.version,
            generated_ms: EPOCH_MS + w.now,
            reports,
            budgets: Vec::new(),
        }
    }
}

impl Policy for Ace {
    fn name(&self) -> String {
        "ace".into()
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        self.request(w, r);
        let (flow, route) = self.run_request(w.now);
        self.note_served(r, &route);
        match route {
            Route::To(_) => {
                self.flows.insert(
                    r,
                    InFlight {
                        flows: vec![flow],
                        answered: false,
                        cached: 0,
                    },
                );
            }
            Route::Refuse(_) | Route::Wait(_) => {
                self.flows.insert(
                    r,
                    InFlight {
                        flows: vec![flow],
                        answered: true,
                        cached: 0,
                    },
                );
                self.complete(w.now, r);
            }
        }
        route
    }

    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let (r, d, a) = (at.r, at.dest, at.answer);
        let Some(mut f) = self.flows.remove(&r) else {
            return Next::Deliver;
        };
        let status = a.status;
        let verdict = self.with_host(w.now, |setup, _worker, host| {
            host.h.response.clear();
            host.h.response.push((":status", status.to_string()));
            host.h
                .response
                .push(("content-type", "text/event-stream".into()));
            if status != 503 || a.first_ms > 5 {
                // Answered by the upstream (a refused connection is not).
                host.h
                    .response
                    .push(("x-envoy-upstream-service-time", a.first_ms.to_string()));
            }
            if let Some(s) = a.retry_after_s {
                host.h.response.push(("retry-after", s.to_string()));
            }
            if let Some(u) = w.up.get(d).and_then(|u| utilisation(u, w.now)) {
                host.h
                    .response
                    .push(("azure-openai-deployment-utilization", u));
            }
            f.flows.last_mut().map_or(Verdict::Continue, |flow| {
                let verdict = flow.on_response_headers(setup, host);
                if (200..300).contains(&status) {
                    // The first token's event, with the headers.
                    host.h.response_chunk.clear();
                    host.h.response_chunk.extend_from_slice(FIRST_EVENT);
                    flow.on_response_body(setup, host, false);
                }
                verdict
            })
        });
        f.answered = true;
        f.cached = a.cached;
        if verdict != Some(Verdict::Rerun) {
            self.flows.insert(r, f);
            if !(200..300).contains(&status) {
                // Failed and delivered: the request ends now.
                self.complete(w.now, r);
            }
            return Next::Deliver;
        }
        // ACE runs it again without the destination that failed: the
        // headers now carry its mark, the body is replayed.
        self.request_body_again(w, r);
        let (flow, route) = self.run_request(w.now);
        self.note_served(r, &route);
        f.flows.push(flow);
        f.answered = false;
        self.flows.insert(r, f);
        if let Route::Refuse(_) = route {
            self.complete(w.now, r);
        }
        Next::Retry { after_ms: 0, route }
    }

    fn done(&mut self, w: &World<'_>, r: u32, _d: usize, ok: bool) {
        let req = w.req(r);
        let Some(mut f) = self.flows.remove(&r) else {
            return;
        };
        let answered = f.answered;
        let cached = f.cached;
        self.with_host(w.now, |setup, _worker, host| {
            let Some(flow) = f.flows.last_mut() else { return };
            if !answered {
                // Reset before its headers (an eviction): Envoy answers 503.
                host.h.response.clear();
                host.h.response.push((":status", "503".into()));
                flow.on_response_headers(setup, host);
                return;
            }
            if ok {
                host.h.response_chunk.clear();
                // The prompt cache's reads, as OpenAI and vLLM report them.
                let details = if cached > 0 {
                    format!(",\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}")
                } else {
                    String::new()
                };
                host.h.response_chunk.extend_from_slice(
                    format!(
                        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{}{details}}}}}\n\ndata: [DONE]\n\n",
                        req.prompt, req.output
                    )
                    .as_bytes(),
                );
                flow.on_response_body(setup, host, true);
            }
        });
        self.flows.insert(r, f);
        self.complete(w.now, r);
    }

    fn finished_without_service(&mut self, w: &World<'_>, r: u32) {
        self.complete(w.now, r);
    }

    fn tick(&mut self, w: &World<'_>) {
        if !self.control {
            return;
        }
        // Through the wire format and the one consumer, as a poll would be.
        let snapshot = self.snapshot(w);
        if let Ok(bytes) = ace_snapshot::encode(&snapshot) {
            self.take_snapshot(&bytes, EPOCH_MS + w.now);
        }
    }

    fn writes_events(&self) -> bool {
        true
    }

    fn served_model(&self, r: u32) -> Option<&str> {
        self.served.get(&r).map(String::as_str)
    }

    fn booked(&mut self, r: u32) -> Option<Booking> {
        Some(self.booked.remove(&r).unwrap_or_default())
    }

    fn take_events(&mut self) -> Vec<u8> {
        self.host
            .as_mut()
            .map(|h| std::mem::take(&mut h.events))
            .unwrap_or_default()
    }
}

impl Ace {
    /// Take the control service's snapshot `bytes` at `now_ms` (Unix ms),
    /// as a poll would: decoded against the configuration, then in force
    /// and applied to the fleet; a snapshot the configuration rejects
    /// leaves the last one in force (false).
    fn take_snapshot(&mut self, bytes: &[u8], now_ms: u64) -> bool {
        let cfg = &self.setup.config;
        let Some(h) = self.host.as_mut() else {
            return false;
        };
        let delivery = Delivery::Snapshot {
            bytes,
            at_ms: now_ms,
        };
        let (verdict, changed) = h.outside.deliver(cfg, delivery, now_ms);
        if changed {
            h.outside.apply_to(&mut h.fleet, cfg, now_ms);
        }
        verdict == ace_flow::control::Verdict::Accepted
    }

    /// Take a "not modified" at `now_ms` for the snapshot in force, as a
    /// poll asking with its ETag would get.
    fn take_unchanged(&mut self, now_ms: u64) -> bool {
        let cfg = &self.setup.config;
        let Some(h) = self.host.as_mut() else {
            return false;
        };
        let Some(etag) = h.outside.etag() else {
            return false;
        };
        let delivery = Delivery::Unchanged {
            etag: &etag,
            at_ms: now_ms,
        };
        let (verdict, changed) = h.outside.deliver(cfg, delivery, now_ms);
        if changed {
            h.outside.apply_to(&mut h.fleet, cfg, now_ms);
        }
        verdict == ace_flow::control::Verdict::Heard
    }

    /// The model the flow substituted in the request just routed to
    /// `route` (it rewrote the body to name another model of the class),
    /// by its catalogue id; `None` when the model named is served. The
    /// body names the model as the destination knows it
    /// (`upstream.models`: a vLLM `--served-model-name`, a provider's id),
    /// so the name is read back to the catalogue's, which the Cedar tables
    /// (the violation count) and the simulated upstreams know: a renamed
    /// model is not a substitute. A name that maps back to no model of the
    /// catalogue is kept as sent, and so counts as a violation (fails
    /// closed).
    fn take_substituted(&mut self, route: &Route) -> Option<String> {
        let body = self.host.as_mut()?.served_body.take()?;
        let Route::To(d) = route else {
            return None;
        };
        let sent = model_of(&body)?;
        let dest = self.setup.config.destinations.get(*d)?;
        let known_as_sent = |catalogue: &str| dest.upstream.model_name(catalogue) == sent;
        if model_of(&self.body).is_some_and(|asked| known_as_sent(&asked)) {
            return None;
        }
        let member = self.setup.routing.as_ref().and_then(|r| {
            r.members
                .iter()
                .find(|m| known_as_sent(&m.name))
                .map(|m| m.name.clone())
        });
        Some(member.unwrap_or(sent))
    }

    /// Remember the model request `r` is served by when the flow
    /// substituted one, for the simulated upstream.
    fn note_served(&mut self, r: u32, route: &Route) {
        match self.take_substituted(route) {
            Some(m) => {
                self.served.insert(r, m);
            }
            None => {
                self.served.remove(&r);
            }
        }
    }

    /// Restore request `r`'s body for a re-run (its headers, with ACE's
    /// mark, are still the host's).
    fn request_body_again(&mut self, w: &World<'_>, r: u32) {
        let mark = self
            .host
            .as_ref()
            .and_then(|h| h.header(ace_flow::flow::RETRY_HEADER).map(str::to_string));
        self.request(w, r);
        if let (Some(m), Some(h)) = (mark, self.host.as_mut()) {
            h.headers
                .push((ace_flow::flow::RETRY_HEADER.to_string(), m));
        }
    }
}

/// The simulator's host driven one callback at a time from outside the
/// engine: for the conformance suite (`ace-conformance`), which runs the
/// same cases over every host. Times are Unix ms; requests are held by id
/// until completed, so several may be in flight.
#[derive(Debug)]
pub struct Probe {
    ace: Ace,
    flows: HashMap<u64, Flow>,
    next: u64,
}

/// What a committed block says of its use on every answer, as Azure
/// OpenAI's provisioned deployments do in `azure-openai-deployment-utilization`
/// (`89.3%`, read by `ace_flow::headroom`): the only signal of that use a
/// real proxy gets, since no control service scrapes a provider's
/// deployment. `None` for a destination without a commitment.
fn utilisation(u: &crate::fleet::Upstream, now: u64) -> Option<String> {
    u.p.tpm_cap
        .is_some()
        .then(|| format!("{:.1}%", u.commitment_used(now) * 100.0))
}

/// Where [`Probe::request`] sent a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// To this cluster (the destination header's value).
    Upstream(String),
    /// Answered locally with this status.
    Refused(u32),
}

impl Probe {
    /// The simulator's host for `setup`, keeping its events.
    pub fn new(setup: Setup) -> Probe {
        Probe {
            ace: Ace::new(setup, true, false),
            flows: HashMap::new(),
            next: 0,
        }
    }

    /// Run a request's path at `now_ms` with `headers` and `body` (empty:
    /// none): its id and where it went.
    pub fn request(
        &mut self,
        now_ms: u64,
        headers: &[(String, String)],
        body: &[u8],
    ) -> (u64, Probed) {
        if let Some(h) = self.ace.host.as_mut() {
            h.headers = headers.to_vec();
        }
        self.ace.body = body.to_vec();
        let (flow, route) = self.ace.run_request(now_ms.saturating_sub(EPOCH_MS));
        let reply = self.ace.host.as_ref().and_then(|h| h.reply);
        let probed = match route {
            Route::To(d) => Probed::Upstream(
                self.ace
                    .setup
                    .config
                    .destinations
                    .get(d)
                    .map_or_else(String::new, |x| x.cluster.clone()),
            ),
            Route::Refuse(s) => Probed::Refused(reply.unwrap_or(u32::from(s))),
            Route::Wait(_) => Probed::Refused(reply.unwrap_or(503)),
        };
        self.next += 1;
        self.flows.insert(self.next, flow);
        (self.next, probed)
    }

    /// The upstream answered request `id` at `now_ms`: `status`, `headers`
    /// and the body in `chunks`.
    pub fn respond(
        &mut self,
        id: u64,
        now_ms: u64,
        status: u32,
        headers: &[(&'static str, String)],
        chunks: &[Vec<u8>],
    ) {
        let Some(flow) = self.flows.get_mut(&id) else {
            return;
        };
        self.ace
            .with_host(now_ms.saturating_sub(EPOCH_MS), |setup, _, host| {
                host.h.response.clear();
                host.h.response.push((":status", status.to_string()));
                host.h.response.extend(headers.iter().cloned());
                flow.on_response_headers(setup, host);
                for (i, c) in chunks.iter().enumerate() {
                    host.h.response_chunk.clone_from(c);
                    flow.on_response_body(setup, host, i + 1 == chunks.len());
                }
            });
    }

    /// Request `id` ended at `now_ms`: its event is written.
    pub fn complete(&mut self, id: u64, now_ms: u64) {
        let Some(mut flow) = self.flows.remove(&id) else {
            return;
        };
        self.ace
            .with_host(now_ms.saturating_sub(EPOCH_MS), |setup, worker, host| {
                flow.on_complete(setup, worker, host)
            });
    }

    /// The control service's snapshot `bytes` arrived at `now_ms`, as the
    /// simulator takes one every interval; false if it was rejected.
    pub fn snapshot(&mut self, bytes: &[u8], now_ms: u64) -> bool {
        self.ace.take_snapshot(bytes, now_ms)
    }

    /// The control service answered "not modified" at `now_ms` to a poll
    /// for the snapshot in force; false if that was not hearing it (no
    /// snapshot in force).
    pub fn unchanged(&mut self, now_ms: u64) -> bool {
        self.ace.take_unchanged(now_ms)
    }

    /// The event lines written since the last call.
    pub fn take_events(&mut self) -> Vec<u8> {
        self.ace.take_events()
    }
}

/// One request of a decision log recorded in front of a real Envoy: what
/// the client sent, when ACE decided, and what the upstream answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// When ACE decided, Unix ms (the event's `time_ms`).
    pub time_ms: u64,
    /// The request headers as the client sent them.
    pub headers: Vec<(String, String)>,
    /// The request body.
    pub body: Vec<u8>,
    /// The status the upstream answered (0: refused by ACE, not sent).
    pub status: u16,
    /// Time to response headers, ms (the event's `latency_ms`).
    pub latency_ms: u64,
}

/// The `model` a JSON request body names.
fn model_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("model")?
        .as_str()
        .map(str::to_string)
}

/// What ACE chose for one replayed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// The destination (`None`: refused).
    pub destination: Option<String>,
    /// The model served in place of the one named, when ACE substituted
    /// one (`None`: the model named).
    pub substituted: Option<String>,
}

/// Replay `log` through ACE with configuration `setup`, one request after
/// another, each answered as recorded: what ACE chooses for each. A
/// simulation of ACE is faithful to Envoy's exactly when these equal the
/// recorded choices.
pub fn replay(setup: Setup, log: &[Recorded]) -> Vec<Replayed> {
    let mut ace = Ace::new(setup, false, false);
    log.iter()
        .map(|rec| {
            let now = rec.time_ms.saturating_sub(EPOCH_MS);
            if let Some(h) = ace.host.as_mut() {
                h.headers.clone_from(&rec.headers);
            }
            ace.body.clone_from(&rec.body);
            let (mut flow, route) = ace.run_request(now);
            let substituted = ace.take_substituted(&route);
            let chosen = match route {
                Route::To(d) => ace.setup.config.destinations.get(d).map(|x| x.name.clone()),
                Route::Refuse(_) | Route::Wait(_) => None,
            };
            let status = rec.status;
            ace.with_host(now + rec.latency_ms, |setup, worker, host| {
                if chosen.is_some() {
                    host.h.response.clear();
                    host.h.response.push((":status", status.to_string()));
                    host.h
                        .response
                        .push(("x-envoy-upstream-service-time", rec.latency_ms.to_string()));
                    flow.on_response_headers(setup, host);
                }
                flow.on_complete(setup, worker, host);
            });
            Replayed {
                destination: chosen,
                substituted,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{test_gpu, Upstream};
    use crate::rng::Rng;

    /// The control service scrapes engines, not a provider's deployment:
    /// the simulated snapshot carries load for the owned server and none
    /// for the committed block, whose use reaches the filter on its
    /// answers.
    #[test]
    fn a_committed_block_reports_no_load_and_says_its_use_on_its_answers() {
        let cfg = Config::parse(
            br#"{"destinations":[
              {"name":"owned","cluster":"owned","tier":"inhouse","capacity":8},
              {"name":"ptu","cluster":"ptu","tier":"reserved","capacity":8}],
              "allow_no_policy":true}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let setup = Setup::new(cfg).unwrap_or_else(|e| panic!("{e}"));
        let mut ace = Ace::new(setup, false, true);
        let mut ptu = test_gpu(8);
        ptu.tier = Tier::Reserved;
        ptu.tpm_cap = Some(1000);
        let mut up = vec![
            Upstream::new(test_gpu(8), &mut Rng::new(1), 1),
            Upstream::new(ptu, &mut Rng::new(1), 1),
        ];
        let mut rng = Rng::new(2);
        for u in &mut up {
            assert_eq!(u.admit(0, 800, 93, "m", &mut rng).status, 200);
        }
        let w = World {
            now: 0,
            up: &up,
            reqs: &[],
            profiles: &[],
            block_ids: &[],
        };
        let snap = ace.snapshot(&w);
        let owned = snap.reports.first().and_then(|r| r.load);
        assert_eq!(owned.map(|l| l.running), Some(1));
        let ptu = snap.reports.get(1);
        assert!(ptu.is_some_and(|r| r.load.is_none() && r.warm.is_none()));
        assert_eq!(up.first().and_then(|u| utilisation(u, 0)), None);
        assert_eq!(
            up.get(1).and_then(|u| utilisation(u, 0)).as_deref(),
            Some("89.3%")
        );
    }
}
