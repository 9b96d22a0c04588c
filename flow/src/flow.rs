//! One request's whole flow, written once for every host.
//!
//! ACE runs inside Envoy two ways, as a proxy-wasm filter and as a dynamic
//! module. Both must route, refuse, spill, settle and log a request exactly
//! alike, so the sequence lives here, generic over [`Host`]: the few things
//! only Envoy can do (read and set headers, read the body, answer locally,
//! read the clock, keep the fleet's shared state, count, write the event).
//! An adapter implements [`Host`] and maps Envoy's callbacks onto
//! [`Flow`]'s; it holds no policy of its own. The conformance suite
//! (`conformance/`) runs the same cases over every host, and drives the
//! whole flow step by step through its mock host (`conformance/tests/flow.rs`).
//!
//! The order a request goes through:
//!
//! 1. [`Flow::on_request_headers`]: drop headers a client may not send,
//!    capture the rest, and either hold the request for its body (the
//!    policy or the estimate needs it) or route now;
//! 2. [`Flow::on_request_body`] / [`Flow::on_request_trailers`]: gather the
//!    held body up to its bound, then route on it;
//! 3. routing: feasibility from the compiled tables (fail closed), then the
//!    rungs (`Ask`: the cache, model routing, the merit order), a claimed
//!    slot ([`FleetOp::Claim`] through [`Host::fleet`]), then the
//!    destination header;
//! 4. [`Flow::on_response_headers`]: what the answer means for the
//!    destination's health, the operator headers, and the usage scan. A
//!    failure frees its slot at once ([`FleetOp::Settle`]); under
//!    `retry_next`, on a host that can, it is run again without the
//!    destination that failed ([`Verdict::Rerun`]). A success keeps its
//!    slot ([`FleetOp::Observe`]): a streamed answer's headers come with
//!    its first token, and its sequence holds a place in the server's
//!    batch until the last, so the load the merit order prices counts it
//!    until then;
//! 5. [`Flow::on_response_body`]: token usage, booked at the decision's
//!    prices;
//! 6. [`Flow::on_complete`]: the slot freed, the request's one event and
//!    its dollars.

use crate::body::{self, RequestBody};
use crate::cache::{self, Entry, Pending};
use crate::counters::{Counter, Fleet};
use crate::event::{self, Event, Text};
use crate::headers;
use crate::request::{self, Refused};
use crate::rerun::{self, Carry};
use crate::routing;
use crate::setup::with_worker;
use crate::stage::budget::{self as budget_stage, Hold};
use crate::stage::rungs::{counterfactual, Claimed, Climbed};
use crate::stage::{self, Shape, Stop};
use crate::upstream;
use crate::usage::UsageScanner;
use ace_config::{Api, Config};
use ace_core::dispatch::{Decision, Request};
use ace_core::health::{Change, Outcome};
use std::cell::RefCell;

pub use crate::fleet::{FleetAnswer, FleetOp, FleetUnavailable};
pub use crate::host::{Can, Host, RESPONSE_HEADERS};
pub use crate::rerun::{RETRY_HEADER, RETRY_REASON};
pub use crate::setup::{not_configured, Setup, Worker};
pub use crate::stage::budget::BUDGET_HEADER;

/// What the adapter tells Envoy after a callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the request or response go on.
    Continue,
    /// Hold the request until more of its body has arrived.
    Hold,
    /// The request was answered locally: stop it here.
    Answered,
    /// Ask Envoy to run the request again (a host that keeps a
    /// [`Host::parking`]); if it
    /// will not, call [`Flow::not_rerun`].
    Rerun,
}

/// One request's state, from its headers to its event.
#[derive(Debug, Default)]
pub struct Flow {
    /// `content-length`, if sent.
    content_length: Option<usize>,
    /// The request body read so far (at most `max_body_bytes`), while the
    /// request is held for it.
    body: Option<Vec<u8>>,
    /// Request body bytes seen so far.
    request_bytes: usize,
    /// The whole request (headers, body, trailers) has passed the filter.
    request_done: bool,
    /// The request had trailers (a re-run would drop them).
    trailers: bool,
    /// The decision and when it was made (ms).
    chosen: Option<(Decision, u64)>,
    /// Whether the slot was released (and any outcome folded in).
    settled: bool,
    /// Whether the answer's outcome was folded in at its headers, the slot
    /// held until the request ends.
    observed: bool,
    /// A streamed 2xx from a destination that had the model resident: its
    /// first body byte, the first token, teaches the destination's time to
    /// first token.
    learn_first_byte: bool,
    /// The request's event, written once, at the end.
    event: Option<Event>,
    /// Token usage in the response, when it is being looked for.
    usage: Option<UsageScanner>,
    /// The request's own output budget (`max_tokens`), if its body gave one.
    max_output: Option<u32>,
    /// This run is ACE's re-run of a request: what it took over from the
    /// run it replaces, the destination that failed among it (not a
    /// candidate).
    rerun: Option<Box<Carry>>,
    /// The event, set aside while Envoy runs the request again (boxed: a
    /// rare case should not grow every request's state).
    parked: Option<Box<Event>>,
    /// The response's status and latency, while a re-run is asked for.
    answered: Option<(u32, u64)>,
    /// Model routing's and the cache's business with this request (boxed:
    /// most requests have none).
    extra: Option<Box<Extra>>,
    /// What the tenant's budgets hold of this request.
    budget: Option<Hold>,
}

/// What model routing and the cache hold for one request.
#[derive(Debug, Default)]
struct Extra {
    /// The price factor of the model named on the counterfactual's
    /// destination (model routing).
    counterfactual_scale: Option<f64>,
    /// A miss to store or a hit to check.
    cache: Option<Pending>,
    /// ACE asked the stream for its usage: what to take out of it.
    strip: Option<crate::stream_usage::Strip>,
    /// The body as the client sent it, where ACE rewrote it and may run
    /// the request again (`retry_next`): a re-run starts from it.
    original: Option<Vec<u8>>,
}

/// What a request won besides its decision (the flow's `chosen`): the
/// routing member served (when another than the one named), a routed
/// request's counterfactual, the cache check pending, and the control
/// service's prices on the destination.
struct Won {
    /// The API the client's path asks for.
    api: Option<Api>,
    /// Ask the stream for its usage on the client's behalf.
    ask_usage: bool,
    /// The claim.
    claimed: Claimed,
    /// The cache check or store pending.
    pending: Option<Box<Pending>>,
}

impl Flow {
    /// A new request.
    pub fn new() -> Flow {
        Flow::default()
    }

    /// The cache's business with this request, if any.
    fn pending(&mut self) -> Option<&mut Pending> {
        self.extra.as_deref_mut().and_then(|x| x.cache.as_mut())
    }

    /// The decision, once made.
    pub fn decision(&self) -> Option<&Decision> {
        self.chosen.as_ref().map(|(d, _)| d)
    }

    /// The request headers arrived (`end_of_stream`: with no body).
    pub fn on_request_headers<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        end_of_stream: bool,
    ) -> Verdict {
        let cfg = &setup.config;
        let headers = host.request_headers();
        // Before anything can pause the request: a client's destination
        // header, and its headers for attributes with verified sources, go.
        // (The destination header is set again, by ACE, when it routes.)
        for name in request::forbidden_headers(cfg, &headers) {
            if !host.remove_request_header(name) {
                return self.internal(host, "cannot remove a header the client may not send");
            }
        }
        let now = host.now_ms();
        let id = with_worker(worker, Worker::next_event_id);
        let head = request::capture(cfg, headers, now, id);
        // Only a host that re-runs requests reads re-run marks (a host that
        // cannot never acts on one, so it skips the lookup).
        let mark = host
            .parking()
            .and_then(|_| head.event.headers.get(RETRY_HEADER));
        if let Some(value) = mark {
            // Ours (it carries this process's token) or a client's: either
            // way it goes no further than here.
            let key = rerun::key(value);
            host.remove_request_header(RETRY_HEADER);
            if let Some(key) = key {
                self.rerun = host.parking().and_then(|p| p.take(key));
                if self.rerun.is_none() {
                    return self.internal(host, "a re-run whose request was not kept");
                }
            }
        }
        host.count(
            if self.rerun.is_some() {
                Fleet::Retries
            } else {
                Fleet::Requests
            }
            .into(),
            1,
        );
        let wants_body = head.wants_body(cfg, end_of_stream);
        self.content_length = head.content_length;
        self.event = Some(head.event);
        self.request_done = end_of_stream;
        if wants_body {
            self.body = Some(Vec::new());
            return Verdict::Hold;
        }
        self.route(setup, worker, host, now)
    }

    /// Request body arrived (`end_of_stream`: the last of it).
    pub fn on_request_body<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        end_of_stream: bool,
    ) -> Verdict {
        if end_of_stream {
            self.request_ended(host);
        }
        let cfg = &setup.config;
        let Some(mut buf) = self.body.take() else {
            if cfg.retry_next && host.parking().is_some() {
                // A re-run must know the body is whole where Envoy keeps it.
                let n = host.request_body(&mut Vec::new(), 0);
                self.request_bytes = self.request_bytes.saturating_add(n);
            }
            return Verdict::Continue;
        };
        let max = cfg.max_body_bytes;
        let room = max.saturating_sub(buf.len());
        let arrived = host.request_body(&mut buf, room);
        self.request_bytes = self.request_bytes.saturating_add(arrived);
        // A re-run of a request whose body ACE rewrote for the destination
        // that failed: the client's body, not that one.
        let original = end_of_stream
            .then(|| self.rerun.as_mut().and_then(|c| c.body.take()))
            .flatten();
        if let Some(original) = original {
            if !host.replace_request_body(&original) {
                return self.internal(host, "cannot put the client's body back for a re-run");
            }
            self.request_bytes = original.len();
            buf = original;
        }
        if !end_of_stream && self.request_bytes < max {
            self.body = Some(buf);
            return Verdict::Hold; // buffer more
        }
        // The whole body, or as much as the bound allows (then the
        // scanner knows it was cut).
        let total = if end_of_stream {
            self.request_bytes
        } else {
            self.request_bytes.max(max.saturating_add(1))
        };
        self.route_on_body(setup, worker, host, &buf, total)
    }

    /// Request trailers arrived: the request is whole. One held for its
    /// body is routed now, on what was read (continuing undecided would
    /// release it to Envoy's router).
    pub fn on_request_trailers<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
    ) -> Verdict {
        self.trailers = true;
        self.request_ended(host);
        let Some(buf) = self.body.take() else {
            return Verdict::Continue;
        };
        let total = self.request_bytes;
        self.route_on_body(setup, worker, host, &buf, total)
    }

    /// The whole request has passed the filter. If it was already routed,
    /// the upstream now has all of it: health latency starts here, not at
    /// the decision (a slow upload is the client's, not the destination's).
    fn request_ended<H: Host>(&mut self, host: &mut H) {
        self.request_done = true;
        if self.chosen.is_some() {
            let now = host.now_ms();
            if let Some(e) = self.event.as_mut() {
                e.sent_ms = now;
            }
        }
    }

    /// Route on the body read so far (`total` bytes long in all).
    fn route_on_body<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        buf: &[u8],
        total: usize,
    ) -> Verdict {
        let now = host.now_ms();
        match body::scan_request(buf, total) {
            Ok(b) => self.route_with(setup, worker, host, Some((&b, buf)), now),
            Err(e) => {
                if let Some(refused) = request::body_refusal(&setup.config, &e) {
                    return self.refuse(host, &refused);
                }
                // The body only refines the estimate: fall back to its size.
                self.content_length = Some(total);
                self.route(setup, worker, host, now)
            }
        }
    }

    /// Feasibility, then merit order, then the routing header.
    fn route<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        now: u64,
    ) -> Verdict {
        self.route_with(setup, worker, host, None, now)
    }

    /// [`Flow::route`] with the body read whole, parsed and raw (model
    /// routing rewrites it; the cache keys on it): the request's shape,
    /// then its stages ([`stage::route`]), then what they came to.
    fn route_with<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        read: Option<(&RequestBody, &[u8])>,
        now: u64,
    ) -> Verdict {
        let body = read.map(|(b, _)| b);
        let raw = read.map(|(_, r)| r);
        let cfg = &setup.config;
        let conflict = self
            .event
            .as_ref()
            .and_then(|e| request::model_conflict(e, body));
        if let Some(refused) = conflict {
            return self.refuse(host, &refused);
        }
        self.max_output = body.and_then(|b| b.max_output_tokens);
        let carried = self.rerun.as_deref();
        let Some(event) = self.event.as_mut() else {
            return self.internal(host, "request not captured");
        };
        let mut req = request::plan(cfg, event, body, self.content_length, now);
        let can = host.can();
        let body_model = body.and_then(|b| b.model.as_deref());
        // Model routing only where the body can say the model served: read
        // whole, naming a model, on a host that can replace it, and not
        // ended by trailers (Envoy has passed the body on by then, and a
        // rewrite could only be appended).
        let rewritable =
            raw.is_some() && body_model.is_some() && !self.trailers && can.replace_request_body;
        let api = event.headers.get(":path").and_then(Api::of_path);
        event.api = api.map(Api::name);
        // A completion streamed without `stream_options`: ask for its usage
        // (the client still gets the stream it asked for).
        let ask_usage = rewritable
            && can.replace_response_body
            && matches!(api, Some(Api::ChatCompletions | Api::Completions))
            && body.is_some_and(|b| b.stream && !b.stream_options);
        let routing = setup.routing.as_ref().filter(|_| rewritable);
        let shape = Shape {
            raw,
            body_model,
            fingerprint: body.map(|b| b.prefix),
            api,
            rewritable,
            routing,
            // The cache only for requests safe to answer twice, and never
            // for ACE's own re-run of a failed request.
            cacheable: setup.cache.as_ref().filter(|_| {
                carried.is_none() && body.is_some_and(|b| b.cacheable) && raw.is_some()
            }),
            carried,
            now,
        };
        let routed = with_worker(worker, |w| {
            stage::route(setup, w, host, event, &mut req, &shape)
        });
        if let Some(h) = routed.hold {
            self.hold(setup, worker, host, h);
        }
        let (claimed, pending) = match routed.climbed {
            Ok((Climbed::Hit, _)) => return self.answer_from_cache(setup, worker, host, routing),
            Ok((Climbed::Claimed(c), pending)) => (c, pending),
            Err(stop) => return self.stopped(setup, host, stop),
        };
        self.chosen = Some((claimed.decision, now));
        let won = Won {
            api,
            ask_usage,
            claimed,
            pending,
        };
        self.go(setup, host, won, raw, routing, now)
    }

    /// What the budget reserved for the request routed: a re-run's
    /// replaces its first run's, and a soft budget is said in the event.
    fn hold<H: Host>(&mut self, setup: &Setup, worker: &RefCell<Worker>, host: &mut H, h: Hold) {
        // A request run again releases its first run's reservation.
        if let Some(old) = self.budget.replace(h) {
            self.release(setup, worker, host, old);
        }
        if let (Some(b), Some(e)) = (h.soft, self.event.as_mut()) {
            host.count(Fleet::BudgetSoft.into(), 1);
            e.budget = setup
                .budgets
                .as_ref()
                .and_then(|bg| bg.names.get(usize::from(b)).cloned());
            e.budget_state = Some(crate::budget::Why::Soft.state());
        }
    }

    /// Answer why routing stopped before a decision.
    fn stopped<H: Host>(&mut self, setup: &Setup, host: &mut H, stop: Stop) -> Verdict {
        match stop {
            Stop::Refused(refused) => self.refuse(host, &refused),
            Stop::Budget(r) => self.refuse_budget(setup, host, &r),
            Stop::NoDestination(refusal) => {
                host.count(Fleet::NoDestination.into(), 1);
                self.refuse(host, &Refused::no_destination(refusal))
            }
            Stop::Fleet => self.refuse(
                host,
                &Refused {
                    status: 503,
                    kind: "internal",
                    reason: "shared_state",
                    message: "fleet state unavailable".to_string(),
                },
            ),
        }
    }

    /// Send the request to the destination claimed: book the routed
    /// request's counterfactual, count the decision, rewrite the body's
    /// model when a substitute serves it, record the decision in the event
    /// and set the destination header Envoy's route reads. Any step that
    /// fails releases the claim and answers 500: a request never leaves
    /// half-routed.
    fn go<H: Host>(
        &mut self,
        setup: &Setup,
        host: &mut H,
        won: Won,
        raw: Option<&[u8]>,
        routing: Option<&crate::routing::Routing>,
        now: u64,
    ) -> Verdict {
        let Won {
            api,
            ask_usage,
            claimed,
            pending,
        } = won;
        let Claimed {
            served, cf, live, ..
        } = claimed;
        let cfg = &setup.config;
        let excluded = self.rerun.as_ref().map(|c| c.failed);
        let Some((decision, _)) = self.chosen.as_mut() else {
            return self.internal(host, "routed without a decision");
        };
        // A routed request books against the model it named (none when
        // no pay-as-you-go destination may serve that one).
        if let Some(cf) = cf {
            decision.counterfactual_index = cf.map(|c| c.index);
            decision.counterfactual_usd = cf.map(|c| c.usd);
            self.extra
                .get_or_insert_with(Box::default)
                .counterfactual_scale = cf.map(|c| c.scale);
        }
        if let Some(p) = pending {
            self.extra.get_or_insert_with(Box::default).cache = Some(*p);
        }
        for (counter, n) in Counter::decided(decision) {
            host.count(counter, n);
        }
        if cfg.no_policy {
            host.count(Fleet::WithoutPolicy.into(), 1);
        }
        let Some(dest) = cfg.destinations.get(decision.index) else {
            self.settle(setup, host, None, Some(now));
            return self.internal(host, "decision index out of range");
        };
        // The model served, by catalogue id: a substitute's, else the one
        // named.
        let member = served
            .zip(routing)
            .map(|(m, r)| r.members.get(m).map_or("", |m| m.name.as_str()));
        let catalogue =
            member.or_else(|| self.event.as_ref().and_then(|e| e.text(&e.model_requested)));
        let sent = catalogue.map(|c| dest.upstream.model_name(c));
        let renamed = sent.filter(|s| Some(*s) != catalogue);
        let rename = member.is_some() || renamed.is_some();
        if rename || ask_usage {
            // The upstream serves the model its body names: name the one
            // chosen, as this upstream knows it. A body that cannot be
            // rewritten never reaches a destination chosen for another
            // model or name (fail closed; `upstream::narrow` kept those
            // out).
            let name = sent.unwrap_or("");
            // One copy per rewrite asked for, none to stand between them.
            let rewritten = raw.and_then(|b| match (rename, ask_usage) {
                (true, true) => {
                    routing::rewrite_model(b, name).and_then(|r| crate::stream_usage::ask(&r))
                }
                (true, false) => routing::rewrite_model(b, name),
                (false, _) => crate::stream_usage::ask(b),
            });
            let sent = rewritten.filter(|b| host.replace_request_body(b));
            let done = sent.is_some();
            if done && ask_usage {
                self.extra.get_or_insert_with(Box::default).strip =
                    Some(crate::stream_usage::Strip::default());
            }
            // A request that may run again keeps the client's body for
            // its re-run, and knows how long the body Envoy holds is.
            if let (Some(sent), true) = (&sent, cfg.retry_next && host.parking().is_some()) {
                self.request_bytes = sent.len();
                if excluded.is_none() {
                    self.extra.get_or_insert_with(Box::default).original = raw.map(<[u8]>::to_vec);
                }
            }
            if !done {
                self.settle(setup, host, None, Some(now));
                return self.internal(host, "cannot rewrite the request body's model");
            }
        }
        let renamed = renamed.map(|r| Text::Owned(r.to_string()));
        if let Some(name) = member {
            if self
                .event
                .as_ref()
                .is_some_and(|e| e.headers.get("x-ace-model").is_some())
            {
                host.set_request_header("x-ace-model", name);
            }
            host.count(Fleet::Substitutions.into(), 1);
            let name = Text::Owned(name.to_string());
            if let Some(e) = self.event.as_mut() {
                e.model_served = Some(name);
            }
        }
        if let Some(e) = self.event.as_mut() {
            e.upstream_model = renamed;
        }
        // Addressed as the upstream expects: its path and authority, and
        // no credential of the client's unless it passes them.
        let addressed = self
            .event
            .as_ref()
            .is_some_and(|e| upstream::address(dest, api, &e.headers, host));
        if !addressed {
            self.settle(setup, host, None, Some(now));
            return self.internal(host, "cannot address the request to its upstream");
        }
        let checking = self.pending().is_some_and(|p| p.check.is_some());
        if let (Some(e), Some((decision, _))) = (self.event.as_mut(), self.chosen.as_ref()) {
            request::record(e, cfg, &setup.names, decision, &live);
            if excluded.is_some() {
                e.reason = RETRY_REASON;
            }
            if checking {
                e.reason = cache::CHECK_REASON;
            }
            if self.request_done {
                e.sent_ms = now;
            }
        }
        if !host.set_request_header(&cfg.destination_header, &dest.cluster) {
            self.settle(setup, host, None, Some(now));
            return self.internal(host, "cannot set the destination header");
        }
        host.clear_route_cache();
        Verdict::Continue
    }

    /// Answer from the cache entry in the worker's buffer: the stored
    /// answer, an event booked at near-zero marginal cost against what
    /// pay-as-you-go would have charged for the model named.
    fn answer_from_cache<H: Host>(
        &mut self,
        setup: &Setup,
        worker: &RefCell<Worker>,
        host: &mut H,
        routing: Option<&crate::routing::Routing>,
    ) -> Verdict {
        let cfg = &setup.config;
        let sent = with_worker(worker, |w| {
            let entry = Entry::decode(&w.entry)?;
            let status = u32::from(entry.status);
            let ok = host.send_local(
                status,
                entry.content_type,
                entry.body,
                cache::HIT_REASON,
                &[],
            );
            ok.then(|| {
                (
                    entry.producer,
                    entry.model.to_string(),
                    entry.status,
                    entry.tokens_in,
                    entry.tokens_out,
                    entry.estimated,
                )
            })
        });
        let Some((producer, model, status, tokens_in, tokens_out, estimated)) = sent else {
            return self.internal(host, "cannot answer from the cache");
        };
        host.count(Fleet::CacheHits.into(), 1);
        let Some(e) = self.event.as_mut() else {
            return Verdict::Answered;
        };
        e.destination = setup.names.get(producer).cloned();
        e.tier = cfg.models.get(producer).map(|m| m.tier.as_str());
        if e.text(&e.model_requested) != Some(model.as_str()) {
            e.model_served = Some(Text::Owned(model));
        }
        e.cached = true;
        e.warm = Some(true);
        e.tokens_in = tokens_in;
        e.tokens_out = tokens_out;
        e.tokens_estimated = estimated;
        e.marginal_usd = 0.0;
        // What pay-as-you-go would have charged for the model named.
        let asked = routing.zip(e.text(&e.model_requested)).and_then(|(r, m)| {
            let a = r.asked(m)?;
            let reference = r.reference(a)?;
            r.members
                .iter()
                .position(|x| x == reference)
                .map(|k| (r, k))
        });
        let tokens = Request::untimed(tokens_in, tokens_out, 0.0);
        let usd = with_worker(worker, |w| {
            // A class named: priced against its reference model, as the
            // ledger prices it (the mask so far is for the class's name,
            // which no table knows).
            let class = asked.filter(|(r, k)| {
                e.text(&e.model_requested)
                    .and_then(|m| r.asked(m))
                    .is_some_and(|a| a.member.is_none())
                    && r.members.get(*k).is_some()
            });
            if let (Some((r, k)), Some(m), Some(tables)) = (
                class,
                cfg.policy.as_ref().and_then(|p| p.model),
                setup.tables.as_ref(),
            ) {
                if let (Some(slot), Some(member)) = (w.lookup.values.get_mut(m), r.members.get(k)) {
                    *slot = member.value;
                }
                if tables
                    .feasible(&w.lookup.values, &mut w.lookup.mask)
                    .is_err()
                {
                    w.lookup.mask.fill(0);
                }
            }
            counterfactual(cfg, &w.lookup.mask, &tokens, |d| {
                asked.map_or(1.0, |(r, k)| r.factor(k, d))
            })
        });
        e.counterfactual_usd = usd.map(|c| c.usd);
        e.finish(u32::from(status), cache::HIT_REASON);
        Verdict::Answered
    }

    /// Answer locally with `refused`'s JSON error.
    fn refuse<H: Host>(&mut self, host: &mut H, refused: &Refused) -> Verdict {
        if let Some(e) = self.event.as_mut() {
            e.finish(refused.status, refused.reason);
        }
        let body = refused.body();
        if !host.send_local(refused.status, JSON, &body, refused.reason, &[]) {
            log::error!("cannot send the local reply {}", refused.status);
        }
        Verdict::Answered
    }

    /// Answer a budget's refusal: 429, its body, `retry-after`.
    fn refuse_budget<H: Host>(
        &mut self,
        setup: &Setup,
        host: &mut H,
        r: &crate::budget::Refusal,
    ) -> Verdict {
        let reason = crate::budget::reason(r.why);
        if let Some(e) = self.event.as_mut() {
            e.finish(429, reason);
            e.budget = setup
                .budgets
                .as_ref()
                .and_then(|bg| bg.names.get(usize::from(r.budget)).cloned());
            e.budget_state = Some(r.why.state());
        }
        host.count(Fleet::BudgetRefused.into(), 1);
        let mut secs = itoa::Buffer::new();
        let retry = [("retry-after", secs.format(r.retry_after_s))];
        if !host.send_local(429, JSON, &r.body, reason, &retry) {
            log::error!("cannot send the local reply 429");
        }
        Verdict::Answered
    }

    /// Count what a request booked against its tenant's budgets, in place
    /// of what it reserved.
    fn release<H: Host>(&mut self, setup: &Setup, worker: &RefCell<Worker>, host: &mut H, h: Hold) {
        let (usd, tokens) = self.event.as_ref().map_or((0.0, 0), |e| {
            let tokens = i64::from(e.tokens_in) + i64::from(e.tokens_out);
            (e.marginal_usd, tokens)
        });
        with_worker(worker, |w| {
            budget_stage::release(setup, w, host, h, usd, tokens);
        });
    }

    /// Answer 500: something that should not happen did; it is logged,
    /// and the request reaches no destination.
    fn internal<H: Host>(&mut self, host: &mut H, message: &str) -> Verdict {
        log::error!("answering 500: {message}");
        self.refuse(
            host,
            &Refused {
                status: 500,
                kind: "internal",
                reason: "internal",
                message: message.to_string(),
            },
        )
    }

    /// Fold the request's outcome into the fleet state (once). `now` is the
    /// caller's clock reading, if it has one.
    fn settle<H: Host>(
        &mut self,
        setup: &Setup,
        host: &mut H,
        outcome: Option<Outcome>,
        now: Option<u64>,
    ) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let Some((decision, _)) = self.chosen else {
            return;
        };
        let d = decision.index;
        let now = now.unwrap_or_else(|| host.now_ms());
        // An outcome observed at the headers is not folded in twice.
        let outcome = if self.observed { None } else { outcome };
        let op = FleetOp::Settle {
            d,
            outcome,
            policy: &setup.config.health,
        };
        self.fleet_op(setup, host, d, outcome, now, op);
    }

    /// Fold a success's outcome into its destination's health at its
    /// headers, keeping the slot: the sequence occupies the server until
    /// its last byte, and the load the merit order prices must say so.
    /// [`Flow::settle`] releases the slot when the request ends.
    fn observe<H: Host>(&mut self, setup: &Setup, host: &mut H, outcome: Outcome, now: u64) {
        if self.settled || std::mem::replace(&mut self.observed, true) {
            return;
        }
        let Some((decision, _)) = self.chosen else {
            return;
        };
        let d = decision.index;
        let op = FleetOp::Observe {
            d,
            outcome,
            policy: &setup.config.health,
        };
        self.fleet_op(setup, host, d, Some(outcome), now, op);
    }

    /// Milliseconds from when the upstream had the whole request (from the
    /// decision at `started` if it answered before the request ended) to
    /// `now`, and the request's tenant key.
    fn since_sent(&self, now: u64, started: u64) -> (u64, u32) {
        let (sent, tenant) = self
            .event
            .as_ref()
            .map_or((0, 1), |e| (e.sent_ms, e.tenant_key));
        (
            now.saturating_sub(if sent > 0 { sent } else { started }),
            tenant,
        )
    }

    /// The answer's first byte arrived: teach its destination's learned
    /// time to first token (from when the upstream had the whole request,
    /// as the health outcome's latency).
    fn learn<H: Host>(&mut self, setup: &Setup, host: &mut H) {
        let Some((decision, started)) = self.chosen else {
            return;
        };
        let now = host.now_ms();
        let (ttft_ms, tenant) = self.since_sent(now, started);
        let op = FleetOp::Learn {
            d: decision.index,
            band: decision.band,
            ttft_ms,
            tenant,
            policy: &setup.config.health,
        };
        if host.fleet(now, op).is_err() {
            log::warn!("cannot update the fleet state");
        }
    }

    /// Run `op` (a settle or an observation of `outcome` on `d`) and count
    /// and log what it did.
    fn fleet_op<H: Host>(
        &mut self,
        setup: &Setup,
        host: &mut H,
        d: usize,
        outcome: Option<Outcome>,
        now: u64,
        op: FleetOp<'_, '_>,
    ) {
        let result = match host.fleet(now, op) {
            Ok(FleetAnswer::Settled(change)) => Ok(change),
            _ => Err(FleetUnavailable),
        };
        if let Some(c) = Counter::outcome(d, outcome) {
            host.count(c, 1);
        }
        match result {
            Ok(change) => {
                if let Some(c) = Counter::change(change) {
                    host.count(c, 1);
                }
                if change != Change::None {
                    let name = setup.names.get(d).map_or("?", |n| n);
                    log::info!("destination {name}: {change:?}");
                }
            }
            Err(FleetUnavailable) => log::warn!("cannot update the shared fleet state"),
        }
    }

    /// The response headers arrived: what they mean for the destination's
    /// health, then either the rest of the response's handling or, under
    /// `retry_next`, [`Verdict::Rerun`].
    pub fn on_response_headers<H: Host>(&mut self, setup: &Setup, host: &mut H) -> Verdict {
        let Some((decision, started)) = self.chosen else {
            return Verdict::Continue;
        };
        let cfg = &setup.config;
        let now = host.now_ms();
        let (latency_ms, tenant) = self.since_sent(now, started);
        let answer = stage::outcome::read(cfg, host, &decision, tenant, latency_ms, now);
        if let Some(e) = self.event.as_mut() {
            e.upstream_ms = answer.upstream_ms;
        }
        let (status, outcome) = (answer.status, answer.outcome);
        // Only when the decision had a runner-up: with none, a re-run could
        // only refuse.
        let rerun = matches!(outcome, Outcome::Failure { .. })
            && cfg.retry_next
            && decision.runner_up.is_some()
            && host.parking().is_some();
        if matches!(outcome, Outcome::Success { .. }) {
            // Only a stream's first byte is its first token: a whole
            // answer's first byte comes with its last.
            self.learn_first_byte = (200..300).contains(&status)
                && decision.warm
                && host.response_header("content-type", |v| headers::has(v, "text/event-stream"));
            self.observe(setup, host, outcome, now);
        } else {
            self.settle(setup, host, Some(outcome), Some(now));
        }
        if rerun && self.prepare_rerun(cfg, host, decision.index) {
            self.answered = Some((status, latency_ms));
            return Verdict::Rerun;
        }
        self.respond(setup, host, status, latency_ms);
        Verdict::Continue
    }

    /// The rest of a response's handling: the event's status, the usage
    /// scan, the operator headers.
    fn respond<H: Host>(&mut self, setup: &Setup, host: &mut H, status: u32, latency_ms: u64) {
        let Some((decision, _)) = self.chosen else {
            return;
        };
        // An encoded answer (gzip, ...) is neither stored nor compared: an
        // entry is replayed without its encoding, to any client.
        // (Read only for a request the cache has a stake in.)
        let encoded = self.pending().is_some()
            && host.response_header("content-encoding", |v| {
                v.is_some_and(|v| !v.eq_ignore_ascii_case(b"identity"))
            });
        let comparable = (200..300).contains(&status) && !encoded;
        let reason = if self.rerun.is_some() {
            RETRY_REASON
        } else if comparable && self.pending().is_some_and(|p| p.check.is_some()) {
            // Counted as a check (the ledger's false-hit rate) only where
            // there will be an answer to compare.
            cache::CHECK_REASON
        } else {
            decision.reason.as_str()
        };
        if let Some(e) = self.event.as_mut() {
            e.latency_ms = latency_ms;
            e.finish(status, reason);
        }
        if !(200..300).contains(&status) {
            if let Some(x) = self.extra.as_deref_mut() {
                x.strip = None;
            }
        }
        if (200..300).contains(&status) {
            let sse =
                host.response_header("content-type", |v| headers::has(v, "text/event-stream"));
            self.usage = Some(UsageScanner::new(sse));
            // Only a stream whose length is not fixed can lose bytes.
            let keep_strip = sse && host.response_header("content-length", |v| v.is_none());
            if !keep_strip {
                if let Some(x) = self.extra.as_deref_mut() {
                    x.strip = None;
                }
            }
            if let Some(p) = self.pending() {
                // Kept as long as it is whole and within the bound.
                p.storable = !encoded;
                if encoded {
                    p.check = None;
                }
                p.sse = sse;
                p.content_type = host.response_header("content-type", |v| {
                    String::from_utf8_lossy(v.unwrap_or(b"application/json")).into_owned()
                });
            }
        }
        let cfg = &setup.config;
        if cfg.response_headers && setup.routing.is_some() {
            let served = self
                .event
                .as_ref()
                .and_then(|e| e.text(&e.model_served).or(e.text(&e.model_requested)));
            if let Some(m) = served {
                let m = m.to_string();
                host.set_response_header(request::RESPONSE_MODEL_HEADER, &m);
            }
        }
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
                host.set_response_header(k, v);
            }
        }
        // A soft budget's tenant is told it was served on the rungs its
        // budget allows (whatever `response_headers` says: it is theirs).
        let soft = self.budget.and_then(|h| h.soft);
        if let Some(name) = soft.and_then(|b| setup.budgets.as_ref()?.names.get(usize::from(b))) {
            let value = format!("soft; budget={name}");
            host.set_response_header(BUDGET_HEADER, &value);
        }
    }

    /// Get ready to run the request again, once, without destination
    /// `failed`, from the client's request ([`rerun`]): the header map put
    /// back as the client sent it, what the re-run takes over parked, the
    /// request marked with this process's token and the carry's key; this
    /// run marked superseded and its event parked (the new run writes the
    /// request's one event). False when this was a re-run already, Envoy
    /// cannot replay the request whole (it had trailers, or its body is no
    /// longer held), or the map could not be put back: the failure is
    /// answered.
    fn prepare_rerun<H: Host>(&mut self, cfg: &Config, host: &mut H, failed: usize) -> bool {
        if self.rerun.is_some() || !self.request_done || self.trailers || host.parking().is_none() {
            return false;
        }
        if self.request_bytes > 0 && !host.replayable(self.request_bytes) {
            log::debug!("not retrying: Envoy does not hold the whole request to run it again");
            return false;
        }
        let Some(event) = self.event.as_ref() else {
            return false;
        };
        if !rerun::restore(cfg, &event.headers, host) {
            log::warn!("not retrying: the client's request headers could not be put back");
            return false;
        }
        let carry = Box::new(Carry {
            failed,
            body: self.extra.as_mut().and_then(|x| x.original.take()),
            verified: rerun::verified(cfg, host),
        });
        let Some(key) = host.parking().map(|p| p.park(carry)) else {
            return false;
        };
        if !host.set_request_header(RETRY_HEADER, &rerun::mark(key)) {
            host.parking().and_then(|p| p.take(key));
            return false;
        }
        host.mark_superseded(true);
        self.parked = self.event.take().map(Box::new);
        true
    }

    /// Envoy would not run the request again: undo the preparation and
    /// let this answer through.
    pub fn not_rerun<H: Host>(&mut self, setup: &Setup, host: &mut H) -> Verdict {
        host.remove_request_header(RETRY_HEADER);
        host.mark_superseded(false);
        self.event = self.parked.take().map(|e| *e);
        if let Some((status, latency_ms)) = self.answered.take() {
            self.respond(setup, host, status, latency_ms);
        }
        Verdict::Continue
    }

    /// Response body arrived (`end_of_stream`: the last of it). Never
    /// holds the response: streams must flow.
    pub fn on_response_body<H: Host>(&mut self, setup: &Setup, host: &mut H, end_of_stream: bool) {
        if std::mem::take(&mut self.learn_first_byte) {
            self.learn(setup, host);
        }
        let max = setup.cache.as_ref().map_or(0, |c| c.max_entry_bytes);
        let (mut capture, mut strip) = match self.extra.as_deref_mut() {
            Some(x) => (x.cache.as_mut().filter(|p| p.storable), x.strip.as_mut()),
            None => (None, None),
        };
        let Some(scanner) = self.usage.as_mut() else {
            return;
        };
        // What the client gets when ACE asked for usage on its behalf: the
        // stream as it asked for it (a host may hand a chunk in pieces).
        let mut sent = Vec::new();
        let mut piece = Vec::new();
        host.response_body(|chunk| {
            scanner.feed(chunk);
            if let Some(s) = strip.as_deref_mut() {
                s.chunk(chunk, false, &mut piece);
                sent.extend_from_slice(&piece);
            }
            if let Some(p) = capture.as_deref_mut() {
                if p.body.len().saturating_add(chunk.len()) <= max {
                    p.body.extend_from_slice(chunk);
                } else {
                    // Whole or not at all.
                    p.storable = false;
                    p.oversize = true;
                    p.body = Vec::new();
                }
            }
        });
        if let Some(s) = strip {
            if end_of_stream {
                s.chunk(&[], true, &mut piece);
                sent.extend_from_slice(&piece);
            }
            if !host.replace_response_chunk(&sent) {
                log::warn!(
                    "cannot replace a response chunk: the client gets the usage ACE asked for"
                );
                if let Some(x) = self.extra.as_deref_mut() {
                    x.strip = None;
                }
            }
        }
        if end_of_stream {
            let Some(scanner) = self.usage.as_mut() else {
                return;
            };
            let found = scanner.finish();
            self.usage = None;
            if found.is_none() {
                // No usage it could read: the estimate stands, counted.
                host.count(Fleet::UsageUnread.into(), 1);
                log::debug!("no readable usage in the answer: booked at the estimate");
            }
            if let (Some(u), Some((decision, _)), Some(e)) =
                (found, self.chosen, self.event.as_mut())
            {
                let scale = self
                    .extra
                    .as_ref()
                    .and_then(|x| x.counterfactual_scale)
                    .unwrap_or(1.0);
                request::book_usage_scaled(e, &setup.config, &decision, u, self.max_output, scale);
            }
            self.store_answer(setup, host);
        }
    }

    /// The whole answer to a cacheable request arrived: compare it with
    /// the hit it checks, if it checks one, and store it.
    fn store_answer<H: Host>(&mut self, setup: &Setup, host: &mut H) {
        let taken = self.extra.as_deref_mut().and_then(|x| x.cache.take());
        if let (Some(p), Some((decision, _)), Some(e)) = (taken, self.chosen, self.event.as_mut()) {
            stage::answer::store(setup, host, p, &decision, e);
        }
    }

    /// The request is over (Envoy runs this before its access loggers):
    /// settle it if nothing did (the client went away: free the slot,
    /// blame no one), book its dollars and write its one event.
    pub fn on_complete<H: Host>(&mut self, setup: &Setup, worker: &RefCell<Worker>, host: &mut H) {
        self.settle(setup, host, None, None);
        if let Some(h) = self.budget.take() {
            self.release(setup, worker, host, h);
        }
        // A check whose fresh answer never ended (the client or the
        // upstream went away) compared nothing: not counted as a check.
        let unchecked = self
            .extra
            .as_deref_mut()
            .and_then(|x| x.cache.take())
            .is_some_and(|p| p.check.is_some());
        let Some(e) = self.event.as_mut() else {
            return;
        };
        if unchecked && e.reason == cache::CHECK_REASON {
            e.reason = self
                .chosen
                .as_ref()
                .map_or(cache::CHECK_REASON, |(d, _)| d.reason.as_str());
        }
        if e.status == 0 {
            // Envoy may have answered itself without the filter seeing the
            // answer (a 413 for a body over its buffer limit while the
            // filter held the request): log what the client got.
            match host.envoy_response_code() {
                Some(code) if code > 0 => e.finish(code, "envoy_reply"),
                _ => e.finish(0, "client_gone"),
            }
        }
        for (counter, n) in Counter::booked(e) {
            host.count(counter, n);
        }
        let written = with_worker(worker, |w| {
            e.write_json(&mut w.event_line);
            host.write_event(&w.event_line)
        });
        if !written {
            log::warn!("cannot write the request event");
        }
    }
}

/// The content type of the flow's own answers.
const JSON: &str = "application/json";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_is_small() {
        let (flow, event) = (std::mem::size_of::<Flow>(), std::mem::size_of::<Event>());
        // The usage scanner's state is most of the rest (its longest key,
        // `cache_creation_input_tokens`, and the cache counts); a
        // budget's hold is 32.
        assert!(flow <= event + 416, "Flow {flow} bytes, Event {event}");
    }
}
