//! Reading an OpenAI-compatible request body.
//!
//! The filter may need the body's `model`, its output budget
//! (`max_completion_tokens` / `max_tokens`, or the Responses API's
//! `max_output_tokens`) and whether it streams. It buffers
//! at most the configured bound and parses once with `serde_json`, which
//! rejects malformed input with an error instead of panicking; unknown fields
//! are skipped without being stored. The input-token estimate is the
//! prompt's size in bytes over four (a standard rule of thumb for English
//! BPE tokenizers), taken from the body length. Usage in responses is the
//! [`crate::usage`] module's.

use crate::prefix::Messages;
use crate::tokens::estimate_tokens;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What the filter takes from a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestBody {
    /// The `model` field.
    pub model: Option<String>,
    /// `max_completion_tokens`, else `max_tokens`, else the Responses
    /// API's `max_output_tokens`: the most output the request allows.
    pub max_output_tokens: Option<u32>,
    /// The `stream` field.
    pub stream: bool,
    /// Whether the body has a `stream_options` member (then ACE never
    /// adds one: the client chose).
    pub stream_options: bool,
    /// Estimated input tokens.
    pub tokens_in: u32,
    /// Safe to answer from a cache: deterministic sampling (`temperature`
    /// 0, at most one choice) and no `tools` or `functions`.
    pub cacheable: bool,
    /// The prompt's fingerprint, for prefix locality ([`crate::prefix`]).
    pub prefix: crate::prefix::Fingerprint,
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    max_tokens: Option<serde_json::Value>,
    #[serde(default)]
    max_completion_tokens: Option<serde_json::Value>,
    /// The Responses API's output bound.
    #[serde(default)]
    max_output_tokens: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
    /// Present whatever its value (`null` included).
    #[serde(default, deserialize_with = "present")]
    stream_options: Option<()>,
    #[serde(default)]
    temperature: Option<serde_json::Value>,
    #[serde(default)]
    n: Option<serde_json::Value>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(default)]
    functions: Option<serde::de::IgnoredAny>,
    /// The prompt: chat messages, the Responses API's `input`, or a
    /// completion's `prompt` (chained as parsed).
    #[serde(default)]
    messages: Option<Messages>,
    #[serde(default)]
    input: Option<Messages>,
    #[serde(default)]
    prompt: Option<Messages>,
    /// Session hints.
    #[serde(borrow, default)]
    prompt_cache_key: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
}

/// `Some` for a member that is there, whatever its value.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| Some(()))
}

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// What is wrong, for the client.
    pub message: String,
    /// The body was larger than the filter reads: what it says past that
    /// bound is unknown.
    pub too_large: bool,
}

impl BodyError {
    fn new(message: String) -> BodyError {
        BodyError {
            message,
            too_large: false,
        }
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

fn token_count(v: &Option<serde_json::Value>, field: &str) -> Result<Option<u32>, BodyError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .map(|n| Some(n.min(u64::from(u32::MAX)) as u32))
            .ok_or_else(|| BodyError::new(format!("`{field}` must be a non-negative integer"))),
        Some(_) => Err(BodyError::new(format!(
            "`{field}` must be a non-negative integer"
        ))),
    }
}

/// Parse a request body. `total_len` is the whole body's size (the bytes
/// given may be a prefix if the body was larger than the bound: then only
/// the estimate is used and the error says so).
pub fn scan_request(bytes: &[u8], total_len: usize) -> Result<RequestBody, BodyError> {
    if bytes.len() < total_len {
        return Err(BodyError {
            message: format!(
                "the body is {total_len} bytes, more than the {} the filter reads; raise body.max_bytes (and Envoy's buffer limit) to send bodies this large",
                bytes.len()
            ),
            too_large: true,
        });
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BodyError::new(
            "the request body is not a JSON object; expected an OpenAI-style request".into(),
        ));
    }
    let wire: Wire<'_> = serde_json::from_slice(bytes).map_err(|e| {
        BodyError::new(format!(
            "the request body is not the JSON object expected: {e}"
        ))
    })?;
    let completion = token_count(&wire.max_completion_tokens, "max_completion_tokens")?;
    let max = token_count(&wire.max_tokens, "max_tokens")?;
    let responses = token_count(&wire.max_output_tokens, "max_output_tokens")?;
    // Anything else (absent, another number, not a number) may sample.
    let cacheable = wire.temperature.as_ref().and_then(|t| t.as_f64()) == Some(0.0)
        && wire.n.as_ref().map_or(Some(1), |n| n.as_u64()) == Some(1)
        && wire.tools.is_none()
        && wire.functions.is_none();
    Ok(RequestBody {
        model: wire.model.map(|m| m.into_owned()),
        max_output_tokens: completion.or(max).or(responses),
        stream: wire.stream.unwrap_or(false),
        stream_options: wire.stream_options.is_some(),
        tokens_in: estimate_tokens(total_len),
        cacheable,
        prefix: crate::prefix::fingerprint(
            wire.messages.or(wire.input).or(wire.prompt),
            wire.tools.map_or(0, crate::prefix::tools_hash),
            wire.prompt_cache_key
                .or(wire.user)
                .map_or(0, crate::prefix::hint_hash),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_it_needs() {
        let b = br#"{"model":"llama-3.1-70b","messages":[{"role":"user","content":"hi"}],"max_tokens":300,"stream":true}"#;
        let r = scan_request(b, b.len()).map_err(|e| e.message);
        assert_eq!(
            r,
            Ok(RequestBody {
                model: Some("llama-3.1-70b".into()),
                max_output_tokens: Some(300),
                stream: true,
                stream_options: false,
                tokens_in: (b.len() / 4) as u32,
                cacheable: false,
                prefix: r.as_ref().map(|r| r.prefix).unwrap_or_default(),
            })
        );
        let cacheable = |b: &[u8]| scan_request(b, b.len()).map(|r| r.cacheable);
        assert_eq!(cacheable(br#"{"model":"m","temperature":0}"#), Ok(true));
        assert_eq!(
            cacheable(br#"{"model":"m","temperature":0.0,"n":1}"#),
            Ok(true)
        );
        for not in [
            &br#"{"model":"m"}"#[..],
            br#"{"model":"m","temperature":0.2}"#,
            br#"{"model":"m","temperature":0,"n":2}"#,
            br#"{"model":"m","temperature":0,"tools":[]}"#,
            br#"{"model":"m","temperature":0,"functions":[{"name":"f"}]}"#,
        ] {
            assert_eq!(
                cacheable(not),
                Ok(false),
                "{}",
                String::from_utf8_lossy(not)
            );
        }
        let b = br#"{"model":"m","max_tokens":10,"max_completion_tokens":20}"#;
        assert_eq!(
            scan_request(b, b.len()).map(|r| r.max_output_tokens),
            Ok(Some(20))
        );
        // The Responses API names its bound `max_output_tokens`.
        let b = br#"{"model":"m","input":"Hello!","stream":true,"max_output_tokens":64}"#;
        assert_eq!(
            scan_request(b, b.len()).map(|r| r.max_output_tokens),
            Ok(Some(64))
        );
        let b = br#"{"model":"a\"b\u00e9"}"#;
        assert_eq!(
            scan_request(b, b.len()).map(|r| r.model),
            Ok(Some("a\"bé".into()))
        );
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        for b in [
            &b""[..],
            b"[]",
            b"{",
            b"{\"model\":7}",
            b"{\"max_tokens\":-1}",
            b"{\"max_tokens\":\"x\"}",
            b"{\"max_output_tokens\":-64}",
            b"\xff\xfe",
        ] {
            assert!(scan_request(b, b.len()).is_err(), "{b:?}");
        }
        assert!(scan_request(b"{}", 10).is_err(), "truncated");
    }
}
