//! A policy directory loaded and checked: the Cedar schema, the policies
//! (validated by Cedar's own validator, each with the request attributes it
//! reads), the fleet manifest turned into Cedar entities, and the finite
//! domain of every request attribute.
//!
//! Why the reads are computed from the policy's JSON form: it is Cedar's
//! own parse, so `context.x`, `context["x"]` and `context has x` are all the
//! same node, and a use of `context` as a whole (which could read anything)
//! is visible and treated as reading every attribute.

use crate::entities::uid;
use crate::error::{from_cedar, Diagnostic, Error};
use crate::manifest::{self, LoadedManifest};
use cedar_policy::{
    Authorizer, Context, Decision, Effect, Entities, EntityUid, Policy, PolicyId, PolicySet,
    Request, RestrictedExpression, Schema, ValidationMode, Validator,
};
use serde_json::Value as Json;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The name of the principal attribute in the tables.
pub const TENANT: &str = "tenant";

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

pub use crate::domain::{AttrValue, UNKNOWN_MARKER};
pub use crate::schema::AttrType;

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
    /// Cedar validator warnings that do not stop the compile.
    pub warnings: Vec<Diagnostic>,
    principal_type: String,
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

/// The policies of one file in file order, each with its id: its `@id`, else
/// the file's stem (`stem#n` when the file holds several).
pub fn policy_names<'a>(set: &'a PolicySet, stem: &str) -> Vec<(&'a Policy, PolicyId)> {
    let mut ps: Vec<&Policy> = set.policies().collect();
    // Cedar numbers policies `policy0`, `policy1`, ... in file order.
    ps.sort_by_key(|p| {
        p.id()
            .to_string()
            .trim_start_matches("policy")
            .parse::<usize>()
            .unwrap_or(usize::MAX)
    });
    let count = ps.len();
    ps.into_iter()
        .enumerate()
        .map(|(n, p)| {
            let id = match p.annotation("id") {
                Some(id) => id.to_string(),
                None if count == 1 => stem.to_string(),
                None => format!("{stem}#{}", n + 1),
            };
            (p, PolicyId::new(id))
        })
        .collect()
}

impl Project {
    /// Loads and checks everything in `sources`, reporting every problem
    /// found with its file, line and column.
    pub fn load(sources: Sources) -> Result<Project, Error> {
        let mut diags = Vec::new();
        let mut warnings = Vec::new();
        let (schema_path, schema_text) = &sources.schema;
        let schema_hint = "see `policies/ace.cedarschema` for the expected shape";
        crate::limits::check(schema_path, schema_text)?;
        let schema = match Schema::from_cedarschema_str(schema_text) {
            Ok((s, schema_warnings)) => {
                for w in schema_warnings {
                    warnings.push(from_cedar(
                        schema_path,
                        schema_text,
                        &w,
                        "Cedar's schema parser warns about this declaration",
                    ));
                }
                s
            }
            Err(e) => {
                return Err(from_cedar(schema_path, schema_text, &e, schema_hint).into());
            }
        };
        let json = cedar_policy::schema_str_to_json_with_resolved_types(schema_text)
            .map(|(j, _)| j)
            .map_err(|e| from_cedar(schema_path, schema_text, &e, schema_hint))?;
        let shape = crate::schema::read(&json, schema_path, schema_text)?;
        diags.extend(crate::entities::check_declared(
            &shape,
            (schema_path, schema_text),
        ));
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
            if let Err(d) = crate::limits::check(path, text) {
                diags.push(d);
                continue;
            }
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
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("policy");
            let mut cursor = 0;
            for (p, id) in policy_names(&set, stem) {
                let src = p.to_cedar().unwrap_or_default();
                let offset = text
                    .get(cursor..)
                    .and_then(|t| t.find(src.as_str()))
                    .map_or(cursor, |i| cursor + i);
                cursor = offset + src.len().min(1);
                let name = id.to_string();
                parsed.push((p.new_id(id), path.clone(), offset, name));
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
            for w in result.validation_warnings() {
                let allowed = renamed
                    .policy(w.policy_id())
                    .and_then(|p| p.annotation(crate::warnings::ALLOW_IMPOSSIBLE))
                    .is_some();
                match crate::warnings::classify(w, allowed) {
                    crate::warnings::Severity::Error => {
                        bad = true;
                        diags.push(crate::warnings::impossible(path, text, w));
                    }
                    crate::warnings::Severity::Warning => {
                        warnings.push(from_cedar(
                            path,
                            text,
                            w,
                            "Cedar's validator warns about this policy",
                        ));
                    }
                }
            }
            if bad {
                parsed.truncate(first_of_file);
            }
        }

        // Attributes: the principal, then the context's, with domains.
        let mut attributes = Vec::new();
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
            for (name, declared) in &shape.context {
                let ty = &declared.ty;
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
                let (values, unknown) =
                    crate::domain::domain_of(m, name, ty, shape.model.as_deref(), &mut diags);
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
                    found if manifest.is_some() => {
                        let at = find_read(text, offset, n).unwrap_or(offset);
                        let ty = found.and_then(|&i| attributes.get(i)).map(|a| &a.ty);
                        let (why, hint) = crate::domain::no_domain(n, ty, shape.model.as_deref());
                        diags.push(Diagnostic::at(
                            &path,
                            text,
                            at,
                            format!("policy `{id}` reads request attribute `{n}`, {why}"),
                            hint,
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
        diags.extend(crate::entities::check_parents(&manifest, &shape));
        if attributes.len() > ace_core::tables::MAX_ATTRIBUTES as usize {
            let offset = schema_text.find("context").unwrap_or(0);
            diags.push(Diagnostic::at(
                schema_path,
                schema_text,
                offset,
                format!(
                    "{} request attributes (the tenant and {} context attributes); the tables hold at most {}",
                    attributes.len(),
                    attributes.len() - 1,
                    ace_core::tables::MAX_ATTRIBUTES
                ),
                "this is a limit of the table format (`ace_core::tables::MAX_ATTRIBUTES`); drop context attributes no policy needs".into(),
            ));
        }
        if !diags.is_empty() {
            return Err(Error { diagnostics: diags });
        }
        let (entities, destinations) = match crate::entities::build(&manifest, &shape, &schema) {
            Ok(x) => x,
            Err(e) => {
                diags.extend(e.diagnostics);
                return Err(Error { diagnostics: diags });
            }
        };
        if !diags.is_empty() {
            return Err(Error { diagnostics: diags });
        }
        let action = uid(&shape.qualify("Action"), crate::schema::ACTION)
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
            warnings,
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
