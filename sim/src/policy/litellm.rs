//! LiteLLM's router as its source behaves: **LiteLLM 1.109.3** (PyPI
//! wheel `litellm==1.109.3`, the newest release whose routing logic ships
//! as readable Python: `litellm/router_python_core.py`, `class
//! PythonCore`). Every rule below names the file and function it follows;
//! line numbers are 1.109.3's and `sim/peers-source.md` (sections 0-7)
//! quotes them. One LiteLLM worker is modelled: every counter, slot and
//! cool-down is that worker's in-memory cache (multi-worker Redis sharing
//! is out of scope). The worker's clock is UTC, so LiteLLM's "UTC minute"
//! and "local minute" are the same minute here.
//!
//! # The configuration the peer is given (`model_list` and router settings)
//!
//! - **Deployments** (D1): one `model_list` entry per (model group,
//!   destination): a GPU server lists the models resident on it, an API
//!   the models it offers; a destination no request may ever use (the
//!   sanctioned region) is left out. Model groups are the model ids.
//!   Cool-downs, success/fail counters, slots and every strategy's
//!   counters are kept per deployment id, i.e. per (group, destination)
//!   (`router_utils/cooldown_cache.py` `CooldownCache`,
//!   `router_utils/router_callbacks/track_deployment_metrics.py`,
//!   `router_strategy/least_busy.py`).
//! - **Limits** (D2): a GPU server's `max_parallel_requests` is its slots
//!   (the knee variant: its knee); an API's `rpm`/`tpm` are its provider
//!   limits; a reserved block's `tpm` is its commitment. The concurrency
//!   cap is `litellm/utils.py` `calculate_max_parallel_requests`:
//!   `max_parallel_requests`, else `rpm`, else `int(tpm/1000*6)`, else
//!   none; so an API's `rpm` is also its in-flight cap.
//! - **Prices** (D16): `input_cost_per_token`/`output_cost_per_token` are
//!   the destination's price at rest times the configuration's
//!   `model_routing.cost_factors` for the model. **Our models are not in
//!   LiteLLM's cost map**: a self-hosted deployment's `model` is
//!   `hosted_vllm/<id>`, and none of the fleet's ids is a key of
//!   `model_prices_and_context_window_backup.json` in 1.109.3 (gpt-4o and
//!   gpt-4o-mini are, but their deployments carry non-zero list prices, so
//!   the map is never consulted for them). `router_strategy/lowest_cost.py`
//!   `LowestCostLoggingHandler._get_available_deployments` reads a price
//!   only if it is truthy, so a price of 0 is unset and costs **5.0 per
//!   token** each way: the example fleet's reserved blocks (sunk, priced 0)
//!   are the *dearest* deployments under cost-based routing, never picked
//!   while any other deployment of the group passes its filter.
//! - **Residency** (D17): `enable_pre_call_checks=True`, every EU
//!   destination's `region_name="eu"` (others their own region), and
//!   `personal_eu` requests carry `allowed_model_region="eu"`:
//!   `PythonCore._pre_call_checks` then keeps only exact `region_name`
//!   matches (`litellm/utils.py` `is_region_allowed`). No other rule of
//!   the fleet's policies has a place in the default configuration.
//! - **Fallbacks**: `fallbacks` per model, the other models of its
//!   manifest model classes in order ([`fallback_chains`]); `num_retries`
//!   left at its default, 2 (the router's default is
//!   `openai.DEFAULT_MAX_RETRIES`, `PythonCore.__init__`), `cooldown_time`
//!   at 5 s, `max_fallbacks` at 5, `allowed_fails` unset.
//! - **Streams**: requests of the `interactive` and `standard` latency
//!   classes are `stream=True` (a chat client watching its time to first
//!   token); `batch` requests are not. Token counts are the trace's.
//! - **Connection failures**: the fleet's 503 is a refused connection (a
//!   server evicted or down, `fleet.rs`), which LiteLLM raises as
//!   `APIConnectionError` (status 500): counted as a failure, retried, and
//!   never cooled (`router_utils/cooldown_handlers.py`
//!   `_is_cooldown_required`).
//!
//! # The request pipeline (`PythonCore.async_function_with_fallbacks` →
//! `async_function_with_retries` → `make_call` → `_acompletion`)
//!
//! Each *call* (`LiteLlm::call`) goes through, in order:
//!
//! 1. the candidates (`_core_async_get_healthy_deployments`): the group's
//!    deployments less those cooling down, then `_pre_call_checks`
//!    (region), then the tag filter (`router_strategy/tag_based_routing.py`
//!    `get_deployments_for_tag`, operator variants only), then the
//!    retry-skip list. None left: `RouterRateLimitError` (429), which goes
//!    through the retries and fallbacks like any failure (D10);
//! 2. the strategy ([`Strategy`], D12-D16, D20); it may find nothing
//!    (429 again);
//! 3. the deployment's `max_parallel_requests` slot
//!    (`router_utils/client_initalization_utils.py`
//!    `MaxParallelRequestsLimit.acquire`, entered in
//!    `PythonCore._acompletion`): **checked after the pick**; full, it
//!    raises a 429 at once, from the router itself, so no failure callback
//!    runs: no cool-down and no failure count (D2, D19). The slot is held
//!    until the response (a stream: the stream) ends;
//! 4. usage-based-v2's pre-call rpm check
//!    (`router_strategy/lowest_tpm_rpm_v2.py`
//!    `LowestTPMLoggingHandler_v2.async_pre_call_check`, run by
//!    `PythonCore.async_routing_strategy_pre_call_checks`) (D14);
//! 5. the provider call. Its failure runs `PythonCore.
//!    deployment_callback_on_failure` inline: the fails counter, then the
//!    cool-down decision (below), before the retry logic looks at healthy
//!    deployments.
//!
//! **Usage is booked when the source books it** (D3): the slot at step 3;
//! v2's rpm at step 4; least-busy's in-flight count at the call's start
//! (`LeastBusyLoggingHandler.log_pre_api_call`) and its release on the
//! success or failure event; the success counter, v2's tpm, the latency
//! samples and the latency and cost maps' rpm/tpm **on success only**, at
//! the end of the response (`deployment_callback_on_success`,
//! `async_log_success_event` of each strategy). No counter books output
//! tokens before the response exists.
//!
//! **Retries** (`PythonCore.async_function_with_retries`,
//! `should_retry_this_error`, `_time_to_sleep_before_retry`; D7-D9):
//! after a failed call, `should_retry_this_error` raises (no retry; the
//! fallbacks still run) for a status `litellm.utils.should_retry` rejects
//! (it accepts 408, 409, 429 and >= 500), except 401/403 on a group of more
//! than one deployment; for 404; for 401/403 on a single-deployment group;
//! and for any error when the group has no healthy (non-cooling)
//! deployment. Otherwise the next call **re-picks afresh**: the same
//! deployment may come back (only cooling ones, and the deployments that
//! answered a status `should_retry` rejects, are out). The sleep before it
//! is 0 when the group has more than one deployment and one is healthy;
//! for a single-deployment group it is `litellm.utils.
//! calculate_retry_after`: the `retry-after` header if 0 < ra <= 60 s, else
//! `min(max(0.5 * 2^k, retry_after=0), 8)` s, plus a jitter U(0, 0.75 s),
//! with k the retries made so far; the last failed retry is followed by
//! one more sleep before the error is raised. `num_retries` 2: three calls
//! per group.
//!
//! **Fallbacks** (`PythonCore.async_function_with_fallbacks_common_utils`,
//! `router_utils/fallback_event_handlers.py` `run_async_fallback`; D11):
//! once a group raises, for whatever reason, its `fallbacks` are attempted
//! in list order, each with its own full retries and its own fallbacks
//! (nested, depth < `max_fallbacks` = 5), skipping groups already
//! attempted for the request; the first success is returned, else the last
//! error.
//!
//! **Cool-down** (`router_utils/cooldown_handlers.py`
//! `_should_cooldown_deployment`, `_is_cooldown_required`; duration from
//! `PythonCore.deployment_callback_on_failure`; D4-D6): the success and
//! fail counters are each a 60-s window that starts at its first event
//! (`caching/in_memory_cache.py` `InMemoryCache.increment_cache` keeps the
//! first TTL). A failure cools its deployment when: its status is 429 and
//! the group has more than one deployment; or every completion in the
//! window failed and there were >= 1,000; or more than 50% failed with >= 5
//! completions, in a group of more than one deployment; or
//! `should_retry(status)` is false (401, 404; 402 only in a larger group).
//! Other 4xx never cool (`_is_cooldown_required`), nor connection errors.
//! The duration is the `retry-after` header (uncapped; 0 means no
//! cool-down), else the router's `cooldown_time`, 5 s; a cool-down in
//! force is not extended (the in-memory TTL is kept).

use super::list_price;
use crate::engine::{Answered, Next, Policy, Route, World};
use crate::fleet::Upstream;
use crate::mix::Profile;
use crate::rng::Rng;
use ace_core::cost::Tier;
use std::collections::{BTreeMap, HashMap, VecDeque};

#[cfg(test)]
mod tests;

/// LiteLLM's routing strategies (`PythonCore._get_routing_context`,
/// `router_strategy/*.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// `simple-shuffle` (`router_strategy/simple_shuffle.py`
    /// `simple_shuffle`): random, weighted by the first of `weight`,
    /// `rpm`, `tpm` that some candidate sets positive (a candidate without
    /// it weighs 0), else uniform (D12).
    SimpleShuffle,
    /// `least-busy` (`router_strategy/least_busy.py`
    /// `LeastBusyLoggingHandler`): fewest in flight per (group,
    /// deployment), ties to the first candidate (D13).
    LeastBusy,
    /// `usage-based-routing-v2` (`router_strategy/lowest_tpm_rpm_v2.py`
    /// `LowestTPMLoggingHandler_v2`): lowest tokens booked this minute on
    /// success, within `tpm` and `rpm - 1`, random among ties; rpm booked at
    /// pre-call, 429 over it (D14).
    UsageBased,
    /// `latency-based-routing` (`router_strategy/lowest_latency.py`
    /// `LowestLatencyLoggingHandler`): lowest mean of the last 10 samples
    /// (a stream: time to first token, s; else seconds per completion
    /// token), written at success; a timeout adds 1,000; untried first;
    /// random among the lowest (D15).
    LatencyBased,
    /// `cost-based-routing` (`router_strategy/lowest_cost.py`
    /// `LowestCostLoggingHandler`): lowest input + output price per token,
    /// a price of 0 read as unset (D16).
    CostBased,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 5] = [
        Strategy::SimpleShuffle,
        Strategy::LeastBusy,
        Strategy::UsageBased,
        Strategy::LatencyBased,
        Strategy::CostBased,
    ];

    /// Its name in the simulator's tables (short; [`Strategy::litellm_name`]
    /// is LiteLLM's).
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::SimpleShuffle => "simple-shuffle",
            Strategy::LeastBusy => "least-busy",
            Strategy::UsageBased => "usage-based",
            Strategy::LatencyBased => "latency-based",
            Strategy::CostBased => "cost-based",
        }
    }

    /// Its `routing_strategy` value in LiteLLM (`PythonCore.
    /// _async_get_available_deployment`) (D20).
    pub fn litellm_name(self) -> &'static str {
        match self {
            Strategy::SimpleShuffle => "simple-shuffle",
            Strategy::LeastBusy => "least-busy",
            Strategy::UsageBased => "usage-based-routing-v2",
            Strategy::LatencyBased => "latency-based-routing",
            Strategy::CostBased => "cost-based-routing",
        }
    }
}

/// How the operator configured the router beyond the default mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The default mapping (module doc).
    Default,
    /// `cost-based-routing` with each GPU deployment's
    /// `max_parallel_requests` at its knee (`floor(knee * slots)`, at
    /// least 1) instead of all its slots: what an operator who read the
    /// capacity plan writes to keep latency off the steep part of the
    /// curve. Everything else as the default. Each deployment (one per
    /// model resident on a server) counts its own requests, so a server
    /// with several can pass its knee when they are busy together; the
    /// `-split` variants ([`Variant::OrderSplit`],
    /// [`Variant::TeamAliasSplit`]) split the knee among them instead.
    /// Neither is best at every load, so the comparison runs both.
    KneeCap,
    /// [`Variant::KneeCap`], compliant: `enable_tag_filtering=True` and
    /// `tag_filtering_match_any=True`; each request carries one tag, the
    /// (team, data class, model, tensor-parallel degree) it is sent with
    /// (the team's key metadata `tags`, set by the operator per key, plus
    /// the data-class header mapped to a tag); each deployment's
    /// `litellm_params.tags` lists the combinations the fleet's Cedar
    /// policies allow on it, for its own model group (a fallback group's
    /// deployments list a combination only where serving that group's
    /// model in place of the one asked for is allowed). No deployment is
    /// tagged `"default"`, so a request with no allowed deployment finds
    /// none (`get_deployments_for_tag` raises) instead of leaking. The
    /// team filter (`filter_team_based_models`: a deployment with
    /// `model_info.team_id` only for that team) is not needed: no
    /// destination of the fleet belongs to one tenant, and a team filter
    /// can only grant a deployment to a team, not deny it one; the teams
    /// enter through their keys' tags.
    Compliant,
    /// [`Variant::Compliant`] plus a per-team `model_group_alias`
    /// (`litellm_core_utils/routing_common_utils.py`
    /// `resolve_model_group_alias`, in the team's router settings): within
    /// each manifest model class, every member is aliased to the member
    /// the owned (in-house) GPUs serve with the most slots, for the teams
    /// whose every request may be served that model instead (so not
    /// Northbank, whose contract forbids substitution, and not the PHI
    /// keys: the operator gives PHI workloads a team of their own). That is
    /// the substitution ACE's model classes allow, as a fixed rewrite
    /// rather than a per-request choice.
    TeamAlias,
    /// [`Variant::Compliant`] with `order` tiers: each deployment's
    /// `litellm_params.order` is its tier's rank (in-house 1, reserved 2,
    /// spot 3, on-demand 4, pay-as-you-go 5), how a LiteLLM operator
    /// writes "owned, then reserved, then pay-as-you-go"
    /// (`litellm/utils.py` `get_order_filtered_deployments`: only the
    /// lowest order among the candidates left after the cooldown and tag
    /// filters; `router.py` `async_function_with_fallbacks`: once a tier's
    /// retries are spent, the same group at each higher order, then the
    /// group's `fallbacks`).
    Order,
    /// [`Variant::Order`] with each server's knee split evenly among its
    /// deployments (`max_parallel_requests` = `floor(knee * slots / n)`
    /// for a server holding `n` models, at least 1): what an operator
    /// writes who has seen a busy server pass its knee with every
    /// deployment under its own cap. It spills to the next `order` sooner.
    OrderSplit,
    /// [`Variant::TeamAlias`] with each server's knee split evenly among
    /// its deployments, as [`Variant::OrderSplit`].
    TeamAliasSplit,
}

impl Variant {
    /// The operator variants, in table order.
    pub const OPERATOR: [Variant; 6] = [
        Variant::KneeCap,
        Variant::Compliant,
        Variant::TeamAlias,
        Variant::TeamAliasSplit,
        Variant::Order,
        Variant::OrderSplit,
    ];

    /// The policy's name for `strategy` under this variant.
    pub fn name(self, strategy: Strategy) -> String {
        let base = format!("litellm-{}", strategy.as_str());
        match self {
            Variant::Default => base,
            Variant::KneeCap => format!("{base}-knee"),
            Variant::Compliant => format!("{base}-compliant"),
            Variant::TeamAlias => format!("{base}-team-alias"),
            Variant::Order => format!("{base}-order"),
            Variant::OrderSplit => format!("{base}-order-split"),
            Variant::TeamAliasSplit => format!("{base}-team-alias-split"),
        }
    }

    fn knee_cap(self) -> bool {
        self != Variant::Default
    }

    fn tags(self) -> bool {
        matches!(
            self,
            Variant::Compliant
                | Variant::TeamAlias
                | Variant::TeamAliasSplit
                | Variant::Order
                | Variant::OrderSplit
        )
    }

    fn order(self) -> bool {
        matches!(self, Variant::Order | Variant::OrderSplit)
    }

    fn aliases(self) -> bool {
        matches!(self, Variant::TeamAlias | Variant::TeamAliasSplit)
    }

    /// Whether a server's knee is split among its deployments.
    fn split(self) -> bool {
        matches!(self, Variant::OrderSplit | Variant::TeamAliasSplit)
    }
}

/// `num_retries` (the router's default, `openai.DEFAULT_MAX_RETRIES`).
pub const NUM_RETRIES: u32 = 2;
/// `cooldown_time` (`DEFAULT_COOLDOWN_TIME_SECONDS`, `constants.py`), ms.
pub const COOLDOWN_MS: u64 = 5_000;
/// `max_fallbacks` (`ROUTER_MAX_FALLBACKS`, `constants.py`).
pub const MAX_FALLBACKS: u32 = 5;
/// `INITIAL_RETRY_DELAY`, s (`constants.py`).
pub const INITIAL_RETRY_DELAY_S: f64 = 0.5;
/// `MAX_RETRY_DELAY`, s (`constants.py`).
pub const MAX_RETRY_DELAY_S: f64 = 8.0;
/// `JITTER`, s (`constants.py`).
pub const JITTER_S: f64 = 0.75;
/// `DEFAULT_FAILURE_THRESHOLD_PERCENT` (`constants.py`).
pub const FAILURE_THRESHOLD_PERCENT: f64 = 0.5;
/// `DEFAULT_FAILURE_THRESHOLD_MINIMUM_REQUESTS` (`constants.py`).
pub const FAILURE_THRESHOLD_MINIMUM_REQUESTS: u32 = 5;
/// `SINGLE_DEPLOYMENT_TRAFFIC_FAILURE_THRESHOLD` (`constants.py`).
pub const SINGLE_DEPLOYMENT_TRAFFIC_FAILURE_THRESHOLD: u32 = 1000;
/// The success/fail counters' TTL (`track_deployment_metrics.py`), ms.
pub const COUNTER_WINDOW_MS: u64 = 60_000;
/// `max_latency_list_size` (`lowest_latency.py` `RoutingArgs`).
pub const MAX_LATENCY_LIST_SIZE: usize = 10;
/// The latency map's TTL (`lowest_latency.py` `RoutingArgs.ttl`), ms.
pub const LATENCY_MAP_TTL_MS: u64 = 3_600_000;
/// The cost map's lifetime: written without a TTL, so the in-memory
/// cache's default (`in_memory_cache.py`), ms.
pub const COST_MAP_TTL_MS: u64 = 600_000;
/// The latency sample a timeout adds (`lowest_latency.py`
/// `async_log_failure_event`), s.
pub const TIMEOUT_PENALTY_S: f64 = 1000.0;
/// The price per token of a deployment with no truthy price and no cost
/// map entry (`lowest_cost.py`).
pub const UNSET_PRICE: f64 = 5.0;
/// `retry-after` on usage-based-v2's 429s (`lowest_tpm_rpm_v2.py`), s.
pub const V2_RETRY_AFTER_S: u32 = 60;

/// A counter whose window starts at its first event and lasts
/// [`COUNTER_WINDOW_MS`] (`InMemoryCache.increment_cache`).
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    /// Start + 1 (0: never written).
    start: u64,
    count: u32,
}

impl Window {
    fn live(&self, now: u64) -> bool {
        self.start > 0 && now < self.start - 1 + COUNTER_WINDOW_MS
    }

    fn get(&self, now: u64) -> u32 {
        if self.live(now) {
            self.count
        } else {
            0
        }
    }

    fn incr(&mut self, now: u64) {
        if !self.live(now) {
            *self = Window {
                start: now + 1,
                count: 0,
            };
        }
        self.count += 1;
    }
}

/// Requests and tokens in one calendar minute.
#[derive(Clone, Copy, Debug, Default)]
struct PerMinute {
    /// Minute + 1 (0: never written).
    minute: u64,
    rpm: u32,
    tpm: u64,
}

impl PerMinute {
    fn at(&self, now: u64) -> (u32, u64) {
        if self.minute == now / 60_000 + 1 {
            (self.rpm, self.tpm)
        } else {
            (0, 0)
        }
    }

    fn book(&mut self, now: u64, rpm: u32, tpm: u64) {
        let m = now / 60_000 + 1;
        if self.minute != m {
            *self = PerMinute {
                minute: m,
                ..PerMinute::default()
            };
        }
        self.rpm += rpm;
        self.tpm += tpm;
    }
}

/// One `model_list` entry and its state.
#[derive(Clone, Debug, Default)]
struct Dep {
    group: u32,
    dest: u32,
    eu: bool,
    /// `calculate_max_parallel_requests`.
    max_parallel: Option<u32>,
    rpm: Option<u32>,
    tpm: Option<u64>,
    weight: Option<f64>,
    /// Input + output price per token, as `lowest_cost.py` reads it.
    price: f64,
    /// `litellm_params.order`.
    order: Option<u32>,
    in_flight: u32,
    busy: u32,
    cooldown_until: u64,
    fails: Window,
    successes: Window,
    v2: PerMinute,
    latency: VecDeque<f64>,
    ttft: VecDeque<f64>,
    latency_minute: PerMinute,
    cost_minute: PerMinute,
}

impl Dep {
    fn cooling(&self, now: u64) -> bool {
        self.cooldown_until > now
    }
}

/// One model group.
#[derive(Clone, Debug, Default)]
struct Group {
    model: String,
    deps: Vec<u32>,
    fallbacks: Vec<u32>,
    /// The distinct `order` values of its deployments, ascending.
    orders: Vec<u32>,
    /// When the latency map (`{group}_map`) was created.
    latency_map_at: Option<u64>,
    /// When the cost map (`cost_map:{group}`) was created, and its
    /// deployments in insertion (first success) order.
    cost_map_at: Option<u64>,
    cost_order: Vec<u32>,
}

/// A failed call, as the retry logic sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Failure {
    /// `status_code` (`None`: an error without one).
    status: Option<u16>,
    retry_after_s: Option<u32>,
    /// The deployment that answered (a provider failure).
    dep: Option<u32>,
}

impl Failure {
    fn router(status: u16) -> Failure {
        Failure {
            status: Some(status),
            ..Failure::default()
        }
    }

    fn client_status(self) -> u16 {
        self.status.unwrap_or(500)
    }
}

/// What follows a sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Then {
    #[default]
    Call,
    Raise,
}

/// A request in the router.
#[derive(Clone, Debug, Default)]
struct Flight {
    /// The group asked for (after any alias) and the one now tried.
    asked: u32,
    group: u32,
    /// Calls made in the current group.
    calls: u32,
    /// `_retry_skipped_deployment_ids`.
    skip: Vec<u32>,
    /// `_target_order` of an order fallback: only that tier.
    target_order: Option<u32>,
    /// The fallback walk: (group, its target order, next index into its
    /// fallback list, depth).
    stack: Vec<(u32, Option<u32>, usize, u32)>,
    /// The targets attempted: (group, target order).
    attempted: Vec<(u32, Option<u32>)>,
    last: Failure,
    then: Then,
    /// The deployment of the provider call in flight, its start and first
    /// byte.
    dep: Option<u32>,
    started: u64,
    first: Option<u64>,
}

/// What the retry logic does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Again,
    Sleep(u64),
    End(u16),
}

/// What the router does with a request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Send(u32),
    Wait(u64),
    /// The provider's failure just answered goes to the client.
    Deliver,
    /// The router answers the client this status.
    Refuse(u16),
}

/// What the peer is configured from.
#[derive(Debug)]
pub struct Setup<'a> {
    /// The fleet.
    pub up: &'a [Upstream],
    /// The destinations listed (the others are left out).
    pub listed: Vec<bool>,
    /// The run's request profiles.
    pub profiles: &'a [Profile],
    /// The manifest's model classes.
    pub classes: Vec<Vec<String>>,
    /// `model_routing.cost_factors`: destination → model → factor.
    pub cost_factors: BTreeMap<String, BTreeMap<String, f64>>,
}

/// LiteLLM's router with one strategy.
#[derive(Debug)]
pub struct LiteLlm {
    strategy: Strategy,
    variant: Variant,
    deps: Vec<Dep>,
    groups: Vec<Group>,
    group_of: HashMap<String, u32>,
    /// Per profile: the group it is routed to (after any alias), the group
    /// of the model it asked for.
    entry: Vec<(u32, u32)>,
    /// Per profile: whether it streams.
    streams: Vec<bool>,
    /// Per (profile, group): the deployments passing the region check, and
    /// those passing the tag filter too.
    statics: Vec<Option<(Vec<u32>, Vec<u32>)>>,
    /// Per tag (team, data class, model, tp degree): its profiles; per
    /// profile, its tag.
    tag_profiles: Vec<Vec<usize>>,
    tag_of: Vec<usize>,
    flights: HashMap<u32, Flight>,
    /// `lowest_latency_buffer`.
    latency_buffer: f64,
    rng: Rng,
}

impl LiteLlm {
    /// `strategy` configured as `variant` over `setup`'s fleet, drawing
    /// from seed `seed`.
    pub fn new(strategy: Strategy, variant: Variant, setup: &Setup<'_>, seed: u64) -> LiteLlm {
        let mut groups: Vec<Group> = Vec::new();
        let mut group_of: HashMap<String, u32> = HashMap::new();
        let mut group = |m: &str, groups: &mut Vec<Group>| -> u32 {
            *group_of.entry(m.to_string()).or_insert_with(|| {
                groups.push(Group {
                    model: m.to_string(),
                    ..Group::default()
                });
                (groups.len() - 1) as u32
            })
        };
        let mut deps = Vec::new();
        for (d, u) in setup.up.iter().enumerate() {
            if !setup.listed.get(d).copied().unwrap_or(false) {
                continue;
            }
            let deployed = if u.p.slots.is_some() {
                &u.p.warm
            } else {
                &u.p.models
            };
            for m in deployed {
                let g = group(m, &mut groups);
                let factor = setup
                    .cost_factors
                    .get(&u.p.name)
                    .and_then(|f| f.get(m))
                    .copied()
                    .unwrap_or(1.0);
                let (pin, pout) = list_price(u);
                // A price of 0 is unset, and our models are not in the cost
                // map: 5.0 (`lowest_cost.py`).
                let truthy = |p: f64| if p != 0.0 { p } else { UNSET_PRICE };
                let (rpm, tpm) = match u.p.api_limits {
                    Some((rpm, tpm)) => (Some(rpm), Some(tpm)),
                    None => (None, u.p.tpm_cap),
                };
                let max_parallel_requests = u.p.slots.map(|s| {
                    if variant.knee_cap() {
                        // The manifest's knee: what the operator knows.
                        let share = if variant.split() {
                            deployed.len().max(1) as f64
                        } else {
                            1.0
                        };
                        ((u.p.cost.knee * f64::from(s) / share).floor() as u32).max(1)
                    } else {
                        s
                    }
                });
                let dep = Dep {
                    group: g,
                    dest: d as u32,
                    eu: u.p.eu,
                    max_parallel: calculate_max_parallel_requests(max_parallel_requests, rpm, tpm),
                    rpm,
                    tpm,
                    weight: None,
                    price: truthy(pin * factor) + truthy(pout * factor),
                    order: variant.order().then_some(match u.p.tier {
                        Tier::InHouse => 1,
                        Tier::Reserved => 2,
                        Tier::Spot => 3,
                        Tier::OnDemand => 4,
                        Tier::Payg => 5,
                    }),
                    ..Dep::default()
                };
                if let Some(x) = groups.get_mut(g as usize) {
                    x.deps.push(deps.len() as u32);
                }
                deps.push(dep);
            }
        }
        for x in &mut groups {
            let mut orders: Vec<u32> = x
                .deps
                .iter()
                .filter_map(|d| deps.get(*d as usize).and_then(|d: &Dep| d.order))
                .collect();
            orders.sort_unstable();
            orders.dedup();
            x.orders = orders;
        }
        for p in setup.profiles {
            group(&p.model, &mut groups);
        }
        for c in &setup.classes {
            for m in c {
                group(m, &mut groups);
            }
        }
        for (m, chain) in fallback_chains(&setup.classes) {
            let ids: Vec<u32> = chain.iter().map(|x| group(x, &mut groups)).collect();
            let g = group(&m, &mut groups);
            if let Some(x) = groups.get_mut(g as usize) {
                x.fallbacks = ids;
            }
        }
        // Tags: one per (team, data class, model, tp degree).
        let mut tag_index: HashMap<(String, String, String, u32), usize> = HashMap::new();
        let mut tag_profiles: Vec<Vec<usize>> = Vec::new();
        let mut tag_of = Vec::new();
        for (i, p) in setup.profiles.iter().enumerate() {
            let key = (
                p.tenant.clone(),
                p.data_class.clone(),
                p.model.clone(),
                p.tp_degree,
            );
            let t = *tag_index.entry(key).or_insert_with(|| {
                tag_profiles.push(Vec::new());
                tag_profiles.len() - 1
            });
            if let Some(v) = tag_profiles.get_mut(t) {
                v.push(i);
            }
            tag_of.push(t);
        }
        let aliases = if variant.aliases() {
            alias_targets(setup, &deps, &groups)
        } else {
            HashMap::new()
        };
        let entry = setup
            .profiles
            .iter()
            .map(|p| {
                let asked = group_of.get(&p.model).copied().unwrap_or(0);
                let aliased = aliases
                    .get(&p.model)
                    .filter(|target| {
                        // The team (tenant; PHI keys a team of their own) may
                        // be served the target for every request it sends
                        // for this model.
                        setup
                            .profiles
                            .iter()
                            .filter(|q| {
                                q.tenant == p.tenant
                                    && q.model == p.model
                                    && (q.data_class == "phi") == (p.data_class == "phi")
                            })
                            .all(|q| may_substitute(q, target))
                    })
                    .and_then(|target| group_of.get(target.as_str()).copied());
                (aliased.unwrap_or(asked), asked)
            })
            .collect();
        let streams = setup
            .profiles
            .iter()
            .map(|p| p.latency_class != "batch")
            .collect();
        let rng_label = match variant {
            Variant::Default => strategy.as_str().to_string(),
            v => v.name(strategy),
        };
        LiteLlm {
            strategy,
            variant,
            deps,
            groups,
            group_of,
            entry,
            streams,
            statics: Vec::new(),
            tag_profiles,
            tag_of,
            flights: HashMap::new(),
            latency_buffer: 0.0,
            rng: Rng::fork(seed, &rng_label),
        }
    }

    fn healthy(&self, g: u32, now: u64) -> (usize, usize) {
        let Some(group) = self.groups.get(g as usize) else {
            return (0, 0);
        };
        let healthy = group
            .deps
            .iter()
            .filter(|d| self.deps.get(**d as usize).is_some_and(|x| !x.cooling(now)))
            .count();
        (healthy, group.deps.len())
    }

    /// The deployments of group `g` request `r` may get whatever their
    /// state: (passing the region check, passing the tags too).
    fn statics(&mut self, w: &World<'_>, r: u32, g: u32) -> (Vec<u32>, Vec<u32>) {
        let p = w.req(r).profile as usize;
        let n = self.groups.len();
        let i = p * n + g as usize;
        if self.statics.len() <= i {
            self.statics.resize(i + 1, None);
        }
        if let Some(Some(s)) = self.statics.get(i) {
            return s.clone();
        }
        let profile = w.profiles.get(p);
        let eu_only = profile.is_some_and(|x| x.data_class == "personal_eu");
        let Some(group) = self.groups.get(g as usize) else {
            return Default::default();
        };
        let region: Vec<u32> = group
            .deps
            .iter()
            .copied()
            .filter(|d| self.deps.get(*d as usize).is_some_and(|x| !eu_only || x.eu))
            .collect();
        let tagged: Vec<u32> = if self.variant.tags() {
            let members = self
                .tag_of
                .get(p)
                .and_then(|t| self.tag_profiles.get(*t))
                .cloned()
                .unwrap_or_default();
            region
                .iter()
                .copied()
                .filter(|d| {
                    let dest = self
                        .deps
                        .get(*d as usize)
                        .map_or(usize::MAX, |x| x.dest as usize);
                    members.iter().all(|q| {
                        w.profiles
                            .get(*q)
                            .is_some_and(|q| q.allows_serving(dest, &group.model))
                    })
                })
                .collect()
        } else {
            region.clone()
        };
        let s = (region, tagged);
        if let Some(slot) = self.statics.get_mut(i) {
            *slot = Some(s.clone());
        }
        s
    }

    /// The filter chain of `_core_async_get_healthy_deployments` for
    /// request `r`'s current group.
    fn candidates(&mut self, w: &World<'_>, r: u32) -> Result<Vec<u32>, Failure> {
        let now = w.now;
        let Some(fl) = self.flights.get(&r) else {
            return Err(Failure::router(429));
        };
        let (g, skip, target_order) = (fl.group, fl.skip.clone(), fl.target_order);
        let (region, tagged) = self.statics(w, r, g);
        let alive = |d: &u32| self.deps.get(*d as usize).is_some_and(|x| !x.cooling(now));
        if !region.iter().any(alive) {
            // `RouterRateLimitError`.
            return Err(Failure::router(429));
        }
        let mut c: Vec<u32> = tagged.into_iter().filter(alive).collect();
        if c.is_empty() {
            // `get_deployments_for_tag`: no deployment with the request's
            // tags and none tagged "default": a `ValueError` (no status).
            return Err(Failure::default());
        }
        // `get_order_filtered_deployments`: the lowest order left (or the
        // order fallback's target); without an order, a deployment is
        // dropped once any candidate has one.
        let order = |d: &u32| self.deps.get(*d as usize).and_then(|x| x.order);
        let keep = target_order.or_else(|| c.iter().filter_map(order).min());
        if let Some(o) = keep {
            c.retain(|d| order(d) == Some(o));
            if c.is_empty() {
                return Err(Failure::router(429));
            }
        }
        if c.iter().any(|d| !skip.contains(d)) {
            c.retain(|d| !skip.contains(d));
        }
        Ok(c)
    }

    /// One `make_call`: the deployment whose provider call starts now, or
    /// the router's own failure.
    fn call(&mut self, w: &World<'_>, r: u32) -> Result<u32, Failure> {
        let now = w.now;
        if let Some(fl) = self.flights.get_mut(&r) {
            fl.calls += 1;
        }
        let c = self.candidates(w, r)?;
        let d = self.choose(w, r, &c)?;
        let strategy = self.strategy;
        let Some(x) = self.deps.get_mut(d as usize) else {
            return Err(Failure::router(429));
        };
        // `MaxParallelRequestsLimit.acquire`: after the pick, no wait.
        if x.max_parallel.is_some_and(|cap| x.in_flight >= cap) {
            return Err(Failure::router(429));
        }
        x.in_flight += 1;
        if strategy == Strategy::UsageBased {
            if let Err(e) = self.pre_call(d, now) {
                if let Some(x) = self.deps.get_mut(d as usize) {
                    x.in_flight -= 1;
                }
                return Err(e);
            }
        }
        let Some(x) = self.deps.get_mut(d as usize) else {
            return Err(Failure::router(429));
        };
        // `log_pre_api_call`.
        x.busy += 1;
        if let Some(fl) = self.flights.get_mut(&r) {
            fl.dep = Some(d);
            fl.started = now;
            fl.first = None;
        }
        Ok(d)
    }

    /// Usage-based-v2's `async_pre_call_check` on `d`: its rpm booked now,
    /// or a 429 (`retry-after: 60`) when it is already at its limit (not
    /// booked then), cooled for the router's `cooldown_time`. The pick and
    /// this check are one step here (one worker, no await between), and
    /// the selection already excludes `rpm - 1` booked, so this 429 only
    /// shows when a deployment's limit changes under it.
    fn pre_call(&mut self, d: u32, now: u64) -> Result<(), Failure> {
        let Some(x) = self.deps.get_mut(d as usize) else {
            return Ok(());
        };
        let Some(rpm) = x.rpm else { return Ok(()) };
        if x.v2.at(now).0 >= rpm {
            self.cool(d, now, 429, COOLDOWN_MS);
            return Err(Failure {
                status: Some(429),
                retry_after_s: Some(V2_RETRY_AFTER_S),
                dep: None,
            });
        }
        x.v2.book(now, 1, 0);
        Ok(())
    }

    /// The strategy's pick among `c` (non-empty).
    fn choose(&mut self, w: &World<'_>, r: u32, c: &[u32]) -> Result<u32, Failure> {
        let now = w.now;
        let req = w.req(r);
        let prompt = u64::from(req.prompt);
        let g = self.flights.get(&r).map_or(0, |f| f.group);
        let deps = &self.deps;
        let dep = |d: &u32| deps.get(*d as usize);
        let none = Failure::router(429);
        match self.strategy {
            Strategy::SimpleShuffle => {
                let sets: [&dyn Fn(&Dep) -> f64; 3] = [
                    &|x| x.weight.unwrap_or(0.0),
                    &|x| x.rpm.map_or(0.0, f64::from),
                    &|x| x.tpm.map_or(0.0, |t| t as f64),
                ];
                for metric in sets {
                    let ws: Vec<f64> = c.iter().map(|d| dep(d).map_or(0.0, metric)).collect();
                    if ws.iter().any(|x| *x > 0.0) {
                        let i = self.rng.weighted(&ws);
                        return c.get(i).copied().ok_or(none);
                    }
                }
                let i = self.rng.below(c.len());
                c.get(i).copied().ok_or(none)
            }
            Strategy::LeastBusy => c
                .iter()
                .copied()
                .min_by_key(|d| dep(d).map_or(0, |x| x.busy))
                .ok_or(none),
            Strategy::UsageBased => {
                let ok: Vec<(u32, u64)> = c
                    .iter()
                    .filter_map(|d| {
                        let x = dep(d)?;
                        let (rpm_used, tpm_used) = x.v2.at(now);
                        let over_tpm = x.tpm.is_some_and(|t| tpm_used + prompt > t);
                        let over_rpm = x.rpm.is_some_and(|l| rpm_used + 1 >= l);
                        (!over_tpm && !over_rpm).then_some((*d, tpm_used))
                    })
                    .collect();
                let Some(lowest) = ok.iter().map(|(_, t)| *t).min() else {
                    return Err(Failure {
                        status: Some(429),
                        retry_after_s: Some(V2_RETRY_AFTER_S),
                        dep: None,
                    });
                };
                let ties: Vec<u32> = ok
                    .iter()
                    .filter(|(_, t)| *t == lowest)
                    .map(|(d, _)| *d)
                    .collect();
                let i = self.rng.below(ties.len());
                ties.get(i).copied().ok_or(none)
            }
            Strategy::LatencyBased => {
                self.expire_maps(g, now);
                let stream = self
                    .streams
                    .get(req.profile as usize)
                    .copied()
                    .unwrap_or(true);
                let deps = &self.deps;
                let ok: Vec<(u32, f64)> = c
                    .iter()
                    .filter_map(|d| {
                        let x = deps.get(*d as usize)?;
                        let (rpm_used, tpm_used) = x.latency_minute.at(now);
                        if x.tpm.is_some_and(|t| tpm_used + prompt > t)
                            || x.rpm.is_some_and(|l| rpm_used + 1 > l)
                        {
                            return None;
                        }
                        Some((*d, latency_of(x, stream)))
                    })
                    .collect();
                let Some(lowest) = ok.iter().map(|(_, l)| *l).min_by(f64::total_cmp) else {
                    return Err(none);
                };
                let bar = lowest + self.latency_buffer * lowest;
                let near: Vec<u32> = ok
                    .iter()
                    .filter(|(_, l)| *l <= bar)
                    .map(|(d, _)| *d)
                    .collect();
                let i = self.rng.below(near.len());
                near.get(i).copied().ok_or(none)
            }
            Strategy::CostBased => {
                self.expire_maps(g, now);
                let deps = &self.deps;
                let order = self
                    .groups
                    .get(g as usize)
                    .map(|x| x.cost_order.as_slice())
                    .unwrap_or(&[]);
                let passes = |d: &u32| {
                    deps.get(*d as usize).is_some_and(|x| {
                        let (rpm_used, tpm_used) = x.cost_minute.at(now);
                        !(x.rpm.is_some_and(|l| rpm_used + 1 > l)
                            || x.tpm.is_some_and(|t| tpm_used + prompt > t))
                    })
                };
                // Stable over the cost map's order: deployments with a
                // success, in first-success order, then the others.
                order
                    .iter()
                    .filter(|d| c.contains(d))
                    .chain(c.iter().filter(|d| !order.contains(d)))
                    .filter(|d| passes(d))
                    .min_by(|a, b| {
                        let p = |d: &u32| deps.get(*d as usize).map_or(f64::MAX, |x| x.price);
                        p(a).total_cmp(&p(b))
                    })
                    .copied()
                    .ok_or(none)
            }
        }
    }

    /// The latency map (1 h) and cost map (600 s) of group `g` expire as
    /// a whole, from their creation.
    fn expire_maps(&mut self, g: u32, now: u64) {
        let Some(group) = self.groups.get_mut(g as usize) else {
            return;
        };
        if group
            .latency_map_at
            .is_some_and(|t| now >= t + LATENCY_MAP_TTL_MS)
        {
            group.latency_map_at = None;
            for d in &group.deps {
                if let Some(x) = self.deps.get_mut(*d as usize) {
                    x.latency.clear();
                    x.ttft.clear();
                    x.latency_minute = PerMinute::default();
                }
            }
        }
        if group
            .cost_map_at
            .is_some_and(|t| now >= t + COST_MAP_TTL_MS)
        {
            group.cost_map_at = None;
            group.cost_order.clear();
            for d in &group.deps {
                if let Some(x) = self.deps.get_mut(*d as usize) {
                    x.cost_minute = PerMinute::default();
                }
            }
        }
    }

    /// `_should_cooldown_deployment` for a failure of `d` with `status`,
    /// cooling it for `duration_ms` if so.
    fn cool(&mut self, d: u32, now: u64, status: u16, duration_ms: u64) {
        if duration_ms == 0 {
            return;
        }
        // `_is_cooldown_required`.
        if (400..500).contains(&status) && !matches!(status, 429 | 401 | 402 | 408 | 404) {
            return;
        }
        let Some(x) = self.deps.get(d as usize) else {
            return;
        };
        let single = self
            .groups
            .get(x.group as usize)
            .is_none_or(|g| g.deps.len() == 1);
        if single && status == 402 {
            return;
        }
        let (s, f) = (x.successes.get(now), x.fails.get(now));
        let total = s + f;
        let p = if total > 0 {
            f64::from(f) / f64::from(total)
        } else {
            0.0
        };
        let cool = (status == 429 && !single)
            || (p == 1.0 && total >= SINGLE_DEPLOYMENT_TRAFFIC_FAILURE_THRESHOLD)
            || (p > FAILURE_THRESHOLD_PERCENT
                && total >= FAILURE_THRESHOLD_MINIMUM_REQUESTS
                && !single)
            || !should_retry(status);
        if let Some(x) = self.deps.get_mut(d as usize) {
            // A cool-down in force keeps its TTL.
            if cool && !x.cooling(now) {
                x.cooldown_until = now + duration_ms;
            }
        }
    }

    /// `_time_to_sleep_before_retry`, ms.
    fn sleep_ms(&mut self, f: Failure, remaining: u32, healthy: usize, all: usize) -> u64 {
        if all != 1 && healthy > 0 {
            return 0;
        }
        let jitter = JITTER_S * self.rng.uniform();
        let s = match f.retry_after_s {
            Some(ra) if ra > 0 && ra <= 60 => f64::from(ra) + jitter,
            _ => {
                let k = NUM_RETRIES.saturating_sub(remaining);
                (INITIAL_RETRY_DELAY_S * 2f64.powi(k as i32)).min(MAX_RETRY_DELAY_S) + jitter
            }
        };
        (s * 1000.0).round() as u64
    }

    /// The retry logic after call failure `f` of request `r`.
    fn failed(&mut self, w: &World<'_>, r: u32, f: Failure) -> Step {
        let now = w.now;
        let Some(fl) = self.flights.get_mut(&r) else {
            return Step::End(f.client_status());
        };
        fl.last = f;
        let (g, calls) = (fl.group, fl.calls);
        let (healthy, all) = self.healthy(g, now);
        if !should_retry_this_error(f, healthy, all) {
            return self.fall_back(r);
        }
        if let (Some(s), Some(d)) = (f.status, f.dep) {
            // `_deployment_ids_to_skip_on_retry`.
            if !should_retry(s) {
                if let Some(fl) = self.flights.get_mut(&r) {
                    fl.skip.push(d);
                }
            }
        }
        let remaining = (NUM_RETRIES + 1).saturating_sub(calls);
        let sleep = self.sleep_ms(f, remaining, healthy, all);
        let last = calls > NUM_RETRIES;
        let Some(fl) = self.flights.get_mut(&r) else {
            return Step::End(f.client_status());
        };
        match (last, sleep) {
            (true, 0) => self.fall_back(r),
            (true, ms) => {
                fl.then = Then::Raise;
                Step::Sleep(ms)
            }
            (false, 0) => Step::Again,
            (false, ms) => {
                fl.then = Then::Call;
                Step::Sleep(ms)
            }
        }
    }

    /// `run_async_fallback`: the next group to attempt, depth first.
    fn fall_back(&mut self, r: u32) -> Step {
        let groups = &self.groups;
        let Some(fl) = self.flights.get_mut(&r) else {
            return Step::End(500);
        };
        while let Some(top) = fl.stack.last_mut() {
            let (g, order, i, depth) = *top;
            let Some(group) = groups.get(g as usize) else {
                fl.stack.pop();
                continue;
            };
            // A group of more than one order falls back to itself at each
            // higher order first, then to its `fallbacks`.
            let tiers: &[u32] = if group.orders.len() > 1 {
                let above = order.or(group.orders.first().copied()).unwrap_or(0);
                let from = group.orders.partition_point(|o| *o <= above);
                group.orders.get(from..).unwrap_or(&[])
            } else {
                &[]
            };
            let next = match tiers.get(i) {
                Some(o) => Some((g, Some(*o))),
                None => group.fallbacks.get(i - tiers.len()).map(|t| (*t, None)),
            };
            match next {
                Some((t, o)) if depth < MAX_FALLBACKS => {
                    top.2 += 1;
                    if (o.is_none() && t == g) || fl.attempted.contains(&(t, o)) {
                        continue;
                    }
                    fl.attempted.push((t, o));
                    fl.stack.push((t, o, 0, depth + 1));
                    fl.group = t;
                    fl.target_order = o;
                    fl.calls = 0;
                    fl.skip.clear();
                    return Step::Again;
                }
                _ => {
                    fl.stack.pop();
                }
            }
        }
        Step::End(fl.last.client_status())
    }

    /// Follow `step` until a provider call starts, a sleep, or the end.
    /// `provider`: `step` follows a provider's failure, which is what the
    /// client gets if nothing else is tried.
    fn drive(&mut self, w: &World<'_>, r: u32, mut step: Step, mut provider: bool) -> Act {
        loop {
            match step {
                Step::Again => match self.call(w, r) {
                    Ok(d) => return Act::Send(d),
                    Err(e) => {
                        provider = false;
                        step = self.failed(w, r, e);
                    }
                },
                Step::Sleep(ms) => return Act::Wait(ms),
                Step::End(s) if provider => {
                    let _ = s;
                    return Act::Deliver;
                }
                Step::End(s) => return Act::Refuse(s),
            }
        }
    }

    fn route_of(&self, act: Act) -> Route {
        match act {
            Act::Send(d) => Route::To(
                self.deps
                    .get(d as usize)
                    .map_or(usize::MAX, |x| x.dest as usize),
            ),
            Act::Wait(ms) => Route::Wait(ms),
            Act::Refuse(s) => Route::Refuse(s),
            Act::Deliver => Route::Refuse(500),
        }
    }

    /// The provider call of request `r` on `d` is over (its slot and its
    /// least-busy count released).
    fn release(&mut self, d: u32) {
        if let Some(x) = self.deps.get_mut(d as usize) {
            x.in_flight = x.in_flight.saturating_sub(1);
            x.busy = x.busy.saturating_sub(1);
        }
    }

    /// The success event of request `r` on `d`, at `now`.
    fn succeeded(&mut self, w: &World<'_>, r: u32, d: u32, started: u64, first: Option<u64>) {
        let now = w.now;
        let req = w.req(r);
        let total = u64::from(req.prompt) + u64::from(req.output);
        let stream = self
            .streams
            .get(req.profile as usize)
            .copied()
            .unwrap_or(true);
        let Some(g) = self.deps.get(d as usize).map(|x| x.group) else {
            return;
        };
        self.expire_maps(g, now);
        if let Some(group) = self.groups.get_mut(g as usize) {
            group.latency_map_at.get_or_insert(now);
            group.cost_map_at.get_or_insert(now);
            if !group.cost_order.contains(&d) {
                group.cost_order.push(d);
            }
        }
        let Some(x) = self.deps.get_mut(d as usize) else {
            return;
        };
        x.successes.incr(now);
        x.v2.book(now, 0, total);
        let seconds = now.saturating_sub(started) as f64 / 1000.0;
        let normalized = if req.output > 0 {
            seconds / f64::from(req.output)
        } else {
            seconds
        };
        push_sample(&mut x.latency, normalized);
        if stream {
            if let Some(t) = first {
                push_sample(&mut x.ttft, t.saturating_sub(started) as f64 / 1000.0);
            }
        }
        x.latency_minute.book(now, 1, total);
        x.cost_minute.book(now, 1, total);
    }
}

/// `calculate_max_parallel_requests` (`litellm/utils.py`): the first set of
/// `max_parallel_requests`, `rpm`, `int(tpm / 1000 * 6)` (at least 1);
/// `default_max_parallel_requests` is unset.
fn calculate_max_parallel_requests(
    max_parallel_requests: Option<u32>,
    rpm: Option<u32>,
    tpm: Option<u64>,
) -> Option<u32> {
    max_parallel_requests
        .or(rpm)
        .or_else(|| tpm.map(|t| ((t as f64 / 1000.0 * 6.0) as u32).max(1)))
}

/// `litellm.utils.should_retry`: 408, 409, 429 and >= 500.
pub fn should_retry(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// `PythonCore.should_retry_this_error` (without context-window and
/// content-policy fallbacks, which are not configured): whether a failed
/// call is retried in its group.
fn should_retry_this_error(f: Failure, healthy: usize, all: usize) -> bool {
    if let Some(s) = f.status {
        if !should_retry(s) && s != 401 && s != 403 {
            return false;
        }
        if (s == 401 || s == 403) && all <= 1 {
            return false;
        }
    }
    healthy > 0
}

/// The latency a deployment is ranked by (`_get_available_deployments`):
/// a stream's mean time to first token if it has samples, else the mean
/// of `latency_normalized`; 0 for none.
fn latency_of(x: &Dep, stream: bool) -> f64 {
    let mean = |v: &VecDeque<f64>| {
        let ok: Vec<f64> = v.iter().copied().filter(|s| *s >= 0.0).collect();
        if ok.is_empty() {
            0.0
        } else {
            ok.iter().sum::<f64>() / ok.len() as f64
        }
    };
    if stream && !x.ttft.is_empty() {
        mean(&x.ttft)
    } else {
        mean(&x.latency)
    }
}

/// Append to a latency list of at most [`MAX_LATENCY_LIST_SIZE`], the
/// oldest dropped.
fn push_sample(v: &mut VecDeque<f64>, s: f64) {
    v.push_back(s);
    while v.len() > MAX_LATENCY_LIST_SIZE {
        v.pop_front();
    }
}

/// Whether `p` may be served `target` instead of its own model somewhere.
fn may_substitute(p: &Profile, target: &str) -> bool {
    p.model == target
        || p.substitutes
            .iter()
            .any(|(m, mask)| m == target && mask.iter().any(|w| *w != 0))
}

/// Per model, the member of its first class that the owned GPUs serve
/// with the most slots (ties: class order), when that is another model.
fn alias_targets(setup: &Setup<'_>, deps: &[Dep], groups: &[Group]) -> HashMap<String, String> {
    let owned_slots = |m: &str| -> u32 {
        groups
            .iter()
            .filter(|g| g.model == m)
            .flat_map(|g| g.deps.iter())
            .filter_map(|d| deps.get(*d as usize))
            .filter_map(|x| setup.up.get(x.dest as usize))
            .filter(|u| u.p.tier == Tier::InHouse)
            .map(|u| u.p.slots.unwrap_or(0))
            .sum()
    };
    let mut out = HashMap::new();
    for class in &setup.classes {
        let mut best: Option<(&String, u32)> = None;
        for m in class {
            let s = owned_slots(m);
            if s > 0 && best.is_none_or(|(_, b)| s > b) {
                best = Some((m, s));
            }
        }
        if let Some((target, _)) = best {
            for m in class {
                if m != target {
                    out.entry(m.clone()).or_insert_with(|| target.clone());
                }
            }
        }
    }
    out
}

impl Policy for LiteLlm {
    fn name(&self) -> String {
        self.variant.name(self.strategy)
    }

    fn route(&mut self, w: &World<'_>, r: u32) -> Route {
        let p = w.req(r).profile as usize;
        let (g, asked) = match self.entry.get(p) {
            Some(e) => *e,
            None => {
                let g = w
                    .profile(r)
                    .and_then(|x| self.group_of.get(&x.model))
                    .copied()
                    .unwrap_or(u32::MAX);
                (g, g)
            }
        };
        self.flights.insert(
            r,
            Flight {
                asked,
                group: g,
                stack: vec![(g, None, 0, 0)],
                attempted: vec![(g, None)],
                ..Flight::default()
            },
        );
        let act = self.drive(w, r, Step::Again, false);
        self.route_of(act)
    }

    fn resume(&mut self, w: &World<'_>, r: u32) -> Route {
        let then = self.flights.get(&r).map_or(Then::Raise, |f| f.then);
        let step = match then {
            Then::Call => Step::Again,
            Then::Raise => self.fall_back(r),
        };
        let act = self.drive(w, r, step, false);
        self.route_of(act)
    }

    fn answered(&mut self, w: &World<'_>, at: &Answered<'_>) -> Next {
        let (r, a) = (at.r, at.answer);
        let now = w.now;
        let Some(fl) = self.flights.get_mut(&r) else {
            return Next::Deliver;
        };
        if (200..300).contains(&a.status) {
            fl.first = Some(now);
            return Next::Deliver;
        }
        let Some(d) = fl.dep.take() else {
            return Next::Deliver;
        };
        self.release(d);
        // `deployment_callback_on_failure`: counted, then maybe cooled.
        if let Some(x) = self.deps.get_mut(d as usize) {
            x.fails.incr(now);
        }
        let connection = a.status == 503;
        if !connection {
            let duration = a.retry_after_s.map_or(COOLDOWN_MS, |s| u64::from(s) * 1000);
            self.cool(d, now, a.status, duration);
        }
        if a.status == 408 {
            // `litellm.Timeout`: the latency penalty.
            let g = self.deps.get(d as usize).map_or(0, |x| x.group);
            if let Some(group) = self.groups.get_mut(g as usize) {
                group.latency_map_at.get_or_insert(now);
            }
            if let Some(x) = self.deps.get_mut(d as usize) {
                push_sample(&mut x.latency, TIMEOUT_PENALTY_S);
            }
        }
        let f = Failure {
            status: Some(if connection { 500 } else { a.status }),
            retry_after_s: a.retry_after_s,
            dep: Some(d),
        };
        let step = self.failed(w, r, f);
        match self.drive(w, r, step, true) {
            Act::Deliver => Next::Deliver,
            act => Next::Retry {
                after_ms: 0,
                route: self.route_of(act),
            },
        }
    }

    fn served_model(&self, r: u32) -> Option<&str> {
        let fl = self.flights.get(&r)?;
        if fl.group == fl.asked {
            return None;
        }
        self.groups.get(fl.group as usize).map(|g| g.model.as_str())
    }

    fn finished_without_service(&mut self, _w: &World<'_>, r: u32) {
        if let Some(d) = self.flights.remove(&r).and_then(|f| f.dep) {
            self.release(d);
        }
    }

    fn done(&mut self, w: &World<'_>, r: u32, _dest: usize, ok: bool) {
        let Some(fl) = self.flights.remove(&r) else {
            return;
        };
        let Some(d) = fl.dep else { return };
        self.release(d);
        if ok {
            self.succeeded(w, r, d, fl.started, fl.first);
        } else if let Some(x) = self.deps.get_mut(d as usize) {
            // Broken mid-response: a connection error, counted, never
            // cooled.
            x.fails.incr(w.now);
        }
    }
}

/// Per model, the other models of its classes in class order: the
/// `fallbacks` an operator writes from the manifest's model classes.
pub fn fallback_chains(classes: &[Vec<String>]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut fallbacks: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for class in classes {
        for m in class {
            let entry = fallbacks.entry(m.clone()).or_default();
            for x in class {
                if x != m && !entry.contains(x) {
                    entry.push(x.clone());
                }
            }
        }
    }
    fallbacks
}
