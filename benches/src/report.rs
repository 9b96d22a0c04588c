//! The summary after the runs: each variant's median over rounds, and the
//! paired differences between variants that price one part of ACE (its
//! own code, its host calls, the access log, the tables, the body).

use crate::bench::Row;
use crate::variant::{Variant, ACE_BASELINE};

/// Median of `v` (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Print the medians over rounds (when there are several) and ACE's share
/// over the no-op filter.
pub fn summarise(rounds: &[Vec<Row>], medians: bool) {
    let names: Vec<String> = rounds
        .first()
        .map(|r| r.iter().map(|x| x.name.clone()).collect())
        .unwrap_or_default();
    let column = |name: &str, f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| r.iter().find(|x| x.name == name).map(f))
            .collect()
    };
    if medians {
        println!("\nmedian of {} rounds:", rounds.len());
        for n in &names {
            println!(
                "{:<24} {:>10.0} {:>10.0} {:>10.0} {:>8} {:>16.1}",
                n,
                median(column(n, &|r| r.stats.rps)),
                median(column(n, &|r| r.stats.p50_us)),
                median(column(n, &|r| r.stats.p99_us)),
                "",
                median(column(n, &|r| r.cpu_us)),
            );
        }
    }
    use Variant::{
        Ace, AceDyn, DynFloor, Floor, Minimal, Noop, Plain, Shipped, ShippedDyn, ShippedDynNoBody,
        ShippedDynNoLog, ShippedDynNoTables, ShippedNoBody, ShippedNoLog, ShippedNoTables,
        ShippedPlain,
    };
    for (of, over, title) in [
        (
            Ace.label(),
            Noop.label(),
            "ACE's own share over the no-op filter",
        ),
        (
            AceDyn.label(),
            Noop.label(),
            "ACE as a dynamic module, over the no-op Wasm filter",
        ),
        (
            AceDyn.label(),
            Plain.label(),
            "ACE as a dynamic module, over plain Envoy",
        ),
        (AceDyn.label(), Ace.label(), "ACE, dynamic module over Wasm"),
        (Ace.label(), ACE_BASELINE, "ACE over the baseline build"),
        (
            Floor.label(),
            Noop.label(),
            "ACE's host calls alone, over the no-op filter",
        ),
        (
            Ace.label(),
            Floor.label(),
            "ACE over its host calls alone (ACE's own code)",
        ),
        (
            Noop.label(),
            Minimal.label(),
            "the SDK's no-op over the minimal filter",
        ),
        (
            DynFloor.label(),
            Noop.label(),
            "ACE's host calls from a dynamic module, over the no-op Wasm filter",
        ),
        (
            DynFloor.label(),
            Floor.label(),
            "ACE's host calls, dynamic module over Wasm",
        ),
        (
            Shipped.label(),
            ShippedPlain.label(),
            "ACE Wasm as shipped, over plain Envoy with its access log",
        ),
        (
            ShippedDyn.label(),
            ShippedPlain.label(),
            "ACE dynamic module as shipped, over plain Envoy with its access log",
        ),
        (
            Shipped.label(),
            ShippedNoLog.label(),
            "the event access log, Wasm",
        ),
        (
            ShippedDyn.label(),
            ShippedDynNoLog.label(),
            "the event access log, dynamic module",
        ),
        (
            ShippedNoLog.label(),
            ShippedNoTables.label(),
            "the policy tables, Wasm",
        ),
        (
            ShippedDynNoLog.label(),
            ShippedDynNoTables.label(),
            "the policy tables, dynamic module",
        ),
        (
            ShippedNoTables.label(),
            ShippedNoBody.label(),
            "reading the body, Wasm",
        ),
        (
            ShippedDynNoTables.label(),
            ShippedDynNoBody.label(),
            "reading the body, dynamic module",
        ),
        (
            ShippedNoBody.label(),
            Plain.label(),
            "the rest (headers, decision, claim, response, event), Wasm, over plain Envoy",
        ),
        (
            ShippedDynNoBody.label(),
            Plain.label(),
            "the rest, dynamic module, over plain Envoy",
        ),
    ] {
        share(rounds, of, over, title, medians);
    }
}

/// Print the paired difference `of` − `against`, per round and its median.
pub fn share(rounds: &[Vec<Row>], of: &str, against: &str, title: &str, medians: bool) {
    let diff = |f: &dyn Fn(&Row) -> f64| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| {
                let base = r.iter().find(|x| x.name == against)?;
                let ace = r.iter().find(|x| x.name == of)?;
                Some(f(ace) - f(base))
            })
            .collect()
    };
    let p50 = diff(&|r| r.stats.p50_us);
    if p50.is_empty() {
        return;
    }
    let p99 = diff(&|r| r.stats.p99_us);
    let cpu = diff(&|r| r.cpu_us);
    // Requests per second as a share of the reference's, per round.
    let rps: Vec<f64> = rounds
        .iter()
        .filter_map(|r| {
            let base = r.iter().find(|x| x.name == against)?;
            let ace = r.iter().find(|x| x.name == of)?;
            Some(100.0 * ace.stats.rps / base.stats.rps)
        })
        .collect();
    let instructions = median(diff(&|r| r.instructions));
    if instructions.is_finite() {
        println!("\n{title}: {instructions:+.0} Envoy instructions per request (callgrind)");
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:+.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if medians {
        println!(
            "\n{title}, median of {} paired rounds: p50 {:+.0} µs (rounds: {}), p99 {:+.0} µs, Envoy CPU {:+.1} µs per request (rounds: {}), requests/s {:.0} % (rounds: {})",
            p50.len(),
            median(p50.clone()),
            list(&p50),
            median(p99),
            median(cpu.clone()),
            list(&cpu),
            median(rps.clone()),
            rps.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
    } else {
        println!(
            "\n{title}: p50 {:+.0} µs, p99 {:+.0} µs, Envoy CPU {:+.1} µs per request, requests/s {:.0} %",
            p50[0], p99[0], cpu[0], rps[0]
        );
    }
}
