//! Limits on the shape of Cedar text, checked before Cedar parses it.
//!
//! Why: Cedar's parser, and its conversion of the parse tree, recurse once
//! per nesting level and once per chained operator, with no limit of their
//! own. A policy with a few hundred nested brackets or some thousands of
//! `&&` overflows the stack: the command aborts with no message, and in
//! the browser playground the module traps and stays unusable until the
//! page is reloaded. Policies people write come nowhere near these limits
//! (the examples nest 3 deep and chain at most 5 operators), so text past
//! them is refused with its line and column before Cedar sees it.
//!
//! The scan is lexical: brackets `(`, `[` and `{` outside string literals
//! and `//` comments give the depth; `&&`, `||`, `!`, `+`, `-`, `*`, `.`
//! and the keyword `if` within one statement (up to a `;`) give
//! the chain. Counting every operator, not only a run of one, overstates
//! the recursion and so errs on the side of refusing.

use crate::error::Diagnostic;
use std::path::Path;

/// The deepest bracket nesting accepted.
pub const MAX_DEPTH: usize = 32;

/// The most operators accepted in one policy (or schema declaration).
pub const MAX_OPERATORS: usize = 256;

/// Checks `text` (a policy file or a schema) against [`MAX_DEPTH`] and
/// [`MAX_OPERATORS`]; the first excess, at its line and column.
pub fn check(path: &Path, text: &str) -> Result<(), Diagnostic> {
    let schema = path.extension().is_some_and(|e| e == "cedarschema");
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut operators = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let next = bytes.get(i + 1).copied();
        match b {
            b'"' => {
                // A string literal: skip to its closing quote.
                i += 1;
                while let Some(&c) = bytes.get(i).filter(|c| **c != b'"') {
                    i += if c == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if next == Some(b'/') => {
                while bytes.get(i).is_some_and(|c| *c != b'\n') {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(Diagnostic::at(
                        path,
                        text,
                        i,
                        format!("brackets nest deeper than {MAX_DEPTH} levels"),
                        if schema {
                            "Cedar parses nesting recursively; declare nested records as \
                             entity types of their own"
                        } else {
                            "Cedar parses nesting recursively; split the condition into \
                             several `when` clauses or policies"
                        }
                        .into(),
                    ));
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b';' => operators = 0,
            b'&' | b'|' if next == Some(b) => {
                operators += 1;
                i += 1;
            }
            b'!' | b'+' | b'-' | b'*' | b'.' => operators += 1,
            b'i' if next == Some(b'f')
                && !bytes
                    .get(i.wrapping_sub(1))
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                && !bytes
                    .get(i + 2)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
            {
                operators += 1;
                i += 1;
            }
            _ => {}
        }
        if operators > MAX_OPERATORS {
            return Err(Diagnostic::at(
                path,
                text,
                i,
                format!("this statement has more than {MAX_OPERATORS} operators"),
                "Cedar parses operator chains recursively; split it into several \
                 `when` clauses or policies, or list values in a set (`[...].contains(x)`)"
                    .into(),
            ));
        }
        i += 1;
    }
    Ok(())
}

/// Policies for the example schema at each limit and one step past it, as
/// (what, at, past): for tests that every front end (the command, the
/// browser playground) compiles the first and refuses the second at line 2.
pub fn shapes_at_the_limits() -> Vec<(&'static str, String, String)> {
    let forbid = |condition: String| {
        format!("forbid (principal, action, resource)\nwhen {{ {condition} }};\n")
    };
    let nested = |n: usize| {
        forbid(format!(
            "{}context.data_class == \"phi\"{}",
            "(".repeat(n),
            ")".repeat(n)
        ))
    };
    let chained =
        |n: usize| forbid(vec!["principal == Ace::Tenant::\"northbank\""; n + 1].join(" && "));
    let branched = |n: usize| {
        forbid(format!(
            "{}context.data_class == \"phi\"{}",
            "if context.tp_degree >= 1 then ".repeat(n),
            " else false".repeat(n)
        ))
    };
    // The `when` clause's brace is the first level of nesting; each `if`
    // level has two operators (`if` and a `.`), plus the last `.`.
    vec![
        ("nesting", nested(MAX_DEPTH - 1), nested(MAX_DEPTH)),
        ("&&", chained(MAX_OPERATORS), chained(MAX_OPERATORS + 1)),
        (
            "if",
            branched((MAX_OPERATORS - 1) / 2),
            branched(MAX_OPERATORS / 2),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_text(text: &str) -> Result<(), String> {
        check(Path::new("p.cedar"), text).map_err(|d| d.to_string())
    }

    #[test]
    fn ordinary_policies_pass() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("cedar" | "cedarschema")
            ) {
                let text = std::fs::read_to_string(&path).unwrap();
                assert_eq!(check(&path, &text).map_err(|d| d.to_string()), Ok(()));
            }
        }
        // Brackets, operators and `if` inside strings and comments do not count.
        let quoted = format!(
            "// {}\npermit (principal, action, resource) when {{ context.x == \"{}\\\"{}\" }};",
            "(".repeat(500),
            "[&&".repeat(2000),
            "if ".repeat(2000)
        );
        assert_eq!(check_text(&quoted), Ok(()));
        // Identifiers containing `if` are not the keyword.
        let names = "permit (principal, action, resource) when { context.iffy || context.gif };"
            .repeat(800);
        assert_eq!(check_text(&names), Ok(()));
    }

    #[test]
    fn excess_is_refused_at_its_place() {
        let deep = format!(
            "permit (principal, action, resource)\nwhen {{ {}true{} }};",
            "(".repeat(MAX_DEPTH),
            ")".repeat(MAX_DEPTH)
        );
        let e = check_text(&deep).unwrap_err();
        assert!(
            e.starts_with("p.cedar:2:") && e.contains("deeper than 32"),
            "{e}"
        );
        // The `when` clause's brace is the first level.
        let at_limit = format!(
            "permit (principal, action, resource)\nwhen {{ {}true{} }};",
            "(".repeat(MAX_DEPTH - 1),
            ")".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(check_text(&at_limit), Ok(()));

        let chain = |n: usize| {
            format!(
                "permit (principal, action, resource) when {{ true }};\n\
                 forbid (principal, action, resource) when {{ {} }};",
                vec!["true"; n + 1].join(" && ")
            )
        };
        assert_eq!(check_text(&chain(MAX_OPERATORS)), Ok(()));
        let e = check_text(&chain(MAX_OPERATORS + 1)).unwrap_err();
        assert!(
            e.starts_with("p.cedar:2:") && e.contains("more than 256 operators"),
            "{e}"
        );
        let ifs = format!(
            "permit (principal, action, resource) when {{ {}true{} }};",
            "if true then ".repeat(MAX_OPERATORS + 1),
            " else false".repeat(MAX_OPERATORS + 1)
        );
        assert!(check_text(&ifs).is_err());
    }
}
