//! The embedded store: one SQLite file, through `rusqlite` (SQLite bundled,
//! so no system library is needed). Write-ahead logging, and one
//! transaction per batch, make ingest fast.

use super::at;
use super::engine::{Engine, Tx, Visit};
use crate::kind::Val;
use rusqlite::types::{ToSqlOutput, Value as SqlValue};
use rusqlite::{Connection, ToSql};

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

cols!(rusqlite::Row<'_>, get);

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
        let mut store = Sqlite {
            conn,
            url,
            migrated: Vec::new(),
        };
        let url = store.url.clone();
        store.migrated = super::engine::prepare(&mut store, super::SQLITE_COLUMNS, &url)?;
        Ok(store)
    }
}

/// A SQLite transaction doing `what` in the store at `url`.
struct SqliteTx<'a> {
    tx: rusqlite::Transaction<'a>,
    what: &'a str,
    url: &'a str,
}

impl Tx for SqliteTx<'_> {
    fn each(&mut self, sql: &str, params: &[Val], f: &mut Visit<'_>) -> anyhow::Result<()> {
        let (what, url) = (self.what, self.url);
        let mut st = at(self.tx.prepare_cached(sql), what, url)?;
        let params = rusqlite::params_from_iter(params.iter());
        let mut rows = at(st.query(params), what, url)?;
        while let Some(r) = at(rows.next(), what, url)? {
            f(r)?;
        }
        Ok(())
    }

    fn execute(&mut self, sql: &str, params: &[Val]) -> anyhow::Result<u64> {
        let (what, url) = (self.what, self.url);
        let mut st = at(self.tx.prepare_cached(sql), what, url)?;
        let n = at(
            st.execute(rusqlite::params_from_iter(params.iter())),
            what,
            url,
        )?;
        Ok(n as u64)
    }

    fn commit(self: Box<Self>) -> anyhow::Result<()> {
        at(self.tx.commit(), "cannot commit", self.url)
    }
}

impl Engine for Sqlite {
    fn begin<'a>(&'a mut self, what: &'a str) -> anyhow::Result<Box<dyn Tx + 'a>> {
        let url = self.url.as_str();
        let tx = at(self.conn.transaction(), "cannot begin a transaction", url)?;
        Ok(Box::new(SqliteTx { tx, what, url }))
    }

    fn migrations(&self) -> &[String] {
        &self.migrated
    }
}
