//! Properties over generated events: the four-way split always sums to the
//! total; ingest is idempotent under repetition, reordering and truncation
//! (the report is the same as for one clean ingest).

use crate::common;
use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::report::Report;
use ace_ledger::split::Split;
use ace_ledger::window::Rules;
use proptest::prelude::*;

/// Time offset, tenant, destination, tokens in and out, status, SLO met,
/// warm, served by the small model, overage.
type Parts = (
    u64,
    u8,
    Option<usize>,
    u32,
    u32,
    u32,
    bool,
    bool,
    bool,
    bool,
);

const DESTS: [(&str, &str); 5] = [
    ("owned", "inhouse"),
    ("reserved", "reserved"),
    ("spot", "spot"),
    ("payg-a", "payg"),
    ("payg-b", "payg"),
];

/// One event line from generated parts, under configuration `id`.
#[allow(clippy::too_many_arguments)]
fn line(
    id: &str,
    n: u32,
    t: u64,
    tenant: u8,
    dest: Option<usize>,
    tin: u32,
    tout: u32,
    status: u32,
    slo_met: bool,
    warm: bool,
    small: bool,
    overage: bool,
) -> String {
    let (d, tier) = match dest.and_then(|i| DESTS.get(i)) {
        Some((d, t)) => (format!("\"{d}\""), format!("\"{t}\"")),
        None => ("null".to_string(), "null".to_string()),
    };
    let overage = overage && dest == Some(1);
    serde_json::json!({
        "schema": "ace.event/2",
        "event_id": format!("{n:032x}"),
        "config": id,
        "request_id": format!("r-{n}"),
        "time_ms": 1_796_342_400_000u64 + t,
        "tenant": format!("t{tenant}"),
        "data_class": null,
        "latency_class": if n.is_multiple_of(2) { "interactive" } else { "batch" },
        "model_requested": "big",
        "model_served": if small { "small" } else { "big" },
        "destination": serde_json::from_str::<serde_json::Value>(&d).unwrap_or_default(),
        "tier": serde_json::from_str::<serde_json::Value>(&tier).unwrap_or_default(),
        "tokens_in": tin,
        "tokens_out": tout,
        "tokens_estimated": false,
        "status": status,
        "latency_ms": 50,
        "slo_ms": 1000,
        "slo_met": slo_met,
        "marginal_usd": 0.0,
        "counterfactual_usd": 0.0,
        "reason": "cheapest",
        "warm": dest.map(|_| warm),
        "overage": overage,
        "usage_capped": false,
        "cached": n.is_multiple_of(7),
    })
    .to_string()
}

fn events() -> impl Strategy<Value = Vec<Parts>> {
    prop::collection::vec(
        (
            0u64..1_800_000,
            0u8..3,
            prop::option::weighted(0.9, 0usize..5),
            0u32..5000,
            0u32..5000,
            prop::sample::select(vec![200u32, 200, 200, 503, 429]),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        1..60,
    )
}

fn report_of(chunks: &[Vec<u8>]) -> Report {
    let dir = tempfile::tempdir().expect("tmp");
    let mut ledger =
        Ledger::open(&dir.path().join("l.sqlite").display().to_string()).expect("open");
    ledger
        .register(&common::golden_config(), "golden")
        .expect("register");
    for (i, c) in chunks.iter().enumerate() {
        ledger
            .ingest_bytes(&format!("part-{i}"), c, &Options::default())
            .expect("ingest");
    }
    ledger.report(&Rules::default()).expect("report")
}

fn id() -> String {
    ace_ledger::configs::config_id(&common::golden_config())
}

fn lines(evs: &[Parts]) -> Vec<String> {
    let id = id();
    evs.iter()
        .enumerate()
        .map(|(n, e)| {
            line(
                &id,
                n as u32 + 1,
                e.0,
                e.1,
                e.2,
                e.3,
                e.4,
                e.5,
                e.6,
                e.7,
                e.8,
                e.9,
            )
        })
        .collect()
}

fn joined(ls: &[String]) -> Vec<u8> {
    ls.iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_split_sums_to_the_total_and_ingest_is_idempotent(
        evs in events(),
        cut in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let ls = lines(&evs);
        let clean = report_of(&[joined(&ls)]);
        // The split sums to the total, earned plus forfeited to the total,
        // and the total is counterfactual minus booked on served requests.
        for s in [&clean.savings, &clean.earned, &clean.forfeited] {
            prop_assert_eq!(s.total(), s.utilisation + s.arbitrage + s.routing + s.caching);
        }
        prop_assert_eq!(clean.savings.total(), clean.counterfactual - clean.booked_served);
        let mut sum = Split::default();
        sum.add(&clean.earned);
        sum.add(&clean.forfeited);
        prop_assert_eq!(sum, clean.savings);

        // Repetition: the same file twice.
        let twice = report_of(&[joined(&ls), joined(&ls)]);
        prop_assert_eq!(&twice, &clean);

        // Reordering: the lines shuffled (a deterministic permutation).
        let mut shuffled = ls.clone();
        let n = shuffled.len();
        let mut x = seed | 1;
        for i in (1..n).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let reordered = report_of(&[joined(&shuffled)]);
        prop_assert_eq!(&reordered, &clean);

        // Truncation: the file cut anywhere (mid-line included), then whole.
        let all = joined(&ls);
        let at = ((all.len() as f64) * cut) as usize;
        let truncated = report_of(&[all[..at].to_vec(), all.clone()]);
        prop_assert_eq!(&truncated, &clean);
    }
}
