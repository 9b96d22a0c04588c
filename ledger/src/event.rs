//! One access-log line as the filter wrote it (`ace.event/2`, or the older
//! `ace.event/1`).
//!
//! The filter writes the line by hand for speed (see `ace-filter`'s
//! `event` module); here it is read back with serde into owned fields. The
//! key that makes ingest idempotent is the event's `event_id`, made by the
//! filter. `ace.event/1` lines have none, so their key is the first 32 hex
//! digits of the SHA-256 of the line's bytes: the same line ingested twice
//! is one event, and two requests never write the same line because each
//! carries Envoy's `x-request-id`.

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The schema this ledger reads in full.
pub const SCHEMA_V2: &str = "ace.event/2";
/// The older schema: no `event_id`, `config`, `warm`, `overage`,
/// `usage_capped` or `cached`.
pub const SCHEMA_V1: &str = "ace.event/1";

/// One request's event, as logged.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    /// [`SCHEMA_V2`] or [`SCHEMA_V1`].
    pub schema: String,
    /// 32 lowercase hex digits (v2); for v1, derived from the line.
    #[serde(default)]
    pub event_id: Option<String>,
    /// First 16 hex digits of the SHA-256 of the plugin configuration
    /// (v2); for v1, the configuration given at ingest.
    #[serde(default)]
    pub config: Option<String>,
    /// Envoy's `x-request-id`.
    pub request_id: Option<String>,
    /// Decision time, ms since the Unix epoch.
    pub time_ms: u64,
    /// `x-ace-tenant`.
    pub tenant: Option<String>,
    /// `x-ace-data-class`.
    pub data_class: Option<String>,
    /// `x-ace-latency-class`.
    pub latency_class: Option<String>,
    /// The model asked for.
    pub model_requested: Option<String>,
    /// The model that served it.
    pub model_served: Option<String>,
    /// The destination chosen (none when refused).
    pub destination: Option<String>,
    /// Its tier.
    pub tier: Option<String>,
    /// Input tokens (actual when the upstream reported usage).
    pub tokens_in: u32,
    /// Output tokens.
    pub tokens_out: u32,
    /// Whether the counts are estimates.
    pub tokens_estimated: bool,
    /// Status sent to the client (0 when none).
    pub status: u32,
    /// Time to response headers, ms.
    pub latency_ms: u64,
    /// The destination's SLO, ms.
    pub slo_ms: Option<u64>,
    /// Whether it held.
    pub slo_met: Option<bool>,
    /// The filter's marginal cost, USD (checked, never booked).
    pub marginal_usd: Option<f64>,
    /// The filter's counterfactual, USD (checked, never booked).
    pub counterfactual_usd: Option<f64>,
    /// Decision reason or refusal code.
    pub reason: String,
    /// Whether the model was resident (null when no destination).
    #[serde(default)]
    pub warm: Option<bool>,
    /// A reserved destination served past its cap at its overage price.
    #[serde(default)]
    pub overage: bool,
    /// The upstream reported more tokens than the request allowed.
    #[serde(default)]
    pub usage_capped: bool,
    /// Served from cache.
    #[serde(default)]
    pub cached: bool,
    /// A cache hit the filter checked against the upstream (reason
    /// `cache_check`) whose fresh answer differed: a false hit, which the
    /// window rule counts.
    #[serde(default)]
    pub cache_false_hit: bool,
}

/// Why a line is not an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// Not a JSON object at all (Envoy writes `-` when the filter set no
    /// event); counted and reported, never fatal.
    NotAnObject(String),
    /// A JSON object that is not a valid event of its schema.
    Invalid(String),
    /// A schema this ledger does not read: fatal, the fix is an upgrade.
    UnknownSchema(String),
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::NotAnObject(m) | LineError::Invalid(m) => f.write_str(m),
            LineError::UnknownSchema(s) => write!(
                f,
                "schema {s:?} is not one this ledger reads ({SCHEMA_V2}, {SCHEMA_V1}); \
                 ingest it with the `ace` built from the same release as the filter"
            ),
        }
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The ledger key of an `ace.event/1` line: 32 hex digits of its SHA-256.
pub fn line_key(line: &[u8]) -> String {
    let digest = Sha256::digest(line);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Parse one line (without its newline). A v1 line gets its key from the
/// line and `v1_config` as its configuration.
pub fn parse(line: &[u8], v1_config: Option<&str>) -> Result<Event, LineError> {
    let trimmed = line.trim_ascii();
    if trimmed.first() != Some(&b'{') {
        let shown = String::from_utf8_lossy(trimmed.get(..40).unwrap_or(trimmed)).into_owned();
        return Err(LineError::NotAnObject(format!(
            "not a JSON object ({shown:?}): Envoy logs `-` for a request that left no event, \
             e.g. one that never reached the ACE filter"
        )));
    }
    #[derive(Deserialize)]
    struct Head {
        schema: Option<String>,
    }
    let head: Head = serde_json::from_slice(trimmed)
        .map_err(|e| LineError::Invalid(format!("not valid JSON: {e}")))?;
    match head.schema.as_deref() {
        Some(SCHEMA_V2) | Some(SCHEMA_V1) => {}
        Some(other) => return Err(LineError::UnknownSchema(other.to_string())),
        None => {
            return Err(LineError::Invalid(
                "no `schema` field: not an ACE event line".to_string(),
            ))
        }
    }
    let mut e: Event = serde_json::from_slice(trimmed)
        .map_err(|e| LineError::Invalid(format!("field error: {e}")))?;
    if e.schema == SCHEMA_V1 {
        e.event_id = Some(line_key(trimmed));
        e.config = v1_config.map(str::to_string);
        return Ok(e);
    }
    match e.event_id.as_deref() {
        Some(id) if is_hex(id, 32) => {}
        other => {
            return Err(LineError::Invalid(format!(
                "field `event_id` is {other:?}; {SCHEMA_V2} needs 32 lowercase hex digits"
            )))
        }
    }
    match e.config.as_deref() {
        Some(id) if is_hex(id, 16) => {}
        other => {
            return Err(LineError::Invalid(format!(
                "field `config` is {other:?}; {SCHEMA_V2} needs 16 lowercase hex digits"
            )))
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2: &str = r#"{"schema":"ace.event/2","event_id":"0123456789abcdef0123456789abcdef","config":"0123456789abcdef","request_id":"r","time_ms":1,"tenant":"t","data_class":null,"latency_class":null,"model_requested":"m","model_served":"m","destination":"d","tier":"payg","tokens_in":1,"tokens_out":2,"tokens_estimated":false,"status":200,"latency_ms":3,"slo_ms":null,"slo_met":null,"marginal_usd":0.1,"counterfactual_usd":0.1,"reason":"cheapest","warm":true,"overage":false,"usage_capped":false,"cached":false}"#;

    #[test]
    fn reads_v2_and_v1_and_refuses_the_rest() {
        let e = parse(V2.as_bytes(), None).unwrap();
        assert_eq!(e.tokens_out, 2);
        assert_eq!(e.warm, Some(true));
        let v1 = V2.replace("ace.event/2", "ace.event/1");
        let e1 = parse(v1.as_bytes(), Some("feedfeedfeedfeed")).unwrap();
        assert_eq!(e1.event_id, Some(line_key(v1.as_bytes())));
        assert_eq!(e1.config.as_deref(), Some("feedfeedfeedfeed"));
        let v9 = V2.replace("ace.event/2", "ace.event/9");
        assert!(matches!(
            parse(v9.as_bytes(), None),
            Err(LineError::UnknownSchema(_))
        ));
        assert!(matches!(parse(b"-", None), Err(LineError::NotAnObject(_))));
        let bad = V2.replace("\"0123456789abcdef\"", "\"XYZ\"");
        assert!(parse(bad.as_bytes(), None)
            .unwrap_err()
            .to_string()
            .contains("`config`"));
    }
}
