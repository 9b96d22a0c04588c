//! From a figure back to the requests behind it.
//!
//! Every figure in a report is a sum over rows selected by tenant, tier,
//! destination and window; [`rows`] selects the same rows and gives each
//! one's ids and figures, so a figure can be re-added by hand.
//!
//! [`table`] prints them for a terminal, with every name from the log
//! escaped ([`crate::text::terminal`]).

use crate::money::usd;
use crate::report::Report;
use crate::row::Row;
use crate::split::Split;
use crate::store::Store;
use crate::text::terminal;
use crate::window::{self, Rules};

/// Which rows to trace (all fields optional; all given must match).
#[derive(Debug, Clone, Default)]
pub struct Select {
    pub tenant: Option<String>,
    pub tier: Option<String>,
    pub destination: Option<String>,
    /// A window start, ms (as the report prints it).
    pub window_ms: Option<i64>,
    /// Only rows in forfeited windows.
    pub forfeited: bool,
    /// Only rows whose logged costs disagree with the ledger's.
    pub flagged: bool,
}

/// One traced row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Traced {
    pub event_id: String,
    pub request_id: Option<String>,
    pub time_ms: i64,
    pub tenant: String,
    pub window_ms: i64,
    pub destination: Option<String>,
    pub tier: Option<String>,
    pub booked: i64,
    pub counterfactual: Option<i64>,
    pub savings: Split,
    pub forfeited: Option<String>,
    pub flags: String,
}

/// The selected rows, with the totals of booked cost and savings.
pub fn rows(
    store: &mut dyn Store,
    report: &Report,
    rules: &Rules,
    sel: &Select,
) -> anyhow::Result<(Vec<Traced>, i64, Split)> {
    let verdicts = report.verdicts();
    let mut out = Vec::new();
    let (mut booked, mut savings) = (0, Split::default());
    store.scan(&mut |r: Row| {
        let key = window::key(&r, rules);
        let forfeited = verdicts.get(&key).cloned().flatten();
        let keep = sel.tenant.as_ref().is_none_or(|t| *t == key.0)
            && sel.tier.as_ref().is_none_or(|t| r.tier.as_ref() == Some(t))
            && sel
                .destination
                .as_ref()
                .is_none_or(|d| r.destination.as_ref() == Some(d))
            && sel.window_ms.is_none_or(|w| w == key.1)
            && (!sel.forfeited || forfeited.is_some())
            && (!sel.flagged || !r.flags.is_empty());
        if keep {
            let split = Split::of(&r);
            booked = r.booked.saturating_add(booked);
            savings.add(&split);
            out.push(Traced {
                event_id: r.event_id,
                request_id: r.request_id,
                time_ms: r.time_ms,
                tenant: key.0,
                window_ms: key.1,
                destination: r.destination,
                tier: r.tier,
                booked: r.booked,
                counterfactual: r.counterfactual,
                savings: split,
                forfeited,
                flags: r.flags,
            });
        }
        Ok(())
    })?;
    Ok((out, booked, savings))
}

/// The traced rows as a terminal table, with their totals.
pub fn table(rows: &[Traced], booked: i64, savings: &Split) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<32} {:<38} {:<14} {:<18} {:>14} {:>14} {:>14}  forfeited",
        "event_id", "request_id", "tenant", "destination", "booked", "payg", "savings"
    );
    for t in rows {
        let _ = writeln!(
            s,
            "{:<32} {:<38} {:<14} {:<18} {:>14} {:>14} {:>14}  {}",
            terminal(&t.event_id),
            terminal(t.request_id.as_deref().unwrap_or("-")),
            terminal(&t.tenant),
            terminal(t.destination.as_deref().unwrap_or("(refused)")),
            usd(t.booked),
            t.counterfactual.map_or("-".into(), usd),
            usd(t.savings.total()),
            terminal(t.forfeited.as_deref().unwrap_or(""))
        );
    }
    let _ = writeln!(
        s,
        "{} requests: booked ${}, savings ${} (utilisation ${}, arbitrage ${}, model routing ${}, \
         caching ${})",
        rows.len(),
        usd(booked),
        usd(savings.total()),
        usd(savings.utilisation),
        usd(savings.arbitrage),
        usd(savings.routing),
        usd(savings.caching)
    );
    s
}
