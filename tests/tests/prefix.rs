//! Prefix locality in a real Envoy, both builds: a multi-turn conversation
//! stays on the destination that holds its prompt while that is cheapest
//! counting the cached price, and moves when the holder loses its cost
//! lead, trips or is drained; another tenant's identical conversation is
//! never steered by it. The table lives in Envoy's shared data (Wasm) or
//! the module's process memory (dynamic), shared by two workers here.
//!
//! The fleet: two providers whose prompt caches read at a tenth of the
//! input price (as Anthropic's do): `eu-api`, dearer at list (2.6e-6 an
//! input token), and `us-api` (2e-6). `personal_eu` data may go only to
//! the EU, `public` anywhere. The control service is
//! `ace_harness::control::FakeControl`, polled every 200 ms.

use ace_harness::client::Request;
use ace_harness::control::{FakeControl, Served};
use ace_harness::envoy::{Envoy, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_snapshot::{Drain, DrainReason, Report};
use ace_tests::{
    for_each_filter, now_ms, require_envoy, residency_spec, start, tables_base64, upstream, Filter,
};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTERVAL_MS: u64 = 200;

fn control_json() -> Value {
    json!({"cluster": "ace_control", "interval_ms": INTERVAL_MS, "stale_after_ms": 60_000})
}

fn config() -> String {
    json!({
        "response_headers": true,
        "body": {"read": true},
        "tables_base64": tables_base64(&residency_spec(&["eu-api", "us-api"], 0b10)),
        "locality": {"slots_per_destination": 256},
        "control": control_json(),
        "health": {"trip_after": 3, "base_cooldown_ms": 60_000},
        "destinations": [
            {"name": "eu-api", "cluster": "eu_api", "tier": "payg",
             "usd_per_input_token": 2.6e-6, "usd_per_output_token": 8e-6,
             "cached_input_factor": 0.1},
            {"name": "us-api", "cluster": "us_api", "tier": "payg",
             "usd_per_input_token": 2e-6, "usd_per_output_token": 8e-6,
             "cached_input_factor": 0.1}
        ]
    })
    .to_string()
}

fn snapshot(version: u64, drained: Option<&str>) -> Vec<u8> {
    let reports = drained
        .map(|name| Report {
            name: name.to_string(),
            drain: Some(Drain {
                until_ms: now_ms() + 600_000,
                reason: DrainReason::Operator,
            }),
            ..Report::default()
        })
        .into_iter()
        .collect();
    ace_tests::snapshot(version, reports)
}

/// Turn `n` of a chat about `topic`: a system prompt of about 7,400
/// bytes, then questions and answers, `extra` bytes more in the last
/// question.
fn conversation(topic: &str, n: usize, extra: usize) -> Value {
    let mut messages = vec![json!({"role": "system",
        "content": format!("{topic}: answer as a careful assistant would. ").repeat(150)})];
    for i in 1..=n {
        if i > 1 {
            messages.push(json!({"role": "assistant", "content": format!("answer {}", i - 1)}));
        }
        let tail = if i == n {
            "x".repeat(extra)
        } else {
            String::new()
        };
        messages.push(json!({"role": "user", "content": format!("question {i}{tail}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 10})
}

struct Rig {
    envoy: Envoy,
    eu: Upstream,
    us: Upstream,
    control: FakeControl,
    /// Requests sent.
    sent: std::cell::Cell<usize>,
}

impl Rig {
    fn start(filter: Filter) -> Rig {
        require_envoy();
        let served = Arc::new(Served::default());
        *served.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot(1, None);
        let control = FakeControl::start(served, 0);
        let (eu, us) = (upstream("eu_api"), upstream("us_api"));
        let mut b = EnvoyBuilder::new();
        if filter == Filter::Dynamic {
            b = b.bootstrap_extension(ace_harness::dylib::control_poller_json(
                &ace_tests::ace_dynamic_lib(),
                &control_json(),
            ));
        }
        let b = filter
            .add_reading_body(b, &config())
            .concurrency(2)
            .cluster("eu_api", eu.port())
            .cluster("us_api", us.port())
            .cluster("ace_control", control.port);
        let envoy = start(&filter.event_log(b));
        Rig {
            envoy,
            eu,
            us,
            control,
            sent: std::cell::Cell::new(0),
        }
    }

    /// Send turn `n` of the conversation about `topic`; where it went and
    /// the event's `tokens_prefix_held`.
    fn turn(&self, topic: &str, n: usize, tenant: &str, class: &str, extra: usize) -> String {
        self.send(tenant, class, &conversation(topic, n, extra))
    }

    fn send(&self, tenant: &str, class: &str, body: &Value) -> String {
        let (eu, us) = (self.eu.count(), self.us.count());
        self.sent.set(self.sent.get() + 1);
        let r = Request::post_json("/v1/chat/completions", body)
            .header("x-ace-tenant", tenant)
            .header("x-ace-data-class", class)
            .send(self.envoy.port())
            .unwrap_or_else(|e| panic!("{e}"));
        if self.eu.count() > eu {
            "eu".into()
        } else if self.us.count() > us {
            "us".into()
        } else {
            format!("refused {}: {}", r.status, r.text())
        }
    }

    /// The last request's event's `tokens_prefix_held`.
    fn held(&self) -> u64 {
        let n = self.sent.get();
        let lines = self.envoy.wait_access_log(n, Duration::from_secs(10));
        let last: Value = lines
            .last()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .unwrap_or_default();
        last["tokens_prefix_held"].as_u64().unwrap_or(u64::MAX)
    }
}

fn a_conversation_follows_its_prefix_until_the_holder_trips_drains_or_costs_more(filter: Filter) {
    let rig = Rig::start(filter);
    let step = |rig: &Rig, went: String, want: &str, what: &str| -> u64 {
        assert_eq!(went, want, "{what}:\n{}", rig.envoy.log());
        rig.held()
    };
    // Turn 1 may go only to the EU.
    let w = rig.turn("tax", 1, "acme", "personal_eu", 0);
    assert_eq!(step(&rig, w, "eu", "turn 1"), 0);
    // Turn 2 may go either way: the US is cheaper at list, the EU holds
    // turn 1's prompt (about 1,600 tokens) at a tenth of its price. The
    // other worker sees what the first recorded: the table is shared.
    for t in 0..4 {
        let w = rig.turn("tax", 2, "acme", "public", 0);
        let held = step(&rig, w, "eu", "turn 2 stays where its prefix is");
        assert!((1_550..1_650).contains(&held), "try {t}: {held}");
    }
    // Another tenant's identical conversation: nothing held for it.
    let w = rig.turn("tax", 2, "rival", "public", 0);
    assert_eq!(step(&rig, w, "us", "another tenant is not steered"), 0);
    // A new question four times the held prompt: the discount no longer
    // covers the EU's dearer list price.
    let w = rig.turn("tax", 3, "acme", "public", 30_000);
    step(&rig, w, "us", "the holder lost its cost lead");
    // A conversation held by the EU, which is then drained.
    let w = rig.turn("law", 1, "acme", "personal_eu", 0);
    step(&rig, w, "eu", "law turn 1");
    let w = rig.turn("law", 2, "acme", "public", 0);
    assert!(step(&rig, w, "eu", "law turn 2 stays") > 0);
    rig.control.set(snapshot(2, Some("eu-api")));
    let t = Instant::now();
    loop {
        let w = rig.turn("law", 2, "acme", "public", 0);
        rig.held();
        if w == "us" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_millis(10 * INTERVAL_MS),
            "a drain never moved the conversation:\n{}",
            rig.envoy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Back from the drain; a third conversation held by the EU, which
    // then trips.
    rig.control.set(snapshot(3, None));
    let t = Instant::now();
    loop {
        let w = rig.send("acme", "personal_eu", &json!({"model": "m"}));
        rig.held();
        if w == "eu" {
            break;
        }
        assert!(
            w.starts_with("refused 503") && t.elapsed() < Duration::from_millis(10 * INTERVAL_MS),
            "never back after the drain ({w}):\n{}",
            rig.envoy.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let w = rig.turn("art", 1, "acme", "personal_eu", 0);
    step(&rig, w, "eu", "art turn 1");
    let w = rig.turn("art", 2, "acme", "public", 0);
    assert!(step(&rig, w, "eu", "art turn 2 stays") > 0);
    rig.eu.set_behavior(Behavior::Status(503));
    for _ in 0..3 {
        let w = rig.send("acme", "personal_eu", &json!({"model": "m"}));
        step(&rig, w, "eu", "a failure on the EU");
    }
    rig.eu.set_behavior(Behavior::Ok);
    let w = rig.turn("art", 3, "acme", "public", 0);
    step(&rig, w, "us", "a tripped holder is passed over");
}

/// The table is bounded by its slots: once they are written, two thousand
/// more distinct prompts (four thousand records) leave Envoy's heap where
/// it was, give or take its own churn. Prints what a slot costs as
/// measured (Envoy's heap, shared data included), for BENCHMARKS.
fn the_table_is_bounded_by_its_slots(filter: Filter) {
    require_envoy();
    let slots_per_destination = 1024u64;
    let mut config: Value = serde_json::from_str(&config()).unwrap_or_else(|e| panic!("{e}"));
    config["locality"]["slots_per_destination"] = json!(slots_per_destination);
    config.as_object_mut().map(|c| c.remove("control"));
    let config = config.to_string();
    let (eu, us) = (upstream("eu_api"), upstream("us_api"));
    let b = filter
        .add_reading_body(EnvoyBuilder::new(), &config)
        .concurrency(1)
        .cluster("eu_api", eu.port())
        .cluster("us_api", us.port());
    let envoy = start(&b);
    let send = |i: usize| {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": format!("prompt {i}: ").repeat(50)},
            {"role": "user", "content": format!("question {i}")}]});
        let r = Request::post_json("/v1/chat/completions", &body)
            .header("x-ace-tenant", "acme")
            .header("x-ace-data-class", "public")
            .send(envoy.port())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status, 200, "{}", r.text());
    };
    // Envoy's admin `/memory`: the allocator's figure now (the
    // `server.memory_allocated` stat is refreshed only every flush).
    let heap = || -> u64 {
        let r = envoy
            .admin("/memory")
            .unwrap_or_else(|e| panic!("admin /memory: {e}"));
        let v: Value = serde_json::from_str(&r.text()).unwrap_or_else(|e| panic!("{e}"));
        v["allocated"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no `allocated` in /memory: {v}"))
    };
    // Envoy's own per-request allocations warm up with the first
    // requests; the dynamic module's table is allocated whole at its first
    // write, the Wasm filter's shared data an entry a slot.
    let before = heap();
    let slots = 2 * slots_per_destination as usize;
    // Each prompt records two boundaries: 4 records a slot, so nearly
    // every slot is written.
    for i in 0..2 * slots {
        send(i);
    }
    let full = heap();
    for i in 2 * slots..2 * slots + 2_000 {
        send(i);
    }
    let after = heap();
    let (filled, grew) = (full.saturating_sub(before), after.saturating_sub(full));
    println!(
        "locality table ({filter:?}): {slots} slots; Envoy's heap {before} before, +{filled} \
         once {} records were written ({} bytes a slot), +{grew} after 4,000 more",
        4 * slots,
        filled / slots as u64,
    );
    // Unbounded, 4,000 more records of 40 bytes and more would add 160 KB
    // and more; bounded, nothing but Envoy's own churn.
    assert!(
        grew < 60_000,
        "the table grew by {grew} bytes past its {slots} slots (filling them took {filled})"
    );
}

for_each_filter!(
    a_conversation_follows_its_prefix_until_the_holder_trips_drains_or_costs_more,
    the_table_is_bounded_by_its_slots,
);
