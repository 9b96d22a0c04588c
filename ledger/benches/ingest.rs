//! Ledger throughput: access-log lines booked per second into SQLite, and
//! the time to report over the booked events.
//!
//! `cargo bench -p ace-ledger --bench ingest`. Events per ingest
//! iteration: `ACE_LEDGER_BENCH_EVENTS` (default 200,000); events in the
//! store the report reads: `ACE_LEDGER_REPORT_EVENTS` (default 1,000,000;
//! booked in chunks, so ten million fit in memory).

use ace_ledger::book::Ledger;
use ace_ledger::ingest::Options;
use ace_ledger::window::Rules;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const CONFIG: &str = r#"{"allow_no_policy": true, "destinations": [
 {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 8,
  "usd_per_input_token": 1e-8, "usd_per_output_token": 1e-8, "usd_per_gpu_hour": 2.0, "slo_ms": 1000},
 {"name": "spot", "cluster": "spot", "tier": "spot", "usd_per_gpu_hour": 3.6, "tokens_per_second": 1000},
 {"name": "payg", "cluster": "payg", "tier": "payg", "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5}
]}"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Realistic event lines `from..to`: three destinations, 20 tenants, one
/// request every 10 ms.
fn log(from: usize, to: usize, id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity((to - from) * 620);
    let dests = [("owned", "inhouse"), ("spot", "spot"), ("payg", "payg")];
    for i in from..to {
        let (d, t) = dests[i % 3];
        let line = format!(
            "{{\"schema\":\"ace.event/2\",\"event_id\":\"{i:032x}\",\"config\":\"{id}\",\
             \"request_id\":\"2f1c9a54-0d7e-4c36-9d55-{i:012x}\",\"time_ms\":{},\"tenant\":\"tenant-{}\",\
             \"data_class\":\"public\",\"latency_class\":\"interactive\",\"model_requested\":\"llama-3-70b\",\
             \"model_served\":\"llama-3-70b\",\"destination\":\"{d}\",\"tier\":\"{t}\",\"tokens_in\":{},\
             \"tokens_out\":{},\"tokens_estimated\":false,\"status\":200,\"latency_ms\":{},\"slo_ms\":1000,\
             \"slo_met\":true,\"marginal_usd\":0.001,\"counterfactual_usd\":0.002,\"reason\":\"cheapest\",\
             \"warm\":true,\"overage\":false,\"usage_capped\":false,\"cached\":false}}\n",
            1_796_342_400_000u64 + i as u64 * 10,
            i % 20,
            100 + i % 900,
            50 + i % 400,
            20 + i % 700
        );
        out.extend_from_slice(line.as_bytes());
    }
    out
}

fn bench(c: &mut Criterion) {
    let n = env("ACE_LEDGER_BENCH_EVENTS", 200_000);
    let id = ace_ledger::configs::config_id(CONFIG.as_bytes());
    let bytes = log(0, n, &id);
    let mut g = c.benchmark_group("ledger");
    g.sample_size(10);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(format!("ingest {n} events into SQLite"), |b| {
        b.iter_with_setup(
            || {
                let dir = tempfile::tempdir().expect("tmp");
                let mut l =
                    Ledger::open(&dir.path().join("l.sqlite").display().to_string()).expect("open");
                l.register(CONFIG.as_bytes(), "bench").expect("config");
                (dir, l)
            },
            |(dir, mut l)| {
                let s = l
                    .ingest_bytes("bench", &bytes, &Options::default())
                    .expect("ingest");
                assert_eq!(s.new as usize, n);
                drop(dir);
            },
        )
    });
    drop(bytes);
    let m = env("ACE_LEDGER_REPORT_EVENTS", 1_000_000);
    let dir = tempfile::tempdir().expect("tmp");
    let mut l = Ledger::open(&dir.path().join("l.sqlite").display().to_string()).expect("open");
    l.register(CONFIG.as_bytes(), "bench").expect("config");
    const CHUNK: usize = 500_000;
    for from in (0..m).step_by(CHUNK) {
        let chunk = log(from, (from + CHUNK).min(m), &id);
        l.ingest_bytes("bench", &chunk, &Options::default())
            .expect("ingest");
    }
    g.throughput(Throughput::Elements(m as u64));
    g.bench_function(format!("report over {m} events in SQLite"), |b| {
        b.iter(|| l.report(&Rules::default()).expect("report"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
