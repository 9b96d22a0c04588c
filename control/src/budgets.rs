//! Tenant budgets: each budget's spend in its current period, read from
//! a [`Spend`] (the ledger's store, `--ledger-store`), published in the
//! snapshot.
//!
//! Why the service reads the books rather than each filter: a filter sees
//! only its own proxy's traffic, and the books see every proxy's (through
//! the access log and `ace ledger ingest`). A filter counts its own recent
//! spend on top of the latest reading it has, so every good read is
//! published with its own `read_ms`, a new snapshot version once per read
//! (at most one per `--ledger-interval`): the sooner a filter has it, the
//! less it counts twice. An unchanged fleet without budgets still gets
//! 304s.
//!
//! Failure never lifts a limit. A read that fails (the store is down,
//! locked, gone, or not a ledger) keeps the last good readings published
//! unchanged, `read_ms` included, so every filter keeps counting its own
//! spend on top of them; the store is opened again at the next interval.
//! Only a good read can lower a budget's state (a new period, or a rolling
//! window that moved on, is read like any other). Before the first good
//! read no reading is published at all: a filter then counts only its own
//! spend.
//!
//! Why a trait: the service knows what a reading is and when to take one,
//! not how the books are kept; the `ace` command hands it the ledger's
//! reader (`ace_ledger::spend::Reader`), so the service does not link the
//! ledger. A read is blocking I/O (SQLite, or PostgreSQL's synchronous
//! client), so each runs on tokio's blocking pool and never holds up the
//! publisher or the server.

use crate::state::{self, Service};
use crate::{log, Error};
use ace_config::Budgets;
use ace_snapshot::Budget;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Where each tenant budget's spend is read from: the books.
pub trait Spend: Send + 'static {
    /// The store as logs and `/metrics` show it (never a password).
    fn shown(&self) -> &str;
    /// Every budget of `budgets` with an amount (`usd`), its spend in its
    /// current period as of `now_ms` (Unix ms); the service sets each
    /// reading's `read_ms`. Blocking: the service runs it on tokio's
    /// blocking pool. A failure is one line naming what went wrong; the
    /// next call tries again from the start (opening the store again).
    fn readings(&mut self, budgets: &Budgets, now_ms: u64) -> Result<Vec<Budget>, String>;
    /// The same source with nothing open: what the service reads with
    /// next after a read that panicked and took this one with it.
    fn fresh(&self) -> Box<dyn Spend>;
}

impl fmt::Debug for dyn Spend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Spend").field(&self.shown()).finish()
    }
}

/// A copy of a configuration reads the same store, opened anew.
impl Clone for Box<dyn Spend> {
    fn clone(&self) -> Self {
        self.fresh()
    }
}

/// The budgets source: reads every budget's spend every interval and
/// hands it to the service.
#[derive(Debug)]
pub(crate) struct Source {
    spend: Box<dyn Spend>,
    budgets: Arc<Budgets>,
    interval: Duration,
}

impl Source {
    /// The source for `budgets` read from `spend`, when there is spend to
    /// read: none, with a line in the log, when the store is given but no
    /// budget has an amount, or budgets have one but no store is given.
    pub fn new(
        spend: Option<Box<dyn Spend>>,
        budgets: Budgets,
        interval: Duration,
    ) -> Result<Option<Source>, Error> {
        if interval.is_zero() {
            return Err(Error::new("--ledger-interval must be above 0"));
        }
        // Budgets with an amount have a spend to read; a token limit alone
        // is the filters' own.
        let with_amount = budgets.list.iter().filter(|b| b.usd.is_some()).count();
        Ok(match (spend, with_amount) {
            (Some(spend), 0) => {
                log(&format!(
                    "--ledger-store {}: the manifest has no budget with `usd`, so the store is \
                     not read",
                    spend.shown()
                ));
                None
            }
            (Some(spend), _) => Some(Source {
                spend,
                budgets: Arc::new(budgets),
                interval,
            }),
            (None, 0) => None,
            (None, n) => {
                log(&format!(
                    "the manifest has {n} budgets with `usd` but no --ledger-store is given: no \
                     budget readings are published, so each filter counts only its own spend"
                ));
                None
            }
        })
    }

    /// The store as logs show it.
    pub fn shown(&self) -> String {
        self.spend.shown().to_string()
    }

    /// Reads every interval, each read on the blocking pool.
    pub fn spawn(self, tasks: &mut JoinSet<()>, svc: Arc<Service>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let Source { spend, budgets, .. } = self;
        tasks.spawn(async move {
            let (shown, base) = (spend.shown().to_string(), spend.fresh());
            let mut spend = Some(spend);
            loop {
                tick.tick().await;
                let mut s = spend.take().unwrap_or_else(|| base.fresh());
                let (b, after) = (budgets.clone(), svc.budgets_read_ms());
                let now = state::now_ms();
                let done = tokio::task::spawn_blocking(move || {
                    let got = read(s.as_mut(), &b, now, after);
                    (s, got)
                })
                .await;
                let got = match done {
                    Ok((s, got)) => {
                        spend = Some(s);
                        got
                    }
                    // The read panicked: its connection is gone with it,
                    // and the next tick opens a new one.
                    Err(e) => Err(format!("the read failed: {e}")),
                };
                svc.set_budgets(got, &shown);
            }
        });
    }
}

/// Every budget's reading as of `now_ms`, each `read_ms` after `after_ms`
/// (the last good read's: a reading is replaced only with a later one, so
/// a clock that steps back must not freeze the readings).
fn read(
    spend: &mut dyn Spend,
    budgets: &Budgets,
    now_ms: u64,
    after_ms: u64,
) -> Result<Vec<Budget>, String> {
    let mut v = spend.readings(budgets, now_ms)?;
    let read_ms = now_ms.max(after_ms.saturating_add(1));
    for b in &mut v {
        b.read_ms = read_ms;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that reads `spent` for every budget with an amount.
    struct Fixed(f64);

    impl Spend for Fixed {
        fn shown(&self) -> &str {
            "fixed"
        }
        fn readings(&mut self, budgets: &Budgets, now_ms: u64) -> Result<Vec<Budget>, String> {
            Ok(budgets
                .list
                .iter()
                .filter(|b| b.usd.is_some())
                .map(|b| Budget {
                    name: b.name.clone(),
                    state: b.state(self.0),
                    spent_usd: self.0,
                    read_ms: now_ms,
                    resets_ms: 0,
                })
                .collect())
        }
        fn fresh(&self) -> Box<dyn Spend> {
            Box::new(Fixed(self.0))
        }
    }

    fn budgets() -> Budgets {
        Budgets::validate(&[ace_config::BudgetSettings {
            name: "a".into(),
            tenants: vec!["t".into()],
            usd: Some(1.0),
            ..Default::default()
        }])
        .expect("budgets")
    }

    #[test]
    fn a_reading_is_always_later_than_the_last() {
        let b = budgets();
        let v = read(&mut Fixed(0.5), &b, 1_000, 0).expect("read");
        assert_eq!((v.len(), v[0].read_ms), (1, 1_000));
        // The clock stepped back: still after the last good read.
        let v = read(&mut Fixed(0.5), &b, 900, 1_000).expect("read");
        assert_eq!(v[0].read_ms, 1_001);
    }

    #[test]
    fn a_store_without_budgets_to_read_is_not_read() {
        let none = Budgets::validate(&[]).expect("budgets");
        let s = Source::new(Some(Box::new(Fixed(0.0))), none, Duration::from_secs(1));
        assert!(s.expect("no error").is_none());
        let s = Source::new(None, budgets(), Duration::ZERO);
        assert!(s.unwrap_err().0.contains("--ledger-interval"));
    }
}
