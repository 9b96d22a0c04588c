//! `ace plugin-config`: the filter's configuration for a policy directory.
//!
//! The fleet manifest and the Cedar policies are the operator's source of
//! truth; the filter needs them as one JSON document: the destinations in
//! table order with their cost curves in per-token dollars, and the
//! compiled tables. The translation itself is
//! [`ace_policy::plugin::plugin_config`], shared with the browser
//! playground; this module adds the command's options (the control
//! service) and writes the document, and prints on stderr what the
//! operator must still see to ([`ace_policy::plugin::warnings`]: budgets
//! on a tenant the client names).

use crate::out;
use ace_config::{ControlSettings, PluginConfig};
use anyhow::{anyhow, Context};
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
    let built = build_config(&args.dir, args.restrict, args.read_body)?;
    for w in ace_policy::plugin::warnings(&built) {
        eprintln!("warning: {w}");
    }
    let mut config = serde_json::to_value(built)?;
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
        let control = serde_json::to_value(ControlSettings {
            cluster,
            token,
            interval_ms: args.control_interval_ms,
            ..ControlSettings::default()
        })?;
        let Some(fields) = config.as_object_mut() else {
            return Err(anyhow!(
                "the plugin configuration is not a JSON object, so `control` cannot be added to it"
            ));
        };
        fields.insert("control".to_string(), control);
        // The filter checks it as it will when Envoy loads it.
        ace_config::Config::parse(config.to_string().as_bytes()).map_err(|e| anyhow!("{e}"))?;
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

/// Compile `dir` and build the filter configuration for it
/// ([`ace_policy::plugin::plugin_config`], which the browser playground
/// shares).
pub fn build_config(dir: &Path, restrict: bool, read_body: bool) -> anyhow::Result<PluginConfig> {
    let project = ace_policy::load_dir(dir).map_err(|e| anyhow!("{e}"))?;
    project_config(&project, restrict, read_body)
}

/// [`build_config`] for a project already loaded.
pub fn project_config(
    project: &ace_policy::Project,
    restrict: bool,
    read_body: bool,
) -> anyhow::Result<PluginConfig> {
    let compiled = ace_policy::compile(project).map_err(|e| anyhow!("{e}"))?;
    ace_policy::plugin::plugin_config(project, &compiled, restrict, read_body)
        .map_err(|e| anyhow!("{e}"))
}
