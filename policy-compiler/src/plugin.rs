//! The filter's plugin configuration for a compiled policy directory: the
//! destinations in table order with their cost curves in per-token dollars,
//! the compiled tables, latency classes, model routing and tenant budgets.
//!
//! Why here and not in the `ace` command: the fleet manifest and the Cedar
//! policies are the operator's source of truth and the filter needs them as
//! one JSON document. `ace plugin-config` and the browser playground both
//! produce that document, and a translation written twice drifts. Built on
//! the filter's own configuration type, so a field the filter does not read
//! cannot be written here, and the manifest never sees filter fields.

use crate::compile::Compiled;
use crate::error::{Diagnostic, Error};
use crate::project::Project;
use ace_config::{Destination, LatencyClassSettings, OnMissing, PluginConfig, WhenLate};
use base64::Engine as _;

/// Whether some destination sends a model under another name.
fn destinations_rename(config: &PluginConfig) -> bool {
    config
        .destinations
        .iter()
        .any(|d| d.upstream.models.iter().any(|(m, n)| m != n))
}

/// The filter's configuration for `project` compiled into `compiled`.
///
/// `restrict` treats a request without an attribute as the unknown value
/// (fails closed) instead of refusing it with 400; `read_body` also reads
/// the request body's `model` (forced on when the tables decide on the
/// model, since the filter refuses such tables without it).
pub fn plugin_config(
    project: &Project,
    compiled: &Compiled,
    restrict: bool,
    read_body: bool,
) -> Result<PluginConfig, Error> {
    let mut destinations = Vec::new();
    for d in project.manifest.resolved() {
        let per_token = |per_mtok: f64| per_mtok / 1e6;
        let capacity =
            match (d.capacity, d.tier.is_sunk()) {
                (Some(c), _) => c,
                (None, false) => 0,
                (None, true) => return Err(Diagnostic::file(
                    &project.sources.manifest.0,
                    format!(
                        "destination `{}` (tier {}) has no cost.capacity",
                        d.name, d.tier
                    ),
                    "set `capacity` under its `[destinations.cost]`: the filter needs the owned \
                     or committed concurrent-request capacity"
                        .into(),
                )
                .into()),
            };
        destinations.push(Destination {
            name: d.name,
            cluster: d.cluster,
            tier: d.tier,
            usd_per_input_token: per_token(d.input_usd_per_mtok),
            usd_per_output_token: per_token(d.output_usd_per_mtok),
            usd_per_gpu_hour: d.gpu_hour_usd * f64::from(d.gpus),
            tokens_per_second: d.throughput_tps,
            eviction_premium: d.eviction_premium,
            overage_usd_per_token: d.overage_usd_per_mtok.map(per_token),
            capacity,
            knee: d.knee,
            service_ms: Destination::DEFAULT_SERVICE_MS,
            slo_ms: d.slo_ms.map(u64::from),
            ttft_ms: d.ttft_ms.map_or(0.0, f64::from),
            cold_load_usd: d.cold_load_usd,
            bias: d.bias,
            warm_models: Some(d.warm_models),
            cached_input_factor: d.cached_input_factor,
            cache_write_factor: d.cache_write_factor,
            upstream: d.upstream,
            prefix_cache: d.prefix_cache,
            max_input_tokens: d.max_input_tokens,
            max_output_tokens: d.max_output_tokens,
        });
    }
    let mut config = PluginConfig {
        destinations,
        tables_base64: Some(base64::engine::general_purpose::STANDARD.encode(&compiled.bytes)),
        on_missing_attribute: Some(if restrict {
            OnMissing::Restrict
        } else {
            OnMissing::Reject
        }),
        ..PluginConfig::default()
    };
    // Tables that decide on the model need the body's `model` (what the
    // upstream serves): the filter refuses a configuration without it.
    let model_policy = ace_core::tables::Tables::load(&compiled.bytes)
        .is_ok_and(|t| t.attribute_index("model").is_some());
    // A destination that renames a model needs the body to rewrite.
    let renames = destinations_rename(&config);
    if read_body || model_policy || renames {
        config.body.read = true;
    }
    // Per latency class in the manifest's domain: what a second of
    // queueing is worth (interactive work most, batch nothing: starting
    // values, edit them to the business's own) and the class's `[slo]`.
    if let Some(domain) = project.manifest.manifest.request.get("latency_class") {
        let slo = &project.manifest.manifest.slo;
        config.latency_classes = domain
            .get_ref()
            .values
            .iter()
            .filter_map(|v| v.get_ref().as_str())
            .map(|c| {
                let usd_per_s = match c {
                    "interactive" => 0.01,
                    "batch" => 0.0,
                    _ => 0.002,
                };
                let class = match slo.get(c).map(|s| s.get_ref()) {
                    None => LatencyClassSettings::Value(usd_per_s),
                    Some(s) => LatencyClassSettings::Class {
                        usd_per_s: Some(s.usd_per_s.unwrap_or(usd_per_s)),
                        ttft_ms: s.ttft_ms,
                        late_usd: s.late_usd,
                        when_late: match s.when_late.as_deref() {
                            Some("refuse") => Some(WhenLate::Refuse),
                            Some(_) => Some(WhenLate::Serve),
                            None => None,
                        },
                    },
                };
                (c.to_string(), class)
            })
            .collect();
    }
    // Model routing where the manifest declares classes: the tables decide
    // who may be served another model (`substituted`); the filter refuses
    // classes without that attribute, naming the fix.
    if let Some((classes, cost_factors)) = project.manifest.model_routing() {
        config.model_routing = Some(ace_config::RoutingSettings {
            classes,
            cost_factors,
        });
    }
    // Tenant budgets as the manifest gives them (validated when it was
    // loaded, their tenants among the tables' own).
    config.budgets = project.manifest.budgets();
    Ok(config)
}

/// What an operator should know of `config` before deploying it, one
/// sentence each (`ace plugin-config` prints them on stderr): budgets that
/// count a tenant the client names, since the manifest cannot say where a
/// verified tenant comes from and the document leaves `attribute_sources`
/// to the operator ([`ace_config::budget::unverified_tenant`]; the filter
/// logs the same when it loads such a configuration).
pub fn warnings(config: &PluginConfig) -> Vec<String> {
    let mut out = Vec::new();
    if !config.budgets.is_empty() && !config.attribute_sources.contains_key("tenant") {
        let names: Vec<&str> = config.budgets.iter().map(|b| b.name.as_str()).collect();
        out.push(ace_config::budget::unverified_tenant(&names));
    }
    out
}
