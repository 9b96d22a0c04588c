//! What "met its SLO" means for a simulated request, per latency class.
//!
//! A request meets its time-to-first-token target and its end-to-end
//! target, which grows with the tokens it generated (a long answer may
//! take longer). A request that failed or was refused meets neither. The
//! targets are the fleet manifest's `[slo.<class>]` tables, the ones the
//! filter ranks by ([`Targets::from_manifest`]); without them, ordinary
//! chat-product targets; `ace sim --slo` replaces either. Whichever they
//! are, ACE is told them ([`Targets::tell`]): it is judged by what it
//! ranks by, as in production.

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
    /// The targets a fleet manifest's `[slo.<class>]` tables set (the same
    /// the filter ranks by), or `None` when it sets none.
    pub fn from_manifest(manifest: &ace_policy::manifest::Manifest) -> Option<Targets> {
        if manifest.slo.is_empty() {
            return None;
        }
        let classes = manifest
            .slo
            .iter()
            .map(|(class, slo)| {
                let slo = slo.get_ref();
                ClassTarget {
                    class: class.clone(),
                    ttft_ms: slo.ttft_ms.map(u64::from),
                    e2e_base_ms: slo.e2e_base_ms.unwrap_or(600_000),
                    e2e_per_token_ms: slo.e2e_per_token_ms.unwrap_or(0.0),
                }
            })
            .collect();
        Some(Targets { classes })
    }

    /// Tell ACE's configuration these targets: each class's
    /// time-to-first-token target becomes the one it is judged by (a class
    /// the configuration lacks is added, worth its default per second), so
    /// that ACE ranks by what the simulation counts.
    pub fn tell(&self, cfg: &mut ace_config::Config) {
        for t in &self.classes {
            let ttft = t.ttft_ms.and_then(|v| u32::try_from(v).ok());
            match cfg
                .latency_classes
                .binary_search_by(|(name, _)| name.as_str().cmp(&t.class))
            {
                Ok(i) => {
                    if let Some((_, c)) = cfg.latency_classes.get_mut(i) {
                        if c.ttft_ms.is_none() && ttft.is_some() {
                            c.late_usd = ace_config::LatencyClass::DEFAULT_LATE_USD;
                        }
                        c.ttft_ms = ttft;
                    }
                }
                Err(i) => {
                    let mut c = ace_config::LatencyClass::untimed(cfg.latency_usd_per_s);
                    c.ttft_ms = ttft;
                    c.late_usd = ace_config::LatencyClass::DEFAULT_LATE_USD;
                    cfg.latency_classes.insert(i, (t.class.clone(), c));
                }
            }
        }
        // The targets replace the classes', and so the floor they set.
        cfg.congestion_usd_per_s = ace_config::congestion_floor(&cfg.latency_classes);
    }

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
