//! The event spine: exactly one event per request, as one JSON line.
//!
//! The filter writes the event into Envoy filter state (`wasm.ace_event`
//! from the Wasm filter, `ace_event` from the dynamic module), and the
//! access log emits it with `%FILTER_STATE(wasm.ace_event:PLAIN)%`,
//! so every request, served or refused, lands on the same line format that
//! the ledger reads. Costs are the core's numbers: `marginal_usd` is the true
//! marginal cost (bias and derate never touch it) and `counterfactual_usd`
//! is what the cheapest feasible pay-as-you-go destination would have
//! charged.
//!
//! The line is written by hand into a reused buffer rather than through
//! `serde_json`: that serialiser cost about 14,000 Wasm instructions per
//! write, a third of the filter's whole per-request budget, for a flat
//! object whose shape never changes. Strings are escaped per RFC 8259;
//! integers come from `itoa` (the formatter `serde_json` uses), so
//! integers parse back exactly; dollar amounts are fixed-point to the
//! picodollar (1e-12 USD).

/// Version of the event's fields (defined with them, in `ace-event`).
pub use ace_event::SCHEMA;

/// Filter-state key (Envoy prefixes it with `wasm.` for a Wasm filter).
pub const PROPERTY: &str = "ace_event";

use crate::headers::{Pairs, Span};
use std::sync::Arc;

/// One request's event: the fields of the line, as
/// [`event_fields!`](crate::event_fields) defines them (see
/// [`crate::schema`]), and three the line does not carry.
///
/// The text that comes from request headers is not copied: the event
/// keeps the request's header buffer (already allocated by the one read of
/// the map) and points into it, so a request costs no allocation per field.
macro_rules! define_event {
    (
        $(#[doc = $fdoc:literal])* $first:ident : $ffty:ty $(, via $fvia:ident)? => $fkind:ident, $fpresence:ident;
        $( $(#[doc = $doc:literal])* $name:ident : $fty:ty $(, via $via:ident)? => $kind:ident, $presence:ident; )*
    ) => {
        /// One request's event (see [`crate::schema`] for its fields).
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct Event {
            $(#[doc = $fdoc])* pub $first: $ffty,
            $( $(#[doc = $doc])* pub $name: $fty, )*
            /// The request's headers, which [`Text::Header`] fields point
            /// into (not logged).
            pub headers: Pairs,
            /// The request's tenant as a health key (not logged): the
            /// tenant attribute's value index plus one, 1 without tenants.
            pub tenant_key: u32,
            /// When the upstream had the whole request, ms (not logged):
            /// latency for health is measured from here, so a client's
            /// slow upload is not the destination's slowness.
            pub sent_ms: u64,
        }

        impl Event {
            /// An event with every field empty (null, 0, `false`) but its
            /// configuration and headers: what a request starts from,
            /// without building (and dropping) a default `Arc`.
            pub fn blank(config: &Arc<str>, headers: Pairs) -> Event {
                Event {
                    $first: <$ffty as Put>::blank(config),
                    $( $name: <$fty as Put>::blank(config), )*
                    headers,
                    tenant_key: 0,
                    sent_ms: 0,
                }
            }

            /// Every field, the first as `{"name":value`, the others as
            /// `,"name":value`.
            #[inline(always)]
            fn write_fields(&self, out: &mut Vec<u8>) {
                put_field!(self, out, "{", $first $(; $fvia)?);
                $( put_field!(self, out, ",", $name $(; $via)?); )*
            }
        }
    };
}

/// Write one field: `prefix`, its key, its value (one copy for the key and
/// a constant value).
macro_rules! put_field {
    ($e:expr, $out:expr, $prefix:literal, $name:ident $(; $via:ident)?) => {{
        const KEYS: Keys = Keys {
            key: concat!($prefix, "\"", stringify!($name), "\":").as_bytes(),
            t: concat!($prefix, "\"", stringify!($name), "\":true").as_bytes(),
            f: concat!($prefix, "\"", stringify!($name), "\":false").as_bytes(),
            null: concat!($prefix, "\"", stringify!($name), "\":null").as_bytes(),
        };
        Put::put(field_value!($e; $name $(; $via)?), $e, &KEYS, $out);
    }};
}

/// The value the writer writes for a field: the field, or its getter's.
macro_rules! field_value {
    ($e:expr; $name:ident) => {
        &$e.$name
    };
    ($e:expr; $name:ident; $via:ident) => {
        $e.$via()
    };
}

crate::event_fields!(define_event);

/// A field's key written alone and with each constant value, so that a
/// boolean or a null costs one copy.
struct Keys {
    key: &'static [u8],
    t: &'static [u8],
    f: &'static [u8],
    null: &'static [u8],
}

/// How a field's Rust type is written (and what a blank event holds).
trait Put {
    /// Write `,"name":value`.
    fn put(&self, e: &Event, k: &Keys, out: &mut Vec<u8>);
    /// The empty value (`config` is the request's configuration id).
    fn blank(config: &Arc<str>) -> Self;
}

impl Put for &'static str {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(k.key);
        string(out, self.as_bytes());
    }
    fn blank(_: &Arc<str>) -> Self {
        ""
    }
}

impl Put for [u8; 32] {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(k.key);
        string(out, self);
    }
    fn blank(_: &Arc<str>) -> Self {
        [0; 32]
    }
}

impl Put for Arc<str> {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(k.key);
        string(out, self.as_bytes());
    }
    fn blank(config: &Arc<str>) -> Self {
        Arc::clone(config)
    }
}

impl Put for Option<Text> {
    #[inline(always)]
    fn put(&self, e: &Event, k: &Keys, out: &mut Vec<u8>) {
        match e.bytes(self) {
            Some(b) => {
                out.extend_from_slice(k.key);
                string(out, b);
            }
            None => out.extend_from_slice(k.null),
        }
    }
    fn blank(_: &Arc<str>) -> Self {
        None
    }
}

/// An optional field: its value, or `null`.
impl<T: Put> Put for Option<T> {
    #[inline(always)]
    fn put(&self, e: &Event, k: &Keys, out: &mut Vec<u8>) {
        match self {
            Some(v) => v.put(e, k, out),
            None => out.extend_from_slice(k.null),
        }
    }
    fn blank(_: &Arc<str>) -> Self {
        None
    }
}

impl Put for u32 {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(k.key);
        out.extend_from_slice(itoa::Buffer::new().format(*self).as_bytes());
    }
    fn blank(_: &Arc<str>) -> Self {
        0
    }
}

impl Put for u64 {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(k.key);
        out.extend_from_slice(itoa::Buffer::new().format(*self).as_bytes());
    }
    fn blank(_: &Arc<str>) -> Self {
        0
    }
}

impl Put for bool {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        out.extend_from_slice(if *self { k.t } else { k.f });
    }
    fn blank(_: &Arc<str>) -> Self {
        false
    }
}

/// A dollar amount as a JSON number: fixed-point, rounded to the
/// picodollar (1e-12 USD, far below any price), which formats with integer
/// arithmetic; amounts of ten million dollars and more use the shortest
/// round-trip form; `null` if not finite (JSON has no NaN or infinity).
impl Put for f64 {
    #[inline(always)]
    fn put(&self, _: &Event, k: &Keys, out: &mut Vec<u8>) {
        if self.is_finite() {
            out.extend_from_slice(k.key);
            out.extend_from_slice(UsdBuffer::default().format_bytes(*self));
        } else {
            out.extend_from_slice(k.null);
        }
    }
    fn blank(_: &Arc<str>) -> Self {
        0.0
    }
}

/// A price a request was decided on (USD per token or per hour), where
/// the control service had set one: written to the picodollar when there
/// is one, and left out of the line when there is none (a reader takes an
/// absent field as null), so the common line pays nothing for it. Eight
/// bytes (none is NaN, which no price is), as the event moves with the
/// request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price(f64);

impl Price {
    /// No price.
    pub const NONE: Price = Price(f64::NAN);

    /// `usd`, or none.
    #[inline]
    pub fn of(usd: Option<f64>) -> Price {
        Price(usd.filter(|v| !v.is_nan()).unwrap_or(f64::NAN))
    }

    /// The price, if there is one.
    #[inline]
    pub fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }
}

impl Default for Price {
    fn default() -> Price {
        Price::NONE
    }
}

impl Put for Price {
    #[inline(always)]
    fn put(&self, e: &Event, k: &Keys, out: &mut Vec<u8>) {
        if let Some(v) = self.get() {
            v.put(e, k, out);
        }
    }
    fn blank(_: &Arc<str>) -> Self {
        Price::NONE
    }
}

/// A text field of an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// A value in the event's header buffer.
    Header(Span),
    /// Text from elsewhere (a model named in the request body).
    Owned(String),
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::Owned(s.to_owned())
    }
}

/// Stands for a header value that is not UTF-8: it matches no configured
/// name (so policy and lookups treat it as unknown) and shows in the line
/// as the replacement character.
pub const NOT_UTF8: &str = "\u{fffd}";

impl Event {
    /// Record the final status and reason; whether the SLO was met follows
    /// from them (a 5xx, a 429 or no answer never meets it).
    pub fn finish(&mut self, status: u32, reason: &'static str) {
        self.status = status;
        self.reason = reason;
        if let Some(slo) = self.slo_ms {
            self.slo_met =
                Some(status != 0 && status < 500 && status != 429 && self.latency_ms <= slo);
        }
    }

    /// The bytes of a text field.
    #[inline]
    pub fn bytes<'a>(&'a self, t: &'a Option<Text>) -> Option<&'a [u8]> {
        match t.as_ref()? {
            Text::Header(span) => self.headers.at(*span),
            Text::Owned(s) => Some(s.as_bytes()),
        }
    }

    /// A text field as text; a value that is not UTF-8 reads as
    /// [`NOT_UTF8`].
    #[inline]
    pub fn text<'a>(&'a self, t: &'a Option<Text>) -> Option<&'a str> {
        self.bytes(t)
            .map(|b| std::str::from_utf8(b).unwrap_or(NOT_UTF8))
    }

    /// One JSON line (no trailing newline).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(512);
        self.write_json(&mut out);
        // Valid by construction (see `string`); lossy is only a fallback.
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Write the JSON line into `out`, replacing what it held. Fields are
    /// always present (`null` when unknown), in the order
    /// [`event_fields!`](crate::event_fields) lists them.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.clear();
        self.write_fields(out);
        out.push(b'}');
    }

    /// The model that served the request: the one routing chose, else the
    /// one asked for.
    pub fn served(&self) -> &Option<Text> {
        if self.model_served.is_some() {
            &self.model_served
        } else {
            &self.model_requested
        }
    }
}

/// Leading zeros of a fraction.
const ZEROS: &[u8; 12] = b"000000000000";

/// Formats dollar amounts without allocating (the way event lines write them).
#[derive(Debug, Default)]
pub struct UsdBuffer {
    bytes: [u8; 32],
}

impl UsdBuffer {
    /// `v` in dollars, fixed-point to 12 decimals, trailing zeros trimmed
    /// (`0.00000125`, `3`); finite `v` only (others print as `0`).
    pub fn format(&mut self, v: f64) -> &str {
        core::str::from_utf8(self.format_bytes(v)).unwrap_or("0")
    }

    /// [`UsdBuffer::format`] as the bytes it writes (ASCII), for writers
    /// of bytes: no UTF-8 check to pay for.
    fn format_bytes(&mut self, v: f64) -> &[u8] {
        if !v.is_finite() {
            return b"0";
        }
        if !(0.0..1e7).contains(&v) {
            // At most 24 bytes (`-1.2345678901234567e-308`).
            let mut z = zmij::Buffer::new();
            return self.copied(z.format_finite(v).as_bytes());
        }
        // v < 1e7, so v * 1e12 < 1e19 < u64::MAX; v >= 0, so adding a half
        // and truncating rounds to nearest (`f64::round` is a libm call in
        // Wasm).
        let pico = (v * 1e12 + 0.5) as u64;
        let mut int = itoa::Buffer::new();
        let digits = int.format(pico).as_bytes();
        // The last 12 digits are the fraction; the rest, or 0, the units.
        let (units, frac) = digits.split_at(digits.len().saturating_sub(12));
        let mut n = self.copy_at(0, if units.is_empty() { b"0" } else { units });
        let kept = frac.iter().rposition(|&d| d != b'0').map_or(0, |i| i + 1);
        if let Some(frac) = frac.get(..kept).filter(|f| !f.is_empty()) {
            n = self.copy_at(n, b".");
            let pad = ZEROS.get(digits.len().min(12)..).unwrap_or(b"");
            n = self.copy_at(n, pad);
            n = self.copy_at(n, frac);
        }
        self.written(n)
    }

    /// Copy `src` to offset `at`; returns the end offset (`at` if it does
    /// not fit, which the callers' bounds rule out).
    fn copy_at(&mut self, at: usize, src: &[u8]) -> usize {
        match self.bytes.get_mut(at..at + src.len()) {
            Some(dst) => {
                dst.copy_from_slice(src);
                at + src.len()
            }
            None => at,
        }
    }

    fn copied(&mut self, src: &[u8]) -> &[u8] {
        let n = self.copy_at(0, src);
        self.written(n)
    }

    fn written(&self, n: usize) -> &[u8] {
        self.bytes.get(..n).unwrap_or(b"0")
    }
}

/// Whether any byte of `b` needs a look: `"`, `\\`, a control character,
/// or a byte of a multi-byte (or invalid) UTF-8 sequence. Eight bytes at a
/// time, the tail too; the usual value, an ASCII header, has none.
fn needs_escape(b: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero <=> the same byte of `has_zero(x)` has its high bit.
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let flagged = |w: [u8; 8]| {
        let x = u64::from_le_bytes(w);
        // Bytes below 0x20 (among ASCII bytes), and bytes from 0x80.
        let control = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
        control
            | (x & HIGH)
            | has_zero(x ^ (ONES * u64::from(b'"')))
            | has_zero(x ^ (ONES * u64::from(b'\\')))
            != 0
    };
    let mut words = b.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        if flagged(a) {
            return true;
        }
    }
    let tail = words.remainder();
    if tail.is_empty() {
        return false;
    }
    // The tail as one more word: the last eight bytes (some of them seen
    // already), or, in a shorter value, its bytes padded with spaces,
    // which need nothing.
    let mut a = [b' '; 8];
    let last = b.len().checked_sub(8).and_then(|start| b.get(start..));
    match (last, a.get_mut(..tail.len())) {
        (Some(last), _) => a.copy_from_slice(last),
        (None, Some(head)) => head.copy_from_slice(tail),
        (None, None) => return true,
    }
    flagged(a)
}

/// The lowercase hex digit of `n` (its low four bits).
pub fn hex_digit(n: u8) -> u8 {
    match n & 15 {
        d @ 0..=9 => b'0' + d,
        d => b'a' + (d - 10),
    }
}

/// A JSON string: quotes, backslashes and control characters escaped;
/// other characters copied as they are, except that each invalid UTF-8
/// sequence (header values are bytes) becomes U+FFFD. The output is UTF-8.
pub fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    if !needs_escape(s) {
        out.extend_from_slice(s);
        out.push(b'"');
        return;
    }
    for chunk in s.utf8_chunks() {
        escape(out, chunk.valid());
        if !chunk.invalid().is_empty() {
            out.extend_from_slice("\u{fffd}".as_bytes());
        }
    }
    out.push(b'"');
}

/// `s` with quotes, backslashes and control characters escaped.
fn escape(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let s = s.as_bytes();
    let mut plain = 0;
    for (i, &b) in s.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(s.get(plain..i).unwrap_or(b""));
        plain = i + 1;
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            for nibble in [b >> 4, b & 0xf] {
                out.push(HEX.get(usize::from(nibble)).copied().unwrap_or(b'0'));
            }
        } else {
            out.extend_from_slice(escape);
        }
    }
    out.extend_from_slice(s.get(plain..).unwrap_or(b""));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_every_field_on_one_line() {
        let e = Event {
            schema: SCHEMA,
            headers: Pairs::default(),
            request_id: Some("r-1".into()),
            time_ms: 5,
            tenant: Some("acme".into()),
            data_class: Some("eu-personal".into()),
            latency_class: None,
            model_requested: Some("m".into()),
            destination: Some("owned".into()),
            tier: Some("inhouse"),
            tokens_in: 10,
            tokens_out: 20,
            tokens_estimated: true,
            status: 200,
            latency_ms: 12,
            slo_ms: Some(100),
            slo_met: Some(true),
            marginal_usd: 0.25,
            counterfactual_usd: Some(1.0),
            reason: "cheapest",
            event_id: *b"0123456789abcdef0000000000000001",
            config: "00112233aabbccdd".into(),
            warm: Some(true),
            upstream_ms: Some(9),
            ..Event::default()
        };
        let line = e.to_json();
        assert!(!line.contains('\n'));
        let mut reused = b"stale".to_vec();
        e.write_json(&mut reused);
        assert_eq!(
            reused,
            line.as_bytes(),
            "a reused buffer holds exactly the line"
        );
        assert_eq!(
            line,
            "{\"schema\":\"ace.event/2\",\"event_id\":\"0123456789abcdef0000000000000001\",\
             \"config\":\"00112233aabbccdd\",\"request_id\":\"r-1\",\"time_ms\":5,\"tenant\":\"acme\",\
             \"data_class\":\"eu-personal\",\"latency_class\":null,\"model_requested\":\"m\",\
             \"model_served\":\"m\",\"api\":null,\"upstream_model\":null,\"destination\":\"owned\",\"tier\":\"inhouse\",\"tokens_in\":10,\
             \"tokens_out\":20,\"tokens_cache_read\":0,\"tokens_cache_write\":0,\"tokens_prefix_held\":0,\"tokens_estimated\":true,\"status\":200,\"latency_ms\":12,\"slo_ms\":100,\
             \"slo_met\":true,\"marginal_usd\":0.25,\"counterfactual_usd\":1,\"reason\":\"cheapest\",\
             \"warm\":true,\"overage\":false,\"usage_capped\":false,\"cached\":false,\"cache_false_hit\":false,\"upstream_ms\":9,\"budget\":null,\"budget_state\":null}"
        );
        // The prices a control service set, where it set them: written to
        // the picodollar, after the fields every line has.
        let mut live = e.clone();
        live.live_usd_per_input_token = Price::of(Some(1.5e-7));
        live.live_usd_per_output_token = Price::of(Some(6e-7));
        live.live_usd_per_hour = Price::of(Some(2.5));
        assert_eq!(
            live.to_json(),
            line.replace(
                ",\"budget\":null",
                ",\"live_usd_per_input_token\":0.00000015,\
                 \"live_usd_per_output_token\":0.0000006,\"live_usd_per_hour\":2.5,\"budget\":null"
            )
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for k in [
            "schema",
            "request_id",
            "time_ms",
            "tenant",
            "data_class",
            "model_requested",
            "model_served",
            "destination",
            "tier",
            "tokens_in",
            "tokens_out",
            "status",
            "latency_ms",
            "slo_ms",
            "slo_met",
            "marginal_usd",
            "counterfactual_usd",
            "reason",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }

    #[test]
    fn strings_and_numbers_parse_back_exactly() {
        let nasty = [
            "",
            "plain",
            "quote\" backslash\\ slash/",
            "nl\n cr\r tab\t bell\u{7} nul\u{0} us\u{1f} del\u{7f}",
            "é ü 中文 🦀",
            "\\u0041 not an escape",
        ];
        let numbers = [
            0.0,
            1e-12,
            1.2345678901234567e-7,
            3.0,
            1e300,
            f64::MIN_POSITIVE,
        ];
        for (s, v) in nasty.iter().zip(numbers.iter().cycle()) {
            let e = Event {
                schema: SCHEMA,
                headers: Pairs::default(),
                request_id: Some((*s).into()),
                time_ms: u64::MAX,
                tenant: None,
                data_class: Some((*s).into()),
                latency_class: None,
                model_requested: None,
                destination: None,
                tier: None,
                tokens_in: u32::MAX,
                tokens_out: 0,
                tokens_estimated: false,
                status: 0,
                latency_ms: 0,
                slo_ms: None,
                slo_met: Some(false),
                marginal_usd: *v,
                counterfactual_usd: Some(f64::NAN),
                reason: "r",
                ..Event::default()
            };
            let line = e.to_json();
            let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(parsed["request_id"], serde_json::json!(s), "{line}");
            assert_eq!(parsed["data_class"], serde_json::json!(s));
            let back = parsed["marginal_usd"].as_f64().unwrap();
            assert!((back - v).abs() <= 5e-13 + v * 1e-15, "{v} -> {back}");
            assert_eq!(parsed["counterfactual_usd"], serde_json::Value::Null);
            assert_eq!(parsed["time_ms"].as_u64(), Some(u64::MAX));
            assert_eq!(parsed["tokens_in"].as_u64(), Some(u64::from(u32::MAX)));
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn header_fields_are_read_from_the_kept_buffer() {
        let headers = Pairs::encode([
            (&b"x-request-id"[..], &b"r-9"[..]),
            (b"x-ace-tenant", b"ac\xffme"),
        ]);
        let [id, tenant] = headers.find(["x-request-id", "x-ace-tenant"]);
        let span = |v: Option<&[u8]>| v.and_then(|v| headers.span(v)).map(Text::Header);
        let e = Event {
            request_id: span(id),
            tenant: span(tenant),
            model_requested: Some("from-body".into()),
            headers: headers.clone(),
            ..Event::default()
        };
        assert_eq!(e.text(&e.request_id), Some("r-9"));
        assert_eq!(
            e.text(&e.tenant),
            Some(NOT_UTF8),
            "not UTF-8: matches nothing"
        );
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["request_id"], "r-9");
        assert_eq!(v["tenant"], "ac\u{fffd}me", "lossy in the line");
        assert_eq!(v["model_requested"], "from-body");
        assert_eq!(v["model_served"], "from-body");
    }

    #[test]
    fn dollars_are_fixed_point_to_the_picodollar() {
        let mut b = UsdBuffer::default();
        assert_eq!(b.format(0.0), "0");
        assert_eq!(b.format(3.0), "3");
        assert_eq!(b.format(0.25), "0.25");
        assert_eq!(b.format(1.25e-6), "0.00000125");
        assert_eq!(b.format(1e-13), "0");
        assert_eq!(b.format(9_999_999.5), "9999999.5");
        assert_eq!(b.format(1.5e7), "15000000.0");
        assert_eq!(b.format(f64::NAN), "0");
        let mut x = 1e-12;
        while x < 1e7 {
            let back: f64 = b.format(x).parse().unwrap();
            assert!((back - x).abs() <= 5e-13 + x * 1e-15, "{x} -> {back}");
            x *= 1.37;
        }
    }

    #[test]
    fn the_word_at_a_time_escape_check_matches_the_byte_check() {
        for len in 0..20 {
            for pos in 0..len {
                for byte in 0..=255u8 {
                    let mut b = vec![b'a'; len];
                    b[pos] = byte;
                    let naive = b
                        .iter()
                        .any(|&c| !(0x20..0x80).contains(&c) || c == b'"' || c == b'\\');
                    assert_eq!(needs_escape(&b), naive, "len {len} pos {pos} byte {byte}");
                }
            }
        }
        let mixed = b"\xff\x80 \x1f\xe0\xa0\x80abcdefgh";
        assert!(needs_escape(mixed));
        assert!(
            needs_escape("é".as_bytes()),
            "non-ASCII takes the careful path"
        );
        assert!(!needs_escape(
            b"2f1c9a54-0d7e-4c36-9d55-6f0b8e8a1c11 plain text!"
        ));
    }
}
