//! What "met its SLO" means for a simulated request, per latency class.
//!
//! A request meets its time-to-first-token target and its end-to-end
//! target, which grows with the tokens it generated (a long answer may
//! take longer). A request that failed or was refused meets neither. The
//! defaults are ordinary chat-product targets; `ace sim --slo` replaces
//! them.

use serde::{Deserialize, Serialize};

/// One latency class's targets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassTarget {
    /// The class name (the `latency_class` attribute's value).
    pub class: String,
    /// Time to first token, ms (`None`: no target).
    pub ttft_ms: Option<u64>,
    /// End to end: this many ms ...
    pub e2e_base_ms: u64,
    /// ... plus this many per generated token.
    pub e2e_per_token_ms: f64,
}

/// Targets for every latency class; a class not listed uses the last
/// entry's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// Per class.
    pub classes: Vec<ClassTarget>,
}

impl Default for Targets {
    fn default() -> Targets {
        let t = |class: &str, ttft: Option<u64>, base: u64, per: f64| ClassTarget {
            class: class.into(),
            ttft_ms: ttft,
            e2e_base_ms: base,
            e2e_per_token_ms: per,
        };
        Targets {
            classes: vec![
                t("interactive", Some(1_000), 1_000, 60.0),
                t("batch", None, 600_000, 0.0),
                t("standard", Some(3_000), 3_000, 120.0),
            ],
        }
    }
}

impl Targets {
    /// The index of `class`'s targets.
    pub fn index(&self, class: &str) -> usize {
        self.classes
            .iter()
            .position(|c| c.class == class)
            .unwrap_or(self.classes.len().saturating_sub(1))
    }

    /// Whether a request of class `i` that generated `output` tokens met
    /// its (first-token, end-to-end) targets.
    pub fn met(&self, i: usize, ttft_ms: Option<u64>, e2e_ms: u64, output: u32) -> (bool, bool) {
        let Some(c) = self.classes.get(i) else {
            return (true, true);
        };
        let first = match (c.ttft_ms, ttft_ms) {
            (None, _) => true,
            (Some(t), Some(x)) => x <= t,
            (Some(_), None) => false,
        };
        let limit = c.e2e_base_ms as f64 + c.e2e_per_token_ms * f64::from(output);
        (first, e2e_ms as f64 <= limit)
    }
}
