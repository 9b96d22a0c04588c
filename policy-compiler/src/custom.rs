//! Custom destination attributes: `attributes = { rack = "r1" }` in the
//! manifest, each declared on `Destination` in the schema.
//!
//! Why only these types: a destination attribute is a constant of the
//! destination, so any Cedar type would do for the tables; the limit is the
//! manifest, where TOML has strings, integers, booleans and arrays. Those
//! map to `String`, `Long`, `Bool`, `Set<String>` and `Set<Long>` without
//! any parsing rule of our own. Anything else is refused, as is an
//! attribute the schema does not declare (it would be dropped) or one that
//! shadows a built-in field.

use crate::error::Diagnostic;
use crate::manifest::LoadedManifest;
use crate::schema::{AttrType, SchemaShape};
use cedar_policy::RestrictedExpression;
use toml::{Spanned, Value};

/// The Cedar types a custom destination attribute may have.
pub const SUPPORTED: &str = "String, Long, Bool, Set<String> or Set<Long>";

/// Whether a custom destination attribute may have type `ty`.
pub fn supported(ty: &AttrType) -> bool {
    match ty {
        AttrType::String | AttrType::Long | AttrType::Bool => true,
        AttrType::Other(s) => s == "Set<String>" || s == "Set<Long>",
        AttrType::Entity(_) => false,
    }
}

fn convert(ty: &AttrType, v: &Value) -> Option<RestrictedExpression> {
    let each = |want: &str| -> Option<Vec<RestrictedExpression>> {
        v.as_array()?
            .iter()
            .map(|x| match (want, x) {
                ("String", Value::String(s)) => Some(RestrictedExpression::new_string(s.clone())),
                ("Long", Value::Integer(i)) => Some(RestrictedExpression::new_long(*i)),
                _ => None,
            })
            .collect()
    };
    match (ty, v) {
        (AttrType::String, Value::String(s)) => Some(RestrictedExpression::new_string(s.clone())),
        (AttrType::Long, Value::Integer(i)) => Some(RestrictedExpression::new_long(*i)),
        (AttrType::Bool, Value::Boolean(b)) => Some(RestrictedExpression::new_bool(*b)),
        (AttrType::Other(s), _) if s == "Set<String>" => {
            each("String").map(RestrictedExpression::new_set)
        }
        (AttrType::Other(s), _) if s == "Set<Long>" => {
            each("Long").map(RestrictedExpression::new_set)
        }
        _ => None,
    }
}

/// The Cedar value of custom attribute `name` of destination `dest`, or why
/// it cannot have one.
pub fn value(
    m: &LoadedManifest,
    shape: &SchemaShape,
    builtin: &[&str],
    dest: &str,
    name: &str,
    v: &Spanned<Value>,
) -> Result<RestrictedExpression, Diagnostic> {
    if builtin.contains(&name) {
        return Err(m.diag(
            v.span(),
            format!("destination `{dest}` sets built-in field `{name}` under `attributes`"),
            &format!("set `{name} = ...` on the destination itself"),
        ));
    }
    let declared = shape
        .entity_attrs
        .get(&shape.resource)
        .and_then(|a| a.get(name))
        .ok_or_else(|| {
            m.diag(
                v.span(),
                format!("destination `{dest}` has attribute `{name}`, which the schema does not declare on `{}`", shape.resource),
                &format!("declare it in the schema (`{name}: String,` in `entity Destination`), or remove it"),
            )
        })?;
    convert(&declared.ty, v.get_ref()).ok_or_else(|| {
        m.diag(
            v.span(),
            format!(
                "attribute `{name}` of destination `{dest}` is `{}`, but the schema says `{}`",
                v.get_ref(),
                declared.ty.spelled()
            ),
            &format!("give a value of the declared type; custom attributes may be {SUPPORTED}"),
        )
    })
}
