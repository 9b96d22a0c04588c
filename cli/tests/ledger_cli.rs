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

/// Ingest `access.log` with its configuration `plugin-config.json`.
const INGEST: [&str; 5] = [
    "ledger",
    "ingest",
    "--config",
    "plugin-config.json",
    "access.log",
];

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

    let (ok, out, err) = ace(d, &INGEST);
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

/// `ace ledger import-bill` and the report's reconciliation, text and
/// JSON: OpenAI's documented usage and costs answers
/// (`ledger/tests/golden/bills/`, cited in its README) with a price
/// changed (day 1), a cached-token count halved (day 2) and a tier
/// downgraded (day 3), against the requests they charge for (five a day,
/// 1,000 input tokens with 400 cached and 500 output): each difference
/// printed with its cause, the price change as a proposal never applied.
/// Importing again adds nothing; a bad row is named and fails the command
/// after the rest is imported.
#[test]
fn import_bill_and_the_report_shows_the_reconciliation() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let bills = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ledger/tests/golden/bills");
    let config = std::fs::read(bills.join("config.json")).expect("config");
    std::fs::write(d.join("plugin-config.json"), &config).expect("write");
    let id = config_id(&config);
    let mut log = String::new();
    for n in 0..15u32 {
        let mut e: serde_json::Value =
            serde_json::from_str(&event(n + 1, &id, "openai", "payg")).expect("event");
        e["time_ms"] = (1_730_419_200_000u64 + u64::from(n / 5) * 86_400_000).into();
        e["model_requested"] = "gpt-4o".into();
        e["model_served"] = "gpt-4o".into();
        e["tokens_in"] = 200.into();
        e["tokens_cache_read"] = 80.into();
        e["tokens_cache_write"] = 20.into();
        e["tokens_out"] = 100.into();
        log += &format!("{e}\n");
    }
    std::fs::write(d.join("access.log"), log).expect("write");
    let (ok, _, err) = ace(d, &INGEST);
    assert!(ok, "{err}");
    let usage = bills.join("openai-usage.changed.json");
    let costs = bills.join("openai-costs.changed.json");
    let files = [usage.to_str().expect("utf8"), costs.to_str().expect("utf8")];
    let (ok, out, err) = ace(d, &["ledger", "import-bill", files[0], files[1]]);
    assert!(ok, "{err}");
    assert!(
        out.contains("(openai-usage): 3 lines, 3 imported, 0 already in the ledger")
            && out.contains("(openai-costs): 3 lines, 3 imported, 0 already in the ledger"),
        "{out}"
    );
    let (ok, out, _) = ace(d, &["ledger", "import-bill", files[0], files[1]]);
    assert!(
        ok && out.matches("0 imported, 3 already").count() == 2,
        "{out}"
    );

    let (ok, out, err) = ace(d, &["ledger", "report"]);
    assert!(ok, "{err}");
    for says in [
        "books against the bill: 6 bill lines, 0 rows not imported, 6 comparisons, 4 differing",
        "openai 2024-11-01 *: billed $0.007700000 booked $0.007000000",
        "cost [price]: billed $0.007700000, booked $0.007000000: the tokens agree, the money does not",
        "proposed (not applied): destination openai usd_per_input_token: 2.5e-6 -> 2.75e-6",
        "tokens_cached [cached tokens]: the bill counts 200 cached input tokens, the log 400",
        "tier [tier]: billed at tier flex",
    ] {
        assert!(out.contains(says), "`{says}` in:\n{out}");
    }
    let (ok, out, err) = ace(d, &["ledger", "report", "--format", "json"]);
    assert!(ok, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("json");
    let b = &r["bills"];
    assert_eq!(
        (&b["bill_lines"], &b["differing"]),
        (&6.into(), &4.into()),
        "{b:#}"
    );
    let causes: Vec<(String, String, String)> = b["comparisons"]
        .as_array()
        .expect("comparisons")
        .iter()
        .flat_map(|c| {
            c["differences"].as_array().into_iter().flatten().map(|d| {
                let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
                (s(&c["day"]), s(&d["measure"]), s(&d["cause"]))
            })
        })
        .collect();
    for want in [
        ("2024-11-01", "cost", "price"),
        ("2024-11-02", "tokens_cached", "cached_tokens"),
        ("2024-11-03", "tier", "tier"),
    ] {
        let want = (want.0.into(), want.1.into(), want.2.into());
        assert!(causes.contains(&want), "{want:?} in {causes:?}");
    }
    assert_eq!(
        b["comparisons"][0]["proposals"][0]["proposed"], 2.75e-6,
        "{b:#}"
    );

    let (ok, html, err) = ace(d, &["ledger", "report", "--format", "html"]);
    assert!(ok, "{err}");
    assert!(
        html.contains("<table id=\"bills\">") && html.contains("<td>cached tokens</td>"),
        "the page's reconciliation (drawn in Chromium by ace-ledger's html_chromium test)"
    );

    // A row that cannot be read: named, the rest imported, exit 1.
    let bad = std::fs::read_to_string(&usage).expect("usage").replacen(
        "\"output_tokens\": 500",
        "\"output_tokens\": -5",
        1,
    );
    std::fs::write(d.join("bad.json"), bad).expect("write");
    let (ok, out, err) = ace(d, &["ledger", "import-bill", "bad.json"]);
    assert!(!ok);
    assert!(
        out.contains("bad.json:1: `data[0].results[0].output_tokens`: -5 is not a count"),
        "{out}"
    );
    assert!(
        err.contains("1 bill rows not imported (named above)"),
        "{err}"
    );
}
