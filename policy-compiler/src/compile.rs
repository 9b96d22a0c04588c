//! Factorisation and evaluation: the policy set becomes permit and forbid
//! factors, each keyed only by the request attributes its policies read,
//! and every row of every factor is decided by Cedar's own authorizer.
//!
//! Why this is exact: a policy's outcome depends only on the attributes it
//! reads (plus the destination, which is the column). Grouping permits by
//! their read set and OR-ing the groups gives "some permit is satisfied";
//! the same for forbids. Cedar allows exactly when some permit and no
//! forbid is satisfied, which is `(OR permits) AND NOT (OR forbids)`. A
//! policy that errors is "not satisfied" in Cedar; we refuse to compile it
//! instead, since an error at run time would be a silent change of meaning.
//!
//! Why the unknown rows are what they are: a permit factor keyed by a value
//! nobody listed grants nothing, and a forbid factor keyed by one forbids
//! everything, so the table for an unknown value is never more permissive
//! than Cedar would be for any concrete unseen value (fail closed).

use crate::error::{Diagnostic, Error};
use crate::project::Project;
use ace_core::tables::{encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec};
use cedar_policy::{Authorizer, Decision, Effect, Policy, PolicyId, PolicySet};
use std::collections::BTreeMap;

/// What one factor holds, for reports and the dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FactorInfo {
    /// Permit or forbid.
    pub kind: FactorKind,
    /// Attribute names it is keyed by.
    pub attributes: Vec<String>,
    /// Ids of its policies.
    pub policies: Vec<String>,
    /// Rows (including unknown values).
    pub rows: usize,
}

/// The compiled tables.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The encoded tables (the `.acet` file).
    pub bytes: Vec<u8>,
    /// What was encoded.
    pub spec: TableSpec,
    /// One entry per factor, in table order.
    pub factors: Vec<FactorInfo>,
    /// Cedar evaluations performed.
    pub evaluations: u64,
    /// Problems that do not stop the compile (Cedar validator warnings, a
    /// policy set that allows nothing).
    pub warnings: Vec<Diagnostic>,
}

/// Mixed-radix decode of `row` over `radices` (most significant first).
pub(crate) fn decode(mut row: usize, radices: &[usize], out: &mut [u32]) {
    for (o, &r) in out.iter_mut().zip(radices).rev() {
        *o = (row % r) as u32;
        row /= r;
    }
}

/// Compiles `project` into tables.
pub fn compile(project: &Project) -> Result<Compiled, Error> {
    let d = project.destinations.len();
    let words = d.div_ceil(64);
    let mut groups: BTreeMap<(bool, Vec<usize>), Vec<usize>> = BTreeMap::new();
    for (i, p) in project.info.iter().enumerate() {
        let forbid = p.effect == Effect::Forbid;
        groups
            .entry((forbid, p.reads.iter().copied().collect()))
            .or_default()
            .push(i);
    }
    let policies: BTreeMap<String, &Policy> = project
        .policies
        .policies()
        .map(|p| (p.id().to_string(), p))
        .collect();
    let authorizer = Authorizer::new();
    // All ones over the real destinations (padding bits stay 0).
    let mut all = vec![u64::MAX; words];
    if !d.is_multiple_of(64) {
        if let Some(last) = all.last_mut() {
            *last = (1u64 << (d % 64)) - 1;
        }
    }
    // Values used for attributes a factor does not read: any known value.
    let defaults: Vec<u32> = project
        .attributes
        .iter()
        .map(|a| u32::from(!a.is_empty()))
        .collect();
    let mut factors = Vec::new();
    let mut infos = Vec::new();
    let mut evaluations = 0u64;
    for ((forbid, keys), members) in groups {
        let mut set = PolicySet::new();
        let mut ids = Vec::new();
        for &m in &members {
            let Some(info) = project.info.get(m) else {
                continue;
            };
            ids.push(info.id.clone());
            if let Some(p) = policies.get(&info.id) {
                set.add((*p).clone()).map_err(|e| internal(e.to_string()))?;
            }
        }
        if forbid {
            // With a permit-everything beside them, Deny means "some forbid
            // in this factor is satisfied".
            let permit_all = Policy::parse(
                Some(PolicyId::new("ace-permit-all")),
                "permit(principal, action, resource);",
            )
            .map_err(|e| internal(e.to_string()))?;
            set.add(permit_all).map_err(|e| internal(e.to_string()))?;
        }
        let radices: Vec<usize> = keys
            .iter()
            .map(|&k| project.attributes.get(k).map_or(1, |a| a.len() + 1))
            .collect();
        // In u64, saturating: `usize` is 32 bits in the browser playground,
        // where a product of large domains would wrap to a small number.
        let rows = radices
            .iter()
            .fold(1u64, |p, &r| p.saturating_mul(r as u64));
        if rows > ace_core::tables::MAX_FACTOR_ROWS {
            return Err(too_many_rows(project, &ids, rows));
        }
        let rows = rows as usize;
        let mut bits = vec![0u64; rows * words];
        let mut key_idx = vec![0u32; keys.len()];
        let mut idx = defaults.clone();
        for (row, chunk) in bits.chunks_exact_mut(words.max(1)).enumerate() {
            decode(row, &radices, &mut key_idx);
            if key_idx.contains(&0) {
                if forbid {
                    chunk.copy_from_slice(&all);
                }
                continue;
            }
            for (&k, &v) in keys.iter().zip(&key_idx) {
                if let Some(slot) = idx.get_mut(k) {
                    *slot = v;
                }
            }
            let context = project.context(&idx).map_err(internal)?;
            for dest in 0..d {
                let request = project
                    .request_with(&idx, dest, context.clone())
                    .map_err(internal)?;
                let response = authorizer.is_authorized(&request, &set, &project.entities);
                evaluations += 1;
                if let Some(e) = response.diagnostics().errors().next() {
                    return Err(eval_error(project, &idx, dest, e));
                }
                let hit = match response.decision() {
                    Decision::Allow => !forbid,
                    Decision::Deny => forbid,
                };
                if hit {
                    if let Some(w) = chunk.get_mut(dest / 64) {
                        *w |= 1 << (dest % 64);
                    }
                }
            }
        }
        infos.push(FactorInfo {
            kind: if forbid {
                FactorKind::Forbid
            } else {
                FactorKind::Permit
            },
            attributes: keys
                .iter()
                .filter_map(|&k| project.attributes.get(k).map(|a| a.name.clone()))
                .collect(),
            policies: ids,
            rows,
        });
        factors.push(FactorSpec {
            kind: if forbid {
                FactorKind::Forbid
            } else {
                FactorKind::Permit
            },
            attributes: keys.iter().map(|&k| k as u32).collect(),
            rows: bits,
        });
    }
    let spec = TableSpec {
        destinations: project
            .manifest
            .manifest
            .destinations
            .iter()
            .map(|d| DestinationSpec {
                name: d.get_ref().name.get_ref().clone(),
                cluster: d.get_ref().cluster.get_ref().clone(),
            })
            .collect(),
        attributes: project
            .attributes
            .iter()
            .map(|a| AttributeSpec {
                name: a.name.clone(),
                values: a.values.iter().flatten().map(|v| v.key.clone()).collect(),
            })
            .collect(),
        factors,
    };
    let bytes = encode(&spec).map_err(|e| internal(e.to_string()))?;
    let mut warnings = project.warnings.clone();
    let grants = spec
        .factors
        .iter()
        .any(|f| f.kind == FactorKind::Permit && f.rows.iter().any(|&w| w != 0));
    if !grants {
        warnings.push(allows_nothing(project));
    }
    Ok(Compiled {
        bytes,
        spec,
        factors: infos,
        evaluations,
        warnings,
    })
}

fn internal(msg: String) -> Error {
    Error::one(Diagnostic::file(
        std::path::Path::new("<compiler>"),
        format!("internal error: {msg}"),
        "this is a bug in ace-policy; please report it with the policy directory".into(),
    ))
}

fn allows_nothing(project: &Project) -> Diagnostic {
    let permits = project
        .info
        .iter()
        .filter(|p| p.effect == Effect::Permit)
        .count();
    let dir = project
        .sources
        .manifest
        .0
        .parent()
        .map_or_else(std::path::PathBuf::new, std::path::Path::to_path_buf);
    Diagnostic::file(
        &dir,
        format!("the policies allow no request to any destination ({permits} permit policies, none satisfied by any known request)"),
        "every request will be answered 503; add a permit (e.g. `permit (principal, action, resource) when { resource.models.contains(context.model) };`) or check the permits' conditions".into(),
    )
}

fn too_many_rows(project: &Project, ids: &[String], rows: u64) -> Error {
    let (file, line, column) = ids
        .first()
        .and_then(|id| project.locate(id))
        .map_or((std::path::PathBuf::new(), 0, 0), |(f, l, c)| {
            (f.to_path_buf(), l, c)
        });
    Error::one(Diagnostic {
        file,
        line,
        column,
        message: format!("policies {} together read attributes with {rows} value combinations", ids.join(", ")),
        hint: "split the policy so that each part reads fewer request attributes, or shrink their domains".into(),
    })
}

fn eval_error(
    project: &Project,
    idx: &[u32],
    dest: usize,
    e: &cedar_policy::AuthorizationError,
) -> Error {
    let id = match e {
        cedar_policy::AuthorizationError::PolicyEvaluationError(p) => p.policy_id().to_string(),
    };
    let (file, line, column) = project
        .locate(&id)
        .map_or((std::path::PathBuf::new(), 0, 0), |(f, l, c)| {
            (f.to_path_buf(), l, c)
        });
    let dest_name = project
        .destinations
        .get(dest)
        .map_or_else(String::new, |u| u.id().escaped().to_string());
    Error::one(Diagnostic {
        file,
        line,
        column,
        message: format!(
            "policy `{id}` failed to evaluate for request `{}` at destination `{dest_name}`: {e}",
            project.describe(idx)
        ),
        hint:
            "guard optional attributes with `has`, and check the manifest values the policy reads"
                .into(),
    })
}
