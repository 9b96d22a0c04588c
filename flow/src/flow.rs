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
use crate::budget;
use crate::cache::{self, Entry, Pending};
use crate::counters::{Counter, Fleet};
use crate::event::{self, Event, Text};
use crate::headers::{self, Pairs};
use crate::headroom;
use crate::prefix;
use crate::request::{self, Lookup, Refused};
use crate::rerun::{self, Carry, Parking};
use crate::routing::{self, Routed};
use crate::upstream;
use crate::usage::UsageScanner;
use ace_config::Api;
use ace_config::Warmth;
use ace_config::{Config, ConfigError, Trusted};
use ace_core::cost::CostModel;
use ace_core::dispatch::{Decision, Held, Refusal, Request};
use ace_core::fleet::{FleetState, LivePrices};
use ace_core::health::{Change, HealthPolicy, Outcome};
use ace_core::tables::Tables;
use std::cell::RefCell;
use std::sync::Arc;

pub use crate::rerun::{RETRY_HEADER, RETRY_REASON};

/// The response headers the flow reads, for hosts that read a header map
/// in one pass ([`Host::response_header`] asks for them one at a time).
pub const RESPONSE_HEADERS: [&str; 5] = [
    ":status",
    "retry-after",
    "retry-after-ms",
    "content-type",
    request::UPSTREAM_TIME_HEADER,
];

/// The fleet's shared state could not be read or written (the host has
/// logged why).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetUnavailable;

/// One change the flow makes to the fleet's shared state (health,
/// in-flight counts, prices): the only way a request touches it.
#[derive(Debug)]
pub enum FleetOp<'r, 'p> {
    /// Decide among the `feasible` destinations (warm for `model` as the
    /// control service last said) and claim a slot on the one chosen
    /// ([`FleetState::decide`]).
    Claim {
        /// Feasible destinations (a bitmask).
        feasible: &'r [u64],
        /// The model asked for, for warmth.
        model: Option<&'r str>,
        /// The request as the merit order sees it.
        req: &'r Request,
        /// What each destination holds of its prompt (prefix locality).
        held: Held<'r>,
    },
    /// Decide among a request's (destination, model) pairs under model
    /// routing, each destination warm for and priced at the model it would
    /// serve ([`FleetState::decide_scaled`]), and claim a slot.
    ClaimRouted {
        /// The pairs.
        routed: &'r mut Routed<'p>,
        /// The request as the merit order sees it.
        req: &'r Request,
        /// What each destination holds of its prompt (prefix locality).
        held: Held<'r>,
    },
    /// Fold an answer's outcome into destination `d`'s health, keeping
    /// its slot: a success still streaming holds its place in the
    /// server's batch until its last byte ([`FleetState::observe`]).
    Observe {
        /// The destination.
        d: usize,
        /// What happened.
        outcome: Outcome,
        /// The health tunables.
        policy: &'r HealthPolicy,
    },
    /// Learn from an answer's first byte on destination `d`
    /// ([`FleetState::learn`]): what this copy of the state expects of
    /// `d`'s time to first token. Never shared between copies: a host
    /// applies it to its own copy ([`FleetOp::is_local`]).
    Learn {
        /// The destination.
        d: usize,
        /// Its load band when the request was sent there.
        band: u8,
        /// From the request sent to the answer's first byte, ms.
        ttft_ms: u64,
        /// The request's tenant key.
        tenant: u32,
        /// The health tunables (the learning's among them).
        policy: &'r HealthPolicy,
    },
    /// Release destination `d`'s slot and fold in the request's outcome
    /// (`None`: the client went away, or the outcome was already
    /// observed: blame no one) ([`FleetState::settle`]).
    Settle {
        /// The destination.
        d: usize,
        /// What happened.
        outcome: Option<Outcome>,
        /// The health tunables.
        policy: &'r HealthPolicy,
    },
}

/// What a [`FleetOp`] came to.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetAnswer {
    /// A claim's decision and the control service's prices on the
    /// destination chosen (what the request is priced with), or why no
    /// destination may take the request.
    Claimed(Result<(Decision, LivePrices), Refusal>),
    /// A settle's effect on the destination's health.
    Settled(Change),
}

impl FleetOp<'_, '_> {
    /// Apply the op to `state`, current at `now_ms`, with `warmth`: the
    /// destination it changed (to store and reprice; `None` for a refusal)
    /// and its answer.
    #[inline]
    pub fn apply(
        &mut self,
        state: &mut FleetState,
        warmth: &Warmth,
        now_ms: u64,
    ) -> (Option<usize>, FleetAnswer) {
        match self {
            FleetOp::Claim {
                feasible,
                model,
                req,
                held,
            } => {
                let warm = warmth.mask(*model);
                let d = if held.is_none() {
                    state.decide(feasible, warm, req, now_ms)
                } else {
                    state.decide_held(feasible, warm, &[], *held, req, now_ms)
                };
                claimed(state, d)
            }
            FleetOp::ClaimRouted { routed, req, held } => {
                let (feasible, warm, scale) = routed.parts(warmth);
                let d = state.decide_held(feasible, warm, scale, *held, req, now_ms);
                claimed(state, d)
            }
            FleetOp::Learn {
                d,
                band,
                ttft_ms,
                tenant,
                policy,
            } => {
                let moved = state.learn(*d, *band, *ttft_ms, *tenant, policy);
                (moved.then_some(*d), FleetAnswer::Settled(Change::None))
            }
            FleetOp::Observe { d, outcome, policy } => (
                Some(*d),
                FleetAnswer::Settled(state.observe(*d, *outcome, policy, now_ms)),
            ),
            FleetOp::Settle { d, outcome, policy } => (
                Some(*d),
                FleetAnswer::Settled(state.settle(*d, *outcome, policy, now_ms)),
            ),
        }
    }

    /// The whole transaction on a state the host holds in its own memory:
    /// for a claim, the slate brought up to `now_ms` under `models` and
    /// `policy` (a decision reads every destination's price at `now_ms`);
    /// the op applied; the destination it changed repriced. A settle
    /// changes one destination and reprices it, and leaves the others'
    /// timed changes to the next claim's advance, which sees them alike.
    pub fn run(
        mut self,
        state: &mut FleetState,
        warmth: &Warmth,
        models: &[CostModel],
        policy: &HealthPolicy,
        now_ms: u64,
    ) -> FleetAnswer {
        if !matches!(
            self,
            FleetOp::Settle { .. } | FleetOp::Observe { .. } | FleetOp::Learn { .. }
        ) {
            state.advance(models, policy, now_ms);
        }
        let (changed, answer) = self.apply(state, warmth, now_ms);
        if let Some(d) = changed {
            state.reprice(d, models, policy, now_ms);
        }
        answer
    }

    /// The destination a settle only releases a slot of, changing no
    /// health (a success within its SLO, or the client gone, on a
    /// destination with no failures to clear): a host that pays for every
    /// write may owe that release to its next write instead.
    #[inline]
    pub fn quiet_release(&self, state: &FleetState, now_ms: u64) -> Option<usize> {
        match self {
            FleetOp::Settle { d, outcome, policy } => {
                state.is_quiet(*d, *outcome, policy, now_ms).then_some(*d)
            }
            _ => None,
        }
    }

    /// Whether the op changes only the host's own copy of the state (what
    /// it learned), never the state its copies share.
    #[inline]
    pub fn is_local(&self) -> bool {
        matches!(self, FleetOp::Learn { .. })
    }

    /// Whether the op changes nothing at all: an observed outcome that is
    /// quiet (see [`FleetOp::quiet_release`]) on a destination it leaves
    /// as it was. A host that pays for every write skips it.
    #[inline]
    pub fn is_noop(&self, state: &FleetState, now_ms: u64) -> bool {
        match self {
            FleetOp::Observe { d, outcome, policy } => {
                state.is_quiet(*d, Some(*outcome), policy, now_ms)
            }
            _ => false,
        }
    }
}

#[inline]
fn claimed(state: &FleetState, d: Result<Decision, Refusal>) -> (Option<usize>, FleetAnswer) {
    let changed = d.as_ref().ok().map(|d| d.index);
    let d = d.map(|d| {
        let live = state.live_prices(d.index);
        (d, live)
    });
    (changed, FleetAnswer::Claimed(d))
}

/// A claim through `host`: the decision, why there is none, or that the
/// fleet state could not be reached.
fn claim<H: Host>(
    host: &mut H,
    now_ms: u64,
    op: FleetOp<'_, '_>,
) -> Result<Result<(Decision, LivePrices), Refusal>, FleetUnavailable> {
    match host.fleet(now_ms, op)? {
        FleetAnswer::Claimed(d) => Ok(d),
        FleetAnswer::Settled(_) => Err(FleetUnavailable),
    }
}

/// What only Envoy can do for a request, as the flow needs it. Every
/// method is infallible or reports failure in its result: a host never
/// panics, it logs and answers.
pub trait Host {
    /// The clock, ms since the Unix epoch.
    fn now_ms(&mut self) -> u64;

    /// A new event id, unique across every worker (see
    /// [`request::EventIds`]).
    fn next_event_id(&mut self) -> [u8; 32];

    /// The request headers, whole (empty if they cannot be read: every
    /// attribute is then unknown, and the policy fails closed).
    fn request_headers(&mut self) -> Pairs;

    /// Remove every value of request header `name`; false if the host
    /// could not.
    fn remove_request_header(&mut self, name: &str) -> bool;

    /// Set request header `name` to `value`, replacing every earlier
    /// value; false if the host could not.
    fn set_request_header(&mut self, name: &str, value: &str) -> bool;

    /// Add `value` to request header `name`, keeping its earlier values
    /// (a re-run puts a repeated header back, [`rerun::restore`]); false
    /// if the host could not (the default).
    fn add_request_header(&mut self, name: &str, value: &str) -> bool {
        let _ = (name, value);
        false
    }

    /// Make Envoy select the route again after the destination header
    /// changed (a no-op where the host does it on its own).
    fn clear_route_cache(&mut self);

    /// The request body that arrived with this body callback: append up
    /// to `room` bytes of it to `into`, and return how many arrived.
    fn request_body(&mut self, into: &mut Vec<u8>, room: usize) -> usize;

    /// A verified attribute's value (dynamic metadata, the mTLS peer), or
    /// `None` when the source has none or this host cannot read it.
    fn trusted(&mut self, source: &Trusted) -> Option<Vec<u8>>;

    /// `f` of response header `name`'s value (`None` when absent).
    fn response_header<R>(&mut self, name: &str, f: impl FnOnce(Option<&[u8]>) -> R) -> R;

    /// Set response header `name` to `value`.
    fn set_response_header(&mut self, name: &str, value: &str);

    /// Every response header, `f(name, value)` for each, in one pass.
    fn each_response_header(&mut self, f: impl FnMut(&[u8], &[u8]));

    /// Calls `f` on each chunk of the response body that arrived with this
    /// body callback.
    fn response_body(&mut self, f: impl FnMut(&[u8]));

    /// Answer the request from the proxy: `status`, a JSON `body`, and
    /// `details` for Envoy's response-code details; false if the host
    /// could not.
    fn send_local(&mut self, status: u32, body: &[u8], details: &str) -> bool {
        self.send_local_with(status, body, details, &[])
    }

    /// [`Host::send_local`] with `headers` besides its content type (a
    /// budget's 429 carries `retry-after`).
    fn send_local_with(
        &mut self,
        status: u32,
        body: &[u8],
        details: &str,
        headers: &[(&str, &str)],
    ) -> bool;

    /// The status Envoy answered with, when it answered without the
    /// filter seeing the answer (its 413 while the body was held).
    fn envoy_response_code(&mut self) -> Option<u32>;

    /// Hand the request's event line to Envoy's access log.
    fn write_event(&mut self, line: &[u8]) -> bool;

    /// Count `n` on `counter`.
    fn count(&mut self, counter: Counter, n: u64);

    /// Run `op` on the fleet's shared state at `now_ms`, as one
    /// transaction: the host brings its copy of the state up to `now_ms`,
    /// runs [`FleetOp::apply`] with the warmth the control service last
    /// gave it ([`crate::control::Outside`]), and stores the destination
    /// the op changed (repriced). A host whose store can refuse a write
    /// (the Wasm filter's compare-and-swap in shared data) may run `apply`
    /// again on a fresher copy; an op is safe to re-run. What the op does
    /// is the flow's, never the host's: [`FleetOp::run`] is the whole
    /// transaction for a host that holds the state in its own memory.
    fn fleet(&mut self, now_ms: u64, op: FleetOp<'_, '_>) -> Result<FleetAnswer, FleetUnavailable>;

    /// Where this host keeps what a re-run takes over from the run it
    /// replaces ([`rerun`]), shared by every worker; `None` (the default):
    /// this host cannot run a request again within the same request, and
    /// `retry_next` is ignored.
    fn parking(&self) -> Option<&Parking> {
        None
    }

    /// Whether this host can run a request again within the same request
    /// (`retry_next`): it keeps a [`Parking`].
    fn can_rerun(&self) -> bool {
        self.parking().is_some()
    }

    /// Whether Envoy holds the whole request body, `bytes` long, to run
    /// the request again.
    fn replayable(&mut self, bytes: usize) -> bool {
        let _ = bytes;
        false
    }

    /// Mark this run of the request as replaced by a re-run (its access
    /// log line carries no event), or not.
    fn mark_superseded(&mut self, superseded: bool) {
        let _ = superseded;
    }

    /// Whether this host can replace the held request body
    /// ([`Host::replace_request_body`]). Model routing substitutes a model
    /// only on a host that can: the upstream serves the model its body
    /// names.
    fn can_replace_request_body(&self) -> bool {
        false
    }

    /// Replace the whole held request body with `body` (and its
    /// `content-length`); false if the host could not.
    fn replace_request_body(&mut self, body: &[u8]) -> bool {
        let _ = body;
        false
    }

    /// Whether this host can replace a response body chunk as it passes
    /// ([`Host::replace_response_chunk`]). ACE asks a stream for its usage
    /// on the client's behalf only on a host that can give the client back
    /// the stream it asked for ([`crate::stream_usage`]).
    fn can_replace_response_body(&self) -> bool {
        false
    }

    /// Replace the response body chunk of this callback with `bytes`;
    /// false if the host could not.
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> bool {
        let _ = bytes;
        false
    }

    /// The cache entry in `slot` ([`crate::cache`]), appended to `into`;
    /// false when there is none or this host keeps no cache.
    fn cache_get(&mut self, slot: u32, into: &mut Vec<u8>) -> bool {
        let _ = (slot, into);
        false
    }

    /// Store `entry` in `slot`, replacing what it held; false if the host
    /// could not (or keeps no cache).
    fn cache_put(&mut self, slot: u32, entry: &[u8]) -> bool {
        let _ = (slot, entry);
        false
    }

    /// The secret that keys prefix locality's table
    /// ([`crate::prefix::Secret`]): drawn once at random and shared by
    /// every worker whose table is shared. `None` (the default): no
    /// locality on this host.
    fn locality_secret(&mut self) -> Option<prefix::Secret> {
        None
    }

    /// Slot `slot` of prefix locality's table, shared by every worker
    /// ([`crate::prefix::Table::get`]).
    fn locality_get(&mut self, _slot: u32, _into: &mut [u8; prefix::RECORD_BYTES]) -> bool {
        false
    }

    /// Store slot `slot` of prefix locality's table.
    fn locality_put(&mut self, _slot: u32, _bytes: &[u8; prefix::RECORD_BYTES]) -> bool {
        false
    }

    /// Answer the request from the cache: `status`, `content_type` and
    /// `body` as stored; false if the host could not.
    fn send_cached(&mut self, status: u32, content_type: &str, body: &[u8]) -> bool {
        let _ = (status, content_type, body);
        false
    }

    /// The control service's latest reading of budget `b`, as this host
    /// holds it ([`crate::control::Outside::budget`]); an empty one when
    /// it has none (the default: a host without a control service).
    fn budget_reading(&mut self, b: u16) -> budget::Reading {
        let _ = b;
        budget::Reading::default()
    }

    /// Run `f` on budget `slot`'s counters in memory every worker of this
    /// proxy shares, atomically, storing them when `f` returns `true`
    /// ([`budget::Cells::update`]); false when they cannot be reached.
    /// The default keeps none: such a host enforces a budget by the
    /// readings alone (its own spend since them is not counted).
    fn budget_cell(
        &mut self,
        slot: u32,
        f: &mut dyn FnMut(&mut [u8; budget::CELL_BYTES]) -> bool,
    ) -> bool {
        let _ = (slot, f);
        false
    }
}

/// The host's shared memory as the budgets' cells.
struct HostCells<'h, H: Host>(&'h mut H);

impl<H: Host> budget::Cells for HostCells<'_, H> {
    fn update(
        &mut self,
        slot: u32,
        f: &mut dyn FnMut(&mut [u8; budget::CELL_BYTES]) -> bool,
    ) -> bool {
        self.0.budget_cell(slot, f)
    }

    fn reading(&mut self, b: u16) -> budget::Reading {
        self.0.budget_reading(b)
    }
}

/// What a request a tenant budget counts reserved when it was routed:
/// settled to what it booked when it ends.
#[derive(Debug, Clone, Copy)]
struct Hold {
    /// The tenant's value index (its budgets: `Budgeting::of`).
    tenant: u32,
    /// Cost reserved, nano-USD.
    nano: i64,
    /// Tokens reserved.
    tokens: u32,
    /// The minute they count in.
    minute: u32,
    /// The soft budget it was served under, if any.
    soft: Option<u16>,
}

/// What the adapter tells Envoy after a callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let the request or response go on.
    Continue,
    /// Hold the request until more of its body has arrived.
    Hold,
    /// The request was answered locally: stop it here.
    Answered,
    /// Ask Envoy to run the request again (see [`Host::can_rerun`]); if it
    /// will not, call [`Flow::not_rerun`].
    Rerun,
}

/// Everything a request needs of one configuration, built once.
#[derive(Debug)]
pub struct Setup {
    /// The validated configuration.
    pub config: Config,
    /// The compiled policy tables, borrowed zero-copy.
    pub tables: Option<Tables<'static>>,
    /// Destination names, shared with each request's event.
    pub names: Vec<Arc<str>>,
    /// Model routing, built against the tables; none when not configured.
    pub routing: Option<routing::Routing>,
    /// The response cache's parameters, built against the tables; none
    /// when not configured.
    pub cache: Option<cache::Cache>,
    /// Prefix locality, built against the destinations; none when not
    /// configured.
    pub locality: Option<prefix::Locality>,
    /// Tenant budgets, built against the tables; none when not configured.
    pub budgets: Option<budget::Budgeting>,
}

impl Setup {
    /// The setup of `config`: its routing and cache built against its
    /// tables, or the configuration error that names what is wrong.
    pub fn new(config: Config) -> Result<Setup, ConfigError> {
        let tables = config.tables();
        let names = config.names();
        let ids: Vec<&str> = config
            .destinations
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        let routing = config
            .model_routing
            .as_ref()
            .map(|r| routing::Routing::build(r, tables.as_ref(), &ids))
            .transpose()?;
        let cache = config
            .cache
            .as_ref()
            .map(|c| cache::Cache::build(c, tables.as_ref()))
            .transpose()?;
        let locality = prefix::Locality::build(&config)?;
        let budgets = budget::Budgeting::build(&config, tables.as_ref());
        Ok(Setup {
            budgets,
            tables,
            names,
            routing,
            cache,
            locality,
            config,
        })
    }

    /// Parse, validate and build the plugin configuration `bytes`: what a
    /// host does when a configuration arrives.
    pub fn parse(bytes: &[u8]) -> Result<Setup, ConfigError> {
        Setup::new(Config::parse(bytes)?)
    }

    /// The same for a configuration a filter ran with, to price its events
    /// ([`Config::parse_for_pricing`]).
    pub fn parse_for_pricing(bytes: &[u8]) -> Result<Setup, ConfigError> {
        Setup::new(Config::parse_for_pricing(bytes)?)
    }

    /// Log what the configuration does, and what this host will not do of
    /// it (`can_rerun`: see [`Host::can_rerun`]).
    pub fn announce(&self, can_rerun: bool) {
        log::info!("{}", self.config.summary());
        if self.config.no_policy {
            log::warn!(
                "allow_no_policy: routing without policy tables, every destination is feasible for every request (counted in ace.requests_without_policy)"
            );
        }
        if let Some(w) = ace_config::budget::unverified_tenant_in(&self.config) {
            log::warn!("{w}");
        }
        if self.config.retry_next && !can_rerun {
            log::warn!(
                "retry_next is ignored: only the dynamic module can run a request again; failures spill from the next request"
            );
        }
    }
}

/// Buffers one worker reuses for every request, so that a warm worker
/// allocates little per request.
#[derive(Debug, Default)]
pub struct Worker {
    /// The feasibility lookup's buffers.
    pub lookup: Lookup,
    /// The event's JSON line, rewritten in place for every write.
    pub event_line: Vec<u8>,
    /// A request's (destination, model) pairs under model routing.
    pub pairs: routing::Pairs,
    /// A cache entry as read.
    pub entry: Vec<u8>,
    /// Cache hits on this worker (every `cache.check_every`-th is checked).
    pub hits: u64,
    /// Scratch mask.
    pub scratch: Vec<u64>,
    /// What each destination holds of a request's prompt.
    pub held: prefix::HeldBuf,
}

/// The host's shared memory as prefix locality's table.
struct HostTable<'h, H: Host>(&'h mut H);

impl<H: Host> prefix::Table for HostTable<'_, H> {
    fn get(&mut self, slot: u32, into: &mut [u8; prefix::RECORD_BYTES]) -> bool {
        self.0.locality_get(slot, into)
    }
    fn put(&mut self, slot: u32, bytes: &[u8; prefix::RECORD_BYTES]) -> bool {
        self.0.locality_put(slot, bytes)
    }
}

/// `f` on `worker`'s buffers, or on fresh ones if they are in use (a
/// re-entrant call from the host: never expected, never a panic).
fn with_worker<R>(worker: &RefCell<Worker>, f: impl FnOnce(&mut Worker) -> R) -> R {
    match worker.try_borrow_mut() {
        Ok(mut w) => f(&mut w),
        Err(_) => f(&mut Worker::default()),
    }
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

/// What the rungs came to, inside the worker's buffers.
enum Climbed {
    /// A destination claimed (the decision is the flow's `chosen`), with
    /// the member served when model routing chose one other than the
    /// model named, and, for a routed request, the counterfactual it books
    /// against.
    Claimed(
        Option<usize>,
        Option<Option<Counterfactual>>,
        LivePrices,
        Decision,
    ),
    /// The cache has an answer the request may have (in the worker's
    /// `entry` buffer).
    Hit,
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
    served: Option<usize>,
    cf: Option<Option<Counterfactual>>,
    pending: Option<Box<Pending>>,
    live: LivePrices,
}

/// A claim: the decision, the routing member served (when another than
/// the one named), a routed request's counterfactual, and the control
/// service's prices on the destination chosen.
type Claim = (
    Decision,
    Option<usize>,
    Option<Option<Counterfactual>>,
    LivePrices,
);

/// One request, feasibility done, as the rungs see it. The rungs are
/// tried in order, each on the feasible set the tables gave:
///
/// 1. [`Ask::cache_rung`]: an exact answer already given, that policy
///    lets this request have (`cached` true, from the producer's
///    destination);
/// 2. [`Ask::routed_rung`]: a permitted cheaper model (model routing),
///    each (destination, model) pair priced in one merit order;
/// 3. [`Ask::merit_rung`]: the merit order over the feasible
///    destinations, for the model named.
///
/// Nothing here adds a destination: every rung reads the tables' masks.
struct Ask<'a> {
    setup: &'a Setup,
    event: &'a Event,
    req: &'a Request,
    /// The body as received (the cache key; the routing rewrite).
    raw: Option<&'a [u8]>,
    /// Model routing, where this request may be routed.
    routing: Option<&'a crate::routing::Routing>,
    /// The destination that failed this request (a re-run excludes it).
    excluded: Option<usize>,
    /// The API the client's path asks for.
    api: Option<Api>,
    /// What each destination holds of the prompt (prefix locality).
    held: Held<'a>,
    /// The destinations a soft budget allows (none: no soft budget).
    soft: Option<&'a [u64]>,
    /// A soft budget allows only a substitute model.
    substitution_only: bool,
    now: u64,
}

/// What the cache rung came to.
enum CacheRung {
    /// Nothing to look up (no body or tables to key on).
    Skip,
    /// Answer from the entry in the worker's buffer.
    Hit,
    /// Go on up the rungs: a miss to store, or a hit to check upstream.
    Pending(Box<Pending>),
}

impl Ask<'_> {
    #[inline]
    fn model(&self) -> Option<&str> {
        self.event.text(&self.event.model_requested)
    }

    /// The rungs in order: the cache (when `cacheable`), model routing,
    /// the merit order.
    fn climb<H: Host>(
        &self,
        cacheable: Option<&cache::Cache>,
        w: &mut Worker,
        host: &mut H,
    ) -> Result<(Climbed, Option<Box<Pending>>), Stop> {
        let pending = match cacheable {
            Some(c) => match self.cache_rung(c, w, host) {
                CacheRung::Hit => return Ok((Climbed::Hit, None)),
                CacheRung::Pending(p) => Some(p),
                CacheRung::Skip => None,
            },
            None => None,
        };
        let claimed = match self.routed_rung(w, host) {
            Some(routed) => routed?,
            // Only a substitute may serve, and none can.
            None if self.substitution_only => {
                return Err(Stop::NoDestination(Refusal::NoFeasibleDestination));
            }
            None => self.merit_rung(w, host)?,
        };
        let (decision, served, cf, live) = claimed;
        Ok((Climbed::Claimed(served, cf, live, decision), pending))
    }

    /// The cache: an entry for this exact request, young enough, that
    /// policy lets this request have. A cached answer is checked against
    /// the configured classes even where this request cannot be routed
    /// (trailers, a body that cannot be replaced): an entry a substitute
    /// produced is then still `substituted` to the model named.
    fn cache_rung<H: Host>(&self, c: &cache::Cache, w: &mut Worker, host: &mut H) -> CacheRung {
        let (cfg, event, now) = (&self.setup.config, self.event, self.now);
        let (Some(raw), Some(tables)) = (self.raw, self.setup.tables.as_ref()) else {
            return CacheRung::Skip;
        };
        let configured = self.setup.routing.as_ref();
        let named = configured.zip(self.model()).and_then(|(r, m)| r.asked(m));
        let key = cache::key(
            &cfg.id,
            &w.lookup.values,
            event.bytes(&event.tenant),
            event.bytes(&event.data_class),
            event.headers.get(":path"),
            raw,
        );
        let slot = c.slot(&key);
        let found = {
            w.entry.clear();
            host.cache_get(slot, &mut w.entry)
        };
        let hit = found
            .then(|| Entry::decode(&w.entry))
            .flatten()
            .filter(|e| e.key == key && now.saturating_sub(e.created_ms) < c.ttl_ms)
            .filter(|e| {
                cache::may_serve(
                    cfg,
                    tables,
                    &mut w.lookup,
                    &mut w.scratch,
                    c,
                    configured,
                    named,
                    e,
                )
            })
            .map(|e| e.digest);
        let mut p = Box::new(Pending {
            key,
            slot,
            ..Pending::default()
        });
        match hit {
            Some(digest) => {
                w.hits = w.hits.wrapping_add(1);
                if c.check_every > 0 && w.hits.is_multiple_of(c.check_every) {
                    // Checked: answered upstream, then compared.
                    p.check = Some(digest);
                } else {
                    return CacheRung::Hit;
                }
            }
            None => host.count(Fleet::CacheMisses.into(), 1),
        }
        CacheRung::Pending(p)
    }

    /// Model routing: every (destination, model) pair the tables allow
    /// for the models that may stand in for the one named, in one merit
    /// order, each at its model's price there; `None` when this request is
    /// not routed.
    fn routed_rung<H: Host>(&self, w: &mut Worker, host: &mut H) -> Option<Result<Claim, Stop>> {
        let r = self.routing?;
        let asked = r.asked(self.model()?)?;
        let tables = self.setup.tables.as_ref()?;
        // A soft budget that allows substitutes only: never the model
        // named, each destination at the cheapest substitute it serves.
        let named = self
            .substitution_only
            .then(|| {
                asked.member.or_else(|| {
                    r.reference(asked)
                        .and_then(|m| r.members.iter().position(|x| x == m))
                })
            })
            .flatten();
        r.expand_without(tables, &mut w.lookup.values, asked, named, &mut w.pairs);
        // Only destinations serving the request's API (a routed body is
        // always rewritable, so every upstream name can be sent).
        self.setup
            .config
            .serving
            .narrow(self.api, &mut w.pairs.mask);
        // A soft budget: its tiers only.
        if let Some(m) = self.soft {
            for (a, b) in w.pairs.mask.iter_mut().zip(m) {
                *a &= b;
            }
        }
        // The counterfactual: the model named (a class's reference model),
        // not substituted, at its price.
        if asked.member.is_none()
            && tables
                .feasible(&w.lookup.values, &mut w.lookup.mask)
                .is_err()
        {
            w.lookup.mask.fill(0);
        }
        let reference = r.reference(asked).map_or(usize::MAX, |m| {
            r.members.iter().position(|x| x == m).unwrap_or(usize::MAX)
        });
        let cf = counterfactual(&self.setup.config, &w.lookup.mask, self.req, |d| {
            r.factor(reference, d)
        });
        if let Some(d) = self.excluded {
            clear_bit(&mut w.pairs.mask, d);
        }
        let mut routed = Routed::new(&mut w.pairs, r);
        let op = FleetOp::ClaimRouted {
            routed: &mut routed,
            req: self.req,
            held: self.held,
        };
        let (decision, live) = match claim(host, self.now, op) {
            Ok(Ok(d)) => d,
            Ok(Err(refusal)) => return Some(Err(Stop::NoDestination(refusal))),
            Err(FleetUnavailable) => return Some(Err(Stop::Fleet)),
        };
        let served = w
            .pairs
            .member(decision.index)
            .filter(|m| Some(*m) != asked.member);
        Some(Ok((decision, served, Some(cf), live)))
    }

    /// The merit order over the feasible destinations.
    fn merit_rung<H: Host>(&self, w: &mut Worker, host: &mut H) -> Result<Claim, Stop> {
        if let Some(d) = self.excluded {
            // The destination that just failed this request.
            clear_bit(&mut w.lookup.mask, d);
        }
        let op = FleetOp::Claim {
            feasible: &w.lookup.mask,
            model: self.model(),
            req: self.req,
            held: self.held,
        };
        let (decision, live) = claim(host, self.now, op)
            .map_err(|_| Stop::Fleet)?
            .map_err(Stop::NoDestination)?;
        Ok((decision, None, None, live))
    }
}

/// The counterfactual of a routed request: the cheapest pay-as-you-go
/// destination the tables allow for the model named, at that model's
/// price there.
#[derive(Clone, Copy)]
struct Counterfactual {
    index: usize,
    usd: f64,
    scale: f64,
}

/// Why routing stopped before a decision.
enum Stop {
    Refused(Refused),
    /// A tenant budget refuses it.
    Budget(budget::Refusal),
    /// No destination may take the request.
    NoDestination(Refusal),
    Fleet,
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
        let head = request::capture(cfg, headers, now, host.next_event_id());
        // Only a host that re-runs requests reads re-run marks (a host that
        // cannot never acts on one, so it skips the lookup).
        let mark = host
            .can_rerun()
            .then(|| head.event.headers.get(RETRY_HEADER))
            .flatten();
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
            if cfg.retry_next && host.can_rerun() {
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
    /// routing rewrites it; the cache keys on it).
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
        let excluded = self.rerun.as_ref().map(|c| c.failed);
        let carried = self.rerun.as_deref();
        let Some(event) = self.event.as_mut() else {
            return self.internal(host, "request not captured");
        };
        let mut req = request::plan(cfg, event, body, self.content_length, now);
        let body_model = body.and_then(|b| b.model.as_deref());
        // Model routing only where the body can say the model served: read
        // whole, naming a model, on a host that can replace it, and not
        // ended by trailers (Envoy has passed the body on by then, and a
        // rewrite could only be appended).
        let trailers = self.trailers;
        let rewritable =
            raw.is_some() && body_model.is_some() && !trailers && host.can_replace_request_body();
        let routing = setup.routing.as_ref().filter(|_| rewritable);
        let api = event.headers.get(":path").and_then(Api::of_path);
        event.api = api.map(Api::name);
        // A completion streamed without `stream_options`: ask for its usage
        // (the client still gets the stream it asked for).
        let ask_usage = rewritable
            && host.can_replace_response_body()
            && matches!(api, Some(Api::ChatCompletions | Api::Completions))
            && body.is_some_and(|b| b.stream && !b.stream_options);
        // The cache only for requests safe to answer twice, and never for
        // ACE's own re-run of a failed request.
        let cacheable = setup
            .cache
            .as_ref()
            .filter(|_| excluded.is_none() && body.is_some_and(|b| b.cacheable) && raw.is_some());
        let chosen = &mut self.chosen;
        let mut hold: Option<Hold> = None;
        // Feasibility first (the compiled Cedar tables), then the rungs in
        // order, with this worker's lookup buffers.
        let climbed = with_worker(worker, |w| {
            request::feasible(
                cfg,
                setup.tables.as_ref(),
                event,
                body_model,
                // A re-run reads what its first run verified: a filter
                // before ACE may have consumed the header it verified.
                |source| {
                    carried
                        .and_then(|c| c.verified(cfg, source))
                        .or_else(|| host.trusted(source))
                },
                &mut w.lookup,
            )
            .map_err(Stop::Refused)?;
            let model = event.text(&event.model_requested);
            upstream::narrow(cfg, api, model, rewritable, &mut w.lookup.mask);
            // The tenant's budgets: refused, or narrowed when one is soft.
            let budgeted = setup.budgets.as_ref().and_then(|bg| {
                let t = cfg.policy.as_ref()?.tenant?;
                let tenant = w.lookup.values.get(t).copied()?;
                let mine = bg.of(tenant);
                (!mine.is_empty()).then_some((bg, tenant, mine))
            });
            let mut soft = None;
            if let Some((bg, tenant, mine)) = budgeted {
                let tokens = req.tokens_in.saturating_add(req.tokens_out);
                let allowed = bg
                    .admit(cfg, mine, tokens, now, &mut HostCells(&mut *host))
                    .map_err(Stop::Budget)?;
                if let Some(b) = allowed.soft {
                    let feasible = w.lookup.mask.iter().any(|m| *m != 0);
                    for (a, m) in w.lookup.mask.iter_mut().zip(bg.soft_mask(b)) {
                        *a &= m;
                    }
                    req.max_usd = allowed.max_usd_per_token * f64::from(tokens);
                    soft = Some((bg, b, feasible, allowed.substitution_only));
                }
                hold = Some(Hold {
                    tenant,
                    nano: 0,
                    tokens,
                    minute: budget::Budgeting::minute(now),
                    soft: allowed.soft,
                });
            }
            // Prefix locality: what each feasible destination holds of
            // this prompt (its buffers out of the worker while the rungs
            // borrow the rest).
            let mut held = std::mem::take(&mut w.held);
            let local = setup.locality.as_ref().and_then(|l| {
                let mut fp = body.map(|b| b.prefix).unwrap_or_default();
                if let Some(v) = l
                    .session_header
                    .as_deref()
                    .and_then(|h| event.headers.get(h))
                {
                    fp.hint_from_header(v);
                }
                if fp.is_empty() {
                    return None;
                }
                let secret = host.locality_secret()?;
                let who = prefix::Whose::of(event);
                let mut table = HostTable(&mut *host);
                let any = l.held(
                    &mut table,
                    &secret,
                    who,
                    &fp,
                    &w.lookup.mask,
                    now,
                    &mut held,
                );
                Some((l, fp, secret, any))
            });
            let ask = Ask {
                setup,
                event,
                req: &req,
                raw,
                routing,
                excluded,
                api,
                held: match local {
                    Some((_, _, _, true)) => held.as_held(),
                    _ => Held::NONE,
                },
                soft: soft.map(|(bg, b, _, _)| bg.soft_mask(b)),
                substitution_only: soft.is_some_and(|(_, _, _, s)| s),
                now,
            };
            let mut climbed = ask.climb(cacheable, w, host);
            // A soft budget left nothing that could serve a request its
            // policy allows: the budget's 429, not a fleet outage's 503.
            if let (Err(Stop::NoDestination(_)), Some((bg, b, true, _))) = (&climbed, soft) {
                if let Some(r) = bg.soft_refusal(cfg, b, now, &mut HostCells(&mut *host)) {
                    climbed = Err(Stop::Budget(r));
                }
            }
            if let (Ok((Climbed::Claimed(_, _, _, d), _)), Some((l, fp, secret, _))) =
                (&climbed, &local)
            {
                // The destination sent this prompt holds it from now.
                let who = prefix::Whose::of(event);
                l.record(
                    &mut HostTable(&mut *host),
                    secret,
                    who,
                    fp,
                    d.index,
                    now,
                    &held,
                );
                event.tokens_prefix_held = held.cached.get(d.index).copied().unwrap_or(0);
            }
            w.held = held;
            let (climbed, pending) = climbed?;
            if let Climbed::Claimed(_, _, _, decision) = &climbed {
                *chosen = Some((*decision, now));
                // What the budgets count from now: the estimate, settled
                // to what is booked when the request ends.
                if let (Some(h), Some((bg, _, mine))) = (hold.as_mut(), budgeted) {
                    h.nano = nano_usd(decision.marginal_usd);
                    let cells = &mut HostCells(&mut *host);
                    bg.book(mine, h.nano, i64::from(h.tokens), h.minute, now, cells);
                }
            } else {
                // From the cache: nothing booked upstream to count.
                hold = None;
            }
            Ok((climbed, pending))
        });
        if let Some(h) = hold {
            // A request run again releases its first run's reservation.
            if let Some(old) = self.budget.replace(h) {
                self.release(setup, host, old);
            }
            if let (Some(b), Some(e)) = (h.soft, self.event.as_mut()) {
                host.count(Fleet::BudgetSoft.into(), 1);
                e.budget = setup
                    .budgets
                    .as_ref()
                    .and_then(|bg| bg.names.get(usize::from(b)).cloned());
                e.budget_state = Some(budget::Why::Soft.state());
            }
        }
        let ((served, cf, live), pending) = match climbed {
            Ok((Climbed::Hit, _)) => return self.answer_from_cache(setup, worker, host, routing),
            Ok((Climbed::Claimed(served, cf, live, _), pending)) => ((served, cf, live), pending),
            Err(Stop::Refused(refused)) => return self.refuse(host, &refused),
            Err(Stop::Budget(r)) => return self.refuse_budget(setup, host, &r),
            Err(Stop::NoDestination(refusal)) => {
                host.count(Fleet::NoDestination.into(), 1);
                return self.refuse(host, &Refused::no_destination(refusal));
            }
            Err(Stop::Fleet) => {
                return self.refuse(
                    host,
                    &Refused {
                        status: 503,
                        kind: "internal",
                        reason: "shared_state",
                        message: "fleet state unavailable".to_string(),
                    },
                );
            }
        };
        let won = Won {
            api,
            ask_usage,
            served,
            cf,
            pending,
            live,
        };
        self.go(setup, host, won, raw, routing, now)
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
            served,
            cf,
            pending,
            live,
        } = won;
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
            if let (Some(sent), true) = (&sent, cfg.retry_next && host.can_rerun()) {
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
            let ok = host.send_cached(u32::from(entry.status), entry.content_type, entry.body);
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
        if !host.send_local(refused.status, &refused.body(), refused.reason) {
            log::error!("cannot send the local reply {}", refused.status);
        }
        Verdict::Answered
    }

    /// Answer a budget's refusal: 429, its body, `retry-after`.
    fn refuse_budget<H: Host>(
        &mut self,
        setup: &Setup,
        host: &mut H,
        r: &budget::Refusal,
    ) -> Verdict {
        let reason = budget::reason(r.why);
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
        if !host.send_local_with(429, &r.body, reason, &retry) {
            log::error!("cannot send the local reply 429");
        }
        Verdict::Answered
    }

    /// Count what a request booked against its tenant's budgets, in place
    /// of what it reserved.
    fn release<H: Host>(&mut self, setup: &Setup, host: &mut H, h: Hold) {
        let Some(bg) = setup.budgets.as_ref() else {
            return;
        };
        let (booked, tokens) = self.event.as_ref().map_or((0, 0), |e| {
            let tokens = i64::from(e.tokens_in) + i64::from(e.tokens_out);
            (nano_usd(e.marginal_usd), tokens)
        });
        let mine = bg.of(h.tenant);
        let now = host.now_ms();
        let cells = &mut HostCells(&mut *host);
        let (nano, tokens) = (booked - h.nano, tokens - i64::from(h.tokens));
        bg.book(mine, nano, tokens, h.minute, now, cells);
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
        let status = host.response_header(":status", |v| headers::number::<u32>(v).unwrap_or(0));
        let slo_ms = cfg.destinations.get(decision.index).and_then(|d| d.slo_ms);
        let now = host.now_ms();
        let (latency_ms, tenant) = self.since_sent(now, started);
        // Present only on an upstream's answer; its value is the
        // upstream's own time.
        let service_time = host.response_header(request::UPSTREAM_TIME_HEADER, |v| {
            v.map(|v| headers::number::<u64>(Some(v)))
        });
        if let Some(e) = self.event.as_mut() {
            e.upstream_ms = service_time.flatten();
        }
        let upstream = matches!(status, 0 | 500..=599) && service_time.is_some();
        // What the provider says of its own limit: `retry-after-ms` or
        // `retry-after` on a 429, its rate-limit figures on an answer.
        let retry_after = (status == 429).then(|| {
            let ms = host.response_header("retry-after-ms", |v| headroom::retry_after_ms(v, None));
            ms.or_else(|| {
                host.response_header("retry-after", |v| headroom::retry_after_ms(None, v))
            })
        });
        let mut reading = headroom::Reading::default();
        if (200..300).contains(&status) {
            host.each_response_header(|k, v| {
                if headroom::may_be(k) {
                    reading.feed(k, v, now);
                }
            });
        }
        let outcome = request::outcome(
            status,
            retry_after.flatten(),
            upstream,
            tenant,
            latency_ms,
            slo_ms,
            reading.headroom(),
        );
        // Only when the decision had a runner-up: with none, a re-run could
        // only refuse.
        let rerun = matches!(outcome, Outcome::Failure { .. })
            && cfg.retry_next
            && decision.runner_up.is_some()
            && host.can_rerun();
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
        if self.rerun.is_some() || !self.request_done || self.trailers || !host.can_rerun() {
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
        let (Some(p), Some((decision, _)), Some(e)) = (taken, self.chosen, self.event.as_mut())
        else {
            return;
        };
        if p.oversize && p.check.is_some() {
            // The fresh answer outgrew the bound the entry fits in: they
            // differ. Counted, and the entry dropped (nothing replaces it).
            host.count(Fleet::CacheChecks.into(), 1);
            host.count(Fleet::CacheFalseHits.into(), 1);
            e.cache_false_hit = true;
            host.cache_put(p.slot, &[]);
            log::warn!(
                "cache false hit: a checked entry's fresh answer outgrew the cache; dropped"
            );
            return;
        }
        if !p.storable {
            return;
        }
        let digest = cache::content_digest(&p.body, p.sse);
        if let Some(check) = p.check {
            host.count(Fleet::CacheChecks.into(), 1);
            if check != digest {
                host.count(Fleet::CacheFalseHits.into(), 1);
                e.cache_false_hit = true;
                log::warn!(
                    "cache false hit: a checked entry differs from the upstream's answer; replaced"
                );
            }
        }
        let model = e
            .text(&e.model_served)
            .or(e.text(&e.model_requested))
            .unwrap_or("");
        let status = u16::try_from(e.status).unwrap_or(200);
        let entry = Entry {
            key: p.key,
            created_ms: host.now_ms(),
            producer: decision.index,
            model,
            status,
            content_type: &p.content_type,
            tokens_in: e.tokens_in,
            tokens_out: e.tokens_out,
            estimated: e.tokens_estimated,
            digest,
            body: &p.body,
        };
        let bytes = entry.encode();
        if host.cache_put(p.slot, &bytes) {
            host.count(Fleet::CacheStores.into(), 1);
        }
        let _ = setup;
    }

    /// The request is over (Envoy runs this before its access loggers):
    /// settle it if nothing did (the client went away: free the slot,
    /// blame no one), book its dollars and write its one event.
    pub fn on_complete<H: Host>(&mut self, setup: &Setup, worker: &RefCell<Worker>, host: &mut H) {
        self.settle(setup, host, None, None);
        if let Some(h) = self.budget.take() {
            self.release(setup, host, h);
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

/// The response header that tells a tenant its budget is soft.
pub const BUDGET_HEADER: &str = "x-ace-budget";

/// `usd` as whole nano-USD (what a budget's cell counts); 0 when not a
/// finite amount.
fn nano_usd(usd: f64) -> i64 {
    if usd.is_finite() {
        (usd * 1e9).round() as i64
    } else {
        0
    }
}

/// Clear destination `d`'s bit in `mask`.
fn clear_bit(mask: &mut [u64], d: usize) {
    if let Some(word) = mask.get_mut(d / 64) {
        *word &= !(1u64 << (d % 64));
    }
}

/// The cheapest pay-as-you-go destination in `mask` for `req`'s tokens,
/// at its list price times `scale(d)` (the named model's factor there).
fn counterfactual(
    cfg: &Config,
    mask: &[u64],
    req: &Request,
    scale: impl Fn(usize) -> f64,
) -> Option<Counterfactual> {
    let mut best: Option<Counterfactual> = None;
    for (d, m) in cfg.models.iter().enumerate() {
        if !m.tier.is_pay_as_you_go() || !ace_core::dispatch::bit(mask, d) {
            continue;
        }
        let s = scale(d);
        let usd = m.rest_usd(req.tokens_in, req.tokens_out) * s;
        if best.is_none_or(|b| usd < b.usd) {
            best = Some(Counterfactual {
                index: d,
                usd,
                scale: s,
            });
        }
    }
    best
}

/// The answer to a request that arrived before any valid configuration.
pub fn not_configured() -> Refused {
    Refused {
        status: 503,
        kind: "not_configured",
        reason: "not_configured",
        message: "the ACE filter has no valid configuration".to_string(),
    }
}

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
