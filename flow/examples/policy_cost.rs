//! The policy path of one request, N times (for callgrind): resolve the
//! attributes from a header map, then the feasibility lookup.
//!
//! ```sh
//! cargo run --release -p ace-cli -- plugin-config policies > /tmp/fleet.json
//! cargo build --release -p ace-flow --example policy_cost
//! valgrind --tool=callgrind target/release/examples/policy_cost /tmp/fleet.json 1000
//! ```
use ace_config::Config;
use ace_core::tables::Tables;
use ace_flow::attributes::{no_trusted, resolve};
use ace_flow::headers::Pairs;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: policy_cost CONFIG.json [N]")?;
    let n: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let config = Config::parse(&std::fs::read(path)?)?;
    let policy = config
        .policy
        .as_ref()
        .ok_or("the configuration has no policy tables")?;
    let tables = Tables::load(policy.tables)?;
    let headers = Pairs::encode([
        (&b":authority"[..], &b"ace.test"[..]),
        (b":path", b"/v1/chat/completions"),
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b"content-type", b"application/json"),
        (b"content-length", b"512"),
        (b"x-request-id", b"2f1c9a54-0d7e-4c36-9d55-6f0b8e8a1c11"),
        (b"x-ace-tenant", b"globex"),
        (b"x-ace-data-class", b"public"),
        (b"x-ace-model", b"llama-3.1-70b"),
        (b"x-ace-latency-class", b"interactive"),
        (b"x-ace-tp-degree", b"1"),
    ]);
    let mut values = vec![0u32; policy.attributes.len()];
    let mut mask = vec![0u64; tables.words()];
    let mut feasible = 0;
    for _ in 0..n {
        if resolve(&tables, policy, &headers, None, no_trusted, &mut values).is_err() {
            return Err("an attribute is missing".into());
        }
        tables.feasible(&values, &mut mask)?;
        feasible = std::hint::black_box(&mask)
            .iter()
            .map(|w| w.count_ones())
            .sum::<u32>();
    }
    println!("values {values:?}; {feasible} feasible destinations");
    Ok(())
}
