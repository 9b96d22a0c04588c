//! `ace ... | head` must not panic: a reader that goes away ends the
//! output quietly, and the command still does its work.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

/// Run `ace ARGS` with stdout a pipe whose reader is already closed, so
/// every write fails with EPIPE; returns (exit code, stderr).
fn run_with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_ace"))
        .args(args)
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .expect("run ace");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn policy_compile_writes_its_files_when_nobody_reads_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("tables.acet");
    let policies = policies();
    let (code, stderr) = run_with_closed_stdout(&[
        "policy",
        "compile",
        policies.to_str().unwrap(),
        "--out",
        tables.to_str().unwrap(),
    ]);
    assert!(!stderr.contains("panicked"), "ace panicked: {stderr}");
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.is_empty(), "a closed pipe is not an error: {stderr}");
    assert!(tables.is_file(), "tables not written");
    assert!(dir.path().join("fleet.json").is_file(), "fleet not written");

    let (code, stderr) = run_with_closed_stdout(&["policy", "dump", tables.to_str().unwrap()]);
    assert!(!stderr.contains("panicked"), "ace panicked: {stderr}");
    assert_eq!(code, Some(0), "stderr: {stderr}");
}

#[test]
fn plugin_config_to_a_closed_pipe_does_not_panic() {
    let policies = policies();
    let (code, stderr) = run_with_closed_stdout(&["plugin-config", policies.to_str().unwrap()]);
    assert!(!stderr.contains("panicked"), "ace panicked: {stderr}");
    assert_eq!(code, Some(0), "stderr: {stderr}");
}
