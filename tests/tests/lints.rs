//! The workspace's lints, kept as cedar keeps them: set once in the root
//! `Cargo.toml`, with `unsafe_code` forbidden, and one `rust-version`.
//!
//! - Every crate inherits `[workspace.lints]` (`[lints] workspace = true`)
//!   but those in [`UNSAFE`], which need `unsafe` (a C ABI, a global
//!   allocator). Cargo cannot inherit the workspace's lints with one of
//!   them changed, so each of those copies the table without
//!   `unsafe_code`; this keeps the copies equal to it, and sends a crate
//!   that no longer has `unsafe` code back to inheriting.
//! - Every crate inherits `rust-version` from the workspace.
//! - Every product crate's roots (its library, its binaries) deny the
//!   no-panic lints, [`NO_PANIC`], but those in [`PANICS_PENDING`], each
//!   with what stands in the way; a crate that gains them leaves the list.
//!
//! The manifests are read as text: the few shapes they use (`[section]`,
//! `key = value`, dotted keys) are all this needs.

use crate::crate_graph::PRODUCT;
use crate::workspace::{self, Package};
use std::collections::BTreeMap;

/// The crates that need `unsafe`.
const UNSAFE: &[&str] = &[
    // the allocator and proxy-wasm's host calls
    "ace-filter",
    // Envoy's dynamic-module C ABI: the module, its bindings, a fake of it,
    // and the benchmark floor made through it
    "ace-dynamic",
    "ace-dynamic-abi",
    "ace-conformance",
    "ace-bench-dynamic-floor",
    // proxy-wasm's ABI without the SDK
    "ace-bench-minimal-filter",
    "ace-example-callback-log",
];

/// What a panic in product code would be: Envoy's worker (or the `ace`
/// command) dying on input. Tests may still assert with them
/// (`clippy.toml`).
const NO_PANIC: &[&str] = &[
    "clippy::unwrap_used",
    "clippy::expect_used",
    "clippy::panic",
    "clippy::indexing_slicing",
];

/// Product crates whose roots do not deny [`NO_PANIC`] yet, and why.
const PANICS_PENDING: &[(&str, &str)] = &[(
    "ace-planner",
    "180 sites (171 indexing, 8 slicing, one expect), nearly all into the solvers' \
         arrays (rt.rs 67, full.rs 31, fast.rs 15, scenario.rs 10, 57 more in 12 files)",
)];

/// A manifest as `section.key` → value, for `key = value` lines (values
/// as written; arrays over several lines and comments left out).
fn manifest(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut section = String::new();
    let mut in_array = false;
    for line in text.lines() {
        let line = line.trim();
        if in_array {
            in_array = !line.starts_with(']');
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('[') && !value.ends_with(']') {
            in_array = true;
            continue;
        }
        out.insert(format!("{section}.{}", key.trim()), value.to_string());
    }
    out
}

/// The entries of `m` under `prefix.`, with the prefix taken off.
fn under(m: &BTreeMap<String, String>, prefix: &str) -> BTreeMap<String, String> {
    m.iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(prefix)
                .and_then(|k| k.strip_prefix('.'))
                .map(|k| (k.to_string(), v.clone()))
        })
        .collect()
}

/// Whether any Rust source under `dir` has `unsafe` code (a block, a
/// function, an `extern` block or an impl).
fn has_unsafe(dir: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let path = e.path();
        if path.is_dir() {
            return has_unsafe(&path);
        }
        path.extension().is_some_and(|x| x == "rs")
            && std::fs::read_to_string(&path).is_ok_and(|text| {
                ["unsafe {", "unsafe fn", "unsafe extern", "unsafe impl"]
                    .iter()
                    .any(|u| text.contains(u))
            })
    })
}

/// The lints a crate root denies in its `#![deny(...)]` attributes.
fn denied(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("#![deny(") {
        let after = &rest[at + "#![deny(".len()..];
        let end = after.find(")]").unwrap_or(after.len());
        out.extend(
            after[..end]
                .split(',')
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty()),
        );
        rest = &after[end..];
    }
    out
}

/// Every problem with the crates' lints, one line each (empty: none).
fn problems(
    root_manifest: &str,
    packages: &BTreeMap<String, Package>,
    read: &dyn Fn(&std::path::Path) -> String,
) -> Vec<String> {
    let mut out = Vec::new();
    let root = workspace::root();
    let workspace = manifest(root_manifest);
    let lints = under(&workspace, "workspace.lints");
    if lints.get("rust.unsafe_code").map(String::as_str) != Some("\"forbid\"") {
        out.push(
            "Cargo.toml: [workspace.lints.rust] has no unsafe_code = \"forbid\"; \
             crates that need unsafe copy the table instead (UNSAFE in tests/tests/lints.rs)"
                .to_string(),
        );
    }
    let mut copy = lints.clone();
    copy.remove("rust.unsafe_code");
    let inherit = BTreeMap::from([("workspace".to_string(), "true".to_string())]);
    for p in packages.values() {
        let path = format!("{}Cargo.toml", p.folder);
        let own = manifest(&read(&root.join(&path)));
        let has = under(&own, "lints");
        if UNSAFE.contains(&p.name.as_str()) {
            if !has_unsafe(&root.join(&p.folder).join("src")) {
                out.push(format!(
                    "{}: has no unsafe code: give {path} `[lints] workspace = true` \
                     and take it out of UNSAFE in tests/tests/lints.rs",
                    p.name
                ));
            } else if has != copy {
                out.push(format!(
                    "{}: {path}'s [lints] must be the root's [workspace.lints] without \
                     unsafe_code: {copy:?}; it has {has:?}",
                    p.name
                ));
            }
        } else if has != inherit {
            out.push(format!(
                "{}: {path} must inherit the workspace's lints (`[lints] workspace = true`, \
                 nothing else); it has {has:?}",
                p.name
            ));
        }
        if own
            .get("package.rust-version.workspace")
            .map(String::as_str)
            != Some("true")
        {
            out.push(format!(
                "{}: add `rust-version.workspace = true` to [package] in {path}",
                p.name
            ));
        }
    }
    for (name, _) in PANICS_PENDING {
        if !PRODUCT.contains(name) {
            out.push(format!("{name}: in PANICS_PENDING but not a product crate"));
        }
    }
    for name in PRODUCT {
        let Some(p) = packages.get(*name) else {
            continue;
        };
        let pending = PANICS_PENDING.iter().any(|(n, _)| n == name);
        let roots = p.shipped_roots();
        let missing: Vec<String> = roots
            .iter()
            .filter_map(|r| {
                let denied = denied(&read(r));
                let lacks: Vec<&str> = NO_PANIC
                    .iter()
                    .copied()
                    .filter(|l| !denied.iter().any(|d| d == l))
                    .collect();
                (!lacks.is_empty()).then(|| {
                    let at = r.strip_prefix(&root).unwrap_or(r).display();
                    format!("{at} lacks {}", lacks.join(", "))
                })
            })
            .collect();
        if pending && missing.is_empty() {
            out.push(format!(
                "{name}: denies the no-panic lints now; take it out of PANICS_PENDING \
                 in tests/tests/lints.rs"
            ));
        } else if !pending && !missing.is_empty() {
            out.push(format!(
                "{name}: product code must deny the no-panic lints: {} \
                 (`#![deny({})]`)",
                missing.join("; "),
                NO_PANIC.join(", ")
            ));
        }
    }
    out.sort();
    out
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_crate_keeps_the_workspace_lints_and_rust_version_and_product_code_denies_panics() {
    let packages = workspace::packages();
    let root_manifest = read(&workspace::root().join("Cargo.toml"));
    let found = problems(&root_manifest, &packages, &read);
    eprintln!(
        "lints: {} crates, {} with unsafe code, {} product crates of which {} not yet panic-free",
        packages.len(),
        UNSAFE.len(),
        PRODUCT.len(),
        PANICS_PENDING.len()
    );
    assert!(found.is_empty(), "lints:\n  {}", found.join("\n  "));
}

/// The checks find what they are for, on manifests and sources changed
/// here.
#[test]
fn the_checks_name_the_crate_and_the_fix() {
    let packages = workspace::packages();
    let root = workspace::root();
    let root_manifest = read(&root.join("Cargo.toml"));
    let changed = move |path: &std::path::Path| {
        let text = read(path);
        let at = path.strip_prefix(&root).unwrap_or(path);
        if at == std::path::Path::new("core/Cargo.toml") {
            text.replace("rust-version.workspace = true\n", "").replace(
                "[lints]\nworkspace = true",
                "[lints.rust]\nunsafe_code = \"allow\"",
            )
        } else if at == std::path::Path::new("pricing/src/lib.rs") {
            text.replace("clippy::indexing_slicing", "")
        } else {
            text
        }
    };
    let found = problems(&root_manifest, &packages, &changed);
    let mentions = |what: &str| found.iter().any(|f| f.contains(what));
    assert!(
        mentions("ace-core: add `rust-version.workspace = true`"),
        "{found:#?}"
    );
    assert!(
        mentions("ace-core: core/Cargo.toml must inherit the workspace's lints"),
        "{found:#?}"
    );
    assert!(
        mentions("ace-pricing: product code must deny the no-panic lints: pricing/src/lib.rs lacks clippy::indexing_slicing"),
        "{found:#?}"
    );
    let unforbidden = root_manifest.replace("unsafe_code = \"forbid\"\n", "");
    let found = problems(&unforbidden, &packages, &read);
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("Cargo.toml: [workspace.lints.rust] has no unsafe_code")),
        "{found:#?}"
    );
    // Without `unsafe_code`, the workspace's table is what the unsafe
    // crates copy: they now differ from it only if it has more.
    assert!(
        !found.iter().any(|f| f.starts_with("ace-filter:")),
        "{found:#?}"
    );
}
