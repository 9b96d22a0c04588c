//! `ace ledger` from the command line: ingest reports malformed lines by
//! number and is idempotent, an unregistered configuration is an error that
//! says how to register it, and report, export and trace agree.

use std::path::Path;
use std::process::Command;

const CONFIG: &str = r#"{"allow_no_policy": true, "destinations": [
 {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 4,
  "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8, "slo_ms": 1000},
 {"name": "payg", "cluster": "payg", "tier": "payg", "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6}
]}"#;

fn event(n: u32, id: &str, dest: &str, tier: &str) -> String {
    serde_json::json!({
        "schema": "ace.event/2", "event_id": format!("{n:032x}"), "config": id,
        "request_id": format!("r-{n}"), "time_ms": 1_796_342_400_000u64 + u64::from(n),
        "tenant": "acme", "data_class": null, "latency_class": null,
        "model_requested": "m", "model_served": "m", "destination": dest, "tier": tier,
        "tokens_in": 1000, "tokens_out": 500, "tokens_estimated": false, "status": 200,
        "latency_ms": 10, "slo_ms": null, "slo_met": null, "marginal_usd": 0.000015,
        "counterfactual_usd": 0.006, "reason": "cheapest", "warm": true, "overage": false,
        "usage_capped": false, "cached": false
    })
    .to_string()
}

fn ace(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ace"))
        .current_dir(dir)
        .args(args)
        .env_remove("ACE_LEDGER_STORE")
        .output()
        .expect("run ace");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn ingest_report_export_and_trace() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::write(d.join("plugin-config.json"), CONFIG).expect("write");
    let id = config_id(CONFIG.as_bytes());
    let log = [
        event(1, &id, "owned", "inhouse"),
        "-".into(),
        event(2, &id, "payg", "payg"),
    ]
    .join("\n")
        + "\n";
    std::fs::write(d.join("access.log"), log).expect("write");

    let (ok, _, err) = ace(d, &["ledger", "ingest", "access.log"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("access.log:1: field `config` is \"{id}\"")),
        "{err}"
    );
    assert!(err.contains("ace ledger ingest --config"), "{err}");

    let (ok, out, err) = ace(
        d,
        &[
            "ledger",
            "ingest",
            "--config",
            "plugin-config.json",
            "access.log",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("access.log: 3 lines, 2 events booked, 0 already in the ledger, 1 malformed"),
        "{out}"
    );
    assert!(out.contains("access.log:2: not a JSON object"), "{out}");
    let (ok, out, _) = ace(d, &["ledger", "ingest", "access.log"]);
    assert!(
        ok && out.contains("0 events booked, 2 already in the ledger"),
        "{out}"
    );

    let (ok, out, err) = ace(d, &["ledger", "report", "--format", "json"]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("json");
    // owned: 1500 × 1e-8 = 15_000 nano; payg 1000 × 2e-6 + 500 × 8e-6 = 6_000_000.
    assert_eq!(r["booked"], 6_015_000);
    assert_eq!(r["counterfactual"], 12_000_000);
    assert_eq!(r["savings"]["utilisation"], 5_985_000);
    assert_eq!(r["rejected_lines"], 1);

    let (ok, out, _) = ace(d, &["ledger", "report"]);
    assert!(ok && out.contains("savings $0.005985000"), "{out}");

    let (ok, _, err) = ace(d, &["ledger", "export", "-o", "focus.csv"]);
    assert!(ok, "{err}");
    let csv = std::fs::read_to_string(d.join("focus.csv")).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    for col in [
        "BilledCost",
        "EffectiveCost",
        "ListCost",
        "ContractedCost",
        "ChargeCategory",
        "PricingCategory",
        "ChargePeriodStart",
        "ChargePeriodEnd",
        "x_AceSavingsUtilization",
    ] {
        assert!(header.contains(&col), "{col} missing");
    }
    assert_eq!(lines.count(), 2);

    let (ok, out, _) = ace(d, &["ledger", "trace", "--tier", "inhouse"]);
    assert!(ok && out.contains("r-1") && !out.contains("r-2"), "{out}");
    assert!(
        out.contains("1 requests: booked $0.000015000, savings $0.005985000"),
        "{out}"
    );
}

/// The configuration id of `bytes`: the first 16 hex digits of SHA-256,
/// computed with the system's `sha256sum`, independently of the ledger.
fn config_id(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(bytes)
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)[..16].to_string()
}

/// `ace ledger migrate` brings a store an earlier release wrote (here
/// `ace.ledger/2`, which lacked the `upstream_ms` column) to this
/// release's tables in place and says what it ran; run again, it has
/// nothing to do.
#[test]
fn migrate_upgrades_an_older_store_in_place() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("old.sqlite");
    let store = store.to_str().expect("utf8");
    let (ok, out, err) = ace(dir.path(), &["ledger", "migrate", "--store", store]);
    assert!(ok, "{err}");
    assert!(out.contains("nothing to do"), "{out}");
    rusqlite::Connection::open(store)
        .expect("sqlite")
        .execute_batch(
            "ALTER TABLE ace_events DROP COLUMN upstream_ms;
             UPDATE ace_meta SET value = 'ace.ledger/2' WHERE key = 'schema';",
        )
        .expect("made older");
    let (ok, out, err) = ace(dir.path(), &["ledger", "migrate", "--store", store]);
    assert!(ok, "{err}");
    assert!(
        out.contains("migrated to ace.ledger/4")
            && out.contains("ALTER TABLE ace_events ADD COLUMN upstream_ms BIGINT"),
        "{out}"
    );
    let (ok, out, _) = ace(dir.path(), &["ledger", "migrate", "--store", store]);
    assert!(ok && out.contains("nothing to do"), "{out}");
}
