//! The comparison over seeds: mean and spread per policy, as a terminal
//! table and as JSON, and the verdict on the goals.

use crate::metrics::Metrics;
use serde::Serialize;

/// A figure over seeds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one seed).
    pub sd: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Over `values`.
    pub fn of(values: &[f64]) -> Spread {
        let n = values.len() as f64;
        if values.is_empty() {
            return Spread::default();
        }
        let mean = values.iter().sum::<f64>() / n;
        let var = if values.len() > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        Spread {
            mean,
            sd: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One policy over every seed.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyFigures {
    /// The policy.
    pub policy: String,
    /// Whether it may serve a request another model than the one named
    /// (ACE's model classes, LiteLLM's per-team aliases).
    pub substitutes: bool,
    /// Marginal cost, USD: every request's booked cost.
    pub cost_usd: Spread,
    /// Standing cost, USD: the owned and reserved capacity over the run,
    /// used or not ([`Metrics::standing`]), the same for every policy.
    pub standing_usd: Spread,
    /// Total spend, USD: marginal plus standing.
    pub total_usd: Spread,
    /// Cost over the all-pay-as-you-go counterfactual of the same served
    /// requests.
    pub cost_vs_payg: Spread,
    /// Served fraction.
    pub served: Spread,
    /// SLO attainment, all classes.
    pub slo: Spread,
    /// SLO attainment per latency class.
    pub slo_by_class: Vec<(String, Spread)>,
    /// Mean owned-GPU utilisation.
    pub owned_utilisation: Spread,
    /// Owned utilisation per hour, mean over seeds.
    pub owned_utilisation_by_hour: Vec<f64>,
    /// SLO-met requests per USD.
    pub goodput_per_usd: Spread,
    /// Compliance violations (attempts to forbidden destinations).
    pub violations: Spread,
    /// Requests with at least one violating attempt.
    pub violating_requests: Spread,
    /// Cost by tier, mean over seeds, USD (inhouse, reserved, spot,
    /// ondemand, payg).
    pub cost_by_tier: [f64; 5],
    /// Prompt caching over seeds (a trace with prompt blocks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCacheSpread>,
    /// Every seed's run.
    pub runs: Vec<Metrics>,
}

/// Prompt caching's figures over seeds
/// ([`crate::metrics::PromptCacheFigures`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PromptCacheSpread {
    /// Cached input tokens over input tokens, served requests.
    pub cached_share: Spread,
    /// Time to first token, median, ms.
    pub ttft_p50_ms: Spread,
    /// Time to first token, 95th percentile, ms.
    pub ttft_p95_ms: Spread,
}

impl PolicyFigures {
    /// The figures of `policy` over `runs`; `substitutes`: whether it may
    /// serve another model than the one named.
    pub fn new(policy: String, substitutes: bool, runs: Vec<Metrics>) -> PolicyFigures {
        let s = |f: &dyn Fn(&Metrics) -> f64| Spread::of(&runs.iter().map(f).collect::<Vec<_>>());
        let classes: Vec<String> = runs
            .first()
            .map(|m| {
                m.classes
                    .iter()
                    .filter(|c| c.requests > 0)
                    .map(|c| c.class.clone())
                    .collect()
            })
            .unwrap_or_default();
        let hours = runs
            .iter()
            .map(|m| m.owned_utilisation.len())
            .max()
            .unwrap_or(0);
        let n = runs.len().max(1) as f64;
        let mut cost_by_tier = [0.0; 5];
        for m in &runs {
            for (t, c) in cost_by_tier.iter_mut().zip(m.cost_by_tier) {
                *t += c / n;
            }
        }
        let pc = |f: &dyn Fn(&crate::metrics::PromptCacheFigures) -> f64| {
            s(&|m| m.prompt_cache.as_ref().map_or(0.0, f))
        };
        let prompt_cache =
            runs.iter()
                .any(|m| m.prompt_cache.is_some())
                .then(|| PromptCacheSpread {
                    cached_share: pc(&|p| p.cached_share()),
                    ttft_p50_ms: pc(&|p| p.ttft_p50_ms as f64),
                    ttft_p95_ms: pc(&|p| p.ttft_p95_ms as f64),
                });
        PolicyFigures {
            prompt_cache,
            cost_usd: s(&|m| m.cost_usd),
            standing_usd: s(&|m| m.standing_usd),
            total_usd: s(&|m| m.cost_usd + m.standing_usd),
            cost_vs_payg: s(&|m| m.cost_vs_counterfactual()),
            served: s(&|m| m.served_fraction()),
            slo: s(&|m| m.slo_attainment()),
            slo_by_class: classes
                .iter()
                .map(|c| (c.clone(), s(&|m| m.class_attainment(c).unwrap_or(0.0))))
                .collect(),
            owned_utilisation: s(&|m| m.mean_owned_utilisation()),
            owned_utilisation_by_hour: (0..hours)
                .map(|h| {
                    runs.iter()
                        .map(|m| m.owned_utilisation.get(h).copied().unwrap_or(0.0))
                        .sum::<f64>()
                        / n
                })
                .collect(),
            goodput_per_usd: s(&|m| m.goodput_per_usd()),
            violations: s(&|m| m.violations as f64),
            violating_requests: s(&|m| m.violating_requests as f64),
            cost_by_tier,
            policy,
            substitutes,
            runs,
        }
    }
}

/// What the simulation was asked to do, for the report's header.
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    /// The trace.
    pub trace: String,
    /// Requests per run.
    pub requests: usize,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// How the trace was shaped.
    pub shape: String,
    /// What the engines and APIs did.
    pub fleet_model: crate::fleet::FleetModel,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The setting.
    pub setting: Setting,
    /// Per policy.
    pub policies: Vec<PolicyFigures>,
    /// The SLO bar a policy must clear to count as meeting the targets.
    pub slo_bar: f64,
}

impl Comparison {
    /// Whether `p` met the SLO targets: attainment at or above the bar in
    /// every latency class and a served fraction at or above it too.
    pub fn meets_slo(&self, p: &PolicyFigures) -> bool {
        p.served.mean >= self.slo_bar && p.slo_by_class.iter().all(|(_, s)| s.mean >= self.slo_bar)
    }

    /// The figures of policy `name`.
    pub fn get(&self, name: &str) -> Option<&PolicyFigures> {
        self.policies.iter().find(|p| p.policy == name)
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let classes: Vec<String> = self
            .policies
            .first()
            .map(|p| p.slo_by_class.iter().map(|(c, _)| c.clone()).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            "{} requests per run, {} seed(s), {}\n",
            self.setting.requests,
            self.setting.seeds.len(),
            self.setting.shape
        ));
        let m = self.setting.fleet_model;
        if m != crate::fleet::FleetModel::default() {
            out.push_str(&format!(
                "fleet model (not the manifest's): engines' knee at {}x the manifest's; {m:?}\n",
                m.knee_factor
            ));
        }
        out.push('\n');
        // The policy column: 24 wide, wider for a longer name.
        let w = self
            .policies
            .iter()
            .map(|p| p.policy.len() + 1)
            .max()
            .unwrap_or(0)
            .max(24);
        let mut header = format!(
            "{:<w$} {:>6} {:>12} {:>10} {:>9} {:>8} {:>8}",
            "policy", "subst", "cost USD", "total USD", "vs payg", "served", "SLO"
        );
        for c in &classes {
            header.push_str(&format!(" {:>11}", truncate(c, 11)));
        }
        header.push_str(&format!(
            " {:>9} {:>11} {:>10} {:>9}\n",
            "owned %", "SLO-met/$", "violations", "requests"
        ));
        out.push_str(&header);
        for p in &self.policies {
            let mark = if self.meets_slo(p) { ' ' } else { '*' };
            let mut line = format!(
                "{:<w$} {:>6} {:>12} {:>10.0} {:>8.1}% {:>7.2}% {:>7.2}%",
                format!("{}{}", p.policy, mark),
                if p.substitutes { "yes" } else { "-" },
                format!("{:.0} ±{:.0}", p.cost_usd.mean, p.cost_usd.sd),
                p.total_usd.mean,
                p.cost_vs_payg.mean * 100.0,
                p.served.mean * 100.0,
                p.slo.mean * 100.0,
            );
            for (_, s) in &p.slo_by_class {
                line.push_str(&format!(" {:>10.2}%", s.mean * 100.0));
            }
            // A policy that spent nothing has no finite SLO-met per dollar.
            let per_usd = if p.cost_usd.mean > 0.0 {
                format!("{:.0}", p.goodput_per_usd.mean)
            } else {
                "-".to_string()
            };
            line.push_str(&format!(
                " {:>8.1}% {:>11} {:>10.0} {:>9.0}\n",
                p.owned_utilisation.mean * 100.0,
                per_usd,
                p.violations.mean,
                p.violating_requests.mean
            ));
            out.push_str(&line);
        }
        if self.policies.iter().any(|p| p.prompt_cache.is_some()) {
            out.push_str(&format!(
                "\nprompt caching (served requests)\n{:<w$} {:>13} {:>12} {:>13} {:>13} {:>8}\n",
                "policy", "cached input", "cost USD", "TTFT p50 ms", "TTFT p95 ms", "SLO"
            ));
            for p in &self.policies {
                let Some(c) = &p.prompt_cache else { continue };
                out.push_str(&format!(
                    "{:<w$} {:>12.1}% {:>12} {:>13.0} {:>13.0} {:>7.2}%\n",
                    p.policy,
                    c.cached_share.mean * 100.0,
                    format!("{:.2} ±{:.2}", p.cost_usd.mean, p.cost_usd.sd),
                    c.ttft_p50_ms.mean,
                    c.ttft_p95_ms.mean,
                    p.slo.mean * 100.0,
                ));
            }
            out.push_str("cached input: input tokens the destinations read from their prompt caches (engines' prefix caches, providers' prompt caches) over all input tokens\n");
        }
        out.push_str(&format!(
            "\n* below the SLO bar: served and every class's attainment at least {:.0}%\n",
            self.slo_bar * 100.0
        ));
        let standing = self.policies.first().map_or(0.0, |p| p.standing_usd.mean);
        if standing > 0.0 {
            out.push_str(&format!(
                "cost: marginal, every request as the ledger books it; total: cost plus USD {standing:.0} a run of standing cost, the owned and reserved capacity paid for whether used or not (the manifest's gpu_hour_usd x gpus of its in-house and reserved destinations over the run's hours), the same for every policy\n"
            ));
        } else {
            out.push_str("cost: marginal, every request as the ledger books it; total: the same, the manifest giving no hourly price (gpu_hour_usd) for its owned and reserved capacity\n");
        }
        out.push_str("vs payg: cost over what the cheapest feasible pay-as-you-go API would have charged for the same served requests\n");
        out.push_str("violations: attempts sent to a destination the compiled Cedar policies forbid for the request; requests: the requests with at least one\n");
        out.push_str("subst: may serve another model than the one named (ACE's model classes, LiteLLM's per-team aliases)\n");
        for line in self.verdict() {
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    /// The goals, checked: ACE cheapest among the policies meeting the
    /// SLO; at least 20% cheaper than LiteLLM's cost-based routing at
    /// equal or better attainment; at least 50% cheaper than all
    /// pay-as-you-go; no violation.
    pub fn verdict(&self) -> Vec<String> {
        let mut out = Vec::new();
        let Some(ace) = self.get("ace") else {
            return out;
        };
        let compliant: Vec<&PolicyFigures> =
            self.policies.iter().filter(|p| self.meets_slo(p)).collect();
        let cheapest = compliant
            .iter()
            .min_by(|a, b| a.cost_usd.mean.total_cmp(&b.cost_usd.mean))
            .map(|p| p.policy.as_str());
        out.push(format!(
            "goal: ACE cheapest of those meeting the SLO bar: {} (cheapest: {})",
            yes(cheapest == Some("ace")),
            cheapest.unwrap_or("none")
        ));
        // The best peer: the cheapest policy that is not ACE's own and
        // meets the SLO bar, whichever it is at this load.
        let best = cheapest_peer(&compliant, |_| true);
        if let Some(b) = best {
            out.push(format!(
                "best peer meeting the SLO bar: {} (USD {:.0}, {:.0} violations); ACE {} (total spend {})",
                b.policy,
                b.cost_usd.mean,
                b.violations.mean,
                cheaper(saving(ace, b)),
                cheaper(saving_of_total(ace, b)),
            ));
        }
        // Substitution apart: each side of ACE against the best peer on
        // the same side, so that neither lead hides in the other.
        for (side, ours, substitutes) in [
            ("with substitution", Some(ace), true),
            ("dispatch alone", self.get("ace-no-model-routing"), false),
        ] {
            let Some(ours) = ours else { continue };
            let peer = cheapest_peer(&compliant, |p| p.substitutes == substitutes);
            // A peer that breaks the policies is no one's choice: the best
            // that breaks none, too, where it is another.
            let clean = cheapest_peer(&compliant, |p| {
                p.substitutes == substitutes && p.violations.max == 0.0
            })
            .filter(|c| peer.is_none_or(|b| c.policy != b.policy))
            .map_or_else(String::new, |c| {
                format!(
                    "; against the best with no violation, {} (USD {:.0}): {}",
                    c.policy,
                    c.cost_usd.mean,
                    cheaper(saving(ours, c)),
                )
            });
            let below = if self.meets_slo(ours) {
                ""
            } else {
                ", below the SLO bar"
            };
            out.push(match peer {
                Some(b) => format!(
                    "{side}: {} (USD {:.0}{below}) against the best peer {} meeting the SLO bar, {} (USD {:.0}, {:.0} violations): {} (total spend {}){}",
                    ours.policy,
                    ours.cost_usd.mean,
                    if substitutes { "that substitutes" } else { "that does not substitute" },
                    b.policy,
                    b.cost_usd.mean,
                    b.violations.mean,
                    cheaper(saving(ours, b)),
                    cheaper(saving_of_total(ours, b)),
                    clean,
                ),
                None => format!(
                    "{side}: {} (USD {:.0}{below}); no peer {} meets the SLO bar",
                    ours.policy,
                    ours.cost_usd.mean,
                    if substitutes { "that substitutes" } else { "that does not substitute" },
                ),
            });
        }
        if let Some(l) = self.get("litellm-cost-based") {
            let saving = 1.0 - ace.cost_usd.mean / l.cost_usd.mean.max(1e-12);
            out.push(format!(
                "goal: >= 20% cheaper than litellm-cost-based at equal or better SLO: {} ({:.1}% cheaper; SLO {:.2}% vs {:.2}%)",
                yes(saving >= 0.2 && ace.slo.mean >= l.slo.mean),
                saving * 100.0,
                ace.slo.mean * 100.0,
                l.slo.mean * 100.0
            ));
        }
        let vs = 1.0 - ace.cost_vs_payg.mean;
        out.push(format!(
            "goal: >= 50% cheaper than all pay-as-you-go: {} ({:.1}% cheaper than the counterfactual",
            yes(vs >= 0.5),
            vs * 100.0
        ) + &match self.get("all-payg") {
            Some(p) => format!(
                "; {:.1}% cheaper than the all-payg run, which served {:.2}%)",
                (1.0 - ace.cost_usd.mean / p.cost_usd.mean.max(1e-12)) * 100.0,
                p.served.mean * 100.0
            ),
            None => ")".into(),
        });
        out.push(format!(
            "goal: ACE has no compliance violation: {} ({} in all runs)",
            yes(ace.runs.iter().all(|m| m.violations == 0)),
            ace.runs.iter().map(|m| m.violations).sum::<u64>()
        ));
        out
    }
}

/// The cheapest of `policies` that is not ACE's own and passes `keep`.
fn cheapest_peer<'a>(
    policies: &[&'a PolicyFigures],
    keep: impl Fn(&PolicyFigures) -> bool,
) -> Option<&'a PolicyFigures> {
    policies
        .iter()
        .copied()
        .filter(|p| !p.policy.starts_with("ace") && keep(p))
        .min_by(|a, b| a.cost_usd.mean.total_cmp(&b.cost_usd.mean))
}

/// What `ours` saves over `peer`, as a fraction of the peer's cost.
fn saving(ours: &PolicyFigures, peer: &PolicyFigures) -> f64 {
    1.0 - ours.cost_usd.mean / peer.cost_usd.mean.max(1e-12)
}

/// What `ours` saves over `peer` as a share of the peer's total spend,
/// standing cost included (the same sum saved, over a larger whole).
fn saving_of_total(ours: &PolicyFigures, peer: &PolicyFigures) -> f64 {
    1.0 - ours.total_usd.mean / peer.total_usd.mean.max(1e-12)
}

/// A saving as "12.3% cheaper", or a loss as "4.5% dearer".
fn cheaper(saving: f64) -> String {
    if saving >= 0.0 {
        format!("{:.1}% cheaper", saving * 100.0)
    } else {
        format!("{:.1}% dearer", -saving * 100.0)
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "met"
    } else {
        "NOT met"
    }
}

fn truncate(s: &str, n: usize) -> &str {
    s.get(..n.min(s.len())).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(name: &str, substitutes: bool, cost: f64, violations: u64) -> PolicyFigures {
        let mut m = Metrics::default();
        m.requests = 100;
        m.served = 100;
        m.cost_usd = cost;
        m.standing_usd = 900.0;
        m.violations = violations;
        PolicyFigures::new(name.into(), substitutes, vec![m])
    }

    #[test]
    fn the_verdict_gives_savings_of_total_spend_and_the_best_peer_with_no_violation() {
        let c = Comparison {
            setting: Setting {
                trace: "t".into(),
                requests: 100,
                seeds: vec![1],
                shape: "s".into(),
                fleet_model: crate::fleet::FleetModel::default(),
            },
            policies: vec![
                figures("ace", true, 10.0, 0),
                figures("ace-no-model-routing", false, 60.0, 0),
                figures("owned-first", false, 80.0, 5),
                figures("litellm-cost-based-order", false, 100.0, 0),
                figures("litellm-cost-based-team-alias", true, 50.0, 0),
            ],
            slo_bar: 0.95,
        };
        let v = c.verdict().join("\n");
        assert!(
            v.contains(
                "dispatch alone: ace-no-model-routing (USD 60) against the best peer that does not \
                 substitute meeting the SLO bar, owned-first (USD 80, 5 violations): 25.0% cheaper \
                 (total spend 2.0% cheaper); against the best with no violation, \
                 litellm-cost-based-order (USD 100): 40.0% cheaper"
            ),
            "{v}"
        );
        assert!(
            v.contains(
                "litellm-cost-based-team-alias (USD 50, 0 violations): 80.0% cheaper (total spend \
                 4.2% cheaper)\n"
            ),
            "{v}"
        );
        assert!(c.table().contains("USD 900 a run of standing cost"));
    }
}
