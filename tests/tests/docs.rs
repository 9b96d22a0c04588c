//! The docs checked against the code, not trusted (issue 53):
//!
//! - `ARCHITECTURE.md`'s crate tables (`| crate | folder | holds | depends
//!   on |`) name every workspace crate once, each in its folder, and each
//!   line's "depends on" is exactly the workspace crates it links (normal
//!   and build dependencies, from `cargo metadata`). A cell names crates
//!   without `ace-` (`core`, `dynamic-abi`), comma-separated; words in
//!   parentheses say why and are not read; `–` is none.
//! - A crate's module map, where its docs have one, names every public
//!   module its root declares and nothing that is not a module: a table
//!   in its `README.md` headed `file` or `module` (`x.rs`, `src/x.rs`,
//!   `x/`; other paths there must exist), or a bullet list in its root's
//!   `//!` docs whose every bullet starts with a link to a module
//!   (`- [`x`]`, `- [`x::Item`]`).
//! - Every path `ARCHITECTURE.md` names in backticks exists.
//! - Every link to a heading of `BENCHMARKS.md` or `benchmarks/` (the
//!   goals table's) finds it.
//! - The README's measured figures (`32 %`, `1.2 s`, `834 tests`) are
//!   BENCHMARKS.md's: each one is written there too.

use crate::workspace::{self, anchors, code_spans, modules, table_rows, Package};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const CRATE_TABLE: &[&str] = &["crate", "folder", "holds", "depends on"];

/// `name` as a workspace crate's name: itself, or with `ace-` before it.
fn crate_name(name: &str, packages: &BTreeMap<String, Package>) -> Option<String> {
    [name.to_string(), format!("ace-{name}")]
        .into_iter()
        .find(|n| packages.contains_key(n))
}

/// Whether `folder` matches `pattern`, where a `*` stands for one path
/// segment (`wasm-host/filters/*/`).
fn folder_matches(pattern: &str, folder: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == folder,
        Some((before, after)) => folder
            .strip_prefix(before)
            .and_then(|rest| rest.strip_suffix(after))
            .is_some_and(|segment| !segment.is_empty() && !segment.contains('/')),
    }
}

/// The crate names in a "depends on" cell; what is in parentheses is left
/// out, `–` is none.
fn dependency_names(cell: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut depth = 0usize;
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    plain
        .split(',')
        .map(|n| n.trim().trim_matches('`').trim().to_string())
        .filter(|n| !n.is_empty() && n != "–" && n != "-")
        .collect()
}

/// Every problem with `ARCHITECTURE.md`'s crate tables, one line each.
fn crate_table_problems(architecture: &str, packages: &BTreeMap<String, Package>) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let rows = table_rows(architecture, CRATE_TABLE);
    for (line, cells) in &rows {
        let [crates, folders, _, depends] = cells.as_slice() else {
            out.push(format!(
                "ARCHITECTURE.md:{line}: a crate table's line has {} cells, not 4",
                cells.len()
            ));
            continue;
        };
        let folders = code_spans(folders);
        let listed: BTreeSet<String> = dependency_names(depends)
            .into_iter()
            .filter_map(|n| match crate_name(&n, packages) {
                Some(n) => Some(n),
                None => {
                    out.push(format!(
                        "ARCHITECTURE.md:{line}: depends on `{n}`, which is no workspace crate"
                    ));
                    None
                }
            })
            .collect();
        for name in code_spans(crates) {
            let Some(p) = packages.get(name) else {
                out.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` is no workspace crate (a package's name, as in its Cargo.toml)"
                ));
                continue;
            };
            if let Some(first) = seen.insert(name.to_string(), *line) {
                out.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` has a line already (line {first})"
                ));
            }
            if !folders.iter().any(|f| folder_matches(f, &p.folder)) {
                out.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` is in `{}`, not in {folders:?}",
                    p.folder
                ));
            }
            let links: BTreeSet<String> = p.links().into_iter().map(str::to_string).collect();
            for missing in links.difference(&listed) {
                out.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` depends on `{missing}`; add it to the line's \"depends on\""
                ));
            }
            for extra in listed.difference(&links) {
                out.push(format!(
                    "ARCHITECTURE.md:{line}: `{name}` does not depend on `{extra}`; take it out of the line's \"depends on\""
                ));
            }
        }
    }
    for name in packages.keys() {
        if !seen.contains_key(name) {
            out.push(format!(
                "ARCHITECTURE.md: `{name}` has no line; add one to a crate table (| crate | folder | holds | depends on |)"
            ));
        }
    }
    out
}

/// The module maps in a crate's docs, as (where, the modules named, the
/// other paths named).
fn module_maps(readme: Option<&str>, root_source: &str) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    if let Some(readme) = readme {
        // The rows of tables whose header's first cell is `file` or `module`.
        let mut named = Vec::new();
        let mut other = Vec::new();
        let mut inside = false;
        for line in readme.lines() {
            let Some(inner) = line.trim().strip_prefix('|') else {
                inside = false;
                continue;
            };
            let first = inner.split('|').next().unwrap_or_default().trim();
            if first == "file" || first == "module" {
                inside = true;
                continue;
            }
            if !inside || first.chars().all(|c| matches!(c, '-' | ':' | ' ')) {
                continue;
            }
            for span in code_spans(first) {
                let path = span.strip_prefix("src/").unwrap_or(span);
                let module = path
                    .strip_suffix(".rs")
                    .or_else(|| path.strip_suffix('/'))
                    .filter(|m| !m.is_empty() && !m.contains('/'));
                match module {
                    Some(m) => named.push(m.to_string()),
                    None => other.push(span.to_string()),
                }
            }
        }
        if !named.is_empty() || !other.is_empty() {
            out.push(("README.md's table".to_string(), named, other));
        }
    }
    // Bullet lists in the root's `//!` docs whose every bullet starts with
    // a link to a module: a list is the lines from one bullet to the next
    // line that is neither a bullet nor its continuation.
    let modules: BTreeSet<String> = modules(root_source).into_iter().map(|(m, _)| m).collect();
    let docs: Vec<&str> = root_source
        .lines()
        .take_while(|l| l.starts_with("//!") || l.starts_with("#!") || l.trim().is_empty())
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let mut lists: Vec<Vec<String>> = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in docs {
        if let Some(bullet) = line.strip_prefix("- ") {
            current
                .get_or_insert_with(Vec::new)
                .push(bullet.to_string());
        } else if line.starts_with("  ") && current.is_some() {
            if let Some(last) = current.as_mut().and_then(|c| c.last_mut()) {
                last.push(' ');
                last.push_str(line.trim());
            }
        } else if let Some(done) = current.take() {
            lists.push(done);
        }
    }
    lists.extend(current);
    let module_of = |link: &str| {
        let link = link.strip_prefix("mod@").unwrap_or(link);
        let first = link.split("::").next().unwrap_or(link);
        modules.contains(first).then(|| first.to_string())
    };
    for list in lists {
        let heads_are_modules = list.iter().all(|b| {
            b.strip_prefix("[`")
                .and_then(|b| b.split_once("`]"))
                .is_some_and(|(link, _)| module_of(link).is_some())
        });
        if !heads_are_modules {
            continue;
        }
        let named = list
            .iter()
            .flat_map(|b| b.split("[`").skip(1))
            .filter_map(|l| l.split_once("`]").map(|(link, _)| link))
            .filter_map(module_of)
            .collect();
        out.push((
            "the crate root's module list".to_string(),
            named,
            Vec::new(),
        ));
    }
    out
}

/// Every problem with the crates' module maps, one line each.
fn module_map_problems(
    packages: &BTreeMap<String, Package>,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Vec<String> {
    let root = workspace::root();
    let mut out = Vec::new();
    for p in packages.values() {
        let Some(lib) = p.lib_root() else {
            continue;
        };
        let Some(source) = read(lib) else {
            continue;
        };
        let declared = modules(&source);
        let lib_at = lib.strip_prefix(&root).unwrap_or(lib).display().to_string();
        let readme = read(&root.join(&p.folder).join("README.md"));
        for (map, named, other) in module_maps(readme.as_deref(), &source) {
            let named: BTreeSet<&str> = named.iter().map(String::as_str).collect();
            for n in &named {
                if !declared.iter().any(|(m, _)| m == n) {
                    out.push(format!(
                        "{}: {map} names module `{n}`, which {lib_at} does not declare",
                        p.name
                    ));
                }
            }
            for (m, public) in &declared {
                if *public && !named.contains(m.as_str()) {
                    out.push(format!(
                        "{}: {map} leaves out `pub mod {m}` ({lib_at}); add a line for it",
                        p.name
                    ));
                }
            }
            for path in other {
                let folder = root.join(&p.folder);
                if !folder.join(&path).exists() && !folder.join("src").join(&path).exists() {
                    out.push(format!(
                        "{}: {map} names `{path}`, which is not in {}",
                        p.name, p.folder
                    ));
                }
            }
        }
    }
    out
}

/// Whether Rust `source` defines `item` (a function, type, trait,
/// constant, module or macro of that name, or an impl for it).
fn defines(source: &str, item: &str) -> bool {
    let starts = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "const ",
        "static ",
        "type ",
        "mod ",
        "macro_rules! ",
        "impl ",
        "for ",
    ];
    starts.iter().any(|start| {
        let needle = format!("{start}{item}");
        source.match_indices(&needle).any(|(at, _)| {
            let after = source[at + needle.len()..].chars().next();
            !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

/// What `markdown` names in backticks that is not there: a repository
/// path (a span with a `/` that starts with a folder of the root) that
/// does not exist, or `file.rs::Item` whose file does not define `Item`.
fn missing_paths(markdown: &str, root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for span in code_spans(markdown) {
        if span.contains(' ') || !span.contains('/') || span.contains("://") {
            continue;
        }
        let mut parts = span.split("::");
        let path = parts.next().unwrap_or(span);
        let Some(top) = path.split('/').next() else {
            continue;
        };
        if top.is_empty() || !root.join(top).is_dir() {
            continue;
        }
        if path.contains('*') || path.contains('<') {
            continue;
        }
        if !root.join(path).exists() {
            out.push(format!("{path}: no such file"));
        } else if let Some(item) = parts.next() {
            let source = std::fs::read_to_string(root.join(path)).unwrap_or_default();
            if !defines(&source, item) {
                out.push(format!("{span}: {path} does not define `{item}`"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The links to headings in `markdown` (a file at `at`, relative to the
/// root) that find none: `(#anchor)` in itself, `(file.md#anchor)` in
/// another Markdown file.
fn broken_anchors(markdown: &str, at: &Path, root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let dir = at.parent().unwrap_or(Path::new(""));
    for piece in markdown.split("](").skip(1) {
        let Some(target) = piece.split(')').next() else {
            continue;
        };
        let Some((file, anchor)) = target.split_once('#') else {
            continue;
        };
        if file.contains("://") {
            continue;
        }
        let text = if file.is_empty() {
            Some(markdown.to_string())
        } else {
            std::fs::read_to_string(root.join(dir).join(file)).ok()
        };
        let Some(text) = text else {
            out.push(format!("{}: links to {target}: no such file", at.display()));
            continue;
        };
        if !anchors(&text).iter().any(|a| a == anchor) {
            out.push(format!(
                "{}: links to {target}: no such heading",
                at.display()
            ));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The measured figures in `text`: a number followed by ` %`, ` s`,
/// ` ms`, ` µs`, ` ns` or ` tests`, as written (`2,144 s`).
fn figures(text: &str) -> Vec<String> {
    const UNITS: &[&str] = &["%", "s", "ms", "µs", "ns", "tests"];
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for pair in words.windows(2) {
        let [number, unit] = pair else {
            continue;
        };
        let unit = unit.trim_end_matches(|c: char| ",.;:)".contains(c));
        let number = number.trim_start_matches('(');
        if UNITS.contains(&unit)
            && number.starts_with(|c: char| c.is_ascii_digit())
            && number
                .chars()
                .all(|c| c.is_ascii_digit() || c == ',' || c == '.')
        {
            out.push(format!("{number} {unit}"));
        }
    }
    out
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn architecture_names_every_crate_in_its_folder_with_its_dependencies() {
    let packages = workspace::packages();
    let text = read(&workspace::root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let found = crate_table_problems(&text, &packages);
    eprintln!(
        "docs: ARCHITECTURE.md has {} crate lines for {} workspace crates",
        table_rows(&text, CRATE_TABLE).len(),
        packages.len()
    );
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md against cargo metadata:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn module_maps_name_every_public_module() {
    let packages = workspace::packages();
    let found = module_map_problems(&packages, &read);
    assert!(
        found.is_empty(),
        "module maps against the module tree:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn architecture_names_only_paths_that_exist() {
    let root = workspace::root();
    let text = read(&root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let missing = missing_paths(&text, &root);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn benchmarks_links_find_their_headings() {
    let root = workspace::root();
    let mut found = Vec::new();
    for at in [
        "BENCHMARKS.md",
        "benchmarks/history.md",
        "benchmarks/README.md",
    ] {
        let text = read(&root.join(at)).unwrap_or_else(|| panic!("{at}"));
        found.extend(broken_anchors(&text, Path::new(at), &root));
    }
    assert!(found.is_empty(), "{}", found.join("\n  "));
}

#[test]
fn the_readme_quotes_figures_from_benchmarks() {
    let root = workspace::root();
    let readme = read(&root.join("README.md")).expect("README.md");
    let benchmarks = read(&root.join("BENCHMARKS.md")).expect("BENCHMARKS.md");
    let stale: Vec<String> = figures(&readme)
        .into_iter()
        .filter(|f| !benchmarks.contains(f.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "README.md quotes figures BENCHMARKS.md does not have (take them from its goals table, or drop them): {stale:?}"
    );
    assert_eq!(
        figures("took 2,144 s (35:44), 834 tests; 32 % and 51 % cheaper, 3 hosts"),
        ["2,144 s", "834 tests", "32 %", "51 %"]
    );
}

/// The checks fail when a crate or a dependency is added without its
/// line, on a workspace changed here.
#[test]
fn the_checks_fail_on_a_crate_or_a_dependency_without_its_line() {
    let mut packages = workspace::packages();
    let text = read(&workspace::root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    // What is wrong already is the other test's to report.
    let before = crate_table_problems(&text, &packages);
    packages.insert(
        "ace-new".into(),
        Package {
            name: "ace-new".into(),
            folder: "new/".into(),
            deps: vec![("ace-core".into(), "normal".into())],
            targets: Vec::new(),
        },
    );
    let core = packages.get_mut("ace-core").expect("ace-core");
    core.deps.push(("ace-snapshot".into(), "normal".into()));
    core.deps.push(("ace-harness".into(), "dev".into()));
    let found: Vec<String> = crate_table_problems(&text, &packages)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    let line = |name: &str| {
        text.lines()
            .position(|l| l.starts_with(&format!("| `{name}` |")))
            .map(|i| i + 1)
            .expect("a line")
    };
    assert_eq!(
        found,
        [
            format!(
                "ARCHITECTURE.md:{}: `ace-core` depends on `ace-snapshot`; add it to the line's \"depends on\"",
                line("ace-core")
            ),
            "ARCHITECTURE.md: `ace-new` has no line; add one to a crate table (| crate | folder | holds | depends on |)".to_string(),
        ],
        "{found:#?}"
    );
    // A module map that leaves out a module, or names one that is gone.
    let root = workspace::root();
    let fake = Package {
        name: "ace-fake".into(),
        folder: "fake/".into(),
        deps: Vec::new(),
        targets: vec![(vec!["lib".into()], root.join("fake/src/lib.rs"))],
    };
    let source = "//! - [`a`]: one\n//! - [`b::Thing`]: two,\n//!   and [`mod@d`]\npub mod a;\npub mod b;\npub mod c;\nmod d;\n#[cfg(test)]\nmod tests;\n";
    let readme = "| file | what it holds |\n|---|---|\n| `a.rs`, `src/b.rs` | x |\n| `gone.rs` | y |\n| `www/x.js` | z |\n";
    let read = |p: &Path| {
        if p.ends_with("fake/src/lib.rs") {
            Some(source.to_string())
        } else if p.ends_with("fake/README.md") {
            Some(readme.to_string())
        } else {
            None
        }
    };
    let found = module_map_problems(&BTreeMap::from([("ace-fake".to_string(), fake)]), &read);
    assert_eq!(
        found,
        [
            "ace-fake: README.md's table names module `gone`, which fake/src/lib.rs does not declare",
            "ace-fake: README.md's table leaves out `pub mod c` (fake/src/lib.rs); add a line for it",
            "ace-fake: README.md's table names `www/x.js`, which is not in fake/",
            "ace-fake: the crate root's module list leaves out `pub mod c` (fake/src/lib.rs); add a line for it",
        ],
        "{found:#?}"
    );
}
