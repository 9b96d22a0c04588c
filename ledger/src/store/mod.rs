//! Where booked events live: SQLite on one machine, PostgreSQL for a mesh
//! of Envoys feeding one ledger ("where users outgrow one machine, use an
//! existing engine").
//!
//! Both hold the same tables, created by the same SQL ([`schema_sql`]), and
//! answer the same few questions, asked once for both (module `engine`:
//! each engine only runs transactions of statements); everything a report
//! computes is computed in Rust from [`Store::scan`], so the two stores
//! cannot give different reports for the same events. Idempotence is the primary key: an event id
//! already stored is skipped (`ON CONFLICT DO NOTHING`), and the ingest
//! compares the stored row with the skipped one, so a different event
//! under a known id is booked apart and reported, never dropped (see
//! [`crate::ingest`]).
//!
//! A store written by an earlier version of these tables is migrated in
//! place when opened ([`migrate_sql`]; `ace ledger migrate --store URL`
//! does it alone and says what it did); one written by a later version
//! (an unknown version, or a column this release does not know) is
//! refused. The event columns come from the event's one definition
//! (`ace_event::event_fields!`, see [`crate::row`]): a column the store
//! lacks is added to it, so a new event field needs no migration code.

/// `impl Cols for $row`, each column read by the engine's `$row::$get`.
macro_rules! cols {
    ($row:ty, $get:ident) => {
        impl crate::kind::Cols for $row {
            fn text(&self, i: usize) -> anyhow::Result<Option<String>> {
                Ok(self.$get(i)?)
            }
            fn int(&self, i: usize) -> anyhow::Result<Option<i64>> {
                Ok(self.$get(i)?)
            }
            fn boolean(&self, i: usize) -> anyhow::Result<Option<bool>> {
                Ok(self.$get(i)?)
            }
        }
    };
}

mod engine;
mod postgres;
mod sqlite;

use crate::bill::{BadRow, BillLine, Stored};
use crate::kind::{need, Cols, Val};
use crate::money::Nano;
use crate::row::{Row, COLUMNS};
use anyhow::{bail, Context};

/// The version of the store's tables; a store written by another version
/// is migrated ([`migrate_sql`]) or refused rather than misread. Adding an
/// event column needs no new version: a store lacking it is given it, and
/// a release that does not know a column refuses the store.
pub const STORE_SCHEMA: &str = "ace.ledger/4";

/// The version whose rejected lines were keyed by source and line
/// ([`migrate_sql`] rekeys them).
pub const STORE_SCHEMA_V1: &str = "ace.ledger/1";

/// The version before event columns were added by migration (it lacks
/// `upstream_ms`).
pub const STORE_SCHEMA_V2: &str = "ace.ledger/2";

/// The version before providers' bills were stored (it lacks the tables
/// [`bill_tables_sql`] creates).
pub const STORE_SCHEMA_V3: &str = "ace.ledger/3";

/// The command that migrates a store (what a refusal names).
pub fn migrate_command(url: &str) -> String {
    format!("ace ledger migrate --store '{url}'")
}

/// A line that was not booked, kept so that a report can say what was not
/// booked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reject {
    /// What makes the record unique: a hash of the source, of the input's
    /// first line, of this line and of how many identical lines came
    /// before it in the input (see `ingest`), so a rotated log's or a
    /// second standard input's lines are kept apart while ingesting the
    /// same input again records nothing twice.
    pub key: String,
    /// The file (or `-` for standard input).
    pub source: String,
    /// 1-based line number.
    pub line: i64,
    /// What was wrong.
    pub error: String,
    /// The event's id, for an event that could not be priced yet (its
    /// configuration not registered): once an ingest books that id, the
    /// report no longer counts the line.
    pub event_id: Option<String>,
}

impl Reject {
    /// The values of [`PUT_REJECT`]'s parameters.
    pub fn values(&self) -> Vec<Val> {
        vec![
            Val::Text(Some(self.key.clone())),
            Val::Text(Some(self.source.clone())),
            Val::Int(Some(self.line)),
            Val::Text(Some(self.error.clone())),
            Val::Text(self.event_id.clone()),
        ]
    }

    /// A reject read back from the columns [`GET_REJECTS`] selects.
    pub fn read(c: &dyn Cols) -> anyhow::Result<Reject> {
        Ok(Reject {
            key: need(c.text(0)?, "key")?,
            source: need(c.text(1)?, "source")?,
            line: need(c.int(2)?, "line")?,
            error: need(c.text(3)?, "error")?,
            event_id: c.text(4)?,
        })
    }
}

/// A configuration's id and JSON read back from the columns
/// [`GET_CONFIGS`] selects.
pub fn read_config(c: &dyn Cols) -> anyhow::Result<(String, Vec<u8>)> {
    Ok((
        need(c.text(0)?, "id")?,
        need(c.text(1)?, "json")?.into_bytes(),
    ))
}

/// What the ledger needs from a store.
pub trait Store: Send {
    /// Register configuration `json` under `id` (idempotent).
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()>;
    /// Every registered configuration.
    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>>;
    /// Insert rows, skipping ids already stored, in one transaction;
    /// returns, per row, whether it was new.
    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>>;
    /// The stored row with `event_id`, if any.
    fn get(&mut self, event_id: &str) -> anyhow::Result<Option<Row>>;
    /// Record malformed lines (idempotent per [`Reject::key`]).
    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()>;
    /// Every recorded malformed line.
    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>>;
    /// Store providers' bill lines in one transaction, keyed by
    /// [`BillLine::key`]: a key not held is inserted, one held with the
    /// same figures left, one held with others replaced (a restated
    /// bill); returns, per line, which.
    ///
    /// Both stores keep bills; a store that does not (a test's stand-in)
    /// refuses them and holds none.
    fn put_bill_lines(&mut self, lines: &[BillLine]) -> anyhow::Result<Vec<Stored>> {
        bail!(
            "this store keeps no bills ({} lines not stored)",
            lines.len()
        )
    }
    /// Every stored bill line, by day, provider and key.
    fn bill_lines(&mut self) -> anyhow::Result<Vec<BillLine>> {
        Ok(Vec::new())
    }
    /// Record bill rows not imported (idempotent per [`BadRow::key`]).
    fn put_bill_rejects(&mut self, rows: &[BadRow]) -> anyhow::Result<()> {
        bail!(
            "this store keeps no bills ({} rows not recorded)",
            rows.len()
        )
    }
    /// Every recorded bill row not imported, by file and place.
    fn bill_rejects(&mut self) -> anyhow::Result<Vec<BadRow>> {
        Ok(Vec::new())
    }
    /// The statements the opening migration ran (empty when the store was
    /// current).
    fn migrated(&self) -> &[String] {
        &[]
    }
    /// Every row, by time then event id.
    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()>;
    /// Booked cost (`booked_nano`) per tenant of `tenants` over the rows
    /// at or after `since_ms` and before `until_ms`, by tenant; a tenant
    /// with no such row is left out. Summed by the store ([`spend_sql`]),
    /// since a budget reading wants one figure per tenant, not every row.
    ///
    /// Each row counts at least 0: a row with a negative cost (never
    /// booked by the ledger, only written into the store by hand or by a
    /// hostile edit) counts as nothing, so that no row can lower what the
    /// others add up to, and no reading lifts a limit that what was booked
    /// reached.
    ///
    /// Every booked row counts, served or not, and so does a row booked
    /// apart as an event id conflict ([`crate::row::CONFLICT_FLAG`]): the
    /// report counts it in its tenant's booked cost as a booking of its
    /// own, and a budget must see the same spend the report shows.
    /// Tenants are matched as the store holds them
    /// ([`crate::kind::storable`]) and bound as parameters.
    fn spend(
        &mut self,
        since_ms: u64,
        until_ms: u64,
        tenants: &[&str],
    ) -> anyhow::Result<Vec<(String, Nano)>>;
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
        META_TABLE.into(),
        "CREATE TABLE IF NOT EXISTS ace_configs (id TEXT PRIMARY KEY, json TEXT NOT NULL)".into(),
        REJECTS_TABLE.into(),
    ]
    .into_iter()
    .chain(bill_tables_sql())
    .chain([
        format!(
            "CREATE TABLE IF NOT EXISTS ace_events ({}, PRIMARY KEY (event_id))",
            cols.join(", ")
        ),
        "CREATE INDEX IF NOT EXISTS ace_events_time ON ace_events (time_ms, event_id)".into(),
        format!(
            "INSERT INTO ace_meta (key, value) VALUES ('schema', '{STORE_SCHEMA}') \
             ON CONFLICT (key) DO NOTHING"
        ),
    ])
    .collect()
}

/// The statements that create the tables of providers' bills: their
/// lines ([`crate::bill::COLUMNS`]) and the rows not imported.
pub fn bill_tables_sql() -> [String; 3] {
    let cols: Vec<String> = crate::bill::COLUMNS
        .iter()
        .map(|(n, t)| format!("{n} {t}"))
        .collect();
    [
        format!(
            "CREATE TABLE IF NOT EXISTS ace_bill_lines ({})",
            cols.join(", ")
        ),
        "CREATE INDEX IF NOT EXISTS ace_bill_lines_day ON ace_bill_lines (day, provider, key)"
            .into(),
        "CREATE TABLE IF NOT EXISTS ace_bill_rejects (key TEXT PRIMARY KEY, source TEXT NOT NULL, \
         line BIGINT NOT NULL, field TEXT NOT NULL, error TEXT NOT NULL)"
            .into(),
    ]
}

fn bill_names() -> String {
    let names: Vec<&str> = crate::bill::COLUMNS.iter().map(|c| c.0).collect();
    names.join(", ")
}

/// `INSERT` of one bill line (`$n` placeholders, read by both engines).
pub fn put_bill_line_sql() -> String {
    let marks: Vec<String> = (1..=crate::bill::COLUMNS.len())
        .map(|i| format!("${i}"))
        .collect();
    format!(
        "INSERT INTO ace_bill_lines ({}) VALUES ({})",
        bill_names(),
        marks.join(", ")
    )
}

/// `UPDATE` of the bill line keyed `$1` to the values `$2` ... (every
/// column but the key, in [`crate::bill::COLUMNS`] order).
pub fn restate_bill_line_sql() -> String {
    let sets: Vec<String> = crate::bill::COLUMNS
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, (n, _))| format!("{n} = ${}", i + 1))
        .collect();
    format!(
        "UPDATE ace_bill_lines SET {} WHERE key = $1",
        sets.join(", ")
    )
}

/// `SELECT` of the bill line keyed `$1`.
pub fn get_bill_line_sql() -> String {
    format!("SELECT {} FROM ace_bill_lines WHERE key = $1", bill_names())
}

/// `SELECT` of every bill line, in order.
pub fn bill_lines_sql() -> String {
    format!(
        "SELECT {} FROM ace_bill_lines ORDER BY day, provider, key",
        bill_names()
    )
}

/// Record a bill row not imported.
pub const PUT_BILL_REJECT: &str = "INSERT INTO ace_bill_rejects (key, source, line, field, error) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO NOTHING";
/// Every bill row not imported.
pub const GET_BILL_REJECTS: &str =
    "SELECT source, line, field, error FROM ace_bill_rejects ORDER BY source, line, key";

/// What storing `line` does, given what the store holds under its key.
pub fn bill_outcome(held: Option<&BillLine>, line: &BillLine) -> Stored {
    match held {
        None => Stored::New,
        Some(h) if h.same_as(line) => Stored::Same,
        Some(_) => Stored::Restated,
    }
}

/// The table of lines not booked.
const REJECTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS ace_rejects (key TEXT PRIMARY KEY, \
     source TEXT NOT NULL, line BIGINT NOT NULL, error TEXT NOT NULL, event_id TEXT)";

/// The statement that creates the version table, run before anything
/// else so the version can be read.
pub const META_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS ace_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)";

/// The statements (one transaction) that upgrade a store holding schema
/// `found` whose event table has `columns` (none when it has no such
/// table yet) to [`STORE_SCHEMA`]; empty when there is nothing to do (or
/// the version is not one this release migrates, which
/// [`check_schema`] refuses).
///
/// From [`STORE_SCHEMA_V1`], whose rejected lines were keyed by source and
/// line number: each keeps its source, line and error, keyed by those.
/// From any earlier version: every column of [`COLUMNS`] the table lacks
/// is added, rows stored before holding its empty value (null, 0,
/// `false`), and the tables of providers' bills ([`bill_tables_sql`]) are
/// created.
pub fn migrate_sql(found: Option<&str>, columns: &[String]) -> Vec<String> {
    let known = [
        STORE_SCHEMA_V1,
        STORE_SCHEMA_V2,
        STORE_SCHEMA_V3,
        STORE_SCHEMA,
    ];
    let Some(found) = found.filter(|f| known.contains(f)) else {
        return Vec::new();
    };
    let mut sql: Vec<String> = Vec::new();
    if found == STORE_SCHEMA_V1 {
        sql.extend([
            "ALTER TABLE ace_rejects RENAME TO ace_rejects_v1".into(),
            REJECTS_TABLE.into(),
            "INSERT INTO ace_rejects (key, source, line, error, event_id) \
             SELECT 'v1:' || source || ':' || CAST(line AS TEXT), source, line, error, NULL \
             FROM ace_rejects_v1"
                .into(),
            "DROP TABLE ace_rejects_v1".into(),
        ]);
    }
    if !columns.is_empty() {
        for ((name, ty), empty) in COLUMNS.iter().zip(crate::row::EMPTY) {
            if !columns.iter().any(|c| c == name) {
                let default = if ty.contains("NOT NULL") {
                    format!(" DEFAULT {empty}")
                } else {
                    String::new()
                };
                sql.push(format!(
                    "ALTER TABLE ace_events ADD COLUMN {name} {ty}{default}"
                ));
            }
        }
    }
    if found != STORE_SCHEMA {
        sql.extend(bill_tables_sql());
        sql.push(format!(
            "UPDATE ace_meta SET value = '{STORE_SCHEMA}' WHERE key = 'schema'"
        ));
    }
    sql
}

/// Refuse a store whose tables another version wrote: an unknown version,
/// or event `columns` this release does not know.
pub fn check_schema(found: Option<String>, columns: &[String], url: &str) -> anyhow::Result<()> {
    match found.as_deref() {
        Some(STORE_SCHEMA) => {}
        Some(STORE_SCHEMA_V1 | STORE_SCHEMA_V2 | STORE_SCHEMA_V3) => bail!(
            "the ledger store {url} holds schema {found:?}, older than this `ace` reads \
             ({STORE_SCHEMA:?}); migrate it in place with `{}`",
            migrate_command(url)
        ),
        Some(other) => bail!(
            "the ledger store {url} holds schema {other:?} but this `ace` reads {STORE_SCHEMA:?}; \
             use the `ace` release that wrote it, or ingest the access logs into a new store"
        ),
        None => bail!(
            "the ledger store {url} has no schema version; it was not created by `ace ledger`"
        ),
    }
    let unknown: Vec<&str> = columns
        .iter()
        .map(String::as_str)
        .filter(|c| !COLUMNS.iter().any(|(n, _)| n == c))
        .collect();
    if !unknown.is_empty() {
        bail!(
            "the ledger store {url} has event columns this `ace` does not know ({}): a newer \
             `ace` wrote it; use that release (or a later one)",
            unknown.join(", ")
        );
    }
    Ok(())
}

/// The names of the event table's columns, SQLite.
pub const SQLITE_COLUMNS: &str = "SELECT name FROM pragma_table_info('ace_events')";
/// The names of the event table's columns, PostgreSQL.
pub const POSTGRES_COLUMNS: &str = "SELECT column_name::text FROM information_schema.columns \
     WHERE table_name = 'ace_events' AND table_schema = current_schema()";

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

/// `SELECT` of the row with one event id.
pub fn get_sql() -> String {
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.0).collect();
    format!(
        "SELECT {} FROM ace_events WHERE event_id = $1",
        names.join(", ")
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

/// The most tenants one [`spend_sql`] statement binds: a budget's group
/// may be long, and SQLite and PostgreSQL cap a statement's parameters
/// (32,766 and 65,535), so longer lists are asked in parts.
pub const SPEND_TENANTS_PER_QUERY: usize = 1000;

/// `SELECT` of the booked cost per tenant from `$1` (ms) to before `$2`
/// for the `n` tenants `$3` .. `$n+2`, by tenant, each row's cost counted
/// as at least 0 (`booked_nano > 0`: a negative row lowers nothing).
///
/// The sum is taken in two parts, whole dollars (`booked_nano /
/// 1000000000`) and the nano-dollars left (`booked_nano % 1000000000`), and
/// put together by [`spend_total`] with saturation, so no store content
/// overflows it: a single `SUM(booked_nano)` overflows SQLite's 64-bit
/// integer (an error) past 9.2e9 USD, which a hostile log could write.
/// Each part is cast to `BIGINT` since PostgreSQL sums a `BIGINT` as a
/// `NUMERIC`.
pub fn spend_sql(n: usize) -> String {
    let marks: Vec<String> = (3..n + 3).map(|i| format!("${i}")).collect();
    format!(
        "SELECT tenant, CAST(SUM(booked_nano / 1000000000) AS BIGINT), \
         CAST(SUM(booked_nano % 1000000000) AS BIGINT) FROM ace_events \
         WHERE time_ms >= $1 AND time_ms < $2 AND booked_nano > 0 AND tenant IN ({}) \
         GROUP BY tenant ORDER BY tenant",
        marks.join(", ")
    )
}

/// The total of a [`spend_sql`] row's two parts, nano-dollars, saturated.
pub fn spend_total(whole_usd: i64, nano: i64) -> Nano {
    whole_usd.saturating_mul(1_000_000_000).saturating_add(nano)
}

/// A time bound of [`spend_sql`] (ms) as the stores' `time_ms` (a time
/// past `i64::MAX` is `i64::MAX`, past every row's).
pub fn spend_time(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// `tenants` as the stores hold them ([`crate::kind::storable`]), each
/// once, in parts of at most [`SPEND_TENANTS_PER_QUERY`].
pub fn spend_parts(tenants: &[&str]) -> Vec<Vec<String>> {
    let mut held: Vec<String> = tenants
        .iter()
        .map(|t| {
            let mut t = (*t).to_string();
            crate::kind::storable(&mut t);
            t
        })
        .collect();
    held.sort_unstable();
    held.dedup();
    held.chunks(SPEND_TENANTS_PER_QUERY)
        .map(<[String]>::to_vec)
        .collect()
}

/// Each [`spend_sql`] query [`Store::spend`] runs for `tenants` from
/// `since_ms` until `until_ms`, with its parameters.
pub fn spend_queries(since_ms: u64, until_ms: u64, tenants: &[&str]) -> Vec<(String, Vec<Val>)> {
    let bounds = [since_ms, until_ms].map(|ms| Val::Int(Some(spend_time(ms))));
    spend_parts(tenants)
        .into_iter()
        .map(|part| {
            let sql = spend_sql(part.len());
            let tenants = part.into_iter().map(|t| Val::Text(Some(t)));
            (sql, bounds.iter().cloned().chain(tenants).collect())
        })
        .collect()
}

/// A tenant's spend read from the columns of a [`spend_sql`] row.
pub fn read_spend(c: &dyn Cols) -> anyhow::Result<(String, Nano)> {
    let whole = need(c.int(1)?, "whole dollars")?;
    let nano = need(c.int(2)?, "nano-dollars")?;
    Ok((need(c.text(0)?, "tenant")?, spend_total(whole, nano)))
}

/// The statements shared by both engines for configurations and rejects.
pub const PUT_CONFIG: &str =
    "INSERT INTO ace_configs (id, json) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING";
/// See [`PUT_CONFIG`].
pub const GET_CONFIGS: &str = "SELECT id, json FROM ace_configs ORDER BY id";
/// See [`PUT_CONFIG`].
pub const PUT_REJECT: &str = "INSERT INTO ace_rejects (key, source, line, error, event_id) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO NOTHING";
/// See [`PUT_CONFIG`].
pub const GET_REJECTS: &str =
    "SELECT key, source, line, error, event_id FROM ace_rejects ORDER BY source, line, key";
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
