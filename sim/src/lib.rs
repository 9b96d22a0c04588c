//! ace-sim: does one merit order over all capacity beat each tool
//! optimising its own rung? A deterministic discrete-event simulation of
//! a fleet serving a real request trace, run once per policy on the same
//! arrivals, failures and evictions.
//!
//! The pieces, each in its own module:
//!
//! - [`trace`]: the requests (the Azure LLM inference trace, any CSV with
//!   its columns, or a synthetic one) and the day they are spread over;
//! - [`mix`]: who sends them (tenants, data and latency classes, models),
//!   checked against the fleet manifest, with the Cedar feasible set of
//!   every combination as the compliance oracle;
//! - [`fleet`]: what each destination does with a request (continuous
//!   batching, commitments, evictions, APIs, injected failures);
//! - [`engine`]: the event loop, the same for every policy;
//! - [`policy`]: ACE (the filter's own request flow) and the strategies
//!   it is compared with;
//! - [`metrics`], [`slo`], [`report`]: the figures, per run and over seeds;
//!   [`chart`]: the same as SVG charts;
//! - [`rng`]: the seeded random streams every draw comes from.
//!
//! Same inputs and seed, same bytes out: every random draw comes from a
//! seeded stream of its own, nothing reads the clock, and runs in
//! parallel threads are gathered in a fixed order.
// The no-panic lints of product code (tests/tests/lints.rs checks them;
// tests may still unwrap and index: clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![deny(clippy::panic, clippy::indexing_slicing)]

pub mod chart;
pub mod engine;
pub mod fleet;
pub mod metrics;
pub mod mix;
pub mod policy;
pub mod report;
pub mod rng;
pub mod slo;
pub mod trace;

use ace_config::Config;
use ace_core::cost::Tier;
use engine::{Policy, Run};
use fleet::{Fault, FaultKind, FleetModel, Params, SpotProcess, Upstream};
use metrics::Metrics;
use mix::{Mix, Profile};
use policy::litellm::{Strategy, Variant};
use rng::Rng;
use slo::Targets;
use trace::{Req, Row, DAY_MS};

/// The policies `ace sim` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// ACE through the filter's flow.
    Ace,
    /// ACE as dispatch alone: every request served the model it named
    /// (the operator's policies plus [`NO_SUBSTITUTION`]), at the same
    /// prices, with the same rules, over the same fleet.
    AceNoRouting,
    /// Everything to pay-as-you-go.
    AllPayg,
    /// LiteLLM's router with one strategy, configured by the default
    /// mapping.
    LiteLlm(Strategy),
    /// LiteLLM's router configured as a competent operator would: its
    /// `cost-based-routing` with one of the [`Variant::OPERATOR`]s.
    LiteLlmOperator(Variant),
    /// A priority-fallback gateway.
    Priority,
    /// Owned GPUs first, overflow to pay-as-you-go.
    OwnedFirst,
    /// ACE with prefix locality (`"locality": {}` in its configuration):
    /// on a trace with prompt blocks only.
    AceLocality,
    /// An engine-side prefix-aware router (SGLang's cache-aware router,
    /// llm-d's prefix-cache scorer) over the owned GPU servers, behind a gateway
    /// that spills to pay-as-you-go ([`policy::prefix`]).
    CacheAware,
}

impl PolicyKind {
    /// Every policy, in table order: the peers with their defaults, then
    /// as a competent operator configures them, so that the table's best
    /// peer is the best a peer can do.
    pub const ALL: [PolicyKind; 16] = [
        PolicyKind::Ace,
        PolicyKind::AceNoRouting,
        PolicyKind::AllPayg,
        PolicyKind::LiteLlm(Strategy::SimpleShuffle),
        PolicyKind::LiteLlm(Strategy::LeastBusy),
        PolicyKind::LiteLlm(Strategy::UsageBased),
        PolicyKind::LiteLlm(Strategy::LatencyBased),
        PolicyKind::LiteLlm(Strategy::CostBased),
        PolicyKind::LiteLlmOperator(Variant::KneeCap),
        PolicyKind::LiteLlmOperator(Variant::Compliant),
        PolicyKind::LiteLlmOperator(Variant::TeamAlias),
        PolicyKind::LiteLlmOperator(Variant::TeamAliasSplit),
        PolicyKind::LiteLlmOperator(Variant::Order),
        PolicyKind::LiteLlmOperator(Variant::OrderSplit),
        PolicyKind::Priority,
        PolicyKind::OwnedFirst,
    ];

    /// The policies that need a trace with prompt blocks (the Mooncake
    /// format), compared beside [`PolicyKind::ALL`] on such a trace.
    pub const PREFIX: [PolicyKind; 2] = [PolicyKind::AceLocality, PolicyKind::CacheAware];

    /// Every policy `--policy` may name.
    pub fn every() -> impl Iterator<Item = PolicyKind> {
        PolicyKind::ALL.into_iter().chain(PolicyKind::PREFIX)
    }

    /// The policies compared by default: [`PolicyKind::ALL`], and on a
    /// trace with prompt blocks ACE with locality and the engine-side
    /// router after ACE.
    pub fn defaults(blocks: bool) -> Vec<PolicyKind> {
        let mut out = Vec::new();
        for k in PolicyKind::ALL {
            out.push(k);
            if blocks && k == PolicyKind::Ace {
                out.extend(PolicyKind::PREFIX);
            }
        }
        out
    }

    /// Its name in tables, files and `--policy`.
    pub fn name(self) -> String {
        match self {
            PolicyKind::AceLocality => "ace-locality".into(),
            PolicyKind::CacheAware => "sglang-cache-aware".into(),
            PolicyKind::LiteLlmOperator(v) => v.name(Strategy::CostBased),
            PolicyKind::Ace => "ace".into(),
            PolicyKind::AceNoRouting => "ace-no-model-routing".into(),
            PolicyKind::AllPayg => "all-payg".into(),
            PolicyKind::LiteLlm(s) => format!("litellm-{}", s.as_str()),
            PolicyKind::Priority => "priority-gateway".into(),
            PolicyKind::OwnedFirst => "owned-first".into(),
        }
    }

    /// Whether it may serve a request another model than the one named:
    /// ACE through its model classes, LiteLLM through per-team aliases.
    /// The comparison sets each side against the best peer on that side.
    pub fn substitutes(self) -> bool {
        match self {
            PolicyKind::Ace
            | PolicyKind::AceLocality
            | PolicyKind::LiteLlmOperator(Variant::TeamAlias | Variant::TeamAliasSplit) => true,
            PolicyKind::AceNoRouting
            | PolicyKind::CacheAware
            | PolicyKind::AllPayg
            | PolicyKind::LiteLlm(_)
            | PolicyKind::LiteLlmOperator(_)
            | PolicyKind::Priority
            | PolicyKind::OwnedFirst => false,
        }
    }

    /// The policy named `s`.
    pub fn parse(s: &str) -> Option<PolicyKind> {
        PolicyKind::every().find(|p| p.name() == s)
    }
}

/// A simulation's inputs, checked: the fleet, the requests, the targets.
#[derive(Debug)]
pub struct Simulation {
    /// The filter configuration (ACE runs it as is).
    pub config_json: Vec<u8>,
    /// The fleet as the simulation models it.
    pub params: Vec<Params>,
    /// The requests, by arrival, with the profiles the first seed draws.
    pub reqs: Vec<Req>,
    /// Every profile drawn, for any seed.
    pub profiles: Vec<Profile>,
    /// The mix, to draw other seeds' profiles from.
    mix: Mix,
    /// The seed `reqs`' profiles were drawn with.
    mix_seed: u64,
    /// Per other seed, each request's profile ([`Simulation::draw_mix`]).
    mix_by_seed: std::collections::BTreeMap<u64, Vec<u32>>,
    /// SLO targets.
    pub targets: Targets,
    /// The configuration, built: what prices every request (the ledger's
    /// pricing, [`ace_pricing`]).
    pub pricing: ace_flow::Setup,
    /// Injected failures; `None`: the default set, drawn per seed.
    pub faults: Option<Vec<Fault>>,
    /// Whether ACE gets the control service's snapshots.
    pub control: bool,
    /// The filter configuration of ACE as dispatch alone
    /// ([`dispatch_only_config`]); `None` where the configuration has no
    /// model routing, so that there is nothing to substitute.
    pub dispatch_only_json: Option<Vec<u8>>,
    /// The trace's prompt block ids (empty: a trace without them).
    pub block_ids: Vec<u32>,
    /// The filter configuration of ACE with prefix locality (a trace with
    /// prompt blocks only): the run's, plus `"locality": {}`.
    pub locality_json: Option<Vec<u8>>,
}

/// The filter configuration for a trace with prompt blocks, from the one
/// `ace plugin-config` writes: each provider's prompt-cache price and each
/// engine's prefill speed, where the configuration does not set them, and
/// a body bound that reads the trace's longest prompt.
///
/// - `cached_input_factor`: an OpenAI (or Azure OpenAI) destination 0.5,
///   the price of a cached input token over an input token for the
///   gpt-4o class that the example fleet's `openai-us` serves (gpt-4o
///   $2.50 and $1.25 per million, gpt-4o-mini $0.15 and $0.075: OpenAI's
///   pricing page; the gpt-4.1 class is 0.1, but no destination here
///   serves it); an Anthropic destination 0.1 (cache reads at a tenth of
///   the base input price: Anthropic's prompt-caching documentation).
///   Others keep theirs (the example fleet's Mistral and Together
///   destinations publish no cached-input discount; the engines are
///   priced by their GPU time, and a reserved block by its commitment).
/// - `prefix_cache.prefill_tokens_per_s` of each engine (in-house, spot,
///   on-demand): the fleet model's prefill speed
///   ([`FleetModel::prefill_tps`], the default's), so that ACE with
///   locality prices the prefill a held prefix saves.
/// - `prefix_cache.ttl_ms` of each engine: how long its KV cache keeps a
///   block, as an operator reads it off the engine (vLLM's prefix-cache
///   hit rate falls when blocks are evicted before their reuse): here its
///   KV blocks ([`fleet::KV_BLOCKS_PER_GPU`] a GPU) over the blocks the
///   trace brings each engine a second (`blocks_per_s` shared evenly),
///   from one second to the two minutes an idle engine's default
///   assumes. The filter's default (two minutes) would price prefixes an
///   engine this busy has long evicted.
/// - `body.max_bytes`: at least the longest prompt's body
///   ([`policy::ace::BYTES_PER_TOKEN`] a token, and room for the JSON).
pub fn prompt_cache_config(
    config_json: &[u8],
    places: &[Placement],
    longest_prompt: u32,
    blocks_per_s: f64,
) -> Result<Vec<u8>, SimError> {
    let bad = |e: String| SimError(format!("the filter configuration: {e}"));
    let mut v: serde_json::Value =
        serde_json::from_slice(config_json).map_err(|e| bad(e.to_string()))?;
    let prefill = FleetModel::default().prefill_tps;
    let is_engine = |d: &serde_json::Value| {
        matches!(
            d.get("tier").and_then(serde_json::Value::as_str),
            Some("inhouse" | "spot" | "ondemand")
        )
    };
    let engines = v
        .get("destinations")
        .and_then(serde_json::Value::as_array)
        .map_or(0, |ds| ds.iter().filter(|d| is_engine(d)).count());
    let per_engine = blocks_per_s / engines.max(1) as f64;
    if let Some(ds) = v
        .get_mut("destinations")
        .and_then(serde_json::Value::as_array_mut)
    {
        for (d, place) in ds.iter_mut().zip(places) {
            let Some(o) = d.as_object_mut() else { continue };
            let factor = match place.provider.to_ascii_lowercase().as_str() {
                "openai" | "azure-openai" | "azure_openai" => Some(0.5),
                "anthropic" => Some(0.1),
                _ => None,
            };
            if let Some(f) = factor {
                o.entry("cached_input_factor")
                    .or_insert_with(|| serde_json::json!(f));
            }
            if is_engine(d) {
                let Some(o) = d.as_object_mut() else { continue };
                let kv = f64::from(place.gpus.max(1).saturating_mul(fleet::KV_BLOCKS_PER_GPU));
                let ttl_ms = if per_engine > 0.0 {
                    (kv / per_engine * 1000.0).clamp(1_000.0, 120_000.0) as u64
                } else {
                    120_000
                };
                let pc = o
                    .entry("prefix_cache")
                    .or_insert_with(|| serde_json::json!({}));
                if let Some(pc) = pc.as_object_mut() {
                    pc.entry("prefill_tokens_per_s")
                        .or_insert_with(|| serde_json::json!(prefill));
                    pc.entry("ttl_ms")
                        .or_insert_with(|| serde_json::json!(ttl_ms));
                }
            }
        }
    }
    let need = (longest_prompt as usize)
        .saturating_mul(policy::ace::BYTES_PER_TOKEN)
        .saturating_add(64 * 1024)
        .min(16 * 1024 * 1024);
    if let Some(o) = v.as_object_mut() {
        let body = o
            .entry("body")
            .or_insert_with(|| serde_json::json!({"read": true}));
        if let Some(b) = body.as_object_mut() {
            let now = b
                .get("max_bytes")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(256 * 1024);
            if (now as usize) < need {
                b.insert("max_bytes".into(), serde_json::json!(need));
            }
        }
    }
    serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))
}

/// `to` with the prompt-cache settings of `from` ([`prompt_cache_config`]):
/// each destination's `cached_input_factor` and `prefix_cache`, and the
/// body bound, so that ACE as dispatch alone meets the same caches at the
/// same prices.
pub fn carry_prompt_cache(from: &[u8], to: &[u8]) -> Result<Vec<u8>, SimError> {
    let bad = |e: String| SimError(format!("the filter configuration: {e}"));
    let from: serde_json::Value = serde_json::from_slice(from).map_err(|e| bad(e.to_string()))?;
    let mut v: serde_json::Value = serde_json::from_slice(to).map_err(|e| bad(e.to_string()))?;
    let src = from
        .get("destinations")
        .and_then(serde_json::Value::as_array);
    if let (Some(src), Some(ds)) = (
        src,
        v.get_mut("destinations")
            .and_then(serde_json::Value::as_array_mut),
    ) {
        for (d, s) in ds.iter_mut().zip(src) {
            for key in ["cached_input_factor", "prefix_cache"] {
                if let (Some(o), Some(x)) = (d.as_object_mut(), s.get(key)) {
                    o.insert(key.into(), x.clone());
                }
            }
        }
    }
    if let (Some(o), Some(b)) = (v.as_object_mut(), from.get("body")) {
        o.insert("body".into(), b.clone());
    }
    serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))
}

/// `config_json` with prefix locality on (`"locality": {}`, every setting
/// at its default), unless it configures locality already.
pub fn locality_config(config_json: &[u8]) -> Result<Vec<u8>, SimError> {
    let bad = |e: String| SimError(format!("the filter configuration: {e}"));
    let mut v: serde_json::Value =
        serde_json::from_slice(config_json).map_err(|e| bad(e.to_string()))?;
    if let Some(o) = v.as_object_mut() {
        o.entry("locality").or_insert_with(|| serde_json::json!({}));
    }
    serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))
}

/// The conversation a request with prompt `blocks` belongs to, for
/// drawing its profile once per conversation: its second block (the first
/// is often a system prompt every conversation shares), else its first.
fn conversation(blocks: trace::Blocks, ids: &[u32]) -> Option<u64> {
    let mut keys = blocks.keys(ids);
    let first = keys.next()?;
    Some(keys.next().unwrap_or(first))
}

/// Each request's profile drawn from `mix` with `rng`, in order: one draw
/// a request, or on a trace with prompt blocks one a conversation
/// ([`conversation`]): a conversation is one tenant's, in one data and
/// latency class, for one model, as a client keeps it.
fn draw_profiles(
    mix: &mut Mix,
    rng: &mut Rng,
    blocks: impl Iterator<Item = trace::Blocks>,
    ids: &[u32],
) -> Vec<u32> {
    let mut seen: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    blocks
        .map(|b| match conversation(b, ids) {
            None => mix.draw(rng),
            Some(c) => *seen.entry(c).or_insert_with(|| mix.draw(rng)),
        })
        .collect()
}

/// The Cedar policy that makes ACE dispatch alone: no request is served
/// another model than the one it named, whoever sends it. It is added to
/// the operator's policies, never in place of one, so the variant keeps
/// every rule and every price (the cost factors of model routing price a
/// request's own model on each destination) and differs from ACE only in
/// substitution. Removing model routing instead would price every request
/// at its destination's reference model.
pub const NO_SUBSTITUTION: &str = "// ace sim: ACE as dispatch alone (no model substitution).\n\
                                   @id(\"ace_sim_dispatch_only\")\n\
                                   forbid (principal, action, resource) when { context.substituted };\n";

/// The plugin configuration of ACE as dispatch alone for the project
/// `sources` ([`NO_SUBSTITUTION`] added, compiled as `ace plugin-config`
/// compiles, with the body read).
pub fn dispatch_only_config(sources: &ace_policy::Sources) -> Result<Vec<u8>, SimError> {
    let mut sources = sources.clone();
    sources.policies.push((
        std::path::PathBuf::from("ace-sim-dispatch-only.cedar"),
        NO_SUBSTITUTION.to_string(),
    ));
    let fail = |e: ace_policy::Error| {
        SimError(format!(
            "ACE as dispatch alone (the policies plus a forbid on `context.substituted`): {e}"
        ))
    };
    let project = ace_policy::Project::load(sources).map_err(fail)?;
    let compiled = ace_policy::compile(&project).map_err(fail)?;
    let config =
        ace_policy::plugin::plugin_config(&project, &compiled, false, true).map_err(fail)?;
    serde_json::to_vec(&config).map_err(|e| SimError(e.to_string()))
}

/// The longest run: the engine keeps times in u32 milliseconds (about
/// 49.7 days), with room for the last requests to finish.
pub const MAX_RUN_MS: u64 = 40 * 86_400_000;

/// A request as a real Envoy logged it (its `ace.event` line), for
/// [`Simulation::shadow`]. An attribute the request did not carry is empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Logged {
    /// When it arrived, Unix ms.
    pub time_ms: u64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Output tokens.
    pub output: u32,
    /// Tenant.
    pub tenant: String,
    /// Data class.
    pub data_class: String,
    /// Latency class.
    pub latency_class: String,
    /// The model it asked for.
    pub model: String,
}

/// What the manifest says of a destination beyond its cost curve.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Name.
    pub name: String,
    /// Jurisdiction.
    pub jurisdiction: String,
    /// Region.
    pub region: String,
    /// Certifications.
    pub certifications: Vec<String>,
    /// Models served.
    pub models: Vec<String>,
    /// Resident models.
    pub warm: Vec<String>,
    /// Its provider (the manifest's `provider`).
    pub provider: String,
    /// GPUs.
    pub gpus: u32,
    /// Tokens per second at a full batch.
    pub throughput_tps: f64,
}

impl Placement {
    /// Every destination of a policy project, in table order.
    pub fn of(project: &ace_policy::Project) -> Vec<Placement> {
        let raw = &project.manifest.manifest.destinations;
        project
            .manifest
            .resolved()
            .into_iter()
            .map(|d| Placement {
                certifications: raw
                    .get(d.index)
                    .map(|r| r.get_ref().certifications.clone())
                    .unwrap_or_default(),
                name: d.name,
                provider: d.provider,
                jurisdiction: d.jurisdiction,
                region: d.region,
                models: d.models,
                warm: d.warm_models,
                gpus: d.gpus,
                throughput_tps: d.throughput_tps,
            })
            .collect()
    }
}

/// A simulation's inputs that cannot be used, named.
#[derive(Debug)]
pub struct SimError(pub String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

/// The model catalogue's tensor-parallel degrees.
pub fn model_tp(project: &ace_policy::Project) -> Vec<(String, u32)> {
    project
        .manifest
        .manifest
        .models
        .iter()
        .map(|m| {
            let m = m.get_ref();
            (
                m.id.get_ref().clone(),
                u32::try_from(*m.tp_degree.get_ref()).unwrap_or(1),
            )
        })
        .collect()
}

impl Simulation {
    /// Check and assemble a simulation: `config_json` the filter
    /// configuration `ace plugin-config` writes for the fleet, `places`
    /// its destinations as the manifest has them, `arrivals` the requests,
    /// the mix (`mix_source` names it in errors) drawn with `seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config_json: Vec<u8>,
        places: &[Placement],
        models_tp: &[(String, u32)],
        arrivals: &[Row],
        mix_source: &str,
        mix_text: &str,
        targets: Targets,
        seed: u64,
    ) -> Result<Simulation, SimError> {
        Simulation::with_blocks(
            config_json,
            places,
            models_tp,
            arrivals,
            Vec::new(),
            mix_source,
            mix_text,
            targets,
            seed,
        )
    }

    /// [`Simulation::new`] for a trace with prompt blocks: `block_ids` the
    /// trace's ([`trace::Trace::block_ids`], which the arrivals' blocks
    /// point into; empty: none). With blocks, the destinations' prompt
    /// caches come into play ([`fleet::PromptCache`]), the configuration
    /// gains its prompt-cache prices ([`prompt_cache_config`]), ACE with
    /// locality can run ([`locality_config`]), and the mix is drawn once a
    /// conversation.
    #[allow(clippy::too_many_arguments)]
    pub fn with_blocks(
        config_json: Vec<u8>,
        places: &[Placement],
        models_tp: &[(String, u32)],
        arrivals: &[Row],
        block_ids: Vec<u32>,
        mix_source: &str,
        mix_text: &str,
        targets: Targets,
        seed: u64,
    ) -> Result<Simulation, SimError> {
        let (config_json, locality_json) = if block_ids.is_empty() {
            (config_json, None)
        } else {
            let longest = arrivals.iter().map(|r| r.prompt).max().unwrap_or(0);
            let span_s = arrivals
                .last()
                .map_or(1.0, |r| r.at_ms.max(1) as f64 / 1000.0);
            let blocks: f64 = arrivals
                .iter()
                .map(|r| f64::from(r.prompt.div_ceil(512)))
                .sum();
            let c = prompt_cache_config(&config_json, places, longest, blocks / span_s)?;
            let l = locality_config(&c)?;
            ace_flow::Setup::parse(&l)
                .map_err(|e| SimError(format!("the filter configuration with locality: {e}")))?;
            (c, Some(l))
        };
        let pricing = ace_flow::Setup::parse(&config_json)
            .map_err(|e| SimError(format!("the filter configuration: {e}")))?;
        let mut mix = Mix::new(mix_source, mix_text, &pricing.config, models_tp)
            .map_err(|e| SimError(e.0))?;
        let mut rng = Rng::fork(seed, "mix");
        let reqs: Vec<Req> = if block_ids.is_empty() {
            arrivals
                .iter()
                .map(|r| Req {
                    at_ms: r.at_ms,
                    prompt: r.prompt,
                    output: r.output,
                    profile: mix.draw(&mut rng),
                    blocks: r.blocks,
                })
                .collect()
        } else {
            let drawn = draw_profiles(
                &mut mix,
                &mut rng,
                arrivals.iter().map(|r| r.blocks),
                &block_ids,
            );
            arrivals
                .iter()
                .zip(drawn)
                .map(|(r, profile)| Req {
                    at_ms: r.at_ms,
                    prompt: r.prompt,
                    output: r.output,
                    profile,
                    blocks: r.blocks,
                })
                .collect()
        };
        let mut sim = Simulation::assemble(config_json, pricing, places, reqs, mix, targets, seed)?;
        sim.block_ids = block_ids;
        sim.locality_json = locality_json;
        Ok(sim)
    }

    /// Shadow mode: the requests a real Envoy logged, each with the
    /// attributes it was sent with, instead of a trace and a mix, so that
    /// every policy is run on the operator's own traffic. `logged` in any
    /// order; times are kept relative to the first.
    pub fn shadow(
        config_json: Vec<u8>,
        places: &[Placement],
        models_tp: &[(String, u32)],
        logged: &[Logged],
        targets: Targets,
        seed: u64,
    ) -> Result<Simulation, SimError> {
        if logged.is_empty() {
            return Err(SimError(
                "the log holds no request to replay (no ace.event line)".into(),
            ));
        }
        let pricing = ace_flow::Setup::parse(&config_json)
            .map_err(|e| SimError(format!("the filter configuration: {e}")))?;
        let mut mix = Mix::given(&pricing.config, models_tp);
        let mut order: Vec<&Logged> = logged.iter().collect();
        order.sort_by_key(|l| l.time_ms);
        let start = order.first().map_or(0, |l| l.time_ms);
        let reqs = order
            .iter()
            .map(|l| Req {
                at_ms: l.time_ms - start,
                prompt: l.prompt,
                output: l.output,
                profile: mix.intern(&l.tenant, &l.data_class, &l.latency_class, &l.model),
                blocks: trace::Blocks::default(),
            })
            .collect();
        Simulation::assemble(config_json, pricing, places, reqs, mix, targets, seed)
    }

    fn assemble(
        config_json: Vec<u8>,
        pricing: ace_flow::Setup,
        places: &[Placement],
        reqs: Vec<Req>,
        mut mix: Mix,
        targets: Targets,
        seed: u64,
    ) -> Result<Simulation, SimError> {
        let cfg = &pricing.config;
        let last = reqs.last().map_or(0, |r| r.at_ms);
        if last > MAX_RUN_MS {
            return Err(SimError(format!(
                "the requests span {:.0} days; a run covers at most {} (times are kept in u32 \
                 milliseconds): give a shorter trace or log",
                last as f64 / 86_400_000.0,
                MAX_RUN_MS / 86_400_000
            )));
        }
        if places.len() != cfg.destinations.len() {
            return Err(SimError(format!(
                "the manifest has {} destinations and the filter configuration {}: regenerate the configuration with `ace plugin-config`",
                places.len(),
                cfg.destinations.len()
            )));
        }
        // The reserved blocks' commitments are sized to their slots at the
        // requests' own mean.
        let n = reqs.len().max(1) as f64;
        let mean_request = (
            reqs.iter().map(|r| f64::from(r.prompt)).sum::<f64>() / n,
            reqs.iter().map(|r| f64::from(r.output)).sum::<f64>() / n,
        );
        let params = params(cfg, places, mean_request)?;
        let profiles = std::mem::take(&mut mix.profiles);
        Ok(Simulation {
            config_json,
            params,
            reqs,
            profiles,
            mix,
            mix_seed: seed,
            mix_by_seed: Default::default(),
            targets,
            pricing,
            faults: None,
            control: true,
            dispatch_only_json: None,
            block_ids: Vec::new(),
            locality_json: None,
        })
    }

    /// The model classes of the configuration's model routing (each
    /// class's models, the reference first): what a gateway operator
    /// writes as fallbacks.
    pub fn model_classes(&self) -> Vec<Vec<String>> {
        serde_json::from_slice::<serde_json::Value>(&self.config_json)
            .ok()
            .and_then(|v| {
                v.get("model_routing")?
                    .get("classes")?
                    .as_object()
                    .map(|o| {
                        o.values()
                            .filter_map(|c| {
                                c.as_array().map(|a| {
                                    a.iter()
                                        .filter_map(|m| m.as_str().map(str::to_string))
                                        .collect()
                                })
                            })
                            .collect()
                    })
            })
            .unwrap_or_default()
    }

    /// What LiteLLM's `model_list` and router settings are written from.
    fn litellm_setup<'a>(
        &'a self,
        up: &'a [Upstream],
        listed: Vec<bool>,
    ) -> policy::litellm::Setup<'a> {
        policy::litellm::Setup {
            up,
            listed,
            profiles: &self.profiles,
            classes: self.model_classes(),
            cost_factors: self
                .pricing
                .config
                .model_routing
                .as_ref()
                .map(|m| m.cost_factors.clone())
                .unwrap_or_default(),
        }
    }

    /// The fleet of seed `seed`: evictions, prices and faults drawn.
    pub fn fleet(&self, seed: u64) -> Vec<Upstream> {
        let days = self.reqs.last().map_or(1, |r| r.at_ms / DAY_MS + 1);
        let mut up: Vec<Upstream> = self
            .params
            .iter()
            .map(|p| {
                Upstream::new(
                    p.clone(),
                    &mut Rng::fork(seed, &format!("dest/{}", p.name)),
                    days,
                )
            })
            .collect();
        let faults = match &self.faults {
            Some(f) => f.clone(),
            None => default_faults(&self.params, &mut Rng::fork(seed, "faults")),
        };
        for f in faults {
            if let Some(u) = up.get_mut(f.dest) {
                u.faults.push(f);
            }
        }
        up
    }

    /// Draw each request's profile anew for every seed of `seeds` (each
    /// from its own stream), so that a run with seed `s` meets the mix as
    /// `s` draws it rather than one draw for all seeds. Before the runs:
    /// the runs share the simulation and its profiles.
    pub fn draw_mix(&mut self, seeds: &[u64]) {
        if !self.mix.draws() {
            return;
        }
        self.mix.profiles = std::mem::take(&mut self.profiles);
        for &seed in seeds {
            if seed == self.mix_seed || self.mix_by_seed.contains_key(&seed) {
                continue;
            }
            let mut rng = Rng::fork(seed, "mix");
            let drawn = if self.block_ids.is_empty() {
                self.reqs.iter().map(|_| self.mix.draw(&mut rng)).collect()
            } else {
                draw_profiles(
                    &mut self.mix,
                    &mut rng,
                    self.reqs.iter().map(|r| r.blocks),
                    &self.block_ids,
                )
            };
            self.mix_by_seed.insert(seed, drawn);
        }
        self.profiles = std::mem::take(&mut self.mix.profiles);
    }

    /// The requests as seed `seed` draws their profiles.
    pub fn reqs_for(&self, seed: u64) -> std::borrow::Cow<'_, [Req]> {
        match self.mix_by_seed.get(&seed) {
            Some(drawn) => self
                .reqs
                .iter()
                .zip(drawn)
                .map(|(r, &profile)| Req { profile, ..*r })
                .collect(),
            None => std::borrow::Cow::Borrowed(&self.reqs),
        }
    }

    /// Compile ACE as dispatch alone from the project's `sources`
    /// ([`dispatch_only_config`]), where the configuration has model
    /// routing; without it there is nothing to substitute and dispatch
    /// alone is ACE.
    pub fn add_dispatch_only(&mut self, sources: &ace_policy::Sources) -> Result<(), SimError> {
        if self.pricing.routing.is_some() {
            let mut json = dispatch_only_config(sources)?;
            if !self.block_ids.is_empty() {
                json = carry_prompt_cache(&self.config_json, &json)?;
            }
            self.dispatch_only_json = Some(json);
        }
        Ok(())
    }

    /// What the engines and APIs do ([`FleetModel`]).
    pub fn fleet_model(&self) -> FleetModel {
        self.params.first().map(|p| p.model).unwrap_or_default()
    }

    /// Run the fleet under `model`: every GPU server's engine knee becomes
    /// [`FleetModel::knee`] of its manifest's. The manifest, and so ACE's
    /// price model and the gateways' operator caps, stay as they are.
    pub fn set_fleet_model(&mut self, model: FleetModel) -> Result<(), SimError> {
        let model = model
            .checked()
            .map_err(|e| SimError(format!("the fleet model: {e}")))?;
        for p in &mut self.params {
            p.knee = model.knee(p.cost.knee);
            p.model = model;
        }
        Ok(())
    }

    /// The filter configuration `kind` runs with, which its event lines
    /// name: the run's, but for ACE as dispatch alone, which runs its own
    /// ([`Simulation::dispatch_only_json`], another configuration id).
    pub fn config_json_of(&self, kind: PolicyKind) -> Result<Vec<u8>, SimError> {
        if kind == PolicyKind::AceLocality {
            return self.locality_json.clone().ok_or_else(|| {
                SimError(format!(
                    "{} needs a trace with prompt blocks (the Mooncake format: JSON lines with \
                     hash_ids); this one has none",
                    kind.name()
                ))
            });
        }
        if kind != PolicyKind::AceNoRouting || self.pricing.routing.is_none() {
            return Ok(self.config_json.clone());
        }
        self.dispatch_only_json.clone().ok_or_else(|| {
            SimError(format!(
                "{} needs the configuration compiled without substitution \
                 (ace_sim::dispatch_only_config); the simulation has none",
                kind.name()
            ))
        })
    }

    /// A fresh `kind` policy for seed `seed`; `events`: keep its events.
    pub fn policy(
        &self,
        kind: PolicyKind,
        seed: u64,
        events: bool,
    ) -> Result<Box<dyn Policy + Send>, SimError> {
        let up = self.fleet(seed);
        let listed = policy::listed(&up, &self.profiles);
        Ok(match kind {
            PolicyKind::Ace | PolicyKind::AceNoRouting | PolicyKind::AceLocality => {
                let bytes = self.config_json_of(kind)?;
                let mut cfg = Config::parse(&bytes)
                    .map_err(|e| SimError(format!("the filter configuration: {e}")))?;
                // The dynamic module's re-run: what a failure costs a
                // request on the build that can.
                cfg.retry_next = true;
                // Ranked by the targets it is judged by.
                self.targets.tell(&mut cfg);
                let setup = ace_flow::Setup::new(cfg)
                    .map_err(|e| SimError(format!("the filter configuration: {e}")))?;
                Box::new(policy::ace::Ace::with_run(
                    setup,
                    events,
                    self.control,
                    run_id(kind, seed),
                ))
            }
            PolicyKind::AllPayg => Box::new(policy::payg::AllPayg::new(listed)),
            PolicyKind::LiteLlm(s) => Box::new(policy::litellm::LiteLlm::new(
                s,
                Variant::Default,
                &self.litellm_setup(&up, listed),
                seed,
            )),
            PolicyKind::LiteLlmOperator(v) => Box::new(policy::litellm::LiteLlm::new(
                Strategy::CostBased,
                v,
                &self.litellm_setup(&up, listed),
                seed,
            )),
            PolicyKind::Priority => Box::new(policy::priority::PriorityGateway::new(listed, seed)),
            PolicyKind::OwnedFirst => Box::new(policy::packer::OwnedFirst::new(listed)),
            PolicyKind::CacheAware => Box::new(policy::prefix::CacheAware::new(listed)),
        })
    }

    /// Run `kind` with seed `seed`; its events to `events` when given.
    pub fn run(
        &self,
        kind: PolicyKind,
        seed: u64,
        events: Option<&mut dyn std::io::Write>,
        progress: &dyn Fn(u64),
    ) -> Result<Metrics, SimError> {
        let mut p = self.policy(kind, seed, events.is_some())?;
        let cfg = &self.pricing.config;
        Run {
            event_names: (cfg.id.clone(), cfg.names(), run_id(kind, seed)),
            up: self.fleet(seed),
            reqs: &self.reqs_for(seed),
            profiles: &self.profiles,
            block_ids: &self.block_ids,
            targets: &self.targets,
            seed,
            pricing: &self.pricing,
        }
        .go(p.as_mut(), events, progress)
        .map_err(|e| SimError(format!("cannot write events: {e}")))
    }
}

/// The first half of the event ids of `kind`'s run with `seed`: distinct
/// per run, so that runs booked into one ledger never share an id.
pub fn run_id(kind: PolicyKind, seed: u64) -> u64 {
    let h = kind.name().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^ seed.rotate_left(32)
}

/// The fleet as simulated, from the configuration and the manifest;
/// `mean_request`: the trace's mean prompt and output tokens.
fn params(
    cfg: &Config,
    places: &[Placement],
    mean_request: (f64, f64),
) -> Result<Vec<Params>, SimError> {
    let (mean_prompt, mean_output) = mean_request;
    cfg.destinations
        .iter()
        .zip(places)
        .zip(&cfg.models)
        .map(|((d, p), m)| {
            if d.name != p.name {
                return Err(SimError(format!(
                    "destination {} is `{}` in the filter configuration and `{}` in the manifest: regenerate the configuration with `ace plugin-config`",
                    p.name, d.name, p.name
                )));
            }
            let gpu = d.tier != Tier::Payg;
            let slots = gpu.then_some(d.capacity.max(1));
            let seq_tps = match d.tier {
                Tier::Spot | Tier::OnDemand => d.tokens_per_second / f64::from(d.capacity.max(1)),
                _ => fleet::DEFAULT_SEQ_TPS,
            }
            .max(1.0);
            let tpot_full_ms = 1000.0 / seq_tps;
            // A commitment sized to what the block's slots serve in a
            // minute at the trace's mean request: the tokens per minute an
            // operator buys for the block's share of that traffic.
            let tpm_cap = (d.tier == Tier::Reserved).then(|| {
                let seconds = 0.3 + mean_output * tpot_full_ms / 1000.0;
                (f64::from(d.capacity.max(1)) * 60.0 / seconds * (mean_prompt + mean_output))
                    as u64
            });
            let spot = (d.tier == Tier::Spot).then(|| SpotProcess {
                notice_ms: if p.region.starts_with("us-") { 120_000 } else { 30_000 },
                up_median_ms: match p.gpus {
                    0..=2 => 3_600_000.0,
                    3..=4 => 1_800_000.0,
                    _ => 1_200_000.0,
                },
                down_median_ms: 1_440_000.0,
            });
            Ok(Params {
                name: d.name.clone(),
                tier: d.tier,
                slots,
                tpot_full_ms,
                knee: d.knee,
                model: FleetModel::default(),
                tpm_cap,
                overage: d.overage_usd_per_token.is_some(),
                spot,
                api_limits: (!gpu).then_some(fleet::API_LIMITS),
                eu: p.jurisdiction == "EU",
                baa: p.certifications.iter().any(|c| c == "hipaa_baa"),
                models: p.models.clone(),
                warm: p.warm.clone(),
                cold_load_usd: d.cold_load_usd,
                slo_ms: d.slo_ms,
                cost: *m,
                cache_blocks: p.gpus.max(1).saturating_mul(fleet::KV_BLOCKS_PER_GPU),
            })
        })
        .collect()
}

/// The failures injected when none are given: a 5xx burst on the largest
/// owned server (30% for 15 minutes), an outage of the cheapest API (20
/// minutes) and a 3x slowdown of a reserved block (30 minutes), each at a
/// seeded time between 09:00 and 18:00.
pub fn default_faults(params: &[Params], rng: &mut Rng) -> Vec<Fault> {
    let mut at = |minutes: u64| {
        let from = 9 * 3_600_000 + (rng.uniform() * 9.0 * 3_600_000.0) as u64;
        (from, from + minutes * 60_000)
    };
    let mut out = Vec::new();
    let largest_owned = params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.tier == Tier::InHouse)
        .max_by_key(|(i, p)| (p.slots.unwrap_or(0), usize::MAX - i))
        .map(|(i, _)| i);
    if let Some(d) = largest_owned {
        let (from_ms, to_ms) = at(15);
        out.push(Fault {
            dest: d,
            from_ms,
            to_ms,
            kind: FaultKind::Errors(0.3),
        });
    }
    let cheapest_api = params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.tier == Tier::Payg)
        .min_by(|a, b| {
            let c = |p: &Params| {
                let (i, o) = p.cost.rest_prices();
                i + o
            };
            c(a.1).total_cmp(&c(b.1))
        })
        .map(|(i, _)| i);
    if let Some(d) = cheapest_api {
        let (from_ms, to_ms) = at(20);
        out.push(Fault {
            dest: d,
            from_ms,
            to_ms,
            kind: FaultKind::Outage,
        });
    }
    if let Some(d) = params.iter().position(|p| p.tier == Tier::Reserved) {
        let (from_ms, to_ms) = at(30);
        out.push(Fault {
            dest: d,
            from_ms,
            to_ms,
            kind: FaultKind::Slowdown(3.0),
        });
    }
    out
}
