//! The plugin configuration: parsed and validated once in `on_configure`,
//! then trusted on every request.
//!
//! Every error names the field that is wrong (a JSON path such as
//! `destinations[1].usd_per_input_token`) and says what would be accepted,
//! because the only place an operator sees it is one line of Envoy's log.
//!
//! ```json
//! {
//!   "destinations": [
//!     {"name": "owned-h100", "cluster": "owned_h100", "tier": "inhouse",
//!      "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8,
//!      "capacity": 8, "knee": 0.8, "slo_ms": 2000},
//!     {"name": "openai", "cluster": "openai", "tier": "payg",
//!      "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5}
//!   ],
//!   "latency_usd_per_s": 0.002,
//!   "latency_classes": {
//!     "interactive": {"usd_per_s": 0.01, "ttft_ms": 1000, "late_usd": 0.05},
//!     "batch": 0.0
//!   },
//!   "congestion_usd_per_s": 0.002,
//!   "default_output_tokens": 256,
//!   "response_headers": false,
//!   "health": {"trip_after": 3, "base_cooldown_ms": 5000}
//! }
//! ```
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

use ace_core::cost::{CostModel, Tier};
use ace_core::health::HealthPolicy;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fmt;

pub mod budget;
pub mod upstream;
pub use budget::{Budget, BudgetSettings, Budgets};
pub use upstream::{Api, Serving, Upstream, CREDENTIAL_HEADERS, CREDENTIAL_QUERY_PARAMS};

/// The header the filter writes and Envoy's route reads (`cluster_header`).
pub const DEFAULT_DESTINATION_HEADER: &str = "x-ace-destination";

/// The name of the computed attribute: whether the pair's model is
/// another than the one the request named.
pub const SUBSTITUTED: &str = "substituted";

/// `model_routing` as configured.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingSettings {
    /// Class name to its member models, the reference model first (a
    /// request naming the class is priced against it).
    pub classes: BTreeMap<String, Vec<String>>,
    /// Destination name to model to the model's token price on that
    /// destination relative to the destination's own (default 1).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_factors: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The name of the computed attribute: whether the request is answered
/// from the cache.
pub const CACHED: &str = "cached";

/// `cache` as configured.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSettings {
    /// Entries kept (default 1,024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// Largest response body stored (default 65,536).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entry_bytes: Option<usize>,
    /// How long an entry is served, ms (default 300,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Fraction of hits also sent upstream and compared (default 0.01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_fraction: Option<f64>,
}

/// `locality` as configured: prefix locality, what each destination
/// already holds of a request's prompt, priced into the merit order
/// (`ace_flow::prefix`). Absent: off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LocalitySettings {
    /// Prefix records kept per destination (default 4,096); the table
    /// holds this many times the destinations, shared by every worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_per_destination: Option<u32>,
    /// A request header naming the client's session (beside the body's
    /// `prompt_cache_key` and `user`), lowercase; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_header: Option<String>,
}

/// A destination's prompt cache as ACE models it (`prefix_cache`); unset
/// fields take its tier's defaults (`ace_flow::prefix`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCache {
    /// How long a prefix stays after its last use, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The shortest prefix it caches, tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Prompt tokens it prefills per second for one request (0 or absent:
    /// the time a held prefix saves is not priced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_tokens_per_s: Option<f64>,
}

impl PrefixCache {
    /// Check destination `i`'s prompt cache, naming the bad field.
    pub fn validate(&self, i: usize) -> Result<(), ConfigError> {
        if self
            .prefill_tokens_per_s
            .is_some_and(|r| !(r.is_finite() && r >= 0.0))
        {
            return Err(err(
                format!("destinations[{i}].prefix_cache.prefill_tokens_per_s"),
                "must be a non-negative number of prompt tokens per second",
            ));
        }
        if self.ttl_ms.is_some_and(|t| t > 86_400_000) {
            return Err(err(
                format!("destinations[{i}].prefix_cache.ttl_ms"),
                "must be at most 86400000 (a day): no provider keeps a prompt cache longer",
            ));
        }
        Ok(())
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Destinations in configuration order (the tie-break order).
    pub destinations: Vec<Destination>,
    /// Cost parameters, parallel to `destinations`, for the core.
    pub models: Vec<CostModel>,
    /// The request header that carries the chosen Envoy cluster.
    pub destination_header: String,
    /// What a second of queueing delay is worth, USD (latency penalty), for
    /// a request whose latency class is not in `latency_classes`.
    pub latency_usd_per_s: f64,
    /// Per latency class (`x-ace-latency-class`), sorted by name: what a
    /// second of queueing is worth (interactive work more than batch), and
    /// the class's time-to-first-token target with what missing it costs.
    pub latency_classes: Vec<(String, LatencyClass)>,
    /// The least a second of queueing past a destination's knee is priced
    /// at, whatever the request's class: a request past the knee slows
    /// every request sharing the server (a fuller batch decodes slower, and
    /// new sequences wait behind it), so even work that values its own
    /// time at nothing pays for the time it takes from timed work. Default
    /// ([`congestion_floor`]): the lowest value of a second among the
    /// classes with a time-to-first-token target, 0 without one.
    pub congestion_usd_per_s: f64,
    /// Which destinations have which models resident, as configured (the
    /// control service's reports replace a destination's list).
    pub warmth: Warmth,
    /// The control service to poll, if any.
    pub control: Option<Control>,
    /// Whether responses carry `x-ace-destination`, `x-ace-tier`,
    /// `x-ace-reason` and `x-ace-cost-usd` (off by default: they tell
    /// clients the fleet's internals and prices; the access-log event has
    /// them all).
    pub response_headers: bool,
    /// Whether a request whose destination fails (a 5xx or Envoy's local
    /// reply for a refused connection or timeout, before any byte reached
    /// the client) is tried once more, within the same request, on the
    /// next feasible destination in merit order. Only the dynamic module
    /// can (it re-runs the request through Envoy's filter chain); the Wasm
    /// filter logs that it ignores it.
    pub retry_next: bool,
    /// Output tokens assumed when the request does not say.
    pub default_output_tokens: u32,
    /// Health tunables.
    pub health: HealthPolicy,
    /// A fingerprint of the destination set, so that shared state written
    /// under another configuration is never misread.
    pub fingerprint: u64,
    /// Compiled policy tables (`ace policy compile`), validated. `None`
    /// means no policy: every destination is feasible.
    pub policy: Option<Policy>,
    /// Whether to read request bodies (needs Envoy's
    /// `allow_on_headers_stop_iteration: true` on the Wasm filter).
    pub read_body: bool,
    /// Most bytes read from a request body (responses are scanned for
    /// token usage as they stream, whatever their size).
    pub max_body_bytes: usize,
    /// The most tokens one request can take in or give out (a model's
    /// context window): bounds every estimate and every usage an upstream
    /// reports, so that neither a client's `max_tokens` nor an upstream's
    /// claim can book more.
    pub max_context_tokens: u32,
    /// The configuration's identity in events: the first 16 hex digits of
    /// the SHA-256 of the exact bytes parsed, so the ledger can find the
    /// prices and tables each event was decided with.
    pub id: std::sync::Arc<str>,
    /// The operator ran without policy tables on purpose
    /// (`"allow_no_policy": true`): every destination is feasible.
    pub no_policy: bool,
    /// Model routing as configured (`model_routing`); none when absent.
    /// The flow builds it against the tables (`ace_flow::routing`).
    pub model_routing: Option<RoutingSettings>,
    /// The response cache as configured (`cache`); none when absent. The
    /// flow builds it against the tables (`ace_flow::cache`).
    pub cache: Option<CacheSettings>,
    /// Which destinations serve which API, and which rename models
    /// (from each destination's `upstream`).
    pub serving: Serving,
    /// Prefix locality as configured (`locality`); none when absent. The
    /// flow builds it against the destinations (`ace_flow::prefix`).
    pub locality: Option<LocalitySettings>,
    /// Tenant budgets, validated (empty when none are configured).
    pub budgets: Budgets,
}

impl Config {
    /// One line saying what this configuration routes, for the log.
    pub fn summary(&self) -> String {
        format!(
            "configured {} destinations, routing header {}, {}",
            self.destinations.len(),
            self.destination_header,
            match &self.policy {
                Some(p) => format!("policy tables reading {} attributes", p.attributes.len()),
                None => "no policy tables: every destination is feasible".to_string(),
            }
        )
    }

    /// Destination names, to share with each request's event.
    pub fn names(&self) -> Vec<std::sync::Arc<str>> {
        self.destinations
            .iter()
            .map(|d| d.name.as_str().into())
            .collect()
    }

    /// The compiled policy tables, borrowed zero-copy (validated by
    /// [`Config::parse`], so `None` only when there is no policy).
    pub fn tables(&self) -> Option<ace_core::tables::Tables<'static>> {
        self.policy
            .as_ref()
            .and_then(|p| ace_core::tables::Tables::load(p.tables).ok())
    }

    /// What a second of queueing delay is worth for a request of latency
    /// class `class` (the default value when absent or not configured).
    pub fn latency_value(&self, class: Option<&str>) -> f64 {
        self.latency_class(class).usd_per_s
    }

    /// Latency class `class` as configured, or a class with the default
    /// value of a second and no target when absent or not configured.
    pub fn latency_class(&self, class: Option<&str>) -> LatencyClass {
        class
            .and_then(|c| {
                self.latency_classes
                    .binary_search_by(|(name, _)| name.as_str().cmp(c))
                    .ok()
            })
            .and_then(|i| self.latency_classes.get(i))
            .map_or(LatencyClass::untimed(self.latency_usd_per_s), |(_, v)| *v)
    }
}

/// A latency class: what its latency is worth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyClass {
    /// USD per second of queueing delay past a destination's knee.
    pub usd_per_s: f64,
    /// Time to first token the class is promised, ms (`None`: no target).
    pub ttft_ms: Option<u32>,
    /// What missing that target costs, USD: added to the rank of a
    /// destination expected to miss it.
    pub late_usd: f64,
    /// What to do when no destination is expected to meet the target.
    pub when_late: WhenLate,
}

impl LatencyClass {
    /// What a miss costs when the configuration does not say: more than
    /// almost any single request's price, so that a destination on time
    /// is chosen over a late one whenever there is one.
    pub const DEFAULT_LATE_USD: f64 = 0.05;

    /// A class worth `usd_per_s` a second, with no target.
    pub const fn untimed(usd_per_s: f64) -> LatencyClass {
        LatencyClass {
            usd_per_s,
            ttft_ms: None,
            late_usd: 0.0,
            when_late: WhenLate::Serve,
        }
    }
}

/// What a class does when no destination is expected to meet its target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenLate {
    /// Serve it on the cheapest destination, late (the event's reason is
    /// `late`, and the ledger counts the miss).
    #[default]
    Serve,
    /// Refuse it (503, `no_timely_destination`): the client may retry or
    /// go elsewhere rather than wait.
    Refuse,
}

/// A latency class as configured: a bare number (USD per second of
/// queueing) or the whole class.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum LatencyClassSettings {
    /// USD per second of queueing; no target.
    Value(f64),
    /// The whole class.
    Class {
        /// USD per second of queueing (default: `latency_usd_per_s`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usd_per_s: Option<f64>,
        /// Time-to-first-token target, ms.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttft_ms: Option<u32>,
        /// What a miss costs, USD (default
        /// [`LatencyClass::DEFAULT_LATE_USD`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        late_usd: Option<f64>,
        /// `serve` (default) or `refuse` when no destination is on time.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        when_late: Option<WhenLate>,
    },
}

/// Which destinations have a model resident (until the control service
/// reports it live): from each destination's `warm_models`. A destination
/// without that list counts as warm for every model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Warmth {
    /// Destinations warm for any model.
    always: Vec<u64>,
    /// Per model named in some `warm_models` (sorted): the destinations
    /// warm for it, `always` included.
    by_model: Vec<(String, Vec<u64>)>,
    /// Every destination.
    all: Vec<u64>,
}

impl Warmth {
    fn build(destinations: &[Destination]) -> Warmth {
        Warmth::from_lists(destinations.len(), |i| {
            destinations.get(i).and_then(|d| d.warm_models.as_deref())
        })
    }

    /// The warmth of `n` destinations, destination `i` warm for the models
    /// `lists(i)` names (`None`: warm for every model).
    pub fn from_lists<'a>(n: usize, lists: impl Fn(usize) -> Option<&'a [String]>) -> Warmth {
        let words = n.div_ceil(64);
        let mut always = vec![0u64; words];
        let mut by_model: std::collections::BTreeMap<&str, Vec<u64>> = Default::default();
        for i in 0..n {
            let (w, b) = (i / 64, 1u64 << (i % 64));
            match lists(i) {
                None => {
                    if let Some(x) = always.get_mut(w) {
                        *x |= b;
                    }
                }
                Some(models) => {
                    for m in models {
                        let mask = by_model.entry(m).or_insert_with(|| vec![0; words]);
                        if let Some(x) = mask.get_mut(w) {
                            *x |= b;
                        }
                    }
                }
            }
        }
        let by_model = by_model
            .into_iter()
            .map(|(m, mut mask)| {
                mask.iter_mut().zip(&always).for_each(|(x, a)| *x |= a);
                (m.to_string(), mask)
            })
            .collect();
        let mut all = vec![0u64; words];
        (0..n).for_each(|i| {
            if let Some(x) = all.get_mut(i / 64) {
                *x |= 1 << (i % 64);
            }
        });
        Warmth {
            always,
            by_model,
            all,
        }
    }

    /// The warm mask for a request for `model`. With no model named, no
    /// cold load can be attributed, so every destination counts as warm.
    #[inline]
    pub fn mask(&self, model: Option<&str>) -> &[u64] {
        let Some(model) = model else {
            return &self.all;
        };
        self.by_model
            .binary_search_by(|(m, _)| m.as_str().cmp(model))
            .ok()
            .and_then(|i| self.by_model.get(i))
            .map_or(&self.always, |(_, mask)| mask)
    }
}

/// The feasibility gate: compiled Cedar tables plus how request headers
/// map onto their attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The table bytes, kept for the life of the VM (see `tables`).
    pub tables: &'static [u8],
    /// One entry per table attribute, in table order.
    pub attributes: Vec<AttributeSource>,
    /// Refuse (400) a request missing an attribute, or restrict it.
    pub on_missing: OnMissing,
    /// The position of the `tenant` attribute, if the tables read one (its
    /// value keys the health rule on tenants).
    pub tenant: Option<usize>,
    /// The position of the `model` attribute, if the tables read one.
    pub model: Option<usize>,
    /// Attributes the filter computes itself, never from a header
    /// (`substituted`, `cached`): position and the value index of `false`,
    /// which a request takes until routing or the cache sets it.
    pub computed: Vec<(usize, u32)>,
    /// The attributes read from request headers (neither verified nor
    /// computed), for the one pass over a request's headers.
    pub from_headers: HeaderAttributes,
}

/// The attributes a request's headers carry, indexed for the pass over
/// the headers that resolves them: a header whose name has none of their
/// lengths (most of a request's) is passed over after one bit test.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderAttributes {
    /// Bit `n` set: some attribute's header name is `n` bytes long (bit 63:
    /// 63 bytes or more).
    pub lengths: u64,
    /// Their positions among the tables' attributes.
    pub positions: Vec<usize>,
}

impl HeaderAttributes {
    /// Whether a header name of `len` bytes may carry an attribute.
    pub fn may_carry(&self, len: usize) -> bool {
        self.lengths & (1 << len.min(63)) != 0
    }
}

impl Policy {
    /// The value index a computed attribute at position `i` starts at.
    pub fn computed_default(&self, i: usize) -> Option<u32> {
        self.computed.iter().find(|(p, _)| *p == i).map(|(_, v)| *v)
    }
}

/// Where one table attribute comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct AttributeSource {
    /// The attribute's name in the tables (e.g. `data_class`).
    pub name: String,
    /// The request header that carries it (e.g. `x-ace-data-class`).
    pub header: String,
    /// Value index used when the header is missing and `on_missing` is
    /// `restrict`: the configured default, or UNKNOWN (fails closed).
    pub default_index: u32,
    /// Where the value comes from instead of the header, when the operator
    /// configured a verified source (`attribute_sources`); the client's
    /// header is then removed and never read.
    pub trusted: Option<Trusted>,
}

/// A verified source for an attribute, set by something the client cannot
/// forge.
///
/// ```json
/// "attribute_sources": {
///   "data_class": {"metadata": {"namespace": "envoy.filters.http.jwt_authn",
///                               "path": ["jwt_payload", "data_class"]}},
///   "tenant": {"peer": "uri_san"}
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Trusted {
    /// Dynamic metadata written by an earlier filter that verified it, e.g.
    /// a claim of the JWT that `jwt_authn` verified (`payload_in_metadata`):
    /// the namespace, then the keys down to a string value.
    Metadata {
        /// The metadata namespace (`envoy.filters.http.jwt_authn`).
        namespace: String,
        /// Keys from the namespace down to the value.
        path: Vec<String>,
    },
    /// The downstream mTLS peer certificate's identity.
    Peer(PeerField),
}

/// Which identity of the mTLS peer certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerField {
    /// The first URI SAN (a SPIFFE id in a mesh).
    UriSan,
    /// The first DNS SAN.
    DnsSan,
    /// The subject.
    Subject,
}

impl PeerField {
    /// Envoy's attribute name under `connection.`.
    pub fn property(self) -> &'static str {
        match self {
            PeerField::UriSan => "uri_san_peer_certificate",
            PeerField::DnsSan => "dns_san_peer_certificate",
            PeerField::Subject => "subject_peer_certificate",
        }
    }
}

/// What to do with a request that lacks an attribute the tables read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissing {
    /// 400 with a JSON error naming the attribute and its header.
    Reject,
    /// Use `attribute_defaults` (the operator's most restrictive class), or
    /// the unknown value, which no permit matches: it fails closed.
    Restrict,
}

/// One place a request can be sent, as configured.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Operator-facing name, unique in the configuration.
    pub name: String,
    /// The Envoy cluster that serves this destination.
    pub cluster: String,
    /// `inhouse`, `reserved`, `spot`, `ondemand` or `payg` (default `payg`).
    #[serde(default = "default_tier")]
    pub tier: Tier,
    /// USD per input token (list price, or operating cost).
    #[serde(default)]
    pub usd_per_input_token: f64,
    /// USD per output token.
    #[serde(default)]
    pub usd_per_output_token: f64,
    /// Spot/on-demand: USD per GPU-hour.
    #[serde(default)]
    pub usd_per_gpu_hour: f64,
    /// Spot/on-demand: measured tokens per second.
    #[serde(default)]
    pub tokens_per_second: f64,
    /// Spot: eviction-risk premium (fraction).
    #[serde(default)]
    pub eviction_premium: f64,
    /// Reserved: USD per token past the commitment, if allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overage_usd_per_token: Option<f64>,
    /// Concurrent requests it can hold (0 = unlimited; payg only).
    #[serde(default)]
    pub capacity: u32,
    /// Utilisation where the latency penalty starts (default 0.8).
    #[serde(default = "default_knee")]
    pub knee: f64,
    /// Typical service time, ms (default 1000).
    #[serde(default = "default_service_ms")]
    pub service_ms: f64,
    /// Latency SLO, ms; slower answers derate the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_ms: Option<u64>,
    /// Time to first token lightly loaded, at the SLO's quantile, ms: the
    /// prior of what ACE learns from its answers (0 or absent: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttft_ms: f64,
    /// Cost of a cold model load, USD.
    #[serde(default)]
    pub cold_load_usd: f64,
    /// Rank-only preference weight (default 1; < 1 preferred).
    #[serde(default = "default_bias")]
    pub bias: f64,
    /// Models resident on the destination (a request for another one pays
    /// `cold_load_usd`). Absent: every model counts as resident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_models: Option<Vec<String>>,
    /// The price of an input token read from the provider's prompt cache,
    /// over its input price (default 1: no discount; OpenAI 0.5 or 0.1 by
    /// model, Anthropic 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_factor: Option<f64>,
    /// The price of an input token written to the prompt cache, over the
    /// input price (default 1; Anthropic 1.25 for its 5-minute cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_factor: Option<f64>,
    /// What its upstream expects: model names, the path per API, the
    /// authority, whether clients' credentials pass ([`Upstream`]).
    #[serde(default, skip_serializing_if = "Upstream::is_default")]
    pub upstream: Upstream,
    /// Its prompt cache, for prefix locality ([`PrefixCache`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCache>,
    /// The most input tokens its model takes in one request (its context
    /// window, as LiteLLM's price file gives it for the model:
    /// `max_input_tokens`, 128000 for gpt-4o). A usage an upstream claims
    /// past it is booked at it, as a provider's bill never charges more.
    /// Absent: `max_context_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u32>,
    /// The same for output (`max_output_tokens`, 16384 for gpt-4o).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

fn default_tier() -> Tier {
    Tier::Payg
}

fn default_knee() -> f64 {
    0.8
}
fn default_service_ms() -> f64 {
    Destination::DEFAULT_SERVICE_MS
}

impl Destination {
    /// `service_ms` when the configuration does not say.
    pub const DEFAULT_SERVICE_MS: f64 = 1000.0;

    /// A prompt-cache read's and write's price over the input price.
    #[inline]
    pub fn cache_factors(&self) -> (f64, f64) {
        (
            self.cached_input_factor.unwrap_or(1.0),
            self.cache_write_factor.unwrap_or(1.0),
        )
    }

    /// The most input and output tokens one request here can take: its
    /// model's own bounds (`max_input_tokens`, `max_output_tokens`), within
    /// the configuration's `max_context_tokens`.
    #[inline]
    pub fn token_bounds(&self, max_context_tokens: u32) -> (u32, u32) {
        let bound =
            |own: Option<u32>| own.map_or(max_context_tokens, |b| b.min(max_context_tokens));
        (bound(self.max_input_tokens), bound(self.max_output_tokens))
    }
}
fn default_bias() -> f64 {
    1.0
}

/// Health tunables as configured; unset ones take [`HealthPolicy`]'s
/// defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSettings {
    /// Consecutive failures that trip a destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trip_after: Option<u16>,
    /// First cooldown after a trip, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_cooldown_ms: Option<u64>,
    /// Longest cooldown after repeated trips, ms; also the longest a
    /// provider's `retry-after` or rate-limit reset holds a destination
    /// back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cooldown_ms: Option<u64>,
    /// Fraction of the cap left after a 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_cut: Option<f64>,
    /// Fraction of capacity the cap recovers per success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap_step: Option<f64>,
    /// Throttle time when a 429 gives no `retry-after`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_retry_after_ms: Option<u64>,
    /// Derate added per answer past the SLO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derate_step: Option<f64>,
    /// Largest derate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derate_max: Option<f64>,
    /// Half-life of a derate, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derate_half_life_ms: Option<u64>,
    /// Distinct tenants whose upstream failures a trip needs (and whose
    /// slow answers raising a learned latency needs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trip_tenants: Option<u8>,
    /// The quantile of time to first token learned per destination (the
    /// SLO bar's; default 0.95).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_quantile: Option<f64>,
    /// Relative step of the learned quantile per answer (default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_step: Option<f64>,
    /// Fraction of a provider's rate limit left below which its cap moves
    /// left in proportion (0 to 1, default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom_low: Option<f64>,
}

/// The default [`Config::congestion_usd_per_s`] for `classes`: the lowest
/// value of a second among the classes with a time-to-first-token target
/// (what the cheapest timed work loses a second), 0 when none has one.
pub fn congestion_floor(classes: &[(String, LatencyClass)]) -> f64 {
    classes
        .iter()
        .filter(|(_, c)| c.ttft_ms.is_some())
        .map(|(_, c)| c.usd_per_s)
        .reduce(f64::min)
        .unwrap_or(0.0)
}

/// The plugin configuration document, as `ace plugin-config` writes it
/// and the filter reads it: the one type both sides use. [`Config::parse`]
/// validates it into a [`Config`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The destinations, in the tables' order.
    pub destinations: Vec<Destination>,
    /// The request header Envoy's route reads the cluster from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_header: Option<String>,
    /// USD per second of queueing for a request of no listed latency class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_usd_per_s: Option<f64>,
    /// The least USD a second of queueing past the knee costs any request
    /// (default: the lowest `usd_per_s` of the classes with a `ttft_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_usd_per_s: Option<f64>,
    /// Latency classes: USD per second of queueing, or the whole class
    /// (`usd_per_s`, `ttft_ms`, `late_usd`, `when_late`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub latency_classes: BTreeMap<String, LatencyClassSettings>,
    /// Whether responses carry ACE's decision headers.
    #[serde(default, skip_serializing_if = "is_false")]
    pub response_headers: bool,
    /// Whether a failed request runs again on the next destination (the
    /// dynamic module only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub retry_next: bool,
    /// Output tokens assumed when a request does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_output_tokens: Option<u32>,
    /// Health tunables.
    #[serde(default, skip_serializing_if = "is_default")]
    pub health: HealthSettings,
    /// The compiled policy tables (`ace policy compile`), base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables_base64: Option<String>,
    /// What a request missing an attribute gets (default `reject`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_missing_attribute: Option<OnMissing>,
    /// The value a missing attribute takes under `restrict`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attribute_defaults: BTreeMap<String, String>,
    /// Reading request bodies.
    #[serde(default, skip_serializing_if = "is_default")]
    pub body: BodySettings,
    /// Route without policy tables, on purpose.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_no_policy: bool,
    /// The most tokens one request can take in or give out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context_tokens: Option<u32>,
    /// Attributes read from verified sources instead of headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attribute_sources: BTreeMap<String, Trusted>,
    /// The control service to poll for prices, load, capacity, drains and
    /// warm models (`ace control serve`); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlSettings>,
    /// Model routing: equivalence classes and per-destination model
    /// prices ([`RoutingSettings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_routing: Option<RoutingSettings>,
    /// The exact-match response cache ([`CacheSettings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSettings>,
    /// Prefix locality ([`LocalitySettings`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<LocalitySettings>,
    /// Tenant budgets ([`BudgetSettings`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetSettings>,
    /// How far the ledger's books trail this proxy, ms (default 5,000):
    /// a proxy counts its own spend on top of a budget's reading for this
    /// long before the reading was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_books_lag_ms: Option<u64>,
}

/// Polling the control service, as configured (see [`Control`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSettings {
    /// The Envoy cluster that reaches the control service.
    pub cluster: String,
    /// The `:authority` of the request (default: the cluster's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// The snapshot's path (default `/v1/snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// How often to poll, ms (default 1,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// How long one poll may take, ms (default: the interval, at most
    /// 5,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// How long without an answer before the snapshot is stale, ms
    /// (default: five intervals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_ms: Option<u64>,
    /// How long a destination's load figures that the control service
    /// holds (its scrapes of that model server failing) are still priced,
    /// counted from their last good scrape, ms (default: `stale_after_ms`;
    /// 0 prices none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_load_ms: Option<u64>,
    /// The bearer token the control service expects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Polling the control service, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// The Envoy cluster that reaches it.
    pub cluster: String,
    /// `:authority`.
    pub authority: String,
    /// `:path`.
    pub path: String,
    /// Poll period, ms.
    pub interval_ms: u64,
    /// Timeout of one poll, ms.
    pub timeout_ms: u64,
    /// Age at which a snapshot is stale, ms.
    pub stale_after_ms: u64,
    /// How long held load figures are priced from their scrape, ms.
    pub held_load_ms: u64,
    /// The `authorization` header's value, if any.
    pub authorization: Option<String>,
}

/// The configuration of a poller that only polls (the dynamic module's
/// bootstrap extension): `{"control": {...}}`, the plugin configuration's
/// `control` object alone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PollerConfig {
    control: ControlSettings,
}

impl Control {
    /// Parse and validate a poller's configuration, `{"control": {...}}`
    /// (the same fields, defaults and checks as the plugin configuration's
    /// `control`); an error names the field.
    pub fn parse_poller(bytes: &[u8]) -> Result<Control, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(err(
                "<root>",
                "the configuration is empty; expected {\"control\": {\"cluster\": ...}}",
            ));
        }
        let raw: PollerConfig = from_json(bytes)?;
        Control::validate(raw.control)
    }

    fn validate(s: ControlSettings) -> Result<Control, ConfigError> {
        if !is_visible_ascii(&s.cluster) {
            return Err(err(
                "control.cluster",
                "must be a non-empty Envoy cluster name of visible ASCII characters",
            ));
        }
        let authority = s.authority.unwrap_or_else(|| s.cluster.clone());
        if !is_visible_ascii(&authority) {
            return Err(err("control.authority", "must be visible ASCII, non-empty"));
        }
        let path = s.path.unwrap_or_else(|| "/v1/snapshot".to_string());
        if !path.starts_with('/') || !is_visible_ascii(&path) {
            return Err(err(
                "control.path",
                "must be a path starting with `/`, visible ASCII",
            ));
        }
        let interval_ms = s.interval_ms.unwrap_or(1000);
        if !(100..=3_600_000).contains(&interval_ms) {
            return Err(err(
                "control.interval_ms",
                "must be between 100 and 3600000 (an hour)",
            ));
        }
        let timeout_ms = s.timeout_ms.unwrap_or(interval_ms.min(5000));
        if !(10..=60_000).contains(&timeout_ms) {
            return Err(err("control.timeout_ms", "must be between 10 and 60000"));
        }
        let stale_after_ms = s.stale_after_ms.unwrap_or(interval_ms.saturating_mul(5));
        if stale_after_ms < interval_ms {
            return Err(err(
                "control.stale_after_ms",
                "must be at least control.interval_ms (a snapshot cannot go stale between polls)",
            ));
        }
        let held_load_ms = s.held_load_ms.unwrap_or(stale_after_ms);
        if held_load_ms > 3_600_000 {
            return Err(err(
                "control.held_load_ms",
                "must be at most 3600000 (an hour): held figures describe a server that stopped answering",
            ));
        }
        let authorization = match s.token {
            None => None,
            Some(t) if is_visible_ascii(&t) && !t.contains(' ') => Some(format!("Bearer {t}")),
            Some(_) => {
                return Err(err(
                    "control.token",
                    "must be a non-empty token of visible ASCII characters without spaces",
                ))
            }
        };
        Ok(Control {
            cluster: s.cluster,
            authority,
            path,
            interval_ms,
            timeout_ms,
            stale_after_ms,
            held_load_ms,
            authorization,
        })
    }
}

/// Request-body reading as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BodySettings {
    /// Whether to hold requests and read their bodies.
    #[serde(default)]
    pub read: bool,
    /// Most bytes read (default 262,144).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// A configuration that cannot be used, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the offending field, e.g. `destinations[2].cluster`.
    pub field: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid ACE plugin configuration at `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// Deserialize `bytes` (JSON), an error naming the field.
fn from_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ConfigError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path.is_empty() || path == "." || path == "?" {
            "<root>".to_string()
        } else {
            path
        };
        err(field, e.into_inner().to_string())
    })
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

impl Config {
    /// Parse and validate the plugin configuration bytes (JSON).
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(err(
                "<root>",
                "the configuration is empty; expected a JSON object with `destinations`",
            ));
        }
        let raw: PluginConfig = from_json(bytes)?;
        Self::validate(raw, config_id(bytes).into(), false)
    }

    /// Parse a configuration a filter ran with, to price the events it
    /// wrote (the ledger's use): a configuration this release would refuse
    /// for how it makes the filter read requests (`body.read` false while
    /// the tables decide on `model` or a `cache` is set) still prices its
    /// events, since those rules move no price, and an earlier release's
    /// configuration must stay bookable. Everything else is validated as
    /// by [`Config::parse`].
    pub fn parse_for_pricing(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: PluginConfig = from_json(bytes)?;
        Self::validate(raw, config_id(bytes).into(), true)
    }

    /// Validate `raw` section by section, each naming its own errors, in
    /// the order a reader meets them: the destinations, locality, the
    /// destination header, latency, the policy tables and what reads the
    /// body, health, limits, control, the cache, upstream models, budgets.
    fn validate(
        raw: PluginConfig,
        id: std::sync::Arc<str>,
        pricing: bool,
    ) -> Result<Config, ConfigError> {
        let models = validate_destinations(&raw.destinations)?;
        if let Some(l) = &raw.locality {
            l.validate()?;
        }
        let destination_header = validate_destination_header(raw.destination_header.as_deref())?;
        let latency_usd_per_s = raw.latency_usd_per_s.unwrap_or(0.001);
        if !(latency_usd_per_s.is_finite() && latency_usd_per_s >= 0.0) {
            return Err(err("latency_usd_per_s", "must be a finite number >= 0"));
        }
        let latency_classes = raw
            .latency_classes
            .iter()
            .map(|(class, v)| Ok((class.clone(), v.validate(class, latency_usd_per_s)?)))
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let congestion_usd_per_s = match raw.congestion_usd_per_s {
            Some(v) if v.is_finite() && v >= 0.0 => v,
            Some(_) => {
                return Err(err(
                    "congestion_usd_per_s",
                    "must be a finite number >= 0 (USD a second of queueing past a knee costs any request)",
                ))
            }
            None => congestion_floor(&latency_classes),
        };
        validate_warm_models(&raw.destinations)?;
        let warmth = Warmth::build(&raw.destinations);
        let fingerprint = fingerprint(&raw.destinations);
        let policy = validate_policy(&raw)?;
        // A configuration a filter ran with still prices its events
        // whatever the body rules say (`parse_for_pricing`).
        let reads_body = raw.body.read || pricing;
        if policy.as_ref().is_some_and(|p| p.model.is_some()) && !reads_body {
            return Err(err(
                "body.read",
                "is false but the policy tables decide on `model`: the upstream serves the \
                 model its body names, so ACE must read it; set body.read to true",
            ));
        }
        // A trip needs two tenants by default when the tables know tenants.
        let tenants = policy.as_ref().is_some_and(|p| p.tenant.is_some());
        let health = health_policy(&raw.health, if tenants { 2 } else { 1 })?;
        let max_context_tokens = raw.max_context_tokens.unwrap_or(1 << 20);
        if max_context_tokens == 0 {
            return Err(err("max_context_tokens", "must be at least 1"));
        }
        let max_body_bytes = raw.body.validate()?;
        let control = raw.control.map(Control::validate).transpose()?;
        if raw.cache.is_some() && !reads_body {
            return Err(err(
                "body.read",
                "is false but `cache` is set: the cache key is the request body; set body.read",
            ));
        }
        let serving = Serving::new(raw.destinations.iter().map(|d| &d.upstream));
        let renames = |d: &Destination| d.upstream.models.iter().any(|(m, n)| m != n);
        if let Some(i) = raw.destinations.iter().position(renames) {
            if !reads_body {
                return Err(err(
                    format!("destinations[{i}].upstream.models"),
                    "renames a model but body.read is false: the upstream reads the model its \
                     body names, so ACE must read the body to rewrite it; set body.read to true",
                ));
            }
        }
        let lag = raw.budget_books_lag_ms;
        let budgets = validate_budgets(&raw.budgets, lag, policy.as_ref(), pricing)?;
        Ok(Config {
            budgets,
            serving,
            model_routing: raw.model_routing,
            cache: raw.cache,
            locality: raw.locality,
            control,
            read_body: raw.body.read,
            max_body_bytes,
            policy,
            destinations: raw.destinations,
            models,
            destination_header,
            latency_usd_per_s,
            latency_classes,
            congestion_usd_per_s,
            warmth,
            response_headers: raw.response_headers,
            retry_next: raw.retry_next,
            default_output_tokens: raw
                .default_output_tokens
                .unwrap_or(256)
                .min(max_context_tokens),
            health,
            fingerprint,
            max_context_tokens,
            id,
            no_policy: raw.allow_no_policy,
        })
    }
}

/// The destinations: at least one, each valid, their names unique; each
/// one's cost model, in order.
fn validate_destinations(ds: &[Destination]) -> Result<Vec<CostModel>, ConfigError> {
    if ds.is_empty() {
        return Err(err("destinations", "at least one destination is required"));
    }
    let mut names = HashSet::new();
    let mut models = Vec::with_capacity(ds.len());
    for (i, d) in ds.iter().enumerate() {
        if d.name.trim().is_empty() {
            return Err(err(format!("destinations[{i}].name"), "must not be empty"));
        }
        if !names.insert(d.name.as_str()) {
            return Err(err(
                format!("destinations[{i}].name"),
                format!(
                    "duplicate destination name {:?}; names must be unique",
                    d.name
                ),
            ));
        }
        models.push(d.validate(i)?);
    }
    Ok(models)
}

impl Destination {
    /// Check destination `i` (its name aside), naming the bad field; its
    /// cost model.
    fn validate(&self, i: usize) -> Result<CostModel, ConfigError> {
        let d = self;
        if !is_visible_ascii(&d.cluster) {
            return Err(err(
                format!("destinations[{i}].cluster"),
                "must be a non-empty Envoy cluster name of visible ASCII characters",
            ));
        }
        if let Some(0) = d.slo_ms {
            return Err(err(
                format!("destinations[{i}].slo_ms"),
                "must be > 0 when set",
            ));
        }
        let model = CostModel {
            tier: d.tier,
            usd_per_input_token: d.usd_per_input_token,
            usd_per_output_token: d.usd_per_output_token,
            usd_per_gpu_hour: d.usd_per_gpu_hour,
            tokens_per_second: d.tokens_per_second,
            eviction_premium: d.eviction_premium,
            overage_usd_per_token: d.overage_usd_per_token,
            capacity: d.capacity,
            knee: d.knee,
            service_ms: d.service_ms,
            ttft_ms: d.ttft_ms,
            cold_load_usd: d.cold_load_usd,
            bias: d.bias,
        };
        model.validate().map_err(|e| {
            err(
                format!("destinations[{i}].{}", e.field),
                format!("must be {}", e.expected),
            )
        })?;
        d.upstream.validate(i)?;
        for (name, f) in [
            ("cached_input_factor", d.cached_input_factor),
            ("cache_write_factor", d.cache_write_factor),
        ] {
            if f.is_some_and(|f| !(f.is_finite() && (0.0..=10.0).contains(&f))) {
                return Err(err(
                    format!("destinations[{i}].{name}"),
                    "must be a number from 0 to 10: the prompt cache's price over the input \
                     price (0.1 is a tenth of it)",
                ));
            }
        }
        if let Some(p) = &d.prefix_cache {
            p.validate(i)?;
        }
        for (name, bound) in [
            ("max_input_tokens", d.max_input_tokens),
            ("max_output_tokens", d.max_output_tokens),
        ] {
            if bound == Some(0) {
                return Err(err(
                    format!("destinations[{i}].{name}"),
                    format!(
                        "must be at least 1 when set: the most tokens its model takes in one \
                         request, as LiteLLM's price file gives it for the model (`{name}`, \
                         e.g. 128000 input and 16384 output for gpt-4o); leave it out to bound \
                         by `max_context_tokens`"
                    ),
                ));
            }
        }
        Ok(model)
    }
}

/// No destination lists an empty warm model.
fn validate_warm_models(ds: &[Destination]) -> Result<(), ConfigError> {
    for (i, d) in ds.iter().enumerate() {
        if let Some(m) = d
            .warm_models
            .iter()
            .flatten()
            .position(|m| m.trim().is_empty())
        {
            return Err(err(
                format!("destinations[{i}].warm_models[{m}]"),
                "must be a model name, not empty",
            ));
        }
    }
    Ok(())
}

impl LocalitySettings {
    /// Check prefix locality's table size and session header.
    fn validate(&self) -> Result<(), ConfigError> {
        if self
            .slots_per_destination
            .is_some_and(|n| !(1..=1 << 20).contains(&n))
        {
            return Err(err(
                "locality.slots_per_destination",
                "must be from 1 to 1048576",
            ));
        }
        if let Some(h) = &self.session_header {
            let valid = !h.is_empty()
                && h.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                });
            if !valid {
                return Err(err(
                    "locality.session_header",
                    format!("{h:?} is not a lowercase header name (letters, digits, '-', '_')"),
                ));
            }
        }
        Ok(())
    }
}

/// The destination header, lowercase (default
/// [`DEFAULT_DESTINATION_HEADER`]).
fn validate_destination_header(h: Option<&str>) -> Result<String, ConfigError> {
    let Some(h) = h else {
        return Ok(DEFAULT_DESTINATION_HEADER.to_string());
    };
    let lower = h.to_ascii_lowercase();
    let valid = !lower.is_empty()
        && lower
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(err(
            "destination_header",
            format!("{h:?} is not a valid header name (letters, digits, '-', '_')"),
        ));
    }
    Ok(lower)
}

impl LatencyClassSettings {
    /// Check latency class `class`; `usd_per_s` is what a second is worth
    /// when the class does not say.
    fn validate(&self, class: &str, usd_per_s: f64) -> Result<LatencyClass, ConfigError> {
        let usd = |field: &str, v: f64, what: &str| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(err(
                    format!("latency_classes.{class}{field}"),
                    format!("must be a finite number >= 0 ({what})"),
                ))
            }
        };
        match self {
            LatencyClassSettings::Value(v) => Ok(LatencyClass::untimed(usd(
                "",
                *v,
                "USD per second of queueing delay, or the class as an object",
            )?)),
            LatencyClassSettings::Class {
                usd_per_s: own,
                ttft_ms,
                late_usd,
                when_late,
            } => {
                if *ttft_ms == Some(0) {
                    return Err(err(
                        format!("latency_classes.{class}.ttft_ms"),
                        "must be > 0 when set (the class's time-to-first-token target, ms)",
                    ));
                }
                Ok(LatencyClass {
                    usd_per_s: usd(
                        ".usd_per_s",
                        own.unwrap_or(usd_per_s),
                        "USD per second of queueing delay",
                    )?,
                    ttft_ms: *ttft_ms,
                    late_usd: usd(
                        ".late_usd",
                        late_usd.unwrap_or(LatencyClass::DEFAULT_LATE_USD),
                        "USD that missing the class's target costs",
                    )?,
                    when_late: when_late.unwrap_or_default(),
                })
            }
        }
    }
}

/// The policy tables, or none on purpose (`allow_no_policy`): attribute
/// defaults and sources need the tables, and tables and
/// `allow_no_policy` exclude each other.
fn validate_policy(raw: &PluginConfig) -> Result<Option<Policy>, ConfigError> {
    match &raw.tables_base64 {
        None => {
            if !raw.attribute_defaults.is_empty() {
                return Err(err(
                    "attribute_defaults",
                    "set without tables_base64; defaults need compiled policy tables",
                ));
            }
            if !raw.attribute_sources.is_empty() {
                return Err(err(
                    "attribute_sources",
                    "set without tables_base64; sources need compiled policy tables",
                ));
            }
            if !raw.allow_no_policy {
                return Err(err(
                    "tables_base64",
                    "is missing: without compiled policy tables every destination would be \
                     feasible for every request; paste the output of `ace plugin-config`, or \
                     set \"allow_no_policy\": true to route without any policy on purpose",
                ));
            }
            Ok(None)
        }
        Some(_) if raw.allow_no_policy => Err(err(
            "allow_no_policy",
            "is true but tables_base64 is set; drop one of them",
        )),
        Some(b64) => Ok(Some(load_policy(
            b64,
            &raw.destinations,
            raw.on_missing_attribute.unwrap_or(OnMissing::Reject),
            &raw.attribute_defaults,
            &raw.attribute_sources,
        )?)),
    }
}

impl BodySettings {
    /// The most bytes of a body read.
    fn validate(&self) -> Result<usize, ConfigError> {
        let max_body_bytes = self.max_bytes.unwrap_or(256 * 1024);
        if !(64..=16 * 1024 * 1024).contains(&max_body_bytes) {
            return Err(err(
                "body.max_bytes",
                "must be between 64 and 16777216 (Envoy buffers at most its per-connection limit anyway)",
            ));
        }
        Ok(max_body_bytes)
    }
}

/// The budgets, the books' lag (`budget_books_lag_ms`), and (unless
/// `pricing`) their tenants against the policy tables'.
fn validate_budgets(
    raw: &[BudgetSettings],
    books_lag_ms: Option<u64>,
    policy: Option<&Policy>,
    pricing: bool,
) -> Result<Budgets, ConfigError> {
    let mut budgets = Budgets::validate(raw)?;
    if let Some(lag) = books_lag_ms {
        if lag > 3_600_000 {
            return Err(err(
                "budget_books_lag_ms",
                "must be at most 3600000 (an hour): ingest the access log more often",
            ));
        }
        budgets.lag_ms = lag;
    }
    if !budgets.list.is_empty() && !pricing {
        check_budget_tenants(&budgets, policy)?;
    }
    Ok(budgets)
}

/// Budgets count a tenant by the policy tables' `tenant` attribute (the
/// verified value where it has a source), so each budget's tenants must be
/// values the tables know: an unknown one would be the tables' catch-all,
/// every tenant they do not name.
fn check_budget_tenants(budgets: &Budgets, policy: Option<&Policy>) -> Result<(), ConfigError> {
    let no_tenant = || {
        err(
            "budgets",
            "are set but the policy tables read no `tenant` attribute, so no request has a tenant to count: compile policies that decide on `tenant`",
        )
    };
    let policy = policy.ok_or_else(no_tenant)?;
    let t = policy.tenant.ok_or_else(no_tenant)?;
    let tables = ace_core::tables::Tables::load(policy.tables)
        .map_err(|e| err("tables_base64", e.to_string()))?;
    for (i, b) in budgets.list.iter().enumerate() {
        for (j, name) in b.tenants.iter().enumerate() {
            if tables.value_index(t as u32, name) == ace_core::tables::UNKNOWN {
                return Err(err(
                    format!("budgets[{i}].tenants[{j}]"),
                    format!(
                        "`{name}` is not a tenant the policy tables know (they would read it as any \
                         unknown tenant); name it in the manifest's [[tenants]], or drop it"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn health_policy(h: &HealthSettings, trip_tenants: u8) -> Result<HealthPolicy, ConfigError> {
    let d = HealthPolicy::default();
    let p = HealthPolicy {
        trip_after: h.trip_after.unwrap_or(d.trip_after),
        base_cooldown_ms: h.base_cooldown_ms.unwrap_or(d.base_cooldown_ms),
        max_cooldown_ms: h.max_cooldown_ms.unwrap_or(d.max_cooldown_ms),
        cap_cut: h.cap_cut.unwrap_or(d.cap_cut),
        cap_step: h.cap_step.unwrap_or(d.cap_step),
        default_retry_after_ms: h.default_retry_after_ms.unwrap_or(d.default_retry_after_ms),
        derate_step: h.derate_step.unwrap_or(d.derate_step),
        derate_max: h.derate_max.unwrap_or(d.derate_max),
        derate_half_life_ms: h.derate_half_life_ms.unwrap_or(d.derate_half_life_ms),
        trip_tenants: h.trip_tenants.unwrap_or(trip_tenants),
        learn: ace_core::latency::LearnPolicy {
            quantile: h.ttft_quantile.unwrap_or(d.learn.quantile),
            step: h.ttft_step.unwrap_or(d.learn.step),
        },
        headroom_low: h.headroom_low.unwrap_or(d.headroom_low),
    };
    if !(0.0..=1.0).contains(&p.headroom_low) {
        return Err(err(
            "health.headroom_low",
            "must be a fraction in [0, 1]: the share of a provider's rate limit left below which \
             its cap moves left",
        ));
    }
    p.learn.validate().map_err(|e| {
        err(
            format!("health.{}", e.field),
            format!("must be {}", e.expected),
        )
    })?;
    if !(1..=2).contains(&p.trip_tenants) {
        return Err(err(
            "health.trip_tenants",
            "must be 1 (any failures trip a destination) or 2 (failures from two tenants, or one \
             no tenant can cause)",
        ));
    }
    if p.trip_after == 0 {
        return Err(err("health.trip_after", "must be at least 1"));
    }
    if p.base_cooldown_ms == 0 || p.max_cooldown_ms < p.base_cooldown_ms {
        return Err(err(
            "health.base_cooldown_ms",
            "must be > 0 and at most health.max_cooldown_ms",
        ));
    }
    if !(p.cap_cut.is_finite() && p.cap_cut > 0.0 && p.cap_cut < 1.0) {
        return Err(err("health.cap_cut", "must be a fraction in (0, 1)"));
    }
    if !(p.cap_step.is_finite() && p.cap_step > 0.0 && p.cap_step <= 1.0) {
        return Err(err("health.cap_step", "must be a fraction in (0, 1]"));
    }
    if !(p.derate_step.is_finite() && p.derate_step >= 1.0) {
        return Err(err("health.derate_step", "must be a finite number >= 1"));
    }
    if !(p.derate_max.is_finite() && p.derate_max >= 1.0) {
        return Err(err("health.derate_max", "must be a finite number >= 1"));
    }
    Ok(p)
}

/// Decode, load and check the tables against the destinations.
///
/// The bytes are leaked on purpose: the tables are borrowed zero-copy on
/// every request for the life of the configuration, and a configuration
/// lives until Envoy replaces it (rarely). Each accepted configuration
/// therefore costs its table size once.
fn load_policy(
    b64: &str,
    destinations: &[Destination],
    on_missing: OnMissing,
    defaults: &std::collections::BTreeMap<String, String>,
    sources: &std::collections::BTreeMap<String, Trusted>,
) -> Result<Policy, ConfigError> {
    use ace_core::tables::{Tables, UNKNOWN};
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| err("tables_base64", format!("is not valid base64 ({e}); paste the output of `ace policy compile --plugin-config`")))?;
    let tables = Tables::load(&bytes).map_err(|e| err("tables_base64", e.to_string()))?;
    if tables.destination_count() != destinations.len() {
        return Err(err(
            "tables_base64",
            format!(
                "the tables hold {} destinations but `destinations` lists {}; compile the tables from the same fleet manifest",
                tables.destination_count(),
                destinations.len()
            ),
        ));
    }
    for (i, d) in destinations.iter().enumerate() {
        let name = tables.destination_name(i).unwrap_or("");
        if name != d.name {
            return Err(err(
                format!("destinations[{i}].name"),
                format!("is {:?} but the tables' destination {i} is {name:?}; destinations must be in table order", d.name),
            ));
        }
        // The tables were proven for this cluster: routing the destination's
        // traffic anywhere else would undo them.
        let cluster = tables.destination_cluster(i).unwrap_or("");
        if cluster != d.cluster {
            return Err(err(
                format!("destinations[{i}].cluster"),
                format!(
                    "is {:?} but the compiled tables bind destination {:?} to cluster {cluster:?}; \
                     change the cluster in the fleet manifest and recompile (`ace plugin-config`)",
                    d.cluster, d.name
                ),
            ));
        }
    }
    let mut attributes = Vec::with_capacity(tables.attribute_count());
    for a in 0..tables.attribute_count() as u32 {
        let name = tables.attribute_name(a).unwrap_or("").to_string();
        let default_index = match defaults.get(&name) {
            None => UNKNOWN,
            Some(v) => {
                let idx = tables.value_index(a, v);
                if idx == UNKNOWN {
                    return Err(err(
                        format!("attribute_defaults.{name}"),
                        format!("{v:?} is not in the domain of `{name}` in the compiled tables"),
                    ));
                }
                idx
            }
        };
        let trusted = sources.get(&name).cloned();
        if let Some(Trusted::Metadata { namespace, path }) = &trusted {
            if namespace.is_empty() || path.is_empty() || path.iter().any(String::is_empty) {
                return Err(err(
                    format!("attribute_sources.{name}.metadata"),
                    "needs a non-empty namespace and a non-empty path of non-empty keys",
                ));
            }
        }
        attributes.push(AttributeSource {
            // Lower case, as Envoy hands header names over.
            header: format!("x-ace-{}", name.replace('_', "-").to_ascii_lowercase()),
            name,
            default_index,
            trusted,
        });
    }
    for k in sources.keys() {
        if !attributes.iter().any(|a| &a.name == k) {
            return Err(err(
                format!("attribute_sources.{k}"),
                "names no attribute of the compiled tables",
            ));
        }
    }
    for k in defaults.keys() {
        if !attributes.iter().any(|a| &a.name == k) {
            return Err(err(
                format!("attribute_defaults.{k}"),
                "names no attribute of the compiled tables",
            ));
        }
    }
    let position = |n: &str| attributes.iter().position(|a| a.name == n);
    let (tenant, model) = (position("tenant"), position("model"));
    let mut computed = Vec::new();
    for name in [SUBSTITUTED, CACHED] {
        let Some(i) = position(name) else { continue };
        let no = tables.value_index(i as u32, "false");
        if no == UNKNOWN || tables.value_count(i as u32) != 2 {
            return Err(err(
                "tables_base64",
                format!(
                    "the tables' `{name}` attribute is not a Bool; ACE sets `{name}` itself, so \
                     declare it `{name}: Bool` in the context of `dispatch` and recompile"
                ),
            ));
        }
        if sources.contains_key(name) || defaults.contains_key(name) {
            return Err(err(
                format!("attribute_sources.{name}"),
                format!("`{name}` is computed by ACE, never read from a request; drop it"),
            ));
        }
        computed.push((i, no));
    }
    let mut from_headers = HeaderAttributes::default();
    for (i, a) in attributes.iter().enumerate() {
        if a.trusted.is_none() && !computed.iter().any(|(p, _)| *p == i) {
            from_headers.lengths |= 1 << a.header.len().min(63);
            from_headers.positions.push(i);
        }
    }
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    Ok(Policy {
        tables: leaked,
        attributes,
        on_missing,
        tenant,
        model,
        computed,
        from_headers,
    })
}

/// The first 16 hex digits of the SHA-256 of `bytes` (see [`Config::id`]).
pub fn config_id(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// FNV-1a over the names and clusters, in order.
fn fingerprint(ds: &[Destination]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for d in ds {
        for b in d
            .name
            .bytes()
            .chain([0])
            .chain(d.cluster.bytes())
            .chain([0])
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn is_visible_ascii(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(json: &str) -> String {
        match Config::parse(json.as_bytes()) {
            Ok(c) => format!("unexpectedly valid: {c:?}"),
            Err(e) => e.field,
        }
    }

    #[test]
    fn accepts_a_good_configuration_with_defaults() {
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"ca","tier":"inhouse","capacity":4},
                                 {"name":"b","cluster":"cb","usd_per_input_token":1e-6}]}"#,
        )
        .map_err(|e| e.to_string());
        let c = match c {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.destinations.len(), 2);
        assert_eq!(c.destination_header, "x-ace-destination");
        assert_eq!(c.models[0].tier, Tier::InHouse);
        assert_eq!(c.models[1].tier, Tier::Payg);
        assert_eq!(c.models[1].knee, 0.8);
        assert_eq!(c.health, HealthPolicy::default());
    }

    /// A destination's model bounds what one request there can book,
    /// within the configuration's own bound; absent, the configuration's
    /// bound alone; 0 is refused, naming the field.
    #[test]
    fn a_models_own_token_bounds_hold_within_the_context_window() {
        let parse = |extra: &str| {
            Config::parse(
                format!(
                    r#"{{"allow_no_policy":true,"max_context_tokens":100000,
                        "destinations":[{{"name":"a","cluster":"ca"{extra}}}]}}"#
                )
                .as_bytes(),
            )
        };
        let bounds = |extra: &str| {
            let c = parse(extra).unwrap_or_else(|e| panic!("{e}"));
            c.destinations[0].token_bounds(c.max_context_tokens)
        };
        assert_eq!(bounds(""), (100000, 100000));
        assert_eq!(
            bounds(r#","max_input_tokens":128000,"max_output_tokens":16384"#),
            (100000, 16384)
        );
        for field in ["max_input_tokens", "max_output_tokens"] {
            let e = parse(&format!(r#","{field}":0"#)).expect_err(field);
            assert_eq!(e.field, format!("destinations[0].{field}"));
            assert!(e.message.contains("price file"), "{e}");
        }
    }

    #[test]
    fn queueing_past_a_knee_costs_at_least_what_the_cheapest_timed_class_loses() {
        let parse = |extra: &str| {
            Config::parse(
                format!(
                    r#"{{"allow_no_policy":true,"destinations":[{{"name":"a","cluster":"ca"}}],
                        "latency_classes":{{"interactive":{{"usd_per_s":0.01,"ttft_ms":1000}},
                                           "standard":{{"usd_per_s":0.002,"ttft_ms":3000}},
                                           "batch":0}}{extra}}}"#
                )
                .as_bytes(),
            )
        };
        let c = parse("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.congestion_usd_per_s, 0.002, "the standard class's");
        let c = parse(r#","congestion_usd_per_s":0"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.congestion_usd_per_s, 0.0, "as configured");
        let e = parse(r#","congestion_usd_per_s":-1"#).unwrap_err();
        assert_eq!(e.field, "congestion_usd_per_s");
        // No timed class: no floor.
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"ca"}],
                 "latency_classes":{"interactive":0.01,"batch":0}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.congestion_usd_per_s, 0.0);
    }

    #[test]
    fn a_latency_class_carries_its_target_and_what_lateness_does() {
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"ca","ttft_ms":450}],
                 "latency_usd_per_s":0.002,
                 "latency_classes":{"interactive":{"ttft_ms":1000},
                                    "live":{"usd_per_s":0.1,"ttft_ms":300,"late_usd":1,"when_late":"refuse"},
                                    "batch":0}}"#,
        )
        .unwrap();
        let i = c.latency_class(Some("interactive"));
        assert_eq!(
            (i.usd_per_s, i.ttft_ms, i.late_usd, i.when_late),
            (
                0.002,
                Some(1000),
                LatencyClass::DEFAULT_LATE_USD,
                WhenLate::Serve
            )
        );
        let l = c.latency_class(Some("live"));
        assert_eq!(
            (l.usd_per_s, l.ttft_ms, l.late_usd, l.when_late),
            (0.1, Some(300), 1.0, WhenLate::Refuse)
        );
        assert_eq!(c.latency_class(Some("batch")).ttft_ms, None);
        assert_eq!(c.latency_class(Some("other")).ttft_ms, None);
        assert_eq!(c.models[0].ttft_ms, 450.0);
        let dest = r#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c"}],"#;
        for (bad, field) in [
            (
                r#""latency_classes":{"x":{"ttft_ms":0}}}"#,
                "latency_classes.x.ttft_ms",
            ),
            (
                r#""latency_classes":{"x":{"late_usd":-1}}}"#,
                "latency_classes.x.late_usd",
            ),
            (
                r#""latency_classes":{"x":{"usd_per_s":-1}}}"#,
                "latency_classes.x.usd_per_s",
            ),
            (r#""health":{"ttft_quantile":0.4}}"#, "health.ttft_quantile"),
            (r#""health":{"ttft_step":1.5}}"#, "health.ttft_step"),
        ] {
            assert_eq!(field_of(&format!("{dest}{bad}")), field, "{bad}");
        }
        let neg =
            r#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c","ttft_ms":-5}]}"#;
        assert_eq!(field_of(neg), "destinations[0].ttft_ms");
        // An unknown answer to lateness is a parse error naming the class.
        let e = Config::parse(
            format!(r#"{dest}"latency_classes":{{"x":{{"when_late":"queue"}}}}}}"#).as_bytes(),
        )
        .map(|_| ())
        .unwrap_err();
        assert!(e.to_string().contains("latency_classes"), "{e}");
    }

    #[test]
    fn latency_value_by_class_with_a_default() {
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"ca"}],"latency_usd_per_s":0.002,
                 "latency_classes":{"interactive":0.01,"batch":0}}"#,
        )
        .unwrap();
        assert_eq!(c.latency_value(Some("interactive")), 0.01);
        assert_eq!(c.latency_value(Some("batch")), 0.0);
        assert_eq!(c.latency_value(Some("standard")), 0.002);
        assert_eq!(c.latency_value(None), 0.002);
        assert_eq!(
            field_of(
                r#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c"}],"latency_classes":{"fast":-1}}"#
            ),
            "latency_classes.fast"
        );
        assert!(!c.response_headers, "response headers are opt-in");
    }

    #[test]
    fn warm_masks_by_model() {
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[
                {"name":"a","cluster":"ca","warm_models":["m1"]},
                {"name":"b","cluster":"cb"},
                {"name":"c","cluster":"cc","warm_models":["m1","m2"]},
                {"name":"d","cluster":"cd","warm_models":[]}]}"#,
        )
        .unwrap();
        let w = &c.warmth;
        assert_eq!(w.mask(Some("m1")), &[0b0111]);
        assert_eq!(w.mask(Some("m2")), &[0b0110]);
        assert_eq!(w.mask(Some("other")), &[0b0010]);
        assert_eq!(w.mask(None), &[0b1111]);
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","warm_models":["m",""]}]}"#),
            "destinations[0].warm_models[1]"
        );
    }

    #[test]
    fn a_poller_takes_the_control_object_alone() {
        let c =
            Control::parse_poller(br#"{"control":{"cluster":"ace_control","interval_ms":500}}"#)
                .unwrap();
        assert_eq!(c.cluster, "ace_control");
        assert_eq!(
            c.authority, "ace_control",
            "defaults as in the plugin configuration"
        );
        assert_eq!(
            (
                c.interval_ms,
                c.timeout_ms,
                c.stale_after_ms,
                c.held_load_ms
            ),
            (500, 500, 2500, 2500)
        );
        let field = |json: &str| Control::parse_poller(json.as_bytes()).unwrap_err().field;
        assert_eq!(
            field(r#"{"control":{"cluster":"c","held_load_ms":3600001}}"#),
            "control.held_load_ms"
        );
        assert_eq!(field(""), "<root>");
        assert_eq!(field("{}"), "<root>");
        assert_eq!(field(r#"{"control":{"cluster":""}}"#), "control.cluster");
        assert_eq!(
            field(r#"{"control":{"cluster":"c","interval_ms":5}}"#),
            "control.interval_ms"
        );
        assert_eq!(
            field(r#"{"control":{"cluster":"c","tokn":"t"}}"#),
            "control.tokn"
        );
        assert_eq!(field(r#"{"control":{"cluster":"c"},"x":1}"#), "x");
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(""), "<root>");
        assert_eq!(field_of("{"), "<root>");
        assert_eq!(field_of(r#"{"destinations":[]}"#), "destinations");
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","usd_per_input_token":"x"}]}"#),
            "destinations[0].usd_per_input_token"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","usd_per_input_token":-1}]}"#),
            "destinations[0].usd_per_input_token"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c"},{"name":"a","cluster":"d"}]}"#),
            "destinations[1].name"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":""}]}"#),
            "destinations[0].cluster"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","tier":"gold"}]}"#),
            "destinations[0].tier"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","tier":"inhouse"}]}"#),
            "destinations[0].capacity"
        );
        assert_eq!(
            field_of(r#"{"destinations":[{"name":"a","cluster":"c","colour":1}]}"#),
            "destinations[0].colour"
        );
        assert_eq!(
            field_of(
                r#"{"destinations":[{"name":"a","cluster":"c"}],"destination_header":"bad header"}"#
            ),
            "destination_header"
        );
        assert_eq!(
            field_of(
                r#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c"}],"health":{"cap_cut":2}}"#
            ),
            "health.cap_cut"
        );
    }

    #[test]
    fn no_tables_is_refused_unless_opted_out_and_ids_follow_the_bytes() {
        let bare = r#"{"destinations":[{"name":"a","cluster":"c"}]}"#;
        assert_eq!(field_of(bare), "tables_base64");
        let c = Config::parse(
            br#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c"}]}"#,
        );
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert!(c.no_policy);
        assert_eq!(c.id.len(), 16);
        let again = Config::parse(
            br#"{"allow_no_policy":true, "destinations":[{"name":"a","cluster":"c"}]}"#,
        );
        assert_ne!(again.map(|c| c.id), Ok(c.id), "another byte, another id");
        assert_eq!(
            field_of(
                r#"{"allow_no_policy":true,"destinations":[{"name":"a","cluster":"c"}],"health":{"trip_tenants":3}}"#
            ),
            "health.trip_tenants"
        );
    }

    #[test]
    fn tables_bind_each_destination_to_its_cluster() {
        use ace_core::tables::{encode, DestinationSpec, FactorKind, FactorSpec, TableSpec};
        use base64::Engine;
        let spec = TableSpec {
            destinations: vec![
                DestinationSpec::new("eu", "eu_c"),
                DestinationSpec::new("sg", "sg_c"),
            ],
            attributes: vec![],
            factors: vec![FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![0b11],
            }],
        };
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(encode(&spec).unwrap_or_else(|e| panic!("{e}")));
        let with = |eu: &str| {
            format!(
                r#"{{"destinations":[{{"name":"eu","cluster":"{eu}"}},{{"name":"sg","cluster":"sg_c"}}],"tables_base64":"{b64}"}}"#
            )
        };
        assert!(Config::parse(with("eu_c").as_bytes()).is_ok());
        let e = Config::parse(with("sg_c").as_bytes()).err();
        assert_eq!(
            e.as_ref().map(|e| e.field.as_str()),
            Some("destinations[0].cluster")
        );
        assert!(e.is_some_and(|e| e.message.contains("eu_c")));
        assert_eq!(
            field_of(&format!(
                r#"{{"allow_no_policy":true,"destinations":[{{"name":"eu","cluster":"eu_c"}},{{"name":"sg","cluster":"sg_c"}}],"tables_base64":"{b64}"}}"#
            )),
            "allow_no_policy"
        );
    }

    #[test]
    fn missing_field_message_names_it() {
        let e = Config::parse(br#"{"allow_no_policy":true,"destinations":[{"name":"a"}]}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("cluster"), "{e}");
    }
}
