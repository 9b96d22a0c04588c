//! The shared store: PostgreSQL, through the synchronous `postgres` crate,
//! so many proxies' logs can be ingested into one ledger. Same tables and
//! statements as SQLite; rows stream out of [`Store::scan`] without being
//! held in memory.

use super::{at, Reject, Store};
use crate::bill::{BadRow, BillLine, Stored};
use crate::kind::{Cols, Val};
use crate::money::Nano;
use crate::row::Row;
use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use postgres::{Client, NoTls};

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

impl Cols for postgres::Row {
    fn text(&self, i: usize) -> anyhow::Result<Option<String>> {
        Ok(self.try_get(i)?)
    }
    fn int(&self, i: usize) -> anyhow::Result<Option<i64>> {
        Ok(self.try_get(i)?)
    }
    fn boolean(&self, i: usize) -> anyhow::Result<Option<bool>> {
        Ok(self.try_get(i)?)
    }
}

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
        let mut client = at(
            Client::connect(url, NoTls),
            "cannot connect (is PostgreSQL running and the URL right?)",
            &name,
        )?;
        at(
            client.batch_execute(super::META_TABLE),
            "cannot create the tables",
            &name,
        )?;
        let mut store = Postgres {
            client,
            url: name,
            migrated: Vec::new(),
        };
        let columns = store.columns()?;
        let migrate = super::migrate_sql(store.schema()?.as_deref(), &columns);
        if !migrate.is_empty() {
            store.in_transaction(|tx, url| {
                for sql in &migrate {
                    at(tx.batch_execute(sql), "cannot migrate the tables", url)?;
                }
                Ok(())
            })?;
        }
        store.migrated = migrate;
        for sql in super::schema_sql() {
            let r = store.client.batch_execute(&sql);
            at(r, "cannot create the tables", &store.url)?;
        }
        let columns = store.columns()?;
        super::check_schema(store.schema()?, &columns, &store.url)?;
        Ok(store)
    }

    /// The event table's columns (none before it exists).
    fn columns(&mut self) -> anyhow::Result<Vec<String>> {
        let r = self.client.query(super::POSTGRES_COLUMNS, &[]);
        Ok(at(r, "cannot read the columns", &self.url)?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect())
    }

    /// The stored schema version.
    fn schema(&mut self) -> anyhow::Result<Option<String>> {
        let r = self.client.query_opt(super::GET_SCHEMA, &[]);
        Ok(at(r, "cannot read the schema version", &self.url)?.map(|r| r.get::<_, String>(0)))
    }
}

impl Postgres {
    /// Run `f` in one transaction, committed when it succeeds.
    fn in_transaction<T>(
        &mut self,
        f: impl FnOnce(&mut postgres::Transaction<'_>, &str) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let url = self.url.clone();
        let mut tx = at(
            self.client.transaction(),
            "cannot begin a transaction",
            &url,
        )?;
        let out = f(&mut tx, &url)?;
        at(tx.commit(), "cannot commit", &url)?;
        Ok(out)
    }

    /// Every row `sql` (without parameters) selects.
    fn all(&mut self, sql: &str, what: &str) -> anyhow::Result<Vec<postgres::Row>> {
        at(self.client.query(sql, &[]), what, &self.url)
    }
}

impl Store for Postgres {
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()> {
        let r = self.client.execute(super::PUT_CONFIG, &[&id, &json]);
        at(r, "cannot store a configuration", &self.url).map(drop)
    }

    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        Ok(self
            .all(super::GET_CONFIGS, "cannot read configurations")?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1).into_bytes()))
            .collect())
    }

    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>> {
        self.in_transaction(|tx, url| {
            let sql = super::insert_sql();
            let st = at(tx.prepare(&sql), "cannot prepare the insert", url)?;
            let mut new = Vec::with_capacity(rows.len());
            for r in rows {
                let v = r.values();
                let params: Vec<&(dyn ToSql + Sync)> =
                    v.iter().map(|x| x as &(dyn ToSql + Sync)).collect();
                new.push(at(tx.execute(&st, &params), "cannot insert an event", url)? > 0);
            }
            Ok(new)
        })
    }

    fn get(&mut self, event_id: &str) -> anyhow::Result<Option<Row>> {
        let r = self.client.query_opt(&super::get_sql(), &[&event_id]);
        match at(r, "cannot read an event", &self.url)? {
            Some(r) => Ok(Some(Row::read(&r)?)),
            None => Ok(None),
        }
    }

    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()> {
        self.in_transaction(|tx, url| {
            for r in rejects {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&r.key, &r.source, &r.line, &r.error, &r.event_id];
                let res = tx.execute(super::PUT_REJECT, &params);
                at(res, "cannot record a malformed line", url)?;
            }
            Ok(())
        })
    }

    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>> {
        let url = self.url.clone();
        let read = |r: &postgres::Row| -> Result<Reject, postgres::Error> {
            Ok(Reject {
                key: r.try_get(0)?,
                source: r.try_get(1)?,
                line: r.try_get(2)?,
                error: r.try_get(3)?,
                event_id: r.try_get(4)?,
            })
        };
        self.all(super::GET_REJECTS, "cannot read rejects")?
            .iter()
            .map(|r| at(read(r), "cannot read a reject", &url))
            .collect()
    }

    fn put_bill_lines(&mut self, lines: &[BillLine]) -> anyhow::Result<Vec<Stored>> {
        self.in_transaction(|tx, url| {
            let what = "cannot store a bill line";
            let get = at(tx.prepare(&super::get_bill_line_sql()), what, url)?;
            let put = at(tx.prepare(&super::put_bill_line_sql()), what, url)?;
            let restate = at(tx.prepare(&super::restate_bill_line_sql()), what, url)?;
            let mut out = Vec::with_capacity(lines.len());
            for l in lines {
                let held = match at(tx.query_opt(&get, &[&l.key]), what, url)? {
                    Some(r) => Some(BillLine::read(&r)?),
                    None => None,
                };
                let outcome = super::bill_outcome(held.as_ref(), l);
                let st = match outcome {
                    Stored::New => &put,
                    Stored::Restated => &restate,
                    Stored::Same => {
                        out.push(outcome);
                        continue;
                    }
                };
                let v = l.values();
                let params: Vec<&(dyn ToSql + Sync)> =
                    v.iter().map(|x| x as &(dyn ToSql + Sync)).collect();
                at(tx.execute(st, &params), what, url)?;
                out.push(outcome);
            }
            Ok(out)
        })
    }

    fn bill_lines(&mut self) -> anyhow::Result<Vec<BillLine>> {
        self.all(&super::bill_lines_sql(), "cannot read bill lines")?
            .iter()
            .map(|r| BillLine::read(r))
            .collect()
    }

    fn put_bill_rejects(&mut self, rows: &[BadRow]) -> anyhow::Result<()> {
        self.in_transaction(|tx, url| {
            for r in rows {
                let key = r.key();
                let params: [&(dyn ToSql + Sync); 5] =
                    [&key, &r.source, &r.line, &r.field, &r.error];
                let res = tx.execute(super::PUT_BILL_REJECT, &params);
                at(res, "cannot record a bill row not imported", url)?;
            }
            Ok(())
        })
    }

    fn bill_rejects(&mut self) -> anyhow::Result<Vec<BadRow>> {
        let url = self.url.clone();
        let read = |r: &postgres::Row| -> Result<BadRow, postgres::Error> {
            Ok(BadRow {
                source: r.try_get(0)?,
                line: r.try_get(1)?,
                field: r.try_get(2)?,
                error: r.try_get(3)?,
            })
        };
        self.all(
            super::GET_BILL_REJECTS,
            "cannot read bill rows not imported",
        )?
        .iter()
        .map(|r| at(read(r), "cannot read a bill row not imported", &url))
        .collect()
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
        let (since, until) = (super::spend_time(since_ms), super::spend_time(until_ms));
        let mut out = Vec::new();
        for part in super::spend_parts(tenants) {
            let sql = super::spend_sql(part.len());
            let what = "cannot sum the tenants' booked cost";
            let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(part.len() + 2);
            params.push(&since);
            params.push(&until);
            params.extend(part.iter().map(|t| t as &(dyn ToSql + Sync)));
            let rows = at(self.client.query(&sql, &params), what, &self.url)?;
            let read = |r: &postgres::Row| -> Result<(String, i64, i64), postgres::Error> {
                Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
            };
            for r in &rows {
                let (tenant, whole, nano) = at(read(r), what, &self.url)?;
                out.push((tenant, super::spend_total(whole, nano)));
            }
        }
        Ok(out)
    }

    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()> {
        use postgres::fallible_iterator::FallibleIterator;
        let url = self.url.clone();
        let none: [&(dyn ToSql + Sync); 0] = [];
        let mut rows = at(
            self.client.query_raw(&super::scan_sql(), none),
            "cannot read events",
            &url,
        )?;
        while let Some(r) = at(rows.next(), "cannot read an event", &url)? {
            f(Row::read(&r)?)?;
        }
        Ok(())
    }
}
