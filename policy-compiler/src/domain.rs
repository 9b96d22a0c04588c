//! The finite domain of each request attribute, from the fleet manifest.
//!
//! Why domains are finite: a table has one row per value, so every value a
//! policy can tell apart must be listed; anything else is "unknown" and
//! fails closed. Strings and Longs take their values from `[request.NAME]`,
//! Bools are `false` and `true`, the model from the `[[models]]` catalogue.
//! Other types (sets, records, extension values, other entities) have no
//! list in the manifest, and a policy that reads one is refused with the
//! reason.

use crate::error::Diagnostic;
use crate::manifest::LoadedManifest;
use crate::project::{uid, AttrType, AttrValue, UNKNOWN_MARKER};
use cedar_policy::RestrictedExpression;

/// Why a context attribute read by a policy has no finite domain, and what
/// to do about it.
pub(crate) fn no_domain(
    name: &str,
    ty: Option<&AttrType>,
    model: Option<&str>,
) -> (String, String) {
    match ty {
        Some(AttrType::String | AttrType::Long) | None => (
            "which has no finite domain".into(),
            format!("list its values under `[request.{name}]` in the fleet manifest, or stop reading it"),
        ),
        Some(AttrType::Entity(t)) => (
            format!("an entity of type `{t}`; the manifest lists entities only for the model catalogue ({})", model.unwrap_or("no `Model` type in the schema")),
            format!("declare `{name}` as `Model`, String or Long, or stop reading it"),
        ),
        Some(t) => (
            format!("of type `{}`, which has no finite domain the tables can key on", t.spelled()),
            format!("request attributes the tables key on are String, Long, Bool or `Model`; declare `{name}` as one of them (a set of values as several Bool attributes), or stop reading it"),
        ),
    }
}

/// The domain of context attribute `name` of type `ty`, and the value Cedar
/// is asked about for an unknown one.
pub(crate) fn domain_of(
    m: &LoadedManifest,
    name: &str,
    ty: &AttrType,
    model_type: Option<&str>,
    diags: &mut Vec<Diagnostic>,
) -> (Option<Vec<AttrValue>>, RestrictedExpression) {
    let declared = m.manifest.request.get(name);
    let hint = "give the values the attribute's Cedar type: strings for String, integers for Long";
    let mut values = Vec::new();
    let unknown;
    if let (Some(d), AttrType::Bool | AttrType::Entity(_) | AttrType::Other(_)) = (declared, ty) {
        let from = match ty {
            AttrType::Bool => "a Bool is always `false` or `true`".to_string(),
            AttrType::Entity(t) if Some(t.as_str()) == model_type => {
                "a model's values are the `[[models]]` catalogue".to_string()
            }
            t => format!("the tables cannot key on type `{}`", t.spelled()),
        };
        diags.push(m.diag(
            d.span(),
            format!(
                "`[request.{name}]` lists values, but `{name}` has type `{}` and {from}",
                ty.spelled()
            ),
            "remove the `[request.…]` table; nothing in it would be used",
        ));
    }
    match ty {
        AttrType::String => {
            unknown = RestrictedExpression::new_string(UNKNOWN_MARKER.into());
            for v in declared.iter().flat_map(|d| &d.get_ref().values) {
                match v.get_ref() {
                    toml::Value::String(s) if s.starts_with('\u{0}') => {
                        diags.push(m.diag(v.span(), format!("value of `{name}` starts with NUL"), "remove it"));
                    }
                    toml::Value::String(s) => values.push(AttrValue {
                        key: s.clone(),
                        expr: RestrictedExpression::new_string(s.clone()),
                    }),
                    other => diags.push(m.diag(
                        v.span(),
                        format!("value `{other}` of `{name}` is not a string, but the schema says String"),
                        hint,
                    )),
                }
            }
        }
        AttrType::Long => {
            let mut ints = Vec::new();
            for v in declared.iter().flat_map(|d| &d.get_ref().values) {
                match v.get_ref() {
                    toml::Value::Integer(i) => ints.push(*i),
                    other => diags.push(m.diag(
                        v.span(),
                        format!("value `{other}` of `{name}` is not an integer, but the schema says Long"),
                        hint,
                    )),
                }
            }
            // An integer outside the domain stands for "unknown".
            let outside = ints.iter().max().map_or(0, |x| x.saturating_add(1));
            unknown = RestrictedExpression::new_long(outside);
            for i in ints {
                values.push(AttrValue {
                    key: i.to_string(),
                    expr: RestrictedExpression::new_long(i),
                });
            }
        }
        AttrType::Bool => {
            unknown = RestrictedExpression::new_bool(false);
            for b in [false, true] {
                values.push(AttrValue {
                    key: b.to_string(),
                    expr: RestrictedExpression::new_bool(b),
                });
            }
        }
        AttrType::Entity(t) if Some(t.as_str()) == model_type => {
            unknown = match uid(t, UNKNOWN_MARKER) {
                Ok(u) => RestrictedExpression::new_entity_uid(u),
                Err(_) => RestrictedExpression::new_string(UNKNOWN_MARKER.into()),
            };
            for mo in &m.manifest.models {
                let id = mo.get_ref().id.get_ref();
                if let Ok(u) = uid(t, id) {
                    values.push(AttrValue {
                        key: id.clone(),
                        expr: RestrictedExpression::new_entity_uid(u),
                    });
                }
            }
        }
        other => {
            let placeholder = match other {
                AttrType::Entity(t) => uid(t, UNKNOWN_MARKER)
                    .map(RestrictedExpression::new_entity_uid)
                    .ok(),
                _ => Some(RestrictedExpression::new_set([])),
            };
            return (
                None,
                placeholder
                    .unwrap_or_else(|| RestrictedExpression::new_string(UNKNOWN_MARKER.into())),
            );
        }
    }
    if declared.is_none() && !matches!(ty, AttrType::Bool | AttrType::Entity(_)) {
        return (None, unknown);
    }
    values.sort_by(|a, b| a.key.cmp(&b.key));
    let before = values.len();
    values.dedup_by(|a, b| a.key == b.key);
    if values.len() != before {
        if let Some(d) = declared {
            diags.push(m.diag(
                d.span(),
                format!("request attribute `{name}` lists a value twice"),
                "list each value once",
            ));
        }
    }
    (Some(values), unknown)
}
