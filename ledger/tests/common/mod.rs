//! Shared by the ledger's integration tests: the golden fleet, its events
//! and stores as earlier releases wrote them. (A real PostgreSQL for a
//! test is `ace_harness::pg::Pg`.)
#![allow(dead_code)]

use ace_core::tables::{encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::{Options, Summary};
use base64::Engine;

/// The golden configuration's bytes: `tests/golden/config.json` with its
/// feasibility tables (model `big` may not use `payg-a`; `small` may use
/// everything).
pub fn golden_config() -> Vec<u8> {
    config_with(&[])
}

/// The golden configuration, its tables also reading a `tenant`
/// attribute when `tenants` (in byte order, as the tables hold values)
/// names any: every destination permitted to each, none to a tenant not
/// named.
fn config_with(tenants: &[&str]) -> Vec<u8> {
    let names = ["owned", "reserved", "spot", "payg-a", "payg-b"];
    let mut spec = TableSpec {
        destinations: names
            .iter()
            .map(|n| DestinationSpec {
                name: (*n).into(),
                cluster: n.replace('-', "_"),
            })
            .collect(),
        attributes: vec![AttributeSpec::new("model", &["big", "small"])],
        factors: vec![FactorSpec {
            kind: FactorKind::Permit,
            attributes: vec![0],
            rows: vec![0, 0b10111, 0b11111],
        }],
    };
    if !tenants.is_empty() {
        spec.attributes.push(AttributeSpec {
            name: "tenant".into(),
            values: tenants.iter().map(|t| (*t).to_string()).collect(),
        });
        spec.factors.push(FactorSpec {
            kind: FactorKind::Permit,
            attributes: vec![1],
            rows: std::iter::once(0)
                .chain(tenants.iter().map(|_| 0b11111))
                .collect(),
        });
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(encode(&spec).expect("tables"));
    include_str!("../golden/config.json")
        .replace("@TABLES@", &b64)
        .into_bytes()
}

/// The golden events, naming configuration `id`.
pub fn golden_events(id: &str) -> Vec<u8> {
    include_str!("../golden/events.ndjson")
        .replace("@CONFIG@", id)
        .into_bytes()
}

/// A ledger at `url` with the golden configuration registered and the
/// golden events ingested, and what the ingest said.
pub fn golden_ledger(url: &str) -> (Ledger, Summary) {
    ledger_of(url, "events.ndjson", golden_events)
}

/// A ledger at `url` with the golden configuration registered and
/// `events(its id)` ingested as `source`, and what the ingest said.
fn ledger_of(url: &str, source: &str, events: fn(&str) -> Vec<u8>) -> (Ledger, Summary) {
    let mut ledger = Ledger::open(url).expect("open");
    let id = ledger
        .register(&golden_config(), "golden config")
        .expect("register");
    let s = ledger
        .ingest_bytes(source, &events(&id), &Options::default())
        .expect("ingest");
    (ledger, s)
}

/// A SQLite ledger file in a new temp dir (kept while the dir lives).
pub fn sqlite_url() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = dir.path().join("ledger.sqlite").display().to_string();
    (dir, url)
}

/// The hostile event file (`tests/golden/hostile.ndjson`), naming
/// configuration `id`, with `@XFF@` made the byte 0xff (not UTF-8, which
/// the fixture itself cannot hold).
pub fn hostile_events(id: &str) -> Vec<u8> {
    let text = include_str!("../golden/hostile.ndjson").replace("@CONFIG@", id);
    let mut out = Vec::with_capacity(text.len());
    for (i, part) in text.split("@XFF@").enumerate() {
        if i > 0 {
            out.push(0xff);
        }
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// The lines of the hostile file that are not booked: times out of range
/// (2, 3, 15), latencies over a day (4, 5), an unknown schema (11), an
/// unregistered configuration (12), and `-` (13, 17).
pub const HOSTILE_REJECTED: [i64; 9] = [2, 3, 4, 5, 11, 12, 13, 15, 17];

/// A ledger at `url` with the golden configuration registered and the
/// hostile events ingested, and what the ingest said.
pub fn hostile_ledger(url: &str) -> (Ledger, Summary) {
    ledger_of(url, "hostile.ndjson", hostile_events)
}

/// A store as `ace.ledger/2` wrote it: the tables `schema_sql` created at
/// commit a4dc722 (ace-ledger before the event's fields were defined in
/// one place), frozen here as SQL valid in SQLite and PostgreSQL alike,
/// with one rejected line and one booked event.
pub const LEDGER_V2_AT_A4DC722: &str = "
CREATE TABLE IF NOT EXISTS ace_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ace_configs (id TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ace_rejects (key TEXT PRIMARY KEY, source TEXT NOT NULL, \
    line BIGINT NOT NULL, error TEXT NOT NULL, event_id TEXT);
CREATE TABLE IF NOT EXISTS ace_events (event_id TEXT PRIMARY KEY, schema TEXT NOT NULL, \
    config TEXT NOT NULL, request_id TEXT, time_ms BIGINT NOT NULL, tenant TEXT, \
    data_class TEXT, latency_class TEXT, model_requested TEXT, model_served TEXT, \
    destination TEXT, tier TEXT, tokens_in BIGINT NOT NULL, tokens_out BIGINT NOT NULL, \
    tokens_estimated BOOLEAN NOT NULL, status BIGINT NOT NULL, latency_ms BIGINT NOT NULL, \
    slo_ms BIGINT, slo_met BOOLEAN, warm BOOLEAN, overage BOOLEAN NOT NULL, \
    usage_capped BOOLEAN NOT NULL, cached BOOLEAN NOT NULL, cache_false_hit BOOLEAN NOT NULL, \
    reason TEXT NOT NULL, filter_marginal_nano BIGINT, filter_counterfactual_nano BIGINT, \
    booked_nano BIGINT NOT NULL, counterfactual_nano BIGINT, served_counterfactual_nano BIGINT, \
    flags TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ace_events_time ON ace_events (time_ms, event_id);
INSERT INTO ace_meta (key, value) VALUES ('schema', 'ace.ledger/2') ON CONFLICT (key) DO NOTHING;
INSERT INTO ace_rejects VALUES ('k1', 'old.log', 7, 'not a JSON object', NULL);
INSERT INTO ace_events VALUES ('0123456789abcdef0123456789abcdef', 'ace.event/2', \
    '00000000000000ff', 'r-old', 1796342400000, 'acme', NULL, 'interactive', 'm', 'm', 'd', \
    'payg', 10, 20, FALSE, 200, 12, 100, TRUE, TRUE, FALSE, FALSE, FALSE, FALSE, 'cheapest', \
    250, 1000, 250, 1000, 1000, '');
";

/// The event [`LEDGER_V2_AT_A4DC722`] holds, as current code reads it back.
pub fn ledger_v2_row() -> ace_ledger::row::Row {
    ace_ledger::row::Row {
        event_id: "0123456789abcdef0123456789abcdef".into(),
        schema: "ace.event/2".into(),
        config: "00000000000000ff".into(),
        request_id: Some("r-old".into()),
        time_ms: 1_796_342_400_000,
        tenant: Some("acme".into()),
        latency_class: Some("interactive".into()),
        model_requested: Some("m".into()),
        model_served: Some("m".into()),
        destination: Some("d".into()),
        tier: Some("payg".into()),
        tokens_in: 10,
        tokens_out: 20,
        status: 200,
        latency_ms: 12,
        slo_ms: Some(100),
        slo_met: Some(true),
        warm: Some(true),
        reason: "cheapest".into(),
        marginal_usd: Some(250),
        counterfactual_usd: Some(1000),
        booked: 250,
        counterfactual: Some(1000),
        served_counterfactual: Some(1000),
        ..Default::default()
    }
}

/// A store [`LEDGER_V2_AT_A4DC722`] made at `url` opens with current code,
/// migrated in place (the columns added since, the version bumped), reads its
/// row back, books the golden events beside it, and reopens as it is.
pub fn check_the_v2_store_migrates(url: &str) {
    let mut store = ace_ledger::store::open(url).expect("the older store opens");
    let mut expected: Vec<String> = [
        "ALTER TABLE ace_events ADD COLUMN api TEXT",
        "ALTER TABLE ace_events ADD COLUMN upstream_model TEXT",
        "ALTER TABLE ace_events ADD COLUMN tokens_cache_read BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE ace_events ADD COLUMN tokens_cache_write BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE ace_events ADD COLUMN tokens_prefix_held BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE ace_events ADD COLUMN upstream_ms BIGINT",
        "ALTER TABLE ace_events ADD COLUMN live_usd_per_input_token BIGINT",
        "ALTER TABLE ace_events ADD COLUMN live_usd_per_output_token BIGINT",
        "ALTER TABLE ace_events ADD COLUMN live_usd_per_hour BIGINT",
        "ALTER TABLE ace_events ADD COLUMN budget TEXT",
        "ALTER TABLE ace_events ADD COLUMN budget_state TEXT",
    ]
    .map(String::from)
    .to_vec();
    expected.extend(ace_ledger::store::bill_tables_sql());
    expected.push("UPDATE ace_meta SET value = 'ace.ledger/4' WHERE key = 'schema'".into());
    assert_eq!(store.migrated(), expected);
    let old = ledger_v2_row();
    assert_eq!(store.get(&old.event_id).expect("get"), Some(old.clone()));
    assert_eq!(
        store
            .get(&old.event_id)
            .expect("get")
            .map(|r| (r.upstream_ms, r.budget, r.budget_state)),
        Some((None, None, None))
    );
    let rejects = store.rejects().expect("rejects");
    assert_eq!((rejects.len(), rejects[0].line), (1, 7));
    drop(store);
    let (mut ledger, s) = golden_ledger(url);
    assert_eq!(s.new, 10, "the golden events book beside the old row");
    let rows = all_rows(&mut ledger);
    assert_eq!(rows.len(), 11);
    assert!(rows.contains(&old));
    assert!(
        ledger.store.migrated().is_empty(),
        "migrated once, current since"
    );
}

/// Every row `ledger`'s store holds, in its order.
pub fn all_rows(ledger: &mut Ledger) -> Vec<ace_ledger::row::Row> {
    let mut rows = Vec::new();
    ledger
        .store
        .scan(&mut |r| {
            rows.push(r);
            Ok(())
        })
        .expect("scan");
    rows
}

/// The first millisecond of 2026-12-04 (UTC), the budget fixture's day.
pub const BUDGET_DAY: i64 = 1_796_342_400_000;
/// The first millisecond of December 2026 (UTC), its month.
pub const BUDGET_MONTH: i64 = 1_796_083_200_000;

/// The golden configuration, its tables reading the tenants `acme`,
/// `lab-1`, `lab-2` and `globex`, with three tenant budgets: acme's day
/// budget of $0.01 (soft at half), a month budget of $1 for the group
/// `lab-1`, `lab-2`, and a token limit for acme.
pub fn budget_config() -> Vec<u8> {
    let budgets = r#""budgets": [
    {"name": "acme-day", "tenants": ["acme"], "usd": 0.01, "soft_at": 0.5},
    {"name": "labs", "tenants": ["lab-1", "lab-2"], "usd": 1, "period": "month"},
    {"name": "acme-tpm", "tenants": ["acme"], "tokens_per_minute": 1000}
  ],
  "tables_base64""#;
    let text = String::from_utf8(config_with(&["acme", "globex", "lab-1", "lab-2"])).expect("utf8");
    assert!(text.contains("\"tables_base64\""), "the fixture changed");
    text.replacen("\"tables_base64\"", budgets, 1).into_bytes()
}

/// One event of the budget fixture, model `small`: served by `dest`
/// (`payg-a` or `owned`) for `tin` and `tout` tokens, or refused (429)
/// when `dest` is none; naming `budget` in `state`.
fn budget_event(
    id: &str,
    n: u32,
    tenant: &str,
    time_ms: i64,
    dest: Option<&str>,
    (tin, tout): (u32, u32),
    budget: Option<(&str, &str)>,
) -> String {
    let payg = f64::from(tin) * 2e-6 + f64::from(tout) * 8e-6;
    let (dest, tier, status, marginal, cf, warm) = match dest {
        Some("owned") => (
            "\"owned\"",
            "\"inhouse\"",
            200,
            f64::from(tin + tout) * 1e-8,
            payg.to_string(),
            "true",
        ),
        Some(_) => (
            "\"payg-a\"",
            "\"payg\"",
            200,
            payg,
            payg.to_string(),
            "true",
        ),
        None => ("null", "null", 429, 0.0, "null".to_string(), "null"),
    };
    let (name, state, reason) = match budget {
        Some((b, s)) => (
            serde_json::to_string(b).expect("name"),
            format!("\"{s}\""),
            if status == 429 {
                format!("budget_{s}")
            } else {
                "cheapest".into()
            },
        ),
        None => ("null".into(), "null".into(), "cheapest".into()),
    };
    format!(
        r#"{{"schema":"ace.event/2","event_id":"{n:032x}","config":"{id}","request_id":null,"time_ms":{time_ms},"tenant":"{tenant}","data_class":"public","latency_class":null,"model_requested":"small","model_served":"small","destination":{dest},"tier":{tier},"tokens_in":{tin},"tokens_out":{tout},"tokens_estimated":false,"status":{status},"latency_ms":100,"slo_ms":null,"slo_met":null,"marginal_usd":{marginal},"counterfactual_usd":{cf},"reason":"{reason}","warm":{warm},"overage":false,"usage_capped":false,"cached":false,"budget":{name},"budget_state":{state}}}"#
    )
}

/// The budget fixture's events under configuration `id`: spend before
/// and at each period's start, each way a budget limits a request, a
/// budget no configuration defines, and one whose name would drive a
/// terminal.
pub fn budget_events(id: &str) -> Vec<u8> {
    let (day, month) = (BUDGET_DAY, BUDGET_MONTH);
    let e =
        |n, tenant, t, dest, tokens, budget| budget_event(id, n, tenant, t, dest, tokens, budget);
    let lines = [
        // acme: yesterday (not in today's spend), then from today's first
        // millisecond: payg-a 1000 × 2e-6 + 500 × 8e-6 = 6_000_000 nano.
        e(1, "acme", day - 1, Some("payg-a"), (1000, 500), None),
        e(2, "acme", day, Some("payg-a"), (1000, 500), None),
        // Soft: served on the owned pool, 1500 × 1e-8 = 15_000; then
        // refused while soft, refused exhausted, over its tokens.
        e(
            3,
            "acme",
            day + 1000,
            Some("owned"),
            (1000, 500),
            Some(("acme-day", "soft")),
        ),
        e(
            4,
            "acme",
            day + 2000,
            None,
            (1000, 0),
            Some(("acme-day", "soft")),
        ),
        e(
            5,
            "acme",
            day + 3000,
            None,
            (1000, 0),
            Some(("acme-day", "exhausted")),
        ),
        e(
            6,
            "acme",
            day + 4000,
            None,
            (1000, 0),
            Some(("acme-tpm", "tokens_per_minute")),
        ),
        // The lab group: last month (not counted), this month's first
        // millisecond (6_000_000), today 2000 × 2e-6 + 1000 × 8e-6 =
        // 12_000_000.
        e(7, "lab-1", month - 1, Some("payg-a"), (1000, 500), None),
        e(8, "lab-1", month, Some("payg-a"), (1000, 500), None),
        e(9, "lab-2", day + 5000, Some("payg-a"), (2000, 1000), None),
        // Named by events only.
        e(
            10,
            "globex",
            day + 6000,
            None,
            (1000, 0),
            Some(("gone", "exhausted")),
        ),
        e(
            11,
            "globex",
            day + 6000,
            None,
            (1000, 0),
            Some(("evil\u{1b}[31m<b>", "exhausted")),
        ),
    ];
    (lines.join("\n") + "\n").into_bytes()
}

/// A ledger at `url` with [`budget_config`] registered and
/// [`budget_events`] ingested.
pub fn budget_ledger(url: &str) -> Ledger {
    let mut ledger = Ledger::open(url).expect("open");
    let id = ledger
        .register(&budget_config(), "budget config")
        .expect("register");
    let s = ledger
        .ingest_bytes("budgets.ndjson", &budget_events(&id), &Options::default())
        .expect("ingest");
    assert_eq!((s.new, s.rejected.len()), (11, 0), "{:?}", s.rejected);
    ledger
}
