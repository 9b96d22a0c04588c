//! Shared helpers for ACE's real-Envoy integration tests (in `tests/tests/`).
//!
//! Every test here needs a real Envoy and fails, never skips, when it is
//! missing: the error names Envoy and `make setup`.

use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::Upstream;
use std::path::PathBuf;

/// Build the ACE filter for wasm32-wasip1 (once per test binary) or fail the test.
pub fn ace_filter_wasm() -> PathBuf {
    match ace_harness::wasm::build("ace-filter") {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Start Envoy from `builder` or fail the test with Envoy's log.
pub fn start(builder: &EnvoyBuilder) -> Envoy {
    match builder.start() {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

/// Start one upstream or fail the test.
pub fn upstream(name: &str) -> Upstream {
    match Upstream::start(name) {
        Ok(u) => u,
        Err(e) => panic!("cannot start upstream {name}: {e}"),
    }
}

/// Fail the test early, with the setup hint, when Envoy is missing. Call it
/// before anything slow so the message comes first.
pub fn require_envoy() {
    if let Err(e) = ace_harness::envoy::find_envoy() {
        panic!("{e}");
    }
}

/// Run `envoy --mode validate` on the bootstrap at `path` (Envoy also
/// starts Wasm plugins in this mode) and return its output, or fail the
/// test with that output when Envoy refuses the configuration.
pub fn envoy_validate(path: &std::path::Path) -> String {
    let envoy = ace_harness::envoy::find_envoy().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run envoy: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("OK"),
        "envoy --mode validate refused {}:\n{text}",
        path.display()
    );
    text
}
