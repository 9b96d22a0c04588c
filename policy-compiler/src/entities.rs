//! The fleet manifest as Cedar entities, for the compiler: tenants in their
//! groups, models, destinations in their pools.
//!
//! Why it refuses rather than drops: a tenant's groups or a destination's
//! pools that the schema gives no type for, or an attribute the schema
//! declares that the manifest cannot give, would make a policy that names
//! them silently never (or always) apply. Attributes the manifest gives but
//! the schema does not declare are left out: no validated policy can read
//! them, so a trimmed schema changes nothing.

use crate::error::{Diagnostic, Error};
use crate::manifest::LoadedManifest;
use crate::schema::{SchemaShape, GROUP_TYPE, POOL_TYPE};
use cedar_policy::{
    Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression, Schema,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;

/// Attributes the manifest gives a tenant.
pub const TENANT_ATTRS: [&str; 1] = ["home_jurisdiction"];
/// Attributes the manifest gives a model.
pub const MODEL_ATTRS: [&str; 3] = ["vram_gb", "tp_degree", "accelerators"];
/// Attributes the manifest gives a destination.
pub const DESTINATION_ATTRS: [&str; 10] = [
    "provider",
    "tier",
    "jurisdiction",
    "region",
    "accelerator",
    "vram_gb",
    "interconnect",
    "models",
    "certifications",
    "owner_team",
];

/// The entity `id` of type `ty` (a type name as the schema spells it).
pub(crate) fn uid(ty: &str, id: &str) -> Result<EntityUid, String> {
    let t = EntityTypeName::from_str(ty).map_err(|e| format!("bad entity type `{ty}`: {e}"))?;
    Ok(EntityUid::from_type_name_and_id(t, EntityId::new(id)))
}

/// Refuses schema attributes of the tenant, model and destination types
/// that the manifest has no field for; `schema` is the schema file and text.
pub fn check_declared(shape: &SchemaShape, schema: (&Path, &str)) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let kinds = [
        (Some(&shape.principal), "tenant", &TENANT_ATTRS[..]),
        (shape.model.as_ref(), "model", &MODEL_ATTRS[..]),
        (Some(&shape.resource), "destination", &DESTINATION_ATTRS[..]),
    ];
    for (ty, what, given) in kinds {
        let Some(ty) = ty else { continue };
        let short = ty.rsplit("::").next().unwrap_or(ty);
        for (name, declared) in shape.entity_attrs.get(ty).into_iter().flatten() {
            if given.contains(&name.as_str()) {
                continue;
            }
            let custom = *ty == shape.resource;
            if custom && crate::custom::supported(&declared.ty) {
                continue;
            }
            let (file, text) = schema;
            let start = text.find(&format!("entity {short}")).unwrap_or(0);
            let offset = text
                .get(start..)
                .and_then(|t| t.find(name.as_str()))
                .map_or(start, |i| start + i);
            let (message, hint) = if custom {
                (
                    format!("custom destination attribute `{name}` has type `{}`", declared.ty.spelled()),
                    format!("custom destination attributes (`attributes = {{ {name} = ... }}` in the manifest) may be {}", crate::custom::SUPPORTED),
                )
            } else {
                (
                    format!("the schema declares attribute `{name}` of `{ty}`, which the fleet manifest has no field for"),
                    format!("a {what} in the manifest has only {}; remove `{name}` from the schema", given.join(", ")),
                )
            };
            out.push(Diagnostic::at(file, text, offset, message, hint));
        }
    }
    out
}

/// Refuses tenant groups and destination pools that the schema gives no
/// type for (they would be dropped).
pub fn check_parents(m: &LoadedManifest, shape: &SchemaShape) -> Vec<Diagnostic> {
    let man = &m.manifest;
    let tenant = man
        .tenants
        .iter()
        .find(|t| !t.get_ref().groups.is_empty())
        .map(|t| (t.span(), t.get_ref().id.get_ref()));
    let destination = man
        .destinations
        .iter()
        .find(|d| !d.get_ref().pools.is_empty())
        .map(|d| (d.span(), d.get_ref().name.get_ref()));
    let cases = [
        (
            shape.group.is_none(),
            tenant,
            "tenant",
            "groups",
            &shape.principal,
            GROUP_TYPE,
        ),
        (
            shape.pool.is_none(),
            destination,
            "destination",
            "pools",
            &shape.resource,
            POOL_TYPE,
        ),
    ];
    let mut out = Vec::new();
    for (missing, first, what, field, child, parent) in cases {
        let Some((span, id)) = first.filter(|_| missing) else {
            continue;
        };
        let short = child.rsplit("::").next().unwrap_or(child);
        out.push(m.diag(
            span,
            format!("{what} `{id}` is in {field}, but the schema's `{child}` is not `in [{parent}]`"),
            &format!("declare `entity {parent};` and `entity {short} in [{parent}]`, or remove `{field}` from the {what}s"),
        ));
    }
    out
}

/// `ids` as entities of type `ty` (none without a type), also added to
/// `all`.
fn parents_of(
    ty: Option<&str>,
    ids: &[String],
    all: &mut BTreeSet<EntityUid>,
) -> Result<HashSet<EntityUid>, String> {
    let mut out = HashSet::new();
    let Some(ty) = ty else { return Ok(out) };
    for id in ids {
        let u = uid(ty, id)?;
        all.insert(u.clone());
        out.insert(u);
    }
    Ok(out)
}

/// Builds the Cedar entities: tenants and their groups, models,
/// destinations and their pools, and the destination uids in table order.
/// Run [`check_parents`] first: without a group (pool) type, groups (pools)
/// are not built.
pub fn build(
    m: &LoadedManifest,
    shape: &SchemaShape,
    schema: &Schema,
) -> Result<(Entities, Vec<EntityUid>), Error> {
    let err = |e: String| Error::one(Diagnostic::file(&m.path, e, "".into()));
    let model_type = shape
        .model
        .clone()
        .unwrap_or_else(|| shape.qualify(crate::schema::MODEL_TYPE));
    let mut all = Vec::new();
    let mut groups = BTreeSet::new();
    let mut pools = BTreeSet::new();
    let mut custom_errors = Vec::new();
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
    let group_type = shape.group.clone();
    for t in &m.manifest.tenants {
        let t = t.get_ref();
        let mut attrs = HashMap::new();
        if let Some(j) = &t.home_jurisdiction {
            attrs.insert("home_jurisdiction".to_string(), s(j));
        }
        let parents = parents_of(group_type.as_deref(), &t.groups, &mut groups).map_err(err)?;
        let e = Entity::new(
            uid(&shape.principal, t.id.get_ref()).map_err(err)?,
            keep(&shape.principal, attrs),
            parents,
        )
        .map_err(|e| err(e.to_string()))?;
        all.push(e);
    }
    if shape.model.is_some() {
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
    let pool_type = shape.pool.clone();
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
        for (name, v) in &d.attributes {
            let dest = d.name.get_ref();
            match crate::custom::value(m, shape, &DESTINATION_ATTRS, dest, name, v) {
                Ok(e) => {
                    attrs.insert(name.clone(), e);
                }
                Err(e) => custom_errors.push(e),
            }
        }
        let parents = parents_of(pool_type.as_deref(), &d.pools, &mut pools).map_err(err)?;
        let u = uid(&shape.resource, d.name.get_ref()).map_err(err)?;
        destinations.push(u.clone());
        all.push(
            Entity::new(u, keep(&shape.resource, attrs), parents)
                .map_err(|e| err(e.to_string()))?,
        );
    }
    if !custom_errors.is_empty() {
        return Err(Error {
            diagnostics: custom_errors,
        });
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
