//! How fast the simulator runs: requests simulated per second for ACE
//! (every request through the filter's flow) and for a gateway strategy,
//! on a synthetic trace over a three-destination fleet. `ace sim`'s own
//! timing on the Azure trace is in BENCHMARKS.md.

use ace_sim::policy::litellm::Strategy;
use ace_sim::slo::Targets;
use ace_sim::trace::{self, Shape, Trace};
use ace_sim::{Placement, PolicyKind, Simulation};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const REQUESTS: usize = 100_000;

fn simulation() -> Simulation {
    let config = br#"{"destinations":[
        {"name":"owned","cluster":"owned","tier":"inhouse","capacity":64,
         "usd_per_input_token":5e-8,"usd_per_output_token":1.5e-7,"slo_ms":1500},
        {"name":"spot","cluster":"spot","tier":"spot","capacity":40,
         "usd_per_gpu_hour":4.4,"tokens_per_second":2400,"eviction_premium":0.15},
        {"name":"api","cluster":"api","tier":"payg",
         "usd_per_input_token":6e-7,"usd_per_output_token":6e-7}],
      "allow_no_policy":true,"body":{"read":true}}"#;
    let place = |name: &str, region: &str| Placement {
        name: name.into(),
        jurisdiction: "US".into(),
        region: region.into(),
        certifications: vec![],
        models: vec!["m".into()],
        warm: vec!["m".into()],
        provider: "test".into(),
        gpus: 4,
        throughput_tps: 2400.0,
    };
    let places = [
        place("owned", "us-east-1"),
        place("spot", "us-east-2"),
        place("api", "us"),
    ];
    let mix = "[[tenants]]\nid = \"t\"\nshare = 1\ndata_class = { public = 1 }\n\
               latency_class = { interactive = 1 }\nmodel = { m = 1 }\n";
    let arrivals = trace::arrivals(
        &Trace::synthetic(1, REQUESTS, 25.0),
        Shape::Replay { speedup: 1.0 },
    );
    Simulation::new(
        config.to_vec(),
        &places,
        &[("m".into(), 1)],
        &arrivals,
        "bench mix",
        mix,
        Targets::default(),
        1,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn bench(c: &mut Criterion) {
    let sim = simulation();
    let mut g = c.benchmark_group("sim");
    g.sample_size(10);
    g.throughput(Throughput::Elements(REQUESTS as u64));
    for kind in [PolicyKind::Ace, PolicyKind::LiteLlm(Strategy::CostBased)] {
        g.bench_function(kind.name(), |b| {
            b.iter(|| {
                sim.run(kind, 1, None, &|_| {})
                    .unwrap_or_else(|e| panic!("{e}"))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
