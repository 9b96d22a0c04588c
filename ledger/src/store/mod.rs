//! Where booked events live: SQLite on one machine, PostgreSQL for a mesh
//! of Envoys feeding one ledger ("where users outgrow one machine, use an
//! existing engine").
//!
//! Both hold the same tables, created by the same SQL ([`schema_sql`]), and
//! answer the same few questions; everything a report computes is computed
//! in Rust from [`Store::scan`], so the two stores cannot give different
//! reports for the same events. Idempotence is the primary key: an event id
//! already stored is skipped (`ON CONFLICT DO NOTHING`).

mod postgres;
mod sqlite;

use crate::row::{Row, COLUMNS};
use anyhow::{bail, Context};

/// The version of the store's tables; a store written by another version
/// is refused rather than misread.
pub const STORE_SCHEMA: &str = "ace.ledger/1";

/// A malformed line, kept so that a report can say what was not booked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reject {
    /// The file (or `-` for standard input).
    pub source: String,
    /// 1-based line number.
    pub line: i64,
    /// What was wrong.
    pub error: String,
}

/// What the ledger needs from a store.
pub trait Store: Send {
    /// Register configuration `json` under `id` (idempotent).
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()>;
    /// Every registered configuration.
    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>>;
    /// Insert rows, skipping ids already stored, in one transaction;
    /// returns how many were new.
    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<u64>;
    /// Record malformed lines (idempotent per source and line).
    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()>;
    /// Every recorded malformed line.
    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>>;
    /// Every row, by time then event id.
    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()>;
}

/// Open the store at `url`: `postgres://...` (or `postgresql://...`), or a
/// SQLite file path (created if missing).
pub fn open(url: &str) -> anyhow::Result<Box<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Box::new(postgres::Postgres::open(url)?))
    } else {
        Ok(Box::new(sqlite::Sqlite::open(std::path::Path::new(url))?))
    }
}

/// The statements that create the tables (idempotent), in order.
pub fn schema_sql() -> Vec<String> {
    let cols: Vec<String> = COLUMNS.iter().map(|(n, t)| format!("{n} {t}")).collect();
    vec![
        "CREATE TABLE IF NOT EXISTS ace_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)".into(),
        "CREATE TABLE IF NOT EXISTS ace_configs (id TEXT PRIMARY KEY, json TEXT NOT NULL)".into(),
        "CREATE TABLE IF NOT EXISTS ace_rejects (source TEXT NOT NULL, line BIGINT NOT NULL, \
         error TEXT NOT NULL, PRIMARY KEY (source, line))"
            .into(),
        format!(
            "CREATE TABLE IF NOT EXISTS ace_events ({})",
            cols.join(", ")
        ),
        "CREATE INDEX IF NOT EXISTS ace_events_time ON ace_events (time_ms, event_id)".into(),
        format!(
            "INSERT INTO ace_meta (key, value) VALUES ('schema', '{STORE_SCHEMA}') \
             ON CONFLICT (key) DO NOTHING"
        ),
    ]
}

/// Refuse a store whose tables another version wrote.
pub fn check_schema(found: Option<String>, url: &str) -> anyhow::Result<()> {
    match found.as_deref() {
        Some(STORE_SCHEMA) => Ok(()),
        Some(other) => bail!(
            "the ledger store {url} holds schema {other:?} but this `ace` reads {STORE_SCHEMA:?}; \
             use the `ace` release that wrote it, or ingest the access logs into a new store"
        ),
        None => bail!(
            "the ledger store {url} has no schema version; it was not created by `ace ledger`"
        ),
    }
}

/// `INSERT` of one row, skipping a stored id (`$n` placeholders, read by
/// both engines).
pub fn insert_sql() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    let marks: Vec<String> = (1..=COLUMNS.len()).map(|i| format!("${i}")).collect();
    format!(
        "INSERT INTO ace_events ({}) VALUES ({}) ON CONFLICT (event_id) DO NOTHING",
        names.join(", "),
        marks.join(", ")
    )
}

/// `SELECT` of every row, in scan order.
pub fn scan_sql() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    format!(
        "SELECT {} FROM ace_events ORDER BY time_ms, event_id",
        names.join(", ")
    )
}

/// The statements shared by both engines for configurations and rejects.
pub const PUT_CONFIG: &str =
    "INSERT INTO ace_configs (id, json) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING";
/// See [`PUT_CONFIG`].
pub const GET_CONFIGS: &str = "SELECT id, json FROM ace_configs ORDER BY id";
/// See [`PUT_CONFIG`].
pub const PUT_REJECT: &str = "INSERT INTO ace_rejects (source, line, error) VALUES ($1, $2, $3) \
     ON CONFLICT (source, line) DO NOTHING";
/// See [`PUT_CONFIG`].
pub const GET_REJECTS: &str = "SELECT source, line, error FROM ace_rejects ORDER BY source, line";
/// See [`PUT_CONFIG`].
pub const GET_SCHEMA: &str = "SELECT value FROM ace_meta WHERE key = 'schema'";

fn context(what: &str, url: &str) -> String {
    format!("{what} in the ledger store {url}")
}

/// Attach the store and the action to an error.
pub fn at<T, E: std::error::Error + Send + Sync + 'static>(
    r: Result<T, E>,
    what: &str,
    url: &str,
) -> anyhow::Result<T> {
    r.with_context(|| context(what, url))
}
