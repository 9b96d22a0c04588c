//! The ledger's questions asked once for both SQL engines: an [`Engine`]
//! (SQLite, PostgreSQL) only runs transactions of parameterised
//! statements ([`Tx`]); every [`Store`] method is the same SQL and the
//! same reading of its rows in both, written here.

use super::{
    read_config, read_spend, spend_queries, Reject, Store, GET_BILL_REJECTS, GET_CONFIGS,
    GET_REJECTS, PUT_BILL_REJECT, PUT_CONFIG, PUT_REJECT,
};
use crate::bill::{BadRow, BillLine, Stored};
use crate::kind::{need, Cols, Val};
use crate::money::Nano;
use crate::row::Row;

/// What is done with each row a statement selects.
pub type Visit<'a> = dyn FnMut(&dyn Cols) -> anyhow::Result<()> + 'a;

/// Statements run in one transaction; an error of theirs names what the
/// transaction does and the store.
pub trait Tx {
    /// Call `f` on every row `sql` selects with `params`, as they come.
    fn each(&mut self, sql: &str, params: &[Val], f: &mut Visit<'_>) -> anyhow::Result<()>;
    /// Run `sql` with `params`; how many rows it changed.
    fn execute(&mut self, sql: &str, params: &[Val]) -> anyhow::Result<u64>;
    /// Commit what it did.
    fn commit(self: Box<Self>) -> anyhow::Result<()>;
}

/// A SQL engine a ledger is kept in.
pub trait Engine: Send {
    /// Begin a transaction doing `what`.
    fn begin<'a>(&'a mut self, what: &'a str) -> anyhow::Result<Box<dyn Tx + 'a>>;
    /// Run `f` in one transaction doing `what`, committed when it
    /// succeeds.
    fn transaction<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut dyn Tx) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut tx = self.begin(what)?;
        let out = f(tx.as_mut())?;
        tx.commit()?;
        Ok(out)
    }
    /// The statements the opening migration ran.
    fn migrations(&self) -> &[String];
}

/// Every row `sql` selects with `params`, read by `read`.
fn all<T>(
    engine: &mut impl Engine,
    sql: &str,
    params: &[Val],
    what: &str,
    read: fn(&dyn Cols) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<T>> {
    engine.transaction(what, |tx| {
        let mut out = Vec::new();
        tx.each(sql, params, &mut |c| read(c).map(|v| out.push(v)))?;
        Ok(out)
    })
}

/// Run `sql` with each of `params`, in one transaction; per run, whether
/// it changed a row.
fn put_each<P: AsRef<[Val]>>(
    engine: &mut impl Engine,
    sql: &str,
    what: &str,
    params: impl Iterator<Item = P>,
) -> anyhow::Result<Vec<bool>> {
    engine.transaction(what, |tx| {
        params
            .map(|v| Ok(tx.execute(sql, v.as_ref())? > 0))
            .collect::<anyhow::Result<Vec<bool>>>()
    })
}

/// Make the tables of the store at `url` current: create what is
/// missing, migrate a store an earlier version wrote (returning the
/// statements run), and refuse one a later version wrote. `columns`
/// selects the names of the event table's columns.
pub fn prepare(engine: &mut impl Engine, columns: &str, url: &str) -> anyhow::Result<Vec<String>> {
    let create = "cannot create the tables";
    engine.transaction(create, |tx| tx.execute(super::META_TABLE, &[]).map(drop))?;
    let first = |c: &dyn Cols| need(c.text(0)?, "the first column");
    let read = |engine: &mut _| -> anyhow::Result<(Option<String>, Vec<String>)> {
        let schema = all(
            engine,
            super::GET_SCHEMA,
            &[],
            "cannot read the schema version",
            first,
        )?;
        let columns = all(engine, columns, &[], "cannot read the columns", first)?;
        Ok((schema.into_iter().next(), columns))
    };
    let (schema, found) = read(engine)?;
    let migrate = super::migrate_sql(schema.as_deref(), &found);
    engine.transaction("cannot migrate the tables", |tx| {
        migrate
            .iter()
            .try_for_each(|sql| tx.execute(sql, &[]).map(drop))
    })?;
    engine.transaction(create, |tx| {
        super::schema_sql()
            .iter()
            .try_for_each(|sql| tx.execute(sql, &[]).map(drop))
    })?;
    let (schema, found) = read(engine)?;
    super::check_schema(schema, &found, url)?;
    Ok(migrate)
}

fn text(s: &str) -> Val {
    Val::Text(Some(s.to_string()))
}

impl<E: Engine> Store for E {
    fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()> {
        let params = std::iter::once(vec![text(id), text(json)]);
        put_each(self, PUT_CONFIG, "cannot store a configuration", params).map(drop)
    }

    fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let what = "cannot read configurations";
        all(self, GET_CONFIGS, &[], what, read_config)
    }

    fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>> {
        let sql = super::insert_sql();
        put_each(
            self,
            &sql,
            "cannot insert an event",
            rows.iter().map(Row::values),
        )
    }

    fn get(&mut self, event_id: &str) -> anyhow::Result<Option<Row>> {
        let sql = super::get_sql();
        let found = all(
            self,
            &sql,
            &[text(event_id)],
            "cannot read an event",
            Row::read,
        )?;
        Ok(found.into_iter().next())
    }

    fn put_rejects(&mut self, rejects: &[Reject]) -> anyhow::Result<()> {
        let params = rejects.iter().map(Reject::values);
        put_each(self, PUT_REJECT, "cannot record a malformed line", params).map(drop)
    }

    fn rejects(&mut self) -> anyhow::Result<Vec<Reject>> {
        all(self, GET_REJECTS, &[], "cannot read rejects", Reject::read)
    }

    fn put_bill_lines(&mut self, lines: &[BillLine]) -> anyhow::Result<Vec<Stored>> {
        let get = super::get_bill_line_sql();
        let put = super::put_bill_line_sql();
        let restate = super::restate_bill_line_sql();
        self.transaction("cannot store a bill line", |tx| {
            let mut out = Vec::with_capacity(lines.len());
            for l in lines {
                let mut held = None;
                tx.each(&get, &[text(&l.key)], &mut |c| {
                    held = Some(BillLine::read(c)?);
                    Ok(())
                })?;
                let outcome = super::bill_outcome(held.as_ref(), l);
                match outcome {
                    Stored::New => tx.execute(&put, &l.values())?,
                    Stored::Restated => tx.execute(&restate, &l.values())?,
                    Stored::Same => 0,
                };
                out.push(outcome);
            }
            Ok(out)
        })
    }

    fn bill_lines(&mut self) -> anyhow::Result<Vec<BillLine>> {
        let sql = super::bill_lines_sql();
        all(self, &sql, &[], "cannot read bill lines", BillLine::read)
    }

    fn put_bill_rejects(&mut self, rows: &[BadRow]) -> anyhow::Result<()> {
        let params = rows.iter().map(BadRow::values);
        let what = "cannot record a bill row not imported";
        put_each(self, PUT_BILL_REJECT, what, params).map(drop)
    }

    fn bill_rejects(&mut self) -> anyhow::Result<Vec<BadRow>> {
        let what = "cannot read bill rows not imported";
        all(self, GET_BILL_REJECTS, &[], what, BadRow::read)
    }

    fn migrated(&self) -> &[String] {
        self.migrations()
    }

    fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let sql = super::scan_sql();
        self.transaction("cannot read events", |tx| {
            tx.each(&sql, &[], &mut |c| f(Row::read(c)?))
        })
    }

    fn spend(
        &mut self,
        since_ms: u64,
        until_ms: u64,
        tenants: &[&str],
    ) -> anyhow::Result<Vec<(String, Nano)>> {
        let what = "cannot sum the tenants' booked cost";
        let mut out = Vec::new();
        for (sql, params) in spend_queries(since_ms, until_ms, tenants) {
            out.extend(all(self, &sql, &params, what, read_spend)?);
        }
        Ok(out)
    }
}
