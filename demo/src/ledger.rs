//! The end of the demo: the ledger books Envoy's access log of ACE events,
//! and says of each tenant window why it kept or forfeited its savings.
//!
//! The ledger counts savings per tenant per window, and only in windows
//! that held its bounds (served fraction, SLO attainment per latency
//! class, cache false-hit rate: `ace_ledger::window`). The demo's windows
//! are [`WINDOW_MS`] long, and a scene waits for a window of its own where
//! it needs one ([`window_for`]): the burst of scene 1, which serves every
//! request, in one window, and the failing reserved block of scenes 2-4,
//! whose 503s reach clients, in the next; scene 7 apart from scene 5, whose
//! tenants it shares. So the ledger's verdicts on real traffic show both
//! sides of the rule, a window that earned its savings and one that
//! forfeited them, each with the figures of every bound.

use ace_cli::ingest_summary::print_summary;
use ace_cli::outln;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::report::Windows;
use ace_ledger::window::Rules;
use anyhow::Context;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The length of the ledger's windows in the demo, ms: short, so that the
/// scenes can start windows of their own without the demo waiting long.
pub const WINDOW_MS: i64 = 10_000;

/// How far past a window's start the demo begins, so that no event of it
/// is stamped before the start (Envoy reads the same clock).
const MARGIN_MS: i64 = 100;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A moment after some traffic: the traffic's events are stamped no
/// later, so they fall in this moment's window or an earlier one.
#[derive(Debug, Clone, Copy)]
pub struct Mark(i64);

impl Mark {
    pub fn now() -> Mark {
        Mark(now_ms())
    }
}

/// How long to wait at `now_ms` before traffic whose events are stamped
/// over `takes_ms`, so that they fall in one window, past its first
/// [`MARGIN_MS`], and in a later window than `after`'s.
fn wait_ms(now_ms: i64, takes_ms: i64, after: Option<i64>) -> i64 {
    let into = now_ms.rem_euclid(WINDOW_MS);
    let start = now_ms - into;
    let next = WINDOW_MS - into + MARGIN_MS;
    if after.is_some_and(|m| m >= start) {
        next
    } else if into < MARGIN_MS {
        MARGIN_MS - into
    } else if WINDOW_MS - into >= takes_ms {
        0
    } else {
        next
    }
}

/// Wait, if need be, so that `what`, traffic whose events are stamped
/// over `takes`, falls in one window, and (with `after`) in a later one
/// than the traffic before `after`. Says why when it waits.
pub fn window_for(what: &str, takes: Duration, after: Option<Mark>) {
    let takes = i64::try_from(takes.as_millis()).unwrap_or(WINDOW_MS);
    let ms = wait_ms(now_ms(), takes, after.map(|m| m.0));
    if ms <= 0 {
        return;
    }
    outln!(
        "  (the ledger counts savings per tenant per {} s window: waiting {:.1} s so that {what})",
        WINDOW_MS / 1000,
        ms as f64 / 1000.0
    );
    std::thread::sleep(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
}

/// The end of the demo: book what each part of the demo served, from
/// Envoy's real access log, in a throwaway ledger, and print the report
/// with every window and why it kept or forfeited its savings. Each part
/// is (name, the plugin configuration Envoy loaded, the log's lines).
pub fn summary(parts: &[(&str, &serde_json::Value, &Vec<String>)]) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("ace-demo-ledger-")
        .tempdir()
        .context("cannot make a temp dir for the demo's ledger")?;
    let mut ledger = Ledger::open(&dir.path().join("ledger.sqlite").display().to_string())?;
    outln!("\nthe ledger: Envoy's access log of ACE events, booked and re-priced");
    for (name, config, lines) in parts {
        let id = ledger.register(config.to_string().as_bytes(), name)?;
        let opts = Options {
            v1_config: Some(id),
            ..Options::default()
        };
        let mut bytes = lines.join("\n").into_bytes();
        bytes.push(b'\n');
        print_summary(&ledger.ingest_bytes(name, &bytes, &opts)?);
    }
    let rules = Rules {
        window_ms: WINDOW_MS,
        ..Rules::default()
    };
    outln!(
        "a tenant's {} s window keeps its savings only when it held every bound: served\n\
         fraction >= {}, SLO attainment >= {} in each latency class, and at most {} of the\n\
         cache hits checked against the upstream wrong (past it, the caching savings go);\n\
         each window below names the bounds it held and failed, with its figures",
        WINDOW_MS / 1000,
        rules.min_served,
        rules.min_slo,
        rules.max_false_hit
    );
    outln!("\n{}", ledger.report(&rules)?.table_listing(Windows::Every));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_waits_only_to_fit_in_a_window_after_the_mark() {
        let start = 1_796_668_440_000; // a window's start
                                       // Room enough: no wait.
        assert_eq!(wait_ms(start + 2_000, 3_000, None), 0);
        // 2 s left for 3 s of traffic: to the next start, past the margin.
        assert_eq!(wait_ms(start + 8_000, 3_000, None), 2_000 + MARGIN_MS);
        // Just after a start: only the margin.
        assert_eq!(wait_ms(start + 40, 3_000, None), MARGIN_MS - 40);
        // The mark's window is this one: the next.
        assert_eq!(
            wait_ms(start + 2_000, 0, Some(start + 1_500)),
            8_000 + MARGIN_MS
        );
        // The mark's window is over: no wait.
        assert_eq!(wait_ms(start + 2_000, 0, Some(start - 1)), 0);
        // Whatever it waits, the traffic starts past the margin, fits, and
        // is in a later window than the mark.
        for now in (start..start + WINDOW_MS).step_by(997) {
            for after in [None, Some(now - 5_000), Some(now)] {
                let at = now + wait_ms(now, 3_000, after);
                let into = at.rem_euclid(WINDOW_MS);
                assert!(
                    into >= MARGIN_MS && WINDOW_MS - into >= 3_000,
                    "{now} {after:?}"
                );
                if let Some(m) = after {
                    assert!(at - into > m, "{now} {after:?}: the mark's window");
                }
            }
        }
    }
}
