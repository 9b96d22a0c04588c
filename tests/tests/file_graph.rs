//! No circle of module files inside a crate (issue 53): for every
//! workspace crate's library and binaries (read from `cargo metadata`), the
//! module tree is walked from the crate root through its `mod x;`
//! declarations, and each module file's references to the crate's other
//! module files are read from its source:
//!
//! - `crate::x::…`, `$crate::x::…` (a macro's), `super::…` and `self::…`
//!   paths, `use` trees included (`use crate::{a, b::{c, d}}`);
//! - a path names the file it goes through: `super::Item` where the parent
//!   re-exports `Item` is a reference to the parent (the file it cannot do
//!   without); a module a `use` binds (`use crate::kind;`) reads through
//!   (`kind::Kind` is `crate::kind::Kind`);
//! - comments, doc comments, string literals and items under `#[cfg(test)]`
//!   (`mod tests { … }`, a test-only helper) are not read;
//! - a module's references into its own submodules are containment (it
//!   declares, re-exports and composes them), not an edge: a circle runs
//!   between modules neither of which holds the other.
//!
//! The test fails naming each circle (`ace-ledger: event -> kind -> event`),
//! where each step is written in the code, and how to break it. Paths
//! written another way (a plain `child::x` in a parent, an item a glob
//! import brings in) are not read, so a circle through only those would
//! pass; each circle the test names is one the code has.
//! Run it alone with `cargo test -p ace-tests --test file_graph`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

// The workspace as `cargo metadata` gives it, shared with the real-Envoy
// binary's docs and lints checks; this binary reads only its crates' roots.
#[path = "workspace.rs"]
#[allow(dead_code)]
mod workspace;

/// What a path takes when it names a module as a whole (`use crate::kind;`).
const MODULE: &str = "(the module)";

/// A module path from the crate root (`[]` is the root: `lib.rs`, `main.rs`).
type ModPath = Vec<String>;

/// One token of Rust source: identifiers and keywords carry their text,
/// punctuation its characters (`::` as one), every literal `"lit"`.
#[derive(Debug, Clone)]
struct Tok {
    text: String,
    ident: bool,
    line: usize,
}

/// Rust source as tokens, without comments, doc comments or the contents of
/// string and character literals (so `"crate::x"` in a message is no path).
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let push = |out: &mut Vec<Tok>, text: String, ident: bool, line: usize| {
        out.push(Tok { text, ident, line })
    };
    while i < c.len() {
        let ch = c[i];
        let start_line = line;
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some(end) = literal_end(&c, i) {
            line += c[i..end].iter().filter(|&&x| x == '\n').count();
            i = end;
            push(&mut out, "\"lit\"".into(), false, start_line);
        } else if ch == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime.
            if at(i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                push(&mut out, "\"lit\"".into(), false, start_line);
            } else if at(i + 2) == '\'' {
                i += 3;
                push(&mut out, "\"lit\"".into(), false, start_line);
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                push(&mut out, "'".into(), false, start_line);
            }
        } else if ch.is_alphabetic() || ch == '_' {
            // `r#type`, a raw identifier, is `type`.
            if ch == 'r' && at(i + 1) == '#' {
                i += 2;
            }
            let from = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            push(&mut out, c[from..i].iter().collect(), true, start_line);
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            push(&mut out, "0".into(), false, start_line);
        } else if ch == ':' && at(i + 1) == ':' {
            i += 2;
            push(&mut out, "::".into(), false, start_line);
        } else {
            i += 1;
            push(&mut out, ch.to_string(), false, start_line);
        }
    }
    out
}

/// Where a string literal starting at `i` ends (one past its closing quote):
/// `"…"`, `b"…"`, `c"…"`, `b'…'`, and the raw forms `r#"…"#`, `br"…"`.
fn literal_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut j = i;
    if (at(j) == 'b' || at(j) == 'c') && matches!(at(j + 1), 'r' | '"' | '\'') {
        j += 1;
    }
    if at(j) == 'r' && matches!(at(j + 1), '"' | '#') {
        let hashes = c[j + 1..].iter().take_while(|&&x| x == '#').count();
        let open = j + 1 + hashes;
        if at(open) != '"' {
            return None; // `r#ident`
        }
        let mut k = open + 1;
        while k < c.len() {
            if c[k] == '"'
                && c[k + 1..]
                    .iter()
                    .take(hashes)
                    .filter(|&&x| x == '#')
                    .count()
                    == hashes
            {
                return Some(k + 1 + hashes);
            }
            k += 1;
        }
        return Some(c.len());
    }
    let quote = at(j);
    if quote == '"' || (quote == '\'' && j > i) {
        let mut k = j + 1;
        while k < c.len() && c[k] != quote {
            k += if c[k] == '\\' { 2 } else { 1 };
        }
        return Some((k + 1).min(c.len()));
    }
    None
}

/// How a path starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Start {
    /// `crate::` (or a macro's `$crate::`).
    Crate,
    /// `super::` this many times.
    Super(usize),
    /// `self::`.
    This,
    /// A name: a child module in a `use`, else an extern crate or a local item.
    Plain,
}

/// One path read from a file: a leaf of a `use` tree or a path in code.
#[derive(Debug, Clone)]
struct Leaf {
    start: Start,
    segs: Vec<String>,
    /// The name a module-level `use` binds (its alias or last segment).
    binds: Option<String>,
    line: usize,
}

impl Leaf {
    /// The path as written (a `use` group's leaf spelled out).
    fn shown(&self) -> String {
        let head = match self.start {
            Start::Crate => vec!["crate".to_string()],
            Start::Super(n) => vec!["super".to_string(); n],
            Start::This => vec!["self".to_string()],
            Start::Plain => vec![],
        };
        head.into_iter()
            .chain(self.segs.iter().cloned())
            .collect::<Vec<_>>()
            .join("::")
    }
}

/// What one file declares and references.
#[derive(Debug, Default)]
struct Scan {
    /// `mod x;` declarations: (the inline modules they sit in, `x`).
    mods: Vec<(Vec<String>, String)>,
    /// Inline modules (`mod x { … }`), as paths inside the file.
    inline: Vec<Vec<String>>,
    /// Each path, with the inline modules it sits in.
    leaves: Vec<(Vec<String>, Leaf)>,
}

/// The index of the bracket closing the one at `open`.
fn closing(t: &[Tok], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, tok) in t.iter().enumerate().skip(open) {
        match tok.text.as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    t.len()
}

/// Past the item, field, variant or statement starting at `i` (the one a
/// `#[cfg(test)]` leaves out of the product).
fn skip_item(t: &[Tok], mut i: usize) -> usize {
    const ITEMS: &[&str] = &[
        "pub",
        "fn",
        "mod",
        "impl",
        "struct",
        "enum",
        "union",
        "trait",
        "use",
        "const",
        "static",
        "type",
        "macro_rules",
        "extern",
        "unsafe",
        "async",
    ];
    let item = t.get(i).is_some_and(|x| ITEMS.contains(&x.text.as_str()));
    let mut depth = 0usize;
    while i < t.len() {
        match t[i].text.as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" if depth == 0 => return i, // the enclosing block ends
            "}" | ")" | "]" => {
                depth -= 1;
                if depth == 0 && t[i].text == "}" && item {
                    i += 1;
                    return i + usize::from(t.get(i).is_some_and(|x| x.text == ";"));
                }
            }
            ";" if depth == 0 => return i + 1,
            "," if depth == 0 && !item => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads the `use` tree or path starting at `*i` (its first name, `{`, or
/// `crate`/`super`/`self`), below `segs`, into `out`.
fn use_tree(
    t: &[Tok],
    i: &mut usize,
    mut start: Start,
    mut segs: Vec<String>,
    out: &mut Vec<Leaf>,
) {
    let text = |k: usize| t.get(k).map_or("", |x| x.text.as_str());
    let line = t.get(*i).map_or(0, |x| x.line);
    let leaf = |start, segs: Vec<String>, t: &[Tok], i: &mut usize, out: &mut Vec<Leaf>| {
        let mut binds = segs.last().cloned();
        if text(*i) == "as" {
            binds = t.get(*i + 1).map(|x| x.text.clone()).filter(|n| n != "_");
            *i += 2;
        }
        if !segs.is_empty() {
            out.push(Leaf {
                start,
                segs,
                binds,
                line,
            });
        }
    };
    loop {
        match text(*i) {
            "$" if text(*i + 1) == "crate" => *i += 1,
            "{" => {
                *i += 1;
                while *i < t.len() && text(*i) != "}" {
                    let before = *i;
                    use_tree(t, i, start, segs.clone(), out);
                    if text(*i) == "," {
                        *i += 1;
                    }
                    if *i == before {
                        *i += 1; // not a use tree: step on
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                *i += 1;
                return; // a glob: which names it brings is not read
            }
            name if t.get(*i).is_some_and(|x| x.ident) => {
                let first = segs.is_empty();
                match (name, start) {
                    ("crate", Start::Plain) if first => start = Start::Crate,
                    ("super", Start::Plain) if first => start = Start::Super(1),
                    ("super", Start::Super(n)) if first => start = Start::Super(n + 1),
                    ("self", Start::Plain) if first => start = Start::This,
                    ("self", _) => {
                        // `a::{self, b}`: the module `a` itself.
                        *i += 1;
                        return leaf(start, segs, t, i, out);
                    }
                    _ => segs.push(name.to_string()),
                }
                *i += 1;
                if text(*i) == "::" {
                    *i += 1;
                    continue;
                }
                return leaf(start, segs, t, i, out);
            }
            _ => return leaf(start, segs, t, i, out),
        }
    }
}

/// Reads one file's module declarations and paths.
fn scan(src: &str) -> Scan {
    let t = tokens(src);
    let text = |k: usize| t.get(k).map_or("", |x| x.text.as_str());
    let mut s = Scan::default();
    // Inline modules open here: (name, brace depth outside them).
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        let inside: Vec<String> = open.iter().map(|(n, _)| n.clone()).collect();
        // At the module's own level (not in a function body or an impl).
        let module_level = depth == open.last().map_or(0, |(_, d)| d + 1);
        match text(i) {
            "#" => {
                let inner = text(i + 1) == "!";
                let bracket = i + 1 + usize::from(inner);
                if text(bracket) != "[" {
                    i += 1;
                    continue;
                }
                let end = closing(&t, bracket);
                let test = (bracket + 1..end).map(text).eq(["cfg", "(", "test", ")"]);
                i = end + 1;
                if test && inner {
                    return s; // the whole file is test code
                }
                if test {
                    while text(i) == "#" {
                        i = closing(&t, i + 1) + 1;
                    }
                    i = skip_item(&t, i);
                }
            }
            "mod" if t.get(i + 1).is_some_and(|x| x.ident) && text(i + 2) == ";" => {
                s.mods.push((inside, text(i + 1).to_string()));
                i += 3;
            }
            "mod" if t.get(i + 1).is_some_and(|x| x.ident) && text(i + 2) == "{" => {
                let mut path = inside;
                path.push(text(i + 1).to_string());
                s.inline.push(path);
                open.push((text(i + 1).to_string(), depth));
                depth += 1;
                i += 3;
            }
            "{" => {
                depth += 1;
                i += 1;
            }
            "}" => {
                depth = depth.saturating_sub(1);
                if open.last().is_some_and(|(_, d)| *d == depth) {
                    open.pop();
                }
                i += 1;
            }
            // `pub(in crate::x)` names where an item is seen, not what it uses.
            "in" if text(i.wrapping_sub(1)) == "(" => i = closing(&t, i - 1),
            "use" if text(i + 1) != "::" => {
                i += 1;
                let mut leaves = Vec::new();
                use_tree(&t, &mut i, Start::Plain, Vec::new(), &mut leaves);
                for mut l in leaves {
                    if !(module_level && open.is_empty()) {
                        l.binds = None;
                    }
                    s.leaves.push((inside.clone(), l));
                }
            }
            // A path in code: `crate::x::f()`, `super::X`, `kind::Kind`.
            _ if t[i].ident && text(i + 1) == "::" && text(i.wrapping_sub(1)) != "::" => {
                let mut leaves = Vec::new();
                use_tree(&t, &mut i, Start::Plain, Vec::new(), &mut leaves);
                for mut l in leaves {
                    l.binds = None;
                    s.leaves.push((inside.clone(), l));
                }
            }
            _ => i += 1,
        }
    }
    s
}

/// One module file of a crate.
#[derive(Debug)]
struct File {
    /// Its path as shown (from the workspace root).
    shown: String,
    scan: Scan,
}

/// A crate's module tree: each module file by its module path.
#[derive(Debug, Default)]
struct Tree {
    files: BTreeMap<ModPath, File>,
}

impl Tree {
    /// Walks the module tree from `root` (`src/lib.rs`, `src/main.rs`, a
    /// `src/bin/x.rs`) through `mod x;` declarations; `read` gives a file's
    /// source, `None` when there is no such file.
    fn walk(root: &Path, shown_from: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Tree {
        let mut tree = Tree::default();
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut queue = vec![(ModPath::new(), root.to_path_buf(), dir)];
        while let Some((module, file, children)) = queue.pop() {
            let src = read(&file)
                .unwrap_or_else(|| panic!("cannot read {} (module {module:?})", file.display()));
            let scan = scan(&src);
            for (inside, name) in &scan.mods {
                let dir = inside.iter().fold(children.clone(), |d, n| d.join(n));
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(name).join("mod.rs");
                let found = [&flat, &nested].into_iter().find(|p| read(p).is_some());
                let Some(found) = found else {
                    panic!(
                        "{}: `mod {name};` has neither {} nor {}",
                        file.display(),
                        flat.display(),
                        nested.display()
                    )
                };
                let mut path = module.clone();
                path.extend(inside.iter().cloned());
                path.push(name.clone());
                queue.push((path, found.clone(), dir.join(name)));
            }
            let shown = file
                .strip_prefix(shown_from)
                .unwrap_or(&file)
                .display()
                .to_string();
            tree.files.insert(module, File { shown, scan });
        }
        tree
    }

    /// Where a path read in `module` (inside its inline modules `inside`)
    /// points, from the crate root; `None` when it leaves the crate or is
    /// a name of the module's own. A plain path starts at a child module or
    /// at a module the file's `use` binds (`bound`).
    fn absolute(
        &self,
        module: &[String],
        inside: &[String],
        leaf: &Leaf,
        bound: &BTreeMap<String, ModPath>,
    ) -> Option<ModPath> {
        let here: ModPath = module.iter().chain(inside).cloned().collect();
        match leaf.start {
            Start::Crate => Some(leaf.segs.clone()),
            Start::Super(n) if n <= here.len() => Some(
                here[..here.len() - n]
                    .iter()
                    .chain(&leaf.segs)
                    .cloned()
                    .collect(),
            ),
            Start::Super(_) => None,
            Start::This => Some(here.iter().chain(&leaf.segs).cloned().collect()),
            Start::Plain => {
                let (first, rest) = leaf.segs.split_first()?;
                let child: ModPath = here.iter().chain([first]).cloned().collect();
                if self.is_module(&child) {
                    return Some(here.iter().chain(&leaf.segs).cloned().collect());
                }
                let to = bound.get(first)?;
                Some(to.iter().chain(rest).cloned().collect())
            }
        }
    }

    /// A module of this tree, in a file of its own or inline.
    fn is_module(&self, path: &[String]) -> bool {
        self.files.contains_key(path)
            || self.files.iter().any(|(m, f)| {
                f.scan.inline.iter().any(|i| {
                    m.len() + i.len() == path.len() && path.starts_with(m) && path.ends_with(i)
                })
            })
    }

    /// The modules `module`'s own module-level `use` declarations bind
    /// (`use crate::kind;` binds `kind`), so that `kind::Kind` in its code
    /// reads as `crate::kind::Kind`.
    fn bindings(&self, module: &[String], file: &File) -> BTreeMap<String, ModPath> {
        let mut out = BTreeMap::new();
        for (inside, leaf) in &file.scan.leaves {
            let Some(name) = &leaf.binds else { continue };
            if let Some(to) = self.absolute(module, inside, leaf, &BTreeMap::new()) {
                if self.is_module(&to) {
                    out.insert(name.clone(), to);
                }
            }
        }
        out
    }

    /// The file a path names (the longest module path of a file it starts
    /// with) and the name it takes there (the next segment, or the module
    /// itself). A path through a re-export names the file that re-exports:
    /// that is the file it cannot do without.
    fn holder(&self, path: &[String]) -> (ModPath, String) {
        let file = (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| self.files.contains_key(p))
            .unwrap_or_default();
        let item = path
            .get(file.len())
            .cloned()
            .unwrap_or_else(|| MODULE.into());
        (file, item)
    }

    /// The references between this tree's files: (from, to) → each place
    /// (`file:line path`) and the names it takes.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), Vec<Reference>> {
        let mut out: BTreeMap<(ModPath, ModPath), Vec<Reference>> = BTreeMap::new();
        for (module, file) in &self.files {
            let bound = self.bindings(module, file);
            for (inside, leaf) in &file.scan.leaves {
                let Some(path) = self.absolute(module, inside, leaf, &bound) else {
                    continue;
                };
                let (to, item) = self.holder(&path);
                if to.starts_with(module) {
                    continue; // itself, or a module it holds
                }
                out.entry((module.clone(), to))
                    .or_default()
                    .push(Reference {
                        place: format!("{}:{}", file.shown, leaf.line),
                        written: leaf.shown(),
                        item,
                    });
            }
        }
        out
    }
}

/// One reference from a file to another.
#[derive(Debug, Clone)]
struct Reference {
    place: String,
    written: String,
    item: String,
}

/// A module path as shown: `a::b`, the root as `crate`.
fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every elementary circle through the graph, each once, starting at its
/// smallest node; at most `most`.
fn circles(edges: &BTreeMap<(ModPath, ModPath), Vec<Reference>>, most: usize) -> Vec<Vec<ModPath>> {
    let mut next: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    let mut out = Vec::new();
    for &start in next.keys() {
        // Depth-first over nodes after `start`, so each circle is found once.
        let mut stack: Vec<(Vec<&ModPath>, usize)> = vec![(vec![start], 0)];
        while let Some((path, k)) = stack.pop() {
            let at = *path.last().expect("a path is never empty");
            let Some(&to) = next.get(at).and_then(|n| n.get(k)) else {
                continue;
            };
            stack.push((path.clone(), k + 1));
            if to == start {
                out.push(
                    path.iter()
                        .map(|m| (*m).clone())
                        .chain([start.clone()])
                        .collect(),
                );
                if out.len() >= most {
                    return out;
                }
            } else if to > start && !path.contains(&to) {
                let mut longer = path;
                longer.push(to);
                stack.push((longer, 0));
            }
        }
    }
    out
}

/// Each circle of `tree` as the test prints it: the circle, each step's
/// first reference, and a hint at the step that takes least.
fn problems(krate: &str, tree: &Tree) -> Vec<String> {
    let edges = tree.edges();
    let mut out = Vec::new();
    for circle in circles(&edges, 100) {
        let shown: Vec<String> = circle.iter().map(|m| name(m)).collect();
        let mut text = format!("{krate}: {}", shown.join(" -> "));
        let mut lightest: Option<(usize, &ModPath, &ModPath, BTreeSet<&str>)> = None;
        for step in circle.windows(2) {
            let refs = &edges[&(step[0].clone(), step[1].clone())];
            let mut items: BTreeSet<&str> = refs.iter().map(|r| r.item.as_str()).collect();
            if items.len() > 1 {
                items.remove(MODULE); // `use crate::kind;` for the `kind::X` it names
            }
            let first = &refs[0];
            text += &format!(
                "\n    {} -> {}: {} `{}`{}",
                name(&step[0]),
                name(&step[1]),
                first.place,
                first.written,
                match refs.len() {
                    1 => String::new(),
                    n => format!(" (+{} more)", n - 1),
                }
            );
            if lightest.as_ref().is_none_or(|l| items.len() < l.0) {
                lightest = Some((items.len(), &step[0], &step[1], items));
            }
        }
        if let Some((_, from, to, items)) = lightest {
            let items: Vec<&str> = items.into_iter().collect();
            text += &format!(
                "\n    hint: {} takes only {} from {}: move that to {}, to the module that owns \
                 the concept, or to a leaf module both use",
                name(from),
                items.join(", "),
                name(to),
                name(from),
            );
        }
        out.push(text);
    }
    out
}

/// Each workspace crate's library and binary roots under its `src/`, named
/// as the failure shows them (`ace-ledger`, `ace-cli (src/main.rs)`).
fn crate_roots() -> Vec<(String, PathBuf)> {
    let root = workspace::root();
    let mut roots = Vec::new();
    for p in workspace::packages().values() {
        let folder = root.join(&p.folder);
        for file in p.shipped_roots() {
            let Ok(inside) = file.strip_prefix(&folder) else {
                continue;
            };
            if !inside.starts_with("src") {
                continue;
            }
            let label = if p.lib_root() == Some(file) {
                p.name.clone()
            } else {
                format!("{} ({})", p.name, inside.display())
            };
            roots.push((label, file.to_path_buf()));
        }
    }
    roots.sort();
    roots
}

#[test]
fn no_circle_of_module_files_inside_a_crate() {
    let roots = crate_roots();
    let workspace = workspace::root();
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let (mut files, mut edges, mut found) = (0, 0, Vec::new());
    for (krate, root) in &roots {
        let tree = Tree::walk(root, &workspace, &read);
        files += tree.files.len();
        edges += tree.edges().len();
        found.extend(problems(krate, &tree));
    }
    eprintln!(
        "file graph: {} crate roots, {files} module files, {edges} references between files, \
         {} circles",
        roots.len(),
        found.len()
    );
    assert!(
        found.is_empty(),
        "circles of module files (each step: where it is written, and how many more):\n{}",
        found.join("\n")
    );
}

/// A tree made up in memory: (file under `src/`, its source).
fn tree_of(files: &[(&str, &str)]) -> Tree {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, s)| (Path::new("src").join(p), s.to_string()))
        .collect();
    Tree::walk(Path::new("src/lib.rs"), Path::new(""), &|p| {
        files.get(p).cloned()
    })
}

/// The edges of a made-up tree, as `from -> to`.
fn edges_of(files: &[(&str, &str)]) -> Vec<String> {
    tree_of(files)
        .edges()
        .keys()
        .map(|(from, to)| format!("{} -> {}", name(from), name(to)))
        .collect()
}

#[test]
fn paths_of_every_form_are_references() {
    let found = edges_of(&[
        ("lib.rs", "mod a; mod b; mod c; mod d; mod e; mod p;"),
        (
            "a.rs",
            "use crate::{b, c::{self, X as Y}};\nfn f() { crate::d::g(); }",
        ),
        ("b.rs", "macro_rules! m { () => { $crate::e::h() } }"),
        ("c.rs", "pub struct X;"),
        ("d.rs", "pub fn g() {}"),
        ("e.rs", "pub fn h() {}"),
        ("p/mod.rs", "mod q; mod r;"),
        (
            "p/q.rs",
            "use super::r::Z; fn f() -> super::super::e::H { todo!() }",
        ),
        ("p/r.rs", "pub struct Z;"),
    ]);
    assert_eq!(
        found,
        [
            "a -> b",
            "a -> c",
            "a -> d",
            "b -> e",
            "p::q -> e",
            "p::q -> p::r"
        ],
        "{found:#?}"
    );
}

#[test]
fn comments_strings_tests_containment_and_visibility_are_not_references() {
    let found = edges_of(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            r##"
            //! See crate::b::X.
            /// Like crate::b::X. /* crate::b::X */
            /* nested /* crate::b::X */ still a comment crate::b::X */
            const S: &str = "crate::b::X";
            const R: &str = r#"crate::b::X "quoted""#;
            const C: char = '"';
            fn f<'a>(x: &'a str) -> &'a str { x }
            pub(in crate::b) struct V;
            mod child;
            #[cfg(test)]
            mod tests { use crate::b::X; }
            #[cfg(test)]
            fn helper() { crate::b::y() }
            "##,
        ),
        ("a/child.rs", "use super::super::b::X;"),
        (
            "b.rs",
            "pub struct X; mod inner { use super::X; } fn g() { crate::a::child::f() }",
        ),
    ]);
    // The only edges: a's child uses b, and b uses a module a holds.
    assert_eq!(found, ["a::child -> b", "b -> a::child"], "{found:#?}");
}

#[test]
fn a_path_names_the_file_it_goes_through_and_the_item_it_takes() {
    let tree = tree_of(&[
        ("lib.rs", "mod kind; mod event; pub use event::Event;"),
        (
            "event.rs",
            "pub struct Event; mod schema; pub use crate::kind::Kind;",
        ),
        ("event/schema.rs", "use super::Kind;"),
        (
            "kind.rs",
            "use crate::Event; use crate::event; fn f(_: event::Event) {}",
        ),
    ]);
    let found: Vec<String> = tree
        .edges()
        .iter()
        .map(|((from, to), refs)| {
            let items: Vec<&str> = refs.iter().map(|r| r.item.as_str()).collect();
            format!("{} -> {}: {}", name(from), name(to), items.join(" "))
        })
        .collect();
    // A re-export (`super::Kind`, `crate::Event`) is the file that makes
    // it; a module a `use` binds (`event::Event`) reads through to its item.
    assert_eq!(
        found,
        [
            "event -> kind: Kind",
            "event::schema -> event: Kind",
            "kind -> crate: Event",
            "kind -> event: (the module) Event",
        ],
        "{found:#?}"
    );
}

#[test]
fn a_circle_is_named_with_its_steps_and_a_hint() {
    let tree = tree_of(&[
        ("lib.rs", "mod body; mod prefix; mod x;"),
        (
            "body.rs",
            "use crate::prefix::{Cut, Mark};\nuse crate::prefix::Cut as C2;",
        ),
        ("prefix.rs", "\n\nfn f(b: crate::body::Body) {}"),
        ("x.rs", "use crate::body::Body;"),
    ]);
    let found = problems("ace-flow", &tree);
    assert_eq!(
        found,
        ["ace-flow: body -> prefix -> body\n    \
          body -> prefix: src/body.rs:1 `crate::prefix::Cut` (+2 more)\n    \
          prefix -> body: src/prefix.rs:3 `crate::body::Body`\n    \
          hint: prefix takes only Body from body: move that to prefix, to the module that owns \
          the concept, or to a leaf module both use"],
        "{found:#?}"
    );
}
