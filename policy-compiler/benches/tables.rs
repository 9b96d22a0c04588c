//! Policy-table benchmarks (numbers in BENCHMARKS.md, "Policy tables").
//!
//! - `lookup/{64,1024}`: `Tables::feasible` for one request (every factor's
//!   row found and combined), over the example policies compiled for a
//!   synthetic fleet of that many destinations. Goal at 64: at most 50 ns.
//! - `compile/256`: loading and compiling the example policies for 256
//!   destinations whose request space is 10^6 known combinations. Goal: at
//!   most 10 s. The table size is printed (goal: at most 1 MiB).
//! - `cedar/256`: Cedar's own authorizer deciding one request for all 256
//!   destinations, and one (request, destination) pair, for scale.
//!
//! Setup (generating and compiling fleets) stays outside the timed loops.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use ace_core::tables::Tables;
use ace_policy::verify::Rng;
use ace_policy::{compile, Project, Sources};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};

const TENANTS: usize = 100;
const MODELS: usize = 100;

/// A fleet of `n` destinations; request space 100 tenants x 5 data classes
/// x 4 latency classes x 5 TP degrees x 100 models = 10^6.
fn fleet(n: usize) -> String {
    let mut r = Rng(n as u64);
    let mut s = String::from("version = 1\n");
    s += "[request.data_class]\nvalues = [\"public\", \"internal\", \"confidential\", \"personal_eu\", \"phi\"]\n";
    s += "[request.latency_class]\nvalues = [\"interactive\", \"standard\", \"batch\", \"offline\"]\n";
    s += "[request.tp_degree]\nvalues = [1, 2, 4, 8, 16]\n";
    for t in 0..TENANTS {
        let id = if t == 0 {
            "northbank".to_string()
        } else {
            format!("tenant-{t}")
        };
        let _ = writeln!(s, "[[tenants]]\nid = \"{id}\"");
    }
    for m in 0..MODELS {
        let _ = writeln!(
            s,
            "[[models]]\nid = \"model-{m}\"\nvram_gb = {}",
            [16, 48, 140, 250, 810][m % 5]
        );
    }
    let tiers = ["inhouse", "reserved", "spot", "ondemand", "payg"];
    let juris = ["EU", "US", "SG", "RU"];
    for d in 0..n {
        let models: Vec<String> = (0..MODELS)
            .filter(|_| r.below(4) == 0)
            .map(|m| format!("model-{m}"))
            .collect();
        let j = juris[r.below(4) as usize];
        let region = if j == "RU" {
            "ru-central-1".to_string()
        } else {
            format!("{j}-{}", r.below(3))
        };
        let certs = if r.below(3) == 0 {
            "[\"hipaa_baa\"]"
        } else {
            "[]"
        };
        let _ = writeln!(
            s,
            "[[destinations]]\nname = \"dest-{d}\"\ncluster = \"cluster_{d}\"\nprovider = \"p\"\ntier = \"{}\"\n\
             jurisdiction = \"{j}\"\nregion = \"{region}\"\naccelerator = \"h100\"\nvram_gb = {}\n\
             interconnect = \"{}\"\nmodels = {models:?}\ncertifications = {certs}",
            tiers[r.below(5) as usize],
            [24, 80, 160, 640, 1280][r.below(5) as usize],
            ["nvlink", "pcie"][r.below(2) as usize],
        );
    }
    s
}

fn sources(n: usize) -> Sources {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut s = Sources::read_dir(&dir).unwrap();
    s.manifest = (PathBuf::from("bench-fleet.toml"), fleet(n));
    s
}

/// Request index vectors with every value known, spread over the space.
fn requests(p: &Project, count: usize) -> Vec<Vec<u32>> {
    let mut r = Rng(7);
    (0..count)
        .map(|_| {
            p.attributes
                .iter()
                .map(|a| 1 + r.below(a.len() as u64) as u32)
                .collect()
        })
        .collect()
}

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

criterion_group!(benches, lookup, compile_256, cedar_256);
criterion_main!(benches);
