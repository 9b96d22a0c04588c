//! Export in FOCUS 1.2 (the FinOps Open Cost and Usage Specification), as
//! CSV, one `Usage` row per request that reached a destination.
//!
//! | FOCUS column | from the ledger |
//! | --- | --- |
//! | `EffectiveCost`, `ContractedCost` | booked true marginal cost |
//! | `BilledCost` | booked cost where the tier bills per use (payg, spot, ondemand, reserved overage); 0 on owned or committed capacity, which is paid for up front |
//! | `ListCost` | the cheapest feasible pay-as-you-go list price for the same tokens (booked cost when none was feasible or the request was not served) |
//! | `PricingCategory` | `Standard` (payg, ondemand), `Dynamic` (spot), `Committed` (reserved), `Other` (inhouse) |
//! | `ChargePeriodStart`/`End` | request time to request time + latency (at least 1 ms) |
//! | `PricingQuantity`, `ConsumedQuantity` | input + output tokens (`Tokens`) |
//! | `ResourceId`, `ResourceName` | destination; `SkuId` the model served |
//! | `SubAccountId` | tenant |
//! | `CommitmentDiscountId`/`Status` | the reserved destination, `Used` |
//! | `x_Ace*` | event and request ids, destination, tier, SLO met, the four savings, forfeit reason, configuration |
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

use crate::money::usd;
use crate::report::Report;
use crate::row::Row;
use crate::split::Split;
use crate::store::Store;
use crate::time::{civil, rfc3339};
use crate::window::{self, Rules};
use ace_core::cost::Tier;
use std::io::Write;

/// The FOCUS version the export follows.
pub const FOCUS_VERSION: &str = "1.2";

/// The header row.
pub const COLUMNS: &[&str] = &[
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "CommitmentDiscountId",
    "CommitmentDiscountStatus",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "ResourceId",
    "ResourceName",
    "ServiceCategory",
    "ServiceName",
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

fn unit_price(cost: i64, quantity: i64) -> String {
    if quantity == 0 {
        return String::new();
    }
    format!("{:.15}", crate::money::usd_f64(cost) / quantity as f64)
}

/// Write every row with a destination as FOCUS CSV; returns the row count.
pub fn export(
    store: &mut dyn Store,
    report: &Report,
    rules: &Rules,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let verdicts = report.verdicts();
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
        let reserved = kind == Some(Tier::Reserved);
        let model = r.model_served.clone().unwrap_or_default();
        let tags = serde_json::json!({
            "tenant": r.tenant, "data_class": r.data_class, "latency_class": r.latency_class
        })
        .to_string();
        let cells: Vec<String> = vec![
            csv(&usd(billed)),
            csv("ace"),
            csv("ACE fleet"),
            csv("USD"),
            csv(&bps),
            csv(&bpe),
            csv("Usage"),
            String::new(),
            text(&format!("LLM request for {model} on {dest} ({tier})")),
            csv(&rfc3339(r.time_ms)),
            csv(&rfc3339(r.time_ms.saturating_add(r.latency_ms.max(1)))),
            if reserved { text(&dest) } else { String::new() },
            if reserved { csv("Used") } else { String::new() },
            csv(&qty.to_string()),
            csv("Tokens"),
            csv(&usd(r.booked)),
            csv(&unit_price(r.booked, qty)),
            csv(&usd(r.booked)),
            csv("ACE"),
            csv(&usd(list)),
            csv(&unit_price(list, qty)),
            csv(pricing),
            csv(&qty.to_string()),
            csv("Tokens"),
            csv("ACE"),
            csv("ACE"),
            String::new(),
            text(&dest),
            text(&dest),
            csv("AI and Machine Learning"),
            csv("LLM inference"),
            text(&model),
            String::new(),
            text(&key.0),
            text(&key.0),
            text(&tags),
            text(&r.event_id),
            text(r.request_id.as_deref().unwrap_or_default()),
            text(&dest),
            text(&tier),
            csv(&r.slo_met.map_or(String::new(), |m| m.to_string())),
            csv(&usd(split.utilisation)),
            csv(&usd(split.arbitrage)),
            csv(&usd(split.routing)),
            csv(&usd(split.caching)),
            csv(&forfeited.is_some().to_string()),
            text(&forfeited.unwrap_or_default()),
            text(&r.config),
        ];
        writeln!(out, "{}", cells.join(","))?;
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_is_its_calendar_month_and_every_column_is_written() {
        assert_eq!(month_bounds(1_796_342_400_000).1, "2027-01-01T00:00:00Z");
        assert_eq!(COLUMNS.len(), 48);
    }
}
