//! Per-request explanations: for every destination, Cedar's decision with
//! the policies that determined it, the tables' answer, and whether a
//! difference is the fail-closed design or a fault.
//!
//! Why the distinction matters: a request with an unknown value (a model
//! not in the catalogue, a missing header) is denied by the tables on
//! purpose even where Cedar, asked about some concrete unseen value, would
//! allow; only a difference on a request whose values are all known, or an
//! allow that Cedar denies, means the tables are wrong.

use crate::oracle::Oracle;
use crate::verify::{all_known, VerifyError};
use ace_core::tables::{Tables, UNKNOWN};
use cedar_policy::Decision;
use std::fmt::Write as _;

/// How the tables' answer relates to Cedar's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Same answer.
    Agree,
    /// Cedar allows, the tables deny, and the request has an unknown value:
    /// denied by design (fail closed).
    FailClosed,
    /// The tables are wrong: recompile, or report a compiler bug.
    Differ,
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
    /// How the two relate.
    pub verdict: Verdict,
}

/// Request attributes the filter computes itself and never reads from a
/// request (`substituted`: model routing served another model of the
/// class; `cached`: the answer comes from the response cache). A request
/// to explain that leaves one out takes `false`, as the filter gives a
/// request served as asked.
pub const COMPUTED: [&str; 2] = ["substituted", "cached"];

/// Value indices for a JSON request object (`{"tenant": "acme", ...}`):
/// strings, integers and booleans are looked up by their text; a missing or
/// unseen value is unknown. Returns the indices and notes about unknowns.
pub fn request_indices(
    oracle: &Oracle,
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
    for (i, a) in oracle.attributes.iter().enumerate() {
        let text = match obj.get(&a.name) {
            None if COMPUTED.contains(&a.name.as_str()) => {
                // What the filter gives a request it serves as asked (not
                // worth a note: no request carries it).
                idx.push(t.value_index(i as u32, "false"));
                continue;
            }
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
    oracle: &Oracle,
    tables: &[u8],
    json: &serde_json::Value,
) -> Result<(Vec<Explained>, Vec<String>), VerifyError> {
    let t = Tables::load(tables).map_err(|e| VerifyError(e.to_string()))?;
    oracle.check_tables(&t)?;
    let (idx, notes) = request_indices(oracle, &t, json)?;
    let known = all_known(oracle, &idx);
    let mut out = vec![0u64; t.words()];
    t.feasible(&idx, &mut out)
        .map_err(|e| VerifyError(e.to_string()))?;
    let (principal, context) = oracle.principal_and_context(&idx, 0)?;
    let mut lines = Vec::new();
    for d in 0..oracle.destinations.len() {
        let response = oracle.authorize(&principal, &context, d)?;
        let mut policies: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|p| p.to_string())
            .collect();
        policies.sort();
        let cedar = response.decision() == Decision::Allow;
        let table = out.get(d / 64).is_some_and(|w| w >> (d % 64) & 1 == 1);
        let verdict = match (cedar == table, known, table) {
            (true, ..) => Verdict::Agree,
            (false, false, false) => Verdict::FailClosed,
            _ => Verdict::Differ,
        };
        lines.push(Explained {
            destination: t.destination_name(d).unwrap_or("?").to_string(),
            cluster: t.destination_cluster(d).unwrap_or("?").to_string(),
            cedar,
            policies,
            errors: response
                .diagnostics()
                .errors()
                .map(|e| e.to_string())
                .collect(),
            table,
            verdict,
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
        let flag = match l.verdict {
            Verdict::Agree => "",
            Verdict::FailClosed => "   (denied by design: an unknown value fails closed)",
            Verdict::Differ => "   <- tables differ from Cedar",
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
