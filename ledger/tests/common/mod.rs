//! Shared by the ledger's integration tests: the golden fleet and a real
//! PostgreSQL started for the test.
#![allow(dead_code)]

pub mod pg;

use ace_core::tables::{encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use ace_ledger::book::Ledger;
use ace_ledger::ingest::{Options, Summary};
use base64::Engine;

/// The golden configuration's bytes: `tests/golden/config.json` with its
/// feasibility tables (model `big` may not use `payg-a`; `small` may use
/// everything).
pub fn golden_config() -> Vec<u8> {
    let names = ["owned", "reserved", "spot", "payg-a", "payg-b"];
    let spec = TableSpec {
        destinations: names
            .iter()
            .map(|n| DestinationSpec {
                name: (*n).into(),
                cluster: n.replace('-', "_"),
            })
            .collect(),
        attributes: vec![AttributeSpec {
            name: "model".into(),
            values: vec!["big".into(), "small".into()],
        }],
        factors: vec![FactorSpec {
            kind: FactorKind::Permit,
            attributes: vec![0],
            rows: vec![0, 0b10111, 0b11111],
        }],
    };
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
    assert_eq!(
        store.migrated(),
        [
            "ALTER TABLE ace_events ADD COLUMN api TEXT",
            "ALTER TABLE ace_events ADD COLUMN upstream_model TEXT",
            "ALTER TABLE ace_events ADD COLUMN tokens_cache_read BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE ace_events ADD COLUMN tokens_cache_write BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE ace_events ADD COLUMN tokens_prefix_held BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE ace_events ADD COLUMN upstream_ms BIGINT",
            "ALTER TABLE ace_events ADD COLUMN live_usd_per_input_token BIGINT",
            "ALTER TABLE ace_events ADD COLUMN live_usd_per_output_token BIGINT",
            "ALTER TABLE ace_events ADD COLUMN live_usd_per_hour BIGINT",
            "UPDATE ace_meta SET value = 'ace.ledger/3' WHERE key = 'schema'",
        ]
    );
    let old = ledger_v2_row();
    assert_eq!(store.get(&old.event_id).expect("get"), Some(old.clone()));
    assert_eq!(
        store
            .get(&old.event_id)
            .expect("get")
            .map(|r| r.upstream_ms),
        Some(None)
    );
    let rejects = store.rejects().expect("rejects");
    assert_eq!((rejects.len(), rejects[0].line), (1, 7));
    drop(store);
    let (mut ledger, s) = golden_ledger(url);
    assert_eq!(s.new, 10, "the golden events book beside the old row");
    let mut rows = Vec::new();
    ledger
        .store
        .scan(&mut |r| {
            rows.push(r);
            Ok(())
        })
        .expect("scan");
    assert_eq!(rows.len(), 11);
    assert!(rows.contains(&old));
    assert!(
        ledger.store.migrated().is_empty(),
        "migrated once, current since"
    );
}
