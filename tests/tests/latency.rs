//! Latency classes in a real Envoy, both builds: an owned upstream whose
//! time to first token grows with its load. As the load rises, the filter
//! learns that from the streams' first bytes; interactive requests (a
//! 400 ms target) move to pay-as-you-go before their target is missed,
//! batch requests (no target) keep the owned capacity busy, and at low
//! load interactive comes back. And a tenant whose own requests are slow
//! to serve (a huge prompt, say) cannot make the destination look slow to
//! everyone else: with `trip_tenants: 2` its answers alone neither start
//! nor raise the learned latency.

use ace_harness::client::{Request, Response};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream, DELAY_HEADER};
use ace_tests::{destinations, require_envoy, start, tables_base64, upstream, Filter};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TARGET_MS: u64 = 400;

/// Tables over a `tenant` attribute that permit everything: the tenant is
/// what the learning's two-tenant rule counts.
fn tenant_tables() -> String {
    use ace_core::tables::{AttributeSpec, FactorKind, FactorSpec, TableSpec};
    tables_base64(&TableSpec {
        destinations: destinations(&["payg", "owned"]),
        attributes: vec![AttributeSpec::new("tenant", &["a", "b", "hostile"])],
        factors: vec![FactorSpec {
            kind: FactorKind::Permit,
            attributes: vec![],
            rows: vec![0b11],
        }],
    })
}

fn config(trip_tenants: u8) -> Value {
    json!({
        "response_headers": true,
        "destinations": [
            {"name": "payg", "cluster": "payg", "tier": "payg",
             "usd_per_input_token": 2.5e-6, "usd_per_output_token": 1e-5},
            {"name": "owned", "cluster": "owned", "tier": "inhouse", "capacity": 32, "knee": 1.0,
             "usd_per_input_token": 1e-9, "usd_per_output_token": 1e-9}
        ],
        "tables_base64": tenant_tables(),
        "latency_classes": {
            "interactive": {"usd_per_s": 0, "ttft_ms": TARGET_MS},
            "batch": 0
        },
        "health": {"trip_tenants": trip_tenants}
    })
}

struct Fleet {
    envoy: Envoy,
    owned: Upstream,
    payg: Upstream,
}

fn fleet(filter: Filter, trip_tenants: u8, owned: Behavior) -> Fleet {
    require_envoy();
    let (o, p) = (upstream("owned"), upstream("payg"));
    o.set_behavior(owned);
    p.set_behavior(Behavior::Stream {
        first: Duration::from_millis(30),
        per_in_flight: Duration::ZERO,
        rest: Duration::from_millis(200),
    });
    let b = filter
        .add(EnvoyBuilder::new(), &config(trip_tenants).to_string())
        .cluster("owned", o.port())
        .cluster("payg", p.port());
    let envoy = start(&filter.event_log(b));
    Fleet {
        envoy,
        owned: o,
        payg: p,
    }
}

fn send(port: u16, tenant: &str, class: &str, delay_ms: u64) -> Response {
    let mut r = Request::post_json(
        "/v1/chat/completions",
        &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .header("x-ace-tenant", tenant)
    .header("x-ace-latency-class", class);
    if delay_ms > 0 {
        r = r.header(DELAY_HEADER, &delay_ms.to_string());
    }
    r.send(port)
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

fn served_by(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-ace-destination").unwrap_or("-").to_string()
}

/// `clients` batch clients, the i-th starting `i * stagger` in, each
/// sending requests one after another until `until`: a load that rises,
/// then holds. Returns the threads (each yields where its requests went).
fn batch_load(
    port: u16,
    clients: u64,
    stagger: Duration,
    until: Instant,
) -> Vec<std::thread::JoinHandle<Vec<String>>> {
    (0..clients)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(stagger * i as u32);
                let mut went = Vec::new();
                while Instant::now() < until {
                    let tenant = if i % 2 == 0 { "a" } else { "b" };
                    went.push(served_by(&send(port, tenant, "batch", 0)));
                }
                went
            })
        })
        .collect()
}

/// The access log's events, as JSON.
fn events(envoy: &Envoy, n: usize) -> Vec<Value> {
    envoy
        .wait_access_log(n, Duration::from_secs(10))
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn interactive_moves_before_its_target_while_batch_stays(filter: Filter) {
    // Owned: 30 ms to the first token alone, 40 ms more per other stream in
    // flight: past 400 ms from about ten streams.
    let f = fleet(
        filter,
        1,
        Behavior::Stream {
            first: Duration::from_millis(30),
            per_in_flight: Duration::from_millis(40),
            rest: Duration::from_millis(600),
        },
    );
    let port = f.envoy.port();
    // Rising load: sixteen batch clients, one more every 150 ms, for 9 s.
    let until = Instant::now() + Duration::from_secs(9);
    let load = batch_load(port, 16, Duration::from_millis(150), until);
    // Once the load holds (from about 2.5 s) and has been learned, what
    // interactive requests get.
    std::thread::sleep(Duration::from_secs(5));
    let mut busy = Vec::new();
    while Instant::now() + Duration::from_millis(1200) < until {
        busy.push(served_by(&send(port, "a", "interactive", 0)));
        std::thread::sleep(Duration::from_millis(100));
    }
    let batch: Vec<String> = load
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_else(|_| panic!("a batch client failed")))
        .collect();
    assert!(
        batch.iter().all(|d| d == "owned"),
        "batch requests keep the owned capacity: {batch:?}"
    );
    assert!(
        !busy.is_empty() && busy.iter().all(|d| d == "payg"),
        "under load, interactive goes to the next rung: {busy:?}"
    );
    // The load gone, interactive comes back to the owned rung.
    std::thread::sleep(Duration::from_millis(1000));
    let quiet: Vec<String> = (0..4)
        .map(|_| served_by(&send(port, "b", "interactive", 0)))
        .collect();
    assert!(quiet.iter().all(|d| d == "owned"), "{quiet:?}");
    // No interactive request was sent where its first byte missed 400 ms.
    let n = batch.len() + busy.len() + quiet.len();
    let late: Vec<Value> = events(&f.envoy, n)
        .into_iter()
        .filter(|e| e["latency_class"] == "interactive")
        .filter(|e| e["latency_ms"].as_u64().is_none_or(|l| l > TARGET_MS))
        .collect();
    assert!(
        late.is_empty(),
        "interactive answers past the target: {late:?}"
    );
    assert!(f.payg.count() >= busy.len() && f.owned.count() >= batch.len());
}

fn one_tenants_slow_requests_do_not_move_the_latency_others_see(filter: Filter) {
    // Owned answers in 30 ms at any load, unless a request asks the
    // upstream for more (the hostile tenant's, whose input is slow to
    // serve).
    let f = fleet(
        filter,
        2,
        Behavior::Stream {
            first: Duration::from_millis(30),
            per_in_flight: Duration::ZERO,
            rest: Duration::from_millis(20),
        },
    );
    let port = f.envoy.port();
    // The hostile tenant, alone at first, then among others: 96 requests
    // each 700 ms slow to its first token, eight at a time.
    let hostile: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                (0..12)
                    .map(|_| served_by(&send(port, "hostile", "batch", 700)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    // Tenants a and b, interactive, while the hostile load goes on: the
    // owned rung's 30 ms answers are what they see.
    let mut others = Vec::new();
    for i in 0..30 {
        let tenant = if i % 2 == 0 { "a" } else { "b" };
        others.push(served_by(&send(port, tenant, "interactive", 0)));
        std::thread::sleep(Duration::from_millis(60));
    }
    for h in hostile {
        let went = h
            .join()
            .unwrap_or_else(|_| panic!("a hostile client failed"));
        assert!(went.iter().all(|d| d == "owned"), "{went:?}");
    }
    assert!(
        others.iter().all(|d| d == "owned"),
        "one tenant's slow answers moved the others off the owned rung: {others:?}"
    );
    assert_eq!(f.payg.count(), 0);
}

ace_tests::for_each_filter!(
    interactive_moves_before_its_target_while_batch_stays,
    one_tenants_slow_requests_do_not_move_the_latency_others_see,
);
