//! Shared by the test binaries: build each guest once per binary.
#![allow(dead_code)]

use ace_wasm_host::FilterModule;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Builds a workspace cdylib for wasm32-wasip1 with `scripts/build-wasm.sh`
/// (once per test binary) and returns the `.wasm` path.
pub fn wasm_path(package: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(package) {
        return p.clone();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/build-wasm.sh"))
        .arg(package)
        .current_dir(&root)
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/build-wasm.sh: {e}"));
    assert!(
        out.status.success(),
        "building {package} for wasm32-wasip1 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    built.insert(package.to_string(), path.clone());
    path
}

/// The compiled module for a workspace package (compiled once per binary).
pub fn module(package: &str) -> FilterModule {
    static MODULES: OnceLock<Mutex<HashMap<String, FilterModule>>> = OnceLock::new();
    let modules = MODULES.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(m) = modules
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(package)
    {
        return m.clone();
    }
    let path = wasm_path(package);
    let m = FilterModule::from_file(&path)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    modules
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(package.to_string(), m.clone());
    m
}

/// Configurations for `ace-filter`, newest format first: the filter's
/// configuration schema is evolving, and the tests only need two
/// destinations where `gpu-b` (cluster `cluster_b`) is clearly cheaper.
const ACE_CONFIGS: &[&str] = &[
    r#"{"allow_no_policy":true,"response_headers":true,"destinations":[
        {"name":"gpu-a","cluster":"cluster_a","tier":"payg","usd_per_input_token":9e-6,"usd_per_output_token":9e-6},
        {"name":"gpu-b","cluster":"cluster_b","tier":"payg","usd_per_input_token":2e-6,"usd_per_output_token":2e-6}]}"#,
    r#"{"allow_no_policy":true,"response_headers":true,"destinations":[
        {"name":"gpu-a","cluster":"cluster_a","price_usd":0.9},
        {"name":"gpu-b","cluster":"cluster_b","price_usd":0.2}]}"#,
];

/// A configuration the built `ace-filter` accepts (probed on the host).
pub fn ace_config() -> &'static str {
    static CHOSEN: OnceLock<&'static str> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let m = module("ace-filter");
        ACE_CONFIGS
            .iter()
            .copied()
            .find(|c| {
                ace_wasm_host::Vm::builder(&m)
                    .configuration(*c)
                    .start()
                    .is_ok()
            })
            .unwrap_or_else(|| panic!("ace-filter accepts none of the test configurations"))
    })
}

/// What the hand-written WAT guests share: two pages of memory, the ABI
/// marker and a bump allocator from 64 KiB up (they never free). A guest
/// puts the line `;; ABI_AND_ALLOCATOR` where this belongs.
const ABI_AND_ALLOCATOR: &str = r#"
    (memory (export "memory") 2)
    (global $heap (mut i32) (i32.const 65536))
    (func (export "proxy_abi_version_0_2_1"))
    (func (export "proxy_on_memory_allocate") (param i32) (result i32) (local $p i32)
        (local.set $p (global.get $heap))
        (global.set $heap (i32.add (global.get $heap) (local.get 0)))
        (local.get $p))"#;

/// A WAT guest with the shared prelude spliced in.
pub fn wat_guest(text: &str) -> String {
    text.replace(";; ABI_AND_ALLOCATOR", ABI_AND_ALLOCATOR)
}

/// The example fleet's plugin configuration (`policies/`: twelve
/// destinations, compiled Cedar tables), as `ace plugin-config policies`
/// prints it (`--read-body` when `read_body`): the same library call the
/// command makes ([`ace_policy::plugin::plugin_config`]), without linking
/// the command.
pub fn example_fleet_config(read_body: bool) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let fail = |e: &dyn std::fmt::Display| -> ! {
        panic!("plugin configuration of {}: {e}", dir.display())
    };
    let project = ace_policy::load_dir(&dir).unwrap_or_else(|e| fail(&e));
    let compiled = ace_policy::compile(&project).unwrap_or_else(|e| fail(&e));
    let config = ace_policy::plugin::plugin_config(&project, &compiled, false, read_body)
        .unwrap_or_else(|e| fail(&e));
    serde_json::to_value(config)
        .unwrap_or_else(|e| fail(&e))
        .to_string()
}
