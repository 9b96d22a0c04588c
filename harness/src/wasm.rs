//! Build workspace cdylibs for `wasm32-wasip1`, once per process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

static BUILT: OnceLock<Mutex<HashMap<String, Result<PathBuf, String>>>> = OnceLock::new();

/// Build `package` (a workspace cdylib, e.g. `ace-filter`) for
/// `wasm32-wasip1` with `scripts/build-wasm.sh`, and return the `.wasm` path.
///
/// The result (success or failure) is cached for the life of the process, so
/// every test in one binary shares one build. Cargo's own lock serialises
/// builds from several test binaries.
pub fn build(package: &str) -> Result<PathBuf, String> {
    let cache = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = guard.get(package) {
        return r.clone();
    }
    let r = build_uncached(package);
    guard.insert(package.to_string(), r.clone());
    r
}

fn build_uncached(package: &str) -> Result<PathBuf, String> {
    let script = crate::workspace_root().join("scripts/build-wasm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(package)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "building {package} for wasm32-wasip1 failed ({}); run `make setup` if the toolchain is missing.\n{stderr}",
            out.status
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout.lines().last().unwrap_or("").trim();
    if path.is_empty() {
        return Err(format!(
            "{} printed no artifact path.\n{stderr}",
            script.display()
        ));
    }
    Ok(PathBuf::from(path))
}
