//! The workspace's crate graph keeps the product apart from its tools
//! (issue 36): read from `cargo metadata --format-version 1`, so every
//! kind of dependency counts (normal, build, dev, renamed, optional,
//! per-target).
//!
//! - No product crate reaches `ace-harness` (real Envoy, scripted
//!   upstreams, the test kit) through normal or build dependencies, directly
//!   or through another workspace crate. A product crate's own tests may
//!   take it as a dev-dependency.
//! - No product crate other than the adapter itself depends on
//!   `ace-filter` (the proxy-wasm adapter) in any way: the compiler,
//!   ledger, simulator and CLI read `ace-config` and `ace-flow`; only the
//!   tools (`tests/`, `benches/`, `wasm-host/`) may load the Wasm filter.
//! - The workspace's crates form no cycle, dev-dependencies included.
//! - A contract crate ([`LEAVES`]: the event line's definition) depends
//!   on no workspace crate in any way, so a reader of the contract never
//!   takes its writer with it.
//! - Every workspace crate is classified: a new crate is named in
//!   [`PRODUCT`] or [`TOOLS`] before this passes.

use std::collections::{BTreeMap, BTreeSet};

/// What ships: the crates a user's Envoy, the `ace` command or the
/// browser playground are built from.
pub(crate) const PRODUCT: &[&str] = &[
    "ace-core",
    "ace-event",
    "ace-snapshot",
    "ace-config",
    "ace-flow",
    "ace-filter",
    "ace-dynamic",
    "ace-dynamic-abi",
    "ace-policy",
    "ace-playground",
    "ace-planner",
    "ace-control",
    "ace-pricing",
    "ace-ledger",
    "ace-sim",
    "ace-cli",
];

/// Contracts that a writer and its readers share, and so depend on no
/// workspace crate at all (not even for their tests): `ace-event`, the
/// event line's fields, which the flow writes and the ledger, pricing and
/// the simulator read.
const LEAVES: &[&str] = &["ace-event"];

/// What builds, tests, shows or measures the product, and ships nothing.
const TOOLS: &[&str] = &[
    "ace-harness",
    "ace-conformance",
    "ace-demo",
    "ace-tests",
    "ace-benches",
    "ace-bench-noop-filter",
    "ace-bench-minimal-filter",
    "ace-bench-dynamic-floor",
    "ace-wasm-host",
    "ace-example-header-rewrite",
    "ace-example-local-auth",
    "ace-example-http-callout",
    "ace-example-body-rewrite",
    "ace-example-callback-log",
    "ace-example-grpc-callout",
    "ace-example-metadata-probe",
];

/// One workspace dependency edge: (to, kind) with kind `normal`, `build`
/// or `dev`.
type Edges = BTreeMap<String, Vec<(String, String)>>;

/// The workspace members and their dependencies on each other, from
/// the one reader of `cargo metadata` (`workspace.rs`).
fn workspace_edges() -> Edges {
    crate::workspace::packages()
        .into_iter()
        .map(|(name, package)| (name, package.deps))
        .collect()
}

/// A path from `from` to `to` along edges of `kinds`, if there is one,
/// as `from`, then each step with its kind.
fn path(edges: &Edges, from: &str, to: &str, kinds: &[&str]) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    // (the crate reached, the path to it as printed)
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    while let Some((at, shown)) = stack.pop() {
        for (next, kind) in edges.get(&at).into_iter().flatten() {
            if !kinds.contains(&kind.as_str()) {
                continue;
            }
            let mut longer = shown.clone();
            longer.push(format!("{next} ({kind})"));
            if next == to {
                return Some(longer);
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

/// Every problem with the graph, one line each (empty: none).
fn problems(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for name in edges.keys() {
        if !PRODUCT.contains(&name.as_str()) && !TOOLS.contains(&name.as_str()) {
            out.push(format!(
                "{name}: not classified; add it to PRODUCT or TOOLS in tests/tests/crate_graph.rs"
            ));
        }
    }
    for name in PRODUCT.iter().chain(TOOLS) {
        if !edges.contains_key(*name) {
            out.push(format!("{name}: listed here but not a workspace member"));
        }
    }
    for product in PRODUCT {
        if let Some(p) = path(edges, product, "ace-harness", &["normal", "build"]) {
            out.push(format!(
                "product crate depends on the test harness: {}",
                p.join(" -> ")
            ));
        }
        if *product == "ace-filter" {
            continue;
        }
        for (to, kind) in edges.get(*product).into_iter().flatten() {
            if to == "ace-filter" {
                out.push(format!(
                    "product crate depends on the Wasm adapter: {product} -> ace-filter ({kind})"
                ));
            }
        }
        if let Some(p) = path(edges, product, "ace-filter", &["normal", "build"]) {
            out.push(format!(
                "product crate reaches the Wasm adapter: {}",
                p.join(" -> ")
            ));
        }
    }
    for leaf in LEAVES {
        for (to, kind) in edges.get(*leaf).into_iter().flatten() {
            out.push(format!(
                "contract crate depends on a workspace crate: {leaf} -> {to} ({kind})"
            ));
        }
    }
    for name in edges.keys() {
        if let Some(p) = path(edges, name, name, &["normal", "build", "dev"]) {
            out.push(format!("cycle: {}", p.join(" -> ")));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn product_crates_do_not_depend_on_the_harness_or_the_wasm_adapter_and_there_is_no_cycle() {
    let edges = workspace_edges();
    let found = problems(&edges);
    let count: usize = edges.values().map(Vec::len).sum();
    eprintln!(
        "crate graph: {} workspace crates ({} product), {count} edges between them",
        edges.len(),
        PRODUCT.len()
    );
    assert!(found.is_empty(), "crate graph:\n  {}", found.join("\n  "));
}

/// The checks find what they are for (on a graph made up here).
#[test]
fn the_checks_name_the_offending_edge() {
    let mut edges = Edges::new();
    for name in PRODUCT.iter().chain(TOOLS) {
        edges.insert(name.to_string(), Vec::new());
    }
    let add = |edges: &mut Edges, from: &str, to: &str, kind: &str| {
        edges
            .entry(from.to_string())
            .or_default()
            .push((to.to_string(), kind.to_string()));
    };
    assert!(problems(&edges).is_empty());
    add(&mut edges, "ace-cli", "ace-harness", "dev");
    assert!(
        problems(&edges).is_empty(),
        "a dev edge to the harness is allowed"
    );
    add(&mut edges, "ace-cli", "ace-demo", "normal");
    add(&mut edges, "ace-demo", "ace-harness", "normal");
    add(&mut edges, "ace-sim", "ace-filter", "dev");
    add(&mut edges, "ace-tests", "ace-ledger", "dev");
    add(&mut edges, "ace-ledger", "ace-tests", "dev");
    add(&mut edges, "ace-event", "ace-core", "dev");
    let found = problems(&edges);
    assert_eq!(
        found,
        [
            "contract crate depends on a workspace crate: ace-event -> ace-core (dev)",
            "cycle: ace-ledger -> ace-tests (dev) -> ace-ledger (dev)",
            "cycle: ace-tests -> ace-ledger (dev) -> ace-tests (dev)",
            "product crate depends on the Wasm adapter: ace-sim -> ace-filter (dev)",
            "product crate depends on the test harness: ace-cli -> ace-demo (normal) -> ace-harness (normal)",
        ],
        "{found:#?}"
    );
}

/// The host adapters: each maps its proxy's (or the simulator's, or the
/// mock's) calls onto the flow, and keeps nothing of a feature's own.
const HOST_ADAPTERS: &[&str] = &[
    "filter/src",
    "dynamic-module/src",
    "sim/src/policy/ace.rs",
    "conformance/src/mock.rs",
];

/// What the users of the shared store (the response cache, prefix
/// locality, the budgets' counters) are made of: their entries, tables,
/// cells, secrets and keys. Written once in `ace-flow` (`flow/src/store.rs`
/// and the stages); a host adapter that names one holds a feature's logic.
const STORE_USERS: &[&str] = &[
    "cache_get",
    "cache_put",
    "cache::Entry",
    "prefix::Table",
    "prefix::Secret",
    "RECORD_BYTES",
    "locality_secret",
    "locality_get",
    "locality_put",
    "CELL_BYTES",
    "budget::Cells",
    "budget_cell",
    "update_in",
    "\"ace.cache",
    "\"ace.loc",
    "\"ace.budget",
];

/// Every `.rs` file under `path` (or `path` itself).
fn rust_files(path: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    let entries = std::fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for entry in entries {
        let p = entry.expect("a directory entry").path();
        if p.is_dir() || p.extension().is_some_and(|x| x == "rs") {
            rust_files(&p, out);
        }
    }
}

/// Adding a feature with state shared across workers touches no host: no
/// host adapter names what the store's users keep (issue 53), and the
/// `Host` trait keeps no method of theirs.
#[test]
fn no_host_adapter_holds_a_store_users_logic() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut found = Vec::new();
    for adapter in HOST_ADAPTERS {
        let mut files = Vec::new();
        rust_files(&root.join(adapter), &mut files);
        assert!(!files.is_empty(), "no host adapter source at {adapter}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for name in STORE_USERS.iter().filter(|u| code.contains(**u)) {
                    let rel = file.strip_prefix(root).unwrap_or(&file).display();
                    found.push(format!("{rel}:{}: names `{name}`", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a host adapter holds logic of the shared store's users; move it into \
         ace-flow (flow/src/store.rs or a stage) over Host::shared_get/shared_set:\n{}",
        found.join("\n")
    );
    let host = std::fs::read_to_string(root.join("flow/src/host.rs")).expect("flow/src/host.rs");
    let start = host.find("pub trait Host").expect("the Host trait");
    let end = host[start..]
        .find("\n}\n")
        .map_or(host.len(), |e| start + e);
    let methods: Vec<&str> = host[start..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix("fn "))
        .map(|l| l.split(['(', '<']).next().unwrap_or(l))
        .collect();
    for m in &methods {
        let feature = m.starts_with("cache") || m.contains("locality") || m.contains("budget_cell");
        assert!(
            !feature,
            "Host::{m} serves one feature's shared state: use the store"
        );
    }
    assert!(
        methods.len() <= 26,
        "Host has {} methods ({methods:?}): a host capability is for what only a proxy can do",
        methods.len()
    );
}
