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
