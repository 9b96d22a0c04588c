//! The workspace as `cargo metadata --no-deps` gives it, for the checks
//! that hold the manifests and the docs to it (`lints.rs`, `docs.rs`).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One workspace crate.
#[derive(Clone, Debug)]
pub struct Package {
    pub name: String,
    /// Its folder, relative to the workspace's root, with a trailing `/`
    /// (`core/`, `dynamic-module/abi/`).
    pub folder: String,
    /// The workspace crates it depends on, as (name, kind): `normal`,
    /// `build` or `dev`.
    pub deps: Vec<(String, String)>,
    /// Its targets, as (kinds, root source file): `["lib"]`,
    /// `["cdylib", "rlib"]`, `["bin"]`, `["test"]` ...
    pub targets: Vec<(Vec<String>, PathBuf)>,
}

impl Package {
    /// The workspace crates it links (normal and build dependencies).
    pub fn links(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .deps
            .iter()
            .filter(|(_, kind)| kind != "dev")
            .map(|(name, _)| name.as_str())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The root source files of what it ships: its library and binaries
    /// (not tests, examples, benches or its build script).
    pub fn shipped_roots(&self) -> Vec<&Path> {
        self.targets
            .iter()
            .filter(|(kinds, _)| {
                kinds
                    .iter()
                    .any(|k| matches!(k.as_str(), "lib" | "rlib" | "cdylib" | "bin"))
            })
            .map(|(_, path)| path.as_path())
            .collect()
    }

    /// Its library's root source file, if it has one.
    pub fn lib_root(&self) -> Option<&Path> {
        self.targets
            .iter()
            .find(|(kinds, _)| {
                kinds
                    .iter()
                    .any(|k| matches!(k.as_str(), "lib" | "rlib" | "cdylib"))
            })
            .map(|(_, path)| path.as_path())
    }
}

/// The workspace's root folder.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// Every workspace crate, by name.
pub fn packages() -> BTreeMap<String, Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = root();
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo} metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata printed JSON");
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let packages: Vec<&Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .collect();
    let names: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    packages
        .iter()
        .map(|p| {
            let manifest = PathBuf::from(text(&p["manifest_path"]));
            let dir = manifest.parent().expect("a manifest is in a folder");
            let folder = format!(
                "{}/",
                dir.strip_prefix(&root)
                    .expect("a member is under the workspace's root")
                    .display()
            );
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                // A dependency with a path inside the workspace; a registry
                // crate of the same name would have no `path`.
                .filter(|d| !d["path"].is_null())
                .filter(|d| d["name"].as_str().is_some_and(|n| names.contains(&n)))
                .map(|d| {
                    let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                    (text(&d["name"]), kind)
                })
                .collect();
            let targets = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    let kinds = t["kind"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(text)
                        .collect();
                    (kinds, PathBuf::from(text(&t["src_path"])))
                })
                .collect();
            let name = text(&p["name"]);
            (
                name.clone(),
                Package {
                    name,
                    folder,
                    deps,
                    targets,
                },
            )
        })
        .collect()
}

/// The modules a crate root declares at its top level (`mod x;`,
/// `pub mod x;`, `pub(crate) mod x;`), as (name, public), leaving out
/// those under `#[cfg(test)]`.
pub fn modules(root_source: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut attributes: Vec<&str> = Vec::new();
    for line in root_source.lines() {
        if line.starts_with("#[") {
            attributes.push(line);
            continue;
        }
        let test_only = attributes.iter().any(|a| a.contains("cfg(test)"));
        attributes.clear();
        let (public, rest) = if let Some(rest) = line.strip_prefix("pub mod ") {
            (true, rest)
        } else if let Some(rest) = line.strip_prefix("mod ") {
            (false, rest)
        } else if let Some(rest) = line
            .strip_prefix("pub(")
            .and_then(|r| r.split_once(") mod "))
            .map(|(_, rest)| rest)
        {
            (false, rest)
        } else {
            continue;
        };
        let Some(name) = rest.trim().strip_suffix(';') else {
            continue;
        };
        if !test_only {
            out.push((name.trim().to_string(), public));
        }
    }
    out
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation
/// dropped (hyphens and underscores kept), spaces as hyphens.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
pub fn anchors(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut code = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            code = !code;
        } else if !code && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The rows of every Markdown table in `markdown` whose header's cells
/// are `header`, as (line number, cells).
pub fn table_rows(markdown: &str, header: &[&str]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut inside = false;
    for (i, line) in markdown.lines().enumerate() {
        let Some(cells) = cells(line) else {
            inside = false;
            continue;
        };
        if cells.iter().map(String::as_str).eq(header.iter().copied()) {
            inside = true;
        } else if inside
            && !cells
                .iter()
                .all(|c| c.chars().all(|c| c == '-' || c == ':'))
        {
            out.push((i + 1, cells));
        }
    }
    out
}

/// A Markdown table line's cells, trimmed; `None` if it is not one.
fn cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

/// The text between backticks in `cell`, in order.
pub fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}
