//! Write one event N times (for callgrind): `event_cost N`.
use ace_flow::event::{Event, SCHEMA};
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let e = Event {
        schema: SCHEMA,
        headers: Default::default(),
        request_id: Some("2f1c9a54-0d7e-4c36-9d55-6f0b8e8a1c11".into()),
        time_ms: 1_780_000_000_000,
        tenant: Some("acme".into()),
        data_class: Some("public".into()),
        latency_class: Some("interactive".into()),
        model_requested: Some("llama-3-70b".into()),
        destination: Some("owned".into()),
        tier: Some("inhouse"),
        tokens_in: 30,
        tokens_out: 12,
        tokens_estimated: false,
        status: 200,
        latency_ms: 3,
        slo_ms: None,
        slo_met: None,
        marginal_usd: 4.2e-9,
        counterfactual_usd: Some(1.95e-4),
        reason: "cheapest",
        ..Event::default()
    };
    let mut out = Vec::with_capacity(1024);
    let mut total = 0;
    for _ in 0..n {
        e.write_json(&mut out);
        total += std::hint::black_box(&out).len();
    }
    println!("{total}");
}
