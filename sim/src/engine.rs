//! The discrete-event loop: arrivals, attempts, first bytes, completions,
//! retries and the control service's ticks, in time order, for one policy
//! and one seed.
//!
//! The loop owns the fleet ([`Upstream`]s) and the clock; a [`Policy`]
//! only chooses. Every policy meets the same arrivals, the same failures
//! and the same evictions (each drawn from its own seeded stream), and
//! every request is priced from the event line it writes, by the ledger's
//! own pricing ([`ace_pricing`]), so the figures differ only by the
//! choices made, and the ledger reading a run's lines books what the run
//! reports, to the nano-dollar.

use crate::fleet::{Answer, Upstream};
use crate::metrics::{Booking, Metrics, RequestOutcome};
use crate::mix::Profile;
use crate::rng::Rng;
use crate::slo::Targets;
use crate::trace::Req;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The run's Unix time at simulated ms 0: 2023-11-16 00:00 UTC, the day
/// the Azure trace was recorded.
pub const EPOCH_MS: u64 = 1_700_092_800_000;

/// How often the control service publishes a snapshot, ms.
pub const CONTROL_INTERVAL_MS: u64 = 1_000;

/// Where a policy sends an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To this destination.
    To(usize),
    /// Nowhere: the proxy answers with this status itself (a refusal, or
    /// a 2xx from ACE's response cache).
    Refuse(u16),
    /// Nowhere yet: the proxy sleeps this many ms without an attempt, then
    /// asks the policy again ([`Policy::resume`]). LiteLLM's router sleeps
    /// between retries this way, and its own refusals (a full
    /// `max_parallel_requests` slot, an empty candidate list) never reach
    /// a destination.
    Wait(u64),
}

/// What a policy does once an attempt answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// The answer goes to the client.
    Deliver,
    /// Try again, `after_ms` later, along `route`.
    Retry {
        /// Back-off, ms.
        after_ms: u64,
        /// Where.
        route: Route,
    },
}

/// What the loop shows a policy.
#[derive(Debug)]
pub struct World<'a> {
    /// Now, ms into the run.
    pub now: u64,
    /// The destinations.
    pub up: &'a [Upstream],
    /// The requests.
    pub reqs: &'a [Req],
    /// Their profiles.
    pub profiles: &'a [Profile],
    /// The trace's prompt block ids ([`Req::blocks`] points into them).
    pub block_ids: &'a [u32],
}

impl World<'_> {
    /// Request `r`.
    pub fn req(&self, r: u32) -> Req {
        self.reqs.get(r as usize).copied().unwrap_or(Req {
            at_ms: 0,
            prompt: 0,
            output: 0,
            profile: 0,
            blocks: crate::trace::Blocks::default(),
        })
    }

    /// Request `r`'s prompt block keys ([`crate::trace::Blocks::keys`]).
    pub fn blocks(&self, r: u32) -> impl Iterator<Item = u64> + '_ {
        self.req(r).blocks.keys(self.block_ids)
    }

    /// Request `r`'s profile.
    pub fn profile(&self, r: u32) -> Option<&Profile> {
        self.profiles.get(self.req(r).profile as usize)
    }
}

/// Attempt `n` (0-based) of request `r` on `dest`, answered `answer`;
/// `tried` lists the destinations tried so far, this one last.
#[derive(Clone, Copy, Debug)]
pub struct Answered<'a> {
    pub r: u32,
    pub dest: usize,
    pub answer: &'a Answer,
    pub n: u32,
    pub tried: &'a [usize],
}

impl<'a> Answered<'a> {
    /// Attempt `n` of request `r` on `dest`, answered `answer`, after `tried`.
    pub fn new(r: u32, dest: usize, answer: &'a Answer, n: u32, tried: &'a [usize]) -> Self {
        Answered {
            r,
            dest,
            answer,
            n,
            tried,
        }
    }
}

/// A routing strategy under test. Each lives in its own module under
/// `policy/`, documented against its source.
pub trait Policy {
    /// Its name in tables and files.
    fn name(&self) -> String;

    /// Where request `r`'s first attempt goes.
    fn route(&mut self, w: &World<'_>, r: u32) -> Route;

    /// An attempt was answered ([`Answered`]): what now.
    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let _ = (w, at);
        Next::Deliver
    }

    /// Request `r` waited as its policy asked ([`Route::Wait`]): where it
    /// goes now.
    fn resume(&mut self, w: &World<'_>, r: u32) -> Route {
        let _ = (w, r);
        Route::Refuse(503)
    }

    /// Request `r`'s last attempt, on `dest`, is over (`ok`: served whole).
    fn done(&mut self, w: &World<'_>, r: u32, dest: usize, ok: bool) {
        let _ = (w, r, dest, ok);
    }

    /// Request `r` was refused without an attempt, or its last attempt
    /// failed and was delivered: no [`Policy::done`] follows.
    fn finished_without_service(&mut self, w: &World<'_>, r: u32) {
        let _ = (w, r);
    }

    /// The control service's tick (every [`CONTROL_INTERVAL_MS`]).
    fn tick(&mut self, w: &World<'_>) {
        let _ = w;
    }

    /// The events written so far, as JSON lines (drained).
    fn take_events(&mut self) -> Vec<u8> {
        Vec::new()
    }

    /// Whether the policy writes its own events ([`Policy::take_events`]);
    /// the loop writes one for every request of a policy that does not.
    fn writes_events(&self) -> bool {
        false
    }

    /// The model the attempt just routed for request `r` is served by,
    /// when the policy substituted one for the model asked for.
    fn served_model(&self, r: u32) -> Option<&str> {
        let _ = r;
        None
    }

    /// The books of request `r`, which is over, for a policy that writes
    /// its own event lines ([`Policy::writes_events`]): those lines,
    /// priced. The loop prices the lines it writes for the others.
    fn booked(&mut self, r: u32) -> Option<Booking> {
        let _ = r;
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// An attempt's response headers (attempt id, generation).
    First(u32, u32),
    /// An attempt's last byte.
    Done(u32, u32),
    /// A retry attempt is sent.
    Send(u32, u32),
    /// A request that waited without an attempt asks its policy again.
    Resume(u32),
    /// The control tick.
    Tick,
    /// Spot evictions take effect.
    Evict(u16),
    /// Utilisation sample.
    Sample,
}

/// The loop's timed events, in (time, insertion) order.
#[derive(Debug, Default)]
struct Timeline {
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
}

impl Timeline {
    fn push(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }

    fn next_time(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    fn pop(&mut self) -> Option<(u64, Ev)> {
        self.heap.pop().map(|Reverse((t, _, e))| (t, e))
    }
}

/// One attempt of a request on a destination.
#[derive(Clone, Debug, Default)]
struct Attempt {
    /// Bumped on reuse, so stale events for a reused slot are ignored.
    generation: u32,
    live: bool,
    req: u32,
    dest: u16,
    n: u32,
    /// Sent (queued or running) and not over.
    sent: bool,
    answer: Option<Answer>,
    /// The request's attempts so far, this one last.
    tried: Vec<usize>,
    /// Killed by an eviction before its end.
    broken: bool,
    /// Holds a running slot on its destination.
    held_slot: bool,
    /// The model served, when not the one asked for.
    model: Option<String>,
    /// The GPU-hour price it started at, where the market had moved it.
    live_usd_per_hour: Option<f64>,
}

/// The attempts in flight, in reusable slots.
#[derive(Debug, Default)]
struct Attempts {
    slots: Vec<Attempt>,
    free: Vec<u32>,
}

impl Attempts {
    fn start(&mut self, req: u32, dest: usize, n: u32, tried: Vec<usize>) -> (u32, u32) {
        let id = self.free.pop().unwrap_or_else(|| {
            self.slots.push(Attempt::default());
            (self.slots.len() - 1) as u32
        });
        let Some(a) = self.slots.get_mut(id as usize) else {
            return (id, 0);
        };
        let generation = a.generation.wrapping_add(1);
        *a = Attempt {
            generation,
            live: true,
            req,
            dest: dest as u16,
            n,
            tried,
            ..Attempt::default()
        };
        (id, generation)
    }

    /// Attempt `id` if it is still generation `g`.
    fn get(&mut self, id: u32, g: u32) -> Option<&mut Attempt> {
        self.slots
            .get_mut(id as usize)
            .filter(|a| a.live && a.generation == g)
    }

    fn end(&mut self, id: u32) {
        if let Some(a) = self.slots.get_mut(id as usize) {
            a.live = false;
            a.tried = Vec::new();
            self.free.push(id);
        }
    }
}

/// What a run needs besides the policy.
#[derive(Debug)]
pub struct Run<'a> {
    /// The fleet, fresh.
    pub up: Vec<Upstream>,
    /// Requests, by arrival.
    pub reqs: &'a [Req],
    /// Their profiles.
    pub profiles: &'a [Profile],
    /// The trace's prompt block ids (empty: none).
    pub block_ids: &'a [u32],
    /// SLO targets.
    pub targets: &'a Targets,
    /// The seed (for the fleet's own draws).
    pub seed: u64,
    /// The configuration the loop's event lines name, which prices them.
    pub pricing: &'a ace_flow::Setup,
    /// The configuration id events name, the destination names, and the
    /// first half of every event id.
    pub event_names: (std::sync::Arc<str>, Vec<std::sync::Arc<str>>, u64),
}

/// The loop's mutable state.
struct Loop<'a> {
    up: Vec<Upstream>,
    reqs: &'a [Req],
    profiles: &'a [Profile],
    block_ids: &'a [u32],
    /// The admitted request's block keys (reused).
    keys: Vec<u64>,
    rng: Rng,
    attempts: Attempts,
    timeline: Timeline,
    metrics: Metrics,
    /// The books of a policy that writes no event lines of its own.
    books: Books<'a>,
    /// Requests waiting without an attempt ([`Route::Wait`]): their next
    /// attempt number and the destinations tried so far.
    waiting: std::collections::HashMap<u32, (u32, Vec<usize>)>,
}

/// Makes the filter's event line for a request a policy other than ACE
/// decided, so that the ledger reads every run alike, and prices it with
/// the ledger's pricing; the line is kept when the run writes events.
struct Books<'a> {
    pricing: &'a ace_flow::Setup,
    memo: ace_pricing::Memo,
    /// Keep the lines (the run writes events).
    write: bool,
    id_prefix: u64,
    config: std::sync::Arc<str>,
    names: Vec<std::sync::Arc<str>>,
    tiers: Vec<&'static str>,
    slo_ms: Vec<Option<u64>>,
    buf: Vec<u8>,
    line: Vec<u8>,
}

impl Books<'_> {
    /// Request `r`'s line, priced (and kept when the run writes events).
    #[allow(clippy::too_many_arguments)]
    fn book(
        &mut self,
        r: u32,
        req: &Req,
        profile: Option<&Profile>,
        o: &RequestOutcome,
        ttft_ms: Option<u64>,
        served_model: Option<&str>,
    ) -> Booking {
        use ace_flow::event::{Event, Text};
        let text = |s: Option<&str>| s.map(Text::from);
        let d = o.dest;
        let id = ace_flow::request::event_id(self.id_prefix, u64::from(r));
        let latency_ms = ttft_ms.unwrap_or(o.e2e_ms);
        let slo_ms = d.and_then(|d| self.slo_ms.get(d).copied().flatten());
        let ok = (200..300).contains(&o.status) && o.served;
        let mut e = Event {
            schema: ace_event::SCHEMA,
            event_id: id,
            config: self.config.clone(),
            time_ms: EPOCH_MS + req.at_ms,
            tenant: text(profile.map(|p| p.tenant.as_str())),
            data_class: text(profile.map(|p| p.data_class.as_str())),
            latency_class: text(profile.map(|p| p.latency_class.as_str())),
            model_requested: text(profile.map(|p| p.model.as_str())),
            model_served: text(served_model.or(profile.map(|p| p.model.as_str()))),
            destination: d.and_then(|d| self.names.get(d).cloned()),
            tier: d.and_then(|d| self.tiers.get(d).copied()),
            tokens_in: req.prompt,
            tokens_cache_read: o.cache_read,
            tokens_out: if ok { req.output } else { 0 },
            tokens_estimated: false,
            status: u32::from(o.status),
            latency_ms,
            slo_ms,
            slo_met: slo_ms.map(|s| ok && latency_ms <= s),
            reason: if d.is_some() { "simulated" } else { "refused" },
            warm: d.map(|_| !o.cold),
            overage: o.overage,
            live_usd_per_hour: ace_flow::event::Price::of(o.live_usd_per_hour),
            ..Event::default()
        };
        // Priced as the ledger reads the line back (its prices to the
        // picodollar, as written), so the two agree exactly.
        let facts = facts(&e);
        let priced = self.memo.price(&facts, self.pricing, &self.config);
        let mut booking = Booking::default();
        booking.add(facts.served(), priced.clone());
        if self.write {
            // The filter's own figures: what the books say.
            if let Ok(p) = priced {
                e.marginal_usd = ace_pricing::money::usd_f64(p.booked);
                e.counterfactual_usd = p.counterfactual.map(ace_pricing::money::usd_f64);
            }
            e.write_json(&mut self.line);
            self.buf.extend_from_slice(&self.line);
            self.buf.push(b'\n');
        }
        booking
    }
}

/// The facts pricing reads of the flow's event `e` exactly as a reader of
/// its line gets them back, without writing the line: its text and counts
/// as they are, its prices as written (to the picodollar, the flow's
/// `UsdBuffer`) and read again by the same JSON parser as the ledger's.
fn facts(e: &ace_flow::event::Event) -> ace_pricing::Facts<'_> {
    use std::borrow::Cow;
    let text = |t| e.text(t).map(Cow::Borrowed);
    let written = |p: ace_flow::event::Price| {
        let usd = p.get()?;
        let mut buf = ace_flow::event::UsdBuffer::default();
        serde_json::from_str(buf.format(usd)).ok()
    };
    ace_pricing::Facts {
        destination: e.destination.as_deref().map(Cow::Borrowed),
        tier: e.tier.map(Cow::Borrowed),
        tokens_in: e.tokens_in,
        tokens_out: e.tokens_out,
        tokens_cache_read: e.tokens_cache_read,
        tokens_cache_write: e.tokens_cache_write,
        status: e.status,
        warm: e.warm,
        overage: e.overage,
        cached: e.cached,
        model_requested: text(&e.model_requested),
        model_served: text(e.served()),
        tenant: text(&e.tenant),
        data_class: text(&e.data_class),
        latency_class: text(&e.latency_class),
        api: e.api.map(Cow::Borrowed),
        live_usd_per_input_token: written(e.live_usd_per_input_token),
        live_usd_per_output_token: written(e.live_usd_per_output_token),
        live_usd_per_hour: written(e.live_usd_per_hour),
    }
}

impl Run<'_> {
    /// Run `policy` over every request; the figures, and the policy's
    /// events through `events` (when given). `progress` is called with
    /// the number of requests that have arrived, every 1%.
    pub fn go(
        self,
        policy: &mut dyn Policy,
        mut events: Option<&mut dyn std::io::Write>,
        progress: &dyn Fn(u64),
    ) -> std::io::Result<Metrics> {
        let end = self.reqs.last().map_or(0, |r| r.at_ms);
        let books = Books {
            pricing: self.pricing,
            memo: ace_pricing::Memo::default(),
            write: events.is_some() && !policy.writes_events(),
            config: self.event_names.0.clone(),
            names: self.event_names.1.clone(),
            id_prefix: self.event_names.2,
            tiers: self.up.iter().map(|u| u.p.tier.as_str()).collect(),
            slo_ms: self.up.iter().map(|u| u.p.slo_ms).collect(),
            buf: Vec::new(),
            line: Vec::new(),
        };
        let mut metrics = Metrics::new(&self.up, self.targets, self.reqs.len());
        if !self.block_ids.is_empty() {
            metrics.track_prompt_cache();
        }
        metrics.stand(&self.up, end);
        let mut l = Loop {
            metrics,
            up: self.up,
            reqs: self.reqs,
            profiles: self.profiles,
            block_ids: self.block_ids,
            keys: Vec::new(),
            rng: Rng::fork(self.seed, "fleet-answers"),
            attempts: Attempts::default(),
            timeline: Timeline::default(),
            books,
            waiting: Default::default(),
        };
        l.timeline.push(0, Ev::Tick);
        l.timeline.push(0, Ev::Sample);
        let evictions: Vec<(u64, u16)> =
            l.up.iter()
                .enumerate()
                .flat_map(|(d, u)| u.evictions.iter().map(move |(_, e, _)| (*e, d as u16)))
                .collect();
        for (t, d) in evictions {
            l.timeline.push(t, Ev::Evict(d));
        }
        let step = (self.reqs.len() as u64 / 100).max(1);
        let mut next = 0usize;
        loop {
            let arrival = l.reqs.get(next).map(|r| r.at_ms);
            let take_arrival = match (arrival, l.timeline.next_time()) {
                (Some(a), Some(t)) => a <= t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if take_arrival {
                let now = arrival.unwrap_or(0);
                let r = next as u32;
                next += 1;
                if (next as u64).is_multiple_of(step) {
                    progress(next as u64);
                }
                let route = policy.route(&l.world(now), r);
                l.drain(policy, &mut events)?;
                l.route(policy, &mut events, now, r, 0, Vec::new(), route, 0)?;
                continue;
            }
            let Some((now, ev)) = l.timeline.pop() else {
                break;
            };
            match ev {
                Ev::Tick => {
                    policy.tick(&l.world(now));
                    l.drain(policy, &mut events)?;
                    if now <= end {
                        l.timeline.push(now + CONTROL_INTERVAL_MS, Ev::Tick);
                    }
                }
                Ev::Sample => {
                    l.metrics.sample(now, &l.up);
                    if now <= end {
                        l.timeline.push(now + 60_000, Ev::Sample);
                    }
                }
                Ev::Evict(d) => l.evict(usize::from(d), now),
                Ev::Send(id, g) => l.send(id, g, now),
                Ev::Resume(r) => {
                    let (n, tried) = l.waiting.remove(&r).unwrap_or_default();
                    let route = policy.resume(&l.world(now), r);
                    l.drain(policy, &mut events)?;
                    l.route(policy, &mut events, now, r, n, tried, route, 0)?;
                }
                Ev::First(id, g) => l.first(policy, &mut events, id, g, now)?,
                Ev::Done(id, g) => l.done(policy, &mut events, id, g, now)?,
            }
        }
        progress(self.reqs.len() as u64);
        l.metrics.finish();
        Ok(l.metrics)
    }
}

impl Loop<'_> {
    /// Request `r` is over (and `policy` told so): its figures, priced
    /// from its event lines, the policy's own or the loop's.
    fn finish_request(
        &mut self,
        policy: &mut dyn Policy,
        r: u32,
        req: &Req,
        outcome: RequestOutcome,
        served_model: Option<&str>,
    ) {
        let profile = self.profiles.get(req.profile as usize);
        let booking = if policy.writes_events() {
            policy.booked(r).unwrap_or_default()
        } else {
            let ttft = self.metrics.ttft(r, req);
            self.books
                .book(r, req, profile, &outcome, ttft, served_model)
        };
        self.metrics.record(r, req, profile, outcome, booking);
    }

    /// Hand the events written so far (the policy's or the loop's) to
    /// `events`.
    fn drain(
        &mut self,
        policy: &mut dyn Policy,
        events: &mut Option<&mut dyn std::io::Write>,
    ) -> std::io::Result<()> {
        drain(policy, events)?;
        if let Some(out) = events.as_mut() {
            if !self.books.buf.is_empty() {
                out.write_all(&self.books.buf)?;
                self.books.buf.clear();
            }
        }
        Ok(())
    }

    fn world(&self, now: u64) -> World<'_> {
        World {
            now,
            up: &self.up,
            reqs: self.reqs,
            profiles: self.profiles,
            block_ids: self.block_ids,
        }
    }

    fn req(&self, r: u32) -> Req {
        self.world(0).req(r)
    }

    /// Act on `route` for attempt `n` of request `r`, `after_ms` from now.
    #[allow(clippy::too_many_arguments)]
    fn route(
        &mut self,
        policy: &mut dyn Policy,
        events: &mut Option<&mut dyn std::io::Write>,
        now: u64,
        r: u32,
        n: u32,
        mut tried: Vec<usize>,
        route: Route,
        after_ms: u64,
    ) -> std::io::Result<()> {
        match route {
            Route::To(d) if d < self.up.len() => {
                let req = self.req(r);
                let served = policy.served_model(r).map(str::to_string);
                let allowed =
                    self.profiles
                        .get(req.profile as usize)
                        .is_none_or(|p| match &served {
                            Some(m) => p.allows_serving(d, m),
                            None => p.allows(d),
                        });
                if !allowed {
                    self.metrics.violation(r);
                }
                tried.push(d);
                let (id, g) = self.attempts.start(r, d, n, tried);
                if let Some(a) = self.attempts.get(id, g) {
                    a.model = served;
                }
                if after_ms == 0 {
                    self.send(id, g, now);
                } else {
                    self.timeline.push(now + after_ms, Ev::Send(id, g));
                }
            }
            Route::Wait(ms) => {
                self.waiting.insert(r, (n, tried));
                self.timeline.push(now + after_ms + ms, Ev::Resume(r));
            }
            _ => {
                let status = match route {
                    Route::Refuse(s) => s,
                    Route::To(_) | Route::Wait(_) => 500,
                };
                let req = self.req(r);
                let mut outcome = RequestOutcome::refused(status, now.saturating_sub(req.at_ms));
                if (200..300).contains(&status) {
                    // Answered by the proxy itself: a cache hit, served at
                    // no marginal cost.
                    outcome.served = true;
                    self.metrics.first_byte(r, now);
                }
                policy.finished_without_service(&self.world(now), r);
                self.finish_request(policy, r, &req, outcome, None);
                self.drain(policy, events)?;
            }
        }
        Ok(())
    }

    /// Send attempt `id` at `now`: queue it, or start it.
    fn send(&mut self, id: u32, g: u32, now: u64) {
        let Some(a) = self.attempts.get(id, g) else {
            return;
        };
        a.sent = true;
        let d = usize::from(a.dest);
        let Some(u) = self.up.get_mut(d) else { return };
        if u.up(now) && u.must_queue() {
            u.queue.push_back((id, g));
            return;
        }
        self.admit(id, g, now);
    }

    /// Attempt `id` starts on its destination at `now`.
    fn admit(&mut self, id: u32, g: u32, now: u64) {
        let reqs = self.reqs;
        let profiles = self.profiles;
        let Some(a) = self.attempts.get(id, g) else {
            return;
        };
        let d = usize::from(a.dest);
        let (Some(u), Some(req)) = (self.up.get_mut(d), reqs.get(a.req as usize)) else {
            return;
        };
        let model = match &a.model {
            Some(m) => m.as_str(),
            None => profiles
                .get(req.profile as usize)
                .map_or("", |p| p.model.as_str()),
        };
        self.keys.clear();
        self.keys.extend(req.blocks.keys(self.block_ids));
        let answer = u.admit_blocks(
            now,
            req.prompt,
            req.output,
            model,
            &self.keys,
            &mut self.rng,
        );
        a.held_slot = crate::fleet::holds_slot(u.p.slots, answer.status);
        let hourly = u.cost_at(now).usd_per_gpu_hour;
        a.live_usd_per_hour = (hourly != u.p.cost.usd_per_gpu_hour).then_some(hourly);
        a.answer = Some(answer);
        self.timeline.push(now + answer.first_ms, Ev::First(id, g));
        if (200..300).contains(&answer.status) {
            self.timeline
                .push(now + answer.done_ms.max(answer.first_ms), Ev::Done(id, g));
        }
    }

    /// Attempt `id`'s slot (if it held one) is free at `now`: the next
    /// waiting attempt starts.
    fn release(&mut self, id: u32, g: u32, now: u64) {
        let Some(a) = self.attempts.get(id, g) else {
            return;
        };
        if !std::mem::replace(&mut a.held_slot, false) {
            return;
        }
        let d = usize::from(a.dest);
        let Some(u) = self.up.get_mut(d) else { return };
        u.finish();
        if !u.must_queue() {
            if let Some((next, ng)) = u.queue.pop_front() {
                self.admit(next, ng, now);
            }
        }
    }

    /// Destination `d` is evicted at `now`: what runs there breaks, what
    /// waits there is refused.
    fn evict(&mut self, d: usize, now: u64) {
        let queued: Vec<(u32, u32)> = self
            .up
            .get_mut(d)
            .map(|u| u.queue.drain(..).collect())
            .unwrap_or_default();
        let running: Vec<(u32, u32)> = self
            .attempts
            .slots
            .iter()
            .enumerate()
            .filter(|(_, a)| a.live && a.sent && usize::from(a.dest) == d && a.answer.is_some())
            .map(|(i, a)| (i as u32, a.generation))
            .collect();
        for (id, g) in queued {
            if let Some(a) = self.attempts.get(id, g) {
                a.broken = true;
                a.answer = Some(Answer::failed(503));
                self.timeline.push(now, Ev::First(id, g));
            }
        }
        for (id, g) in running {
            if let Some(a) = self.attempts.get(id, g) {
                a.broken = true;
                self.timeline.push(now, Ev::Done(id, g));
            }
        }
    }

    /// Attempt `id`'s response headers arrived.
    fn first(
        &mut self,
        policy: &mut dyn Policy,
        events: &mut Option<&mut dyn std::io::Write>,
        id: u32,
        g: u32,
        now: u64,
    ) -> std::io::Result<()> {
        let Some(a) = self.attempts.get(id, g) else {
            return Ok(());
        };
        let Some(answer) = a.answer else {
            return Ok(());
        };
        let (r, d, n, broken) = (a.req, usize::from(a.dest), a.n, a.broken);
        let tried = std::mem::take(&mut a.tried);
        let ok = (200..300).contains(&answer.status);
        if ok && broken {
            // Broken before its headers: the Done already queued ends it.
            if let Some(a) = self.attempts.get(id, g) {
                a.tried = tried;
            }
            return Ok(());
        }
        let next = policy.answered(&self.world(now), &Answered::new(r, d, &answer, n, &tried));
        self.drain(policy, events)?;
        if ok {
            self.metrics.first_byte(r, now);
            if let Some(a) = self.attempts.get(id, g) {
                a.tried = tried;
            }
            return Ok(());
        }
        self.release(id, g, now);
        self.attempts.end(id);
        match next {
            Next::Retry { after_ms, route } => {
                self.route(policy, events, now, r, n + 1, tried, route, after_ms)
            }
            Next::Deliver => {
                let req = self.req(r);
                policy.finished_without_service(&self.world(now), r);
                self.finish_request(
                    policy,
                    r,
                    &req,
                    RequestOutcome::failed(answer.status, now.saturating_sub(req.at_ms), d),
                    None,
                );
                self.drain(policy, events)
            }
        }
    }

    /// Attempt `id`'s response is over (whole, or broken by an eviction).
    fn done(
        &mut self,
        policy: &mut dyn Policy,
        events: &mut Option<&mut dyn std::io::Write>,
        id: u32,
        g: u32,
        now: u64,
    ) -> std::io::Result<()> {
        let Some(a) = self.attempts.get(id, g) else {
            return Ok(());
        };
        let (r, d, broken) = (a.req, usize::from(a.dest), a.broken);
        let live_usd_per_hour = a.live_usd_per_hour;
        let served_model = a.model.clone();
        let answer = a.answer.unwrap_or(Answer::failed(0));
        self.release(id, g, now);
        self.attempts.end(id);
        let req = self.req(r);
        policy.done(&self.world(now), r, d, !broken);
        self.finish_request(
            policy,
            r,
            &req,
            RequestOutcome {
                status: answer.status,
                served: !broken,
                e2e_ms: now.saturating_sub(req.at_ms),
                dest: Some(d),
                cold: answer.cold,
                overage: answer.overage,
                live_usd_per_hour,
                cache_read: if broken { 0 } else { answer.cached },
            },
            served_model.as_deref(),
        );
        self.drain(policy, events)
    }
}

fn drain(
    policy: &mut dyn Policy,
    events: &mut Option<&mut dyn std::io::Write>,
) -> std::io::Result<()> {
    if let Some(w) = events {
        let bytes = policy.take_events();
        if !bytes.is_empty() {
            w.write_all(&bytes)?;
        }
    }
    Ok(())
}
