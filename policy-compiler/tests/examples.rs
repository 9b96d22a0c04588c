//! The example policy directory compiles, and the compiled tables equal
//! Cedar over its whole request space; bad inputs are reported at their
//! file, line and column with a hint.

use ace_policy::oracle::Oracle;
use ace_policy::{compile, explain, load_dir, verify, Project, Sources};
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

#[test]
fn example_directory_compiles_and_verifies_exhaustively() {
    let project = load_dir(&examples()).unwrap();
    let compiled = compile(&project).unwrap();
    assert!(compiled.warnings.is_empty(), "{:?}", compiled.warnings);
    let oracle = Oracle::load(&project.sources).unwrap();
    let report = verify::verify(&oracle, &compiled.bytes).unwrap();
    assert!(report.exhaustive);
    assert_eq!(report.requests, report.space);
    assert!(report.known > 0 && report.known < report.requests);
    assert_eq!(report.mismatch_count, 0, "{:?}", report.mismatches);
    // Eleven example policies: one permit factor (model), and forbids keyed
    // by data_class, tenant, model, tp_degree with model and nothing, and by the
    // computed `substituted` and `cached` with tenant or data_class.
    assert_eq!(project.info.len(), 11);
    let keys: Vec<Vec<String>> = compiled
        .factors
        .iter()
        .map(|f| f.attributes.clone())
        .collect();
    assert!(keys.contains(&vec![]));
    assert!(keys.contains(&vec!["tenant".to_string()]));
    assert!(keys.contains(&vec!["data_class".to_string()]));
}

#[test]
fn committed_tables_are_current() {
    // `policies/out/` is committed so that other crates' tests can load
    // real tables; it must be what the compiler makes of the sources now.
    let project = load_dir(&examples()).unwrap();
    let compiled = compile(&project).unwrap();
    let committed = std::fs::read(ace_policy::tables_path(&examples())).unwrap();
    assert!(
        committed == compiled.bytes,
        "policies/out/tables.acet is stale: run `ace policy compile policies/`"
    );
}

#[test]
fn explain_names_the_determining_policies() {
    let project = load_dir(&examples()).unwrap();
    let compiled = compile(&project).unwrap();
    let request = serde_json::json!({
        "tenant": "northbank", "data_class": "personal_eu", "model": "llama-3.1-8b",
        "latency_class": "interactive", "tp_degree": 1
    });
    let oracle = Oracle::load(&project.sources).unwrap();
    let (lines, notes) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    for l in &lines {
        assert_eq!(l.cedar, l.table, "{l:?}");
    }
    let us = lines
        .iter()
        .find(|l| l.destination == "us-inhouse-h100")
        .unwrap();
    assert!(!us.cedar);
    assert_eq!(us.policies, vec!["eu_residency".to_string()]);
    let spot = lines
        .iter()
        .find(|l| l.destination == "eu-spot-l4")
        .unwrap();
    assert_eq!(spot.policies, vec!["northbank_no_spot".to_string()]);
    let eu = lines
        .iter()
        .find(|l| l.destination == "eu-inhouse-h100")
        .unwrap();
    assert!(eu.cedar);
    assert_eq!(eu.policies, vec!["serves_model".to_string()]);
    // An unseen model fails closed everywhere.
    let request = serde_json::json!({"tenant": "globex", "data_class": "public", "model": "gpt-9",
        "latency_class": "batch", "tp_degree": 1});
    let (lines, notes) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    assert!(lines.iter().all(|l| !l.table));
    // Cedar asked about an unseen model allows nowhere either (no
    // destination serves it), so every line agrees; an unseen tenant is
    // denied by design where Cedar would allow.
    assert!(lines.iter().all(|l| l.verdict != explain::Verdict::Differ));
    let request = serde_json::json!({"tenant": "nobody", "data_class": "public", "model": "llama-3.1-8b",
        "latency_class": "batch", "tp_degree": 1});
    let (lines, _) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    assert!(lines
        .iter()
        .any(|l| l.verdict == explain::Verdict::FailClosed));
    assert!(lines.iter().all(|l| l.verdict != explain::Verdict::Differ));
    let text = explain::render_explanation(&lines, &[]);
    assert!(text.contains("denied by design"), "{text}");
    assert!(notes.iter().any(|n| n.contains("gpt-9")));
}

#[test]
fn corrupted_tables_are_rejected_by_verify() {
    let project = load_dir(&examples()).unwrap();
    let mut bytes = compile(&project).unwrap().bytes;
    let oracle = Oracle::load(&project.sources).unwrap();
    let n = bytes.len();
    bytes[n - 40] ^= 0x10;
    let e = verify::verify(&oracle, &bytes).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!(verify::verify(&oracle, &bytes[..n / 2]).is_err());
}

/// The example sources with one file's text replaced.
/// The example manifest without its `[slo.<class>]` tables, for edits that
/// take latency classes away (an objective must name a class).
fn without_slo(fleet: &str) -> String {
    let from = fleet.find("[slo.").unwrap_or(fleet.len());
    let end = "[slo.batch]\ne2e_base_ms = 600000\n";
    let to = fleet.find(end).map_or(from, |i| i + end.len());
    format!("{}{}", &fleet[..from], &fleet[to..])
}

fn with(file: &str, edit: impl FnOnce(&str) -> String) -> Sources {
    let mut s = Sources::read_dir(&examples()).unwrap();
    let slot = if file == "fleet.toml" {
        &mut s.manifest
    } else if file.ends_with(".cedarschema") {
        &mut s.schema
    } else {
        s.policies
            .iter_mut()
            .find(|(p, _)| p.ends_with(file))
            .unwrap()
    };
    slot.1 = edit(&slot.1);
    s
}

fn error_of(s: Sources) -> String {
    let e = Project::load(s)
        .and_then(|p| compile(&p).map(|_| ()))
        .unwrap_err();
    e.to_string()
}

#[test]
fn syntax_error_has_file_line_column_and_hint() {
    let msg = error_of(with("sanctions.cedar", |t| t.replace("when {", "when {{")));
    assert!(msg.contains("sanctions.cedar:8:"), "{msg}");
    assert!(msg.contains("hint:"), "{msg}");
}

#[test]
fn schema_violation_is_located() {
    let msg = error_of(with("eu_residency.cedar", |t| {
        t.replace("resource.jurisdiction", "resource.jurisdicton")
    }));
    assert!(msg.contains("eu_residency.cedar:11:"), "{msg}");
    assert!(msg.contains("jurisdicton"), "{msg}");
}

#[test]
fn manifest_value_outside_its_domain_is_located() {
    let msg = error_of(with("fleet.toml", |t| {
        t.replacen("tier = \"spot\"", "tier = \"spotty\"", 1)
    }));
    assert!(msg.contains("fleet.toml:"), "{msg}");
    assert!(
        msg.contains("`spotty`") && msg.contains("hint: use one of"),
        "{msg}"
    );
    let msg = error_of(with("fleet.toml", |t| {
        t.replacen(
            "\"mistral-small\", \"mistral-large\"]",
            "\"mistral-tiny\"]",
            1,
        )
    }));
    assert!(
        msg.contains("mistral-tiny") && msg.contains("catalogue"),
        "{msg}"
    );
    let msg = error_of(with("fleet.toml", |t| {
        t.replace("values = [1, 2, 4, 8]", "values = [1, \"two\"]")
    }));
    assert!(msg.contains("fleet.toml:") && msg.contains("Long"), "{msg}");
}

#[test]
fn reading_an_attribute_without_a_domain_is_located() {
    // Without a domain for latency_class the directory still compiles, as
    // no policy reads it; a policy that does is an error at the read.
    let no_domain = with("fleet.toml", |t| {
        without_slo(&t.replace(
            "[request.latency_class]\nvalues = [\"interactive\", \"standard\", \"batch\"]\n",
            "",
        ))
    });
    assert!(Project::load(no_domain).is_ok());
    let mut s = with("fleet.toml", |t| {
        without_slo(&t.replace(
            "[request.latency_class]\nvalues = [\"interactive\", \"standard\", \"batch\"]\n",
            "",
        ))
    });
    s.policies.push((
        PathBuf::from("policies/batch.cedar"),
        "// batch only on spot\nforbid (principal, action, resource)\n  when { context.latency_class == \"batch\" && resource.tier != \"spot\" };\n".into(),
    ));
    let msg = error_of(s);
    assert!(msg.contains("batch.cedar:3:10"), "{msg}");
    assert!(
        msg.contains("no finite domain") && msg.contains("[request.latency_class]"),
        "{msg}"
    );
}

#[test]
fn cedar_evaluation_error_names_the_policy_and_the_request() {
    let mut s = Sources::read_dir(&examples()).unwrap();
    s.policies.push((
        PathBuf::from("policies/overflow.cedar"),
        "@id(\"overflows\")\nforbid (principal, action, resource)\n  when { context.tp_degree * 4611686018427387904 > 0 };\n".into(),
    ));
    let msg = error_of(s);
    assert!(msg.contains("overflow.cedar:1:1"), "{msg}");
    assert!(
        msg.contains("policy `overflows` failed to evaluate"),
        "{msg}"
    );
    assert!(msg.contains("tp_degree=2"), "{msg}");
}

#[test]
fn cost_parameters_are_validated_and_defaults_resolved() {
    let msg = error_of(with("fleet.toml", |t| {
        t.replacen("knee = 0.8", "knee = 1.5", 1)
    }));
    assert!(
        msg.contains("fleet.toml:") && msg.contains("`knee`"),
        "{msg}"
    );
    let msg = error_of(with("fleet.toml", |t| {
        t.replacen(
            "warm_models = [\"llama-3.1-8b\", \"llama-3.1-70b\"]",
            "warm_models = [\"gpt-4o\"]",
            1,
        )
    }));
    assert!(msg.contains("warm model `gpt-4o`"), "{msg}");
    let project = load_dir(&examples()).unwrap();
    let fleet = project.manifest.resolved();
    assert_eq!(fleet.len(), 12);
    let openai = fleet.iter().find(|d| d.name == "openai-us").unwrap();
    assert_eq!(
        (openai.capacity, openai.knee, openai.bias, openai.gpus),
        (None, 0.8, 1.0, 1)
    );
    assert_eq!(openai.warm_models, openai.models);
    // fleet.json is the committed rendering of the same.
    let committed = std::fs::read_to_string(examples().join("out/fleet.json")).unwrap();
    let parsed: Vec<ace_policy::manifest::ResolvedDestination> =
        serde_json::from_str(&committed).unwrap();
    assert_eq!(parsed, fleet);
}

#[test]
fn json_schema_lists_exactly_the_cost_fields() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(examples().join("fleet.schema.json")).unwrap(),
    )
    .unwrap();
    let in_schema: std::collections::BTreeSet<String> = schema["properties"]["destinations"]
        ["items"]["properties"]["cost"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let in_rust: std::collections::BTreeSet<String> =
        serde_json::to_value(ace_policy::manifest::Cost::default())
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
    assert_eq!(
        in_schema, in_rust,
        "policies/fleet.schema.json and manifest::Cost disagree"
    );
}

#[test]
fn verify_and_explain_handle_any_destination_name() {
    // A name with a quote, a backslash and non-ASCII text, which Cedar
    // escapes when it prints an entity id.
    let odd = r#"eu "quoted" \ zürich"#;
    let s = with("fleet.toml", |t| {
        t.replacen(
            "name = \"eu-inhouse-h100\"",
            &format!("name = {}", toml::Value::String(odd.into())),
            1,
        )
    });
    let project = Project::load(s).unwrap();
    let compiled = compile(&project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    let report = verify::verify(&oracle, &compiled.bytes).unwrap();
    assert_eq!(report.mismatch_count, 0, "{:?}", report.mismatches);
    let request = serde_json::json!({
        "tenant": "northbank", "data_class": "personal_eu", "model": "llama-3.1-8b",
        "latency_class": "interactive", "tp_degree": 1
    });
    let (lines, _) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    let line = lines.iter().find(|l| l.destination == odd).unwrap();
    assert!(line.cedar && line.table, "{line:?}");
}

#[test]
fn refusals_name_the_input_and_the_reason() {
    // Groups the schema has no type for are refused, not dropped.
    let msg = error_of(with("ace.cedarschema", |t| {
        t.replace("entity Tenant in [TenantGroup] {", "entity Tenant {")
    }));
    assert!(
        msg.contains("fleet.toml:") && msg.contains("is in groups") && msg.contains("TenantGroup"),
        "{msg}"
    );
    // A tenant attribute the manifest cannot give; a custom destination
    // attribute of a type the manifest cannot write.
    let msg = error_of(with("ace.cedarschema", |t| {
        t.replace(
            "    home_jurisdiction?: String,",
            "    home_jurisdiction?: String,\n    tier_level: Long,",
        )
    }));
    assert!(
        msg.contains("ace.cedarschema:") && msg.contains("`tier_level`"),
        "{msg}"
    );
    let msg = error_of(with("ace.cedarschema", |t| {
        t.replace(
            "    owner_team?: String,",
            "    owner_team?: String,\n    subnet?: ipaddr,",
        )
    }));
    assert!(
        msg.contains("ace.cedarschema:") && msg.contains("`subnet`") && msg.contains("Set<Long>"),
        "{msg}"
    );
    // A context attribute of a set type, read by a policy.
    let mut s = with("ace.cedarschema", |t| {
        t.replace(
            "      tp_degree: Long,",
            "      tp_degree: Long,\n      regions: Set<String>,",
        )
    });
    s.policies.push((
        PathBuf::from("policies/regions.cedar"),
        "forbid (principal, action, resource)\n  when { context.regions.contains(resource.region) };\n".into(),
    ));
    let msg = error_of(s);
    assert!(
        msg.contains("regions.cedar:2:10")
            && msg.contains("`Set<String>`")
            && !msg.contains("list its values"),
        "{msg}"
    );
    // An impossible policy is an error unless allowed.
    let mut s = Sources::read_dir(&examples()).unwrap();
    s.policies.push((
        PathBuf::from("policies/never.cedar"),
        "forbid (principal, action, resource)\n  when { context.tp_degree > 1 && false };\n".into(),
    ));
    let msg = error_of(s.clone());
    assert!(
        msg.contains("never.cedar:") && msg.contains("can never apply"),
        "{msg}"
    );
    s.policies.last_mut().unwrap().1 = format!(
        "@allow_impossible(\"parked\")\n{}",
        s.policies.last().unwrap().1
    );
    assert!(Project::load(s).is_ok());
    // Values listed for an attribute whose values come from elsewhere.
    let msg = error_of(with("fleet.toml", |t| {
        t.replace(
            "[request.tp_degree]",
            "[request.model]\nvalues = [\"x\"]\n\n[request.tp_degree]",
        )
    }));
    assert!(msg.contains("`[request.model]` lists values"), "{msg}");
}

#[test]
fn a_policy_set_that_allows_nothing_is_warned_about() {
    let s = with("model_capability.cedar", |t| {
        t.replace(
            "resource.models.contains(context.model)",
            "resource.models.contains(context.model) && resource.vram_gb < 0",
        )
    });
    let project = Project::load(s).unwrap();
    let compiled = compile(&project).unwrap();
    assert!(
        compiled
            .warnings
            .iter()
            .any(|w| w.to_string().contains("allow no request")),
        "{:?}",
        compiled.warnings
    );
}

/// The example sources with custom destination attributes: `rack`
/// (String, required) on every destination, `tags` (Set<String>) on some.
fn with_custom_attributes() -> Sources {
    let mut s = with("ace.cedarschema", |t| {
        t.replace(
            "    owner_team?: String,",
            "    owner_team?: String,\n    rack: String,\n    tags?: Set<String>,",
        )
    });
    let mut n = 0;
    s.manifest.1 = s
        .manifest
        .1
        .lines()
        .map(|l| {
            if l.starts_with("interconnect = ") {
                n += 1;
                let tags = if n % 3 == 0 {
                    ", tags = [\"quiet\"]"
                } else {
                    ""
                };
                format!("{l}\nattributes = {{ rack = \"r{}\"{tags} }}", n % 2)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    s.policies.push((
        PathBuf::from("policies/racks.cedar"),
        "@id(\"phi_not_on_rack_1\")\nforbid (principal, action, resource)\n  when { context.data_class == \"phi\" && resource.rack == \"r1\" };\n\
         @id(\"batch_only_quiet\")\nforbid (principal, action, resource)\n  when { context.latency_class == \"batch\" }\n  unless { resource has tags && resource.tags.contains(\"quiet\") };\n"
            .into(),
    ));
    s
}

#[test]
fn custom_destination_attributes_compile_exactly() {
    let project = Project::load(with_custom_attributes()).unwrap();
    let compiled = compile(&project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    let report = verify::verify(&oracle, &compiled.bytes).unwrap();
    assert!(report.exhaustive);
    assert_eq!(report.mismatch_count, 0, "{:?}", report.mismatches);
    // The forbids bite: batch requests reach only the `quiet` destinations.
    let request = serde_json::json!({"tenant": "globex", "data_class": "public",
        "model": "llama-3.1-8b", "latency_class": "batch", "tp_degree": 1});
    let (lines, _) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    assert!(lines
        .iter()
        .any(|l| l.policies.contains(&"batch_only_quiet".to_string())));
    // An undeclared one, a built-in one and a mistyped one are refused.
    for (edit, want) in [
        (
            "attributes = { rack = \"r1\", colour = \"red\" }",
            "does not declare",
        ),
        (
            "attributes = { rack = \"r1\", tier = \"spot\" }",
            "built-in field `tier`",
        ),
        ("attributes = { rack = 7 }", "the schema says `String`"),
    ] {
        let mut s = with_custom_attributes();
        s.manifest.1 = s
            .manifest
            .1
            .replacen("attributes = { rack = \"r1\" }", edit, 1);
        let msg = error_of(s);
        assert!(msg.contains("fleet.toml:") && msg.contains(want), "{msg}");
    }
}

/// The examples with context attributes of extension and entity types.
fn with_typed_context() -> Sources {
    let mut s = with("ace.cedarschema", |t| {
        t.replace(
            "      tp_degree: Long,",
            "      tp_degree: Long,\n      client_net: ipaddr,\n      budget: decimal,\n      home: Pool,",
        )
    });
    s.manifest.1 = s.manifest.1.replace(
        "[request.tp_degree]",
        "[request.client_net]\nvalues = [\"10.0.0.1\", \"192.168.1.7\"]\n\n[request.budget]\nvalues = [\"0.5\", \"2.0\"]\n\n[request.home]\nvalues = [\"eu\", \"us\"]\n\n[request.tp_degree]",
    );
    s.policies.push((
        PathBuf::from("policies/typed.cedar"),
        "@id(\"lan_not_on_spot\")\nforbid (principal, action, resource)\n  when { context.client_net.isInRange(ip(\"192.168.0.0/16\")) && resource.tier == \"spot\" };\n\
         @id(\"cheap_not_ondemand\")\nforbid (principal, action, resource)\n  when { context.budget.lessThan(decimal(\"1.0\")) && resource.tier == \"ondemand\" };\n\
         @id(\"stay_home\")\nforbid (principal, action, resource)\n  unless { resource in context.home };\n"
            .into(),
    ));
    s
}

#[test]
fn extension_and_entity_context_attributes_compile_exactly() {
    let project = Project::load(with_typed_context()).unwrap();
    let compiled = compile(&project).unwrap();
    let oracle = Oracle::load(&project.sources).unwrap();
    let report = verify::verify(&oracle, &compiled.bytes).unwrap();
    assert!(report.known > 1000, "{}", report.coverage_line());
    assert_eq!(report.mismatch_count, 0, "{:?}", report.mismatches);
    let request = serde_json::json!({"tenant": "globex", "data_class": "public",
        "model": "llama-3.1-8b", "latency_class": "batch", "tp_degree": 1,
        "client_net": "192.168.1.7", "budget": "0.5", "home": "eu"});
    let (lines, notes) = explain::explain(&oracle, &compiled.bytes, &request).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert!(lines.iter().all(|l| l.verdict == explain::Verdict::Agree));
    let stay = lines
        .iter()
        .find(|l| l.destination == "us-inhouse-h100")
        .unwrap();
    assert_eq!(stay.policies, vec!["stay_home".to_string()]);
    // A value Cedar cannot parse is refused at its place.
    let mut s = with_typed_context();
    s.manifest.1 = s.manifest.1.replace("\"192.168.1.7\"", "\"192.168.1.700\"");
    let msg = error_of(s);
    assert!(
        msg.contains("fleet.toml:") && msg.contains("`192.168.1.700`") && msg.contains("`ipaddr`"),
        "{msg}"
    );
}

#[test]
fn schema_warnings_are_shown() {
    // An entity type named like a built-in extension type: Cedar warns.
    let s = with("ace.cedarschema", |t| {
        t.replace("  entity Pool;", "  entity Pool;\n  entity decimal;")
    });
    let project = Project::load(s).unwrap();
    let compiled = compile(&project).unwrap();
    assert!(
        compiled.warnings.iter().any(
            |w| w.to_string().contains("ace.cedarschema:") && w.to_string().contains("decimal")
        ),
        "{:?}",
        compiled.warnings
    );
}

#[test]
fn too_many_request_attributes_is_a_limit_with_its_place() {
    let extra: String = (0..256)
        .map(|i| format!("      extra_{i}: String,\n"))
        .collect();
    let msg = error_of(with("ace.cedarschema", |t| {
        t.replace(
            "      tp_degree: Long,\n",
            &format!("      tp_degree: Long,\n{extra}"),
        )
    }));
    assert!(
        msg.contains("ace.cedarschema:")
            && msg.contains("at most 256")
            && msg.contains("MAX_ATTRIBUTES")
            && !msg.contains("bug"),
        "{msg}"
    );
}

/// Policies at the shape limits (`ace_policy::limits`) load and compile on a test thread's stack (2 MiB) in a debug build, where frames
/// are largest; one step past them is refused at its line, never a crash.
#[test]
fn policies_at_the_shape_limits_compile_and_past_them_are_refused() {
    let dir = examples();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let sources = |policy: String| Sources {
        schema: (dir.join("ace.cedarschema"), read("ace.cedarschema")),
        policies: vec![
            (
                dir.join("model_capability.cedar"),
                read("model_capability.cedar"),
            ),
            (PathBuf::from("shape.cedar"), policy),
        ],
        manifest: (dir.join("fleet.toml"), read("fleet.toml")),
    };
    for (what, at, past) in ace_policy::limits::shapes_at_the_limits() {
        let project = Project::load(sources(at)).unwrap_or_else(|e| panic!("{what}: {e}"));
        // Compiling evaluates the policy with Cedar (its evaluator recurses
        // as its parser does).
        let compiled = compile(&project).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!compiled.bytes.is_empty(), "{what}");
        let e = Project::load(sources(past))
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        let e = e.to_string();
        assert!(e.contains("shape.cedar:2:"), "{what}: {e}");
    }
}

/// A policy whose attributes together have more value combinations than
/// a factor may hold is refused at the policy, naming the count; the count
/// is computed in 64 bits, so the browser's 32-bit build refuses it too.
#[test]
fn a_policy_over_too_many_value_combinations_is_refused_at_its_line() {
    let dir = examples();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let many = |n: usize, f: &dyn Fn(usize) -> String| (0..n).map(f).collect::<Vec<_>>().join(", ");
    let fleet = without_slo(&read("fleet.toml"))
        .replace(
            "values = [\"public\", \"internal\", \"confidential\", \"personal_eu\", \"phi\"]",
            &format!("values = [{}]", many(700, &|i| format!("\"d{i}\""))),
        )
        .replace(
            "values = [\"interactive\", \"standard\", \"batch\"]",
            &format!("values = [{}]", many(700, &|i| format!("\"l{i}\""))),
        );
    let policy = "@id(\"wide\")\nforbid (principal, action, resource)\n\
                  when { context.data_class == \"d1\" && context.latency_class == \"l2\" \
                  && context.tp_degree == 8 && principal == Ace::Tenant::\"globex\" };\n";
    let sources = Sources {
        schema: (dir.join("ace.cedarschema"), read("ace.cedarschema")),
        policies: vec![
            (
                dir.join("model_capability.cedar"),
                read("model_capability.cedar"),
            ),
            (PathBuf::from("wide.cedar"), policy.to_string()),
        ],
        manifest: (dir.join("fleet.toml"), fleet),
    };
    let project = Project::load(sources).unwrap_or_else(|e| panic!("{e}"));
    let e = compile(&project)
        .err()
        .unwrap_or_else(|| panic!("compiled"))
        .to_string();
    // (700 + 1) x (700 + 1) x (4 + 1) x (6 + 1) combinations.
    assert!(
        e.contains("wide.cedar:") && e.contains("17199035 value combinations"),
        "{e}"
    );
}
