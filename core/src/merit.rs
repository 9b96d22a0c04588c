//! Merit order: rank destinations by the cost of serving one more request.
//!
//! The full model (cost curves by tier, the stutter knee, warmth, health)
//! grows here; the contract stays the same: a pure function from a borrowed
//! table of offers to a [`Choice`], with a deterministic tie-break (the lower
//! index wins) so that every worker and every simulation agrees.

/// One destination's offer for the current request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offer {
    /// Marginal cost in US dollars for this request. Must be finite and
    /// non-negative; the configuration loader rejects anything else.
    pub cost_usd: f64,
    /// Whether the destination may take the request at all.
    pub available: bool,
}

/// Why a destination was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The chosen destination had the lowest cost among those available.
    Cheapest,
    /// It was the only available destination.
    OnlyOption,
}

impl Reason {
    /// A stable, machine-readable name used in headers and events.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Cheapest => "cheapest",
            Reason::OnlyOption => "only_option",
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// Index of the chosen destination in the offer table.
    pub index: usize,
    /// Index of the next-best destination, if any.
    pub runner_up: Option<usize>,
    /// The chosen destination's cost.
    pub cost_usd: f64,
    /// Why it was chosen.
    pub reason: Reason,
}

/// Pick the lowest-cost available offer. Ties go to the lower index.
/// Returns `None` when no offer is available.
pub fn choose(offers: &[Offer]) -> Option<Choice> {
    let mut best: Option<(usize, f64)> = None;
    let mut second: Option<(usize, f64)> = None;
    for (i, o) in offers.iter().enumerate() {
        if !o.available {
            continue;
        }
        match best {
            Some((_, c)) if o.cost_usd >= c => {
                if second.is_none_or(|(_, s)| o.cost_usd < s) {
                    second = Some((i, o.cost_usd));
                }
            }
            _ => {
                second = best;
                best = Some((i, o.cost_usd));
            }
        }
    }
    let (index, cost_usd) = best?;
    Some(Choice {
        index,
        runner_up: second.map(|(i, _)| i),
        cost_usd,
        reason: if second.is_some() {
            Reason::Cheapest
        } else {
            Reason::OnlyOption
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(cost_usd: f64) -> Offer {
        Offer {
            cost_usd,
            available: true,
        }
    }

    #[test]
    fn picks_the_cheapest_and_names_the_runner_up() {
        let c = choose(&[offer(3.0), offer(1.0), offer(2.0)]);
        assert_eq!(
            c,
            Some(Choice {
                index: 1,
                runner_up: Some(2),
                cost_usd: 1.0,
                reason: Reason::Cheapest
            })
        );
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let c = choose(&[offer(2.0), offer(1.0), offer(1.0)]).map(|c| (c.index, c.runner_up));
        assert_eq!(c, Some((1, Some(2))));
    }

    #[test]
    fn unavailable_offers_are_never_chosen() {
        let mut o = [offer(0.5), offer(4.0)];
        o[0].available = false;
        let c = choose(&o);
        assert_eq!(
            c.map(|c| (c.index, c.reason)),
            Some((1, Reason::OnlyOption))
        );
        o[1].available = false;
        assert_eq!(choose(&o), None);
    }

    #[test]
    fn empty_table_chooses_nothing() {
        assert_eq!(choose(&[]), None);
    }
}
