//! What a control snapshot costs a filter, at 16, 256 and 1,024
//! destinations: its size, decoding it (`ace_snapshot::decode`), and
//! decoding plus resolving it against the configuration
//! (`ace_flow::control::decode`, what each Wasm VM or each dynamic
//! fleet does once per version). Every destination reports load,
//! capacity, a price and two warm models.
//!
//! ```sh
//! cargo bench -p ace-flow --bench snapshot -- --warm-up-time 1 --measurement-time 3
//! ```

use ace_config::Config;
use ace_snapshot::{Load, Price, Report, Snapshot};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

fn fleet(n: usize) -> (Config, Vec<u8>) {
    let destinations: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"name":"dest-{i:04}","cluster":"c{i}","tier":"payg","usd_per_input_token":1e-6,"usd_per_output_token":2e-6}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"allow_no_policy":true,"control":{{"cluster":"ace_control"}},"destinations":[{}]}}"#,
        destinations.join(",")
    );
    let cfg = Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let reports = (0..n)
        .map(|i| Report {
            name: format!("dest-{i:04}"),
            load: Some(Load {
                running: 12,
                waiting: 3,
                kv_permille: 640,
                stale: false,
                scraped_ms: 0,
            }),
            capacity: Some(64),
            price: Some(Price {
                usd_per_input_token: 1.1e-6,
                usd_per_output_token: 2.2e-6,
            }),
            warm: Some(vec!["llama-3.1-70b".into(), "sql-lora".into()]),
            ..Report::default()
        })
        .collect();
    let snapshot = Snapshot {
        version: 1,
        generated_ms: 1_800_000_000_000,
        reports,
        budgets: Vec::new(),
    };
    let bytes = ace_snapshot::encode(&snapshot).unwrap_or_else(|e| panic!("{e}"));
    (cfg, bytes)
}

fn snapshot(c: &mut Criterion) {
    let mut g = c.benchmark_group("snapshot");
    for n in [16usize, 256, 1024] {
        let (cfg, bytes) = fleet(n);
        println!("snapshot of {n} destinations: {} bytes", bytes.len());
        g.bench_with_input(BenchmarkId::new("decode", n), &bytes, |b, bytes| {
            b.iter(|| ace_snapshot::decode(black_box(bytes)))
        });
        g.bench_with_input(BenchmarkId::new("decode+resolve", n), &bytes, |b, bytes| {
            b.iter(|| ace_flow::control::decode(&cfg, black_box(bytes)))
        });
    }
    g.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
