//! The shipped Istio manifests (`envoy/istio/`) hold together: what each
//! hands Envoy is accepted by Envoy 1.40 and by the filter (built from source
//! in this run), and the patches point at each other by the right names.
//!
//! There is no Istio here, so the test plays its part: it takes the Wasm
//! filter configuration from each manifest (the `EnvoyFilter`'s ECDS
//! extension config as is; the `WasmPlugin`'s `pluginConfig` as the JSON
//! string Istio passes), puts it in a bootstrap with `route.yaml`'s route
//! patch and one cluster per destination, and runs
//! `envoy --mode validate`, in which Envoy also starts the plugin.

use ace_harness::client::Request;
use ace_harness::envoy::EnvoyBuilder;
use ace_tests::{ace_filter_wasm, envoy_validate, require_envoy, start, upstream};
use serde_json::{json, Value};

fn manifest(name: &str) -> Value {
    let path = ace_harness::workspace_root().join("envoy/istio").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An `EnvoyFilter`'s config patch applied to `apply_to` (its `match` and
/// its `patch`).
fn config_patch<'a>(filter: &'a Value, apply_to: &str) -> &'a Value {
    let patches = filter["spec"]["configPatches"]
        .as_array()
        .unwrap_or_else(|| {
            panic!(
                "{}: spec.configPatches is not a list",
                filter["metadata"]["name"]
            )
        });
    let found: Vec<&Value> = patches
        .iter()
        .filter(|p| p["applyTo"] == apply_to)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{}: one {apply_to} patch",
        filter["metadata"]["name"]
    );
    found[0]
}

/// The ACE plugin configuration (JSON in a `StringValue`) inside a Wasm
/// filter's `TypedExtensionConfig`.
fn plugin_config(wasm: &Value) -> Value {
    let text = wasm["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("no plugin configuration string in {wasm}"));
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the plugin configuration is not JSON: {e}"))
}

/// `envoy --mode validate` on a bootstrap whose only HTTP filter before the
/// router is `wasm` (a `TypedExtensionConfig`), routed as `route.yaml`
/// patches the gateway route; returns Envoy's output.
fn validate(wasm: &Value, route: &Value) -> String {
    let config = plugin_config(wasm);
    let clusters: Vec<Value> = config["destinations"]
        .as_array()
        .unwrap_or_else(|| panic!("no destinations in {config}"))
        .iter()
        .map(|d| {
            let name = d["cluster"].as_str().unwrap_or_default();
            json!({
                "name": name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address":
                        {"address": "127.0.0.1", "port_value": 9}}}}]}]}
            })
        })
        .collect();
    let bootstrap = json!({
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "llm", "domains": ["*"],
                            "routes": [{"name": "ace-llm", "match": {"prefix": "/v1/"}, "route": route}]
                        }]},
                        "http_filters": [
                            {"name": wasm["name"], "typed_config": wasm["typed_config"]},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ]
                    }
                }]}]
            }],
            "clusters": clusters
        }
    });
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("gateway.json");
    std::fs::write(&path, bootstrap.to_string()).unwrap_or_else(|e| panic!("{e}"));
    envoy_validate(&path)
}

/// The route as `route.yaml` leaves it: the patch merged into the
/// `VirtualService`'s route (the patch's `cluster_header` takes the place
/// of Istio's `cluster`, one `oneof`).
fn patched_route() -> Value {
    let service = manifest("virtualservice.yaml");
    let patches = manifest("route.yaml");
    let route = config_patch(&patches, "HTTP_ROUTE");
    assert_eq!(route["patch"]["operation"], "MERGE");
    let wanted = route["match"]["routeConfiguration"]["vhost"]["route"]["name"].clone();
    assert!(
        service["spec"]["http"]
            .as_array()
            .is_some_and(|h| h.iter().any(|r| r["name"] == wanted)),
        "the route patch targets {wanted}, a route virtualservice.yaml names"
    );
    let merged = route["patch"]["value"]["route"].clone();
    assert_eq!(merged["cluster_header"], "x-ace-destination", "{merged}");
    assert_eq!(merged["timeout"], "0s", "streams outlive any fixed timeout");
    merged
}

#[test]
fn envoyfilter_configures_the_plugin_and_routes_on_its_header() {
    require_envoy();
    let module = ace_filter_wasm();
    let filter = manifest("envoyfilter.yaml");

    // The HTTP filter asks ECDS for the extension config the first patch
    // adds, by its name and type, just before the router.
    // The route patch lives in route.yaml alone (the WasmPlugin needs it too),
    // for the same gateway.
    let patches = filter["spec"]["configPatches"].as_array();
    assert!(
        patches.is_some_and(|p| p.iter().all(|p| p["applyTo"] != "HTTP_ROUTE")),
        "envoyfilter.yaml leaves the route to route.yaml"
    );
    let gateway = &filter["spec"]["workloadSelector"]["labels"];
    assert_eq!(
        &manifest("route.yaml")["spec"]["workloadSelector"]["labels"],
        gateway
    );
    assert_eq!(
        &manifest("wasmplugin.yaml")["spec"]["selector"]["matchLabels"],
        gateway
    );
    let ext = config_patch(&filter, "EXTENSION_CONFIG")["patch"]["value"].clone();
    let http = config_patch(&filter, "HTTP_FILTER");
    assert_eq!(http["patch"]["operation"], "INSERT_BEFORE");
    let sub = &http["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"];
    assert_eq!(
        sub, "envoy.filters.http.router",
        "ACE runs last before the router"
    );
    let http = &http["patch"]["value"];
    assert_eq!(http["name"], ext["name"], "ECDS asks for the added config");
    let types = &http["config_discovery"]["type_urls"];
    let wanted = ext["typed_config"]["@type"].as_str().map(|t| {
        format!(
            "type.googleapis.com/{}",
            t.trim_start_matches("type.googleapis.com/")
        )
    });
    assert!(
        types
            .as_array()
            .is_some_and(|t| t.iter().any(|u| u.as_str() == wanted.as_deref())),
        "config_discovery.type_urls {types} include the extension's type"
    );
    let wasm_config = &ext["typed_config"]["config"];
    assert_eq!(wasm_config["failure_policy"], "FAIL_CLOSED");
    assert_eq!(wasm_config["allow_on_headers_stop_iteration"], true);

    // What ECDS delivers, with the module where this machine has it.
    let mut ext = ext;
    let code = &mut ext["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"];
    assert!(code.is_string(), "the module is a local file: {code}");
    *code = json!(module.to_string_lossy());
    let text = validate(&ext, &patched_route());
    assert!(
        text.contains("configured 2 destinations"),
        "the plugin accepted the EnvoyFilter's configuration:\n{text}"
    );
}

/// Validate a `WasmPlugin` the way Istio would deliver it: its
/// `pluginConfig` as a JSON string in the Wasm filter's configuration.
fn validate_wasmplugin(plugin: &Value) -> String {
    let module = ace_filter_wasm();
    let spec = &plugin["spec"];
    assert_eq!(spec["failStrategy"], "FAIL_CLOSE");
    assert!(
        spec["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("oci://")),
        "{}",
        spec["url"]
    );
    let config = spec["pluginConfig"].to_string();
    let ext = json!({
        "name": "ace",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "root_id": "ace",
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": module.to_string_lossy()}}
                },
                "failure_policy": "FAIL_CLOSED",
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": config
                }
            }
        }
    });
    validate(&ext, &patched_route())
}

#[test]
fn wasmplugin_config_is_accepted_as_istio_passes_it() {
    require_envoy();
    let text = validate_wasmplugin(&manifest("wasmplugin.yaml"));
    assert!(
        text.contains("configured 2 destinations"),
        "the plugin accepted the WasmPlugin's pluginConfig:\n{text}"
    );
}

/// envoy/README.md: `ace plugin-config` output goes under `pluginConfig:`
/// unchanged. Pasted into the shipped manifest's text in place of its own
/// `pluginConfig` block, the example fleet with its Cedar tables loads.
#[test]
fn ace_plugin_config_pastes_into_the_wasmplugin_as_is() {
    require_envoy();
    let dir = ace_harness::workspace_root().join("policies");
    let config = ace_cli::plugin::build(&dir, false, false).unwrap_or_else(|e| panic!("{e:#}"));
    let path = ace_harness::workspace_root().join("envoy/istio/wasmplugin.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let at = text
        .find("  pluginConfig:")
        .unwrap_or_else(|| panic!("wasmplugin.yaml has no pluginConfig block"));
    let pasted = format!(
        "{}  pluginConfig: {}\n",
        &text[..at],
        serde_json::to_string_pretty(&config).unwrap_or_default()
    );
    let plugin: Value = serde_yaml_ng::from_str(&pasted).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin["spec"]["pluginConfig"], config);
    let text = validate_wasmplugin(&plugin);
    assert!(
        text.contains("configured 12 destinations"),
        "the plugin accepted the example fleet's configuration:\n{text}"
    );
}

/// The `EnvoyFilter` path run for real, as an Istio gateway would: the
/// filter arrives through ECDS (here from a file instead of istiod's ADS,
/// the rest of the HTTP_FILTER patch as shipped), the route is route.yaml's
/// patch, and the clusters carry Istio's names. Requests reach the cheapest
/// destination's cluster by the header ACE wrote.
#[test]
fn envoyfilter_gateway_serves_through_ecds_by_the_route_patch() {
    require_envoy();
    let module = ace_filter_wasm();
    let filter = manifest("envoyfilter.yaml");
    let mut ext = config_patch(&filter, "EXTENSION_CONFIG")["patch"]["value"].clone();
    ext["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
        json!(module.to_string_lossy());
    let mut http = config_patch(&filter, "HTTP_FILTER")["patch"]["value"].clone();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ecds = dir.path().join("ace-ecds.json");
    ace_harness::envoy::publish_ecds(&ecds, &ext["name"], &ext["typed_config"], 1)
        .unwrap_or_else(|e| panic!("{e}"));
    http["config_discovery"]["config_source"] = ace_harness::envoy::ecds_config_source(&ecds);

    let config = plugin_config(&ext);
    let cluster = |name: &str| -> String {
        config["destinations"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["name"] == name))
            .and_then(|d| d["cluster"].as_str())
            .unwrap_or_else(|| panic!("no destination {name} in {config}"))
            .to_string()
    };
    let (owned_cluster, payg_cluster) = (cluster("owned-h100-eu"), cluster("payg-api-us"));
    assert!(owned_cluster.starts_with("outbound|"), "{owned_cluster}");
    let (owned, payg) = (upstream("owned"), upstream("payg"));
    let envoy = start(
        &EnvoyBuilder::new()
            .node(
                "router~10.0.0.1~ingressgateway.istio-system~istio-system.svc.cluster.local",
                "istio-ingressgateway",
            )
            .http_filter(http)
            .route(patched_route())
            .cluster(&owned_cluster, owned.port())
            .cluster(&payg_cluster, payg.port()),
    );
    for i in 0..3 {
        let resp = Request::post_json(
            "/v1/chat/completions",
            &json!({"model": "llama-3.1-8b", "max_tokens": 16, "n": i}),
        )
        .send(envoy.port())
        .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(resp.status, 200, "request {i}: {}", resp.text());
    }
    assert_eq!(owned.count(), 3, "the owned GPUs are cheapest");
    assert_eq!(payg.count(), 0);
    for r in owned.requests() {
        let dest = r.headers.iter().find(|(k, _)| k == "x-ace-destination");
        assert_eq!(dest.map(|(_, v)| v.as_str()), Some(owned_cluster.as_str()));
    }
}

/// `providers.yaml`'s documents, its secret paths moved under `secrets`.
fn provider_manifests(secrets: &std::path::Path) -> Vec<Value> {
    let path = ace_harness::workspace_root().join("envoy/istio/providers.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = text.replace("/etc/ace/secrets", &secrets.to_string_lossy());
    text.split("\n---\n")
        .map(|d| serde_yaml_ng::from_str(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// Each provider's cluster as Istio would make it from `providers.yaml`
/// (the `ServiceEntry`'s host on 443, the `DestinationRule`'s TLS with its
/// SNI, the `EnvoyFilter`'s MERGE of the credential injector) is accepted
/// by Envoy 1.40 with its secret files, and every patch has its service
/// and TLS.
#[test]
fn provider_manifests_give_each_cluster_tls_and_its_own_key() {
    require_envoy();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let docs = provider_manifests(dir.path());
    let of_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let filter = of_kind("EnvoyFilter");
    assert_eq!(filter.len(), 1);
    let patches = filter[0]["spec"]["configPatches"]
        .as_array()
        .unwrap_or_else(|| panic!("no configPatches"));
    let mut clusters = Vec::new();
    let mut headers = Vec::new();
    for p in patches {
        assert_eq!(p["applyTo"], "CLUSTER");
        let service = p["match"]["cluster"]["service"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(p["match"]["cluster"]["portNumber"], 443, "{service}");
        assert!(
            of_kind("ServiceEntry")
                .iter()
                .any(|s| s["spec"]["hosts"][0] == service && s["spec"]["ports"][0]["number"] == 443),
            "no ServiceEntry for {service}"
        );
        let tls = of_kind("DestinationRule")
            .into_iter()
            .find(|d| d["spec"]["host"] == service)
            .map(|d| d["spec"]["trafficPolicy"]["tls"].clone())
            .unwrap_or_else(|| panic!("no DestinationRule for {service}"));
        assert_eq!(
            (tls["mode"].as_str(), tls["sni"].as_str()),
            (Some("SIMPLE"), Some(service))
        );
        let options = &p["patch"]["value"]["typed_extension_protocol_options"];
        let generic = &options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["http_filters"][0]["typed_config"]["credential"]["typed_config"];
        headers.push(generic["header"].as_str().unwrap_or_default().to_string());
        let secret = generic["credential"]["name"].as_str().unwrap_or_default();
        let key = dir.path().join(format!("{secret}.txt"));
        std::fs::write(&key, "sk-test\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.path().join(format!("{secret}.yaml")),
            json!({"resources": [{
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
                "name": secret, "generic_secret": {"secret": {"filename": key}}}]})
            .to_string(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let name = format!("outbound|443||{service}");
        clusters.push(json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]},
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": service,
                "common_tls_context": {"validation_context": {
                    "trusted_ca": {"filename": "/etc/ssl/certs/ca-certificates.crt"}}}}},
            "typed_extension_protocol_options": options
        }));
    }
    assert_eq!(headers, ["authorization", "api-key", "authorization"]);
    let bootstrap = json!({"node": {"id": "gateway", "cluster": "gateway"},
                           "static_resources": {"clusters": clusters}});
    let path = dir.path().join("gateway.json");
    std::fs::write(&path, bootstrap.to_string()).unwrap_or_else(|e| panic!("{e}"));
    envoy_validate(&path);
}
