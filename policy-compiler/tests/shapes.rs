//! Property: schemas shaped unlike the example (extra actions before and
//! after `dispatch`, several principal and resource types, several parent
//! types, in any order) either compile to tables that equal Cedar on every
//! request, with entities built independently of the compiler
//! (`ace_policy::oracle`), or are refused with an error naming what was
//! expected. Nothing in the manifest is dropped silently: groups or pools
//! the schema has no type for are refused.
#![allow(clippy::unwrap_used, reason = "test")]

use ace_policy::oracle::Oracle;
use ace_policy::verify::verify;
use ace_policy::{compile, Project, Sources};
use proptest::prelude::*;
use std::fmt::Write as _;
use std::path::PathBuf;

/// A schema with `dispatch` among `actions`, the given principal and
/// resource type lists, and the given parent types of tenants and
/// destinations.
fn schema(
    actions: &[String],
    principals: &[&str],
    resources: &[&str],
    tenant_in: &[&str],
    dest_in: &[&str],
) -> String {
    let inn = |ps: &[&str]| {
        if ps.is_empty() {
            String::new()
        } else {
            format!(" in [{}]", ps.join(", "))
        }
    };
    // `Bucket` has the destination's attributes, so that policies with an
    // unconstrained resource validate for it too.
    let attrs = "{ provider: String, tier: String, jurisdiction: String, region: String, accelerator: String, vram_gb: Long, interconnect: String, models: Set<Model>, certifications: Set<String>, owner_team?: String }";
    let mut s = format!("namespace Ace {{\n  entity TenantGroup;\n  entity Org;\n  entity Pool;\n  entity Region;\n  entity Admin;\n  entity Bucket {attrs};\n");
    let _ = writeln!(
        s,
        "  entity Tenant{} {{ home_jurisdiction?: String }};",
        inn(tenant_in)
    );
    s += "  entity Model { vram_gb: Long, tp_degree: Long, accelerators: Set<String> };\n";
    let _ = writeln!(s, "  entity Destination{} {attrs};", inn(dest_in));
    for a in actions {
        let _ = writeln!(
            s,
            "  action {a} appliesTo {{ principal: [{}], resource: [{}], context: {{ data_class: String, model: Model }} }};",
            principals.join(", "),
            resources.join(", ")
        );
    }
    s + "}\n"
}

fn manifest(groups: bool, pools: bool) -> String {
    let mut s = String::from("version = 1\n[request.data_class]\nvalues = [\"public\", \"phi\"]\n");
    for (t, g) in [("t0", "regulated"), ("t1", "other"), ("t2", "regulated")] {
        let _ = writeln!(s, "[[tenants]]\nid = \"{t}\"");
        if groups {
            let _ = writeln!(s, "groups = [\"{g}\"]");
        }
    }
    for m in ["m0", "m1"] {
        let _ = writeln!(s, "[[models]]\nid = \"{m}\"\nvram_gb = 16");
    }
    let dests = [
        ("eu-a", "spot", "EU", true, "eu"),
        ("eu-b", "inhouse", "EU", false, "eu"),
        ("us-a", "spot", "US", true, "us"),
        ("us-b", "reserved", "US", true, "us"),
        ("sg-a", "ondemand", "SG", false, "ap"),
        ("ru-a", "spot", "RU", false, "ru"),
    ];
    for (name, tier, j, baa, pool) in dests {
        let _ = writeln!(
            s,
            "[[destinations]]\nname = \"{name}\"\ncluster = \"{name}\"\nprovider = \"x\"\ntier = \"{tier}\"\njurisdiction = \"{j}\"\nregion = \"r\"\naccelerator = \"h100\"\nvram_gb = 80\ninterconnect = \"nvlink\"\nmodels = [\"m0\", \"m1\"]\ncertifications = {}",
            if baa { "[\"hipaa_baa\"]" } else { "[]" }
        );
        if pools {
            let _ = writeln!(s, "pools = [\"{pool}\"]");
        }
    }
    s
}

fn policies(
    extra_actions: &[String],
    admin: bool,
    group: bool,
    pool: bool,
    org: bool,
    region: bool,
) -> String {
    let mut s = String::from(
        "@id(\"serves\")\npermit (principal, action == Ace::Action::\"dispatch\", resource) when { resource.models.contains(context.model) };\n\
         @id(\"phi\")\nforbid (principal, action == Ace::Action::\"dispatch\", resource) when { context.data_class == \"phi\" } unless { resource.certifications.contains(\"hipaa_baa\") };\n\
         @id(\"t1_no_spot\")\nforbid (principal == Ace::Tenant::\"t1\", action, resource) when { resource.tier == \"spot\" };\n",
    );
    for a in extra_actions {
        let _ = writeln!(
            s,
            "@id(\"deny_{a}\")\nforbid (principal, action == Ace::Action::\"{a}\", resource);"
        );
        let _ = writeln!(
            s,
            "@id(\"allow_{a}\")\npermit (principal, action == Ace::Action::\"{a}\", resource);"
        );
    }
    if admin {
        s += "@id(\"admins\")\npermit (principal is Ace::Admin, action, resource);\n";
    }
    if group {
        s += "@id(\"regulated_no_spot\")\nforbid (principal in Ace::TenantGroup::\"regulated\", action, resource) when { resource.tier == \"spot\" };\n";
    }
    if pool {
        s += "@id(\"eu_pool_public\")\nforbid (principal, action, resource in Ace::Pool::\"eu\") when { context.data_class == \"phi\" };\n";
    }
    if org {
        s += "@id(\"org\")\nforbid (principal in Ace::Org::\"o\", action, resource);\n";
    }
    if region {
        s += "@id(\"region\")\npermit (principal, action, resource in Ace::Region::\"r\");\n";
    }
    s
}

/// A list with `must` and optionally `extra`, in either order.
fn listed(must: &'static str, extra: &'static str) -> impl Strategy<Value = Vec<&'static str>> {
    (0..3u8).prop_map(move |k| match k {
        0 => vec![must],
        1 => vec![must, extra],
        _ => vec![extra, must],
    })
}

/// Parents: none, `want`, `other`, or both in either order.
fn parents(want: &'static str, other: &'static str) -> impl Strategy<Value = Vec<&'static str>> {
    (0..5u8).prop_map(move |k| match k {
        0 => vec![],
        1 => vec![want],
        2 => vec![other],
        3 => vec![want, other],
        _ => vec![other, want],
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 32, ..ProptestConfig::default() })]

    #[test]
    fn shapes_compile_exactly_or_are_refused(
        extra in prop::sample::subsequence(vec!["audit".to_string(), "a_admin".to_string(), "zz_export".to_string()], 0..=3),
        principals in listed("Tenant", "Admin"),
        resources in listed("Destination", "Bucket"),
        tenant_in in parents("TenantGroup", "Org"),
        dest_in in parents("Pool", "Region"),
        groups in any::<bool>(),
        pools in any::<bool>(),
    ) {
        let mut actions = extra.clone();
        actions.push("dispatch".into());
        actions.sort();
        let has_group = tenant_in.contains(&"TenantGroup");
        let has_pool = dest_in.contains(&"Pool");
        let sources = Sources {
            schema: (PathBuf::from("shape.cedarschema"), schema(&actions, &principals, &resources, &tenant_in, &dest_in)),
            policies: vec![(PathBuf::from("shape.cedar"), policies(
                &extra,
                principals.contains(&"Admin"),
                has_group,
                has_pool,
                tenant_in.contains(&"Org"),
                dest_in.contains(&"Region"),
            ))],
            manifest: (PathBuf::from("fleet.toml"), manifest(groups, pools)),
        };
        let loaded = Project::load(sources.clone());
        if (groups && !has_group) || (pools && !has_pool) {
            let e = loaded.unwrap_err().to_string();
            prop_assert!(e.contains("is in groups") || e.contains("is in pools"), "{e}");
            prop_assert!(e.contains("fleet.toml:"), "{e}");
            return Ok(());
        }
        let project = loaded.map_err(|e| TestCaseError::fail(format!("{e}\n{}", sources.schema.1)))?;
        let compiled = compile(&project).unwrap();
        let oracle = Oracle::load(&sources).unwrap();
        let report = verify(&oracle, &compiled.bytes).unwrap();
        prop_assert!(report.exhaustive);
        prop_assert!(report.known > 0);
        prop_assert!(report.mismatch_count == 0, "{:?}\n{}", report.mismatches, sources.schema.1);
    }
}

#[test]
fn a_schema_without_dispatch_or_tenant_is_refused() {
    let fleet = manifest(false, false);
    let load = |schema_text: String| {
        Project::load(Sources {
            schema: (PathBuf::from("s.cedarschema"), schema_text),
            policies: vec![(
                PathBuf::from("p.cedar"),
                "permit (principal, action, resource);\n".into(),
            )],
            manifest: (PathBuf::from("fleet.toml"), fleet.clone()),
        })
        .unwrap_err()
        .to_string()
    };
    let cases = [
        ("route", "Tenant", "Destination", "no action `dispatch`"),
        ("dispatch", "Admin", "Destination", "not to `Ace::Tenant`"),
        ("dispatch", "Tenant", "Bucket", "not to `Ace::Destination`"),
    ];
    for (action, principal, resource, want) in cases {
        let e = load(schema(
            &[action.into()],
            &[principal],
            &[resource],
            &[],
            &[],
        ));
        assert!(
            e.contains("s.cedarschema:") && e.contains(want) && e.contains("hint:"),
            "{e}"
        );
    }
}
