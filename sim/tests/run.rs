//! Whole runs of the simulator on a small fleet: one event per request,
//! every request accounted for, failures spilled, same seed same figures.

use ace_sim::fleet::{Fault, FaultKind};
use ace_sim::policy::litellm::Strategy;
use ace_sim::slo::Targets;
use ace_sim::trace::{self, Shape, Trace};
use ace_sim::{Placement, PolicyKind, Simulation};
use serde_json::Value;

fn simulation(requests: usize) -> Simulation {
    simulation_with(requests, MIX).unwrap_or_else(|e| panic!("{e}"))
}

const MIX: &str = "[[tenants]]\nid = \"t\"\nshare = 1\ndata_class = { public = 1 }\n\
                   latency_class = { interactive = 2, batch = 1 }\nmodel = { m = 1 }\n";

/// The three destinations of [`simulation_with`]'s configuration.
fn places() -> Vec<Placement> {
    ["owned", "spot", "api"]
        .iter()
        .map(|n| Placement {
            name: (*n).into(),
            jurisdiction: "US".into(),
            region: "us-east-1".into(),
            certifications: vec![],
            models: vec!["m".into()],
            warm: vec!["m".into()],
            provider: "test".into(),
            gpus: 4,
            throughput_tps: 2400.0,
        })
        .collect()
}

/// The filter configuration of [`simulation_with`]: an owned server
/// (standing cost USD 8.56 an hour), a spot server and an API.
const CONFIG: &[u8] = br#"{"destinations":[
    {"name":"owned","cluster":"owned","tier":"inhouse","capacity":16,
     "usd_per_input_token":5e-8,"usd_per_output_token":1.5e-7,"slo_ms":1500,
     "usd_per_gpu_hour":8.56},
    {"name":"spot","cluster":"spot","tier":"spot","capacity":16,
     "usd_per_gpu_hour":4.4,"tokens_per_second":2400,"eviction_premium":0.15},
    {"name":"api","cluster":"api","tier":"payg",
     "usd_per_input_token":6e-7,"usd_per_output_token":6e-7}],
  "allow_no_policy":true,"body":{"read":true}}"#;

fn simulation_with(requests: usize, mix: &str) -> Result<Simulation, String> {
    let config = CONFIG;
    let arrivals = trace::arrivals(
        &Trace::synthetic(3, requests, 4.0),
        Shape::Replay { speedup: 1.0 },
    );
    let mut sim = Simulation::new(
        config.to_vec(),
        &places(),
        &[("m".into(), 1)],
        &arrivals,
        "test mix",
        mix,
        Targets::default(),
        1,
    )
    .map_err(|e| e.to_string())?;
    sim.faults = Some(Vec::new());
    Ok(sim)
}

#[test]
fn a_shadow_log_longer_than_a_run_is_refused_and_one_within_runs() {
    let sim = simulation(1);
    let places = places();
    let at = |time_ms: u64| ace_sim::Logged {
        time_ms,
        prompt: 100,
        output: 20,
        tenant: "t".into(),
        model: "m".into(),
        ..ace_sim::Logged::default()
    };
    let shadow = |log: &[ace_sim::Logged]| {
        Simulation::shadow(
            sim.config_json.clone(),
            &places,
            &[("m".into(), 1)],
            log,
            Targets::default(),
            1,
        )
    };
    let day = 86_400_000;
    let e = shadow(&[at(1_700_000_000_000), at(1_700_000_000_000 + 50 * day)])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("span 50 days") && e.contains("at most 40"),
        "{e}"
    );
    assert!(shadow(&[]).is_err(), "an empty log is refused");
    // Out of order, with an attribute missing: sorted, and runs.
    let ok =
        shadow(&[at(1_700_000_005_000), at(1_700_000_000_000)]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ok.reqs.iter().map(|r| r.at_ms).collect::<Vec<_>>(),
        [0, 5_000]
    );
    let m = ok
        .run(PolicyKind::Ace, 1, None, &|_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.requests, 2);
}

#[test]
fn a_bad_mix_is_refused_naming_the_tenant_and_the_fix() {
    for (mix, expect) in [
        (MIX.replace("share = 1", "share = 0"), "shares sum to 0"),
        (
            MIX.replace("share = 1", "share = -1"),
            "share -1 is not a weight",
        ),
        (
            MIX.replace("{ public = 1 }", "{ public = 0 }"),
            "tenant `t`: its data class weights sum to 0",
        ),
        (
            MIX.replace("{ m = 1 }", "{ m = 1e308, n = 1e308 }"),
            "its model weights sum to inf",
        ),
        ("tenants = 3".to_string(), "test mix"),
    ] {
        match simulation_with(10, &mix) {
            Ok(_) => panic!("accepted: {mix}"),
            Err(e) => assert!(e.contains(expect), "{mix}\nexpected `{expect}` in: {e}"),
        }
    }
}

#[test]
fn ace_writes_one_filter_event_per_request() {
    let sim = simulation(3000);
    let mut out = Vec::new();
    let m = sim
        .run(PolicyKind::Ace, 1, Some(&mut out), &|_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.requests, 3000);
    let events: Vec<Value> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert_eq!(events.len(), 3000, "exactly one event per request");
    assert!(events.iter().all(|e| e["schema"] == "ace.event/2"));
    let served = events.iter().filter(|e| e["status"] == 200).count() as u64;
    assert_eq!(served, m.served, "the events and the figures agree");
    let booked: f64 = events
        .iter()
        .map(|e| e["marginal_usd"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(booked > 0.0);
}

#[test]
fn every_policy_accounts_for_every_request_and_repeats_itself() {
    let sim = simulation(2000);
    for kind in PolicyKind::ALL {
        let a = sim
            .run(kind, 4, None, &|_| {})
            .unwrap_or_else(|e| panic!("{e}"));
        let b = sim
            .run(kind, 4, None, &|_| {})
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.requests, 2000, "{}", kind.name());
        assert_eq!(
            serde_json::to_string(&a).unwrap_or_default(),
            serde_json::to_string(&b).unwrap_or_default(),
            "{}: same seed, same figures",
            kind.name()
        );
        let per_class: u64 = a.classes.iter().map(|c| c.requests).sum();
        assert_eq!(per_class, 2000, "{}", kind.name());
    }
}

/// Owned capacity costs its hourly price over the run's whole hours, for
/// every policy alike, beside what each spends per request; spot capacity
/// bought by the hour is marginal, not standing.
#[test]
fn standing_cost_is_the_owned_capacity_over_the_runs_hours_for_every_policy() {
    // 3,000 requests at 4 a second: a run of 12.5 minutes, billed an hour.
    let sim = simulation(3000);
    for kind in [
        PolicyKind::Ace,
        PolicyKind::LiteLlm(Strategy::CostBased),
        PolicyKind::AllPayg,
    ] {
        let m = sim
            .run(kind, 1, None, &|_| {})
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.standing, 8_560_000_000, "{kind:?}");
        assert_eq!(m.standing_usd, 8.56);
    }
}

#[test]
fn an_outage_is_spilled_around() {
    let mut sim = simulation(3000);
    // The owned server is down for the whole run.
    sim.faults = Some(vec![Fault {
        dest: 0,
        from_ms: 0,
        to_ms: u64::MAX,
        kind: FaultKind::Outage,
    }]);
    let ace = sim
        .run(PolicyKind::Ace, 1, None, &|_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(ace.served_fraction() > 0.99, "{}", ace.served_fraction());
    let owned = ace.served_by_destination.first().map_or(0, |d| d.1);
    assert_eq!(owned, 0);
    // LiteLLM 1.109.3 raises a refused connection as `APIConnectionError`,
    // which never cools a deployment (`_is_cooldown_required`): cost-based
    // routing keeps picking the cheapest, dead, owned server, three calls a
    // request, while simple-shuffle (weighted by rpm: only the API has one)
    // never sends it there.
    let cost = sim
        .run(PolicyKind::LiteLlm(Strategy::CostBased), 1, None, &|_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        cost.served_fraction() < 0.05,
        "no cool-down on connection errors: {}",
        cost.served_fraction()
    );
    let shuffle = sim
        .run(
            PolicyKind::LiteLlm(Strategy::SimpleShuffle),
            1,
            None,
            &|_| {},
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        shuffle.served_fraction() > 0.99,
        "{}",
        shuffle.served_fraction()
    );
}
