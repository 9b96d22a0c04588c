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
//!
//! A line is hostile input: whatever wrote the log can write anything. So
//! text is made storable here, once, for both stores (a NUL, which
//! PostgreSQL's `TEXT` cannot hold, becomes the six characters `\u0000`;
//! bytes that are not UTF-8 become `\xNN`), and times and latencies
//! outside a sane range are refused with the field named, because every
//! later report adds and subtracts them.

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The earliest `time_ms` booked: 2000-01-01T00:00:00Z. ACE did not
/// exist before; a smaller time (0, a clock never set) would stretch a
/// report's period, and with it every owned pool's charge, over decades.
pub const MIN_TIME_MS: u64 = 946_684_800_000;
/// The latest `time_ms` booked, exclusive: 2100-01-01T00:00:00Z. A fixed
/// bound (not "now"), so the same line is booked or refused the same way
/// on every ingest.
pub const MAX_TIME_MS: u64 = 4_102_444_800_000;
/// The longest `latency_ms` (and `slo_ms`) booked: one day. Latencies are
/// summed per pool, so an absurd one would claim a pool busy for ages.
pub const MAX_LATENCY_MS: u64 = 86_400_000;

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

/// `s` as text both stores hold: each NUL becomes `\u0000` (as the JSON
/// line spelled it).
pub fn storable(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\\u0000");
    }
}

/// `line` with every byte that is not part of valid UTF-8 spelled `\\xNN`
/// (a JSON escape of the backslash, so the string reads back as `\xNN`),
/// or `None` when it is valid UTF-8 already.
fn escape_invalid_utf8(line: &[u8]) -> Option<Vec<u8>> {
    if std::str::from_utf8(line).is_ok() {
        return None;
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    for chunk in line.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        for b in chunk.invalid() {
            out.extend_from_slice(format!("\\\\x{b:02x}").as_bytes());
        }
    }
    Some(out)
}

impl Event {
    /// Every optional text field, to make them storable at once.
    fn optional_texts(&mut self) -> [&mut Option<String>; 10] {
        [
            &mut self.event_id,
            &mut self.config,
            &mut self.request_id,
            &mut self.tenant,
            &mut self.data_class,
            &mut self.latency_class,
            &mut self.model_requested,
            &mut self.model_served,
            &mut self.destination,
            &mut self.tier,
        ]
    }

    /// Refuse a time or latency outside the bounds, naming the field.
    fn check_ranges(&self) -> Result<(), LineError> {
        if !(MIN_TIME_MS..MAX_TIME_MS).contains(&self.time_ms) {
            return Err(LineError::Invalid(format!(
                "field `time_ms` is {}, outside the times the ledger books \
                 ({MIN_TIME_MS}..{MAX_TIME_MS}: 2000-01-01 to 2100-01-01 UTC, in ms since the \
                 epoch); the writer's clock or the line is wrong",
                self.time_ms
            )));
        }
        for (name, v) in [
            ("latency_ms", Some(self.latency_ms)),
            ("slo_ms", self.slo_ms),
        ] {
            if let Some(v) = v.filter(|v| *v > MAX_LATENCY_MS) {
                return Err(LineError::Invalid(format!(
                    "field `{name}` is {v}, more than the ledger books ({MAX_LATENCY_MS} ms, \
                     one day); the line is wrong"
                )));
            }
        }
        Ok(())
    }
}

/// Parse one line (without its newline). A v1 line gets its key from the
/// line and `v1_config` as its configuration.
pub fn parse(line: &[u8], v1_config: Option<&str>) -> Result<Event, LineError> {
    let original = line.trim_ascii();
    let escaped = escape_invalid_utf8(original);
    let trimmed = escaped.as_deref().unwrap_or(original);
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
    e.check_ranges()?;
    storable(&mut e.reason);
    e.optional_texts().into_iter().flatten().for_each(storable);
    if e.schema == SCHEMA_V1 {
        e.event_id = Some(line_key(original));
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

    const V2: &str = r#"{"schema":"ace.event/2","event_id":"0123456789abcdef0123456789abcdef","config":"0123456789abcdef","request_id":"r","time_ms":1796342400000,"tenant":"t","data_class":null,"latency_class":null,"model_requested":"m","model_served":"m","destination":"d","tier":"payg","tokens_in":1,"tokens_out":2,"tokens_estimated":false,"status":200,"latency_ms":3,"slo_ms":null,"slo_met":null,"marginal_usd":0.1,"counterfactual_usd":0.1,"reason":"cheapest","warm":true,"overage":false,"usage_capped":false,"cached":false}"#;

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
