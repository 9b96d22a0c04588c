//! Build workspace cdylibs as native shared libraries (Envoy dynamic
//! modules), once per process.
//!
//! They build into their own target directory (`target/dylib`), so a test
//! running under `cargo test` never waits on the lock of the build that
//! started it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Each package built so far, with its result.
type Builds = Vec<(String, Result<PathBuf, String>)>;

static BUILT: OnceLock<Mutex<Builds>> = OnceLock::new();

/// Build `package` (a workspace cdylib built for this machine) in
/// release mode and return the path of its `lib<name>.so`.
pub fn build(package: &str) -> Result<PathBuf, String> {
    let cache = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = guard.iter().find(|(p, _)| p == package) {
        return r.clone();
    }
    let r = build_uncached(package);
    guard.push((package.to_string(), r.clone()));
    r
}

fn build_uncached(package: &str) -> Result<PathBuf, String> {
    let root = crate::workspace_root();
    let target = root.join("target/dylib");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--release", "-q", "-p", package, "--target-dir"])
        .arg(&target)
        .current_dir(&root)
        .output()
        .map_err(|e| format!("cannot run {cargo} to build {package}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building {package} as a shared library failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let lib = target
        .join("release")
        .join(format!("lib{}.so", package.replace('-', "_")));
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(format!(
            "expected {} after building {package}",
            lib.display()
        ))
    }
}

/// Point `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`, in this process (and so in
/// every Envoy started from it afterwards), at `lib`'s directory, where
/// Envoy then finds it by name.
pub fn use_search_path(lib: &std::path::Path) {
    if let Some(dir) = lib.parent() {
        std::env::set_var("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir);
    }
}

/// The HTTP filter entry that loads the module at `lib` (as [`build`]
/// returned it) as Envoy filter `filter_name`, handing it `config` (a
/// string, as `filter_config`'s `StringValue`) when given.
///
/// Envoy finds a module by name, as `lib<name>.so` on
/// `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`; this sets it ([`use_search_path`]).
pub fn http_filter_json(
    lib: &std::path::Path,
    filter_name: &str,
    config: Option<&str>,
) -> serde_json::Value {
    use_search_path(lib);
    let name = module_name(lib);
    let mut filter = serde_json::json!({
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"name": name},
            "filter_name": filter_name
        }
    });
    if let Some(config) = config {
        filter["typed_config"]["filter_config"] = serde_json::json!({
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": config
        });
    }
    filter
}

/// The bootstrap extension entry (for
/// [`EnvoyBuilder::bootstrap_extension`](crate::envoy::EnvoyBuilder::bootstrap_extension))
/// that loads the module at `lib` (as [`build`] returned it) as
/// `envoy.bootstrap.dynamic_modules` extension `extension_name`, handing
/// it `config` (a string, as `extension_config`'s `StringValue`). Sets
/// the search path, as [`http_filter_json`] does.
pub fn bootstrap_extension_json(
    lib: &std::path::Path,
    extension_name: &str,
    config: &str,
) -> serde_json::Value {
    use_search_path(lib);
    let name = module_name(lib);
    serde_json::json!({
        "name": "envoy.bootstrap.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.bootstrap.dynamic_modules.v3.DynamicModuleBootstrapExtension",
            "dynamic_module_config": {"name": name},
            "extension_name": extension_name,
            "extension_config": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": config
            }
        }
    })
}

/// ACE's control poller: `lib` (`ace-dynamic`) as the bootstrap extension
/// `ace_control`, polling as `control` (the plugin configuration's
/// `control` object) says.
pub fn control_poller_json(
    lib: &std::path::Path,
    control: &serde_json::Value,
) -> serde_json::Value {
    let config = serde_json::json!({ "control": control }).to_string();
    bootstrap_extension_json(lib, "ace_control", &config)
}

/// The name Envoy finds `lib` by (`libNAME.so`: `NAME`).
fn module_name(lib: &std::path::Path) -> &str {
    lib.file_stem()
        .and_then(|s| s.to_str())
        .map(|s| s.trim_start_matches("lib"))
        .unwrap_or_default()
}
