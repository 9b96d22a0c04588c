//! Proof that the tables say what Cedar says, and per-request explanations.
//!
//! Why verify reads the compiled file rather than the in-memory result: the
//! claim worth proving is about the bytes the filter will load, through the
//! same `ace_core::tables` reader the filter uses.
//!
//! Requests whose values are all known must match Cedar exactly. Requests
//! with an unknown value are asked of Cedar with a value outside the domain
//! (see [`crate::project::UNKNOWN_MARKER`]); there the tables must be no more
//! permissive than Cedar (fail closed), and anything they allow that Cedar
//! denies is a mismatch.

use crate::project::Project;
use ace_core::tables::{Tables, UNKNOWN};
use cedar_policy::Decision;
use std::fmt::Write as _;

/// Exhaustive checking is used up to this many requests (unknowns
/// included); above it, random sampling plus boundary values.
pub const EXHAUSTIVE_LIMIT: u64 = 1_000_000;
/// Random requests checked when the space is too large to enumerate.
pub const SAMPLES: u64 = 100_000;

/// One disagreement between the tables and Cedar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The request, spelled out.
    pub request: String,
    /// The destination name.
    pub destination: String,
    /// Cedar's answer.
    pub cedar: bool,
    /// The tables' answer.
    pub table: bool,
}

/// The outcome of [`verify`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Size of the request space, unknown values included.
    pub space: u64,
    /// Whether every request was checked.
    pub exhaustive: bool,
    /// Requests checked.
    pub requests: u64,
    /// Of which all values known (checked for equality).
    pub known: u64,
    /// (request, destination) pairs checked.
    pub decisions: u64,
    /// Mismatches found (all of them are counted; `mismatches` keeps the
    /// first [`Report::KEEP`]).
    pub mismatch_count: u64,
    /// The first mismatches.
    pub mismatches: Vec<Mismatch>,
}

impl Report {
    /// Mismatches kept for printing.
    pub const KEEP: usize = 1000;
}

/// Why verification could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError(pub String);

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for VerifyError {}

/// Maps the project's attribute indices to the tables'; errors if the
/// tables were compiled from different attributes or destinations.
fn check_shape(project: &Project, t: &Tables<'_>) -> Result<(), VerifyError> {
    let stale = |what: String| {
        VerifyError(format!(
            "the tables do not match the policy directory: {what}; recompile with `ace policy compile`"
        ))
    };
    if t.attribute_count() != project.attributes.len() {
        return Err(stale(format!(
            "{} attributes in the tables, {} in the sources",
            t.attribute_count(),
            project.attributes.len()
        )));
    }
    for (i, a) in project.attributes.iter().enumerate() {
        let i = i as u32;
        if t.attribute_name(i) != Some(a.name.as_str()) || t.value_count(i) as usize != a.len() {
            return Err(stale(format!("attribute `{}` differs", a.name)));
        }
        for (j, v) in a.values.iter().flatten().enumerate() {
            if t.value_name(i, j as u32 + 1) != Some(v.key.as_str()) {
                return Err(stale(format!("value `{}` of `{}` differs", v.key, a.name)));
            }
        }
    }
    if t.destination_count() != project.destinations.len() {
        return Err(stale("destination count differs".into()));
    }
    for (d, u) in project.destinations.iter().enumerate() {
        if t.destination_name(d) != Some(u.id().escaped().as_ref()) {
            return Err(stale(format!("destination {d} differs")));
        }
    }
    Ok(())
}

/// A small deterministic generator (splitmix64), so runs are repeatable.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Checks `tables` against Cedar on `project`'s request space:
/// exhaustively up to [`EXHAUSTIVE_LIMIT`] requests, else [`SAMPLES`]
/// random ones plus every value of every attribute.
pub fn verify(project: &Project, tables: &[u8]) -> Result<Report, VerifyError> {
    let radices: Vec<u64> = project
        .attributes
        .iter()
        .map(|a| a.len() as u64 + 1)
        .collect();
    let space = radices
        .iter()
        .try_fold(1u64, |acc, &r| acc.checked_mul(r))
        .unwrap_or(u64::MAX);
    let exhaustive = space <= EXHAUSTIVE_LIMIT;
    let decode = |mut n: u64| {
        let mut idx = vec![0u32; radices.len()];
        for (o, &rad) in idx.iter_mut().zip(&radices).rev() {
            *o = (n % rad) as u32;
            n /= rad;
        }
        idx
    };
    let mut report = if exhaustive {
        verify_requests(project, tables, (0..space).map(decode))?
    } else {
        // Boundary values: each attribute through all its values (unknown
        // included) with the others at their first and at their last value.
        let mut boundary = Vec::new();
        for (a, &rad) in radices.iter().enumerate() {
            for base in [1u64, u64::MAX] {
                for v in 0..rad {
                    let idx: Vec<u32> = radices
                        .iter()
                        .enumerate()
                        .map(|(b, &r)| if b == a { v } else { base.min(r - 1) } as u32)
                        .collect();
                    boundary.push(idx);
                }
            }
        }
        let mut rng = Rng(0x00ac_e5ee_d000_0001);
        let random = (0..SAMPLES).map(move |_| {
            radices
                .iter()
                .map(|&r| rng.below(r) as u32)
                .collect::<Vec<u32>>()
        });
        verify_requests(project, tables, boundary.into_iter().chain(random))?
    };
    report.space = space;
    report.exhaustive = exhaustive;
    Ok(report)
}

/// Checks `tables` against Cedar on the given requests (value-index
/// vectors, one entry per attribute, `0` = unknown).
pub fn verify_requests(
    project: &Project,
    tables: &[u8],
    requests: impl IntoIterator<Item = Vec<u32>>,
) -> Result<Report, VerifyError> {
    let t = Tables::load(tables).map_err(|e| VerifyError(e.to_string()))?;
    check_shape(project, &t)?;
    let mut report = Report::default();
    let mut out = vec![0u64; t.words()];
    for idx in requests {
        check_one(project, &t, &idx, &mut out, &mut report)?;
    }
    Ok(report)
}

fn check_one(
    project: &Project,
    t: &Tables<'_>,
    idx: &[u32],
    out: &mut [u64],
    report: &mut Report,
) -> Result<(), VerifyError> {
    t.feasible(idx, out)
        .map_err(|e| VerifyError(e.to_string()))?;
    let known = !idx.contains(&UNKNOWN);
    report.requests += 1;
    report.known += u64::from(known);
    let context = project.context(idx).map_err(VerifyError)?;
    for d in 0..project.destinations.len() {
        let request = project
            .request_with(idx, d, context.clone())
            .map_err(VerifyError)?;
        let cedar = project.allows(&request);
        let table = out.get(d / 64).is_some_and(|w| w >> (d % 64) & 1 == 1);
        report.decisions += 1;
        let bad = if known {
            cedar != table
        } else {
            table && !cedar
        };
        if bad {
            report.mismatch_count += 1;
            if report.mismatches.len() < Report::KEEP {
                report.mismatches.push(Mismatch {
                    request: project.describe(idx),
                    destination: t.destination_name(d).unwrap_or("?").to_string(),
                    cedar,
                    table,
                });
            }
        }
    }
    Ok(())
}

/// One destination's line in an explanation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    /// Destination name.
    pub destination: String,
    /// Envoy cluster.
    pub cluster: String,
    /// Cedar's decision.
    pub cedar: bool,
    /// The policy ids that determined it (satisfied permits on allow,
    /// satisfied forbids on deny; empty when nothing permitted).
    pub policies: Vec<String>,
    /// Evaluation errors, if any.
    pub errors: Vec<String>,
    /// The tables' answer.
    pub table: bool,
}

/// Value indices for a JSON request object (`{"tenant": "acme", ...}`):
/// strings, integers and booleans are looked up by their text; a missing or
/// unseen value is unknown. Returns the indices and notes about unknowns.
pub fn request_indices(
    project: &Project,
    t: &Tables<'_>,
    json: &serde_json::Value,
) -> Result<(Vec<u32>, Vec<String>), VerifyError> {
    let obj = json.as_object().ok_or_else(|| {
        VerifyError("the request must be a JSON object such as {\"tenant\": \"acme\", \"data_class\": \"phi\"}".into())
    })?;
    let mut notes = Vec::new();
    for k in obj.keys() {
        if t.attribute_index(k).is_none() {
            notes.push(format!(
                "`{k}` is not a request attribute of these tables; ignored"
            ));
        }
    }
    let mut idx = Vec::new();
    for (i, a) in project.attributes.iter().enumerate() {
        let text = match obj.get(&a.name) {
            None => {
                notes.push(format!(
                    "`{}` is missing: treated as unknown (fails closed)",
                    a.name
                ));
                idx.push(UNKNOWN);
                continue;
            }
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v.to_string(),
            Some(other) => {
                return Err(VerifyError(format!(
                    "request attribute `{}` is `{other}`; give a string, integer or boolean",
                    a.name
                )))
            }
        };
        let v = t.value_index(i as u32, &text);
        if v == UNKNOWN {
            notes.push(format!(
                "`{}` = `{text}` is not in its domain: treated as unknown (fails closed)",
                a.name
            ));
        }
        idx.push(v);
    }
    Ok((idx, notes))
}

/// For every destination: Cedar's decision with the determining policy ids,
/// and the tables' answer.
pub fn explain(
    project: &Project,
    tables: &[u8],
    json: &serde_json::Value,
) -> Result<(Vec<Explained>, Vec<String>), VerifyError> {
    let t = Tables::load(tables).map_err(|e| VerifyError(e.to_string()))?;
    check_shape(project, &t)?;
    let (idx, notes) = request_indices(project, &t, json)?;
    let mut out = vec![0u64; t.words()];
    t.feasible(&idx, &mut out)
        .map_err(|e| VerifyError(e.to_string()))?;
    let context = project.context(&idx).map_err(VerifyError)?;
    let mut lines = Vec::new();
    for d in 0..project.destinations.len() {
        let request = project
            .request_with(&idx, d, context.clone())
            .map_err(VerifyError)?;
        let response = project.authorize(&request);
        let mut policies: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|p| p.to_string())
            .collect();
        policies.sort();
        lines.push(Explained {
            destination: t.destination_name(d).unwrap_or("?").to_string(),
            cluster: t.destination_cluster(d).unwrap_or("?").to_string(),
            cedar: response.decision() == Decision::Allow,
            policies,
            errors: response
                .diagnostics()
                .errors()
                .map(|e| e.to_string())
                .collect(),
            table: out.get(d / 64).is_some_and(|w| w >> (d % 64) & 1 == 1),
        });
    }
    Ok((lines, notes))
}

/// A human-readable rendering of an explanation.
pub fn render_explanation(lines: &[Explained], notes: &[String]) -> String {
    let mut s = String::new();
    for n in notes {
        let _ = writeln!(s, "note: {n}");
    }
    let w = lines
        .iter()
        .map(|l| l.destination.len())
        .max()
        .unwrap_or(11)
        .max(11);
    let _ = writeln!(
        s,
        "{:<w$}  {:<5}  {:<5}  determining policies",
        "destination", "cedar", "table"
    );
    for l in lines {
        let yn = |b: bool| if b { "allow" } else { "deny" };
        let why = if l.policies.is_empty() {
            if l.cedar {
                "-".to_string()
            } else {
                "(no permit applies)".to_string()
            }
        } else {
            l.policies.join(", ")
        };
        let flag = if l.cedar == l.table {
            ""
        } else {
            "   <- tables differ from Cedar"
        };
        let _ = writeln!(
            s,
            "{:<w$}  {:<5}  {:<5}  {why}{flag}",
            l.destination,
            yn(l.cedar),
            yn(l.table)
        );
        for e in &l.errors {
            let _ = writeln!(s, "{:<w$}  error: {e}", "");
        }
    }
    s
}
