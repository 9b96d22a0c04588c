//! Prices: per-token list prices from a LiteLLM-format price file, and
//! GPU-hour prices from a feed of timestamped changes.
//!
//! **Per-token** (`--prices`): the format of LiteLLM's
//! `model_prices_and_context_window.json`, an object keyed by model name
//! (some keys carry a provider prefix, `mistral/mistral-small`), whose
//! entries give `input_cost_per_token` and `output_cost_per_token` in USD.
//! A destination's `price_key` is looked up as written; a key with a
//! provider prefix (`groq/gpt-4o`) then finds the entry without it, or the
//! one key ending in it, only when that entry's own `litellm_provider`
//! is the key's provider, as LiteLLM itself matches them: `groq/gpt-4o`
//! never gets OpenAI's `gpt-4o` price, nor `mistral/mistral-large` a
//! reseller's `vercel_ai_gateway/mistral/mistral-large`. A key without a
//! prefix finds the one key that is it with a provider prefix (`gpt-4o`
//! finds `openai/gpt-4o` when no other provider lists it; when several
//! do, the error lists them). LiteLLM's file has carried prices as strings; a string
//! that parses as a number (`"2.5e-06"`) is accepted as that number, any
//! other string is refused, naming the key and field. Only the entries a
//! destination names are read, so the thousands of others (and LiteLLM's
//! `sample_spec`) never stop the service.
//!
//! **GPU-hour** (`--gpu-prices`, a file or an http(s) URL):
//!
//! ```json
//! {"prices": [
//!   {"key": "aws/us-east-1/p5.48xlarge/spot", "usd_per_gpu_hour": 3.1, "from": "2026-12-05T10:00:00Z"},
//!   {"key": "aws/us-east-1/p5.48xlarge/spot", "usd_per_gpu_hour": 2.7, "from": "2026-12-05T14:00:00Z"}
//! ]}
//! ```
//!
//! For each key, the latest change whose `from` is at or before now
//! applies (a change dated in the future takes effect at its time, without
//! a re-read); a key with no change yet has no price. A destination's
//! hourly price is its key's per-GPU price times its `cost.gpus`.

use ace_snapshot::{Price, MAX_USD_PER_HOUR, MAX_USD_PER_TOKEN};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// A LiteLLM-format price table.
#[derive(Clone, Debug, Default)]
pub struct TokenPrices(Map<String, Value>);

impl TokenPrices {
    /// The table in `body`.
    pub fn parse(body: &[u8]) -> Result<TokenPrices, String> {
        match serde_json::from_slice(body) {
            Ok(Value::Object(map)) => Ok(TokenPrices(map)),
            Ok(_) => Err(
                "not a LiteLLM price file: the top level must be an object keyed by model name"
                    .into(),
            ),
            Err(e) => Err(format!("not valid JSON: {e}")),
        }
    }

    /// The per-token prices under `key`: the entry of that name; else, for
    /// a key with a provider prefix (`groq/gpt-4o`), the entry without it
    /// or the one key ending in it, but only when that entry's
    /// `litellm_provider` is the key's provider (LiteLLM's own rule,
    /// `_check_provider_match` in `litellm/utils.py`, with its allowances
    /// for `vertex_ai*`, `fireworks_ai*`, `bedrock*` and `azure_ai`); else,
    /// for a key without one, the one entry that is it with a provider
    /// prefix. An entry with no `litellm_provider` matches any provider.
    pub fn price(&self, key: &str) -> Result<Price, String> {
        let wanted = key.split_once('/');
        fn provider_of(e: &Value) -> Option<&str> {
            e.get("litellm_provider").and_then(Value::as_str)
        }
        let (found, entry) = match self.0.get(key) {
            Some(e) => (key, e),
            None => {
                let suffix = format!("/{key}");
                let mut near: Vec<(&str, &Value)> = Vec::new();
                if let Some((_, rest)) = wanted {
                    if let Some(e) = self.0.get(rest) {
                        near.push((rest, e));
                    }
                }
                near.extend(
                    self.0
                        .iter()
                        .filter(|(k, _)| k.ends_with(&suffix))
                        .map(|(k, e)| (k.as_str(), e)),
                );
                // A provider named in the key must be the entry's own.
                let (fits, others): (Vec<_>, Vec<_>) =
                    near.into_iter().partition(|(_, e)| match wanted {
                        Some((p, _)) => provider_matches(provider_of(e), p),
                        None => true,
                    });
                match fits[..] {
                    [(k, e)] => (k, e),
                    [] => {
                        let Some((p, _)) = wanted else {
                            return Err(format!("no entry `{key}` in the price file"));
                        };
                        return Err(match others.first() {
                            None => format!("no entry `{key}` in the price file"),
                            Some((k, e)) => format!(
                                "no entry `{key}` in the price file; `{k}` is provider `{}`'s, not `{p}`'s: name an entry of `{p}`'s in `price_key`",
                                provider_of(e).unwrap_or("?")
                            ),
                        });
                    }
                    _ => {
                        let names: Vec<&str> = fits.iter().take(4).map(|(k, _)| *k).collect();
                        return Err(format!(
                            "no entry `{key}` in the price file, and several with a provider prefix (`{}`): name one in `price_key`",
                            names.join("`, `")
                        ));
                    }
                }
            }
        };
        let field = |name: &str| -> Result<f64, String> {
            let v = entry
                .get(name)
                .ok_or_else(|| format!("entry `{found}` has no `{name}`"))?;
            let x = match v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse::<f64>().ok(),
                _ => None,
            }
            .ok_or_else(|| format!("entry `{found}`, `{name}` is {v}, not a number"))?;
            if !(x.is_finite() && (0.0..=MAX_USD_PER_TOKEN).contains(&x)) {
                return Err(format!(
                    "entry `{found}`, `{name}` is {x}: a price is USD per token from 0 to {MAX_USD_PER_TOKEN}"
                ));
            }
            Ok(x)
        };
        Ok(Price {
            usd_per_input_token: field("input_cost_per_token")?,
            usd_per_output_token: field("output_cost_per_token")?,
        })
    }
}

/// Whether an entry of provider `entry` (its `litellm_provider`; `None`:
/// no constraint) may price a key of provider `wanted`, as LiteLLM's
/// `_check_provider_match` (litellm 1.110.2, `litellm/utils.py`) decides.
fn provider_matches(entry: Option<&str>, wanted: &str) -> bool {
    let Some(e) = entry else {
        return true;
    };
    e == wanted
        || (wanted == "vertex_ai" && e.starts_with("vertex_ai"))
        || (wanted == "fireworks_ai" && e.starts_with("fireworks_ai"))
        || (wanted.starts_with("bedrock") && e.starts_with("bedrock"))
        || (wanted == "azure_ai" && (e == "azure" || e == "openai"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeedFile {
    prices: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    key: String,
    usd_per_gpu_hour: f64,
    from: String,
}

/// A GPU price feed: per key, its changes in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuPrices(HashMap<String, Vec<(u64, f64)>>);

impl GpuPrices {
    /// The feed in `body`; an error names the change and field.
    pub fn parse(body: &[u8]) -> Result<GpuPrices, String> {
        let file: FeedFile = serde_json::from_slice(body).map_err(|e| {
            format!("not a GPU price feed (`{{\"prices\":[{{\"key\",\"usd_per_gpu_hour\",\"from\"}}]}}`): {e}")
        })?;
        let mut by_key: HashMap<String, Vec<(u64, f64)>> = HashMap::new();
        for (i, v) in file.prices.into_iter().enumerate() {
            let c: Change = serde_json::from_value(v).map_err(|e| format!("`prices[{i}]`: {e}"))?;
            if c.key.is_empty() {
                return Err(format!("`prices[{i}].key` is empty"));
            }
            let p = c.usd_per_gpu_hour;
            if !(p.is_finite() && (0.0..=MAX_USD_PER_HOUR).contains(&p)) {
                return Err(format!(
                    "`prices[{i}].usd_per_gpu_hour` is {p}: give USD per GPU-hour from 0 to {MAX_USD_PER_HOUR}"
                ));
            }
            let from =
                crate::rfc3339_ms(&c.from).map_err(|e| format!("`prices[{i}].from`: {e}"))?;
            by_key.entry(c.key).or_default().push((from, p));
        }
        for v in by_key.values_mut() {
            // Stable: of two changes at one instant, the later listed wins.
            v.sort_by_key(|&(t, _)| t);
        }
        Ok(GpuPrices(by_key))
    }

    /// Whether the feed has any change for `key`.
    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// The per-GPU price of `key` at `now_ms`: the latest change at or
    /// before it.
    pub fn at(&self, key: &str, now_ms: u64) -> Option<f64> {
        let v = self.0.get(key)?;
        let n = v.partition_point(|&(t, _)| t <= now_ms);
        n.checked_sub(1)
            .and_then(|i| v.get(i))
            .map(|(_, price)| *price)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn litellm_keys_prefixes_and_numeric_strings() {
        let t = TokenPrices::parse(
            br#"{"sample_spec":{"input_cost_per_token":"set this"},
                "gpt-4o":{"input_cost_per_token":2.5e-06,"output_cost_per_token":1e-05,"litellm_provider":"openai"},
                "mistral/mistral-small":{"input_cost_per_token":"1e-06","output_cost_per_token":" 3e-06 "},
                "odd":{"input_cost_per_token":"cheap","output_cost_per_token":0},
                "huge":{"input_cost_per_token":1,"output_cost_per_token":0}}"#,
        )
        .unwrap();
        assert_eq!(t.price("gpt-4o").unwrap().usd_per_input_token, 2.5e-6);
        assert_eq!(t.price("openai/gpt-4o").unwrap().usd_per_output_token, 1e-5);
        assert_eq!(
            t.price("mistral/mistral-small")
                .unwrap()
                .usd_per_output_token,
            3e-6
        );
        assert_eq!(t.price("mistral-small").unwrap().usd_per_input_token, 1e-6);
        let two = TokenPrices::parse(
            br#"{"a/m":{"input_cost_per_token":0,"output_cost_per_token":0},
                 "b/m":{"input_cost_per_token":0,"output_cost_per_token":0}}"#,
        )
        .unwrap();
        let e = two.price("m").unwrap_err();
        assert!(
            e.contains("several with a provider prefix (`a/m`, `b/m`)"),
            "{e}"
        );
        assert!(two.price("x").unwrap_err().contains("no entry `x`"));
        let e = t.price("odd").unwrap_err();
        assert!(e.contains("`input_cost_per_token` is \"cheap\""), "{e}");
        assert!(t.price("huge").unwrap_err().contains("from 0 to"));
        assert!(TokenPrices::parse(b"[1]").is_err());
    }

    #[test]
    fn a_provider_named_in_the_key_must_be_the_entrys_own() {
        // Entries copied from litellm 1.110.2's price file
        // (tests/fixtures/README.md).
        let t = TokenPrices::parse(fixture!("litellm-prices.json").as_bytes()).unwrap();
        // A reseller's entry ending in the key is not Mistral's own.
        let e = t.price("mistral/mistral-large").unwrap_err();
        assert!(
            e.contains("`vercel_ai_gateway/mistral/mistral-large` is provider `vercel_ai_gateway`'s, not `mistral`'s"),
            "{e}"
        );
        // OpenAI's `gpt-4o` is not Groq's.
        let e = t.price("groq/gpt-4o").unwrap_err();
        assert!(
            e.contains("`gpt-4o` is provider `openai`'s, not `groq`'s"),
            "{e}"
        );
        // The provider's own entries are found, with or without a prefix.
        assert_eq!(
            t.price("openai/gpt-4o").unwrap().usd_per_input_token,
            2.5e-6
        );
        assert_eq!(t.price("gpt-4o").unwrap().usd_per_input_token, 2.5e-6);
        assert_eq!(
            t.price("azure/eu/gpt-4o").unwrap().usd_per_input_token,
            2.75e-6
        );
        assert_eq!(
            t.price("mistral/mistral-large-latest")
                .unwrap()
                .usd_per_output_token,
            1.5e-6
        );
        // LiteLLM's allowance: Azure AI serves Azure's and OpenAI's models.
        assert_eq!(
            t.price("azure_ai/gpt-4o").unwrap().usd_per_input_token,
            2.5e-6
        );
        // An entry without prices is named.
        let e = t.price("snowflake/mistral-large").unwrap_err();
        assert!(e.contains("has no `input_cost_per_token`"), "{e}");
    }

    #[test]
    fn the_latest_change_at_or_before_now_applies() {
        let f = GpuPrices::parse(
            br#"{"prices":[
              {"key":"k","usd_per_gpu_hour":2.7,"from":"2026-12-05T14:00:00Z"},
              {"key":"k","usd_per_gpu_hour":3.1,"from":"2026-12-05T10:00:00Z"}]}"#,
        )
        .unwrap();
        let ten = crate::rfc3339_ms("2026-12-05T10:00:00Z").unwrap();
        let two = crate::rfc3339_ms("2026-12-05T14:00:00Z").unwrap();
        assert_eq!(f.at("k", ten - 1), None);
        assert_eq!(f.at("k", ten), Some(3.1));
        assert_eq!(f.at("k", two - 1), Some(3.1));
        assert_eq!(f.at("k", two + 5), Some(2.7));
        assert_eq!(f.at("other", two), None);
    }

    #[test]
    fn a_bad_change_is_named() {
        for (body, want) in [
            (
                r#"{"prices":[{"key":"k","usd_per_gpu_hour":-1,"from":"2026-12-05T10:00:00Z"}]}"#,
                "prices[0].usd_per_gpu_hour",
            ),
            (
                r#"{"prices":[{"key":"k","usd_per_gpu_hour":1,"from":"2026-12-05T10:00:00Z"},{"key":"k","usd_per_gpu_hour":1,"from":"yesterday"}]}"#,
                "prices[1].from",
            ),
            (
                r#"{"prices":[{"key":"k","usd_per_gpu_hour":"1","from":"2026-12-05T10:00:00Z"}]}"#,
                "prices[0]",
            ),
            (r#"{"price":[]}"#, "not a GPU price feed"),
        ] {
            let e = GpuPrices::parse(body.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
    }
}
