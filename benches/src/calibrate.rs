//! `--calibrate`: the price of Envoy's host calls. The no-op filter makes
//! [`CALLS`] calls of one kind per request, against the plain no-op, so the
//! difference in Envoy CPU (and instructions, under `--callgrind`) per
//! request over [`CALLS`] is the cost of one call.

use crate::bench::Bench;
use crate::variant::Request;
use ace_harness::envoy::EnvoyBuilder;
use std::path::Path;

/// Host calls per request in a calibration variant.
pub const CALLS: u32 = 20;

/// The host-call kinds the no-op filter can repeat (its configuration
/// `KIND N`).
pub const KINDS: [&str; 10] = [
    "header_found",
    "header_missing",
    "header_pairs",
    "header_set",
    "property",
    "clear_route_cache",
    "shared_get",
    "shared_set",
    "metric",
    "time",
];

/// Run the calibration with `bench`: `base` is the variants' Envoy (one
/// worker, the upstream's clusters), `fixed_route` the route to the
/// upstream, `noop` the no-op filter's build; prints a row per kind and
/// then the per-call differences.
pub fn run(
    bench: &Bench,
    base: impl Fn() -> EnvoyBuilder,
    fixed_route: &serde_json::Value,
    noop: &Path,
) -> Result<(), String> {
    let mut variants = vec![(
        "no-op".to_string(),
        base().route(fixed_route.clone()).wasm_filter(noop, ""),
    )];
    for k in KINDS {
        variants.push((
            format!("{k} x{CALLS}"),
            base()
                .route(fixed_route.clone())
                .wasm_filter(noop, &format!("{k} {CALLS}")),
        ));
    }
    let mut rows = Vec::new();
    for (name, builder) in variants {
        let running = bench.start(name, &builder, Request::Bench)?;
        rows.push(bench.run(&running)?);
    }
    if let Some(base) = rows.first() {
        println!("\nEnvoy CPU per host call (difference over the no-op, / {CALLS}):");
        for r in rows.iter().skip(1) {
            let instructions = (r.instructions - base.instructions) / f64::from(CALLS);
            println!(
                "  {:<24} {:>6.2} µs{}",
                r.name,
                (r.cpu_us - base.cpu_us) / f64::from(CALLS),
                if instructions.is_finite() {
                    format!(", {instructions:+.0} instructions")
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
