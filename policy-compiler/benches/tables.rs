//! Policy-table benchmarks (numbers in BENCHMARKS.md, "Policy tables").
//!
//! - `lookup/{64,1024}`: `Tables::feasible` for one request (every factor's
//!   row found and combined), over the example policies compiled for a
//!   synthetic fleet of that many destinations. Goal at 64: at most 50 ns.
//! - `compile/256`: loading and compiling the example policies for 256
//!   destinations whose request space is 10^6 known combinations. Goal: at
//!   most 10 s. The table size is printed (goal: at most 1 MiB).
//! - `verify/256`: the independent verify (`ace_policy::oracle` plus
//!   `verify::verify`) of those tables, sampled with its stated coverage.
//!   Goal: under a minute.
//! - `cedar/256`: Cedar's own authorizer deciding one request for all 256
//!   destinations, and one (request, destination) pair, for scale.
//!
//! Setup (generating and compiling fleets) stays outside the timed loops.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ace_core::tables::Tables;
use ace_policy::{compile, Project};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

mod support;
use support::{requests, sources};

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    for n in [64usize, 1024] {
        let project = Project::load(sources(n)).unwrap();
        let compiled = compile(&project).unwrap();
        let tables = Tables::load(&compiled.bytes).unwrap();
        let reqs = requests(&project, 1024);
        let mut out = vec![0u64; tables.words()];
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) & 1023;
                tables.feasible(black_box(&reqs[i]), &mut out).unwrap();
                black_box(&out);
            })
        });
    }
    g.finish();
}

fn compile_256(c: &mut Criterion) {
    let src = sources(256);
    let project = Project::load(src.clone()).unwrap();
    let space: u64 = project.attributes.iter().map(|a| a.len() as u64).product();
    let compiled = compile(&project).unwrap();
    eprintln!(
        "compile/256: {} destinations, request space {} known combinations, {} factors, {} Cedar evaluations, table {} bytes",
        project.destinations.len(),
        space,
        compiled.factors.len(),
        compiled.evaluations,
        compiled.bytes.len()
    );
    let mut g = c.benchmark_group("compile");
    g.sample_size(10);
    g.bench_function("256", |b| {
        b.iter(|| {
            let p = Project::load(src.clone()).unwrap();
            black_box(compile(&p).unwrap().bytes.len())
        })
    });
    g.finish();
}

fn verify_256(c: &mut Criterion) {
    let src = sources(256);
    let project = Project::load(src.clone()).unwrap();
    let compiled = compile(&project).unwrap();
    let mut g = c.benchmark_group("verify");
    g.sample_size(10);
    g.bench_function("256", |b| {
        b.iter(|| {
            let oracle = ace_policy::oracle::Oracle::load(&src).unwrap();
            let report = ace_policy::verify::verify(&oracle, &compiled.bytes).unwrap();
            assert_eq!(report.mismatch_count, 0);
            black_box(report.decisions)
        })
    });
    g.finish();
}

fn cedar_256(c: &mut Criterion) {
    let project = Project::load(sources(256)).unwrap();
    let reqs = requests(&project, 64);
    let mut g = c.benchmark_group("cedar");
    g.sample_size(20);
    let mut i = 0usize;
    g.bench_function("request_x_256_destinations", |b| {
        b.iter(|| {
            i = (i + 1) & 63;
            let ctx = project.context(&reqs[i]).unwrap();
            let mut allowed = 0;
            for d in 0..256 {
                let r = project.request_with(&reqs[i], d, ctx.clone()).unwrap();
                allowed += usize::from(project.allows(&r));
            }
            black_box(allowed)
        })
    });
    let prepared: Vec<_> = (0..64)
        .map(|k| project.request(&reqs[k], k * 3 % 256).unwrap())
        .collect();
    g.bench_function("one_authorization", |b| {
        b.iter(|| {
            i = (i + 1) & 63;
            black_box(project.allows(&prepared[i]))
        })
    });
    g.finish();
}

criterion_group!(benches, lookup, compile_256, verify_256, cedar_256);
criterion_main!(benches);
