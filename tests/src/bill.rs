//! A fake provider's bill: what it served ([`Served`]: the usage each of
//! its answers reported, per model and UTC day), charged at a
//! destination's configured per-token prices, in the provider's own
//! documented record. The shapes are those `ace ledger import-bill` reads,
//! each copied from the provider's documentation in the ledger's fixtures
//! (`ledger/tests/golden/bills/`, cited in its README):
//!
//! - [`Format::OpenaiUsage`]: OpenAI `GET /v1/organization/usage/completions`
//!   with `group_by=model`: a page of daily buckets (`start_time`,
//!   `end_time` in Unix seconds), a `organization.usage.completions.result`
//!   per model with `input_tokens` (cached included),
//!   `input_cached_tokens`, `output_tokens`, `num_model_requests`
//!   (`openapi.yaml`, `UsageCompletionsResult`);
//! - [`Format::OpenaiCosts`]: OpenAI `GET /v1/organization/costs`, not
//!   grouped: a `organization.costs.result` a day, `amount.value` in
//!   `usd` (`CostsResult`);
//! - [`Format::AnthropicUsage`]: Anthropic `GET
//!   /v1/organizations/usage_report/messages` with `group_by[]=model`:
//!   buckets (`starting_at`, `ending_at`, RFC 3339) of results with
//!   `uncached_input_tokens`, `cache_read_input_tokens`,
//!   `cache_creation.ephemeral_5m_input_tokens`, `output_tokens`;
//! - [`Format::AnthropicCost`]: Anthropic `GET /v1/organizations/cost_report`
//!   with `group_by[]=description`: a result per model and `token_type`,
//!   `amount` a decimal string in cents.
//!
//! Money: an uncached input token at `usd_per_input_token`, a cache read
//! at it times `cached_input_factor`, a cache write times
//! `cache_write_factor`, an output token at `usd_per_output_token`: the
//! destination's own figures ([`ace_config::Destination`]), so the books
//! and the bill price from one configuration.

use ace_config::Destination;
use ace_harness::provider::Served;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A provider's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenAI's completions usage answer.
    OpenaiUsage,
    /// OpenAI's costs answer.
    OpenaiCosts,
    /// Anthropic's Messages usage report.
    AnthropicUsage,
    /// Anthropic's cost report.
    AnthropicCost,
}

const DAY_MS: u64 = 86_400_000;

/// What a day's answers of one model add up to.
#[derive(Default)]
struct Day {
    requests: u64,
    uncached: u64,
    cached: u64,
    cache_write: u64,
    output: u64,
}

/// `served` summed per (UTC day, model).
fn days(served: &[Served]) -> BTreeMap<(u64, String), Day> {
    let mut out: BTreeMap<(u64, String), Day> = BTreeMap::new();
    for s in served {
        let d = out.entry((s.at_ms / DAY_MS, s.model.clone())).or_default();
        d.requests += 1;
        d.uncached += s.usage.uncached();
        d.cached += s.usage.cached;
        d.cache_write += s.usage.cache_write;
        d.output += s.usage.output;
    }
    out
}

/// What each kind of token of `d` costs at `dest`'s prices, USD: uncached
/// input, cache reads, cache writes, output.
fn costs(d: &Day, dest: &Destination) -> [f64; 4] {
    let (read, write) = dest.cache_factors();
    let input = dest.usd_per_input_token;
    [
        d.uncached as f64 * input,
        d.cached as f64 * input * read,
        d.cache_write as f64 * input * write,
        d.output as f64 * dest.usd_per_output_token,
    ]
}

/// The bill, in `format`, for `served`, at `dest`'s prices.
pub fn write(format: Format, served: &[Served], dest: &Destination) -> String {
    let days = days(served);
    match format {
        Format::OpenaiUsage => openai_page(&days, |model, d| {
            vec![json!({
                "object": "organization.usage.completions.result",
                "input_tokens": d.uncached + d.cached + d.cache_write,
                "input_cached_tokens": d.cached,
                "input_cache_write_tokens": d.cache_write,
                "input_uncached_tokens": d.uncached,
                "output_tokens": d.output,
                "input_text_tokens": d.uncached + d.cached + d.cache_write,
                "output_text_tokens": d.output,
                "input_cached_text_tokens": d.cached,
                "input_audio_tokens": 0,
                "input_cached_audio_tokens": 0,
                "output_audio_tokens": 0,
                "input_image_tokens": 0,
                "input_cached_image_tokens": 0,
                "output_image_tokens": 0,
                "num_model_requests": d.requests,
                "project_id": null,
                "user_id": null,
                "api_key_id": null,
                "model": model,
                "batch": false,
                "service_tier": "default"
            })]
        }),
        Format::OpenaiCosts => {
            // Not grouped: one result a day, every model's cost in it.
            let mut total: BTreeMap<u64, Day> = BTreeMap::new();
            for ((day, _), d) in &days {
                let t = total.entry(*day).or_default();
                t.uncached += d.uncached;
                t.cached += d.cached;
                t.cache_write += d.cache_write;
                t.output += d.output;
            }
            let per_day = total
                .into_iter()
                .map(|(day, d)| ((day, String::new()), d))
                .collect();
            openai_page(&per_day, |_, d| {
                vec![json!({
                    "object": "organization.costs.result",
                    "amount": {"value": costs(d, dest).iter().sum::<f64>(), "currency": "usd"},
                    "line_item": null,
                    "project_id": null,
                    "api_key_id": null,
                    "quantity": null,
                    "quantity_unit": null
                })]
            })
        }
        Format::AnthropicUsage => anthropic_report(&days, |model, d| {
            vec![json!({
                "uncached_input_tokens": d.uncached,
                "cache_creation": {
                    "ephemeral_1h_input_tokens": 0,
                    "ephemeral_5m_input_tokens": d.cache_write
                },
                "cache_read_input_tokens": d.cached,
                "output_tokens": d.output,
                "server_tool_use": {"web_search_requests": 0},
                "api_key_id": null,
                "workspace_id": null,
                "model": model,
                "service_tier": "standard",
                "context_window": "0-200k"
            })]
        }),
        Format::AnthropicCost => anthropic_report(&days, |model, d| {
            let kinds = [
                "uncached_input_tokens",
                "cache_read_input_tokens",
                "cache_creation.ephemeral_5m_input_tokens",
                "output_tokens",
            ];
            kinds
                .iter()
                .zip(costs(d, dest))
                .map(|(kind, usd)| {
                    json!({
                        "currency": "USD",
                        // Cents, as a decimal string.
                        "amount": format!("{}", usd * 100.0),
                        "workspace_id": null,
                        "description": format!("{model} Usage - {kind}"),
                        "cost_type": "tokens",
                        "context_window": "0-200k",
                        "model": model,
                        "service_tier": "standard",
                        "token_type": kind
                    })
                })
                .collect()
        }),
    }
}

/// The record's buckets: a day a bucket, `bucket(start ms, results)`,
/// the day's results from `results` (model, figures).
fn buckets(
    days: &BTreeMap<(u64, String), Day>,
    results: impl Fn(&str, &Day) -> Vec<Value>,
    bucket: impl Fn(u64, Vec<Value>) -> Value,
) -> Vec<Value> {
    let mut out: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    for ((day, model), d) in days {
        out.entry(*day).or_default().extend(results(model, d));
    }
    out.into_iter()
        .map(|(day, results)| bucket(day * DAY_MS, results))
        .collect()
}

/// An OpenAI page of daily buckets (Unix seconds).
fn openai_page(
    days: &BTreeMap<(u64, String), Day>,
    results: impl Fn(&str, &Day) -> Vec<Value>,
) -> String {
    let data = buckets(days, results, |ms, results| {
        json!({"object": "bucket", "start_time": ms / 1000,
               "end_time": (ms + DAY_MS) / 1000, "results": results})
    });
    json!({"object": "page", "data": data, "has_more": false, "next_page": null}).to_string()
}

/// An Anthropic report of daily buckets (RFC 3339).
fn anthropic_report(
    days: &BTreeMap<(u64, String), Day>,
    results: impl Fn(&str, &Day) -> Vec<Value>,
) -> String {
    let data = buckets(days, results, |ms, results| {
        json!({"starting_at": ace_config::budget::rfc3339(ms),
               "ending_at": ace_config::budget::rfc3339(ms + DAY_MS), "results": results})
    });
    json!({"data": data, "has_more": false, "next_page": null}).to_string()
}
