//! A human-readable rendering of a tables file, read back through
//! `ace_core::tables` so that what is shown is what the filter will see.
//!
//! Why rows are listed by value names and destination indices: a reviewer
//! checking a policy change wants to see "data_class=personal_eu forbids
//! d3 d7", not bit patterns; `diff` on two dumps then shows what a change
//! did.

use ace_core::tables::{FactorKind, LoadError, Tables, UNKNOWN};
use std::fmt::Write as _;

/// Renders `bytes` as text. Rows that are empty (permit) are left out, as
/// are unknown-value rows, which are fixed by construction (empty for
/// permits, everything for forbids).
pub fn dump(bytes: &[u8]) -> Result<String, LoadError> {
    let t = Tables::load(bytes)?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "ACE policy tables, format v{}, {} bytes, {} destinations, {} attributes, {} factors",
        ace_core::tables::VERSION,
        bytes.len(),
        t.destination_count(),
        t.attribute_count(),
        t.factor_count()
    );
    let _ = writeln!(s, "\ndestinations (bit: name -> cluster)");
    for d in 0..t.destination_count() {
        let _ = writeln!(
            s,
            "  {d:>4}: {} -> {}",
            t.destination_name(d).unwrap_or("?"),
            t.destination_cluster(d).unwrap_or("?")
        );
    }
    let _ = writeln!(s, "\nattributes (value index: value; 0 is unknown)");
    for a in 0..t.attribute_count() as u32 {
        let values: Vec<String> = (1..=t.value_count(a))
            .map(|v| format!("{v}={}", t.value_name(a, v).unwrap_or("?")))
            .collect();
        let _ = writeln!(
            s,
            "  {}: {}",
            t.attribute_name(a).unwrap_or("?"),
            values.join(" ")
        );
    }
    for f in 0..t.factor_count() {
        let Some(factor) = t.factor(f) else { continue };
        let attrs: Vec<u32> = factor.attributes().collect();
        let names: Vec<&str> = attrs
            .iter()
            .map(|&a| t.attribute_name(a).unwrap_or("?"))
            .collect();
        let kind = match factor.kind() {
            FactorKind::Permit => "permit",
            FactorKind::Forbid => "forbid",
        };
        let _ = writeln!(
            s,
            "\nfactor {f}: {kind} keyed by [{}], {} rows",
            names.join(", "),
            factor.row_count()
        );
        let radices: Vec<usize> = attrs
            .iter()
            .map(|&a| t.value_count(a) as usize + 1)
            .collect();
        let mut key = vec![0u32; attrs.len()];
        for r in 0..factor.row_count() {
            crate::compile::decode(r, &radices, &mut key);
            if key.contains(&UNKNOWN) {
                continue;
            }
            let dests: Vec<String> = (0..t.destination_count())
                .filter(|&d| {
                    factor
                        .word(r, d / 64)
                        .is_some_and(|w| w >> (d % 64) & 1 == 1)
                })
                .map(|d| d.to_string())
                .collect();
            if dests.is_empty() && factor.kind() == FactorKind::Permit {
                continue;
            }
            let label: Vec<String> = attrs
                .iter()
                .zip(&key)
                .map(|(&a, &v)| {
                    format!(
                        "{}={}",
                        t.attribute_name(a).unwrap_or("?"),
                        t.value_name(a, v).unwrap_or("?")
                    )
                })
                .collect();
            let label = if label.is_empty() {
                "(any request)".to_string()
            } else {
                label.join(" ")
            };
            let body = if dests.len() == t.destination_count() {
                "all".to_string()
            } else if dests.is_empty() {
                "none".to_string()
            } else {
                dests.join(" ")
            };
            let _ = writeln!(s, "  {label}: {body}");
        }
    }
    Ok(s)
}
