//! OpenAI's organisation usage and cost answers, as the OpenAI API
//! reference documents them (`openai/openai-openapi`, `openapi.yaml`:
//! `UsageResponse`, `UsageTimeBucket`, `CostsResult`,
//! `UsageCompletionsResult`; paths `/organization/costs` and
//! `/organization/usage/completions`).
//!
//! - **Costs** (`GET /v1/organization/costs`): daily buckets (`start_time`
//!   in Unix seconds) of `organization.costs.result`: `amount.value` in
//!   `amount.currency` (lowercase ISO 4217, `usd`), and, as grouped,
//!   `line_item`, `project_id`, `api_key_id`, `quantity` with its
//!   `quantity_unit`. A cost result names no model, so the reconciliation
//!   sets it against the day's books ([`super::reconcile`]); a line item
//!   that names a kind of token (`input_tokens`, `output_tokens`, cached
//!   input) with a quantity in `tokens` or `1000_tokens` gives that kind's
//!   price.
//! - **Completions usage** (`GET /v1/organization/usage/completions`):
//!   buckets of `organization.usage.completions.result`: `input_tokens`
//!   (cached and cache writes included), `input_cached_tokens`,
//!   `output_tokens`, `num_model_requests`, and, as grouped, `model`,
//!   `project_id`, `batch`, `service_tier`. A batch result's tier is
//!   `batch`.

use super::json::{self, Start};
use super::{BadRow, BillLine, Figures, Format, Parsed, TokenKind};

/// The provider's name in the ledger.
pub const PROVIDER: &str = "openai";

/// The figures of a costs result (not part of its identity).
const COST_FIGURES: [&str; 2] = ["amount", "quantity"];

/// Read a Costs API answer.
pub fn costs(source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    json::each(source, bytes, Start::UnixSeconds, |r, keys| {
        object(r, "organization.costs.result")?;
        let value = r
            .get("amount.value")
            .ok_or_else(|| r.bad("amount.value", "missing; a cost result states its amount"))?;
        let cost = value
            .as_number()
            .and_then(|n| super::nano(&n.to_string()))
            .ok_or_else(|| {
                r.bad(
                    "amount.value",
                    format!("{value} is not an amount; a number of US dollars is accepted"),
                )
            })?;
        let currency = r.text("amount.currency")?.unwrap_or_default();
        if !currency.eq_ignore_ascii_case("usd") {
            return Err(r.bad(
                "amount.currency",
                format!("{currency:?}: the ledger books USD only; `usd` is accepted"),
            ));
        }
        let line_item = r.text("line_item")?;
        let (kind, quantity) = match (line_item.as_deref().and_then(kind_of), quantity(r)?) {
            (Some(k), Some(q)) => (Some(k), Some(q)),
            _ => (None, None),
        };
        Ok(BillLine {
            key: keys.key(Format::OpenaiCosts, &r.identity(&COST_FIGURES)),
            provider: PROVIDER.into(),
            scope: r.text("project_id")?,
            kind,
            quantity,
            description: line_item,
            figures: Figures::of_cost(cost),
            ..BillLine::default()
        })
    })
}

/// The figures of a completions usage result.
const USAGE_FIGURES: [&str; 0] = [];

/// Read a completions Usage API answer.
pub fn usage(source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    json::each(source, bytes, Start::UnixSeconds, |r, keys| {
        object(r, "organization.usage.completions.result")?;
        let batch = match r.get("batch") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| r.bad("batch", format!("{v} is not true, false or null")))?,
        };
        let tier = if batch {
            Some("batch".to_string())
        } else {
            r.text("service_tier")?
        };
        Ok(BillLine {
            key: keys.key(Format::OpenaiUsage, &r.identity(&USAGE_FIGURES)),
            provider: PROVIDER.into(),
            model: r.text("model")?,
            scope: r.text("project_id")?,
            tier,
            figures: Figures {
                tokens_in: Some(r.need_count("input_tokens")?),
                tokens_out: Some(r.need_count("output_tokens")?),
                tokens_cached: Some(r.count("input_cached_tokens")?.unwrap_or(0)),
                requests: Some(r.need_count("num_model_requests")?),
                ..Figures::default()
            },
            ..BillLine::default()
        })
    })
}

/// Refuse a result whose `object` is not `want` (another endpoint's
/// answer, or the wrong `--format`).
fn object(r: &json::Result<'_>, want: &str) -> Result<(), BadRow> {
    match r.text("object")? {
        Some(o) if o == want => Ok(()),
        other => Err(r.bad(
            "object",
            format!("{other:?}: this format reads {want:?} results only"),
        )),
    }
}

/// The kind of token a line item charges for, when it names one.
fn kind_of(line_item: &str) -> Option<TokenKind> {
    let l = line_item.to_ascii_lowercase();
    if l.contains("cached") || l.contains("cache read") {
        Some(TokenKind::Cached)
    } else if l.contains("cache write") || l.contains("cache_write") {
        Some(TokenKind::CacheWrite)
    } else if l.contains("input") {
        Some(TokenKind::Input)
    } else if l.contains("output") {
        Some(TokenKind::Output)
    } else {
        None
    }
}

/// A line item's quantity in tokens (`quantity_unit` `tokens` or
/// `1000_tokens`), when it has one.
fn quantity(r: &json::Result<'_>) -> Result<Option<i64>, BadRow> {
    let Some(q) = r.get("quantity") else {
        return Ok(None);
    };
    let shift = match r.text("quantity_unit")?.as_deref() {
        Some("tokens") => 0,
        Some("1000_tokens") => 3,
        _ => return Ok(None),
    };
    q.as_number()
        .and_then(|n| super::scaled(&n.to_string(), shift))
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(|| r.bad("quantity", format!("{q} is not a quantity of tokens >= 0")))
}
