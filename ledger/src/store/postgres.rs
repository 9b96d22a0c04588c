//! The shared store: PostgreSQL, through the synchronous `postgres` crate,
//! so many proxies' logs can be ingested into one ledger. Same tables and
//! statements as SQLite; rows stream out of [`super::Store::scan`]
//! without being held in memory.

use super::at;
use super::engine::{Engine, Tx, Visit};
use crate::kind::Val;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use postgres::{Client, NoTls, Statement};
use std::collections::HashMap;

impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Val::Text(v) => v.to_sql(ty, out),
            Val::Int(v) => v.to_sql(ty, out),
            Val::Bool(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <String as ToSql>::accepts(ty)
            || <i64 as ToSql>::accepts(ty)
            || <bool as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

cols!(postgres::Row, try_get);

/// A PostgreSQL ledger.
pub struct Postgres {
    client: Client,
    url: String,
    migrated: Vec<String>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres").field("url", &self.url).finish()
    }
}

/// `url` without its password, for messages.
fn shown(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl Postgres {
    /// Connect to `url` and create the tables if needed.
    pub fn open(url: &str) -> anyhow::Result<Postgres> {
        let name = shown(url);
        let client = at(
            Client::connect(url, NoTls),
            "cannot connect (is PostgreSQL running and the URL right?)",
            &name,
        )?;
        let mut store = Postgres {
            client,
            url: name.clone(),
            migrated: Vec::new(),
        };
        store.migrated = super::engine::prepare(&mut store, super::POSTGRES_COLUMNS, &name)?;
        Ok(store)
    }
}

/// A PostgreSQL transaction doing `what` in the store at `url`, each
/// statement prepared once.
struct PgTx<'a> {
    tx: postgres::Transaction<'a>,
    prepared: HashMap<String, Statement>,
    what: &'a str,
    url: &'a str,
}

impl PgTx<'_> {
    /// `sql`, prepared.
    fn prepare(&mut self, sql: &str) -> anyhow::Result<Statement> {
        if let Some(st) = self.prepared.get(sql) {
            return Ok(st.clone());
        }
        let st = at(self.tx.prepare(sql), self.what, self.url)?;
        self.prepared.insert(sql.to_string(), st.clone());
        Ok(st)
    }
}

/// `params` as the `postgres` crate binds them.
fn bound(params: &[Val]) -> impl ExactSizeIterator<Item = &(dyn ToSql + Sync)> {
    params.iter().map(|v| v as &(dyn ToSql + Sync))
}

impl Tx for PgTx<'_> {
    fn each(&mut self, sql: &str, params: &[Val], f: &mut Visit<'_>) -> anyhow::Result<()> {
        use postgres::fallible_iterator::FallibleIterator;
        let st = self.prepare(sql)?;
        let (what, url) = (self.what, self.url);
        let mut rows = at(self.tx.query_raw(&st, bound(params)), what, url)?;
        while let Some(r) = at(rows.next(), what, url)? {
            f(&r)?;
        }
        Ok(())
    }

    fn execute(&mut self, sql: &str, params: &[Val]) -> anyhow::Result<u64> {
        let st = self.prepare(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> = bound(params).collect();
        at(self.tx.execute(&st, &params), self.what, self.url)
    }

    fn commit(self: Box<Self>) -> anyhow::Result<()> {
        at(self.tx.commit(), "cannot commit", self.url)
    }
}

impl Engine for Postgres {
    fn begin<'a>(&'a mut self, what: &'a str) -> anyhow::Result<Box<dyn Tx + 'a>> {
        let url = self.url.as_str();
        let tx = at(self.client.transaction(), "cannot begin a transaction", url)?;
        let prepared = HashMap::new();
        Ok(Box::new(PgTx {
            tx,
            prepared,
            what,
            url,
        }))
    }

    fn migrations(&self) -> &[String] {
        &self.migrated
    }
}
