//! Anthropic's Usage & Cost Admin API answers, as its API reference
//! documents them (platform.claude.com, "Usage and Cost API" and the
//! admin API reference: "Get Messages Usage Report", "Get Cost Report").
//!
//! - **Messages usage** (`GET /v1/organizations/usage_report/messages`):
//!   buckets (`starting_at`, `ending_at`, RFC 3339) of results with
//!   `uncached_input_tokens`, `cache_read_input_tokens`,
//!   `cache_creation.ephemeral_5m_input_tokens` and
//!   `cache_creation.ephemeral_1h_input_tokens`, `output_tokens`,
//!   `server_tool_use.web_search_requests`, and, as grouped, `model`,
//!   `workspace_id`, `api_key_id`, `service_tier`, `context_window`. The
//!   input the ledger compares is all four input counts together (what a
//!   Messages answer's usage adds up to); the report counts no requests.
//! - **Cost** (`GET /v1/organizations/cost_report`): daily buckets of
//!   results with `amount`, a decimal string in the currency's lowest
//!   unit (`"123.45"` USD is USD 1.2345), `currency` (`USD`), and, as
//!   grouped, `workspace_id`, `description`, `cost_type` (`tokens`,
//!   `web_search`, `code_execution`), `model`, `service_tier`,
//!   `context_window`, `token_type` (`uncached_input_tokens`,
//!   `output_tokens`, `cache_read_input_tokens`,
//!   `cache_creation.ephemeral_5m_input_tokens`, ...). Priority Tier
//!   costs are not in it (Anthropic bills them otherwise).

use super::json::{self, Start};
use super::{BillLine, Figures, Format, Parsed, TokenKind};

/// The provider's name in the ledger.
pub const PROVIDER: &str = "anthropic";

/// Read a Messages Usage Report answer.
pub fn usage(source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    json::each(source, bytes, Start::Rfc3339, |r, keys| {
        let uncached = r.need_count("uncached_input_tokens")?;
        let read = r.count("cache_read_input_tokens")?.unwrap_or(0);
        let write = r
            .count("cache_creation.ephemeral_5m_input_tokens")?
            .unwrap_or(0)
            .saturating_add(
                r.count("cache_creation.ephemeral_1h_input_tokens")?
                    .unwrap_or(0),
            );
        Ok(BillLine {
            key: keys.key(Format::AnthropicUsage, &r.identity(&[])),
            provider: PROVIDER.into(),
            model: r.text("model")?,
            scope: r.text("workspace_id")?,
            tier: r.text("service_tier")?,
            figures: Figures {
                tokens_in: Some(uncached.saturating_add(read).saturating_add(write)),
                tokens_out: Some(r.need_count("output_tokens")?),
                tokens_cached: Some(read),
                ..Figures::default()
            },
            ..BillLine::default()
        })
    })
}

/// Read a Cost Report answer.
pub fn cost(source: &str, bytes: &[u8]) -> anyhow::Result<Parsed> {
    json::each(source, bytes, Start::Rfc3339, |r, keys| {
        let amount = r
            .text("amount")?
            .ok_or_else(|| r.bad("amount", "missing; a cost result states its amount"))?;
        let cost = super::scaled(&amount, 7).ok_or_else(|| {
            r.bad(
                "amount",
                format!(
                    "{amount:?} is not an amount; a decimal string in cents (\"123.45\" is USD \
                     1.2345) is accepted"
                ),
            )
        })?;
        let currency = r.text("currency")?.unwrap_or_default();
        if currency != "USD" {
            return Err(r.bad(
                "currency",
                format!("{currency:?}: the ledger books USD only; `USD` is accepted"),
            ));
        }
        let token_type = r.text("token_type")?;
        let kind = token_type.as_deref().map(|t| match t {
            "uncached_input_tokens" => Ok(TokenKind::Input),
            "output_tokens" => Ok(TokenKind::Output),
            "cache_read_input_tokens" => Ok(TokenKind::Cached),
            t if t.starts_with("cache_creation") => Ok(TokenKind::CacheWrite),
            t => Err(r.bad(
                "token_type",
                format!(
                    "{t:?}: uncached_input_tokens, output_tokens, cache_read_input_tokens or \
                     cache_creation.* is accepted"
                ),
            )),
        });
        Ok(BillLine {
            key: keys.key(Format::AnthropicCost, &r.identity(&["amount"])),
            provider: PROVIDER.into(),
            model: r.text("model")?,
            scope: r.text("workspace_id")?,
            kind: kind.transpose()?,
            tier: r.text("service_tier")?,
            description: r.text("description")?.or(r.text("cost_type")?),
            figures: Figures::of_cost(cost),
            ..BillLine::default()
        })
    })
}
