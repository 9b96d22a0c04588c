//! Build cdylibs for `wasm32-wasip1`, once per process: the workspace's
//! own, and examples that a package published on crates.io ships (filters
//! we did not write, fetched by cargo when a test needs them, so that none
//! of their code lives in this repository).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
    once(package, || build_with(package, &[]))
}

/// The published crate whose examples [`build_proxy_wasm_example`] builds.
pub const PROXY_WASM_CRATE: (&str, &str) = ("proxy-wasm", "0.2.0");

/// Build `example` (`hello_world`, `http_auth_random`, `http_headers`,
/// `http_body` or `http_config`), one of the cdylib examples that the
/// published [`PROXY_WASM_CRATE`] package ships, for `wasm32-wasip1`, and
/// return the `.wasm` path. See [`build_registry_example`].
pub fn build_proxy_wasm_example(example: &str) -> Result<PathBuf, String> {
    let (krate, version) = PROXY_WASM_CRATE;
    build_registry_example(krate, version, example)
}

/// Build `example`, a cdylib example of the package `krate` at exactly
/// `version` from crates.io, unchanged, for `wasm32-wasip1` with the
/// recipe of our own filters (`scripts/build-wasm.sh`), and return the
/// `.wasm` path.
///
/// The package comes through cargo's registry cache ([`registry_package`]);
/// it is copied to `target/wasm/registry/` before the build, which writes
/// only there and to `target/wasm/`, never into the cache. It is built
/// with the workspace's `wasm` profile into our filters' target directory,
/// so the standard library built for them is reused.
/// Its own `Cargo.lock` pins the examples' dependencies. Its host functions
/// are undeclared imports (`extern "C"` without a wasm import module),
/// which today's `wasm-ld` resolves only with `--allow-undefined`, as
/// rustc passed it for wasm targets when such packages were published;
/// the flag goes to the example's link alone.
pub fn build_registry_example(
    krate: &str,
    version: &str,
    example: &str,
) -> Result<PathBuf, String> {
    once(&format!("{krate}@{version}:{example}"), || {
        let source = registry_package(krate, version)?;
        let scratch = crate::workspace_root().join("target/wasm/registry");
        let copy = scratch.join(format!("{krate}-{version}"));
        copy_package(&source, &copy)?;
        let manifest = copy.join("Cargo.toml");
        build_with(
            krate,
            &[
                ("ACE_WASM_MANIFEST", manifest.as_os_str()),
                ("ACE_WASM_EXAMPLE", example.as_ref()),
                (
                    "ACE_WASM_LINK_ARGS",
                    "-C link-arg=--allow-undefined".as_ref(),
                ),
            ],
        )
    })
}

/// The unpacked source directory of `krate` at exactly `version` in
/// cargo's registry cache, fetched from crates.io first if it is not
/// there: a generated manifest that depends on `krate = "=version"`, then
/// `cargo fetch` for it and `cargo metadata` to find the package.
pub fn registry_package(krate: &str, version: &str) -> Result<PathBuf, String> {
    let fail = |why: String| {
        format!(
            "cannot get the crate {krate} {version} from crates.io into cargo's registry \
             cache: {why}. Run `make setup` (it prefetches {krate} {version}) on a machine \
             that reaches the registry."
        )
    };
    let dir = crate::workspace_root()
        .join("target/wasm/registry")
        .join(format!("fetch-{krate}-{version}"));
    std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let manifest = dir.join("Cargo.toml");
    let text = format!(
        "[package]\nname = \"ace-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[lib]\npath = \"lib.rs\"\n\n[dependencies]\n\
         {krate} = \"={version}\"\n"
    );
    for (path, contents) in [(&manifest, text.as_str()), (&dir.join("lib.rs"), "")] {
        std::fs::write(path, contents).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let run = |args: &[&str]| -> Result<Vec<u8>, String> {
        let out = Command::new(&cargo)
            .args(args)
            .arg("--manifest-path")
            .arg(&manifest)
            .output()
            .map_err(|e| fail(format!("cannot run cargo: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(fail(format!(
                "`cargo {}` failed: {}",
                args[0],
                stderr.trim()
            )));
        }
        Ok(out.stdout)
    };
    run(&["fetch", "-q"])?;
    let metadata = run(&["metadata", "-q", "--offline", "--format-version", "1"])?;
    let metadata: serde_json::Value = serde_json::from_slice(&metadata)
        .map_err(|e| fail(format!("cargo metadata printed no JSON: {e}")))?;
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == krate && p["version"] == version)
        .and_then(|p| p["manifest_path"].as_str())
        .and_then(|m| Path::new(m).parent())
        .map(Path::to_path_buf)
        .ok_or_else(|| fail("cargo metadata does not list it".to_string()))
}

/// Copies the package at `from` to `to` (files and directories; a copy
/// made before is refreshed in place).
fn copy_package(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_package(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

/// `build()` caches what `f` returns under `key` for the process.
fn once(key: &str, f: impl FnOnce() -> Result<PathBuf, String>) -> Result<PathBuf, String> {
    let cache = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = guard.get(key) {
        return r.clone();
    }
    let r = f();
    guard.insert(key.to_string(), r.clone());
    r
}

fn build_with(package: &str, env: &[(&str, &std::ffi::OsStr)]) -> Result<PathBuf, String> {
    let script = crate::workspace_root().join("scripts/build-wasm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(package)
        .envs(env.iter().copied())
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
