//! Compliance fails closed, end to end: the example Cedar policies in
//! `policies/` are compiled into tables, and for random requests (every
//! attribute random, unknown values included), random cost models, random
//! loads and random health states, whatever the decision picks is a
//! destination that Cedar's own authorizer permits for that request.
//!
//! This composes the two halves proven elsewhere (tables == Cedar in
//! `ace policy verify` and the policy compiler's property test; choice within
//! the mask in the core's property test) into the one statement that
//! matters, checked against Cedar directly.

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{decide, Request};
use ace_core::health::Health;
use ace_core::tables::Tables;
use ace_tests::priced;
use proptest::prelude::*;
use std::sync::OnceLock;

struct Compiled {
    project: ace_policy::Project,
    tables: Vec<u8>,
}

fn compiled() -> &'static Compiled {
    static C: OnceLock<Compiled> = OnceLock::new();
    C.get_or_init(|| {
        let dir = ace_harness::workspace_root().join("policies");
        let project = ace_policy::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let tables = ace_policy::compile(&project)
            .unwrap_or_else(|e| panic!("{e}"))
            .bytes;
        Compiled { project, tables }
    })
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::InHouse),
        Just(Tier::Reserved),
        Just(Tier::Spot),
        Just(Tier::OnDemand),
        Just(Tier::Payg)
    ]
}

fn model() -> impl Strategy<Value = CostModel> {
    (tier(), 0.0..1e-5f64, 0.0..4e-5f64, 1u32..16, 0.2..4.0f64).prop_map(
        |(tier, i, o, cap, bias)| CostModel {
            tier,
            usd_per_input_token: i,
            usd_per_output_token: o,
            usd_per_gpu_hour: 3.0,
            tokens_per_second: 1000.0,
            capacity: if tier == Tier::Payg { 0 } else { cap },
            bias,
            ..CostModel::default()
        },
    )
}

fn health() -> impl Strategy<Value = Health> {
    proptest::collection::vec(0u8..3, 0..5).prop_map(ace_tests::health_after)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_choice_is_permitted_by_cedar(
        raw_values in proptest::collection::vec(0u32..64, 8),
        models in proptest::collection::vec(model(), 64),
        healths in proptest::collection::vec(health(), 64),
        loads in proptest::collection::vec(0u32..20, 64),
        warm_bits in any::<u64>(),
        tokens_in in 1u32..10_000,
        tokens_out in 1u32..2_000,
        now_ms in 0u64..10_000,
    ) {
        let c = compiled();
        let tables = Tables::load(&c.tables).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let n = tables.destination_count();
        prop_assume!(n <= 64);
        // One value index per attribute, unknown (0) included.
        let idx: Vec<u32> = c
            .project
            .attributes
            .iter()
            .zip(&raw_values)
            .map(|(a, r)| r % (a.len() as u32 + 1))
            .collect();
        let mut mask = vec![0u64; tables.words()];
        tables.feasible(&idx, &mut mask).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let req = Request::untimed(tokens_in, tokens_out, 0.002);
        let slate = priced(&models[..n], &healths[..n], &loads[..n], now_ms);
        if let Ok(decision) = decide(&slate, &mask, &[warm_bits], &req) {
            let context = c.project.context(&idx).map_err(TestCaseError::fail)?;
            let request = c
                .project
                .request_with(&idx, decision.index, context)
                .map_err(TestCaseError::fail)?;
            prop_assert!(
                c.project.allows(&request),
                "Cedar denies {} for {}",
                tables.destination_name(decision.index).unwrap_or("?"),
                c.project.describe(&idx)
            );
        }
    }
}

/// The property above is only as strong as the decisions it sees: over a
/// fixed sample of requests with a healthy fleet, most requests get a
/// destination, all of them Cedar-permitted, and requests that Cedar denies
/// everywhere are refused.
#[test]
fn a_healthy_fleet_serves_most_requests_and_only_where_cedar_allows() {
    let c = compiled();
    let tables = Tables::load(&c.tables).unwrap_or_else(|e| panic!("{e}"));
    let n = tables.destination_count();
    let models: Vec<CostModel> = (0..n)
        .map(|i| CostModel {
            tier: Tier::Payg,
            usd_per_input_token: 1e-6 * (1 + i) as f64,
            ..CostModel::default()
        })
        .collect();
    let healths = vec![Health::default(); n];
    let loads = vec![0u32; n];
    let req = Request::untimed(100, 10, 0.0);
    let slate = priced(&models, &healths, &loads, 0);
    let mut rng = ace_policy::verify::Rng(7);
    let (mut served, mut refused) = (0, 0);
    let mut mask = vec![0u64; tables.words()];
    for _ in 0..2_000 {
        // Known values only (1..=len): every request is a real one.
        let idx: Vec<u32> = c
            .project
            .attributes
            .iter()
            .map(|a| 1 + rng.below(a.len() as u64) as u32)
            .collect();
        tables
            .feasible(&idx, &mut mask)
            .unwrap_or_else(|e| panic!("{e}"));
        let context = c.project.context(&idx).unwrap_or_else(|e| panic!("{e}"));
        let allowed: Vec<bool> = (0..n)
            .map(|d| {
                let r = c.project.request_with(&idx, d, context.clone());
                c.project.allows(&r.unwrap_or_else(|e| panic!("{e}")))
            })
            .collect();
        match decide(&slate, &mask, &[u64::MAX], &req) {
            Ok(d) => {
                assert!(
                    allowed[d.index],
                    "chose a Cedar-denied destination for {}",
                    c.project.describe(&idx)
                );
                served += 1;
            }
            Err(_) => {
                assert!(
                    !allowed.contains(&true),
                    "refused although Cedar allows some destination"
                );
                refused += 1;
            }
        }
    }
    assert!(served > 200, "served {served}, refused {refused}");
    assert!(
        refused > 0,
        "the examples deny some requests everywhere (e.g. PHI to no BAA)"
    );
}

/// The plugin configuration `ace plugin-config policies/` writes, parsed by
/// the filter's own configuration type.
fn filter_config() -> &'static ace_config::Config {
    static C: OnceLock<ace_config::Config> = OnceLock::new();
    C.get_or_init(|| {
        let dir = ace_harness::workspace_root().join("policies");
        let json = ace_cli::plugin::build(&dir, false, true).unwrap_or_else(|e| panic!("{e}"));
        ace_config::Config::parse(json.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Hostile requests the property saw served (so that it is not vacuous).
static SERVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One hostile request: per table attribute, the values its header is
/// sent with (none, one, or several, unknown ones included), the models its
/// body names (none, one, or the `model` key twice), and whether it forges
/// the destination header.
#[derive(Debug, Clone)]
struct Hostile {
    headers: Vec<Vec<u32>>,
    body: BodyModel,
    forged: bool,
}

/// The `model` the body names.
#[derive(Debug, Clone)]
enum BodyModel {
    None,
    /// The one the `x-ace-model` header names (if sent).
    AsHeader,
    One(u32),
    /// The key twice.
    Twice(u32, u32),
}

/// How one attribute's header is sent: mostly once, sometimes not at all,
/// twice with one value, or twice with two (unknown values included).
fn sent_values() -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        6 => (0u32..64).prop_map(|v| vec![v]),
        1 => Just(vec![]),
        1 => (0u32..64).prop_map(|v| vec![v, v]),
        2 => (0u32..64, 0u32..64).prop_map(|(a, b)| vec![a, b]),
    ]
}

fn hostile(attributes: usize) -> impl Strategy<Value = Hostile> {
    (
        proptest::collection::vec(sent_values(), attributes),
        prop_oneof![
            2 => Just(BodyModel::None),
            5 => Just(BodyModel::AsHeader),
            2 => (0u32..64).prop_map(BodyModel::One),
            1 => (0u32..64, 0u32..64).prop_map(|(a, b)| BodyModel::Twice(a, b)),
        ],
        any::<bool>(),
    )
        .prop_map(|(headers, body, forged)| Hostile {
            headers,
            body,
            forged,
        })
}

/// Through the filter's own request steps (the ones both builds run):
/// repeated policy headers, a header and a body naming different
/// models, a body naming the model twice, a forged destination header.
/// Whatever is served is a destination Cedar permits for the values the
/// filter decided on, and those are what the upstream receives: the
/// body's model when there is one, the one value of each header.
#[test]
fn hostile_requests_through_the_filter_steps_stay_where_cedar_allows() {
    let strategy = (
        hostile(8),
        proptest::collection::vec(health(), 64),
        proptest::collection::vec(0u32..20, 64),
    );
    // A fixed seed: the same 1,024 requests every run, so that the count
    // below is not a matter of luck.
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig::with_cases(1024),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let result = runner.run(&strategy, |(h, healths, loads)| {
        hostile_case(&h, &healths, &loads)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let served = SERVED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        served >= 50,
        "only {served} of 1,024 hostile requests were served: vacuous"
    );
}

fn hostile_case(h: &Hostile, healths: &[Health], loads: &[u32]) -> Result<(), TestCaseError> {
    use ace_flow::{body, headers::Pairs, request};
    let c = compiled();
    let cfg = filter_config();
    let tables = cfg
        .tables()
        .ok_or_else(|| TestCaseError::fail("no tables"))?;
    let n = tables.destination_count();
    prop_assume!(n <= 64);
    let policy = cfg
        .policy
        .as_ref()
        .ok_or_else(|| TestCaseError::fail("no policy"))?;
    // A value of attribute `a` by number: known values and one unknown.
    let text = |a: usize, v: u32| {
        let count = tables.value_count(a as u32);
        // Mostly known values; one in sixteen unknown.
        let i = if v >= 60 || count == 0 {
            0
        } else {
            v % count + 1
        };
        tables
            .value_name(a as u32, i)
            .filter(|_| i > 0)
            .unwrap_or("no-such-value")
            .to_string()
    };
    let mut sent: Vec<(String, String)> = Vec::new();
    if h.forged {
        sent.push(("x-ace-destination".into(), "anything".into()));
    }
    for ((a, source), values) in policy.attributes.iter().enumerate().zip(&h.headers) {
        for v in values {
            sent.push((source.header.clone(), text(a, *v)));
        }
    }
    let pairs = Pairs::encode(sent.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
    let model_attr = policy.model;
    let models: Vec<u32> = match (&h.body, model_attr) {
        (_, None) | (BodyModel::None, _) => vec![],
        (BodyModel::AsHeader, Some(m)) => h.headers.get(m).cloned().unwrap_or_default(),
        (BodyModel::One(v), _) => vec![*v],
        (BodyModel::Twice(a, b), _) => vec![*a, *b],
    };
    let keys: Vec<String> = models
        .iter()
        .take(2)
        .map(|v| {
            let name = text(model_attr.unwrap_or(0), *v);
            format!("\"model\":{}", serde_json::Value::from(name))
        })
        .collect();
    let body_text = format!("{{{}}}", keys.join(","));
    let mut head = request::capture(cfg, pairs, 0, [b'0'; 32]);
    let parsed = body::scan_request(body_text.as_bytes(), body_text.len());
    let body = match parsed {
        Ok(b) => b,
        Err(e) => {
            // Refused whenever the policy decides on the model.
            prop_assert!(model_attr.is_none() || request::body_refusal(cfg, &e).is_some());
            return Ok(());
        }
    };
    if request::model_conflict(&head.event, Some(&body)).is_some() {
        return Ok(());
    }
    let mut lookup = request::Lookup::new(cfg);
    let body_model = body.model.clone();
    if request::feasible(
        cfg,
        Some(&tables),
        &mut head.event,
        body_model.as_deref(),
        ace_flow::attributes::no_trusted,
        &mut lookup,
    )
    .is_err()
    {
        return Ok(());
    }
    // The filter refused nothing: every header attribute was sent with
    // one value (repeats of the same value aside). What ACE computes
    // itself (`substituted`, `cached`) is never read from a header: a
    // request served as asked has them false, whatever it sent.
    for (values, a) in h.headers.iter().take(policy.attributes.len()).zip(0..) {
        if let Some(no) = policy.computed_default(a) {
            prop_assert_eq!(lookup.values.get(a).copied(), Some(no));
            continue;
        }
        let distinct: std::collections::BTreeSet<String> =
            values.iter().map(|v| text(a, *v)).collect();
        prop_assert!(
            distinct.len() <= 1,
            "served with two values of attribute {a}"
        );
    }
    // The model decided on is the body's, when the body names one.
    if let (Some(m), Some(name)) = (model_attr, body.model.as_deref()) {
        let decided = lookup.values.get(m).copied().unwrap_or(u32::MAX);
        prop_assert_eq!(decided, tables.value_index(m as u32, name));
    }
    let slate = priced(&cfg.models[..n], &healths[..n], &loads[..n], 0);
    let req = Request::untimed(10, 10, 0.0);
    if let Ok(decision) = decide(&slate, &lookup.mask, &[u64::MAX], &req) {
        SERVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let idx = &lookup.values;
        let context = c.project.context(idx).map_err(TestCaseError::fail)?;
        let r = c
            .project
            .request_with(idx, decision.index, context)
            .map_err(TestCaseError::fail)?;
        prop_assert!(
            c.project.allows(&r),
            "Cedar denies {} for {}",
            tables.destination_name(decision.index).unwrap_or("?"),
            c.project.describe(idx)
        );
    }
    Ok(())
}

/// The example configuration with model routing (the manifest's classes
/// and cost factors) and the response cache on.
fn routed_config() -> &'static ace_flow::Setup {
    static C: OnceLock<ace_flow::Setup> = OnceLock::new();
    C.get_or_init(|| {
        let dir = ace_harness::workspace_root().join("policies");
        let mut json = ace_cli::plugin::build(&dir, false, true).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            json.get("model_routing").is_some(),
            "ace plugin-config writes the manifest's model classes"
        );
        json["cache"] = serde_json::json!({});
        ace_flow::Setup::parse(json.to_string().as_bytes()).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// Requests served by models routing (destination, model) pairs and
/// answers from the cache: for random requests naming a class member or a
/// class (every other attribute random, unknown values included), random
/// costs, loads and health, the pair the merit order picks is one Cedar
/// allows for the request with that model and `substituted` as it is; and
/// a cache entry from a random producer with a random model is served only
/// where Cedar allows that producer for the request with that model and
/// `cached` true.
#[test]
fn routed_pairs_and_cache_hits_stay_where_cedar_allows() {
    use ace_flow::{request, routing};
    let c = compiled();
    let setup = routed_config();
    let cfg = &setup.config;
    let tables = cfg.tables().unwrap_or_else(|| panic!("no tables"));
    let n = tables.destination_count();
    let routing = setup
        .routing
        .as_ref()
        .unwrap_or_else(|| panic!("no routing"));
    let cache_cfg = setup.cache.as_ref().unwrap_or_else(|| panic!("no cache"));
    let policy = cfg.policy.as_ref().unwrap_or_else(|| panic!("no policy"));
    let attrs = tables.attribute_count();
    let served = std::cell::Cell::new((0usize, 0usize, 0usize));
    let strategy = (
        proptest::collection::vec(0u32..64, attrs),
        0usize..64,
        proptest::collection::vec(model(), n),
        proptest::collection::vec(health(), n),
        proptest::collection::vec(0u32..20, n),
        (0usize..64, 0usize..64),
    );
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig::with_cases(512),
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let names: Vec<String> = routing
        .members
        .iter()
        .map(|m| m.name.clone())
        .chain(["chat-large".to_string(), "chat-small".to_string()])
        .collect();
    let result = runner.run(
        &strategy,
        |(raw, named, models, healths, loads, (producer, made_by))| {
            // Attribute values: mostly known, sometimes unknown; computed
            // ones start false, as the filter starts them.
            let mut values: Vec<u32> = raw
                .iter()
                .enumerate()
                .map(|(a, v)| {
                    let count = tables.value_count(a as u32);
                    if *v >= 60 || count == 0 {
                        0
                    } else {
                        v % count + 1
                    }
                })
                .collect();
            for (i, no) in &policy.computed {
                values[*i] = *no;
            }
            let name = &names[named % names.len()];
            let asked = routing
                .asked(name)
                .unwrap_or_else(|| panic!("{name} is routed"));
            let m = policy
                .model
                .unwrap_or_else(|| panic!("the tables read model"));
            values[m] = tables.value_index(m as u32, name);
            let mut lookup = request::Lookup::new(cfg);
            lookup.values.clone_from(&values);
            // Cedar's own answer for this request served by `model` on
            // destination `d`: `None` when it allows, else why not.
            let allowed = |d: usize, model: &str, substituted: bool, cached: bool| {
                let mut idx = values.clone();
                idx[m] = tables.value_index(m as u32, model);
                idx[routing.substituted_attribute()] = routing.substituted_value(substituted);
                if cached {
                    idx[cache_cfg.attribute()] = cache_cfg.yes();
                }
                let context = c.project.context(&idx).map_err(TestCaseError::fail)?;
                let r = c
                    .project
                    .request_with(&idx, d, context)
                    .map_err(TestCaseError::fail)?;
                Ok::<_, TestCaseError>((!c.project.allows(&r)).then(|| {
                    format!(
                        "Cedar denies {} serving {model} for {}",
                        tables.destination_name(d).unwrap_or("?"),
                        c.project.describe(&idx)
                    )
                }))
            };
            // A cache entry from a random producer and model: served only
            // where Cedar allows it.
            let producer = producer % n;
            let model = routing.members[made_by % routing.members.len()]
                .name
                .as_str();
            let (hit, substituted) =
                ace_tests::cache_would_serve(setup, &mut lookup, asked, producer, model);
            if hit {
                served.set((served.get().0, served.get().1, served.get().2 + 1));
                let why = allowed(producer, model, substituted, true)?;
                prop_assert!(why.is_none(), "a cache hit: {}", why.unwrap_or_default());
            }
            prop_assert_eq!(
                &lookup.values,
                &values,
                "the cache check leaves the request as it was"
            );
            // The pairs, and the merit order over them at the models' prices.
            let mut pairs = routing::Pairs::default();
            routing.expand(&tables, &mut lookup.values, asked, &mut pairs);
            let slate = priced(&models, &healths, &loads, 0);
            let req = Request::untimed(100, 100, 0.0);
            let decided = ace_core::dispatch::decide_scaled(
                &slate,
                &pairs.mask,
                &[u64::MAX],
                &req,
                &pairs.scale,
            );
            if let Ok(d) = decided {
                let member = pairs
                    .member(d.index)
                    .ok_or_else(|| TestCaseError::fail("a destination with no model"))?;
                let served_name = &routing.members[member].name;
                let (r, sub, h) = served.get();
                served.set((r + 1, sub + usize::from(asked.member != Some(member)), h));
                let substituted = asked.member.is_some_and(|a| a != member);
                let why = allowed(d.index, served_name, substituted, false)?;
                prop_assert!(why.is_none(), "a routed pair: {}", why.unwrap_or_default());
                // The booked price is the served model's there.
                let f = routing.factor(member, d.index);
                let plain =
                    ace_core::dispatch::decide(&slate, &[1u64 << d.index], &[u64::MAX], &req)
                        .map(|p| p.marginal_usd * f)
                        .unwrap_or(f64::NAN);
                prop_assert!((plain - d.marginal_usd).abs() <= 1e-12 * plain.abs().max(1.0));
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    let (routed, substituted, hits) = served.get();
    assert!(
        routed >= 50 && substituted >= 10 && hits >= 10,
        "not vacuous: {routed} routed, {substituted} substituted, {hits} cache hits of 512"
    );
}
