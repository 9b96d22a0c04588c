//! Planted faults: a compiler that picks the wrong action, drops a tenant's
//! groups, loses a policy, or writes a wrong bit produces tables that
//! `verify` reports as mismatched, because verify builds Cedar's entities
//! and requests without the compiler (`ace_policy::oracle`).
#![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "test")]

use ace_policy::oracle::Oracle;
use ace_policy::verify::{verify, verify_until, Report};
use ace_policy::{compile, Project, Sources};
use cedar_policy::{Entities, Entity, EntityUid};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

/// The examples, plus a second action beside `dispatch` and a policy on a
/// tenant group, so that each fault below changes some answer.
fn sources() -> Sources {
    let mut s = Sources::read_dir(&examples()).unwrap();
    s.schema.1 = s.schema.1.replace(
        "  action dispatch appliesTo {",
        "  action audit appliesTo { principal: Tenant, resource: Destination };\n  action dispatch appliesTo {",
    );
    s.policies.push((
        PathBuf::from("public_sector.cedar"),
        "@id(\"public_sector_inhouse\")\nforbid (principal in Ace::TenantGroup::\"public-sector\", action, resource)\nunless { resource.tier == \"inhouse\" };\n".into(),
    ));
    s
}

/// Verify `project`'s tables, stopping at the first 100 mismatches: a
/// planted fault needs to be caught, not counted to the end.
fn check(project: &Project) -> Report {
    let compiled = compile(project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    verify_until(&oracle, &compiled.bytes, 100).unwrap()
}

#[test]
fn the_unplanted_directory_verifies() {
    let project = Project::load(sources()).unwrap();
    let compiled = compile(&project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    let report = verify(&oracle, &compiled.bytes).unwrap();
    assert!(!report.stopped);
    assert!(report.exhaustive);
    assert_eq!(report.mismatch_count, 0, "{:?}", report.mismatches);
}

#[test]
fn a_wrong_action_is_caught() {
    let mut project = Project::load(sources()).unwrap();
    project.action = EntityUid::from_str("Ace::Action::\"audit\"").unwrap();
    let report = check(&project);
    assert!(report.mismatch_count > 0);
}

#[test]
fn a_dropped_group_is_caught() {
    let mut project = Project::load(sources()).unwrap();
    let tenant = "Ace::Tenant";
    let rebuilt: Vec<Entity> = project
        .entities
        .iter()
        .map(|e| {
            let (uid, attrs, parents) = e.clone().into_inner();
            let parents = if uid.type_name().to_string() == tenant {
                HashSet::new()
            } else {
                parents
            };
            Entity::new(uid, attrs, parents).unwrap()
        })
        .collect();
    project.entities = Entities::from_entities(rebuilt, None).unwrap();
    let report = check(&project);
    assert!(report.mismatch_count > 0);
    assert!(
        report
            .mismatches
            .iter()
            .all(|m| m.request.contains("tenant=eu-gov") && m.table && !m.cedar),
        "{:?}",
        report.mismatches
    );
}

#[test]
fn a_lost_policy_is_caught() {
    let mut project = Project::load(sources()).unwrap();
    let kept: Vec<_> = project
        .policies
        .policies()
        .filter(|p| p.id().to_string() != "phi_needs_baa")
        .cloned()
        .collect();
    project.policies = cedar_policy::PolicySet::from_policies(kept).unwrap();
    project.info.retain(|p| p.id != "phi_needs_baa");
    let report = check(&project);
    assert!(report.mismatch_count > 0);
    assert!(report
        .mismatches
        .iter()
        .all(|m| m.request.contains("data_class=phi")));
}

#[test]
fn flipped_bits_are_caught() {
    let project = Project::load(sources()).unwrap();
    let compiled = compile(&project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    // The forbid factor keyed by nothing (the sanctions list): one row, a
    // fixed mask. Setting a bit shuts a destination that some request may
    // use; clearing a sanctioned one opens it.
    let f = compiled
        .spec
        .factors
        .iter()
        .position(|f| f.kind == ace_core::tables::FactorKind::Forbid && f.attributes.is_empty())
        .unwrap();
    let sanctioned: Vec<usize> = project
        .manifest
        .manifest
        .destinations
        .iter()
        .enumerate()
        .filter(|(_, d)| d.get_ref().region.starts_with("ru-"))
        .map(|(i, _)| i)
        .collect();
    assert!(!sanctioned.is_empty());
    for d in [0].into_iter().chain(sanctioned) {
        let mut spec = compiled.spec.clone();
        spec.factors[f].rows[d / 64] ^= 1 << (d % 64);
        let bytes = ace_core::tables::encode(&spec).unwrap();
        let report = verify_until(&oracle, &bytes, 100).unwrap();
        assert!(
            report.mismatch_count > 0,
            "flipping destination {d} was not caught"
        );
        assert!(report.mismatches.iter().all(|m| m.destination
            == project.manifest.manifest.destinations[d]
                .get_ref()
                .name
                .get_ref()
                .as_str()));
    }
}
