//! Cedar's answer for a request, built from the policy directory's text
//! without the compiler: the reference that [`crate::verify`] holds the
//! tables to.
//!
//! Why a second path: a verify that builds its entities and requests with
//! the compiler's code agrees with every mistake the compiler makes (a wrong
//! action, a dropped group), so it proves nothing. This module shares no
//! entity-building, schema-reading or domain code with the compiler. It
//! finds the action, principal and resource types through Cedar's own
//! `Schema` queries, writes the manifest out as Cedar's entity JSON (every
//! field of a tenant, model and destination, groups and pools as parents),
//! lets Cedar type the context from the schema, and parses the policy files
//! itself. Only the policy naming (`@id`, else the file name) and the
//! documented names (`dispatch`, `Tenant`, ...) are shared.

use crate::error::VerifyError;
use crate::project::{policy_names, Sources, TENANT};
use crate::schema::{ACTION, DESTINATION_TYPE, GROUP_TYPE, MODEL_TYPE, POOL_TYPE, TENANT_TYPE};
use ace_core::tables::Tables;
use cedar_policy::{
    Authorizer, Context, Decision, Entities, EntityId, EntityTypeName, EntityUid, PolicySet,
    Request, Response, Schema,
};
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeSet;
use std::str::FromStr;

/// One request attribute as the oracle sees it.
#[derive(Clone, Debug)]
pub struct OracleAttribute {
    /// Table name (`tenant`, or the context attribute).
    pub name: String,
    /// Known values: the key the filter looks up and the Cedar value as
    /// entity or context JSON, sorted by key. Empty without a domain.
    pub values: Vec<(String, Json)>,
    /// Values outside the domain that stand for "unknown" (for a Bool, both
    /// values); for an attribute without a domain, the one value used.
    pub unknown: Vec<Json>,
    /// Whether the attribute has a domain (possibly empty); without one, no
    /// policy may read it and the tables never know its value.
    pub domain: bool,
}

/// The policy directory as Cedar sees it.
#[derive(Debug)]
pub struct Oracle {
    schema: Schema,
    policies: PolicySet,
    entities: Entities,
    action: EntityUid,
    tenant: EntityTypeName,
    /// Destination names and uids, in manifest order.
    pub destinations: Vec<(String, EntityUid)>,
    /// The tenant, then the context attributes by name.
    pub attributes: Vec<OracleAttribute>,
}

fn fail(what: impl std::fmt::Display) -> VerifyError {
    VerifyError(format!(
        "verify could not read the policy directory: {what}; run `ace policy compile` for the details"
    ))
}

fn type_name(ns: &str, name: &str) -> Result<EntityTypeName, VerifyError> {
    let full = if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}::{name}")
    };
    EntityTypeName::from_str(&full).map_err(fail)
}

fn entity_ref(ty: &EntityTypeName, id: &str) -> Json {
    json!({"__entity": {"type": ty.to_string(), "id": id}})
}

/// TOML as Cedar's entity JSON (records for tables, sets for arrays).
fn to_json(v: &toml::Value) -> Json {
    match v {
        toml::Value::String(s) => Json::String(s.clone()),
        toml::Value::Integer(i) => json!(i),
        toml::Value::Boolean(b) => json!(b),
        toml::Value::Array(a) => Json::Array(a.iter().map(to_json).collect()),
        toml::Value::Table(t) => {
            Json::Object(t.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
        other => Json::String(other.to_string()),
    }
}

fn list<'a>(t: &'a toml::Table, key: &str) -> impl Iterator<Item = &'a toml::Value> {
    t.get(key)
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
}

fn text<'a>(t: &'a toml::Table, key: &str) -> Result<&'a str, VerifyError> {
    t.get(key)
        .and_then(toml::Value::as_str)
        .ok_or_else(|| fail(format!("an entry without `{key}`")))
}

/// The parents listed under `key` of `entry`, as entities of type `ty`;
/// their ids are added to `seen`.
fn parents_of(
    entry: &toml::Table,
    key: &str,
    ty: &EntityTypeName,
    seen: &mut BTreeSet<String>,
) -> Vec<Json> {
    list(entry, key)
        .filter_map(toml::Value::as_str)
        .map(|id| {
            seen.insert(id.to_string());
            json!({"type": ty.to_string(), "id": id})
        })
        .collect()
}

/// The entity JSON of one manifest entry: every field but `skip` as an
/// attribute, `defaults` for fields it leaves out, `parents` as parents.
fn entity(
    ty: &EntityTypeName,
    id: &str,
    entry: &toml::Table,
    skip: &[&str],
    defaults: &[(&str, Json)],
    parents: Vec<Json>,
) -> Json {
    let mut attrs: Map<String, Json> = entry
        .iter()
        .filter(|(k, _)| !skip.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), to_json(v)))
        .collect();
    for (k, v) in defaults {
        attrs.entry((*k).to_string()).or_insert_with(|| v.clone());
    }
    json!({"uid": {"type": ty.to_string(), "id": id}, "attrs": attrs, "parents": parents})
}

/// The kind of a schema type in Cedar's resolved JSON form: `String`,
/// `Long`, `Boolean`, `Set`, `Record`, `Entity`, or an extension type by
/// name (`ipaddr`, with or without `__cedar::`).
fn kind_of(ty: &Json) -> Option<&str> {
    let t = ty.get("type").and_then(Json::as_str)?;
    Some(t.strip_prefix("__cedar::").unwrap_or(t))
}

/// A value of schema type `ty` (JSON schema form), for context attributes
/// that no policy may read: only its type matters.
fn placeholder(ty: &Json) -> Json {
    match kind_of(ty) {
        Some("Long") => json!(0),
        Some("Boolean" | "Bool") => json!(false),
        Some("Set") => json!([]),
        Some("Record") => Json::Object(
            ty.get("attributes")
                .and_then(Json::as_object)
                .into_iter()
                .flatten()
                .filter(|(_, a)| a.get("required").and_then(Json::as_bool) != Some(false))
                .map(|(k, a)| (k.clone(), placeholder(a)))
                .collect(),
        ),
        Some("Entity") => {
            json!({"__entity": {"type": ty.get("name").cloned().unwrap_or_default(), "id": ""}})
        }
        Some(ext @ ("ipaddr" | "decimal" | "datetime" | "duration")) => {
            let (f, arg) = match ext {
                "decimal" => ("decimal", "0.0"),
                "ipaddr" => ("ip", "0.0.0.0"),
                "datetime" => ("datetime", "1970-01-01"),
                _ => ("duration", "0ms"),
            };
            json!({"__extn": {"fn": f, "arg": arg}})
        }
        _ => json!(""),
    }
}

/// A key not in `keys` (which is sorted): the largest with `~` appended.
fn outside(keys: &[String]) -> String {
    keys.last()
        .map_or_else(|| "~".to_string(), |k| format!("{k}~"))
}

impl Oracle {
    /// Builds the reference from the raw sources.
    pub fn load(sources: &Sources) -> Result<Oracle, VerifyError> {
        let (_, schema_text) = &sources.schema;
        let (schema, _) = Schema::from_cedarschema_str(schema_text).map_err(fail)?;
        let actions: Vec<&EntityUid> = schema
            .actions()
            .filter(|a| a.id().unescaped() == ACTION)
            .collect();
        let action = match actions.as_slice() {
            [one] => (*one).clone(),
            _ => {
                return Err(fail(format!(
                    "the schema does not declare action `{ACTION}` exactly once"
                )))
            }
        };
        let ns = action.type_name().namespace();
        let tenant = type_name(&ns, TENANT_TYPE)?;
        let destination = type_name(&ns, DESTINATION_TYPE)?;
        let model = type_name(&ns, MODEL_TYPE)?;
        let group = type_name(&ns, GROUP_TYPE)?;
        let pool = type_name(&ns, POOL_TYPE)?;
        let principal_ok = schema
            .principals_for_action(&action)
            .is_some_and(|mut ts| ts.any(|t| *t == tenant));
        let resource_ok = schema
            .resources_for_action(&action)
            .is_some_and(|mut ts| ts.any(|t| *t == destination));
        if !principal_ok || !resource_ok {
            return Err(fail(format!(
                "`{ACTION}` does not apply to `{tenant}` and `{destination}`"
            )));
        }

        let manifest: toml::Table = toml::from_str(&sources.manifest.1).map_err(fail)?;
        let tables = |key: &str| -> Vec<toml::Table> {
            list(&manifest, key)
                .filter_map(toml::Value::as_table)
                .cloned()
                .collect()
        };
        let (tenants, models, dests) =
            (tables("tenants"), tables("models"), tables("destinations"));
        let mut json_entities = Vec::new();
        let mut groups = BTreeSet::new();
        let mut pools = BTreeSet::new();
        let mut tenant_ids = Vec::new();
        for t in &tenants {
            let id = text(t, "id")?;
            tenant_ids.push(id.to_string());
            let parents = parents_of(t, "groups", &group, &mut groups);
            json_entities.push(entity(&tenant, id, t, &["id", "groups"], &[], parents));
        }
        let mut model_ids = Vec::new();
        for m in &models {
            let id = text(m, "id")?;
            model_ids.push(id.to_string());
            let defaults = [("tp_degree", json!(1)), ("accelerators", json!([]))];
            json_entities.push(entity(&model, id, m, &["id"], &defaults, Vec::new()));
        }
        let mut destinations = Vec::new();
        for d in &dests {
            let name = text(d, "name")?;
            let served: Vec<Json> = list(d, "models")
                .filter_map(toml::Value::as_str)
                .map(|m| entity_ref(&model, m))
                .collect();
            let parents = parents_of(d, "pools", &pool, &mut pools);
            let defaults = [
                ("models", Json::Array(served)),
                ("certifications", json!([])),
            ];
            // Custom attributes are attributes like any other.
            let mut flat = d.clone();
            if let Some(toml::Value::Table(custom)) = flat.remove("attributes") {
                flat.extend(custom);
            }
            let skip = ["name", "pools", "cost", "models"];
            json_entities.push(entity(&destination, name, &flat, &skip, &defaults, parents));
            let uid = EntityUid::from_type_name_and_id(destination.clone(), EntityId::new(name));
            destinations.push((name.to_string(), uid));
        }
        for (ty, ids) in [(&group, &groups), (&pool, &pools)] {
            for id in ids {
                json_entities.push(
                    json!({"uid": {"type": ty.to_string(), "id": id}, "attrs": {}, "parents": []}),
                );
            }
        }
        let actions = schema.action_entities().map_err(fail)?;
        let entities = Entities::from_json_value(Json::Array(json_entities), None)
            .map_err(fail)?
            .add_entities(actions.iter().cloned(), None)
            .map_err(fail)?;

        let mut policies = PolicySet::new();
        for (path, text) in &sources.policies {
            let set = PolicySet::from_str(text).map_err(fail)?;
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy");
            for (p, id) in policy_names(&set, stem) {
                policies.add(p.new_id(id)).map_err(fail)?;
            }
        }

        let mut attributes = vec![known(
            TENANT,
            tenant_ids
                .iter()
                .map(|t| (t.clone(), entity_ref(&tenant, t))),
        )];
        let (resolved, _) =
            cedar_policy::schema_str_to_json_with_resolved_types(schema_text).map_err(fail)?;
        let context = resolved
            .get(&ns)
            .and_then(|n| n.get("actions"))
            .and_then(|a| a.get(ACTION))
            .and_then(|a| a.get("appliesTo"))
            .and_then(|a| a.get("context"))
            .and_then(|c| c.get("attributes"))
            .and_then(Json::as_object)
            .cloned()
            .unwrap_or_default();
        let request = manifest.get("request").and_then(toml::Value::as_table);
        for (name, ty) in &context {
            let listed: Vec<&toml::Value> = request
                .and_then(|r| r.get(name))
                .and_then(toml::Value::as_table)
                .map(|d| list(d, "values").collect())
                .unwrap_or_default();
            let kind = kind_of(ty);
            let is_model = kind == Some("Entity")
                && ty.get("name").and_then(Json::as_str) == Some(&model.to_string());
            let attribute = match kind {
                Some("String" | "Long") if !listed.is_empty() => known(
                    name,
                    listed.iter().map(|v| match v {
                        toml::Value::String(s) => (s.clone(), json!(s)),
                        other => (other.to_string(), to_json(other)),
                    }),
                ),
                Some("Boolean" | "Bool") => OracleAttribute {
                    name: name.clone(),
                    values: vec![("false".into(), json!(false)), ("true".into(), json!(true))],
                    unknown: vec![json!(false), json!(true)],
                    domain: true,
                },
                _ if is_model => known(
                    name,
                    model_ids.iter().map(|m| (m.clone(), entity_ref(&model, m))),
                ),
                Some("Entity") if !listed.is_empty() => {
                    let ty = type_name(
                        "",
                        ty.get("name").and_then(Json::as_str).unwrap_or_default(),
                    )?;
                    known(
                        name,
                        strings(&listed).map(|s| (s.clone(), entity_ref(&ty, &s))),
                    )
                }
                Some(ext @ ("ipaddr" | "decimal" | "datetime" | "duration"))
                    if !listed.is_empty() =>
                {
                    extension(name, ext, strings(&listed))
                }
                _ => OracleAttribute {
                    name: name.clone(),
                    values: Vec::new(),
                    unknown: vec![placeholder(ty)],
                    domain: false,
                },
            };
            attributes.push(attribute);
        }
        Ok(Oracle {
            schema,
            policies,
            entities,
            action,
            tenant,
            destinations,
            attributes,
        })
    }

    /// Errors unless `t` has this directory's attributes, values and
    /// destinations, in the same order.
    pub fn check_tables(&self, t: &Tables<'_>) -> Result<(), VerifyError> {
        let stale = |what: String| {
            VerifyError(format!(
                "the tables do not match the policy directory: {what}; recompile with `ace policy compile`"
            ))
        };
        if t.attribute_count() != self.attributes.len() {
            return Err(stale(format!(
                "{} attributes in the tables, {} in the sources",
                t.attribute_count(),
                self.attributes.len()
            )));
        }
        for (i, a) in self.attributes.iter().enumerate() {
            let i = i as u32;
            if t.attribute_name(i) != Some(a.name.as_str())
                || t.value_count(i) as usize != a.values.len()
            {
                return Err(stale(format!("attribute `{}` differs", a.name)));
            }
            for (j, (key, _)) in a.values.iter().enumerate() {
                if t.value_name(i, j as u32 + 1) != Some(key.as_str()) {
                    return Err(stale(format!("value `{key}` of `{}` differs", a.name)));
                }
            }
        }
        if t.destination_count() != self.destinations.len() {
            return Err(stale("destination count differs".into()));
        }
        for (d, (name, _)) in self.destinations.iter().enumerate() {
            if t.destination_name(d) != Some(name.as_str()) {
                return Err(stale(format!("destination {d} (`{name}`) differs")));
            }
        }
        Ok(())
    }

    /// The attribute values for value indices `idx` (`0` = unknown; `pick`
    /// chooses among the unknown stand-ins).
    fn value(&self, a: usize, i: u32, pick: usize) -> Json {
        let Some(attr) = self.attributes.get(a) else {
            return Json::Null;
        };
        match (i as usize).checked_sub(1).and_then(|k| attr.values.get(k)) {
            Some((_, v)) => v.clone(),
            None => attr
                .unknown
                .get(pick % attr.unknown.len().max(1))
                .cloned()
                .unwrap_or(Json::Null),
        }
    }

    /// The principal and context of the request with indices `idx`.
    pub fn principal_and_context(
        &self,
        idx: &[u32],
        pick: usize,
    ) -> Result<(EntityUid, Context), VerifyError> {
        let principal = match self.value(0, idx.first().copied().unwrap_or(0), pick) {
            Json::Object(o) => o
                .get("__entity")
                .and_then(|e| e.get("id"))
                .and_then(Json::as_str)
                .map(str::to_string)
                .unwrap_or_default(),
            _ => String::new(),
        };
        let principal =
            EntityUid::from_type_name_and_id(self.tenant.clone(), EntityId::new(principal));
        let mut context = Map::new();
        for (a, attr) in self.attributes.iter().enumerate().skip(1) {
            let i = idx.get(a).copied().unwrap_or(0);
            context.insert(attr.name.clone(), self.value(a, i, pick));
        }
        let context =
            Context::from_json_value(Json::Object(context), Some((&self.schema, &self.action)))
                .map_err(|e| {
                    VerifyError(format!("verify could not build the request context: {e}"))
                })?;
        Ok((principal, context))
    }

    /// Cedar's response for `principal` and `context` at destination `d`.
    pub fn authorize(
        &self,
        principal: &EntityUid,
        context: &Context,
        d: usize,
    ) -> Result<Response, VerifyError> {
        let resource = self
            .destinations
            .get(d)
            .map(|(_, u)| u.clone())
            .ok_or_else(|| VerifyError(format!("no destination {d}")))?;
        let request = Request::new(
            principal.clone(),
            self.action.clone(),
            resource,
            context.clone(),
            None,
        )
        .map_err(|e| VerifyError(e.to_string()))?;
        Ok(Authorizer::new().is_authorized(&request, &self.policies, &self.entities))
    }

    /// Whether Cedar allows at destination `d`.
    pub fn allows(
        &self,
        principal: &EntityUid,
        context: &Context,
        d: usize,
    ) -> Result<bool, VerifyError> {
        Ok(self.authorize(principal, context, d)?.decision() == Decision::Allow)
    }

    /// How many stand-ins an unknown value in `idx` has (the requests to
    /// ask Cedar for one unknown request).
    pub fn picks(&self, idx: &[u32]) -> usize {
        self.attributes
            .iter()
            .zip(idx)
            .filter(|(a, &i)| i == 0 && a.domain)
            .map(|(a, _)| a.unknown.len())
            .max()
            .unwrap_or(1)
    }

    /// The request with indices `idx`, spelled out (`tenant=acme ...`).
    pub fn describe(&self, idx: &[u32]) -> String {
        self.attributes
            .iter()
            .zip(idx)
            .map(|(a, &i)| {
                let v = (i as usize)
                    .checked_sub(1)
                    .and_then(|k| a.values.get(k))
                    .map_or("<unknown>", |(k, _)| k.as_str());
                format!("{}={v}", a.name)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The strings among `values`.
fn strings<'a>(values: &'a [&toml::Value]) -> impl Iterator<Item = String> + 'a {
    values.iter().filter_map(|v| v.as_str()).map(str::to_string)
}

/// An attribute of extension type `ext` (`ipaddr`, `decimal`, `datetime`,
/// `duration`) with the given values, and one outside them for "unknown".
fn extension(name: &str, ext: &str, values: impl Iterator<Item = String>) -> OracleAttribute {
    let (f, outside) = match ext {
        "ipaddr" => ("ip", ["10.255.255.254", "192.0.2.1", "::2"]),
        "decimal" => ("decimal", ["-9999.9999", "9999.9999", "0.1234"]),
        "datetime" => ("datetime", ["2000-01-01", "2100-01-01", "1999-12-31"]),
        _ => ("duration", ["1d", "7h", "3ms"]),
    };
    let call = |s: &str| json!({"__extn": {"fn": f, "arg": s}});
    let mut attribute = known(name, values.map(|s| (s.clone(), call(&s))));
    let free = outside
        .iter()
        .find(|o| attribute.values.iter().all(|(k, _)| k != *o))
        .unwrap_or(&outside[0]);
    attribute.unknown = vec![call(free)];
    attribute
}

/// An attribute with the given (key, value) domain, sorted and deduplicated,
/// and a key outside it as the unknown stand-in.
fn known(name: &str, values: impl Iterator<Item = (String, Json)>) -> OracleAttribute {
    let mut values: Vec<(String, Json)> = values.collect();
    values.sort_by(|a, b| a.0.cmp(&b.0));
    values.dedup_by(|a, b| a.0 == b.0);
    let keys: Vec<String> = values.iter().map(|(k, _)| k.clone()).collect();
    let out = outside(&keys);
    let unknown = match values.first().map(|(_, v)| v) {
        Some(Json::Object(o)) => {
            let ty = o
                .get("__entity")
                .and_then(|e| e.get("type"))
                .cloned()
                .unwrap_or_default();
            json!({"__entity": {"type": ty, "id": out}})
        }
        Some(Json::Number(_)) => {
            let ints: Vec<i64> = values.iter().filter_map(|(_, v)| v.as_i64()).collect();
            let max = ints.iter().max().copied().unwrap_or(0);
            let min = ints.iter().min().copied().unwrap_or(0);
            json!(max.checked_add(1).unwrap_or(min.saturating_sub(1)))
        }
        _ => json!(out),
    };
    OracleAttribute {
        name: name.to_string(),
        values,
        unknown: vec![unknown],
        domain: true,
    }
}
