//! The parts of the Cedar schema the compiler needs, found by name.
//!
//! Why by name: the manifest describes tenants, destinations, models, tenant
//! groups and pools, and each of those has one documented Cedar type
//! (`Tenant`, `Destination`, `Model`, `TenantGroup`, `Pool`) in the namespace
//! of the action `dispatch`. Reading the schema by position (the first
//! action, the first principal type, the first parent type) compiles a
//! schema with a second action or a second parent type silently wrong, so
//! every type is looked up by its documented name, and a schema that does
//! not have it is refused with what was expected.
//!
//! Other actions, principal types, resource types and parent types may be
//! declared beside these: requests through ACE are always `dispatch` from a
//! tenant to a destination, so policies about anything else never apply to
//! them, and the tables are exact for the requests ACE makes.

use crate::error::Diagnostic;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;

/// The action every request is.
pub const ACTION: &str = "dispatch";
/// The principal type (the tenant in `x-ace-tenant`).
pub const TENANT_TYPE: &str = "Tenant";
/// The resource type (a destination of the manifest).
pub const DESTINATION_TYPE: &str = "Destination";
/// The model catalogue's type.
pub const MODEL_TYPE: &str = "Model";
/// The type of a tenant's `groups`.
pub const GROUP_TYPE: &str = "TenantGroup";
/// The type of a destination's `pools`.
pub const POOL_TYPE: &str = "Pool";

/// A Cedar type a request attribute can have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrType {
    /// `String`.
    String,
    /// `Long`.
    Long,
    /// `Bool`.
    Bool,
    /// An entity of the named (fully qualified) type.
    Entity(String),
    /// Anything else (sets, records, extensions), with its Cedar spelling:
    /// no finite domain.
    Other(String),
}

impl AttrType {
    /// The type as a policy author writes it (`Set<String>`, `decimal`).
    pub fn spelled(&self) -> String {
        match self {
            AttrType::String => "String".into(),
            AttrType::Long => "Long".into(),
            AttrType::Bool => "Bool".into(),
            AttrType::Entity(t) => t.clone(),
            AttrType::Other(s) => s.clone(),
        }
    }
}

/// How a schema attribute type is spelled in Cedar syntax.
fn spell(j: &Json) -> String {
    let name = || {
        j.get("name")
            .and_then(Json::as_str)
            .unwrap_or("?")
            .to_string()
    };
    match type_of(j) {
        Some("Set") => format!("Set<{}>", j.get("element").map_or("?".into(), spell)),
        Some("Record") => "a record".into(),
        Some("Entity" | "Extension" | "EntityOrCommon") => name(),
        Some(other) => other.to_string(),
        None => "?".into(),
    }
}

/// The `type` of a schema type in JSON form, without the `__cedar::`
/// prefix that names a built-in type explicitly (extension types appear as
/// `{"type": "ipaddr"}`).
fn type_of(j: &Json) -> Option<&str> {
    j.get("type")
        .and_then(Json::as_str)
        .map(|t| t.strip_prefix("__cedar::").unwrap_or(t))
}

fn attr_type(j: &Json) -> AttrType {
    match type_of(j) {
        Some("String") => AttrType::String,
        Some("Long") => AttrType::Long,
        Some("Boolean" | "Bool") => AttrType::Bool,
        Some("Entity") => AttrType::Entity(
            j.get("name")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        _ => AttrType::Other(spell(j)),
    }
}

/// One declared attribute of an entity type or of the context.
#[derive(Clone, Debug)]
pub struct Declared {
    /// Its type.
    pub ty: AttrType,
    /// Whether the schema requires it (no `?`).
    pub required: bool,
}

/// The schema, as far as the compiler needs it, with every name fully
/// qualified (`Ace::Tenant`).
#[derive(Clone, Debug)]
pub struct SchemaShape {
    /// The namespace of `dispatch` (may be empty).
    pub namespace: String,
    /// The principal type.
    pub principal: String,
    /// The resource type.
    pub resource: String,
    /// The model type, if the schema declares it.
    pub model: Option<String>,
    /// The tenant-group type, if tenants may be in it.
    pub group: Option<String>,
    /// The pool type, if destinations may be in it.
    pub pool: Option<String>,
    /// The context attributes of `dispatch`, by name.
    pub context: BTreeMap<String, Declared>,
    /// Declared attributes per entity type.
    pub entity_attrs: BTreeMap<String, BTreeMap<String, Declared>>,
}

impl SchemaShape {
    /// `ns::name`, or `name` in the empty namespace.
    pub fn qualify(&self, name: &str) -> String {
        qualify(&self.namespace, name)
    }
}

fn qualify(ns: &str, name: &str) -> String {
    if ns.is_empty() || name.contains("::") {
        name.to_string()
    } else {
        format!("{ns}::{name}")
    }
}

fn record(r: &Json) -> Option<BTreeMap<String, Declared>> {
    let m = r.get("attributes")?.as_object()?;
    Some(
        m.iter()
            .map(|(k, v)| {
                let required = v.get("required").and_then(Json::as_bool).unwrap_or(true);
                let ty = attr_type(v);
                (k.clone(), Declared { ty, required })
            })
            .collect(),
    )
}

fn names(j: Option<&Json>, ns: &str) -> Vec<String> {
    j.and_then(Json::as_array)
        .into_iter()
        .flatten()
        .filter_map(Json::as_str)
        .map(|s| qualify(ns, s))
        .collect()
}

/// Reads the shape from the schema's JSON form (types resolved). `text` is
/// the schema's source, for error positions.
pub fn read(j: &Json, file: &Path, text: &str) -> Result<SchemaShape, Diagnostic> {
    let at = |needle: &str, message: String, hint: &str| {
        let offset = text.find(needle).unwrap_or(0);
        Diagnostic::at(file, text, offset, message, hint.to_string())
    };
    let namespaces = j.as_object().into_iter().flatten();
    let with_action: Vec<(&String, &Json)> = namespaces
        .filter(|(_, ns)| ns.get("actions").and_then(|a| a.get(ACTION)).is_some())
        .collect();
    let (namespace, ns) = match with_action.as_slice() {
        [one] => *one,
        [] => {
            return Err(at(
                "",
                format!("the schema declares no action `{ACTION}`"),
                "every request through ACE is the action `dispatch`; declare `action dispatch appliesTo { principal: Tenant, resource: Destination, context: {...} };`",
            ))
        }
        _ => {
            return Err(at(
                ACTION,
                format!("the schema declares action `{ACTION}` in {} namespaces", with_action.len()),
                "declare `dispatch` once, in the namespace that holds `Tenant` and `Destination`",
            ))
        }
    };
    let applies = ns
        .get("actions")
        .and_then(|a| a.get(ACTION))
        .and_then(|a| a.get("appliesTo"))
        .unwrap_or(&Json::Null);
    let principal = qualify(namespace, TENANT_TYPE);
    let resource = qualify(namespace, DESTINATION_TYPE);
    let roles = [
        ("principalTypes", "principals", &principal, "the tenant is the principal of every request: list `Tenant` in `principal: [...]` of `dispatch`"),
        ("resourceTypes", "resources", &resource, "the destination is the resource of every request: list `Destination` in `resource: [...]` of `dispatch`"),
    ];
    for (key, role, want, hint) in roles {
        let listed = names(applies.get(key), namespace);
        if !listed.contains(want) {
            return Err(at(
                ACTION,
                format!(
                    "action `{ACTION}` applies to {role} [{}], not to `{want}`",
                    listed.join(", ")
                ),
                hint,
            ));
        }
    }
    let context = match applies.get("context") {
        None => BTreeMap::new(),
        Some(c) => record(c).ok_or_else(|| {
            at(
                "context",
                format!("the context of `{ACTION}` is not written out as a record"),
                "declare the context inline, `context: { data_class: String, ... }`, not as a common type",
            )
        })?,
    };
    let mut entity_attrs = BTreeMap::new();
    let mut parents: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, e) in ns
        .get("entityTypes")
        .and_then(Json::as_object)
        .into_iter()
        .flatten()
    {
        let full = qualify(namespace, name);
        let attrs = e.get("shape").and_then(record).unwrap_or_default();
        entity_attrs.insert(full.clone(), attrs);
        parents.insert(full, names(e.get("memberOfTypes"), namespace));
    }
    let parent_of = |child: &str, parent: &str| {
        let p = qualify(namespace, parent);
        parents
            .get(child)
            .is_some_and(|ps| ps.contains(&p))
            .then_some(p)
    };
    let model = qualify(namespace, MODEL_TYPE);
    Ok(SchemaShape {
        namespace: namespace.clone(),
        group: parent_of(&principal, GROUP_TYPE),
        pool: parent_of(&resource, POOL_TYPE),
        model: entity_attrs.contains_key(&model).then_some(model),
        principal,
        resource,
        context,
        entity_attrs,
    })
}
