//! The fleet manifest: destinations (with their Envoy clusters, policy
//! attributes and cost-curve parameters), tenants and their budgets, the
//! model catalogue and the finite domains of the request attributes.
//!
//! Why TOML: it is one human-edited file, comments are first-class, and the
//! parser gives byte spans, so a value outside its domain is reported at its
//! line and column. The JSON Schema next to the example
//! (`policies/fleet.schema.json`) documents the same fields for editors.
//!
//! Cost fields are optional; their defaults are chosen so that a destination
//! without them costs nothing extra and never saturates, which is right for
//! a policy-only manifest and obviously wrong for dispatch, so the filter's
//! operator will notice. Every number is checked to be finite and in range.

use crate::error::{Diagnostic, Error};
use ace_core::cost::Tier;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Interconnects a destination may declare.
pub const INTERCONNECTS: [&str; 3] = ["nvlink", "pcie", "none"];

/// The parsed manifest, with spans kept for error reporting.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Manifest format version; must be 1.
    pub version: Spanned<u32>,
    /// Domains of the request (context) attributes, by name.
    #[serde(default)]
    pub request: std::collections::BTreeMap<String, Spanned<Domain>>,
    /// Tenants (the principals).
    #[serde(default)]
    pub tenants: Vec<Spanned<Tenant>>,
    /// The model catalogue.
    #[serde(default)]
    pub models: Vec<Spanned<Model>>,
    /// Destinations, in table (bit) order.
    pub destinations: Vec<Spanned<Destination>>,
    /// Models that may stand in for each other (model routing).
    #[serde(default)]
    pub model_classes: Vec<Spanned<ModelClass>>,
    /// Latency classes' service-level objectives, by class (a value of
    /// `request.latency_class`): what the filter ranks destinations by and
    /// what `ace sim` judges every policy by.
    #[serde(default)]
    pub slo: std::collections::BTreeMap<String, Spanned<ClassSlo>>,
    /// Tenant budgets (`[[budgets]]`): spend per period, what a tenant past
    /// its soft threshold may still use, tokens per minute. The plugin
    /// configuration's own type, so the manifest and the filter read the
    /// same fields; `ace plugin-config` copies them and `ace control serve`
    /// reads each budget's spend from the ledger.
    #[serde(default)]
    pub budgets: Vec<Spanned<ace_config::BudgetSettings>>,
}

/// One latency class's service-level objective.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassSlo {
    /// Time to first token, ms. Default: no target.
    pub ttft_ms: Option<u32>,
    /// End to end: this many ms ... Default 600000.
    pub e2e_base_ms: Option<u64>,
    /// ... plus this many per generated token. Default 0.
    pub e2e_per_token_ms: Option<f64>,
    /// What a second of queueing is worth, USD. Default: 0.01 for
    /// `interactive`, 0 for `batch`, 0.002 for others.
    pub usd_per_s: Option<f64>,
    /// What missing the time-to-first-token target costs, USD. Default
    /// 0.05.
    pub late_usd: Option<f64>,
    /// `serve` (default) or `refuse` when no destination is expected on
    /// time.
    pub when_late: Option<String>,
}

/// An equivalence class of models: a request naming one may be served by
/// another when policy allows `substituted` and it is cheaper.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelClass {
    /// The class's name; a request may name it instead of a model.
    pub name: Spanned<String>,
    /// Its members, by catalogue id; the first is the reference a request
    /// naming the class is priced against.
    pub models: Vec<Spanned<String>>,
}

/// The finite domain of one request attribute.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Domain {
    /// The values a request may carry; strings or integers to match the
    /// attribute's Cedar type.
    pub values: Vec<Spanned<toml::Value>>,
}

/// A tenant.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// The id the filter sees in `x-ace-tenant`.
    pub id: Spanned<String>,
    /// Tenant groups (`principal in Ace::TenantGroup::"..."`).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Where the tenant's contract is governed, if it says.
    pub home_jurisdiction: Option<String>,
}

/// A model in the catalogue.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// The id requests name (`model` in the body, `x-ace-model`).
    pub id: Spanned<String>,
    /// VRAM one replica needs, in GB.
    pub vram_gb: Spanned<i64>,
    /// Tensor-parallel degree it is served with.
    #[serde(default = "one")]
    pub tp_degree: Spanned<i64>,
    /// Accelerator families it runs on.
    #[serde(default)]
    pub accelerators: Vec<String>,
}

fn one() -> Spanned<i64> {
    Spanned::new(0..0, 1)
}

/// A destination: one Envoy cluster that can serve requests.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Destination {
    /// Unique name (the Cedar entity id).
    pub name: Spanned<String>,
    /// The Envoy cluster the filter routes to; unique.
    pub cluster: Spanned<String>,
    /// Pools (`resource in Ace::Pool::"..."`).
    #[serde(default)]
    pub pools: Vec<String>,
    /// Who runs it (`inhouse`, a cloud, an API vendor).
    pub provider: String,
    /// A tier name ([`Tier::parse`]).
    pub tier: Spanned<String>,
    /// Legal jurisdiction of the data while served, e.g. `EU`, `US`.
    pub jurisdiction: String,
    /// Region, e.g. `eu-west-1`.
    pub region: String,
    /// Accelerator family, e.g. `h100`; `api` for a hosted API.
    pub accelerator: String,
    /// VRAM of one replica, in GB (0 for a hosted API that does not say).
    pub vram_gb: Spanned<i64>,
    /// One of [`INTERCONNECTS`].
    pub interconnect: Spanned<String>,
    /// Models served, by catalogue id.
    #[serde(default)]
    pub models: Vec<Spanned<String>>,
    /// Certifications held, e.g. `hipaa_baa`.
    #[serde(default)]
    pub certifications: Vec<String>,
    /// The team owning an in-house destination.
    pub owner_team: Option<String>,
    /// Custom attributes, each declared on `Destination` in the schema.
    #[serde(default)]
    pub attributes: std::collections::BTreeMap<String, Spanned<toml::Value>>,
    /// Cost-curve parameters for dispatch.
    pub cost: Option<Spanned<Cost>>,
    /// Where the control service (`ace control serve`) pulls this
    /// destination's live figures from. Absent: it reports nothing of it.
    pub control: Option<Spanned<Control>>,
    /// What its upstream expects (`[destinations.upstream]`): the name it
    /// knows each served model by, the path of each API it serves, its
    /// authority, whether clients' credentials pass. Absent: every API on
    /// the client's path, catalogue ids, credentials removed.
    pub upstream: Option<Spanned<ace_config::Upstream>>,
    /// Its prompt cache, for prefix locality (`[destinations.prefix_cache]`:
    /// `ttl_ms`, `min_tokens`, `prefill_tokens_per_s`). Absent: its tier's
    /// defaults.
    pub prefix_cache: Option<Spanned<ace_config::PrefixCache>>,
}

/// Engines whose Prometheus metrics the control service can read.
pub const ENGINES: [&str; 4] = ["vllm", "sglang", "trtllm", "tgi"];

/// Clouds whose spot eviction notices the control service can poll.
pub const EVICTION_PROVIDERS: [&str; 3] = ["aws", "gcp", "azure"];

/// Where the control service pulls one destination's live figures from
/// (`[destinations.control]`). Every field is optional; a source left out
/// is not polled. `control/README.md` describes what each source gives.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Control {
    /// The model server's base URL, e.g. `http://10.0.0.5:8000`: `metrics`
    /// and `models` default to its engine's paths under it.
    pub url: Option<String>,
    /// The serving engine, one of [`ENGINES`]; it picks the metric names
    /// and the default metrics path. Default `vllm`.
    pub engine: Option<String>,
    /// The Prometheus metrics URL. Default: `url` + `/metrics`
    /// (`/prometheus/metrics` for `trtllm`).
    pub metrics: Option<String>,
    /// The OpenAI-style model list, e.g. `http://10.0.0.5:8000/v1/models`.
    /// Default: `url` + `/v1/models`.
    pub models: Option<String>,
    /// Spot eviction notices to poll.
    pub eviction: Option<Eviction>,
    /// The key of its per-token prices in the LiteLLM-format price file
    /// (per-token tiers: inhouse, reserved, payg).
    pub price_key: Option<String>,
    /// The key of its GPU-hour price in the GPU price feed (GPU-hour
    /// tiers: spot, ondemand); the price is per GPU, times `cost.gpus`.
    pub gpu_price_key: Option<String>,
    /// The planner's RT app whose owned GPUs this destination serves
    /// (`owned[].app` in `ace plan roll --json`).
    pub plan_app: Option<u32>,
    /// Concurrent requests one of those GPUs holds; required with
    /// `plan_app`.
    pub slots_per_gpu: Option<u32>,
    /// A file holding the model server's API key (`vllm --api-key`), sent
    /// as `Authorization: Bearer` with the metrics and model-list
    /// requests; relative to the manifest's folder. The key itself is
    /// never written in the manifest.
    pub api_key_file: Option<String>,
    /// The engine's batch token budget (TGI's `--max-batch-total-tokens`,
    /// which its log states at start), for an engine that reports KV use in
    /// tokens but not its budget.
    pub kv_token_budget: Option<u64>,
}

/// A spot eviction notice source.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Eviction {
    /// One of [`EVICTION_PROVIDERS`].
    pub provider: String,
    /// The instance metadata service's base URL. Default: the cloud's
    /// (`http://169.254.169.254`, GCP `http://metadata.google.internal`).
    pub url: Option<String>,
    /// Azure: the VM's name as Scheduled Events lists it in `Resources`
    /// (events reach every VM of an availability set or placement group,
    /// so only those naming this VM drain it). Default: the metadata
    /// service's own `compute/name`.
    pub vm_name: Option<String>,
}

impl Control {
    /// The engine, `vllm` when not given.
    pub fn engine(&self) -> &str {
        self.engine.as_deref().unwrap_or("vllm")
    }

    /// The metrics URL: `metrics`, else `url` and the engine's path.
    pub fn metrics_url(&self) -> Option<String> {
        self.metrics.clone().or_else(|| {
            let path = if self.engine() == "trtllm" {
                "/prometheus/metrics"
            } else {
                "/metrics"
            };
            self.url
                .as_ref()
                .map(|u| format!("{}{path}", u.trim_end_matches('/')))
        })
    }

    /// The model-list URL: `models`, else `url` + `/v1/models`.
    pub fn models_url(&self) -> Option<String> {
        self.models.clone().or_else(|| {
            self.url
                .as_ref()
                .map(|u| format!("{}/v1/models", u.trim_end_matches('/')))
        })
    }
}

impl Eviction {
    /// The metadata service's base URL: `url`, else the cloud's own.
    pub fn base_url(&self) -> String {
        match &self.url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None if self.provider == "gcp" => "http://metadata.google.internal".into(),
            None => "http://169.254.169.254".into(),
        }
    }
}

/// Cost-curve parameters (see the dispatch issue). All optional; the
/// defaults are documented per field.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// US dollars per million input tokens: the list price (pay-as-you-go)
    /// or the operating cost per token (in-house). Default 0.
    #[serde(default)]
    pub input_usd_per_mtok: f64,
    /// US dollars per million output tokens. Default 0.
    #[serde(default)]
    pub output_usd_per_mtok: f64,
    /// US dollars per GPU-hour: what spot and on-demand capacity costs
    /// while used; for in-house and reserved capacity its standing cost,
    /// paid used or not (the ledger's chargeback, `ace sim`'s totals),
    /// which does not price a request. Default 0.
    #[serde(default)]
    pub gpu_hour_usd: f64,
    /// GPUs behind the destination (multiplies `gpu_hour_usd`). Default 1.
    pub gpus: Option<u32>,
    /// Measured throughput in tokens per second for the whole destination.
    /// Default 1000. Must be above 0.
    pub throughput_tps: Option<f64>,
    /// Capacity in concurrent requests (in-house: owned capacity; reserved:
    /// committed cap). Default: unlimited.
    pub capacity: Option<u32>,
    /// Utilisation (0 to 1] past which the latency penalty starts. Default
    /// 0.8.
    pub knee: Option<f64>,
    /// Latency SLO in milliseconds; above it the destination is derated.
    /// Default: none.
    pub slo_ms: Option<u32>,
    /// Time to first token lightly loaded, at the SLO's quantile, ms: the
    /// prior of what the filter learns from answers. Default: none.
    pub ttft_ms: Option<u32>,
    /// US dollars to load a model that is not resident. Default 0.
    #[serde(default)]
    pub cold_load_usd: f64,
    /// Models resident now, by catalogue id; each must be served. Default:
    /// every served model.
    pub warm_models: Option<Vec<String>>,
    /// Rank weight, a multiplier on effective cost that moves the rank
    /// only; the booked cost stays true. Default 1. Must be above 0.
    pub bias: Option<f64>,
    /// Spot eviction-risk premium as a fraction of the GPU cost. Default 0.
    #[serde(default)]
    pub eviction_premium: f64,
    /// Reserved: US dollars per million tokens past the committed cap.
    /// Default: none (no overage; the cap is hard).
    pub overage_usd_per_mtok: Option<f64>,
    /// Per served model, its token price relative to this destination's
    /// (model routing). Default 1 for every model.
    #[serde(default)]
    pub model_cost_factors: std::collections::BTreeMap<String, f64>,
    /// An input token read from the provider's prompt cache, priced as
    /// this fraction of an input token (0 to 10). Default 1.
    pub cached_input_factor: Option<f64>,
    /// An input token written to the prompt cache, likewise. Default 1.
    pub cache_write_factor: Option<f64>,
    /// The most input tokens its model takes in one request: LiteLLM's
    /// price file's `max_input_tokens` for the model (128000 for gpt-4o).
    /// A usage claim past it is booked at it. Default: the configuration's
    /// `max_context_tokens`.
    pub max_input_tokens: Option<u32>,
    /// The same for output (`max_output_tokens`, 16384 for gpt-4o).
    pub max_output_tokens: Option<u32>,
}

/// A destination's cost parameters with every default resolved, as written
/// to `fleet.json` for the filter, in table order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResolvedDestination {
    /// Bit index in the tables.
    pub index: usize,
    /// Manifest name.
    pub name: String,
    /// Envoy cluster.
    pub cluster: String,
    /// Tier.
    pub tier: Tier,
    /// Provider.
    pub provider: String,
    /// Jurisdiction.
    pub jurisdiction: String,
    /// Region.
    pub region: String,
    /// Models served.
    pub models: Vec<String>,
    /// US dollars per million input tokens.
    pub input_usd_per_mtok: f64,
    /// US dollars per million output tokens.
    pub output_usd_per_mtok: f64,
    /// US dollars per GPU-hour.
    pub gpu_hour_usd: f64,
    /// GPUs.
    pub gpus: u32,
    /// Tokens per second.
    pub throughput_tps: f64,
    /// Concurrent-request capacity; `None` is unlimited.
    pub capacity: Option<u32>,
    /// Knee utilisation.
    pub knee: f64,
    /// SLO in milliseconds, if any.
    pub slo_ms: Option<u32>,
    /// Declared time to first token, ms, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u32>,
    /// Cold-load cost in US dollars.
    pub cold_load_usd: f64,
    /// Resident models.
    pub warm_models: Vec<String>,
    /// Rank multiplier.
    pub bias: f64,
    /// Spot eviction premium fraction.
    pub eviction_premium: f64,
    /// Overage price per million tokens, if any.
    pub overage_usd_per_mtok: Option<f64>,
    /// What its upstream expects.
    #[serde(default, skip_serializing_if = "ace_config::Upstream::is_default")]
    pub upstream: ace_config::Upstream,
    /// Prompt-cache read price over the input price, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_factor: Option<f64>,
    /// Prompt-cache write price over the input price, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_factor: Option<f64>,
    /// Its prompt cache as ACE models it, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<ace_config::PrefixCache>,
    /// Its model's most input tokens per request, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u32>,
    /// Its model's most output tokens per request, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

/// A manifest read from disk, with its text kept for error positions.
#[derive(Clone, Debug)]
pub struct LoadedManifest {
    /// The file.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
    /// Parsed and validated contents.
    pub manifest: Manifest,
}

impl LoadedManifest {
    /// A diagnostic at `span` of the manifest.
    pub fn diag(&self, span: std::ops::Range<usize>, message: String, hint: &str) -> Diagnostic {
        Diagnostic::span(&self.path, &self.text, span, message, hint.to_string())
    }

    /// The model classes (class name to members, reference first) and
    /// each destination's model cost factors (destination name to model to
    /// factor, only where some are given): the filter's `model_routing`,
    /// or `None` when the manifest declares no class.
    #[allow(clippy::type_complexity)]
    pub fn model_routing(
        &self,
    ) -> Option<(
        std::collections::BTreeMap<String, Vec<String>>,
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
    )> {
        let man = &self.manifest;
        if man.model_classes.is_empty() {
            return None;
        }
        let classes = man
            .model_classes
            .iter()
            .map(|c| {
                let c = c.get_ref();
                let members = c.models.iter().map(|m| m.get_ref().clone()).collect();
                (c.name.get_ref().clone(), members)
            })
            .collect();
        let factors = man
            .destinations
            .iter()
            .filter_map(|d| {
                let d = d.get_ref();
                let f = &d.cost.as_ref()?.get_ref().model_cost_factors;
                (!f.is_empty()).then(|| (d.name.get_ref().clone(), f.clone()))
            })
            .collect();
        Some((classes, factors))
    }

    /// The `[[budgets]]`, as the plugin configuration carries them.
    pub fn budgets(&self) -> Vec<ace_config::BudgetSettings> {
        self.manifest
            .budgets
            .iter()
            .map(|b| b.get_ref().clone())
            .collect()
    }

    /// A path the manifest names, relative to the manifest's folder unless
    /// absolute.
    pub fn resolve_path(&self, p: &str) -> std::path::PathBuf {
        let p = Path::new(p);
        match self.path.parent() {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p.to_path_buf(),
        }
    }

    /// Destinations with every cost default resolved, in table order.
    pub fn resolved(&self) -> Vec<ResolvedDestination> {
        self.manifest
            .destinations
            .iter()
            .enumerate()
            .map(|(index, d)| {
                let d = d.get_ref();
                let c = d
                    .cost
                    .as_ref()
                    .map(|c| c.get_ref().clone())
                    .unwrap_or_default();
                let models: Vec<String> = d.models.iter().map(|m| m.get_ref().clone()).collect();
                ResolvedDestination {
                    index,
                    name: d.name.get_ref().clone(),
                    cluster: d.cluster.get_ref().clone(),
                    // Validated in `check`: an unknown name never resolves.
                    tier: Tier::parse(d.tier.get_ref()).unwrap_or(Tier::Payg),
                    provider: d.provider.clone(),
                    jurisdiction: d.jurisdiction.clone(),
                    region: d.region.clone(),
                    input_usd_per_mtok: c.input_usd_per_mtok,
                    output_usd_per_mtok: c.output_usd_per_mtok,
                    gpu_hour_usd: c.gpu_hour_usd,
                    gpus: c.gpus.unwrap_or(1),
                    throughput_tps: c.throughput_tps.unwrap_or(1000.0),
                    capacity: c.capacity,
                    knee: c.knee.unwrap_or(0.8),
                    slo_ms: c.slo_ms,
                    ttft_ms: c.ttft_ms,
                    cold_load_usd: c.cold_load_usd,
                    warm_models: c.warm_models.clone().unwrap_or_else(|| models.clone()),
                    bias: c.bias.unwrap_or(1.0),
                    eviction_premium: c.eviction_premium,
                    overage_usd_per_mtok: c.overage_usd_per_mtok,
                    cached_input_factor: c.cached_input_factor,
                    cache_write_factor: c.cache_write_factor,
                    max_input_tokens: c.max_input_tokens,
                    max_output_tokens: c.max_output_tokens,
                    upstream: d
                        .upstream
                        .as_ref()
                        .map(|u| u.get_ref().clone())
                        .unwrap_or_default(),
                    prefix_cache: d.prefix_cache.as_ref().map(|p| p.get_ref().clone()),
                    models,
                }
            })
            .collect()
    }
}

/// A destination's `[destinations.upstream]`: valid as the filter will
/// read it, and naming only models the destination serves.
fn check_upstream(m: &LoadedManifest, d: &Destination, out: &mut Vec<Diagnostic>) {
    let Some(u) = &d.upstream else {
        return;
    };
    let span = u.span();
    if let Err(e) = u.get_ref().validate(0) {
        let field = e.field.trim_start_matches("destinations[0].");
        out.push(m.diag(
            span.clone(),
            format!(
                "destination `{}`: `{field}` {}",
                d.name.get_ref(),
                e.message
            ),
            "see `upstream` in fleet.schema.json",
        ));
    }
    for model in u.get_ref().models.keys() {
        if !d.models.iter().any(|mo| mo.get_ref() == model) {
            out.push(m.diag(
                span.clone(),
                format!(
                    "`upstream.models` names model `{model}`, which destination `{}` does not serve",
                    d.name.get_ref()
                ),
                "map only catalogue ids in the destination's `models` to the upstream's names",
            ));
        }
    }
}

/// A destination's `[destinations.prefix_cache]`: valid as the filter will
/// read it.
fn check_prefix_cache(m: &LoadedManifest, d: &Destination, out: &mut Vec<Diagnostic>) {
    let Some(p) = &d.prefix_cache else {
        return;
    };
    if let Err(e) = p.get_ref().validate(0) {
        let field = e.field.trim_start_matches("destinations[0].");
        out.push(m.diag(
            p.span(),
            format!(
                "destination `{}`: `{field}` {}",
                d.name.get_ref(),
                e.message
            ),
            "see `prefix_cache` in fleet.schema.json",
        ));
    }
}

/// The `[[budgets]]`: valid as the filter will read them (the plugin
/// configuration's own validation, its field mapped back to the line that
/// holds it), and counting only tenants of `[[tenants]]`: the tables know
/// no other, so a budget of another tenant would count nobody's spend.
fn check_budgets(m: &LoadedManifest, out: &mut Vec<Diagnostic>) {
    let budgets = &m.manifest.budgets;
    let Some(first) = budgets.first() else {
        return;
    };
    let raw: Vec<ace_config::BudgetSettings> =
        budgets.iter().map(|b| b.get_ref().clone()).collect();
    if let Err(e) = ace_config::Budgets::validate(&raw) {
        let (i, field) = budget_field(&e.field);
        let at = i.and_then(|i| budgets.get(i));
        let span = match at {
            Some(b) => field_span(&m.text, b.span(), &field),
            None => first.span(),
        };
        let whose = match at {
            Some(b) if !b.get_ref().name.trim().is_empty() => {
                format!("budget `{}`", b.get_ref().name)
            }
            Some(_) => format!("budget {}", i.unwrap_or(0) + 1),
            None => "`[[budgets]]`".to_string(),
        };
        out.push(m.diag(
            span,
            format!("{whose}: `{field}` {}", e.message),
            "see `budgets` in fleet.schema.json",
        ));
    }
    let known: BTreeSet<&str> = m
        .manifest
        .tenants
        .iter()
        .map(|t| t.get_ref().id.get_ref().as_str())
        .collect();
    for b in budgets {
        let s = b.get_ref();
        for t in &s.tenants {
            if !t.trim().is_empty() && !known.contains(t.as_str()) {
                out.push(m.diag(
                    field_span(&m.text, b.span(), "tenants"),
                    format!(
                        "budget `{}` counts tenant `{t}`, which is not under `[[tenants]]`",
                        s.name
                    ),
                    "budgets count tenants the policy tables know: add the tenant under \
                     `[[tenants]]`, or fix the id",
                ));
            }
        }
    }
}

/// The budget index and the field within it of a configuration error's
/// path (`budgets[2].soft.tiers[0]` gives 2 and `soft.tiers[0]`).
fn budget_field(path: &str) -> (Option<usize>, String) {
    let Some(rest) = path.strip_prefix("budgets[") else {
        return (None, path.to_string());
    };
    let Some((i, field)) = rest.split_once(']') else {
        return (None, path.to_string());
    };
    let field = field.strip_prefix('.').unwrap_or(field);
    (i.parse().ok(), field.to_string())
}

/// Where the key of `field` (its last name, without an index:
/// `soft.tiers[0]` looks for `tiers`) is written in the budget table at
/// `span` of `text`, else the table's start: so an error points at the
/// line to change. A `[[budgets]]` table's span is its header alone, so
/// its body is read up to the next header that is not one of its own
/// sub-tables (`[budgets.soft]`); an inline table's span is all of it.
fn field_span(text: &str, span: std::ops::Range<usize>, field: &str) -> std::ops::Range<usize> {
    let key = field
        .rsplit('.')
        .next()
        .unwrap_or(field)
        .split('[')
        .next()
        .unwrap_or("");
    let Some(head) = text.get(span.clone()) else {
        return span;
    };
    let end = if head.starts_with("[[") {
        let mut end = text.len();
        let mut at = span.end;
        while let Some(i) = text[at..].find('\n') {
            let line = text[at + i + 1..].trim_start_matches([' ', '\t']);
            if line.starts_with('[') && !line.starts_with("[budgets.") {
                end = at + i + 1;
                break;
            }
            at += i + 1;
        }
        end
    } else {
        span.end
    };
    let body = &text[span.start..end];
    if key.is_empty() {
        return span;
    }
    let mut from = 0;
    while let Some(i) = body[from..].find(key) {
        let at = from + i;
        let before = body[..at].chars().next_back();
        let after = body[at + key.len()..].trim_start_matches([' ', '\t']);
        let starts = before.is_none_or(|c| c.is_whitespace() || c == '{' || c == ',');
        if starts && after.starts_with('=') {
            return span.start + at..span.start + at + key.len();
        }
        from = at + key.len();
    }
    span
}

/// Reads, parses and validates the manifest at `path`.
pub fn load(path: &Path) -> Result<LoadedManifest, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Diagnostic::file(
            path,
            format!("cannot read the fleet manifest: {e}"),
            "put the fleet manifest at `fleet.toml` in the policy directory".into(),
        )
    })?;
    parse(path, text)
}

/// Parses and validates manifest `text` (named `path` in errors).
pub fn parse(path: &Path, text: String) -> Result<LoadedManifest, Error> {
    let manifest: Manifest = match toml::from_str(&text) {
        Ok(m) => m,
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            return Err(Diagnostic::span(
                path,
                &text,
                span,
                format!("invalid fleet manifest: {}", e.message().trim()),
                "see `policies/fleet.schema.json` for the fields and their types".into(),
            )
            .into());
        }
    };
    let loaded = LoadedManifest {
        path: path.to_path_buf(),
        text,
        manifest,
    };
    let problems = validate(&loaded);
    if problems.is_empty() {
        Ok(loaded)
    } else {
        Err(Error {
            diagnostics: problems,
        })
    }
}

fn check_number(
    m: &LoadedManifest,
    span: &std::ops::Range<usize>,
    out: &mut Vec<Diagnostic>,
    name: &str,
    value: f64,
    positive: bool,
) {
    let ok = value.is_finite() && if positive { value > 0.0 } else { value >= 0.0 };
    if !ok {
        let want = if positive { "above 0" } else { "0 or more" };
        out.push(m.diag(
            span.clone(),
            format!("cost field `{name}` is `{value}`, which is not a finite number {want}"),
            "cost parameters are US dollars, tokens per second or fractions; see fleet.schema.json",
        ));
    }
}

fn check_control(
    m: &LoadedManifest,
    d: &Destination,
    ctl: &Spanned<Control>,
    out: &mut Vec<Diagnostic>,
) {
    let span = ctl.span();
    let c = ctl.get_ref();
    let name = d.name.get_ref();
    let mut bad = |field: &str, problem: String, hint: &str| {
        out.push(m.diag(
            span.clone(),
            format!("destination `{name}`, control field `{field}`: {problem}"),
            hint,
        ));
    };
    if !ENGINES.contains(&c.engine()) {
        bad(
            "engine",
            format!("`{}` is not a known engine", c.engine()),
            "use one of `vllm`, `sglang`, `trtllm`, `tgi`",
        );
    }
    let urls = [
        ("url", c.url.as_deref()),
        ("metrics", c.metrics.as_deref()),
        ("models", c.models.as_deref()),
        (
            "eviction.url",
            c.eviction.as_ref().and_then(|e| e.url.as_deref()),
        ),
    ];
    for (field, u) in urls {
        if let Some(u) = u {
            if !is_http_url(u) {
                bad(
                    field,
                    format!("`{u}` is not an http:// or https:// URL"),
                    "give a full URL, e.g. `http://10.0.0.5:8000`",
                );
            }
        }
    }
    if let Some(e) = &c.eviction {
        if !EVICTION_PROVIDERS.contains(&e.provider.as_str()) {
            bad(
                "eviction.provider",
                format!("`{}` is not a known cloud", e.provider),
                "use one of `aws`, `gcp`, `azure`",
            );
        }
        match &e.vm_name {
            Some(_) if e.provider != "azure" => bad(
                "eviction.vm_name",
                format!("only Azure's notices name VMs, not `{}`'s", e.provider),
                "remove `vm_name`: AWS and GCP answer for the instance asked only",
            ),
            Some(n) if n.trim().is_empty() || n.chars().any(char::is_control) => bad(
                "eviction.vm_name",
                "the name is empty or holds control characters".into(),
                "give the VM's name as Azure's Scheduled Events list it in `Resources`",
            ),
            _ => {}
        }
    }
    if c.kv_token_budget == Some(0) {
        bad(
            "kv_token_budget",
            "the budget is 0".into(),
            "give the engine's batch token budget, e.g. TGI's `--max-batch-total-tokens`",
        );
    }
    if let Some(f) = &c.api_key_file {
        if f.trim().is_empty() {
            bad(
                "api_key_file",
                "the path is empty".into(),
                "name the file holding the model server's API key (never the key itself)",
            );
        }
    }
    let tier = Tier::parse(d.tier.get_ref());
    for (field, key) in [
        ("price_key", &c.price_key),
        ("gpu_price_key", &c.gpu_price_key),
    ] {
        if key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            bad(
                field,
                "the key is empty".into(),
                "give the price entry's key",
            );
        }
    }
    if let Some(t) = tier {
        if c.price_key.is_some() && t.bills_gpu_hours() {
            bad(
                "price_key",
                format!(
                    "a `{}` destination is priced by the GPU-hour, not by the token",
                    t.as_str()
                ),
                "use `gpu_price_key` for spot and on-demand destinations",
            );
        }
        if c.gpu_price_key.is_some() && !t.bills_gpu_hours() {
            bad(
                "gpu_price_key",
                format!(
                    "a `{}` destination is priced by the token, not by the GPU-hour",
                    t.as_str()
                ),
                "use `price_key` for inhouse, reserved and payg destinations",
            );
        }
    }
    match (c.plan_app, c.slots_per_gpu) {
        (Some(_), None) => bad(
            "slots_per_gpu",
            "missing, and `plan_app` needs it".into(),
            "give the concurrent requests one GPU holds, e.g. `slots_per_gpu = 8`",
        ),
        (None, Some(_)) => bad(
            "plan_app",
            "missing, and `slots_per_gpu` is given".into(),
            "give the planner's RT app this destination serves, or drop `slots_per_gpu`",
        ),
        (_, Some(0)) => bad(
            "slots_per_gpu",
            "is 0".into(),
            "give at least 1 (a plan of 0 GPUs already closes the destination)",
        ),
        _ => {}
    }
}

/// Whether `u` looks like an absolute http(s) URL with a host.
fn is_http_url(u: &str) -> bool {
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"));
    rest.is_some_and(|r| {
        let host = r.split(['/', '?', '#']).next().unwrap_or("");
        !host.is_empty() && !u.chars().any(char::is_whitespace)
    })
}

/// Every `[slo.<class>]` names a latency class of the request domain, with
/// usable figures.
fn check_slo(m: &LoadedManifest, out: &mut Vec<Diagnostic>) {
    let classes: Vec<String> = m
        .manifest
        .request
        .get("latency_class")
        .map(|d| {
            d.get_ref()
                .values
                .iter()
                .filter_map(|v| v.get_ref().as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for (class, slo) in &m.manifest.slo {
        let span = slo.span();
        let slo = slo.get_ref();
        if !classes.contains(class) {
            out.push(m.diag(
                span.clone(),
                format!("`[slo.{class}]` names no value of `request.latency_class`"),
                "add the class to `[request.latency_class] values`, or fix the name",
            ));
        }
        if slo.ttft_ms == Some(0) {
            out.push(m.diag(
                span.clone(),
                format!("`[slo.{class}]` ttft_ms is 0"),
                "a time-to-first-token target in ms > 0, or none",
            ));
        }
        let bad = |v: Option<f64>| v.is_some_and(|v| !(v.is_finite() && v >= 0.0));
        for (field, v) in [
            ("e2e_per_token_ms", slo.e2e_per_token_ms),
            ("usd_per_s", slo.usd_per_s),
            ("late_usd", slo.late_usd),
        ] {
            if bad(v) {
                out.push(m.diag(
                    span.clone(),
                    format!("`[slo.{class}]` {field} is not a number >= 0"),
                    "a finite number >= 0",
                ));
            }
        }
        if let Some(w) = &slo.when_late {
            if w != "serve" && w != "refuse" {
                out.push(m.diag(
                    span.clone(),
                    format!("`[slo.{class}]` when_late is `{w}`"),
                    "`serve` (late, counted as a miss) or `refuse` (503)",
                ));
            }
        }
    }
}

fn validate(m: &LoadedManifest) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let man = &m.manifest;
    if *man.version.get_ref() != 1 {
        out.push(m.diag(
            man.version.span(),
            format!(
                "manifest version `{}` is not supported",
                man.version.get_ref()
            ),
            "set `version = 1`",
        ));
    }
    let mut seen = BTreeSet::new();
    for t in &man.tenants {
        let id = &t.get_ref().id;
        if !seen.insert(id.get_ref().clone()) {
            out.push(m.diag(
                id.span(),
                format!("tenant `{}` is listed twice", id.get_ref()),
                "tenant ids must be unique",
            ));
        }
    }
    let mut models = BTreeSet::new();
    for mo in &man.models {
        let mo = mo.get_ref();
        if !models.insert(mo.id.get_ref().clone()) {
            out.push(m.diag(
                mo.id.span(),
                format!("model `{}` is listed twice", mo.id.get_ref()),
                "model ids must be unique",
            ));
        }
        if *mo.vram_gb.get_ref() < 0 {
            out.push(m.diag(
                mo.vram_gb.span(),
                format!("model `{}` needs negative VRAM", mo.id.get_ref()),
                "`vram_gb` is the VRAM one replica needs, in GB",
            ));
        }
        if *mo.tp_degree.get_ref() < 1 {
            out.push(m.diag(
                mo.tp_degree.span(),
                format!(
                    "model `{}` has tensor-parallel degree below 1",
                    mo.id.get_ref()
                ),
                "`tp_degree` is 1 for an unsharded model",
            ));
        }
    }
    if man.destinations.is_empty() {
        out.push(Diagnostic::file(
            &m.path,
            "the fleet manifest has no destinations".into(),
            "add at least one `[[destinations]]` table".into(),
        ));
    }
    if man.destinations.len() > ace_core::tables::MAX_DESTINATIONS as usize {
        out.push(Diagnostic::file(
            &m.path,
            format!("the fleet has {} destinations", man.destinations.len()),
            "the tables hold at most 65,536 destinations".into(),
        ));
    }
    let mut names = BTreeSet::new();
    let mut clusters = BTreeSet::new();
    for d in &man.destinations {
        let d = d.get_ref();
        if !names.insert(d.name.get_ref().clone()) {
            out.push(m.diag(
                d.name.span(),
                format!("destination `{}` is listed twice", d.name.get_ref()),
                "destination names must be unique",
            ));
        }
        if !clusters.insert(d.cluster.get_ref().clone()) {
            out.push(m.diag(
                d.cluster.span(),
                format!(
                    "cluster `{}` is used by two destinations",
                    d.cluster.get_ref()
                ),
                "each destination routes to its own Envoy cluster",
            ));
        }
        if Tier::parse(d.tier.get_ref()).is_none() {
            out.push(m.diag(
                d.tier.span(),
                format!("tier `{}` is not a known tier", d.tier.get_ref()),
                &format!("use one of {}", Tier::EXPECTED),
            ));
        }
        if !INTERCONNECTS.contains(&d.interconnect.get_ref().as_str()) {
            out.push(m.diag(
                d.interconnect.span(),
                format!("interconnect `{}` is not known", d.interconnect.get_ref()),
                "use one of `nvlink`, `pcie`, `none`",
            ));
        }
        if *d.vram_gb.get_ref() < 0 {
            out.push(m.diag(
                d.vram_gb.span(),
                format!("destination `{}` has negative VRAM", d.name.get_ref()),
                "`vram_gb` is the VRAM of one replica in GB; 0 if unknown",
            ));
        }
        for mo in &d.models {
            if !models.contains(mo.get_ref()) {
                out.push(m.diag(
                    mo.span(),
                    format!(
                        "destination `{}` serves model `{}`, which is not in the catalogue",
                        d.name.get_ref(),
                        mo.get_ref()
                    ),
                    "add it under `[[models]]` or fix the id",
                ));
            }
        }
        let c = d
            .cost
            .as_ref()
            .map(|c| c.get_ref().clone())
            .unwrap_or_default();
        let span = d.cost.as_ref().map_or_else(|| d.name.span(), |c| c.span());
        for (name, v) in [
            ("input_usd_per_mtok", c.input_usd_per_mtok),
            ("output_usd_per_mtok", c.output_usd_per_mtok),
            ("gpu_hour_usd", c.gpu_hour_usd),
            ("cold_load_usd", c.cold_load_usd),
            ("eviction_premium", c.eviction_premium),
        ] {
            check_number(m, &span, &mut out, name, v, false);
        }
        if let Some(v) = c.overage_usd_per_mtok {
            check_number(m, &span, &mut out, "overage_usd_per_mtok", v, false);
        }
        if let Some(v) = c.throughput_tps {
            check_number(m, &span, &mut out, "throughput_tps", v, true);
        }
        if let Some(v) = c.bias {
            check_number(m, &span, &mut out, "bias", v, true);
        }
        if let Some(k) = c.knee {
            if !(k > 0.0 && k <= 1.0) {
                out.push(m.diag(
                    span.clone(),
                    format!("cost field `knee` is `{k}`, outside (0, 1]"),
                    "the knee is the utilisation fraction where queueing starts to bite, e.g. 0.8",
                ));
            }
        }
        if c.gpus == Some(0) {
            out.push(m.diag(
                span.clone(),
                "cost field `gpus` is 0".into(),
                "omit it or give at least 1",
            ));
        }
        for (name, bound) in [
            ("max_input_tokens", c.max_input_tokens),
            ("max_output_tokens", c.max_output_tokens),
        ] {
            if bound == Some(0) {
                out.push(m.diag(
                    span.clone(),
                    format!("cost field `{name}` is 0"),
                    "give the model's own bound from LiteLLM's price file (gpt-4o: 128000 input, \
                     16384 output), or omit it to bound by `max_context_tokens`",
                ));
            }
        }
        for (name, f) in [
            ("cached_input_factor", c.cached_input_factor),
            ("cache_write_factor", c.cache_write_factor),
        ] {
            if let Some(f) = f.filter(|f| !(f.is_finite() && (0.0..=10.0).contains(f))) {
                out.push(m.diag(
                    span.clone(),
                    format!("cost field `{name}` is `{f}`, outside [0, 10]"),
                    "the prompt cache's price over the input price, e.g. 0.1 for a tenth",
                ));
            }
        }
        if let Some(ctl) = &d.control {
            check_control(m, d, ctl, &mut out);
        }
        for (model, f) in &c.model_cost_factors {
            let in_class = man
                .model_classes
                .iter()
                .any(|k| k.get_ref().models.iter().any(|mo| mo.get_ref() == model));
            if !in_class {
                out.push(m.diag(
                    span.clone(),
                    format!(
                        "`model_cost_factors` of destination `{}` names `{model}`, which is in no \
                         model class",
                        d.name.get_ref()
                    ),
                    "a factor prices model routing's (destination, model) pairs: add the model \
                     to a `[[model_classes]]` entry or remove its factor",
                ));
            }
            if !d.models.iter().any(|mo| mo.get_ref() == model) {
                out.push(m.diag(
                    span.clone(),
                    format!(
                        "`model_cost_factors` names model `{model}`, which destination `{}` does not serve",
                        d.name.get_ref()
                    ),
                    "list only models in the destination's `models`",
                ));
            }
            if !(f.is_finite() && *f > 0.0 && *f <= 1e6) {
                out.push(m.diag(
                    span.clone(),
                    format!(
                        "`model_cost_factors` gives `{model}` the factor `{f}`, outside (0, 1e6]"
                    ),
                    "a factor is the model's token price over the destination's, e.g. 0.2",
                ));
            }
        }
        check_upstream(m, d, &mut out);
        check_prefix_cache(m, d, &mut out);
        for w in c.warm_models.iter().flatten() {
            if !d.models.iter().any(|mo| mo.get_ref() == w) {
                out.push(m.diag(
                    span.clone(),
                    format!(
                        "warm model `{w}` is not served by destination `{}`",
                        d.name.get_ref()
                    ),
                    "`warm_models` must be a subset of `models`",
                ));
            }
        }
    }
    check_slo(m, &mut out);
    check_budgets(m, &mut out);
    let mut named = BTreeSet::new();
    for class in &man.model_classes {
        let class = class.get_ref();
        let name = class.name.get_ref();
        if models.contains(name) || !named.insert(name.clone()) {
            out.push(m.diag(
                class.name.span(),
                format!("model class `{name}` repeats a model or class name"),
                "a class needs a name of its own: requests may name it instead of a model",
            ));
        }
        if class.models.len() < 2 {
            out.push(m.diag(
                class.name.span(),
                format!("model class `{name}` has fewer than two models"),
                "list the models that may stand in for each other",
            ));
        }
        for mo in &class.models {
            if !models.contains(mo.get_ref()) {
                out.push(m.diag(
                    mo.span(),
                    format!(
                        "model class `{name}` lists `{}`, which is not in the catalogue",
                        mo.get_ref()
                    ),
                    "add it under `[[models]]` or fix the id",
                ));
            } else if !named.insert(mo.get_ref().clone()) {
                out.push(m.diag(
                    mo.span(),
                    format!("model `{}` is in two model classes", mo.get_ref()),
                    "a model may stand in for the models of one class only",
                ));
            }
        }
    }
    for (name, dom) in &man.request {
        if dom.get_ref().values.is_empty() {
            out.push(m.diag(
                dom.span(),
                format!("request attribute `{name}` has an empty domain"),
                "list at least one value; requests with other values fail closed anyway",
            ));
        }
    }
    out
}

/// What `text` as a `fleet.toml` is refused for, each diagnostic as it
/// prints; none when it is accepted.
#[cfg(test)]
fn refusals(text: String) -> Vec<String> {
    match parse(Path::new("fleet.toml"), text) {
        Ok(_) => Vec::new(),
        Err(e) => e.diagnostics.iter().map(|d| d.to_string()).collect(),
    }
}

#[cfg(test)]
mod control_tests {
    use super::*;

    const BASE: &str = r#"
version = 1
[[models]]
id = "m"
vram_gb = 1
[[destinations]]
name = "spot-a"
cluster = "spot_a"
provider = "aws"
tier = "spot"
jurisdiction = "US"
region = "us-east-1"
accelerator = "h100"
vram_gb = 80
interconnect = "nvlink"
models = ["m"]
"#;

    fn errors(control: &str) -> Vec<String> {
        let text = format!("{BASE}[destinations.control]\n{control}\n");
        refusals(text)
    }

    #[test]
    fn a_full_control_table_is_accepted_and_resolves_its_urls() {
        let text = format!(
            "{BASE}[destinations.control]\nurl = \"http://10.0.0.5:8000/\"\nengine = \"trtllm\"\n\
             eviction = {{ provider = \"gcp\" }}\ngpu_price_key = \"aws/us-east-1/p5/spot\"\n\
             plan_app = 2\nslots_per_gpu = 8\n"
        );
        let m = parse(Path::new("fleet.toml"), text).unwrap();
        let d = m.manifest.destinations[0].get_ref();
        let c = d.control.as_ref().unwrap().get_ref();
        assert_eq!(
            c.metrics_url().as_deref(),
            Some("http://10.0.0.5:8000/prometheus/metrics")
        );
        assert_eq!(
            c.models_url().as_deref(),
            Some("http://10.0.0.5:8000/v1/models")
        );
        assert_eq!(
            c.eviction.as_ref().unwrap().base_url(),
            "http://metadata.google.internal"
        );
    }

    #[test]
    fn a_prefix_cache_table_resolves_and_its_errors_name_the_field() {
        let text =
            format!("{BASE}[destinations.prefix_cache]\nttl_ms = 600000\nmin_tokens = 1024\n");
        let m = parse(Path::new("fleet.toml"), text).unwrap();
        let p = m.resolved()[0].prefix_cache.clone().unwrap();
        assert_eq!((p.ttl_ms, p.min_tokens), (Some(600_000), Some(1024)));
        for (table, expect) in [
            (
                "prefill_tokens_per_s = -1.0",
                "`prefix_cache.prefill_tokens_per_s`",
            ),
            ("ttl_ms = 90000000", "`prefix_cache.ttl_ms`"),
            ("size = 3", "unknown field `size`"),
        ] {
            let text = format!("{BASE}[destinations.prefix_cache]\n{table}\n");
            let e = refusals(text).concat();
            assert!(!e.is_empty(), "{table} accepted");
            assert!(e.contains(expect), "{table}: {e}");
        }
    }

    /// A model's own token bounds reach the resolved destination; 0 is
    /// refused, naming the field.
    #[test]
    fn a_models_token_bounds_resolve_and_zero_is_refused() {
        let cost = "[destinations.cost]\nmax_input_tokens = 128000\nmax_output_tokens = 16384\n";
        let m = parse(Path::new("fleet.toml"), format!("{BASE}{cost}")).unwrap();
        let d = &m.resolved()[0];
        assert_eq!(
            (d.max_input_tokens, d.max_output_tokens),
            (Some(128000), Some(16384))
        );
        for field in ["max_input_tokens", "max_output_tokens"] {
            let e = refusals(format!("{BASE}[destinations.cost]\n{field} = 0\n")).concat();
            assert!(e.contains(&format!("`{field}` is 0")), "{field}: {e}");
        }
    }

    #[test]
    fn an_upstream_table_resolves_and_its_errors_name_the_field() {
        let text = format!(
            "{BASE}[destinations.upstream]\nauthority = \"api.example.com\"\n\
             paths = {{ chat_completions = \"/openai/v1/chat/completions\" }}\n\
             models = {{ m = \"org/M-Instruct\" }}\n"
        );
        let m = parse(Path::new("fleet.toml"), text).unwrap();
        let u = &m.resolved()[0].upstream;
        assert_eq!(u.model_name("m"), "org/M-Instruct");
        assert_eq!(u.authority.as_deref(), Some("api.example.com"));
        for (upstream, expect) in [
            ("models = { x = \"y\" }", "names model `x`"),
            ("authority = \"a b\"", "`upstream.authority`"),
            (
                "paths = { chat_completions = \"v1\" }",
                "`upstream.paths.chat_completions`",
            ),
            ("paths = { chat = \"/v1\" }", "unknown variant `chat`"),
            ("api_key = \"sk-\"", "unknown field `api_key`"),
        ] {
            let text = format!("{BASE}[destinations.upstream]\n{upstream}\n");
            let e = refusals(text).concat();
            assert!(!e.is_empty(), "{upstream} accepted");
            assert!(e.contains(expect), "{upstream}: {e}");
        }
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/fleet.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let fields: BTreeSet<String> = schema["properties"]["destinations"]["items"]["properties"]
            ["upstream"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let full = ace_config::Upstream {
            authority: Some("a".into()),
            paths: Some(Default::default()),
            models: [("a".to_string(), "b".to_string())].into(),
            pass_credentials: true,
        };
        let rust: BTreeSet<String> = serde_json::to_value(full)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            fields, rust,
            "policies/fleet.schema.json and Upstream disagree"
        );
    }

    #[test]
    fn json_schema_lists_exactly_the_control_fields() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/fleet.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let control = &schema["properties"]["destinations"]["items"]["properties"]["control"];
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let rust = |v: serde_json::Value| keys(&v);
        assert_eq!(
            keys(&control["properties"]),
            rust(serde_json::to_value(Control::default()).unwrap()),
            "policies/fleet.schema.json and manifest::Control disagree"
        );
        assert_eq!(
            keys(&control["properties"]["eviction"]["properties"]),
            rust(serde_json::to_value(Eviction::default()).unwrap()),
            "policies/fleet.schema.json and manifest::Eviction disagree"
        );
    }

    #[test]
    fn bad_control_fields_name_the_destination_and_field() {
        for (control, field) in [
            ("engine = \"ollama\"", "`engine`"),
            ("metrics = \"10.0.0.5/metrics\"", "`metrics`"),
            (
                "eviction = { provider = \"oracle\" }",
                "`eviction.provider`",
            ),
            ("price_key = \"gpt-4o\"", "`price_key`"),
            ("plan_app = 1", "`slots_per_gpu`"),
            ("slots_per_gpu = 4", "`plan_app`"),
            ("plan_app = 1\nslots_per_gpu = 0", "`slots_per_gpu`"),
        ] {
            let e = errors(control);
            assert_eq!(e.len(), 1, "{control}: {e:?}");
            assert!(
                e[0].contains("destination `spot-a`, control field ") && e[0].contains(field),
                "{control}: {}",
                e[0]
            );
        }
        let e = errors("colour = \"red\"");
        assert!(e[0].contains("colour"), "{e:?}");
    }
}

#[cfg(test)]
mod model_class_tests {
    use super::*;

    /// A manifest of three models and one destination serving two of them,
    /// with `classes` and the destination's `cost` lines added.
    fn errors(classes: &str, cost: &str) -> Vec<String> {
        let text = format!(
            r#"
version = 1
[[models]]
id = "a"
vram_gb = 1
[[models]]
id = "b"
vram_gb = 1
[[models]]
id = "c"
vram_gb = 1
{classes}
[[destinations]]
name = "api"
cluster = "api"
provider = "x"
tier = "payg"
jurisdiction = "US"
region = "us-east-1"
accelerator = "api"
vram_gb = 0
interconnect = "none"
models = ["a", "b"]
[destinations.cost]
{cost}
"#
        );
        refusals(text)
    }

    const AB: &str = "[[model_classes]]\nname = \"ab\"\nmodels = [\"a\", \"b\"]";

    #[test]
    fn a_valid_class_and_factor_are_accepted() {
        assert_eq!(
            errors(AB, "model_cost_factors = { b = 0.2 }"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn bad_classes_and_factors_name_the_model_and_the_fix() {
        for (classes, cost, expect) in [
            (
                "[[model_classes]]\nname = \"one\"\nmodels = [\"a\"]",
                "",
                "model class `one` has fewer than two models",
            ),
            (
                "[[model_classes]]\nname = \"a\"\nmodels = [\"b\", \"c\"]",
                "",
                "model class `a` repeats a model or class name",
            ),
            (
                "[[model_classes]]\nname = \"x\"\nmodels = [\"a\", \"z\"]",
                "",
                "lists `z`, which is not in the catalogue",
            ),
            (
                "[[model_classes]]\nname = \"x\"\nmodels = [\"a\", \"b\"]\n\
                 [[model_classes]]\nname = \"y\"\nmodels = [\"b\", \"c\"]",
                "",
                "model `b` is in two model classes",
            ),
            (
                AB,
                "model_cost_factors = { c = 0.5 }",
                "names model `c`, which destination `api` does not serve",
            ),
            (
                AB,
                "model_cost_factors = { a = 0.0 }",
                "gives `a` the factor `0`, outside (0, 1e6]",
            ),
            // A factor prices a routed pair; a model in no class is never
            // one, and the filter would refuse the configuration.
            (
                "[[model_classes]]\nname = \"bc\"\nmodels = [\"b\", \"c\"]",
                "model_cost_factors = { a = 0.5 }",
                "names `a`, which is in no model class",
            ),
            (
                "",
                "model_cost_factors = { a = 0.5 }",
                "which is in no model class",
            ),
        ] {
            let e = errors(classes, cost);
            assert!(
                e.iter().any(|m| m.contains(expect)),
                "{classes} / {cost}: expected `{expect}` in {e:?}"
            );
        }
    }
}

#[cfg(test)]
mod slo_tests {
    use super::*;

    fn errors(slo: &str) -> Vec<String> {
        let text = format!(
            "version = 1\n[request.latency_class]\nvalues = [\"interactive\", \"batch\"]\n\
             [[models]]\nid = \"m\"\nvram_gb = 1\n[[destinations]]\nname = \"api\"\n\
             cluster = \"api\"\nprovider = \"x\"\ntier = \"payg\"\njurisdiction = \"US\"\n\
             region = \"us-east-1\"\naccelerator = \"none\"\nvram_gb = 0\n\
             interconnect = \"none\"\nmodels = [\"m\"]\n{slo}\n"
        );
        refusals(text)
    }

    #[test]
    fn class_objectives_are_checked_against_the_class_domain() {
        let ok = "[slo.interactive]\nttft_ms = 1000\ne2e_base_ms = 1000\ne2e_per_token_ms = 60\n\
                  late_usd = 0.1\nwhen_late = \"refuse\"\n[slo.batch]\ne2e_base_ms = 600000\n";
        assert_eq!(errors(ok), Vec::<String>::new());
        for (slo, expect) in [
            (
                "[slo.live]\nttft_ms = 300\n",
                "`[slo.live]` names no value of `request.latency_class`",
            ),
            ("[slo.interactive]\nttft_ms = 0\n", "ttft_ms is 0"),
            (
                "[slo.interactive]\nlate_usd = -1.0\n",
                "late_usd is not a number >= 0",
            ),
            (
                "[slo.interactive]\nwhen_late = \"queue\"\n",
                "when_late is `queue`",
            ),
            ("[slo.interactive]\nttft = 5\n", "unknown field `ttft`"),
        ] {
            let e = errors(slo);
            assert!(
                e.iter().any(|m| m.contains(expect)),
                "{slo}: expected `{expect}` in {e:?}"
            );
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    const BASE: &str = "version = 1\n[[tenants]]\nid = \"t1\"\n[[tenants]]\nid = \"t2\"\n\
                        [[models]]\nid = \"m\"\nvram_gb = 1\n[[destinations]]\nname = \"api\"\n\
                        cluster = \"api\"\nprovider = \"x\"\ntier = \"payg\"\njurisdiction = \"US\"\n\
                        region = \"us-east-1\"\naccelerator = \"api\"\nvram_gb = 0\n\
                        interconnect = \"none\"\nmodels = [\"m\"]\n";

    /// The diagnostics of BASE with `budgets` appended.
    fn errors(budgets: &str) -> Vec<Diagnostic> {
        match parse(Path::new("fleet.toml"), format!("{BASE}{budgets}")) {
            Ok(_) => Vec::new(),
            Err(e) => e.diagnostics,
        }
    }

    /// The 1-based line of `BASE` + `budgets` that holds `needle`.
    fn line_of(budgets: &str, needle: &str) -> usize {
        let text = format!("{BASE}{budgets}");
        let at = text.find(needle).expect("needle");
        text[..at].matches('\n').count() + 1
    }

    #[test]
    fn budgets_resolve_into_the_plugin_configuration_types() {
        let text = format!(
            "{BASE}[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 100\nperiod = \"week\"\n\
             soft = {{ tiers = [\"inhouse\"], max_usd_per_mtok = 0.5 }}\n\
             [[budgets]]\nname = \"g\"\ntenants = [\"t1\", \"t2\"]\ntokens_per_minute = 1000\n"
        );
        let m = parse(Path::new("fleet.toml"), text).unwrap();
        let b = m.budgets();
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].usd, Some(100.0));
        assert_eq!(b[0].period.as_deref(), Some("week"));
        assert_eq!(b[0].soft.as_ref().unwrap().max_usd_per_mtok, Some(0.5));
        assert_eq!(b[1].tenants, ["t1", "t2"]);
        let v = ace_config::Budgets::validate(&b).unwrap();
        assert_eq!(v.of("t1"), &[0, 1]);
    }

    #[test]
    fn a_bad_budget_is_named_at_the_line_of_its_field() {
        for (budgets, needle, expect) in [
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 10\nsoft_at = 1.5\n",
                "soft_at = 1.5",
                "budget `a`: `soft_at` must be a share",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 10\n\n\
                 [[budgets]]\nname = \"b\"\ntenants = [\"t2\"]\nusd = 10\nperiod = \"year\"\n",
                "period = \"year\"",
                "budget `b`: `period` `year` is not a period",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 10\n\
                 soft = { tiers = [\"gpu\"] }\n",
                "tiers = [\"gpu\"]",
                "budget `a`: `soft.tiers[0]` `gpu` is not a tier",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 10\n[budgets.soft]\n\
                 substitution_only = true\nmax_usd_per_mtok = -1.0\n",
                "max_usd_per_mtok = -1.0",
                "budget `a`: `soft.max_usd_per_mtok` must be a non-negative number",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 10\nperiod = \"rolling\"\n",
                "[[budgets]]",
                "budget `a`: `window_s` is missing",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 1\n\n[[budgets]]\n\
                 name = \"a\"\ntenants = [\"t2\"]\nusd = 1\n",
                "name = \"a\"\ntenants = [\"t2\"]",
                "`name` `a` names two budgets",
            ),
            (
                "[[budgets]]\nname = \"a\"\ntenants = [\"t1\", \"t9\"]\nusd = 10\n",
                "tenants = [\"t1\", \"t9\"]",
                "budget `a` counts tenant `t9`, which is not under `[[tenants]]`",
            ),
        ] {
            let e = errors(budgets);
            assert_eq!(e.len(), 1, "{budgets}: {e:?}");
            let text = e[0].to_string();
            assert!(text.contains(expect), "{budgets}: {text}");
            assert_eq!(e[0].line, line_of(budgets, needle), "{budgets}: {text}");
        }
        let e = errors("[[budgets]]\nname = \"a\"\ntenants = [\"t1\"]\nusd = 1\ncolour = 1\n");
        assert!(e[0].to_string().contains("unknown field `colour`"), "{e:?}");
    }

    #[test]
    fn json_schema_lists_exactly_the_budget_fields() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/fleet.schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let items = &schema["properties"]["budgets"]["items"];
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let full = ace_config::BudgetSettings {
            name: "a".into(),
            tenants: vec!["t".into()],
            usd: Some(1.0),
            period: Some("rolling".into()),
            window_s: Some(60),
            soft_at: Some(0.5),
            soft: Some(ace_config::budget::SoftSettings {
                tiers: Some(vec![]),
                max_usd_per_mtok: Some(1.0),
                substitution_only: true,
            }),
            tokens_per_minute: Some(1),
        };
        let rust = serde_json::to_value(&full).unwrap();
        assert_eq!(
            keys(&items["properties"]),
            keys(&rust),
            "policies/fleet.schema.json and BudgetSettings disagree"
        );
        assert_eq!(
            keys(&items["properties"]["soft"]["properties"]),
            keys(&rust["soft"]),
            "policies/fleet.schema.json and SoftSettings disagree"
        );
    }
}
