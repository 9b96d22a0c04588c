//! Budget readings: what the books say each tenant budget has spent in its
//! current period, and where that leaves it.
//!
//! The control service calls [`readings`] on every poll and publishes the
//! result in its snapshot; the filter narrows or refuses on it and counts
//! its own spend on top until the next reading. The spend is the ledger's
//! booked cost (its own re-derived marginal cost, never the filter's
//! logged figure), so a budget is held to the same money the report
//! shows. A budget's period ([`ace_config::budget::Period::window`]) and
//! its thresholds ([`ace_config::budget::Budget::state`]) are the
//! configuration's, written once for the filter, the service and the
//! ledger.
//!
//! The store sums the rows ([`Store::spend`]) instead of this crate
//! scanning them: a reading is taken every few seconds, and needs one
//! figure per tenant, not every row. Budgets whose periods start at the
//! same moment (every `day` budget, every `month` budget) share one query.
//!
//! A reading is bounded in time on both sides, and each row counts at
//! least 0. It counts the rows from its period's start to [`AHEAD_MS`]
//! after its own time, never at or past the period's end: a row dated
//! ahead (a forged time, or a proxy's clock far ahead of the control
//! service's) waits until the reading's time comes within [`AHEAD_MS`] of
//! it, rather than counting in every period until then. A row with a
//! negative cost counts as nothing ([`Store::spend`]): no row lowers what
//! the others add up to.

use crate::kind::{MAX_TIME_MS, MIN_TIME_MS};
use crate::money::{usd_f64, Nano};
use crate::store::Store;
use ace_config::budget::Budget;
use ace_config::Budgets;
use std::collections::{BTreeMap, HashMap};

/// Every budget of `budgets` with an amount (`usd`), in configuration
/// order, read from `store` as of `now_ms` (Unix ms): its tenants' booked
/// cost since its period began, its state under its thresholds, when it
/// was read (`now_ms`) and when its period resets (0 for a rolling
/// window). A budget with only a token limit has no spend to read and is
/// left out.
///
/// The spend is held to the snapshot's range (0 to
/// [`ace_snapshot::MAX_SPENT_USD`]), each row counting at least 0: a store
/// edited to hold a negative cost reads it as nothing spent, never as
/// credit against the other rows.
pub fn readings(
    store: &mut dyn Store,
    budgets: &Budgets,
    now_ms: u64,
) -> anyhow::Result<Vec<ace_snapshot::Budget>> {
    let with_amount: Vec<&Budget> = budgets.list.iter().filter(|b| b.usd.is_some()).collect();
    let spent = spends(store, &with_amount, now_ms)?;
    Ok(with_amount
        .iter()
        .zip(spent)
        .map(|(b, s)| {
            let spent_usd = spent_usd(s.spent);
            ace_snapshot::Budget {
                name: b.name.clone(),
                state: b.state(spent_usd),
                spent_usd,
                read_ms: now_ms,
                resets_ms: s.resets_ms,
            }
        })
        .collect())
}

/// How far past a reading's time a row still counts in it, ms: a minute.
///
/// Proxies date their events by their own clocks and the control service
/// reads as of its own. A proxy whose clock is ahead of the service's by
/// less than this loses nothing: its rows count at once. One further ahead
/// (or a row dated ahead by hand) counts once the service's clock is
/// within this of the row's time: late by the skew less a minute, never
/// early by more than a minute, and never in a period it is not dated in.
/// A proxy behind the service's clock is covered by the filter's own
/// count (`budget_books_lag_ms`), which keeps what it booked counted until
/// a reading's time, less that lag, passes it: keep the proxies' clocks
/// within that lag of the service's (NTP keeps them within milliseconds).
pub const AHEAD_MS: u64 = 60_000;

/// One budget's spend in the period holding a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    /// Booked cost of its tenants since the period began, nano-USD.
    pub spent: Nano,
    /// When the period began, Unix ms.
    pub start_ms: u64,
    /// When it resets, Unix ms (0: a rolling window).
    pub resets_ms: u64,
}

/// The spend of each of `budgets` (in their order) in its period holding
/// `now_ms`, from the period's start to [`AHEAD_MS`] past `now_ms` and
/// before the period's end: one store query per distinct pair of bounds.
/// `now_ms` is held to the times the ledger books (2000 to 2100), so a
/// store edited to hold any time still has a period to read.
pub fn spends(
    store: &mut dyn Store,
    budgets: &[&Budget],
    now_ms: u64,
) -> anyhow::Result<Vec<Spend>> {
    let now = now_ms.clamp(MIN_TIME_MS, MAX_TIME_MS);
    let windows: Vec<(u64, u64)> = budgets.iter().map(|b| b.period.window(now)).collect();
    // From the period's start to a minute past now, and before its end
    // (a rolling window has none).
    let bounds = |(start, resets): (u64, u64)| {
        let ahead = now.saturating_add(AHEAD_MS);
        (
            start,
            if resets == 0 {
                ahead
            } else {
                ahead.min(resets)
            },
        )
    };
    let mut by_bounds: BTreeMap<(u64, u64), Vec<&str>> = BTreeMap::new();
    for (b, w) in budgets.iter().zip(&windows) {
        by_bounds
            .entry(bounds(*w))
            .or_default()
            .extend(b.tenants.iter().map(String::as_str));
    }
    let mut per_bounds: HashMap<(u64, u64), HashMap<String, Nano>> = HashMap::new();
    for ((since, until), tenants) in by_bounds {
        let got = store.spend(since, until, &tenants)?;
        per_bounds.insert((since, until), got.into_iter().collect());
    }
    Ok(budgets
        .iter()
        .zip(windows)
        .map(|(b, (start_ms, resets_ms))| {
            let spent_by = per_bounds.get(&bounds((start_ms, resets_ms)));
            let spent = b
                .tenants
                .iter()
                .map(|t| {
                    let mut held = t.clone();
                    crate::kind::storable(&mut held);
                    spent_by.and_then(|m| m.get(&held)).copied().unwrap_or(0)
                })
                .fold(0, Nano::saturating_add);
            Spend {
                spent,
                start_ms,
                resets_ms,
            }
        })
        .collect())
}

/// Booked nano-USD as a snapshot's spend: USD from 0 to
/// [`ace_snapshot::MAX_SPENT_USD`].
pub fn spent_usd(spent: Nano) -> f64 {
    usd_f64(spent.max(0)).min(ace_snapshot::MAX_SPENT_USD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::Row;
    use ace_config::budget::BudgetSettings;
    use ace_snapshot::BudgetState;

    /// 2026-12-07T01:30:00Z, a Monday.
    const NOW: u64 = 1_796_607_000_000;
    /// That day's start, and that month's.
    const DAY: u64 = 1_796_601_600_000;
    const MONTH: u64 = 1_796_083_200_000;

    fn budgets(json: &str) -> Budgets {
        let raw: Vec<BudgetSettings> = serde_json::from_str(json).expect("budget JSON");
        Budgets::validate(&raw).expect("valid budgets")
    }

    fn row(n: u32, tenant: &str, time_ms: u64, booked: Nano) -> Row {
        Row {
            event_id: format!("{n:032x}"),
            tenant: Some(tenant.into()),
            time_ms: time_ms as i64,
            booked,
            ..Row::default()
        }
    }

    /// A SQLite store in a temp dir holding `rows`.
    fn store(rows: &[Row]) -> (tempfile::TempDir, Box<dyn Store>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger.sqlite");
        let mut s = crate::store::open(&path.display().to_string()).expect("open");
        s.insert(rows).expect("insert");
        (dir, s)
    }

    /// Two tenants, each with a day budget, and a month budget for the two
    /// together; spend before a window's start is not counted, spend at
    /// its start is.
    #[test]
    fn each_budget_reads_its_tenants_spend_since_its_period_began() {
        let b = budgets(
            r#"[{"name":"a","tenants":["a"],"usd":10},
                {"name":"b","tenants":["b"],"usd":1,"soft_at":0.5},
                {"name":"tokens","tenants":["a"],"tokens_per_minute":100},
                {"name":"lab","tenants":["a","b"],"usd":20,"period":"month"}]"#,
        );
        let usd = 1_000_000_000;
        let (_dir, mut s) = store(&[
            // Last month: counted by nothing.
            row(1, "a", MONTH - 1, 100 * usd),
            // This month before today: the month budget only.
            row(2, "a", MONTH, 3 * usd),
            row(3, "b", DAY - 1, 4 * usd),
            // Today, from its first millisecond.
            row(4, "a", DAY, 2 * usd),
            row(5, "b", DAY + 1, usd / 2),
            row(6, "c", DAY + 1, 50 * usd),
            // A conflict booked apart is a booking of its own.
            Row {
                flags: crate::row::CONFLICT_FLAG.into(),
                ..row(7, "a", NOW, usd)
            },
        ]);
        let got = readings(s.as_mut(), &b, NOW).expect("readings");
        let want = [
            ("a", BudgetState::Ok, 3.0, DAY + 86_400_000),
            ("b", BudgetState::Soft, 0.5, DAY + 86_400_000),
            ("lab", BudgetState::Ok, 10.5, 1_798_761_600_000),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, (name, state, spent, resets)) in got.iter().zip(want) {
            assert_eq!(
                (
                    g.name.as_str(),
                    g.state,
                    g.spent_usd,
                    g.read_ms,
                    g.resets_ms
                ),
                (name, state, spent, NOW, resets)
            );
        }
        // Past the amount, exhausted.
        s.insert(&[row(8, "b", NOW, usd)]).expect("insert");
        let got = readings(s.as_mut(), &b, NOW).expect("readings");
        assert_eq!(
            (got[1].state, got[1].spent_usd),
            (BudgetState::Exhausted, 1.5)
        );
    }

    /// Two budgets of the same period start share one query; a rolling
    /// window reads from its length ago and never resets.
    #[test]
    fn budgets_of_one_period_start_share_a_query() {
        struct Counting(Box<dyn Store>, Vec<(u64, Vec<String>)>);
        impl Store for Counting {
            fn put_config(&mut self, id: &str, json: &str) -> anyhow::Result<()> {
                self.0.put_config(id, json)
            }
            fn configs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
                self.0.configs()
            }
            fn insert(&mut self, rows: &[Row]) -> anyhow::Result<Vec<bool>> {
                self.0.insert(rows)
            }
            fn get(&mut self, id: &str) -> anyhow::Result<Option<Row>> {
                self.0.get(id)
            }
            fn put_rejects(&mut self, r: &[crate::store::Reject]) -> anyhow::Result<()> {
                self.0.put_rejects(r)
            }
            fn rejects(&mut self) -> anyhow::Result<Vec<crate::store::Reject>> {
                self.0.rejects()
            }
            fn scan(&mut self, f: &mut dyn FnMut(Row) -> anyhow::Result<()>) -> anyhow::Result<()> {
                self.0.scan(f)
            }
            fn spend(
                &mut self,
                since: u64,
                until: u64,
                t: &[&str],
            ) -> anyhow::Result<Vec<(String, Nano)>> {
                self.1
                    .push((since, t.iter().map(|s| (*s).to_string()).collect()));
                self.0.spend(since, until, t)
            }
        }
        let b = budgets(
            r#"[{"name":"a","tenants":["a"],"usd":10},
                {"name":"b","tenants":["b","a"],"usd":10},
                {"name":"r","tenants":["a"],"usd":10,"period":"rolling","window_s":60}]"#,
        );
        let (_dir, s) = store(&[row(1, "a", NOW - 60_000, 7), row(2, "a", NOW - 60_001, 9)]);
        let mut c = Counting(s, Vec::new());
        let got = readings(&mut c, &b, NOW).expect("readings");
        assert_eq!(c.1.len(), 2, "{:?}", c.1);
        assert_eq!(c.1[0].0, DAY);
        assert_eq!(c.1[1], (NOW - 60_000, vec!["a".to_string()]));
        assert_eq!((got[2].spent_usd, got[2].resets_ms), (7e-9, 0));
        assert_eq!(got[0].spent_usd, 16e-9);
    }

    /// A stored cost out of any sense reads as 0 or the snapshot's most,
    /// never an error or a panic; a tenant's NUL matches as stored.
    #[test]
    fn absurd_stored_costs_are_held_to_the_snapshots_range() {
        let b = budgets(
            r#"[{"name":"neg","tenants":["n"],"usd":10},
                {"name":"huge","tenants":["h","nul\u0000t"],"usd":10}]"#,
        );
        let (_dir, mut s) = store(&[
            row(1, "n", NOW, -5_000_000_000),
            row(2, "h", NOW, i64::MAX),
            row(3, "h", NOW, i64::MAX),
            row(4, "nul\\u0000t", NOW, i64::MAX),
        ]);
        let got = readings(s.as_mut(), &b, NOW).expect("readings");
        assert_eq!((got[0].spent_usd, got[0].state), (0.0, BudgetState::Ok));
        assert_eq!(
            (got[1].spent_usd, got[1].state),
            (ace_snapshot::MAX_SPENT_USD, BudgetState::Exhausted)
        );
        let sums = s.spend(0, u64::MAX, &["h", "nul\0t", "h"]).expect("spend");
        assert_eq!(
            sums,
            [
                ("h".to_string(), i64::MAX),
                ("nul\\u0000t".to_string(), i64::MAX)
            ]
        );
        // Any moment has a period, even one the ledger would not book.
        assert!(spends(s.as_mut(), &[&b.list[0]], 0).is_ok());
        assert!(readings(s.as_mut(), &b, u64::MAX).is_ok());
    }
}
