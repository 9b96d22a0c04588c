//! Export in FOCUS 1.3 (the FinOps Open Cost and Usage Specification,
//! focus.finops.org; its column rules are `specification/datasets/cost_and_usage/columns/*.md`
//! of `FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec`), as CSV: the Cost and
//! Usage dataset, one `Usage` row per request that reached a destination,
//! and the rows of each standing pool's commitment.
//!
//! | FOCUS column | from the ledger |
//! | --- | --- |
//! | `EffectiveCost` | booked true marginal cost, plus, on an owned or reserved pool, the request's share of the pool's used capacity (the chargeback's amortisation, split by tokens) |
//! | `ContractedCost` | booked true marginal cost |
//! | `BilledCost` | booked cost where the tier bills per use (payg, spot, ondemand, reserved overage); 0 on owned or committed capacity, whose standing cost is billed on its pool's `Purchase` row |
//! | `ListCost` | the cheapest feasible pay-as-you-go list price for the same tokens (booked cost when none was feasible or the request was not served) |
//! | `PricingCategory` | `Standard` (payg, ondemand), `Dynamic` (spot), `Committed` (reserved), `Other` (inhouse) |
//! | `ChargeFrequency` | `Usage-Based` for requests, `Recurring` for capacity |
//! | `ChargePeriodStart`/`End` | request time to request time + latency (at least 1 ms), rounded out to whole seconds (DateTimeFormat: `YYYY-MM-DDTHH:mm:ssZ`) |
//! | `PricingQuantity`, `ConsumedQuantity` | input + output tokens (`Tokens`) |
//! | `ResourceId`, `ResourceName` | destination; `SkuId` the model served; `SkuPriceId` configuration/destination/model |
//! | `SubAccountId` | tenant |
//! | `ServiceProviderName`, `InvoiceIssuerName` | `ACE` (1.3 replaced `ProviderName` and `PublisherName`) |
//! | `Commitment*` | a reserved destination's commitment (below) |
//! | `ContractApplied` | null: ACE knows of no contract commitment |
//! | `x_Ace*` | event and request ids, destination, tier, SLO met, the four savings, forfeit reason, configuration, capacity row kind |
//!
//! **Commitments.** A reserved destination (a PTU reservation, a reserved
//! GPU block, a committed-use discount) is what FOCUS calls a *commitment
//! discount* of category `Usage`: capacity bought for a term, whose use in
//! each charge period is either consumed (`Used`) or wasted (`Unused`)
//! (`commitmentdiscountstatus.md`, `commitmentdiscountquantity.md`). Its
//! unit is the slot-hour (`CommitmentDiscountUnit` `Slot-Hours`: one of its
//! `capacity` concurrent requests held for an hour). Over the report's
//! charged period (the chargeback's, `crate::chargeback`), each standing
//! pool writes:
//!
//! - a `Purchase` row (reserved pools only): `ChargeFrequency` `Recurring`,
//!   `BilledCost` its whole amortised cost, `EffectiveCost` 0 (spread over
//!   the usage rows), `CommitmentDiscountQuantity` the slot-hours bought,
//!   `PricingCategory` `Standard` (a commitment bought at its agreed rate);
//! - each request it served: `CommitmentDiscountStatus` `Used`,
//!   `CommitmentDiscountQuantity` the slot-hours it held (its latency);
//! - an `Unused` row: `ChargeCategory` `Usage`, the idle cost as
//!   `EffectiveCost`, `BilledCost` 0, the slot-hours no request held,
//!   `ConsumedQuantity` null (as `consumedquantity.md` requires of unused
//!   commitment).
//!
//! A pool with no standing cost (no `usd_per_gpu_hour`) writes no
//! capacity rows. An owned pool (`inhouse`) is no commitment discount (nothing is bought
//! from a provider): its requests carry their share of its used capacity
//! in `EffectiveCost` and its idle capacity is one `Usage` row, with the
//! `Commitment*` columns null and `x_AceCapacity` `idle`.
//!
//! FOCUS 1.3 also added *contract commitments* (the Contract Commitment
//! dataset and the Cost and Usage column `ContractApplied`: a negotiated
//! spend or usage floor across a contract, such as an enterprise discount
//! programme). ACE's reserved tier is a commitment discount, not one of
//! those, and ACE knows of none: `ContractApplied` is written, null
//! (`contractapplied.md`: it must not be null only when a contract
//! commitment applies to the charge). FOCUS 1.4 adds nothing ACE knows
//! beyond these columns.
//!
//! Costs are decimals with nine places, exact from integer nano-dollars.
//!
//! Text cells come from access-log lines (a client chooses its
//! `x-request-id`, tenant and model names), and the file is opened in
//! spreadsheets, which run a cell that begins with `=`, `+`, `-`, `@`, a
//! tab or a carriage return as a formula. Each such text cell is
//! neutralised as OWASP's CSV-injection guidance says: prefixed with a
//! single quote, and, like every text cell, quoted with its double quotes
//! doubled ([`text`]). Figures the ledger computed are written as they are
//! (a negative saving stays a number).

use crate::chargeback::{allocate, Pool, UNUSED};
use crate::money::{usd, Nano};
use crate::report::Report;
use crate::row::Row;
use crate::split::Split;
use crate::store::Store;
use crate::time::{civil, rfc3339};
use crate::window::{self, Rules};
use ace_core::cost::Tier;
use std::collections::BTreeMap;
use std::io::Write;

/// The FOCUS version the export follows.
pub const FOCUS_VERSION: &str = "1.3";

/// The unit a commitment is counted in: one concurrent-request slot of a
/// pool held for an hour.
pub const SLOT_HOURS: &str = "Slot-Hours";

/// What a reserved destination's commitment is called
/// (`CommitmentDiscountType`, the provider's own label).
pub const COMMITMENT_TYPE: &str = "Reserved capacity";

/// The header row.
pub const COLUMNS: &[&str] = &[
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractApplied",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "RegionId",
    "ResourceId",
    "ResourceName",
    "ServiceCategory",
    "ServiceName",
    "ServiceProviderName",
    "ServiceSubcategory",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x_AceEventId",
    "x_AceRequestId",
    "x_AceDestination",
    "x_AceTier",
    "x_AceSloMet",
    "x_AceSavingsUtilization",
    "x_AceSavingsArbitrage",
    "x_AceSavingsModelRouting",
    "x_AceSavingsCaching",
    "x_AceSavingsForfeited",
    "x_AceForfeitReason",
    "x_AceConfig",
    "x_AceCapacity",
];

/// A figure the ledger computed (a decimal, a time, a fixed word): quoted
/// only when CSV needs it.
fn csv(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        quoted(field)
    } else {
        field.to_string()
    }
}

fn quoted(field: &str) -> String {
    format!("\"{}\"", field.replace('"', "\"\""))
}

/// A cell whose text came from the log: always quoted, and prefixed with
/// `'` when a spreadsheet would read it as a formula.
pub fn text(field: &str) -> String {
    if field.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        quoted(&format!("'{field}"))
    } else {
        quoted(field)
    }
}

fn month_bounds(ms: i64) -> (String, String) {
    let (y, m, _) = civil(ms.div_euclid(86_400_000));
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (
        format!("{y:04}-{m:02}-01T00:00:00Z"),
        format!("{ny:04}-{nm:02}-01T00:00:00Z"),
    )
}

fn unit_price(cost: i64, quantity: f64) -> String {
    if quantity <= 0.0 {
        return String::new();
    }
    format!("{:.15}", crate::money::usd_f64(cost) / quantity)
}

/// `ms` of one slot as slot-hours.
fn slot_hours(ms: f64) -> f64 {
    ms.max(0.0) / 3_600_000.0
}

/// `ms` as FOCUS writes a moment (`YYYY-MM-DDTHH:mm:ssZ`, DateTimeFormat:
/// whole seconds), rounded down, or up when `up` (so a charge period
/// rounded out still holds the whole request).
fn moment(ms: i64, up: bool) -> String {
    let s = if up {
        ms.saturating_add(999).div_euclid(1000)
    } else {
        ms.div_euclid(1000)
    };
    let t = rfc3339(s.saturating_mul(1000));
    t.strip_suffix(".000Z")
        .map_or(t.clone(), |t| format!("{t}Z"))
}

fn decimal(q: f64) -> String {
    format!("{q:.9}")
}

/// One row, its cells in [`COLUMNS`] order (empty: null).
struct Line(Vec<String>);

impl Line {
    /// The cells every row shares.
    fn new(bps: &str, bpe: &str) -> Line {
        let mut l = Line(vec![String::new(); COLUMNS.len()]);
        for (col, v) in [
            ("BillingAccountId", "ace"),
            ("BillingAccountName", "ACE fleet"),
            ("BillingCurrency", "USD"),
            ("BillingPeriodStart", bps),
            ("BillingPeriodEnd", bpe),
            ("InvoiceIssuerName", "ACE"),
            ("ServiceProviderName", "ACE"),
            ("ServiceCategory", "AI and Machine Learning"),
            ("ServiceSubcategory", "Generative AI"),
            ("ServiceName", "LLM inference"),
        ] {
            l.set(col, csv(v));
        }
        l
    }

    fn set(&mut self, col: &str, cell: String) {
        if let Some(c) = COLUMNS
            .iter()
            .position(|c| *c == col)
            .and_then(|i| self.0.get_mut(i))
        {
            *c = cell;
        }
    }

    /// A reserved destination's commitment columns.
    fn commitment(&mut self, dest: &str, status: Option<&str>, quantity: f64) {
        self.set("CommitmentDiscountId", text(dest));
        self.set("CommitmentDiscountName", text(dest));
        self.set("CommitmentDiscountCategory", csv("Usage"));
        self.set("CommitmentDiscountType", csv(COMMITMENT_TYPE));
        if let Some(s) = status {
            self.set("CommitmentDiscountStatus", csv(s));
        }
        self.set("CommitmentDiscountQuantity", csv(&decimal(quantity)));
        self.set("CommitmentDiscountUnit", csv(SLOT_HOURS));
    }

    /// A capacity row's money: what is billed, its effective cost, and
    /// its contracted and list cost (`listed`) over `slot_hours`, each
    /// unit price that cost per slot-hour.
    fn capacity_costs(&mut self, billed: Nano, effective: Nano, listed: Nano, slot_hours: f64) {
        self.set("BilledCost", csv(&usd(billed)));
        self.set("EffectiveCost", csv(&usd(effective)));
        for col in ["ContractedCost", "ListCost"] {
            self.set(col, csv(&usd(listed)));
        }
        for col in ["ContractedUnitPrice", "ListUnitPrice"] {
            self.set(col, csv(&unit_price(listed, slot_hours)));
        }
        self.set("PricingQuantity", csv(&decimal(slot_hours)));
    }

    fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "{}", self.0.join(","))
    }
}

/// Each served request's share of its pool's used capacity, by event id
/// (the chargeback's amortisation: by tokens), and what no request could
/// take (a pool used only by requests of no tokens), by pool.
fn amortised(
    store: &mut dyn Store,
    pools: &[Pool],
) -> anyhow::Result<(BTreeMap<String, Nano>, BTreeMap<String, Nano>)> {
    let mut weights: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    store.scan(&mut |r: Row| {
        if let Some(dest) = r.destination.as_deref().filter(|_| r.served()) {
            if pools.iter().any(|p| p.destination == dest) {
                let tokens = u64::try_from(r.tokens_in.saturating_add(r.tokens_out)).unwrap_or(0);
                weights
                    .entry(dest.to_string())
                    .or_default()
                    .insert(r.event_id.clone(), tokens);
            }
        }
        Ok(())
    })?;
    let mut shares = BTreeMap::new();
    let mut left = BTreeMap::new();
    for p in pools {
        let w = weights.remove(&p.destination).unwrap_or_default();
        for (id, v) in allocate(p.used, &w) {
            if id == UNUSED && !w.contains_key(UNUSED) {
                left.insert(p.destination.clone(), v);
            } else {
                shares.insert(id, v);
            }
        }
    }
    Ok((shares, left))
}

/// Write every row with a destination, then each standing pool's rows, as
/// FOCUS CSV; returns the row count.
pub fn export(
    store: &mut dyn Store,
    report: &Report,
    rules: &Rules,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let verdicts = report.verdicts();
    let pools = &report.chargeback.pools;
    let (shares, left) = amortised(store, pools)?;
    writeln!(out, "{}", COLUMNS.join(","))?;
    let mut n = 0u64;
    store.scan(&mut |r: Row| {
        let (Some(dest), Some(tier)) = (r.destination.clone(), r.tier.clone()) else {
            return Ok(());
        };
        let key = window::key(&r, rules);
        let forfeited = verdicts.get(&key).cloned().flatten();
        let split = Split::of(&r);
        let qty = r.tokens_in.saturating_add(r.tokens_out);
        let list = if r.served() {
            r.counterfactual.unwrap_or(r.booked)
        } else {
            r.booked
        };
        let kind = Tier::parse(&tier);
        let per_use = kind.is_some_and(|t| !t.is_sunk()) || r.overage;
        let billed = if per_use { r.booked } else { 0 };
        let pricing = kind.map_or("Other", Tier::focus_pricing);
        let (bps, bpe) = month_bounds(r.time_ms);
        let model = r.model_served.clone().unwrap_or_default();
        let tags = serde_json::json!({
            "tenant": r.tenant, "data_class": r.data_class, "latency_class": r.latency_class
        })
        .to_string();
        let share = shares.get(&r.event_id).copied().unwrap_or(0);
        let mut l = Line::new(&bps, &bpe);
        l.set("BilledCost", csv(&usd(billed)));
        l.set("ChargeCategory", csv("Usage"));
        l.set("ChargeFrequency", csv("Usage-Based"));
        l.set(
            "ChargeDescription",
            text(&format!("LLM request for {model} on {dest} ({tier})")),
        );
        l.set("ChargePeriodStart", csv(&moment(r.time_ms, false)));
        l.set(
            "ChargePeriodEnd",
            csv(&moment(r.time_ms.saturating_add(r.latency_ms.max(1)), true)),
        );
        if kind == Some(Tier::Reserved) {
            l.commitment(&dest, Some("Used"), slot_hours(r.latency_ms as f64));
        }
        for col in ["ConsumedQuantity", "PricingQuantity"] {
            l.set(col, csv(&qty.to_string()));
        }
        l.set("ConsumedUnit", csv("Tokens"));
        l.set("PricingUnit", csv("Tokens"));
        l.set("ContractedCost", csv(&usd(r.booked)));
        l.set(
            "ContractedUnitPrice",
            csv(&unit_price(r.booked, qty as f64)),
        );
        l.set("EffectiveCost", csv(&usd(r.booked.saturating_add(share))));
        l.set("ListCost", csv(&usd(list)));
        l.set("ListUnitPrice", csv(&unit_price(list, qty as f64)));
        l.set("PricingCategory", csv(pricing));
        l.set("ResourceId", text(&dest));
        l.set("ResourceName", text(&dest));
        l.set("SkuId", text(&model));
        l.set("SkuPriceId", text(&format!("{}/{dest}/{model}", r.config)));
        l.set("SubAccountId", text(&key.0));
        l.set("SubAccountName", text(&key.0));
        l.set("Tags", text(&tags));
        l.set("x_AceEventId", text(&r.event_id));
        l.set(
            "x_AceRequestId",
            text(r.request_id.as_deref().unwrap_or_default()),
        );
        l.set("x_AceDestination", text(&dest));
        l.set("x_AceTier", text(&tier));
        l.set(
            "x_AceSloMet",
            csv(&r.slo_met.map_or(String::new(), |m| m.to_string())),
        );
        l.set("x_AceSavingsUtilization", csv(&usd(split.utilisation)));
        l.set("x_AceSavingsArbitrage", csv(&usd(split.arbitrage)));
        l.set("x_AceSavingsModelRouting", csv(&usd(split.routing)));
        l.set("x_AceSavingsCaching", csv(&usd(split.caching)));
        l.set(
            "x_AceSavingsForfeited",
            csv(&forfeited.is_some().to_string()),
        );
        l.set("x_AceForfeitReason", text(&forfeited.unwrap_or_default()));
        l.set("x_AceConfig", text(&r.config));
        if share != 0 || kind.is_some_and(Tier::is_sunk) {
            l.set("x_AceCapacity", csv("used"));
        }
        l.write(out)?;
        n += 1;
        Ok(())
    })?;
    n += capacity(report, rules, &left, out)?;
    Ok(n)
}

/// Each standing pool's rows over the report's charged period: a reserved
/// pool's `Purchase`, and every pool's idle (`Unused`) capacity.
fn capacity(
    report: &Report,
    rules: &Rules,
    left: &BTreeMap<String, Nano>,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let w = rules.window_ms.max(1);
    let (Some(first), Some(last)) = (
        report.cost_series.keys().next(),
        report.cost_series.keys().next_back(),
    ) else {
        return Ok(0);
    };
    let (start, end) = (*first, last.saturating_add(w));
    let (bps, bpe) = month_bounds(start);
    let period = report.chargeback.period_ms;
    let mut n = 0;
    // A pool with no standing cost (no `usd_per_gpu_hour`) has nothing
    // to amortise: its requests' rows say all there is.
    for p in report.chargeback.pools.iter().filter(|p| p.cost != 0) {
        let reserved = Tier::parse(&p.tier) == Some(Tier::Reserved);
        let slots = f64::from(
            report
                .pools
                .iter()
                .find(|s| s.destination == p.destination)
                .map_or(1, |s| s.capacity.max(1)),
        );
        let bought = slot_hours(period as f64) * slots;
        let idle_hours = bought * (1.0 - p.utilisation).max(0.0);
        // A recurring row of the pool's, of `category`.
        let row = |category: &str, description: String| {
            let mut l = Line::new(&bps, &bpe);
            l.set("ChargePeriodStart", csv(&moment(start, false)));
            l.set("ChargePeriodEnd", csv(&moment(end, true)));
            l.set("ChargeCategory", csv(category));
            l.set("ChargeFrequency", csv("Recurring"));
            l.set("ChargeDescription", text(&description));
            l.set("ResourceId", text(&p.destination));
            l.set("ResourceName", text(&p.destination));
            l.set("SkuId", text(&p.destination));
            l.set("SkuPriceId", text(&format!("{}/capacity", p.destination)));
            l.set("PricingUnit", csv(SLOT_HOURS));
            l.set("x_AceDestination", text(&p.destination));
            l.set("x_AceTier", text(&p.tier));
            l
        };
        if reserved {
            let description = format!("Reserved capacity {} for the period", p.destination);
            let mut l = row("Purchase", description);
            l.commitment(&p.destination, None, bought);
            l.capacity_costs(p.cost, 0, p.cost, bought);
            l.set("PricingCategory", csv("Standard"));
            l.set("x_AceCapacity", csv("purchase"));
            l.write(out)?;
            n += 1;
        }
        let idle = p
            .idle
            .saturating_add(left.get(&p.destination).copied().unwrap_or(0));
        let description = format!("Idle capacity of {} ({})", p.destination, p.tier);
        let mut l = row("Usage", description);
        if reserved {
            l.commitment(&p.destination, Some("Unused"), idle_hours);
            l.set("PricingCategory", csv("Committed"));
        } else {
            // No commitment: a usage row, of nothing consumed.
            l.set("PricingCategory", csv("Other"));
            l.set("ConsumedQuantity", csv(&decimal(0.0)));
            l.set("ConsumedUnit", csv(SLOT_HOURS));
        }
        l.capacity_costs(0, idle, idle, idle_hours);
        l.set("x_AceCapacity", csv("idle"));
        l.write(out)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_is_its_calendar_month_and_every_column_is_written() {
        assert_eq!(month_bounds(1_796_342_400_000).1, "2027-01-01T00:00:00Z");
        assert_eq!(moment(1_796_342_400_123, false), "2026-12-04T00:00:00Z");
        assert_eq!(moment(1_796_342_400_123, true), "2026-12-04T00:00:01Z");
        assert_eq!(moment(1_796_342_400_000, true), "2026-12-04T00:00:00Z");
        assert_eq!(COLUMNS.len(), 56);
    }
}
