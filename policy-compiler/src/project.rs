//! A policy directory loaded and checked: the Cedar schema, the policies
//! (validated by Cedar's own validator, each with the request attributes it
//! reads), the fleet manifest turned into Cedar entities, and the finite
//! domain of every request attribute.
//!
//! Why the reads are computed from the policy's JSON form: it is Cedar's
//! own parse, so `context.x`, `context["x"]` and `context has x` are all the
//! same node, and a use of `context` as a whole (which could read anything)
//! is visible and treated as reading every attribute.

use crate::error::{from_cedar, Diagnostic, Error};
use crate::manifest::{self, LoadedManifest};
use cedar_policy::{
    Authorizer, Context, Decision, Effect, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    Policy, PolicyId, PolicySet, Request, RestrictedExpression, Schema, ValidationMode, Validator,
};
use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The name of the principal attribute in the tables.
pub const TENANT: &str = "tenant";
/// The marker used for "a value not known at compile time" when asking
/// Cedar about it (verify, explain): no manifest value can start with NUL.
pub const UNKNOWN_MARKER: &str = "\u{0}unknown";

/// The text inputs of a compile: one schema, any number of policy files, one
/// manifest. Paths are used only in error messages.
#[derive(Clone, Debug)]
pub struct Sources {
    /// The Cedar schema file and its text.
    pub schema: (PathBuf, String),
    /// Policy files and their texts, in a stable order.
    pub policies: Vec<(PathBuf, String)>,
    /// The fleet manifest and its text.
    pub manifest: (PathBuf, String),
}

impl Sources {
    /// Reads a policy directory: exactly one `*.cedarschema`, every
    /// `*.cedar` (sorted by name), and `fleet.toml`.
    pub fn read_dir(dir: &Path) -> Result<Sources, Error> {
        let entries = std::fs::read_dir(dir).map_err(|e| {
            Diagnostic::file(
                dir,
                format!("cannot read the policy directory: {e}"),
                "pass a directory holding `*.cedarschema`, `*.cedar` and `fleet.toml`".into(),
            )
        })?;
        let mut schemas = Vec::new();
        let mut policies = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("cedarschema") => schemas.push(path),
                Some("cedar") => policies.push(path),
                _ => {}
            }
        }
        schemas.sort();
        policies.sort();
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| {
                Error::one(Diagnostic::file(
                    p,
                    format!("cannot read: {e}"),
                    "check the file's permissions".into(),
                ))
            })
        };
        let schema = match schemas.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(Diagnostic::file(
                    dir,
                    "no Cedar schema (`*.cedarschema`) in the policy directory".into(),
                    "add the schema, e.g. `policies/ace.cedarschema`".into(),
                )
                .into())
            }
            _ => {
                return Err(Diagnostic::file(
                    dir,
                    format!("{} Cedar schemas in the policy directory", schemas.len()),
                    "keep exactly one `*.cedarschema` file".into(),
                )
                .into())
            }
        };
        if policies.is_empty() {
            return Err(Diagnostic::file(
                dir,
                "no policies (`*.cedar`) in the policy directory".into(),
                "add at least one permit policy; with none, Cedar denies everything".into(),
            )
            .into());
        }
        let manifest = dir.join("fleet.toml");
        Ok(Sources {
            schema: (schema.clone(), read(&schema)?),
            policies: policies
                .iter()
                .map(|p| Ok((p.clone(), read(p)?)))
                .collect::<Result<_, Error>>()?,
            manifest: (manifest.clone(), read(&manifest)?),
        })
    }
}

/// A Cedar type a request attribute can have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrType {
    /// `String`.
    String,
    /// `Long`.
    Long,
    /// `Bool`.
    Bool,
    /// An entity of the named type.
    Entity(String),
    /// Anything else (sets, records, extensions): no finite domain.
    Other(Json),
}

/// One value in an attribute's domain.
#[derive(Clone, Debug)]
pub struct AttrValue {
    /// The string the filter looks up (`value_index`): the string itself, the
    /// decimal integer, `true`/`false`, or the entity id.
    pub key: String,
    /// The Cedar value.
    pub expr: RestrictedExpression,
}

/// One request attribute: the principal (`tenant`) or a context attribute.
#[derive(Clone, Debug)]
pub struct Attribute {
    /// Table name.
    pub name: String,
    /// Whether it is the principal.
    pub principal: bool,
    /// Its Cedar type.
    pub ty: AttrType,
    /// Known values sorted by key; value index `i + 1` is `values[i]`.
    /// `None` when the attribute has no finite domain.
    pub values: Option<Vec<AttrValue>>,
    /// What Cedar is asked for an unknown value (a value outside the domain).
    pub unknown: RestrictedExpression,
}

impl Attribute {
    /// Number of known values (0 without a domain).
    pub fn len(&self) -> usize {
        self.values.as_ref().map_or(0, Vec::len)
    }

    /// Whether the domain is empty or missing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One policy, where it came from and what it reads.
#[derive(Clone, Debug)]
pub struct PolicyInfo {
    /// Its id in the combined set (`@id` annotation or `file#n`).
    pub id: String,
    /// Its file.
    pub file: PathBuf,
    /// Byte offset in the file.
    pub offset: usize,
    /// Permit or forbid.
    pub effect: Effect,
    /// Indices into [`Project::attributes`] of the attributes it reads.
    pub reads: BTreeSet<usize>,
}

/// A loaded, validated policy directory.
#[derive(Debug)]
pub struct Project {
    /// The inputs.
    pub sources: Sources,
    /// The Cedar schema.
    pub schema: Schema,
    /// All policies, renamed to their ids.
    pub policies: PolicySet,
    /// Per policy, in file order.
    pub info: Vec<PolicyInfo>,
    /// The manifest.
    pub manifest: LoadedManifest,
    /// Tenants, destinations, models, groups, pools and the action.
    pub entities: Entities,
    /// Request attributes: the principal first, then context attributes by
    /// name.
    pub attributes: Vec<Attribute>,
    /// Destination uids in table order.
    pub destinations: Vec<EntityUid>,
    /// The dispatch action.
    pub action: EntityUid,
    principal_type: String,
}

fn uid(ty: &str, id: &str) -> Result<EntityUid, String> {
    let t = EntityTypeName::from_str(ty).map_err(|e| format!("bad entity type `{ty}`: {e}"))?;
    Ok(EntityUid::from_type_name_and_id(t, EntityId::new(id)))
}

/// The parts of the schema the compiler needs.
struct SchemaShape {
    namespace: String,
    action: String,
    principal: String,
    resource: String,
    context: BTreeMap<String, (AttrType, bool)>,
    entity_attrs: HashMap<String, BTreeMap<String, bool>>,
    parents: HashMap<String, String>,
}

fn attr_type(j: &Json) -> AttrType {
    match j.get("type").and_then(Json::as_str) {
        Some("String") => AttrType::String,
        Some("Long") => AttrType::Long,
        Some("Boolean" | "Bool") => AttrType::Bool,
        Some("Entity") => AttrType::Entity(
            j.get("name")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_string(),
        ),
        _ => AttrType::Other(j.clone()),
    }
}

fn shape_of(j: &Json) -> Option<SchemaShape> {
    let (namespace, ns) = j.as_object()?.iter().next()?;
    let (action, a) = ns.get("actions")?.as_object()?.iter().next()?;
    let applies = a.get("appliesTo")?;
    let first = |k: &str| {
        applies
            .get(k)?
            .as_array()?
            .first()?
            .as_str()
            .map(str::to_string)
    };
    let record = |r: &Json| -> BTreeMap<String, (AttrType, bool)> {
        r.get("attributes")
            .and_then(Json::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let required = v.get("required").and_then(Json::as_bool).unwrap_or(true);
                        (k.clone(), (attr_type(v), required))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut entity_attrs = HashMap::new();
    let mut parents = HashMap::new();
    for (name, e) in ns
        .get("entityTypes")
        .and_then(Json::as_object)
        .into_iter()
        .flatten()
    {
        let full = format!("{namespace}::{name}");
        let attrs = e
            .get("shape")
            .map(|s| record(s).into_iter().map(|(k, (_, r))| (k, r)).collect())
            .unwrap_or_default();
        entity_attrs.insert(full.clone(), attrs);
        if let Some(p) = e
            .get("memberOfTypes")
            .and_then(Json::as_array)
            .and_then(|a| a.first())
            .and_then(Json::as_str)
        {
            let p = if p.contains("::") {
                p.to_string()
            } else {
                format!("{namespace}::{p}")
            };
            parents.insert(full, p);
        }
    }
    Some(SchemaShape {
        namespace: namespace.clone(),
        action: action.clone(),
        principal: first("principalTypes")?,
        resource: first("resourceTypes")?,
        context: applies.get("context").map(record).unwrap_or_default(),
        entity_attrs,
        parents,
    })
}

/// The context attributes read by a policy's JSON form, or `None` when it
/// uses `context` as a whole; and whether it uses the principal.
fn reads_of(j: &Json, attrs: &mut BTreeSet<String>, whole: &mut bool, principal: &mut bool) {
    match j {
        Json::Object(m) => {
            for op in [".", "has"] {
                if let Some(inner) = m.get(op) {
                    if inner.get("left") == Some(&serde_json::json!({"Var": "context"})) {
                        if let Some(a) = inner.get("attr").and_then(Json::as_str) {
                            attrs.insert(a.to_string());
                            return;
                        }
                    }
                }
            }
            if m.get("Var").and_then(Json::as_str) == Some("context") {
                *whole = true;
            }
            if m.get("Var").and_then(Json::as_str) == Some("principal") {
                *principal = true;
            }
            for v in m.values() {
                reads_of(v, attrs, whole, principal);
            }
        }
        Json::Array(a) => {
            for v in a {
                reads_of(v, attrs, whole, principal);
            }
        }
        _ => {}
    }
}

/// Byte offset of the first mention of context attribute `attr` in
/// `text[from..]`, for error positions.
fn find_read(text: &str, from: usize, attr: &str) -> Option<usize> {
    let rest = text.get(from..)?;
    [
        format!("context.{attr}"),
        format!("context[\"{attr}\"]"),
        format!("context has {attr}"),
    ]
    .iter()
    .filter_map(|p| rest.find(p.as_str()))
    .min()
    .map(|i| from + i)
}

impl Project {
    /// Loads and checks everything in `sources`, reporting every problem
    /// found with its file, line and column.
    pub fn load(sources: Sources) -> Result<Project, Error> {
        let mut diags = Vec::new();
        let (schema_path, schema_text) = &sources.schema;
        let schema_hint = "see `policies/ace.cedarschema` for the expected shape";
        let schema = match Schema::from_cedarschema_str(schema_text) {
            Ok((s, _warnings)) => s,
            Err(e) => {
                return Err(from_cedar(schema_path, schema_text, &e, schema_hint).into());
            }
        };
        let shape = cedar_policy::schema_str_to_json_with_resolved_types(schema_text)
            .ok()
            .and_then(|(j, _)| shape_of(&j))
            .ok_or_else(|| {
                Error::one(Diagnostic::file(
                    schema_path,
                    "the schema needs one namespace with one action that names one principal \
                     type and one resource type"
                        .into(),
                    schema_hint.into(),
                ))
            })?;
        let manifest = match manifest::parse(&sources.manifest.0, sources.manifest.1.clone()) {
            Ok(m) => Some(m),
            Err(e) => {
                diags.extend(e.diagnostics);
                None
            }
        };

        // Policies: parse and validate per file, so that spans map to files.
        let validator = Validator::new(schema.clone());
        let mut policies = PolicySet::new();
        let mut parsed: Vec<(Policy, PathBuf, usize, String)> = Vec::new();
        for (path, text) in &sources.policies {
            let set = match PolicySet::from_str(text) {
                Ok(s) => s,
                Err(e) => {
                    for pe in e.iter() {
                        diags.push(from_cedar(
                            path,
                            text,
                            pe,
                            "check the policy syntax against the Cedar reference",
                        ));
                    }
                    continue;
                }
            };
            if set.templates().next().is_some() {
                diags.push(Diagnostic::file(
                    path,
                    "policy templates are not supported".into(),
                    "write linked policies out in full".into(),
                ));
                continue;
            }
            let first_of_file = parsed.len();
            let mut ps: Vec<&Policy> = set.policies().collect();
            // Cedar numbers policies `policy0`, `policy1`, ... in file order.
            ps.sort_by_key(|p| {
                p.id()
                    .to_string()
                    .trim_start_matches("policy")
                    .parse::<usize>()
                    .unwrap_or(usize::MAX)
            });
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy")
                .to_string();
            let count = ps.len();
            let mut cursor = 0;
            for (n, p) in ps.into_iter().enumerate() {
                let src = p.to_cedar().unwrap_or_default();
                let offset = text
                    .get(cursor..)
                    .and_then(|t| t.find(src.as_str()))
                    .map_or(cursor, |i| cursor + i);
                cursor = offset + src.len().min(1);
                let id = match p.annotation("id") {
                    Some(id) => id.to_string(),
                    None if count == 1 => stem.clone(),
                    None => format!("{stem}#{}", n + 1),
                };
                parsed.push((
                    p.new_id(PolicyId::new(id.clone())),
                    path.clone(),
                    offset,
                    id,
                ));
            }
            // Validate under our ids, so that messages name `eu_residency`
            // rather than Cedar's `policy0`.
            let mut renamed = PolicySet::new();
            for (p, ..) in parsed.iter().skip(first_of_file) {
                let _ = renamed.add(p.clone());
            }
            let result = validator.validate(&renamed, ValidationMode::Strict);
            let mut bad = false;
            for e in result.validation_errors() {
                bad = true;
                diags.push(from_cedar(
                    path,
                    text,
                    e,
                    "the policy does not match the schema; compare with `ace.cedarschema`",
                ));
            }
            if bad {
                parsed.truncate(first_of_file);
            }
        }

        // Attributes: the principal, then the context's, with domains.
        let mut attributes = Vec::new();
        let ns = &shape.namespace;
        let model_type = format!("{ns}::Model");
        if let Some(m) = &manifest {
            let mut tenants: Vec<AttrValue> = Vec::new();
            for t in &m.manifest.tenants {
                let id = t.get_ref().id.get_ref();
                match uid(&shape.principal, id) {
                    Ok(u) => tenants.push(AttrValue {
                        key: id.clone(),
                        expr: RestrictedExpression::new_entity_uid(u),
                    }),
                    Err(e) => diags.push(m.diag(t.span(), e, "")),
                }
            }
            tenants.sort_by(|a, b| a.key.cmp(&b.key));
            attributes.push(Attribute {
                name: TENANT.into(),
                principal: true,
                ty: AttrType::Entity(shape.principal.clone()),
                values: Some(tenants),
                unknown: RestrictedExpression::new_entity_uid(
                    uid(&shape.principal, UNKNOWN_MARKER)
                        .map_err(|e| Diagnostic::file(schema_path, e, "".into()))?,
                ),
            });
            for (name, (ty, _required)) in &shape.context {
                if name == TENANT {
                    diags.push(Diagnostic::file(
                        schema_path,
                        format!(
                            "context attribute `{TENANT}` clashes with the principal's table name"
                        ),
                        "rename the context attribute".into(),
                    ));
                    continue;
                }
                let (values, unknown) = domain_of(m, name, ty, &model_type, &mut diags);
                attributes.push(Attribute {
                    name: name.clone(),
                    principal: false,
                    ty: ty.clone(),
                    values,
                    unknown,
                });
            }
            if let Some(extra) = m
                .manifest
                .request
                .keys()
                .find(|k| !shape.context.contains_key(*k))
            {
                diags.push(m.diag(
                    m.manifest.request.get(extra).map_or(0..0, |d| d.span()),
                    format!("request attribute `{extra}` is not in the schema's context"),
                    "declare it in the `context` of the action in the schema, or remove it",
                ));
            }
        }

        // Reads per policy, and the "no finite domain" check.
        let index: HashMap<&str, usize> = attributes
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name.as_str(), i))
            .collect();
        let mut info = Vec::new();
        for (policy, path, offset, id) in parsed {
            let text = sources
                .policies
                .iter()
                .find(|(p, _)| *p == path)
                .map_or("", |(_, t)| t.as_str());
            let json = policy.to_json().unwrap_or(Json::Null);
            let (mut names, mut whole, mut principal) = (BTreeSet::new(), false, false);
            reads_of(&json, &mut names, &mut whole, &mut principal);
            if json
                .get("principal")
                .and_then(|p| p.get("op"))
                .and_then(Json::as_str)
                != Some("All")
            {
                principal = true;
            }
            if whole {
                names.extend(shape.context.keys().cloned());
            }
            let mut reads = BTreeSet::new();
            if principal {
                reads.insert(0);
            }
            for n in &names {
                match index.get(n.as_str()) {
                    Some(&i) if attributes.get(i).is_some_and(|a| a.values.is_some()) => {
                        reads.insert(i);
                    }
                    _ if manifest.is_some() => {
                        let at = find_read(text, offset, n).unwrap_or(offset);
                        diags.push(Diagnostic::at(
                            &path,
                            text,
                            at,
                            format!("policy `{id}` reads request attribute `{n}`, which has no finite domain"),
                            format!("list its values under `[request.{n}]` in the fleet manifest, or stop reading it"),
                        ));
                    }
                    _ => {}
                }
            }
            if let Err(e) = policies.add(policy.clone()) {
                diags.push(Diagnostic::at(
                    &path,
                    text,
                    offset,
                    e.to_string(),
                    "give each policy a unique `@id`".into(),
                ));
            }
            info.push(PolicyInfo {
                id,
                file: path,
                offset,
                effect: policy.effect(),
                reads,
            });
        }

        let Some(manifest) = manifest else {
            return Err(Error { diagnostics: diags });
        };
        let (entities, destinations) = match build_entities(&manifest, &shape, &schema) {
            Ok(x) => x,
            Err(e) => {
                diags.extend(e.diagnostics);
                return Err(Error { diagnostics: diags });
            }
        };
        if !diags.is_empty() {
            return Err(Error { diagnostics: diags });
        }
        let action = uid(&format!("{ns}::Action"), &shape.action)
            .map_err(|e| Diagnostic::file(schema_path, e, "".into()))?;
        Ok(Project {
            sources,
            schema,
            policies,
            info,
            manifest,
            entities,
            attributes,
            destinations,
            action,
            principal_type: shape.principal,
        })
    }

    /// The Cedar request for value indices `idx` (one per attribute, `0` =
    /// unknown) at destination `d`.
    pub fn request(&self, idx: &[u32], d: usize) -> Result<Request, String> {
        let context = self.context(idx)?;
        self.request_with(idx, d, context)
    }

    /// The context part of [`Project::request`].
    pub fn context(&self, idx: &[u32]) -> Result<Context, String> {
        let mut pairs = Vec::new();
        for (a, &i) in self.attributes.iter().zip(idx) {
            if a.principal {
                continue;
            }
            pairs.push((a.name.clone(), self.value(a, i)));
        }
        Context::from_pairs(pairs).map_err(|e| e.to_string())
    }

    /// [`Project::request`] with a prebuilt context.
    pub fn request_with(&self, idx: &[u32], d: usize, context: Context) -> Result<Request, String> {
        let principal = match (self.attributes.first(), idx.first()) {
            (Some(a), Some(&i)) if a.principal => {
                let key = a
                    .values
                    .as_ref()
                    .and_then(|v| v.get((i as usize).wrapping_sub(1)))
                    .map_or(UNKNOWN_MARKER, |v| v.key.as_str());
                uid(&self.principal_type, key)?
            }
            _ => uid(&self.principal_type, UNKNOWN_MARKER)?,
        };
        let resource = self
            .destinations
            .get(d)
            .cloned()
            .ok_or_else(|| format!("no destination {d}"))?;
        Request::new(principal, self.action.clone(), resource, context, None)
            .map_err(|e| e.to_string())
    }

    fn value(&self, a: &Attribute, i: u32) -> RestrictedExpression {
        a.values
            .as_ref()
            .and_then(|v| v.get((i as usize).wrapping_sub(1)))
            .map_or_else(|| a.unknown.clone(), |v| v.expr.clone())
    }

    /// Cedar's answer for the full policy set.
    pub fn authorize(&self, request: &Request) -> cedar_policy::Response {
        Authorizer::new().is_authorized(request, &self.policies, &self.entities)
    }

    /// Whether Cedar allows `request`.
    pub fn allows(&self, request: &Request) -> bool {
        self.authorize(request).decision() == Decision::Allow
    }

    /// Where policy `id` starts, for messages.
    pub fn locate(&self, id: &str) -> Option<(&Path, usize, usize)> {
        let p = self.info.iter().find(|p| p.id == id)?;
        let text = self
            .sources
            .policies
            .iter()
            .find(|(f, _)| *f == p.file)
            .map_or("", |(_, t)| t.as_str());
        let (l, c) = crate::error::line_col(text, p.offset);
        Some((&p.file, l, c))
    }

    /// The request with indices `idx`, spelled out (`tenant=acme ...`).
    pub fn describe(&self, idx: &[u32]) -> String {
        self.attributes
            .iter()
            .zip(idx)
            .map(|(a, &i)| {
                let v = a
                    .values
                    .as_ref()
                    .and_then(|v| v.get((i as usize).wrapping_sub(1)))
                    .map_or("<unknown>", |v| v.key.as_str());
                format!("{}={}", a.name, v)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The domain of context attribute `name` of type `ty`, and the value Cedar
/// is asked about for an unknown one.
fn domain_of(
    m: &LoadedManifest,
    name: &str,
    ty: &AttrType,
    model_type: &str,
    diags: &mut Vec<Diagnostic>,
) -> (Option<Vec<AttrValue>>, RestrictedExpression) {
    let declared = m.manifest.request.get(name);
    let hint = "give the values the attribute's Cedar type: strings for String, integers for Long";
    let mut values = Vec::new();
    let unknown;
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
        AttrType::Entity(t) if t == model_type => {
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

/// Builds the Cedar entities: tenants and their groups, models,
/// destinations and their pools. Destination attributes the schema does not
/// declare are left out, so a trimmed schema still works.
fn build_entities(
    m: &LoadedManifest,
    shape: &SchemaShape,
    schema: &Schema,
) -> Result<(Entities, Vec<EntityUid>), Error> {
    let ns = &shape.namespace;
    let err = |e: String| Error::one(Diagnostic::file(&m.path, e, "".into()));
    let model_type = format!("{ns}::Model");
    let mut all = Vec::new();
    let mut groups = BTreeSet::new();
    let mut pools = BTreeSet::new();
    let keep = |ty: &str,
                attrs: HashMap<String, RestrictedExpression>|
     -> HashMap<String, RestrictedExpression> {
        match shape.entity_attrs.get(ty) {
            Some(declared) => attrs
                .into_iter()
                .filter(|(k, _)| declared.contains_key(k))
                .collect(),
            None => HashMap::new(),
        }
    };
    let s = |v: &str| RestrictedExpression::new_string(v.to_string());
    let group_type = shape.parents.get(&shape.principal).cloned();
    for t in &m.manifest.tenants {
        let t = t.get_ref();
        let mut attrs = HashMap::new();
        if let Some(j) = &t.home_jurisdiction {
            attrs.insert("home_jurisdiction".to_string(), s(j));
        }
        let mut parents = HashSet::new();
        if let Some(gt) = &group_type {
            for g in &t.groups {
                let u = uid(gt, g).map_err(err)?;
                groups.insert(u.clone());
                parents.insert(u);
            }
        }
        let e = Entity::new(
            uid(&shape.principal, t.id.get_ref()).map_err(err)?,
            keep(&shape.principal, attrs),
            parents,
        )
        .map_err(|e| err(e.to_string()))?;
        all.push(e);
    }
    if shape.entity_attrs.contains_key(&model_type) {
        for mo in &m.manifest.models {
            let mo = mo.get_ref();
            let mut attrs = HashMap::new();
            attrs.insert(
                "vram_gb".to_string(),
                RestrictedExpression::new_long(*mo.vram_gb.get_ref()),
            );
            attrs.insert(
                "tp_degree".to_string(),
                RestrictedExpression::new_long(*mo.tp_degree.get_ref()),
            );
            attrs.insert(
                "accelerators".to_string(),
                RestrictedExpression::new_set(mo.accelerators.iter().map(|a| s(a))),
            );
            let e = Entity::new(
                uid(&model_type, mo.id.get_ref()).map_err(err)?,
                keep(&model_type, attrs),
                HashSet::new(),
            )
            .map_err(|e| err(e.to_string()))?;
            all.push(e);
        }
    }
    let pool_type = shape.parents.get(&shape.resource).cloned();
    let mut destinations = Vec::new();
    for d in &m.manifest.destinations {
        let d = d.get_ref();
        let mut attrs = HashMap::new();
        attrs.insert("provider".to_string(), s(&d.provider));
        attrs.insert("tier".to_string(), s(d.tier.get_ref()));
        attrs.insert("jurisdiction".to_string(), s(&d.jurisdiction));
        attrs.insert("region".to_string(), s(&d.region));
        attrs.insert("accelerator".to_string(), s(&d.accelerator));
        attrs.insert(
            "vram_gb".to_string(),
            RestrictedExpression::new_long(*d.vram_gb.get_ref()),
        );
        attrs.insert("interconnect".to_string(), s(d.interconnect.get_ref()));
        let mut model_uids = Vec::new();
        for mo in &d.models {
            model_uids.push(RestrictedExpression::new_entity_uid(
                uid(&model_type, mo.get_ref()).map_err(err)?,
            ));
        }
        attrs.insert(
            "models".to_string(),
            RestrictedExpression::new_set(model_uids),
        );
        attrs.insert(
            "certifications".to_string(),
            RestrictedExpression::new_set(d.certifications.iter().map(|c| s(c))),
        );
        if let Some(o) = &d.owner_team {
            attrs.insert("owner_team".to_string(), s(o));
        }
        let mut parents = HashSet::new();
        if let Some(pt) = &pool_type {
            for p in &d.pools {
                let u = uid(pt, p).map_err(err)?;
                pools.insert(u.clone());
                parents.insert(u);
            }
        }
        let u = uid(&shape.resource, d.name.get_ref()).map_err(err)?;
        destinations.push(u.clone());
        all.push(
            Entity::new(u, keep(&shape.resource, attrs), parents)
                .map_err(|e| err(e.to_string()))?,
        );
    }
    for g in groups.into_iter().chain(pools) {
        all.push(Entity::with_uid(g));
    }
    let entities = Entities::from_entities(all, Some(schema)).map_err(|e| {
        Error::one(Diagnostic::file(
            &m.path,
            format!("the manifest does not fit the schema: {e}"),
            "every attribute the schema requires of a tenant, model or destination must be in the manifest".into(),
        ))
    })?;
    Ok((entities, destinations))
}
