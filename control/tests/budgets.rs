//! Tenant budgets read from a real ledger store: `ace control serve` with
//! `--ledger-store` on a SQLite ledger the test books events into (with a
//! plugin configuration compiled from the test's own manifest, budgets
//! and all), checked on decoded snapshots and the service's /metrics.

use ace_control::{Config, Running, Spend};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::spend::Reader;
use ace_snapshot::{Budget, BudgetState, Snapshot};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{metrics, now_ms, snapshot_and_etag, wait_for, TOKEN};

/// The ledger's store as the service's spend, as `ace control serve
/// --ledger-store` hands it over (`ace_cli::spend`).
struct Books(Reader);

impl Spend for Books {
    fn shown(&self) -> &str {
        self.0.shown()
    }
    fn readings(
        &mut self,
        budgets: &ace_config::Budgets,
        now_ms: u64,
    ) -> Result<Vec<Budget>, String> {
        self.0.read(budgets, now_ms)
    }
    fn fresh(&self) -> Box<dyn Spend> {
        Box::new(Books(self.0.fresh()))
    }
}

const SCHEMA: &str = "namespace Ace {\n  entity Tenant;\n  entity Destination;\n  \
                      action dispatch appliesTo { principal: [Tenant], resource: [Destination], \
                      context: {} };\n}\n";

const POLICY: &str = "@id(\"all\")\npermit (principal, action == Ace::Action::\"dispatch\", \
                      resource);\n";

/// Two tenants on one pay-as-you-go API at $1 per million tokens in and
/// out; `lab` is t1's over a rolling minute, `team` is t2's per day, and
/// `tokens` (a token limit alone) has no spend to read.
const FLEET: &str = r#"version = 1
[[tenants]]
id = "t1"
[[tenants]]
id = "t2"
[[models]]
id = "m"
vram_gb = 0
[[destinations]]
name = "api"
cluster = "api"
provider = "p"
tier = "payg"
jurisdiction = "US"
region = "r"
accelerator = "api"
vram_gb = 0
interconnect = "none"
models = ["m"]
[destinations.cost]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 1.0

[[budgets]]
name = "lab"
tenants = ["t1"]
usd = 1.0
period = "rolling"
window_s = 60

[[budgets]]
name = "team"
tenants = ["t2"]
usd = 1.0
soft_at = 0.5

[[budgets]]
name = "tokens"
tenants = ["t1"]
tokens_per_minute = 100000
"#;

/// The policy directory (schema, policy, manifest) and the plugin
/// configuration `ace plugin-config` makes of it.
fn policy_dir(dir: &Path) -> (PathBuf, Vec<u8>) {
    std::fs::write(dir.join("ace.cedarschema"), SCHEMA).unwrap();
    std::fs::write(dir.join("all.cedar"), POLICY).unwrap();
    std::fs::write(dir.join("fleet.toml"), FLEET).unwrap();
    let project = ace_policy::load_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    let compiled = ace_policy::compile(&project).unwrap_or_else(|e| panic!("{e}"));
    let config = ace_policy::plugin::plugin_config(&project, &compiled, true, false)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.budgets.len(), 3, "plugin-config copies the budgets");
    let bytes = serde_json::to_vec(&config).unwrap();
    ace_config::Config::parse(&bytes).unwrap_or_else(|e| panic!("{e}"));
    (dir.join("fleet.toml"), bytes)
}

/// One event of `tenant` at `time_ms` that books `usd` (in tokens at $1
/// per million).
fn event(n: u32, config: &str, tenant: &str, time_ms: u64, usd: f64) -> String {
    let tokens = (usd * 1e6).round() as u64;
    serde_json::json!({
        "schema": ace_ledger::event::SCHEMA_V2, "event_id": format!("{n:032x}"),
        "config": config, "request_id": format!("r-{n}"), "time_ms": time_ms,
        "tenant": tenant, "data_class": null, "latency_class": null,
        "model_requested": "m", "model_served": "m", "destination": "api", "tier": "payg",
        "tokens_in": tokens, "tokens_out": 0, "tokens_estimated": false, "status": 200,
        "latency_ms": 100, "slo_ms": null, "slo_met": null, "marginal_usd": usd,
        "counterfactual_usd": usd, "reason": "cheapest", "warm": true, "overage": false,
        "usage_capped": false, "cached": false
    })
    .to_string()
        + "\n"
}

fn budget<'a>(s: &'a Snapshot, name: &str) -> Option<&'a Budget> {
    s.budgets.iter().find(|b| b.name == name)
}

/// Polls /metrics until it holds `line` (5 s at most).
async fn wait_metric(r: &Running, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = metrics(r).await;
        if m.lines().any(|l| l == line) {
            return m;
        }
        assert!(Instant::now() < deadline, "no `{line}` in /metrics:\n{m}");
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

/// The ledger's files (the database and SQLite's write-ahead log and its
/// index, as far as they exist) moved to `to`, a gone store; `back` undoes
/// it. The log moves with the database: SQLite reads the latest pages
/// from it, so a database file alone is not the store.
fn move_store(from: &Path, to: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let name = |p: &Path| PathBuf::from(format!("{}{suffix}", p.display()));
        if name(from).exists() {
            std::fs::rename(name(from), name(to)).unwrap();
        }
    }
}

/// `ace_control_ledger_reads_total{result="error"}` now.
async fn read_errors(r: &Running) -> u64 {
    let m = metrics(r).await;
    m.lines()
        .find_map(|l| l.strip_prefix("ace_control_ledger_reads_total{result=\"error\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no read errors counted in /metrics:\n{m}"))
}

/// Waits until the service has failed `n` more reads.
async fn failed_reads(r: &Running, n: u64) {
    let from = read_errors(r).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while read_errors(r).await < from + n {
        assert!(Instant::now() < deadline, "the reads did not fail");
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

#[tokio::test]
async fn budgets_follow_the_books_and_hold_while_the_store_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let (manifest, plugin) = policy_dir(dir.path());
    let db = dir.path().join("ledger.sqlite");
    let mut c = Config::new(manifest);
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.interval = Duration::from_millis(100);
    c.token = Some(TOKEN.into());
    c.spend = Some(Box::new(Books(
        Reader::new(&db.display().to_string()).unwrap(),
    )));
    let r = ace_control::start(c).await.unwrap();

    // No ledger yet: the service runs, publishes no reading, and says so.
    wait_metric(&r, "ace_control_ledger_up 0").await;
    assert!(snapshot_and_etag(&r).await.0.budgets.is_empty());
    assert!(!db.exists(), "a missing ledger is not created");

    // The ledger appears: every budget with an amount reads 0, ok.
    let mut ledger = Ledger::open(&db.display().to_string()).unwrap();
    let id = ledger.register(&plugin, "plugin-config.json").unwrap();
    let s = wait_for(&r, 5, "the first reading", |s| s.budgets.len() == 2).await;
    for name in ["lab", "team"] {
        let b = budget(&s, name).unwrap();
        assert_eq!((b.state, b.spent_usd), (BudgetState::Ok, 0.0), "{b:?}");
        assert!(b.read_ms > 0);
    }
    assert_eq!(budget(&s, "lab").unwrap().resets_ms, 0, "a rolling window");
    assert!(budget(&s, "team").unwrap().resets_ms > now_ms());
    assert!(budget(&s, "tokens").is_none(), "a token limit alone");
    let m = wait_metric(&r, "ace_control_ledger_up 1").await;
    assert!(
        m.contains("ace_control_budget_state{budget=\"team\"} 0"),
        "{m}"
    );

    // Spend grows: soft past half of $1, exhausted at $1.
    let now = now_ms();
    let book = |ledger: &mut Ledger, lines: String| {
        let s = ledger
            .ingest_bytes("access.log", lines.as_bytes(), &Options::default())
            .unwrap();
        assert!(s.rejected.is_empty() && s.new > 0, "{s:?}");
    };
    book(&mut ledger, event(1, &id, "t2", now, 0.6));
    let s = wait_for(&r, 5, "team soft", |s| {
        budget(s, "team").is_some_and(|b| b.state == BudgetState::Soft)
    })
    .await;
    assert!((budget(&s, "team").unwrap().spent_usd - 0.6).abs() < 1e-9);
    book(&mut ledger, event(2, &id, "t2", now, 0.5));
    let s = wait_for(&r, 5, "team exhausted", |s| {
        budget(s, "team").is_some_and(|b| b.state == BudgetState::Exhausted)
    })
    .await;
    assert!((budget(&s, "team").unwrap().spent_usd - 1.1).abs() < 1e-9);
    assert_eq!(budget(&s, "lab").unwrap().state, BudgetState::Ok);
    wait_metric(&r, "ace_control_budget_state{budget=\"team\"} 2").await;
    drop(ledger);

    // The store goes away: the last good readings stay published as they
    // were, read_ms and all, so no filter sees a limit lifted.
    let aside = dir.path().join("aside.sqlite");
    move_store(&db, &aside);
    wait_metric(&r, "ace_control_ledger_up 0").await;
    let last = snapshot_and_etag(&r).await.0;
    assert_eq!(budget(&last, "team").unwrap().state, BudgetState::Exhausted);
    failed_reads(&r, 3).await;
    assert_eq!(
        snapshot_and_etag(&r).await.0.budgets,
        last.budgets,
        "held while gone"
    );
    // Something that is not a ledger in its place: the same.
    std::fs::write(&db, b"not a ledger at all, just bytes").unwrap();
    failed_reads(&r, 3).await;
    assert_eq!(
        snapshot_and_etag(&r).await.0.budgets,
        last.budgets,
        "held while unreadable"
    );
    let m = metrics(&r).await;
    assert!(m.contains("ace_control_ledger_up 0"), "{m}");
    assert!(
        m.contains("ace_control_source_errors_total{source=\"ledger\"}"),
        "{m}"
    );
    // Back: read again, with a later read_ms, still exhausted.
    std::fs::remove_file(&db).unwrap();
    move_store(&aside, &db);
    let read = budget(&last, "team").unwrap().read_ms;
    let s = wait_for(&r, 5, "a new reading", |s| {
        budget(s, "team").is_some_and(|b| b.read_ms > read)
    })
    .await;
    assert_eq!(budget(&s, "team").unwrap().state, BudgetState::Exhausted);
    wait_metric(&r, "ace_control_ledger_up 1").await;

    // A rolling window moves on: spend booked 55 s ago exhausts `lab`,
    // then ages out of its minute and `lab` reads ok again.
    let mut ledger = Ledger::open(&db.display().to_string()).unwrap();
    book(&mut ledger, event(3, &id, "t1", now_ms() - 55_000, 2.0));
    wait_for(&r, 5, "lab exhausted", |s| {
        budget(s, "lab").is_some_and(|b| b.state == BudgetState::Exhausted)
    })
    .await;
    let s = wait_for(&r, 15, "lab ok again", |s| {
        budget(s, "lab").is_some_and(|b| b.state == BudgetState::Ok && b.spent_usd == 0.0)
    })
    .await;
    assert_eq!(budget(&s, "team").unwrap().state, BudgetState::Exhausted);
    r.stop().await;
}
