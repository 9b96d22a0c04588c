//! The embedded store: one SQLite file, through `rusqlite` (SQLite bundled,
//! so no system library is needed). Write-ahead logging, and one
//! transaction per batch, make ingest fast.

use super::{at, Reject, Store};
use crate::bill::{BadRow, BillLine, Stored};
use crate::kind::{Cols, Val};
use crate::money::Nano;
use crate::row::Row;
use rusqlite::types::{ToSqlOutput, Value as SqlValue};
use rusqlite::{Connection, OptionalExtension, ToSql};

impl ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Owned(match self {
            Val::Text(Some(s)) => SqlValue::Text(s.clone()),
            Val::Int(Some(i)) => SqlValue::Integer(*i),
            Val::Bool(Some(b)) => SqlValue::Integer(i64::from(*b)),
            Val::Text(None) | Val::Int(None) | Val::Bool(None) => SqlValue::Null,
        }))
    }
}

impl Cols for rusqlite::Row<'_> {
    fn text(&self, i: usize) -> anyhow::Result<Option<String>> {
        Ok(self.get(i)?)
    }
    fn int(&self, i: usize) -> anyhow::Result<Option<i64>> {
        Ok(self.get(i)?)
    }
    fn boolean(&self, i: usize) -> anyhow::Result<Option<bool>> {
        Ok(self.get(i)?)
    }
}

/// A SQLite ledger.
#[derive(Debug)]
pub struct Sqlite {
    conn: Connection,
    url: String,
    migrated: Vec<String>,
}

impl Sqlite {
    /// Open (or create) the ledger file at `path`.
    pub fn open(path: &std::path::Path) -> anyhow::Result<Sqlite> {
        let url = path.display().to_string();
        let conn = at(Connection::open(path), "cannot open", &url)?;
        at(
            conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;"),
            "cannot set WAL mode",
            &url,
        )?;
        at(
            conn.execute(super::META_TABLE, []),
            "cannot create the tables",
            &url,
        )?;
        let mut store = Sqlite {
            conn,
            url,
            migrated: Vec::new(),
        };
        let migrate = super::migrate_sql(store.schema()?.as_deref(), &store.columns()?);
        if !migrate.is_empty() {
            store.in_transaction(|tx, url| {
                for sql in &migrate {
                    at(tx.execute(sql, []), "cannot migrate the tables", url)?;
                }
                Ok(())
            })?;
        }
        store.migrated = migrate;
        for sql in super::schema_sql() {
            let r = store.conn.execute(&sql, []);
            at(r, "cannot create the tables", &store.url)?;
        }
        let columns = store.columns()?;
        super::check_schema(store.schema()?, &columns, &store.url)?;
        Ok(store)
    }

    /// The event table's columns (none before it exists).
    fn columns(&self) -> anyhow::Result<Vec<String>> {
        let mut st = at(
            self.conn.prepare(super::SQLITE_COLUMNS),
            "cannot read the columns",
            &self.url,
        )?;
        let rows = at(
            st.query_map([], |r| r.get::<_, String>(0)),
            "cannot read the columns",
            &self.url,
        )?;
        rows.map(|r| at(r, "cannot read the columns", &self.url))
            .collect()
    }

    /// The stored schema version.
    fn schema(&self) -> anyhow::Result<Option<String>> {
        at(
            self.conn
                .query_row(super::GET_SCHEMA, [], |r| r.get(0))
                .optional(),
            "cannot read the schema version",
            &self.url,
        )
    }
}

impl Sqlite {
    /// Run `f` in one transaction, committed when it succeeds.
    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &str) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let tx = at(
            self.conn.transaction(),
            "cannot begin a transaction",
            &self.url,
        )?;
        let out = f(&tx, &self.url)?;
        at(tx.commit(), "cannot commit", &self.url)?;
        Ok(out)
    }
}

impl Store for Sqlite {
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()> {
        let r = self.conn.execute(super::PUT_CONFIG, [id, json]);
        at(r, "cannot store a configuration", &self.url).map(drop)
    }

    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let url = self.url.clone();
        let mut st = at(
            self.conn.prepare(super::GET_CONFIGS),
            "cannot read configurations",
            &url,
        )?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)));
        let rows = at(rows, "cannot read configurations", &url)?;
        let mut out = Vec::new();
        for r in rows {
            let (id, json) = at(r, "cannot read a configuration", &url)?;
            out.push((id, json.into_bytes()));
        }
        Ok(out)
    }

    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>> {
        self.in_transaction(|tx, url| {
            let sql = super::insert_sql();
            let mut st = at(tx.prepare_cached(&sql), "cannot prepare the insert", url)?;
            let mut new = Vec::with_capacity(rows.len());
            for r in rows {
                let v = r.values();
                let params = rusqlite::params_from_iter(v.iter());
                new.push(at(st.execute(params), "cannot insert an event", url)? > 0);
            }
            Ok(new)
        })
    }

    fn get(&mut self, event_id: &str) -> anyhow::Result<Option<Row>> {
        let url = self.url.clone();
        let sql = super::get_sql();
        let mut st = at(self.conn.prepare_cached(&sql), "cannot read an event", &url)?;
        let mut rows = at(st.query([event_id]), "cannot read an event", &url)?;
        match at(rows.next(), "cannot read an event", &url)? {
            Some(r) => Ok(Some(Row::read(r)?)),
            None => Ok(None),
        }
    }

    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()> {
        self.in_transaction(|tx, url| {
            for r in rejects {
                let params = rusqlite::params![r.key, r.source, r.line, r.error, r.event_id];
                at(
                    tx.execute(super::PUT_REJECT, params),
                    "cannot record a malformed line",
                    url,
                )?;
            }
            Ok(())
        })
    }

    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>> {
        let url = self.url.clone();
        let mut st = at(
            self.conn.prepare(super::GET_REJECTS),
            "cannot read rejects",
            &url,
        )?;
        let rows = st.query_map([], |r| {
            Ok(Reject {
                key: r.get(0)?,
                source: r.get(1)?,
                line: r.get(2)?,
                error: r.get(3)?,
                event_id: r.get(4)?,
            })
        });
        let rows = at(rows, "cannot read rejects", &url)?;
        rows.map(|r| at(r, "cannot read a reject", &url)).collect()
    }

    fn put_bill_lines(&mut self, lines: &[BillLine]) -> anyhow::Result<Vec<Stored>> {
        self.in_transaction(|tx, url| {
            let what = "cannot store a bill line";
            let get = super::get_bill_line_sql();
            let mut out = Vec::with_capacity(lines.len());
            for l in lines {
                let held = {
                    let mut st = at(tx.prepare_cached(&get), what, url)?;
                    let mut rows = at(st.query([&l.key]), what, url)?;
                    match at(rows.next(), what, url)? {
                        Some(r) => Some(BillLine::read(r)?),
                        None => None,
                    }
                };
                let outcome = super::bill_outcome(held.as_ref(), l);
                let sql = match outcome {
                    Stored::New => super::put_bill_line_sql(),
                    Stored::Restated => super::restate_bill_line_sql(),
                    Stored::Same => {
                        out.push(outcome);
                        continue;
                    }
                };
                let v = l.values();
                at(
                    tx.execute(&sql, rusqlite::params_from_iter(v.iter())),
                    what,
                    url,
                )?;
                out.push(outcome);
            }
            Ok(out)
        })
    }

    fn bill_lines(&mut self) -> anyhow::Result<Vec<BillLine>> {
        let url = self.url.clone();
        let what = "cannot read bill lines";
        let mut st = at(self.conn.prepare(&super::bill_lines_sql()), what, &url)?;
        let mut rows = at(st.query([]), what, &url)?;
        let mut out = Vec::new();
        while let Some(r) = at(rows.next(), what, &url)? {
            out.push(BillLine::read(r)?);
        }
        Ok(out)
    }

    fn put_bill_rejects(&mut self, rows: &[BadRow]) -> anyhow::Result<()> {
        self.in_transaction(|tx, url| {
            for r in rows {
                let params = rusqlite::params![r.key(), r.source, r.line, r.field, r.error];
                let res = tx.execute(super::PUT_BILL_REJECT, params);
                at(res, "cannot record a bill row not imported", url)?;
            }
            Ok(())
        })
    }

    fn bill_rejects(&mut self) -> anyhow::Result<Vec<BadRow>> {
        let url = self.url.clone();
        let what = "cannot read bill rows not imported";
        let mut st = at(self.conn.prepare(super::GET_BILL_REJECTS), what, &url)?;
        let rows = st.query_map([], |r| {
            Ok(BadRow {
                source: r.get(0)?,
                line: r.get(1)?,
                field: r.get(2)?,
                error: r.get(3)?,
            })
        });
        let rows = at(rows, what, &url)?;
        rows.map(|r| at(r, what, &url)).collect()
    }

    fn migrated(&self) -> &[String] {
        &self.migrated
    }

    fn spend(
        &mut self,
        since_ms: u64,
        until_ms: u64,
        tenants: &[&str],
    ) -> anyhow::Result<Vec<(String, Nano)>> {
        let url = self.url.clone();
        let (since, until) = (super::spend_time(since_ms), super::spend_time(until_ms));
        let mut out = Vec::new();
        for part in super::spend_parts(tenants) {
            let sql = super::spend_sql(part.len());
            let what = "cannot sum the tenants' booked cost";
            let mut st = at(self.conn.prepare_cached(&sql), what, &url)?;
            let params = [SqlValue::Integer(since), SqlValue::Integer(until)]
                .into_iter()
                .chain(part.into_iter().map(SqlValue::Text));
            let rows = st.query_map(rusqlite::params_from_iter(params), |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            });
            for r in at(rows, what, &url)? {
                let (tenant, whole, nano) = at(r, what, &url)?;
                out.push((tenant, super::spend_total(whole, nano)));
            }
        }
        Ok(out)
    }

    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let url = self.url.clone();
        let sql = super::scan_sql();
        let mut st = at(self.conn.prepare(&sql), "cannot read events", &url)?;
        let mut rows = at(st.query([]), "cannot read events", &url)?;
        while let Some(r) = at(rows.next(), "cannot read an event", &url)? {
            f(Row::read(r)?)?;
        }
        Ok(())
    }
}
