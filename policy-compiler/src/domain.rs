//! The finite domain of each request attribute, from the fleet manifest.
//!
//! Why domains are finite: a table has one row per value, so every value a
//! policy can tell apart must be listed; anything else is "unknown" and
//! fails closed. Strings, Longs, extension values (`ipaddr`, `decimal`,
//! `datetime`, `duration`, written as the string Cedar's constructor takes)
//! and entities other than the model (by id) take their values from
//! `[request.NAME]`; Bools are `false` and `true`, the model the
//! `[[models]]` catalogue. Sets and records have no finite list a request
//! header could name, and a policy that reads one is refused with the
//! reason.

use crate::entities::uid;
use crate::error::Diagnostic;
use crate::manifest::LoadedManifest;
use crate::schema::AttrType;
use cedar_policy::RestrictedExpression;

/// The marker used for "a value not known at compile time" when asking
/// Cedar about it (verify, explain): no manifest value can start with NUL.
pub const UNKNOWN_MARKER: &str = "\u{0}unknown";

/// One value in an attribute's domain.
#[derive(Clone, Debug)]
pub struct AttrValue {
    /// The string the filter looks up (`value_index`): the string itself, the
    /// decimal integer, `true`/`false`, or the entity id.
    pub key: String,
    /// The Cedar value.
    pub expr: RestrictedExpression,
}

/// Why a context attribute read by a policy has no finite domain, and what
/// to do about it.
pub(crate) fn no_domain(
    name: &str,
    ty: Option<&AttrType>,
    model: Option<&str>,
) -> (String, String) {
    match ty {
        Some(t) if t == &AttrType::Long || listed(t, model).is_some() => (
            "which has no finite domain".into(),
            format!("list its values under `[request.{name}]` in the fleet manifest, or stop reading it"),
        ),
        None => (
            "which has no finite domain".into(),
            format!("list its values under `[request.{name}]` in the fleet manifest, or stop reading it"),
        ),
        Some(t) => (
            format!("of type `{}`, which has no finite domain the tables can key on", t.spelled()),
            format!("request attributes the tables key on are String, Long, Bool, an entity or an extension value; declare `{name}` as one of them (a set of values as several Bool attributes), or stop reading it"),
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
    let kind = listed(ty, model_type);
    if let (Some(d), AttrType::Bool | AttrType::Entity(_) | AttrType::Other(_), None) =
        (declared, ty, &kind)
    {
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
    match (ty, kind) {
        (_, Some(kind)) => {
            for v in declared.iter().flat_map(|d| &d.get_ref().values) {
                match v.get_ref() {
                    toml::Value::String(s) if s.starts_with('\u{0}') => {
                        diags.push(m.diag(v.span(), format!("value of `{name}` starts with NUL"), "remove it"));
                    }
                    toml::Value::String(s) => match kind.make(s) {
                        Ok(expr) => values.push(AttrValue { key: s.clone(), expr }),
                        Err(e) => diags.push(m.diag(
                            v.span(),
                            format!("value `{s}` of `{name}` is not a valid `{}`: {e}", ty.spelled()),
                            "write the value as Cedar's constructor takes it, e.g. \"10.0.0.0/8\" for ipaddr, \"1.5\" for decimal",
                        )),
                    },
                    other => diags.push(m.diag(
                        v.span(),
                        format!("value `{other}` of `{name}` is not a string, but the schema says `{}`", ty.spelled()),
                        hint,
                    )),
                }
            }
            let keys: Vec<&str> = values.iter().map(|v| v.key.as_str()).collect();
            unknown = kind.stand_in(&keys);
        }
        (AttrType::Long, _) => {
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
        (AttrType::Bool, _) => {
            unknown = RestrictedExpression::new_bool(false);
            for b in [false, true] {
                values.push(AttrValue {
                    key: b.to_string(),
                    expr: RestrictedExpression::new_bool(b),
                });
            }
        }
        (AttrType::Entity(t), _) if Some(t.as_str()) == model_type => {
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
        (other, _) => {
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
    let fixed = matches!(ty, AttrType::Bool)
        || matches!(ty, AttrType::Entity(t) if Some(t.as_str()) == model_type);
    if declared.is_none() && !fixed {
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

/// Types whose values `[request.NAME]` lists as strings, and how a string
/// becomes a Cedar value.
#[derive(Clone, Copy, Debug)]
enum Listed<'a> {
    /// `String`.
    String,
    /// An extension type, by Cedar's constructor (`ip`, `decimal`, ...).
    Extension(&'static str),
    /// An entity type other than the model catalogue's, by id.
    Entity(&'a str),
}

/// Extension types, their constructors, and values used for "unknown" (the
/// first one not in the domain).
const EXTENSIONS: [(&str, &str, [&str; 3]); 4] = [
    ("ipaddr", "ip", ["0.0.0.0", "255.255.255.255", "::1"]),
    ("decimal", "decimal", ["0.0", "-0.0001", "0.0001"]),
    (
        "datetime",
        "datetime",
        ["1970-01-01", "2999-12-31", "1970-01-02"],
    ),
    ("duration", "duration", ["0ms", "1ms", "-1ms"]),
];

fn listed<'a>(ty: &'a AttrType, model: Option<&str>) -> Option<Listed<'a>> {
    match ty {
        AttrType::String => Some(Listed::String),
        AttrType::Entity(t) if Some(t.as_str()) != model => Some(Listed::Entity(t)),
        AttrType::Other(s) => EXTENSIONS
            .iter()
            .find(|(name, ..)| name == s)
            .map(|(_, f, _)| Listed::Extension(f)),
        _ => None,
    }
}

impl Listed<'_> {
    fn make(self, s: &str) -> Result<RestrictedExpression, String> {
        match self {
            Listed::String => Ok(RestrictedExpression::new_string(s.to_string())),
            Listed::Entity(t) => uid(t, s).map(RestrictedExpression::new_entity_uid),
            Listed::Extension(f) => {
                let expr = match f {
                    "ip" => RestrictedExpression::new_ip(s),
                    "decimal" => RestrictedExpression::new_decimal(s),
                    "datetime" => RestrictedExpression::new_datetime(s),
                    _ => RestrictedExpression::new_duration(s),
                };
                // Evaluating it is the only check Cedar offers.
                cedar_policy::Context::from_pairs([("v".to_string(), expr.clone())])
                    .map_err(|e| e.to_string())?;
                Ok(expr)
            }
        }
    }

    fn stand_in(self, keys: &[&str]) -> RestrictedExpression {
        let fallback = || RestrictedExpression::new_string(UNKNOWN_MARKER.into());
        match self {
            Listed::String => fallback(),
            Listed::Entity(t) => uid(t, UNKNOWN_MARKER)
                .map_or_else(|_| fallback(), RestrictedExpression::new_entity_uid),
            Listed::Extension(f) => {
                let candidates = EXTENSIONS
                    .iter()
                    .find(|(_, g, _)| *g == f)
                    .map_or([""; 3], |(.., c)| *c);
                let pick = candidates
                    .iter()
                    .find(|c| !keys.contains(c))
                    .or(candidates.first())
                    .copied()
                    .unwrap_or_default();
                self.make(pick).unwrap_or_else(|_| fallback())
            }
        }
    }
}
