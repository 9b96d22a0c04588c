//! `ace plugin-config`: the filter's configuration for a policy directory.
//!
//! The fleet manifest and the Cedar policies are the operator's source of
//! truth; the filter needs them as one JSON document: the destinations in
//! table order with their cost curves in per-token dollars, and the
//! compiled tables. This is the one place that translation happens, so the
//! filter never sees a manifest and the manifest never sees filter fields.

use crate::out;
use ace_filter::config::{ControlSettings, Destination, OnMissing, PluginConfig};
use anyhow::{anyhow, bail, Context};
use base64::Engine;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `ace plugin-config`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Policy directory (schema, policies, fleet manifest).
    #[arg(default_value = "policies")]
    dir: PathBuf,
    /// Treat a request without an attribute as the unknown value (fails
    /// closed) instead of refusing it with 400.
    #[arg(long)]
    restrict: bool,
    /// Also read the request body's `model` (needs
    /// `allow_on_headers_stop_iteration` on the Envoy filter).
    #[arg(long)]
    read_body: bool,
    /// Write here instead of standard output.
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Poll the control service (`ace control serve`) through this Envoy
    /// cluster for prices, load, capacity, drains and warm models.
    #[arg(long, value_name = "CLUSTER")]
    control_cluster: Option<String>,
    /// The control service's bearer token, read from this file (with
    /// `--control-cluster`).
    #[arg(long, value_name = "FILE", requires = "control_cluster")]
    control_token_file: Option<PathBuf>,
    /// How often to poll it, ms (default 1000).
    #[arg(long, value_name = "MS", requires = "control_cluster")]
    control_interval_ms: Option<u64>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = build(&args.dir, args.restrict, args.read_body)?;
    if let Some(cluster) = args.control_cluster {
        let token = match &args.control_token_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| {
                        format!("cannot read the control token file `{}`", f.display())
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        config["control"] = serde_json::to_value(ControlSettings {
            cluster,
            token,
            interval_ms: args.control_interval_ms,
            ..ControlSettings::default()
        })?;
        // The filter checks it as it will when Envoy loads it.
        ace_filter::config::Config::parse(config.to_string().as_bytes())
            .map_err(|e| anyhow!("{e}"))?;
    }
    let text = serde_json::to_string_pretty(&config)? + "\n";
    match &args.out {
        Some(p) => {
            std::fs::write(p, text).with_context(|| format!("cannot write `{}`", p.display()))?
        }
        None => out!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Compile `dir` and build the filter configuration for it, as JSON.
pub fn build(dir: &Path, restrict: bool, read_body: bool) -> anyhow::Result<Value> {
    Ok(serde_json::to_value(build_config(
        dir, restrict, read_body,
    )?)?)
}

/// Compile `dir` and build the filter configuration for it: the filter's
/// own configuration type, so that a field the filter does not read cannot
/// be written here.
pub fn build_config(dir: &Path, restrict: bool, read_body: bool) -> anyhow::Result<PluginConfig> {
    let project = ace_policy::load_dir(dir).map_err(|e| anyhow!("{e}"))?;
    let compiled = ace_policy::compile(&project).map_err(|e| anyhow!("{e}"))?;
    let mut destinations = Vec::new();
    for d in project.manifest.resolved() {
        let per_token = |per_mtok: f64| per_mtok / 1e6;
        let capacity = match (d.capacity, d.tier.is_sunk()) {
            (Some(c), _) => c,
            (None, false) => 0,
            (None, true) => bail!(
                "destination `{}` (tier {}) has no cost.capacity in the fleet manifest; \
                 the filter needs the owned or committed concurrent-request capacity",
                d.name,
                d.tier
            ),
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
            cold_load_usd: d.cold_load_usd,
            bias: d.bias,
            warm_models: Some(d.warm_models),
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
    if read_body || model_policy {
        config.body.read = true;
    }
    // What a second of queueing is worth per latency class in the
    // manifest's domain: interactive work most, batch nothing. Starting
    // values; edit them to the business's own.
    if let Some(domain) = project.manifest.manifest.request.get("latency_class") {
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
                (c.to_string(), usd_per_s)
            })
            .collect();
    }
    Ok(config)
}
