//! Property: for random fleets (100+ destinations) and random policy sets
//! using the operators operators actually write (permit and forbid,
//! `when`/`unless`, `==`, `!=`, `<`, `>=`, `in`, `contains`, `has`, `&&`,
//! `||`, `!`, principal and resource scopes), the compiled tables agree
//! with Cedar's authorizer on every sampled request: exactly when every
//! value is known, and never more permissive when one is unknown.
//!
//! Runs proptest's default 256 cases (about 40 s of CPU in a debug build,
//! most of it in unoptimised Cedar); `PROPTEST_CASES` overrides.

use ace_policy::oracle::Oracle;
use ace_policy::verify::{verify_requests, Rng};
use ace_policy::{compile, Project, Sources};
use proptest::prelude::*;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const TENANTS: usize = 3;
const MODELS: usize = 3;
const DATA: [&str; 4] = ["public", "phi", "personal_eu", "internal"];
const LATENCY: [&str; 2] = ["interactive", "batch"];
const TP: [i64; 3] = [1, 2, 4];
/// Every tier's manifest name.
fn tiers() -> [&'static str; 5] {
    ace_core::cost::Tier::ALL.map(ace_core::cost::Tier::as_str)
}
const JURIS: [&str; 3] = ["EU", "US", "SG"];
const CERTS: [&str; 2] = ["hipaa_baa", "soc2"];

/// A random fleet manifest as TOML.
fn fleet(seed: u64, destinations: usize) -> String {
    let mut r = Rng(seed);
    let mut s = String::from("version = 1\n");
    let pick = |r: &mut Rng, n: usize| r.below(n as u64) as usize;
    let _ = writeln!(
        s,
        "[request.data_class]\nvalues = {:?}",
        &DATA[..2 + pick(&mut r, 3)]
    );
    let _ = writeln!(
        s,
        "[request.latency_class]\nvalues = {:?}",
        &LATENCY[..1 + pick(&mut r, 2)]
    );
    let _ = writeln!(
        s,
        "[request.tp_degree]\nvalues = {:?}",
        &TP[..1 + pick(&mut r, 3)]
    );
    for t in 0..1 + pick(&mut r, TENANTS) {
        let groups: Vec<String> = (0..2)
            .filter(|_| r.below(2) == 0)
            .map(|g| format!("g{g}"))
            .collect();
        let _ = writeln!(s, "[[tenants]]\nid = \"t{t}\"\ngroups = {groups:?}");
        if r.below(2) == 0 {
            let _ = writeln!(s, "home_jurisdiction = \"{}\"", JURIS[pick(&mut r, 3)]);
        }
    }
    for m in 0..1 + pick(&mut r, MODELS) {
        let _ = writeln!(
            s,
            "[[models]]\nid = \"m{m}\"\nvram_gb = {}\ntp_degree = {}",
            [0, 16, 80, 200][pick(&mut r, 4)],
            TP[pick(&mut r, 3)]
        );
    }
    let models = 1 + (s.matches("[[models]]").count() - 1);
    for d in 0..destinations {
        let served: Vec<String> = (0..models)
            .filter(|_| r.below(2) == 0)
            .map(|m| format!("m{m}"))
            .collect();
        let certs: Vec<&str> = CERTS.iter().copied().filter(|_| r.below(2) == 0).collect();
        let pools: Vec<String> = (0..3)
            .filter(|_| r.below(3) == 0)
            .map(|p| format!("p{p}"))
            .collect();
        let _ = writeln!(
            s,
            "[[destinations]]\nname = \"d{d}\"\ncluster = \"c{d}\"\npools = {pools:?}\nprovider = \"x\"\n\
             tier = \"{}\"\njurisdiction = \"{}\"\nregion = \"r{}\"\naccelerator = \"h100\"\nvram_gb = {}\n\
             interconnect = \"{}\"\nmodels = {served:?}\ncertifications = {certs:?}",
            tiers()[pick(&mut r, 5)],
            JURIS[pick(&mut r, 3)],
            pick(&mut r, 4),
            [0, 24, 80, 160, 640][pick(&mut r, 5)],
            ["nvlink", "pcie", "none"][pick(&mut r, 3)],
        );
        if r.below(3) == 0 {
            let _ = writeln!(s, "owner_team = \"{}\"", ["ml", "search"][pick(&mut r, 2)]);
        }
    }
    s
}

/// Boolean atoms over request and destination attributes.
fn atom() -> impl Strategy<Value = String> {
    let data = prop::sample::select(vec!["public", "phi", "personal_eu", "internal", "secret"]);
    prop_oneof![
        (data.clone(), any::<bool>()).prop_map(|(v, eq)| format!(
            "context.data_class {} \"{v}\"",
            if eq { "==" } else { "!=" }
        )),
        prop::sample::select(vec!["interactive", "batch"])
            .prop_map(|v| format!("context.latency_class == \"{v}\"")),
        (0i64..6, any::<bool>()).prop_map(|(n, lt)| format!(
            "context.tp_degree {} {n}",
            if lt { "<" } else { ">=" }
        )),
        Just("resource.vram_gb >= context.model.vram_gb".to_string()),
        (0i64..700).prop_map(|n| format!("resource.vram_gb < {n}")),
        Just("resource.models.contains(context.model)".to_string()),
        prop::sample::select(CERTS.to_vec())
            .prop_map(|c| format!("resource.certifications.contains(\"{c}\")")),
        (prop::sample::select(tiers().to_vec()), any::<bool>()).prop_map(|(t, eq)| format!(
            "resource.tier {} \"{t}\"",
            if eq { "==" } else { "!=" }
        )),
        prop::sample::select(JURIS.to_vec()).prop_map(|j| format!("resource.jurisdiction == \"{j}\"")),
        Just("resource has owner_team".to_string()),
        Just("(resource has owner_team && resource.owner_team == \"ml\")".to_string()),
        Just(
            "(principal has home_jurisdiction && principal.home_jurisdiction == resource.jurisdiction)"
                .to_string()
        ),
        (0..2u8).prop_map(|g| format!("principal in Ace::TenantGroup::\"g{g}\"")),
        (0..4u8).prop_map(|t| format!("principal == Ace::Tenant::\"t{t}\"")),
        (0..4u8, 0..4u8).prop_map(|(a, b)| format!(
            "context.model in [Ace::Model::\"m{a}\", Ace::Model::\"m{b}\"]"
        )),
        (0..4u8).prop_map(|m| format!("context.model == Ace::Model::\"m{m}\"")),
        (data.clone(), data).prop_map(|(a, b)| format!("[\"{a}\", \"{b}\"].contains(context.data_class)")),
        (0..3u8).prop_map(|p| format!("resource in Ace::Pool::\"p{p}\"")),
    ]
}

fn expr() -> impl Strategy<Value = String> {
    atom().prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            inner.prop_map(|a| format!("!({a})")),
        ]
    })
}

fn policy() -> impl Strategy<Value = String> {
    let principal = prop_oneof![
        Just("principal".to_string()),
        (0..4u8).prop_map(|t| format!("principal == Ace::Tenant::\"t{t}\"")),
        (0..2u8).prop_map(|g| format!("principal in Ace::TenantGroup::\"g{g}\"")),
    ];
    let resource = prop_oneof![
        3 => Just("resource".to_string()),
        1 => (0..100u8).prop_map(|d| format!("resource == Ace::Destination::\"d{d}\"")),
        1 => (0..3u8).prop_map(|p| format!("resource in Ace::Pool::\"p{p}\"")),
    ];
    let action = prop::sample::select(vec!["action", "action == Ace::Action::\"dispatch\""]);
    let conditions = prop::collection::vec((any::<bool>(), expr()), 0..3);
    (any::<bool>(), principal, action, resource, conditions).prop_map(|(permit, p, a, r, cs)| {
        // Random conditions can contradict each other (`has x && !has x`),
        // which the compiler refuses unless told it is meant: here it is,
        // and Cedar must agree that such a policy never applies.
        let mut s = format!(
            "@allow_impossible(\"random test policy\")\n{} ({p}, {a}, {r})",
            if permit { "permit" } else { "forbid" }
        );
        for (when, e) in cs {
            let _ = write!(s, " {} {{ {e} }}", if when { "when" } else { "unless" });
        }
        s + ";\n"
    })
}

proptest! {
    #![proptest_config(ProptestConfig { max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn tables_equal_cedar(
        seed in any::<u64>(),
        destinations in 100usize..140,
        // At least one permit so that the tables are not trivially empty.
        base in (atom(), any::<bool>()).prop_map(|(e, w)| format!(
            "@allow_impossible(\"random test policy\")\npermit (principal, action, resource) {} {{ {e} }};\n",
            if w { "when" } else { "unless" })),
        policies in prop::collection::vec(policy(), 1..5),
    ) {
        let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/ace.cedarschema");
        let sources = Sources {
            schema: (schema.clone(), std::fs::read_to_string(&schema).unwrap()),
            policies: vec![(PathBuf::from("random.cedar"), base + &policies.concat())],
            manifest: (PathBuf::from("fleet.toml"), fleet(seed, destinations)),
        };
        let text = sources.policies[0].1.clone();
        let project = Project::load(sources).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let compiled = compile(&project).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        // Sample requests: random combinations, unknown values included.
        let radices: Vec<u64> = project.attributes.iter().map(|a| a.len() as u64 + 1).collect();
        let mut r = Rng(seed ^ 0x5eed);
        let requests: Vec<Vec<u32>> = (0..24)
            .map(|i| radices.iter().map(|&n| {
                // Mostly known values; every fourth request may hold unknowns.
                if i % 4 == 0 { r.below(n) as u32 } else { 1 + r.below(n - 1) as u32 }
            }).collect())
            .collect();
        let oracle = Oracle::load(&project.sources).unwrap();
        let report = verify_requests(&oracle, &compiled.bytes, requests).unwrap();
        // Every destination for every request; a request whose Bool
        // (`substituted`, `cached`) is unknown is asked at each of its values.
        let decisions = report.decisions as usize;
        prop_assert!(
            report.requests == 24 && decisions >= 24 * destinations && decisions.is_multiple_of(destinations),
            "{} requests, {} decisions", report.requests, report.decisions
        );
        prop_assert!(report.mismatch_count == 0, "{:?}\n{text}", report.mismatches);
    }
}
