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
