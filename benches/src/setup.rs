//! The Envoys the variants run, beyond the harness's builder: ACE's
//! dynamic module, the example fleet's plugin configuration and clusters,
//! and the shipped bootstraps (`envoy/envoy.yaml`,
//! `envoy/envoy-dynamic.yaml`) with one phase taken out at a time.

use crate::variant::{Ablation, Build, Variant};
use ace_config::PluginConfig;
use ace_harness::envoy::EnvoyBuilder;
use serde_json::json;
use std::path::PathBuf;

/// ACE's dynamic module: `ACE_DYNAMIC_LIB` (a `libace_dynamic.so` built
/// elsewhere, e.g. from an older commit), else the workspace's, built.
pub fn dynamic_lib() -> Result<PathBuf, String> {
    match file_from_env("ACE_DYNAMIC_LIB")? {
        Some(p) => Ok(p),
        None => ace_harness::dylib::build("ace-dynamic"),
    }
}

/// The file environment variable `var` names, if it is set; an error if
/// it names no file.
pub fn file_from_env(var: &str) -> Result<Option<PathBuf>, String> {
    match std::env::var_os(var) {
        Some(p) => {
            let p = PathBuf::from(p);
            if p.is_file() {
                Ok(Some(p))
            } else {
                Err(format!("{var}={}: no such file", p.display()))
            }
        }
        None => Ok(None),
    }
}

/// The example fleet's plugin configuration for variant `v`: the
/// manifest's model routing only for the routing variants, the cache only
/// for the cache ones (checking every hit for `*check`).
pub fn fleet_config(v: Variant) -> Result<String, String> {
    let mut config = fleet_plugin_config()?;
    if !matches!(v, Variant::AceRoute | Variant::AceDynRoute) {
        config.model_routing = None;
    }
    let check = match v {
        Variant::AceHit | Variant::AceDynHit => Some(0.0),
        Variant::AceCheck | Variant::AceDynCheck => Some(1.0),
        _ => None,
    };
    if matches!(v, Variant::AceAddressed | Variant::AceDynAddressed) {
        // Every destination as a provider would have it: its own names for
        // the models it serves, its own path and authority.
        for d in &mut config.destinations {
            let models = d.warm_models.clone().unwrap_or_default();
            d.upstream = ace_config::Upstream {
                authority: Some(format!("{}.provider.example", d.cluster.replace('_', "-"))),
                paths: Some(
                    [(
                        ace_config::Api::ChatCompletions,
                        "/openai/v1/chat/completions".to_string(),
                    )]
                    .into(),
                ),
                models: models
                    .iter()
                    .map(|m| (m.clone(), format!("org/{m}")))
                    .collect(),
                pass_credentials: false,
            };
        }
    }
    let mut json = serde_json::to_value(&config).map_err(|e| e.to_string())?;
    if let Some(f) = check {
        json["cache"] = json!({"check_fraction": f});
    }
    if matches!(v, Variant::AcePrefix | Variant::AceDynPrefix) {
        json["locality"] = json!({});
    }
    Ok(json.to_string())
}

/// `ace plugin-config policies/`: the example fleet's plugin configuration
/// (reading bodies), as the CLI writes it.
pub fn fleet_plugin_config() -> Result<PluginConfig, String> {
    let dir = ace_harness::workspace_root().join("policies");
    let project = ace_policy::load_dir(&dir).map_err(|e| e.to_string())?;
    let compiled = ace_policy::compile(&project).map_err(|e| e.to_string())?;
    ace_policy::plugin::plugin_config(&project, &compiled, false, true).map_err(|e| e.to_string())
}

/// The shipped bootstrap of `build` (`envoy/envoy.yaml` or
/// `envoy/envoy-dynamic.yaml`, parsed), with `ablation` taken out: what a
/// user runs after replacing the clusters and the plugin configuration as
/// the file's header says. The plugin configuration keeps every setting the
/// file ships (body reading, control, latency price, retries) and takes the
/// example fleet's destinations and tables from `ace plugin-config
/// policies/` (without model routing: the reference request is not
/// substituted). `wasm` is the filter build the Wasm file loads.
pub fn shipped(
    build: Build,
    ablation: Ablation,
    wasm: &std::path::Path,
) -> Result<serde_json::Value, String> {
    let file = match build {
        Build::Plain | Build::Wasm => "envoy/envoy.yaml",
        Build::Dynamic => "envoy/envoy-dynamic.yaml",
    };
    let path = ace_harness::workspace_root().join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = text.replace("/etc/ace/ace_filter.wasm", &wasm.to_string_lossy());
    let mut b: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if build == Build::Dynamic {
        let lib = dynamic_lib()?;
        ace_harness::dylib::use_search_path(&lib);
    }
    let manager = "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config";
    let hcm = b
        .pointer_mut(manager)
        .ok_or_else(|| format!("{file}: no HTTP connection manager at {manager}"))?;
    let filters = hcm["http_filters"]
        .as_array_mut()
        .ok_or_else(|| format!("{file}: the connection manager has no http_filters"))?;
    if build == Build::Plain {
        filters.retain(|f| f["name"] == "envoy.filters.http.router");
        // No ACE to name the cluster: the route names the one it would.
        let route = "/route_config/virtual_hosts/0/routes/0/route";
        let to = fleet_plugin_config()?
            .destinations
            .first()
            .map(|d| d.cluster.clone())
            .ok_or("the example fleet has no destination")?;
        let r = hcm
            .pointer_mut(route)
            .and_then(serde_json::Value::as_object_mut)
            .ok_or_else(|| format!("{file}: no route at {route}"))?;
        r.remove("cluster_header");
        r.insert("cluster".into(), json!(to));
        // Envoy's own line (its default format) for every request.
        let log = &mut hcm["access_log"][0];
        if let Some(l) = log.as_object_mut() {
            l.remove("filter");
        }
        log["typed_config"]
            .as_object_mut()
            .ok_or_else(|| format!("{file}: the access log has no typed_config"))?
            .remove("log_format");
        return Ok(b);
    }
    let ace = filters
        .iter_mut()
        .find(|f| f["name"] != "envoy.filters.http.router")
        .ok_or_else(|| format!("{file}: no ACE filter before the router"))?;
    let value = match build {
        Build::Dynamic => "/typed_config/filter_config/value",
        _ => "/typed_config/config/configuration/value",
    };
    let slot = ace
        .pointer_mut(value)
        .ok_or_else(|| format!("{file}: the ACE filter has no configuration at {value}"))?;
    let mut config: PluginConfig = serde_json::from_str(slot.as_str().unwrap_or_default())
        .map_err(|e| format!("{file}: the ACE filter's configuration: {e}"))?;
    let fleet = fleet_plugin_config()?;
    config.destinations = fleet.destinations;
    config.on_missing_attribute = fleet.on_missing_attribute;
    config.attribute_defaults = fleet.attribute_defaults;
    config.latency_classes = fleet.latency_classes;
    config.max_context_tokens = fleet.max_context_tokens;
    config.allow_no_policy = false;
    config.tables_base64 = fleet.tables_base64;
    if ablation >= Ablation::Body {
        config.body = Default::default();
    }
    if ablation >= Ablation::Tables {
        config.tables_base64 = None;
        config.allow_no_policy = true;
    }
    let config = serde_json::to_string(&config).map_err(|e| e.to_string())?;
    *slot = json!(config);
    if ablation >= Ablation::Log {
        hcm.as_object_mut()
            .ok_or_else(|| format!("{file}: the connection manager is not an object"))?
            .remove("access_log");
    }
    Ok(b)
}

/// `b` with every cluster of the example fleet, all to the upstream on
/// `port` (but `owned`, `reserved` and `payg` when `b` has them already).
pub fn fleet_clusters(b: EnvoyBuilder, port: u16, has_base: bool) -> EnvoyBuilder {
    let dir = ace_harness::workspace_root().join("policies");
    let Ok(project) = ace_policy::load_dir(&dir) else {
        return b;
    };
    let clusters: Vec<String> = project
        .manifest
        .resolved()
        .into_iter()
        .map(|d| d.cluster)
        .filter(|c| !has_base || !["owned", "reserved", "payg"].contains(&c.as_str()))
        .collect();
    clusters.iter().fold(b, |b, c| b.cluster(c, port))
}
