//! Model routing and the response cache cannot widen the feasible set, on
//! fleets and policies nobody wrote by hand.
//!
//! `compliance_props` checks routed pairs and cache hits on the example
//! fleet, whose classes and policies were written alongside the filter.
//! This test draws the whole setting at random instead: a manifest (tenants
//! and groups, a model catalogue, one to three model classes, 3 to 40
//! destinations of every tier, or in one fleet of five 65 to 130 (masks of
//! more than one word), with random models served, pools, prices and
//! per-model cost factors) and a policy set (a base permit that reads
//! `context.model`, random permits and forbids over request, tenant and
//! destination attributes, and forbids on `context.substituted` and
//! `context.cached` under random conditions). It compiles them with the
//! policy compiler, builds the filter's configuration the way `ace
//! plugin-config` does, and then, for random requests naming a class, a
//! class member or another model, random prices, loads and health:
//!
//! - every (destination, model) pair the merit order picks is one Cedar
//!   allows for the request with that model and `substituted` as it is;
//! - a cache entry from a random producer and model is served only where
//!   Cedar allows that producer, with that model and `cached` true (and,
//!   when every request value is known, exactly there: the cache misses
//!   nothing Cedar allows);
//! - every pair routing offers, chosen or not, is Cedar-allowed and of the
//!   named model's class;
//! - a request naming a model outside every class is never substituted.
//!
//! Each case is seeded; a failure prints the seed, the manifest and the
//! policies, which reproduce it. `ACE_ROUTING_PROPS_FLEETS` sets the
//! number of fleets (default 150).

use ace_core::cost::{CostModel, Tier};
use ace_core::dispatch::{decide, decide_scaled, Request};
use ace_core::health::Health;
use ace_flow::{request, routing};
use ace_policy::verify::Rng;
use ace_policy::{compile, Project, Sources};
use ace_tests::priced;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const DATA: [&str; 4] = ["public", "internal", "personal_eu", "phi"];
const JURIS: [&str; 3] = ["EU", "US", "SG"];
const CERTS: [&str; 2] = ["hipaa_baa", "soc2"];
const ACCELERATORS: [&str; 3] = ["h100", "a100", "api"];

fn pick<'a>(r: &mut Rng, from: &[&'a str]) -> &'a str {
    from[r.below(from.len() as u64) as usize]
}

/// A random subset of `0..n` (each in with probability 1/2).
fn subset(r: &mut Rng, n: usize) -> Vec<usize> {
    (0..n).filter(|_| r.below(2) == 0).collect()
}

/// A random fleet manifest with model classes and cost blocks, and the
/// number of its destinations.
fn manifest(r: &mut Rng) -> (String, usize) {
    let mut s = String::from("version = 1\n");
    let data = 2 + r.below(3) as usize;
    let _ = writeln!(s, "[request.data_class]\nvalues = {:?}", &DATA[..data]);
    let _ = writeln!(
        s,
        "[request.latency_class]\nvalues = {:?}",
        &["interactive", "batch"][..1 + r.below(2) as usize]
    );
    let _ = writeln!(
        s,
        "[request.tp_degree]\nvalues = {:?}",
        &[1, 2, 4][..1 + r.below(3) as usize]
    );
    for t in 0..1 + r.below(4) {
        let groups: Vec<String> = subset(r, 2).iter().map(|g| format!("g{g}")).collect();
        let _ = writeln!(s, "[[tenants]]\nid = \"t{t}\"\ngroups = {groups:?}");
        if r.below(2) == 0 {
            let _ = writeln!(s, "home_jurisdiction = \"{}\"", pick(r, &JURIS));
        }
    }
    let models = 3 + r.below(5) as usize;
    for m in 0..models {
        let _ = writeln!(
            s,
            "[[models]]\nid = \"m{m}\"\nvram_gb = {}\ntp_degree = {}\naccelerators = [\"{}\"]",
            [0, 16, 80, 200][r.below(4) as usize],
            [1, 2, 4][r.below(3) as usize],
            pick(r, &ACCELERATORS)
        );
    }
    // Classes: disjoint runs of a shuffled catalogue, two or more each;
    // at least one model is left outside every class when there is room.
    let mut order: Vec<usize> = (0..models).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, r.below(i as u64 + 1) as usize);
    }
    let mut at = 0;
    let mut in_class = vec![false; models];
    for c in 0..1 + r.below(3) {
        let left = models - at;
        if left < 2 {
            break;
        }
        let size = 2 + r.below((left - 1) as u64) as usize;
        let members: Vec<String> = order[at..at + size]
            .iter()
            .map(|m| format!("m{m}"))
            .collect();
        for &m in &order[at..at + size] {
            in_class[m] = true;
        }
        at += size;
        let _ = writeln!(
            s,
            "[[model_classes]]\nname = \"c{c}\"\nmodels = {members:?}"
        );
    }
    // One fleet in five past 64 destinations: masks of several words.
    let destinations = if r.below(5) == 0 {
        65 + r.below(66) as usize
    } else {
        3 + r.below(38) as usize
    };
    for d in 0..destinations {
        let mut served = subset(r, models);
        if served.is_empty() {
            served.push(r.below(models as u64) as usize);
        }
        let certs: Vec<&str> = CERTS.iter().copied().filter(|_| r.below(2) == 0).collect();
        let pools: Vec<String> = subset(r, 3).iter().map(|p| format!("p{p}")).collect();
        let tier = Tier::ALL[r.below(Tier::ALL.len() as u64) as usize];
        let _ = writeln!(
            s,
            "[[destinations]]\nname = \"d{d}\"\ncluster = \"c{d}\"\npools = {pools:?}\n\
             provider = \"x\"\ntier = \"{}\"\njurisdiction = \"{}\"\nregion = \"r{}\"\n\
             accelerator = \"{}\"\nvram_gb = {}\ninterconnect = \"{}\"\nmodels = {:?}\n\
             certifications = {certs:?}",
            tier.as_str(),
            pick(r, &JURIS),
            r.below(4),
            pick(r, &ACCELERATORS),
            [0, 24, 80, 160, 640][r.below(5) as usize],
            pick(r, &["nvlink", "pcie", "none"]),
            served.iter().map(|m| format!("m{m}")).collect::<Vec<_>>(),
        );
        let mut factors = Vec::new();
        for &m in &served {
            // Factors are for class members only (the manifest refuses others).
            if in_class[m] && r.below(2) == 0 {
                let f = [0.05, 0.2, 0.5, 1.0, 2.0, 8.0][r.below(6) as usize];
                factors.push(format!("\"m{m}\" = {f}"));
            }
        }
        let _ = writeln!(
            s,
            "[destinations.cost]\ninput_usd_per_mtok = {}\noutput_usd_per_mtok = {}\n\
             capacity = {}\nmodel_cost_factors = {{ {} }}",
            r.below(1000) as f64 / 100.0,
            r.below(4000) as f64 / 100.0,
            1 + r.below(16),
            factors.join(", ")
        );
    }
    (s, destinations)
}

/// A random condition over the request, the tenant and the destination.
fn atom(r: &mut Rng, models: usize) -> String {
    match r.below(14) {
        0 => format!(
            "context.data_class {} \"{}\"",
            pick(r, &["==", "!="]),
            pick(r, &DATA)
        ),
        1 => format!("context.latency_class == \"{}\"", pick(r, &["interactive", "batch"])),
        2 => format!("context.tp_degree >= {}", r.below(5)),
        3 => "resource.vram_gb >= context.model.vram_gb".to_string(),
        4 => format!("resource.certifications.contains(\"{}\")", pick(r, &CERTS)),
        5 => format!("resource.tier == \"{}\"", pick(r, &Tier::ALL.map(Tier::as_str))),
        6 => format!("resource.jurisdiction == \"{}\"", pick(r, &JURIS)),
        7 => format!("principal in Ace::TenantGroup::\"g{}\"", r.below(2)),
        8 => format!("principal == Ace::Tenant::\"t{}\"", r.below(4)),
        9 => format!("context.model == Ace::Model::\"m{}\"", r.below(models as u64)),
        10 => format!(
            "context.model in [Ace::Model::\"m{}\", Ace::Model::\"m{}\"]",
            r.below(models as u64),
            r.below(models as u64)
        ),
        11 => format!("resource in Ace::Pool::\"p{}\"", r.below(3)),
        12 => "context.model.accelerators.contains(resource.accelerator)".to_string(),
        _ => "(principal has home_jurisdiction && principal.home_jurisdiction == resource.jurisdiction)"
            .to_string(),
    }
}

/// One to three atoms joined by `&&`, `||` or negated.
fn condition(r: &mut Rng, models: usize) -> String {
    let mut e = atom(r, models);
    for _ in 0..r.below(3) {
        let b = atom(r, models);
        e = match r.below(3) {
            0 => format!("({e} && {b})"),
            1 => format!("({e} || {b})"),
            _ => format!("({e} && !({b}))"),
        };
    }
    e
}

/// A random policy set that reads `model`, `substituted` and `cached`.
fn policies(r: &mut Rng, models: usize) -> String {
    let allow = "@allow_impossible(\"random test policy\")\n";
    let mut s = format!(
        "{allow}permit (principal, action, resource) when {{ resource.models.contains(context.model) }};\n"
    );
    for _ in 0..r.below(4) {
        let _ = writeln!(
            s,
            "{allow}{} (principal, action, resource) {} {{ {} }};",
            pick(r, &["permit", "forbid", "forbid"]),
            pick(r, &["when", "unless"]),
            condition(r, models)
        );
    }
    for flag in ["substituted", "cached"] {
        let _ = writeln!(
            s,
            "{allow}forbid (principal, action, resource) when {{ context.{flag} }} {} {{ {} }};",
            pick(r, &["when", "unless"]),
            condition(r, models)
        );
    }
    s
}

fn cost_model(r: &mut Rng) -> CostModel {
    let tier = Tier::ALL[r.below(Tier::ALL.len() as u64) as usize];
    CostModel {
        tier,
        usd_per_input_token: r.below(1000) as f64 * 1e-8,
        usd_per_output_token: r.below(4000) as f64 * 1e-8,
        usd_per_gpu_hour: 3.0,
        tokens_per_second: 1000.0,
        capacity: if tier.is_pay_as_you_go() {
            0
        } else {
            1 + r.below(15) as u32
        },
        bias: 0.2 + r.below(40) as f64 / 10.0,
        ..CostModel::default()
    }
}

fn health(r: &mut Rng) -> Health {
    let events: Vec<u8> = (0..r.below(5)).map(|_| r.below(3) as u8).collect();
    ace_tests::health_after(events)
}

/// Counts that show the property was not vacuous.
#[derive(Default, Debug)]
struct Seen {
    fleets: usize,
    routed: usize,
    substituted: usize,
    hits: usize,
    unknown_misses: usize,
}

fn one_fleet(seed: u64, seen: &mut Seen) -> Result<(), String> {
    let mut r = Rng(seed);
    let (toml, n) = manifest(&mut r);
    let models = toml.matches("[[models]]").count();
    let text = policies(&mut r, models);
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/ace.cedarschema");
    let sources = Sources {
        schema: (
            schema.clone(),
            std::fs::read_to_string(&schema).map_err(|e| format!("{}: {e}", schema.display()))?,
        ),
        policies: vec![(PathBuf::from("random.cedar"), text.clone())],
        manifest: (PathBuf::from("fleet.toml"), toml.clone()),
    };
    let project = Project::load(sources).map_err(|e| format!("load: {e}"))?;
    let compiled = compile(&project).map_err(|e| format!("compile: {e}"))?;
    let plugin = ace_policy::plugin::plugin_config(&project, &compiled, false, true)
        .map_err(|e| format!("plugin-config: {e}"))?;
    let mut json = serde_json::to_value(&plugin).map_err(|e| e.to_string())?;
    json["cache"] = serde_json::json!({});
    let setup = ace_flow::Setup::parse(json.to_string().as_bytes())
        .map_err(|e| format!("the filter refused the configuration: {e}"))?;
    let cfg = &setup.config;
    let tables = cfg.tables().ok_or("no tables")?;
    let routing = setup.routing.as_ref().ok_or("no model_routing")?;
    let cache_cfg = setup.cache.as_ref().ok_or("no cache")?;
    let policy = cfg.policy.as_ref().ok_or("no policy")?;
    let m = policy.model.ok_or("the tables do not read model")?;
    assert_eq!(tables.destination_count(), n);
    seen.fleets += 1;

    // Names a request may give: every class, every catalogue model.
    let mut names: Vec<String> = (0..models).map(|i| format!("m{i}")).collect();
    names.extend(
        json["model_routing"]["classes"]
            .as_object()
            .ok_or("the configuration has no model classes")?
            .keys()
            .cloned(),
    );
    let attrs = tables.attribute_count();
    let warm = vec![u64::MAX; tables.words()];
    for case in 0..48 {
        let mut values: Vec<u32> = (0..attrs)
            .map(|a| {
                let count = tables.value_count(a as u32);
                if count == 0 || r.below(10) == 0 {
                    0
                } else {
                    1 + r.below(u64::from(count)) as u32
                }
            })
            .collect();
        for (i, no) in &policy.computed {
            values[*i] = *no;
        }
        let name = &names[r.below(names.len() as u64) as usize];
        values[m] = tables.value_index(m as u32, name);
        let models_priced: Vec<CostModel> = (0..n).map(|_| cost_model(&mut r)).collect();
        let healths: Vec<Health> = (0..n).map(|_| health(&mut r)).collect();
        let loads: Vec<u32> = (0..n).map(|_| r.below(20) as u32).collect();
        let slate = priced(&models_priced, &healths, &loads, 1_000);
        let req = Request::untimed(1 + r.below(4000) as u32, 1 + r.below(1000) as u32, 0.0);
        // Cedar's own answer for this request served by `model` on `d`.
        let allowed = |d: usize, model: &str, substituted: bool, cached: bool| {
            let mut idx = values.clone();
            idx[m] = tables.value_index(m as u32, model);
            idx[routing.substituted_attribute()] = routing.substituted_value(substituted);
            if cached {
                idx[cache_cfg.attribute()] = cache_cfg.yes();
            }
            let context = project.context(&idx)?;
            let request = project.request_with(&idx, d, context)?;
            Ok::<_, String>(project.allows(&request))
        };
        let why = |what: &str, d: usize, model: &str| {
            format!(
                "case {case}: {what}: Cedar denies {} serving {model} for {} (named {name})",
                tables.destination_name(d).unwrap_or("?"),
                project.describe(&values)
            )
        };
        let Some(asked) = routing.asked(name) else {
            // Outside every class: routing does not apply, and the plain
            // lookup decides; the served model is the one named.
            let mut mask = vec![0u64; tables.words()];
            tables
                .feasible(&values, &mut mask)
                .map_err(|e| e.to_string())?;
            if let Ok(d) = decide(&slate, &mask, &warm, &req) {
                if !allowed(d.index, name, false, false)? {
                    return Err(why("unrouted", d.index, name));
                }
            }
            continue;
        };
        let mut lookup = request::Lookup::new(cfg);
        lookup.values.clone_from(&values);
        // A cache entry from a random producer and model.
        let member = r.below(routing.members.len() as u64) as usize;
        let producer = r.below(n as u64) as usize;
        let model = routing.members[member].name.as_str();
        let (hit, substituted) =
            ace_tests::cache_would_serve(&setup, &mut lookup, asked, producer, model);
        if hit {
            seen.hits += 1;
            if !allowed(producer, model, substituted, true)? {
                return Err(why("a cache hit", producer, model));
            }
        } else if allowed(producer, model, substituted, true)? {
            // Cedar would allow it; the cache said no. The tables fail
            // closed on an unknown value, so that is a fair miss; with
            // every value known the tables equal Cedar, and so must this.
            if values.iter().all(|&v| v != 0) {
                return Err(format!(
                    "case {case}: a miss Cedar allows: {} with {} for {}",
                    tables.destination_name(producer).unwrap_or("?"),
                    model,
                    project.describe(&values)
                ));
            }
            seen.unknown_misses += 1;
        }
        if lookup.values != values {
            return Err(format!("case {case}: the cache check changed the request"));
        }
        let mut pairs = routing::Pairs::default();
        routing.expand(&tables, &mut lookup.values, asked, &mut pairs);
        // Every pair, not only the one chosen, is one Cedar allows.
        for d in 0..n {
            if pairs.mask[d / 64] & (1 << (d % 64)) == 0 {
                continue;
            }
            let k = pairs
                .member(d)
                .ok_or("a feasible destination with no model")?;
            let served = &routing.members[k].name;
            let sub = asked.member.is_some_and(|a| a != k);
            if !allowed(d, served, sub, false)? {
                return Err(why("a feasible pair", d, served));
            }
            if routing.members[k].class != asked.class {
                return Err(format!(
                    "case {case}: {served} is outside the class of {name}"
                ));
            }
        }
        if let Ok(d) = decide_scaled(&slate, &pairs.mask, &warm, &req, &pairs.scale) {
            seen.routed += 1;
            let k = pairs.member(d.index).ok_or("the choice has no model")?;
            if asked.member.is_some_and(|a| a != k) {
                seen.substituted += 1;
            }
        }
    }
    Ok(())
}

#[test]
fn random_fleets_route_and_cache_only_where_cedar_allows() {
    let fleets: u64 = std::env::var("ACE_ROUTING_PROPS_FLEETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut seen = Seen::default();
    for seed in 0..fleets {
        if let Err(e) = one_fleet(seed, &mut seen) {
            let mut r = Rng(seed);
            let (toml, _) = manifest(&mut r);
            let models = toml.matches("[[models]]").count();
            panic!(
                "seed {seed}: {e}\n--- fleet.toml\n{toml}\n--- random.cedar\n{}",
                policies(&mut r, models)
            );
        }
    }
    eprintln!("{seen:?}");
    assert!(
        seen.fleets as u64 == fleets
            && seen.routed >= fleets as usize * 8
            && seen.substituted >= 20
            && seen.hits >= 20,
        "not vacuous: {seen:?}"
    );
}
