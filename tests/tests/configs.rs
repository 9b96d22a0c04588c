//! The shipped Envoy configurations are valid for Envoy 1.40 and configure
//! the filter (built from source in this run) without error: the Wasm
//! module (`envoy.yaml`) and the dynamic module (`envoy-dynamic.yaml`).

use ace_tests::{ace_dynamic_lib, ace_filter_wasm, envoy_validate, require_envoy};

#[test]
fn shipped_envoy_yaml_validates_and_the_plugin_accepts_its_configuration() {
    require_envoy();
    let wasm = ace_filter_wasm();
    let root = ace_harness::workspace_root();
    let yaml = std::fs::read_to_string(root.join("envoy/envoy.yaml"))
        .unwrap_or_else(|e| panic!("envoy/envoy.yaml: {e}"));
    assert!(yaml.contains("/etc/ace/ace_filter.wasm"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("envoy.yaml");
    let local = yaml.replace("/etc/ace/ace_filter.wasm", &wasm.to_string_lossy());
    std::fs::write(&path, local).unwrap_or_else(|e| panic!("{e}"));
    let text = envoy_validate(&path);
    assert!(
        text.contains("configured 3 destinations"),
        "the plugin configured itself:\n{text}"
    );
}

#[test]
fn shipped_dynamic_module_yaml_validates_and_the_module_accepts_its_configuration() {
    require_envoy();
    let lib = ace_dynamic_lib();
    let root = ace_harness::workspace_root();
    let path = root.join("envoy/envoy-dynamic.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        yaml.contains("name: ace_dynamic"),
        "loads libace_dynamic.so"
    );
    // Inherited by `envoy --mode validate`.
    ace_harness::dylib::use_search_path(&lib);
    let text = envoy_validate(&path);
    assert!(
        text.contains("configured 3 destinations"),
        "the module configured itself:\n{text}"
    );
    assert!(
        text.contains("control poller: GET /v1/snapshot through cluster `ace_control`"),
        "the bootstrap extension took its configuration:\n{text}"
    );
}

#[test]
fn shipped_providers_yaml_validates_with_its_secret_files() {
    require_envoy();
    let wasm = ace_filter_wasm();
    let root = ace_harness::workspace_root();
    let yaml = std::fs::read_to_string(root.join("envoy/providers.yaml"))
        .unwrap_or_else(|e| panic!("envoy/providers.yaml: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap_or_else(|e| panic!("{e}"));
    for name in ["vllm_key", "azure_key", "openai_key", "groq_key"] {
        assert!(
            yaml.contains(&format!("/etc/ace/secrets/{name}.yaml")),
            "{name}"
        );
        let key = secrets.join(format!("{name}.txt"));
        std::fs::write(&key, format!("sk-{name}\n")).unwrap_or_else(|e| panic!("{e}"));
        let secret = format!(
            "resources:\n- \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  \
             name: {name}\n  generic_secret: {{ secret: {{ filename: {} }} }}\n",
            key.display()
        );
        std::fs::write(secrets.join(format!("{name}.yaml")), secret)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let local = yaml
        .replace("/etc/ace/ace_filter.wasm", &wasm.to_string_lossy())
        .replace("/etc/ace/secrets", &secrets.to_string_lossy());
    let path = dir.path().join("providers.yaml");
    std::fs::write(&path, local).unwrap_or_else(|e| panic!("{e}"));
    let text = envoy_validate(&path);
    assert!(
        text.contains("configured 4 destinations"),
        "the plugin configured itself:\n{text}"
    );
}
