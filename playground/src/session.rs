//! The playground's operations on plain Rust types: what the page asks for,
//! answered by `ace-policy` exactly as the `ace` command answers it.
//!
//! Why a layer without wasm-bindgen: the answers (the checksum above all)
//! must equal the command's, and that is easiest to keep true, and to
//! test natively, when the browser binding in [`crate::wasm`] only moves
//! strings and bytes across. Every answer is JSON, shaped for the page.

use ace_core::tables::{FactorKind, Tables};
use ace_policy::explain::{self, Verdict};
use ace_policy::oracle::Oracle;
use ace_policy::verify::{self, VerifyError};
use ace_policy::{Compiled, Diagnostic, Error, Project, Sources};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One editor's contents: a file name (used in messages, and for policies
/// as the policy's name when it has no `@id`) and its text.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct File {
    /// File name, e.g. `eu_residency.cedar`.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// What the page sends: the same three inputs as a policy directory.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Input {
    /// The Cedar schema (`ace.cedarschema`).
    pub schema: File,
    /// The fleet manifest (`fleet.toml`).
    pub manifest: File,
    /// The policy files (`*.cedar`).
    pub policies: Vec<File>,
}

impl Input {
    /// Parses the page's JSON.
    pub fn parse(json: &str) -> Result<Input, String> {
        serde_json::from_str(json).map_err(|e| {
            format!(
                "the playground input is not {{\"schema\": {{\"name\", \"text\"}}, \"manifest\": \
                 {{...}}, \"policies\": [{{...}}]}}: {e}; reload the page"
            )
        })
    }

    /// The compiler's sources, policies in file-name order as
    /// `Sources::read_dir` orders a directory, so that the tables are byte
    /// for byte those `ace policy compile` writes for the same files.
    pub fn sources(&self) -> Sources {
        let mut policies: Vec<(PathBuf, String)> = self
            .policies
            .iter()
            .map(|f| (PathBuf::from(&f.name), f.text.clone()))
            .collect();
        policies.sort_by(|a, b| a.0.cmp(&b.0));
        Sources {
            schema: (PathBuf::from(&self.schema.name), self.schema.text.clone()),
            policies,
            manifest: (
                PathBuf::from(&self.manifest.name),
                self.manifest.text.clone(),
            ),
        }
    }
}

/// A problem in an input, as Cedar and the compiler report it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The file name.
    pub file: String,
    /// 1-based line; 0 for the file as a whole.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// What to change.
    pub hint: String,
    /// The whole diagnostic as the `ace` command prints it.
    pub text: String,
}

impl From<&Diagnostic> for Problem {
    fn from(d: &Diagnostic) -> Self {
        Problem {
            file: d.file.display().to_string(),
            line: d.line,
            column: d.column,
            message: d.message.clone(),
            hint: d.hint.clone(),
            text: d.to_string(),
        }
    }
}

fn problems(e: &Error) -> Vec<Problem> {
    e.diagnostics.iter().map(Problem::from).collect()
}

/// A problem that is not in one file (the page sent something malformed).
fn general(message: String) -> Vec<Problem> {
    vec![Problem {
        file: String::new(),
        line: 0,
        column: 0,
        text: message.clone(),
        message,
        hint: String::new(),
    }]
}

/// One request attribute and its known values, in table order.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AttributeInfo {
    /// `tenant` or a context attribute's name.
    pub name: String,
    /// The values the tables know (anything else is unknown).
    pub values: Vec<String>,
}

/// One destination, in table (bit) order.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DestinationInfo {
    /// Manifest name.
    pub name: String,
    /// Envoy cluster.
    pub cluster: String,
}

/// One factor of the tables, as `ace policy compile` lists it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FactorSummary {
    /// `permit` or `forbid`.
    pub kind: &'static str,
    /// The attributes it is keyed by.
    pub attributes: Vec<String>,
    /// Rows, unknown values included.
    pub rows: usize,
    /// Its policies' ids.
    pub policies: Vec<String>,
}

/// What a successful compile shows.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Summary {
    /// Size of the tables file in bytes.
    pub bytes: usize,
    /// Its SHA-256, as `ace policy compile` prints it.
    pub sha256: String,
    /// Policies compiled.
    pub policies: usize,
    /// Cedar evaluations the compile made.
    pub evaluations: u64,
    /// The destinations.
    pub destinations: Vec<DestinationInfo>,
    /// The request attributes.
    pub attributes: Vec<AttributeInfo>,
    /// The factors.
    pub factors: Vec<FactorSummary>,
    /// Problems that did not stop the compile.
    pub warnings: Vec<Problem>,
    /// The tables as text (`ace policy dump`).
    pub dump: String,
}

/// A compiled input: the project, its tables, and (once asked for) Cedar's
/// reference for explanations.
#[derive(Debug)]
pub struct Session {
    project: Project,
    compiled: Compiled,
    oracle: Option<Oracle>,
}

impl Session {
    /// Loads and compiles `input`, or says what is wrong with it.
    pub fn compile(input: &Input) -> Result<Session, Vec<Problem>> {
        let project = Project::load(input.sources()).map_err(|e| problems(&e))?;
        let compiled = ace_policy::compile(&project).map_err(|e| problems(&e))?;
        Ok(Session {
            project,
            compiled,
            oracle: None,
        })
    }

    /// The compiled tables file (`tables.acet`).
    pub fn tables(&self) -> &[u8] {
        &self.compiled.bytes
    }

    /// What the compile produced.
    pub fn summary(&self) -> Result<Summary, Vec<Problem>> {
        let bytes = &self.compiled.bytes;
        let t = Tables::load(bytes)
            .map_err(|e| general(format!("the compiled tables do not load: {e}")))?;
        let attributes = (0..t.attribute_count() as u32)
            .map(|a| AttributeInfo {
                name: t.attribute_name(a).unwrap_or("?").to_string(),
                values: (1..=t.value_count(a))
                    .map(|v| t.value_name(a, v).unwrap_or("?").to_string())
                    .collect(),
            })
            .collect();
        let destinations = (0..t.destination_count())
            .map(|d| DestinationInfo {
                name: t.destination_name(d).unwrap_or("?").to_string(),
                cluster: t.destination_cluster(d).unwrap_or("?").to_string(),
            })
            .collect();
        let factors = self
            .compiled
            .factors
            .iter()
            .map(|f| FactorSummary {
                kind: match f.kind {
                    FactorKind::Permit => "permit",
                    FactorKind::Forbid => "forbid",
                },
                attributes: f.attributes.clone(),
                rows: f.rows,
                policies: f.policies.clone(),
            })
            .collect();
        let dump = ace_policy::dump::dump(bytes)
            .map_err(|e| general(format!("the compiled tables do not load: {e}")))?;
        Ok(Summary {
            bytes: bytes.len(),
            sha256: ace_policy::tables_sha256(bytes),
            policies: self.project.info.len(),
            evaluations: self.compiled.evaluations,
            destinations,
            attributes,
            factors,
            warnings: self.compiled.warnings.iter().map(Problem::from).collect(),
            dump,
        })
    }

    /// The filter's plugin configuration as `ace plugin-config` writes it
    /// (pretty JSON with a final newline).
    pub fn plugin_config(&self, restrict: bool, read_body: bool) -> Result<String, Vec<Problem>> {
        let config =
            ace_policy::plugin::plugin_config(&self.project, &self.compiled, restrict, read_body)
                .map_err(|e| problems(&e))?;
        serde_json::to_string_pretty(&config)
            .map(|s| s + "\n")
            .map_err(|e| general(format!("cannot write the plugin configuration: {e}")))
    }

    /// Every destination's decision for `request` (a JSON object such as
    /// `{"tenant": "globex", "data_class": "personal_eu"}`), as `ace policy
    /// explain` gives it.
    pub fn explain(&mut self, request: &str) -> Result<Explanation, String> {
        let json: serde_json::Value = serde_json::from_str(request).map_err(|e| {
            format!(
                "the request is not JSON ({e}); give an object such as {{\"tenant\": \"globex\"}}"
            )
        })?;
        let oracle = match self.oracle.take() {
            Some(o) => o,
            None => Oracle::load(&self.project.sources).map_err(|e| e.to_string())?,
        };
        let result = explain::explain(&oracle, &self.compiled.bytes, &json);
        self.oracle = Some(oracle);
        let (lines, notes) = result.map_err(|e| e.to_string())?;
        Ok(Explanation {
            text: explain::render_explanation(&lines, &notes),
            destinations: lines
                .into_iter()
                .map(|l| Decision {
                    destination: l.destination,
                    cluster: l.cluster,
                    cedar: l.cedar,
                    table: l.table,
                    policies: l.policies,
                    errors: l.errors,
                    verdict: match l.verdict {
                        Verdict::Agree => "agree",
                        Verdict::FailClosed => "fail-closed",
                        Verdict::Differ => "differ",
                    },
                })
                .collect(),
            notes,
        })
    }
}

/// One destination's line of an explanation.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Decision {
    /// Destination name.
    pub destination: String,
    /// Envoy cluster.
    pub cluster: String,
    /// Cedar's decision.
    pub cedar: bool,
    /// The tables' decision (what the filter does).
    pub table: bool,
    /// The policies that decided: the satisfied permits when allowed, the
    /// satisfied forbids when denied (empty when no permit applies).
    pub policies: Vec<String>,
    /// Cedar evaluation errors.
    pub errors: Vec<String>,
    /// `agree`, `fail-closed` (an unknown value denied by design) or
    /// `differ` (the tables are wrong).
    pub verdict: &'static str,
}

/// An explanation of one request.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Explanation {
    /// Per destination, in table order.
    pub destinations: Vec<Decision>,
    /// Notes about missing or unknown values.
    pub notes: Vec<String>,
    /// The same as `ace policy explain` prints it.
    pub text: String,
}

/// What a verify found, as `ace policy verify` reports it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Verified {
    /// Whether every request of the space was checked.
    pub exhaustive: bool,
    /// The `coverage:` line.
    pub coverage: String,
    /// Requests checked.
    pub requests: u64,
    /// Of which every value known.
    pub known: u64,
    /// (request, destination) decisions compared.
    pub decisions: u64,
    /// Mismatches found.
    pub mismatches: u64,
    /// The first mismatches, one line each.
    pub first: Vec<String>,
}

/// Proves `tables` equal to Cedar for `input` (Cedar's side built from the
/// sources by the verifier's own path), calling `progress(checked, total)`
/// as it goes.
pub fn verify(
    input: &Input,
    tables: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Verified, String> {
    let oracle = Oracle::load(&input.sources()).map_err(|e: VerifyError| e.to_string())?;
    let report =
        verify::verify_with_progress(&oracle, tables, progress).map_err(|e| e.to_string())?;
    let yn = |b: bool| if b { "allow" } else { "deny" };
    Ok(Verified {
        exhaustive: report.exhaustive,
        coverage: report.coverage_line(),
        requests: report.requests,
        known: report.known,
        decisions: report.decisions,
        mismatches: report.mismatch_count,
        first: report
            .mismatches
            .iter()
            .take(50)
            .map(|m| {
                format!(
                    "request {} destination {}: cedar {}, tables {}",
                    m.request,
                    m.destination,
                    yn(m.cedar),
                    yn(m.table)
                )
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The shipped examples, as the page loads them.
    fn examples() -> Input {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let read = |name: &str| File {
            name: name.to_string(),
            text: std::fs::read_to_string(dir.join(name)).unwrap(),
        };
        let mut policies: Vec<File> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".cedar"))
            .map(|n| read(&n))
            .collect();
        // The page's order is not the directory's: compile must not care.
        policies.reverse();
        Input {
            schema: read("ace.cedarschema"),
            manifest: read("fleet.toml"),
            policies,
        }
    }

    #[test]
    fn tables_equal_the_command_s_for_the_examples() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let project = ace_policy::load_dir(&dir).unwrap();
        let cli = ace_policy::compile(&project).unwrap();
        let session = Session::compile(&examples()).unwrap();
        assert_eq!(session.tables(), cli.bytes.as_slice());
        let summary = session.summary().unwrap();
        assert_eq!(summary.sha256, ace_policy::tables_sha256(&cli.bytes));
        assert_eq!(summary.bytes, cli.bytes.len());
        assert_eq!(summary.attributes[0].name, "tenant");
        // The plugin configuration is the command's, byte for byte.
        let config = ace_policy::plugin::plugin_config(&project, &cli, false, false).unwrap();
        assert_eq!(
            session.plugin_config(false, false).unwrap(),
            serde_json::to_string_pretty(&config).unwrap() + "\n"
        );
    }

    #[test]
    fn a_broken_policy_is_reported_with_line_and_column() {
        let mut input = examples();
        let eu = input
            .policies
            .iter_mut()
            .find(|f| f.name == "eu_residency.cedar")
            .unwrap();
        eu.text = eu
            .text
            .replace("resource.jurisdiction", "resource.jurisdicton");
        let problems = Session::compile(&input).unwrap_err();
        let p = &problems[0];
        assert_eq!(p.file, "eu_residency.cedar");
        assert!(p.line > 0 && p.column > 0, "{p:?}");
        assert!(p
            .text
            .starts_with(&format!("eu_residency.cedar:{}:{}: ", p.line, p.column)));
    }

    #[test]
    fn explain_and_verify_agree_with_cedar() {
        let input = examples();
        let mut session = Session::compile(&input).unwrap();
        let e = session
            .explain(r#"{"tenant":"globex","data_class":"personal_eu","model":"llama-3.1-8b","latency_class":"interactive","tp_degree":1}"#)
            .unwrap();
        assert_eq!(e.destinations.len(), 12);
        assert!(e.destinations.iter().all(|d| d.verdict == "agree"));
        assert!(e
            .destinations
            .iter()
            .any(|d| !d.table && d.policies.iter().any(|p| p == "eu_residency")));
        // Verify over a smaller request space (a dev build of the verifier
        // takes tens of seconds over the examples' whole space).
        let mut small = input.clone();
        for (from, to) in [
            (
                r#"values = ["public", "internal", "confidential", "personal_eu", "phi"]"#,
                r#"values = ["public", "personal_eu"]"#,
            ),
            (
                r#"values = ["interactive", "standard", "batch"]"#,
                r#"values = ["interactive"]"#,
            ),
            // The objectives of the classes taken out go with them.
            (
                "[slo.standard]\nttft_ms = 3000\ne2e_base_ms = 3000\ne2e_per_token_ms = 120\n",
                "",
            ),
            ("[slo.batch]\ne2e_base_ms = 600000\n", ""),
            ("values = [1, 2, 4, 8]", "values = [1]"),
        ] {
            assert!(
                small.manifest.text.contains(from),
                "the examples list {from}"
            );
            small.manifest.text = small.manifest.text.replace(from, to);
        }
        let tables = Session::compile(&small).unwrap().tables().to_vec();
        let mut calls = Vec::new();
        let v = verify(&small, &tables, &mut |done, total| {
            calls.push((done, total))
        })
        .unwrap();
        assert!(v.exhaustive);
        assert_eq!(v.mismatches, 0);
        assert_eq!(calls.last(), Some(&(v.requests, v.requests)));
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(session.explain("[1]").is_err());
    }

    #[test]
    fn malformed_input_says_what_was_expected() {
        let e = Input::parse("{}").unwrap_err();
        assert!(e.contains("\"schema\""), "{e}");
    }
}
