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

/// The schema this ledger reads in full: the one the filter of this
/// release writes.
pub const SCHEMA_V2: &str = ace_event::SCHEMA;
/// The older schema: no `event_id`, `config`, `warm`, `overage`,
/// `usage_capped` or `cached`.
pub const SCHEMA_V1: &str = "ace.event/1";

/// The reader's struct: one field per entry of `ace_event::event_fields!`,
/// typed by its kind ([`crate::kind`]); a field `Added` after
/// `ace.event/1` defaults (null, `false`) when a line lacks it.
macro_rules! reader_struct {
    (@acc [$($out:tt)*]) => {
        /// One request's event, as logged (its fields are
        /// `ace_event::event_fields!`).
        #[derive(Debug, Clone, PartialEq, Deserialize)]
        pub struct Event { $($out)* }
    };
    (@acc [$($out:tt)*] $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, Always; $($rest:tt)*) => {
        reader_struct! { @acc [$($out)* $(#[doc = $doc])* pub $name: <$crate::kind::$kind as $crate::kind::Kind>::Read,] $($rest)* }
    };
    (@acc [$($out:tt)*] $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, Added; $($rest:tt)*) => {
        reader_struct! { @acc [$($out)* $(#[doc = $doc])* #[serde(default)] pub $name: <$crate::kind::$kind as $crate::kind::Kind>::Read,] $($rest)* }
    };
    ($($entries:tt)*) => {
        reader_struct! { @acc [] $($entries)* }
    };
}
ace_event::event_fields!(reader_struct);

/// Each field's check and storable text, by its kind.
macro_rules! reader_checks {
    ($( $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, $presence:ident; )*) => {
        impl Event {
            /// Refuse a field outside what the ledger books (a time or
            /// latency out of range), naming it.
            fn check_fields(&self) -> Result<(), LineError> {
                $( <$crate::kind::$kind as $crate::kind::Kind>::check(stringify!($name), &self.$name).map_err(LineError::Invalid)?; )*
                Ok(())
            }

            /// Make every text field storable.
            fn make_storable(&mut self) {
                $( <$crate::kind::$kind as $crate::kind::Kind>::storable(&mut self.$name); )*
            }
        }
    };
}
ace_event::event_fields!(reader_checks);

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
    e.check_fields()?;
    e.make_storable();
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

    /// A field added later (`upstream_ms`): lines written before it was
    /// (the `V2` line above has none) still read, as null; lines that
    /// carry it read it; an absurd value is refused naming it.
    #[test]
    fn a_field_added_later_is_optional_in_older_lines() {
        assert_eq!(parse(V2.as_bytes(), None).unwrap().upstream_ms, None);
        let with = V2.replace("\"cached\":false}", "\"cached\":false,\"upstream_ms\":7}");
        assert_eq!(parse(with.as_bytes(), None).unwrap().upstream_ms, Some(7));
        let absurd = with.replace(":7}", ":172800000}");
        let e = parse(absurd.as_bytes(), None).unwrap_err().to_string();
        assert!(e.contains("`upstream_ms`"), "{e}");
    }

    /// The writer's line reads back field for field.
    #[test]
    fn the_writers_line_reads_back() {
        let e = ace_flow::event::Event {
            schema: ace_flow::event::SCHEMA,
            event_id: *b"0123456789abcdef0123456789abcdef",
            config: "0123456789abcdef".into(),
            time_ms: 1_796_342_400_000,
            tenant: Some("t".into()),
            tokens_in: 3,
            latency_ms: 40,
            marginal_usd: 0.5,
            reason: "cheapest",
            cache_false_hit: true,
            upstream_ms: Some(31),
            ..Default::default()
        };
        let r = parse(e.to_json().as_bytes(), None).unwrap();
        assert_eq!(r.tenant.as_deref(), Some("t"));
        assert_eq!(
            (r.tokens_in, r.latency_ms, r.upstream_ms),
            (3, 40, Some(31))
        );
        assert_eq!(r.marginal_usd, Some(0.5));
        assert!(r.cache_false_hit);
    }
}
