//! Cedar validator warnings: shown, and "this policy can never apply" made
//! an error unless the policy says it is meant.
//!
//! Why impossible policies are errors: a forbid that can never apply is a
//! compliance rule that silently does nothing (a misspelt action, a group
//! type the tenant cannot be in), and a permit that can never apply grants
//! nothing. An author who means it (a rule parked for later) writes
//! `@allow_impossible("why")` on the policy.

use crate::error::{from_cedar, Diagnostic};
use cedar_policy::ValidationWarning;
use std::path::Path;

/// The annotation that lets an impossible policy compile.
pub const ALLOW_IMPOSSIBLE: &str = "allow_impossible";

/// What a validator warning does to the compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Stops the compile.
    Error,
    /// Shown; the compile goes on.
    Warning,
}

/// Whether warning `w` stops the compile; `allowed` is whether its policy
/// carries [`ALLOW_IMPOSSIBLE`].
pub fn classify(w: &ValidationWarning, allowed: bool) -> Severity {
    let impossible = matches!(
        w,
        ValidationWarning::ImpossiblePolicy(_) | ValidationWarning::InvalidActionApplication(_)
    );
    if impossible && !allowed {
        Severity::Error
    } else {
        Severity::Warning
    }
}

/// The error for an impossible policy at its place in `text`.
pub fn impossible(file: &Path, text: &str, w: &ValidationWarning) -> Diagnostic {
    let mut d = from_cedar(file, text, w, "");
    d.message = format!("policy `{}` can never apply: {}", w.policy_id(), d.message);
    d.hint = format!(
        "check its action, principal and resource scopes and its conditions against the schema \
         (a group the tenant cannot be in, an action other than `dispatch`); if it is meant, \
         annotate it `@{ALLOW_IMPOSSIBLE}(\"why\")`"
    );
    d
}
