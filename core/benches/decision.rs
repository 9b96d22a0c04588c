//! The per-request decision, native: feasibility lookup (tables) and merit
//! order (`dispatch::decide`) at 16, 64 and 256 destinations, with a mixed
//! fleet at mixed load and a few tripped or throttled destinations, as in
//! production; and the pricing step that runs when the fleet changes
//! (`Slate::refresh_one` for one destination, `Slate::refresh` for all).
//! Setup stays outside the timed loop.
//!
//! `cargo bench -p ace-core --bench decision`

// Benchmark setup indexes fixed fixtures and fails loudly if they are wrong.
#![allow(clippy::indexing_slicing, clippy::expect_used)]

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{decide, Fleet, Request, Slate};
use ace_core::health::{Health, HealthPolicy, Outcome};
use ace_core::tables::{
    encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec, Tables,
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

struct World {
    models: Vec<CostModel>,
    health: Vec<Health>,
    in_flight: Vec<u32>,
    tables: Vec<u8>,
}

fn world(n: usize) -> World {
    let tiers = Tier::ALL;
    let policy = HealthPolicy::default();
    let mut models = Vec::new();
    let mut health = Vec::new();
    let mut in_flight = Vec::new();
    for i in 0..n {
        let tier = tiers[i % tiers.len()];
        models.push(CostModel {
            tier,
            usd_per_input_token: 1e-8 * (1 + i % 7) as f64,
            usd_per_output_token: 3e-8 * (1 + i % 5) as f64,
            usd_per_gpu_hour: 2.0 + (i % 3) as f64,
            tokens_per_second: 1500.0,
            eviction_premium: 0.2,
            overage_usd_per_token: None,
            capacity: if tier == Tier::Payg {
                0
            } else {
                16 + (i % 16) as u32
            },
            knee: 0.8,
            service_ms: 900.0,
            ttft_ms: 0.0,
            cold_load_usd: 0.01,
            bias: 1.0,
        });
        let mut h = Health::default();
        if i % 11 == 3 {
            for _ in 0..3 {
                h.observe(Outcome::Failure { tenant: 0 }, 0, &policy);
            }
        }
        if i % 13 == 5 {
            h.observe(
                Outcome::Throttled {
                    retry_after_ms: Some(60_000),
                },
                0,
                &policy,
            );
        }
        health.push(h);
        in_flight.push((i * 7 % 20) as u32);
    }
    // Three attributes, a permit factor on model and a forbid on data class.
    let words = n.div_ceil(64);
    let all: Vec<u64> = (0..words)
        .map(|w| {
            if (w + 1) * 64 <= n {
                u64::MAX
            } else {
                (1u64 << (n % 64)) - 1
            }
        })
        .collect();
    let half: Vec<u64> = all.iter().map(|w| w & 0x5555_5555_5555_5555).collect();
    let mut permit_rows = vec![0u64; words]; // unknown model: nothing
    for _ in 0..8 {
        permit_rows.extend_from_slice(&all);
    }
    let mut forbid_rows = all.clone(); // unknown data class: everything
    forbid_rows.extend_from_slice(&half);
    forbid_rows.extend(std::iter::repeat_n(0, words * 2));
    let spec = TableSpec {
        destinations: (0..n)
            .map(|i| DestinationSpec {
                name: format!("d{i}"),
                cluster: format!("c{i}"),
            })
            .collect(),
        attributes: vec![
            AttributeSpec::new("data_class", &["internal", "personal_eu", "public"]),
            AttributeSpec {
                name: "model".into(),
                values: (0..8).map(|m| format!("m{m}")).collect(),
            },
            AttributeSpec::new("tenant", &["t"]),
        ],
        factors: vec![
            FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![1],
                rows: permit_rows,
            },
            FactorSpec {
                kind: FactorKind::Forbid,
                attributes: vec![0],
                rows: forbid_rows,
            },
        ],
    };
    let tables = encode(&spec).expect("bench tables encode");
    World {
        models,
        health,
        in_flight,
        tables,
    }
}

fn bench(c: &mut Criterion) {
    let policy = HealthPolicy::default();
    let mut g = c.benchmark_group("decision");
    for n in [16usize, 64, 256] {
        let w = world(n);
        let tables = Tables::load(&w.tables).expect("bench tables load");
        let fleet = Fleet {
            models: &w.models,
            health: &w.health,
            in_flight: &w.in_flight,
            live: &[],
            learned: &[],
            policy: &policy,
        };
        let req = Request::untimed(1200, 300, 0.002);
        let mut slate = Slate::new(n);
        slate.refresh(&fleet, 1_000);
        let warm = vec![u64::MAX; n.div_ceil(64)];
        let mut mask = vec![0u64; n.div_ceil(64)];
        let values = [2u32, 3, 1]; // personal_eu, m2, t
        g.bench_with_input(BenchmarkId::new("decide", n), &n, |b, _| {
            tables.feasible(&values, &mut mask).expect("lookup");
            b.iter(|| decide(black_box(&slate), black_box(&mask), &warm, black_box(&req)))
        });
        g.bench_with_input(BenchmarkId::new("lookup+decide", n), &n, |b, _| {
            b.iter(|| {
                tables
                    .feasible(black_box(&values), &mut mask)
                    .expect("lookup");
                decide(black_box(&slate), &mask, &warm, black_box(&req))
            })
        });
        g.bench_with_input(BenchmarkId::new("refresh_one", n), &n, |b, _| {
            let mut d = 0;
            b.iter(|| {
                d = (d + 7) % n;
                slate.refresh_one(black_box(&fleet), d, 1_000);
            })
        });
        g.bench_with_input(BenchmarkId::new("refresh_all", n), &n, |b, _| {
            b.iter(|| slate.refresh(black_box(&fleet), 1_000))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
