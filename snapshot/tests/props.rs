//! Every valid snapshot survives the wire unchanged; any bytes at all give
//! a snapshot or an error, never a panic.

use ace_snapshot::{
    decode, encode, Budget, BudgetState, Drain, DrainReason, Load, Price, Report, Snapshot,
    MAX_SPENT_USD, MAX_USD_PER_TOKEN,
};
use proptest::prelude::*;

fn report(i: usize) -> impl Strategy<Value = Report> {
    let load = (
        0u32..=1_000_000,
        0u32..=1_000_000,
        0u16..=1000,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(running, waiting, kv_permille, stale, scraped_ms)| Load {
            running,
            waiting,
            kv_permille,
            stale,
            // A scrape time travels only with held (stale) figures.
            scraped_ms: if stale { scraped_ms } else { 0 },
        });
    let usd = prop_oneof![
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(MAX_USD_PER_TOKEN),
        0.0..=MAX_USD_PER_TOKEN
    ];
    let price = (usd.clone(), usd).prop_map(|(i, o)| Price {
        usd_per_input_token: i,
        usd_per_output_token: o,
    });
    let drain = (
        any::<u64>(),
        prop::sample::select(DrainReason::ALL.to_vec()),
    )
        .prop_map(|(until_ms, reason)| Drain { until_ms, reason });
    // Names from one byte to the limit, multi-byte UTF-8 included.
    let warm = prop::collection::vec(
        prop_oneof!["[a-z0-9./:-]{1,40}", "\\PC{1,64}", "[é中]{85}"],
        0..6,
    );
    (
        prop::option::of(load),
        prop::option::of(prop_oneof![
            Just(0u32),
            Just(ace_snapshot::MAX_SLOTS),
            0u32..=1_000_000
        ]),
        prop::option::of(price),
        prop::option::of(0.0..=ace_snapshot::MAX_USD_PER_HOUR),
        prop::option::of(drain),
        prop::option::of(warm),
    )
        .prop_map(
            move |(load, capacity, price, usd_per_hour, drain, warm)| Report {
                name: format!("dest-{i}"),
                load,
                capacity,
                price,
                usd_per_hour,
                drain,
                warm,
            },
        )
}

fn budget(i: usize) -> impl Strategy<Value = Budget> {
    (
        prop::sample::select(BudgetState::ALL.to_vec()),
        prop_oneof![Just(0.0), Just(MAX_SPENT_USD), 0.0..=MAX_SPENT_USD],
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(move |(state, spent_usd, read_ms, resets_ms)| Budget {
            name: format!("budget-{i}"),
            state,
            spent_usd,
            read_ms,
            resets_ms,
        })
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (0usize..40, 0usize..6)
        .prop_flat_map(|(n, b)| {
            (
                (0..n).map(report).collect::<Vec<_>>(),
                (0..b).map(budget).collect::<Vec<_>>(),
            )
        })
        .prop_flat_map(|(reports, budgets)| {
            (any::<u64>(), any::<u64>()).prop_map(move |(version, generated_ms)| Snapshot {
                version,
                generated_ms,
                reports: reports.clone(),
                budgets: budgets.clone(),
            })
        })
}

proptest! {
    #[test]
    fn valid_snapshots_round_trip(s in snapshot()) {
        let bytes = encode(&s).unwrap();
        prop_assert_eq!(ace_snapshot::encoded_len(&s.reports, &s.budgets), bytes.len());
        prop_assert_eq!(decode(&bytes).unwrap(), s);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        let mut framed = b"ACSN\x01\x00\x00\x00".to_vec();
        framed.extend_from_slice(&bytes);
        let _ = decode(&framed);
        // With the budgets flag: a section read from whatever follows.
        framed[6] = 1;
        let _ = decode(&framed);
    }
}
