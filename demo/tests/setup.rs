//! `make demo` installs what the demo runs and nothing more: no browser and
//! no wasm-bindgen (the playground's and the ledger's tests need those;
//! `make test` installs them through `make setup`).
//!
//! Read from the files themselves: the Makefile's rules that `demo` runs
//! (its prerequisites, transitively, and their recipes), and every script
//! those recipes name, with the scripts they name in turn (`setup.sh`
//! sources `setup-demo.sh`; a demo path that ran `setup.sh` would take in
//! all of it). Comment lines do not count: they may say what is left out
//! and why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What the demo's setup path must not name (lower case).
const NOT_FOR_THE_DEMO: [&str; 2] = ["chromium", "wasm-bindgen"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Lines that are not comments, `\`-continued lines joined.
fn code_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        if cur.is_empty() && line.trim_start().starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(line);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The Makefile's rules: target -> (prerequisites, recipe lines).
fn rules(makefile: &str) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let mut rules: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in code_lines(makefile) {
        if let Some(recipe) = line.strip_prefix('\t') {
            if let Some(t) = &current {
                rules
                    .entry(t.clone())
                    .or_default()
                    .1
                    .push(recipe.to_string());
            }
            continue;
        }
        current = None;
        // `target: prerequisites`, not `VAR := value` or `.PHONY: ...`.
        let Some((head, prereqs)) = line.split_once(':') else {
            continue;
        };
        if prereqs.starts_with('=') || head.contains('=') || head.trim().starts_with('.') {
            continue;
        }
        for target in head.split_whitespace() {
            let rule = rules.entry(target.to_string()).or_default();
            rule.0
                .extend(prereqs.split_whitespace().map(str::to_string));
            current = Some(target.to_string());
        }
    }
    rules
}

/// The scripts (file names under `scripts/`) that `code` names.
fn scripts_named(code: &str) -> Vec<String> {
    code.split(|c: char| c.is_whitespace() || "\"'();`$/{}".contains(c))
        .filter(|w| w.ends_with(".sh") && w.len() > 3)
        .map(str::to_string)
        .collect()
}

/// The targets a recipe line runs with `$(MAKE)`.
fn sub_make_targets(line: &str) -> Vec<String> {
    line.split("$(MAKE)")
        .skip(1)
        .flat_map(|rest| {
            rest.split(|c: char| c.is_whitespace() || ";&|".contains(c))
                .skip_while(|w| w.is_empty())
                .take_while(|w| !w.is_empty())
                .filter(|w| !w.starts_with('-') && !w.contains('='))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every line of code `make <target>` runs: its rules' recipes and the
/// scripts they name, transitively. Returns (what was read, the code).
fn closure(target: &str) -> (Vec<String>, Vec<String>) {
    let root = root();
    let rules = rules(&read(&root.join("Makefile")));
    let mut seen_targets = BTreeSet::new();
    let mut todo = vec![target.to_string()];
    let mut code = Vec::new();
    let mut read_from = Vec::new();
    let mut scripts = Vec::new();
    while let Some(t) = todo.pop() {
        if !seen_targets.insert(t.clone()) {
            continue;
        }
        let Some((prereqs, recipe)) = rules.get(&t) else {
            panic!(
                "the Makefile has no rule for `{t}` (a prerequisite on the way from `{target}`)"
            );
        };
        read_from.push(format!("Makefile rule `{t}`"));
        todo.extend(prereqs.iter().cloned());
        for line in recipe {
            scripts.extend(scripts_named(line));
            todo.extend(sub_make_targets(line));
            code.push(line.clone());
        }
    }
    let mut seen_scripts = BTreeSet::new();
    while let Some(s) = scripts.pop() {
        if !seen_scripts.insert(s.clone()) {
            continue;
        }
        let path = root.join("scripts").join(&s);
        let lines = code_lines(&read(&path));
        read_from.push(format!("scripts/{s}"));
        for line in lines {
            scripts.extend(scripts_named(&line));
            code.push(line);
        }
    }
    (read_from, code)
}

#[test]
fn make_demo_installs_no_browser_and_no_wasm_bindgen() {
    let (read_from, code) = closure("demo");
    assert!(
        read_from.iter().any(|r| r == "scripts/setup-demo.sh"),
        "`make demo` no longer runs scripts/setup-demo.sh (read: {read_from:?}); \
         it must install the demo's tools"
    );
    for line in &code {
        let lower = line.to_lowercase();
        for word in NOT_FOR_THE_DEMO {
            assert!(
                !lower.contains(word),
                "`make demo`'s setup names {word}, which the demo does not need: `{}`\n\
                 (read: {read_from:?}). Install it in scripts/setup.sh (`make setup`, \
                 which `make test` runs), not on the demo's path.",
                line.trim()
            );
        }
    }
}

#[test]
fn make_test_still_installs_the_browser_and_wasm_bindgen() {
    let (read_from, code) = closure("test");
    let text = code.join("\n").to_lowercase();
    for word in NOT_FOR_THE_DEMO {
        assert!(
            text.contains(word),
            "`make test`'s setup no longer names {word}, which the playground's and the \
             ledger's tests need (read: {read_from:?})"
        );
    }
    assert!(
        read_from.iter().any(|r| r == "scripts/setup-demo.sh"),
        "`make test` no longer installs what the demo needs (read: {read_from:?})"
    );
}

#[test]
fn the_reader_sees_what_a_recipe_runs() {
    let makefile = "# a comment: chromium\nA := 1\n.PHONY: a b\na: b\n\t@bash scripts/x.sh \\\n\t  --flag\nb:\n\techo hi\n";
    let r = rules(makefile);
    assert_eq!(r["a"].0, ["b"]);
    assert_eq!(r["a"].1, ["@bash scripts/x.sh \t  --flag"]);
    assert_eq!(r["b"].1, ["echo hi"]);
    assert!(!r.contains_key("A") && !r.contains_key(".PHONY"));
    assert_eq!(
        sub_make_targets("@$(MAKE) --no-print-directory docs fuzz-check; echo done"),
        ["docs", "fuzz-check"]
    );
    assert_eq!(
        scripts_named(". \"$(dirname \"${BASH_SOURCE[0]}\")/setup-demo.sh\""),
        ["setup-demo.sh"]
    );
}
