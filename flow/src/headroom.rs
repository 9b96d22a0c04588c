//! A provider's own figures of its rate limit, read from an answer's
//! headers: how much is left and when it resets
//! ([`ace_core::health::Headroom`]). They move the destination's cap before
//! the provider answers 429 (see [`ace_core::health`]); they never widen
//! the feasible set, and a destination that sends none is judged by its
//! 429s alone.
//!
//! The headers, per their providers' documentation:
//!
//! - OpenAI ("Rate limits" guide, "Rate limits in headers"; Groq and
//!   Azure OpenAI's standard deployments send the same names):
//!   `x-ratelimit-limit-requests` and `-tokens`, `x-ratelimit-remaining-*`,
//!   and `x-ratelimit-reset-*`, the time until the limit resets as a Go
//!   duration (`1s`, `6m0s`, `12ms`, `18.642s`).
//! - Anthropic (API reference, "Rate limits", response headers):
//!   `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
//!   the reset an RFC 3339 time (`2025-08-21T12:40:59Z`).
//! - Azure OpenAI provisioned (PTU) deployments:
//!   `azure-openai-deployment-utilization` (`89.3%`), the deployment's
//!   utilisation (Microsoft's `Azure/azure-openai-benchmark`,
//!   `benchmark/oairequester.py`, reads it on every answer); past 100 %
//!   the service answers 429 with `retry-after-ms` ("Provisioned
//!   throughput", Azure OpenAI docs). It says no reset time: the limit is
//!   taken to reset after the health policy's default `retry-after`.
//!
//! One pass over the answer's headers; a value that does not parse is
//! ignored (never an error: the answer is the client's), and a limit of 0
//! or less (Azure's `-1` on some surfaces) says nothing. Resets and
//! `retry-after` are read as said, however far: how long any of them may
//! hold a destination back is one rule of [`ace_core::health`] (at most
//! `health.max_cooldown_ms`).

use ace_core::health::Headroom;

/// The dimensions a provider reports a limit in.
const DIMENSIONS: usize = 4;

/// What one answer's headers said, as they are read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    limit: [Option<f64>; DIMENSIONS],
    remaining: [Option<f64>; DIMENSIONS],
    reset_ms: [Option<u64>; DIMENSIONS],
    utilization: Option<f64>,
}

/// Which limit a header's dimension names.
fn dimension(name: &[u8]) -> Option<usize> {
    [
        &b"requests"[..],
        b"tokens",
        b"input-tokens",
        b"output-tokens",
    ]
    .iter()
    .position(|d| name.eq_ignore_ascii_case(d))
}

/// Whether a response header may be one of them (a cheap first test).
#[inline]
pub fn may_be(name: &[u8]) -> bool {
    matches!(name.first(), Some(b'x' | b'a' | b'X' | b'A'))
        && (starts_with_ignore_case(name, b"x-ratelimit-")
            || starts_with_ignore_case(name, b"anthropic-ratelimit-")
            || name.eq_ignore_ascii_case(b"azure-openai-deployment-utilization"))
}

fn starts_with_ignore_case(s: &[u8], prefix: &[u8]) -> bool {
    s.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
}

impl Reading {
    /// Read one response header (`now_ms`: the clock, for an absolute
    /// reset time).
    pub fn feed(&mut self, name: &[u8], value: &[u8], now_ms: u64) {
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"azure-openai-deployment-utilization") {
            let v = value.strip_suffix(b"%").unwrap_or(value);
            self.utilization = number(v).filter(|u| *u >= 0.0).map(|u| u / 100.0);
            return;
        }
        let rest = |prefix: &[u8]| -> Option<&[u8]> {
            starts_with_ignore_case(name, prefix)
                .then(|| name.get(prefix.len()..))
                .flatten()
        };
        if let Some(rest) = rest(b"x-ratelimit-") {
            // x-ratelimit-{limit,remaining,reset}-{dimension}
            let (kind, dim) = match rest.iter().position(|&b| b == b'-') {
                Some(i) => (rest.get(..i), rest.get(i + 1..)),
                None => return,
            };
            let (Some(kind), Some(d)) = (kind, dim.and_then(dimension)) else {
                return;
            };
            self.set(kind, d, value, duration_ms);
        } else if let Some(rest) = rest(b"anthropic-ratelimit-") {
            // anthropic-ratelimit-{dimension}-{limit,remaining,reset}
            let Some(i) = rest.iter().rposition(|&b| b == b'-') else {
                return;
            };
            let (Some(dim), Some(kind)) = (rest.get(..i), rest.get(i + 1..)) else {
                return;
            };
            let Some(d) = dimension(dim) else {
                return;
            };
            self.set(kind, d, value, |v| {
                rfc3339_ms(v).map(|at| at.saturating_sub(now_ms))
            });
        }
    }

    fn set(&mut self, kind: &[u8], d: usize, value: &[u8], reset: impl Fn(&[u8]) -> Option<u64>) {
        let kind = [&b"limit"[..], b"remaining", b"reset"]
            .iter()
            .position(|k| kind.eq_ignore_ascii_case(k));
        match kind {
            Some(0) => {
                if let Some(x) = self.limit.get_mut(d) {
                    *x = number(value);
                }
            }
            Some(1) => {
                if let Some(x) = self.remaining.get_mut(d) {
                    *x = number(value);
                }
            }
            Some(2) => {
                if let Some(x) = self.reset_ms.get_mut(d) {
                    *x = reset(value);
                }
            }
            _ => {}
        }
    }

    /// What the headers said: the smallest fraction left of any limit
    /// given with its remaining count, and that limit's reset; `None`
    /// when they said nothing usable.
    pub fn headroom(&self) -> Option<Headroom> {
        let mut best: Option<Headroom> = None;
        for d in 0..DIMENSIONS {
            let (Some(Some(limit)), Some(Some(remaining))) =
                (self.limit.get(d), self.remaining.get(d))
            else {
                continue;
            };
            if *limit <= 0.0 || *remaining < 0.0 {
                continue;
            }
            let left = (remaining / limit).clamp(0.0, 1.0);
            if best.is_none_or(|b| left < b.left) {
                best = Some(Headroom {
                    left,
                    reset_ms: self.reset_ms.get(d).copied().flatten().unwrap_or(0),
                });
            }
        }
        if let Some(u) = self.utilization {
            let left = (1.0 - u).clamp(0.0, 1.0);
            if best.is_none_or(|b| left < b.left) {
                best = Some(Headroom { left, reset_ms: 0 });
            }
        }
        best
    }
}

/// A plain non-negative decimal number (`150000`, `89.3`).
fn number(v: &[u8]) -> Option<f64> {
    if v.is_empty() || v.len() > 32 || !v.iter().all(|b| b.is_ascii_digit() || *b == b'.') {
        // Azure's `-1` (no limit), and anything else, say nothing.
        return None;
    }
    std::str::from_utf8(v)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
}

/// A Go duration (`1s`, `6m0s`, `1h2m3s`, `12ms`, `18.642s`, `0.5s`) in
/// ms, rounded up (past `u64::MAX` ms, that).
pub fn duration_ms(v: &[u8]) -> Option<u64> {
    let mut total = 0.0f64;
    let mut i = 0usize;
    let mut any = false;
    while i < v.len() {
        let start = i;
        while v.get(i).is_some_and(|b| b.is_ascii_digit() || *b == b'.') {
            i += 1;
        }
        let n = number(v.get(start..i)?)?;
        let unit_start = i;
        while v.get(i).is_some_and(u8::is_ascii_alphabetic) {
            i += 1;
        }
        let ms = match v.get(unit_start..i)? {
            b"h" => 3_600_000.0,
            b"m" => 60_000.0,
            b"s" => 1_000.0,
            b"ms" => 1.0,
            b"us" | b"\xc2\xb5s" => 0.001,
            b"ns" => 0.000_001,
            _ => return None,
        };
        total += n * ms;
        any = true;
    }
    // A float to integer cast saturates: a duration past u64::MAX ms is
    // that.
    any.then(|| total.ceil() as u64)
}

/// An RFC 3339 UTC time (`2025-08-21T12:40:59Z`, fractions and a numeric
/// offset allowed) in ms since the Unix epoch.
pub fn rfc3339_ms(v: &[u8]) -> Option<u64> {
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = v.get(r)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(s).ok()?.parse().ok()
    };
    if v.get(4) != Some(&b'-') || v.get(7) != Some(&b'-') || v.get(13) != Some(&b':') {
        return None;
    }
    if !matches!(v.get(10), Some(b'T' | b't' | b' ')) || v.get(16) != Some(&b':') {
        return None;
    }
    let (y, mo, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (h, mi, s) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ms = 0i64;
    if v.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while v.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let f = v.get(start..i)?;
        for (k, b) in f.iter().take(3).enumerate() {
            frac_ms += i64::from(b - b'0') * [100, 10, 1].get(k).copied().unwrap_or(0);
        }
    }
    let offset_min = match v.get(i..)? {
        b"Z" | b"z" => 0,
        o if o.len() == 6 && matches!(o.first(), Some(b'+' | b'-')) && o.get(3) == Some(&b':') => {
            let sign = if o.first() == Some(&b'-') { -1 } else { 1 };
            sign * (digits(i + 1..i + 3)? * 60 + digits(i + 4..i + 6)?)
        }
        _ => return None,
    };
    // Days since the epoch (Howard Hinnant's days_from_civil).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3_600 + mi * 60 + s - offset_min * 60;
    u64::try_from(secs.checked_mul(1000)?.checked_add(frac_ms)?).ok()
}

/// `retry-after-ms` (Azure OpenAI, read first by OpenAI's own client),
/// else `retry-after` in seconds (fractions allowed), in ms (saturating).
pub fn retry_after_ms(ms: Option<&[u8]>, secs: Option<&[u8]>) -> Option<u64> {
    let ms = ms
        .map(<[u8]>::trim_ascii)
        .and_then(number)
        .map(|x| x.ceil() as u64);
    ms.or_else(|| {
        secs.map(<[u8]>::trim_ascii)
            .and_then(number)
            .map(|x| (x * 1000.0).ceil() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(headers: &[(&str, &str)], now: u64) -> Option<Headroom> {
        let mut r = Reading::default();
        for (k, v) in headers {
            if may_be(k.as_bytes()) {
                r.feed(k.as_bytes(), v.as_bytes(), now);
            }
        }
        r.headroom()
    }

    #[test]
    fn openais_sample_headers() {
        // The sample values of OpenAI's "Rate limits in headers" table.
        let h = read(
            &[
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-limit-tokens", "150000"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-remaining-tokens", "149984"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            0,
        )
        .unwrap();
        assert!((h.left - 59.0 / 60.0).abs() < 1e-12, "{h:?}");
        assert_eq!(h.reset_ms, 1_000, "the tightest limit's reset");
        let h = read(
            &[
                ("X-RateLimit-Limit-Tokens", "1000"),
                ("x-ratelimit-remaining-tokens", "20"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            0,
        )
        .unwrap();
        assert_eq!((h.left, h.reset_ms), (0.02, 360_000));
    }

    #[test]
    fn anthropics_headers_reset_at_a_time() {
        let now = rfc3339_ms(b"2025-08-21T12:40:00Z").unwrap();
        let h = read(
            &[
                ("anthropic-ratelimit-requests-limit", "1000"),
                ("anthropic-ratelimit-requests-remaining", "999"),
                ("anthropic-ratelimit-requests-reset", "2025-08-21T12:40:59Z"),
                ("anthropic-ratelimit-input-tokens-limit", "80000"),
                ("anthropic-ratelimit-input-tokens-remaining", "4000"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2025-08-21T12:40:30.5Z",
                ),
            ],
            now,
        )
        .unwrap();
        assert_eq!((h.left, h.reset_ms), (0.05, 30_500));
    }

    #[test]
    fn a_provisioned_deployments_utilisation() {
        let h = read(&[("azure-openai-deployment-utilization", "89.3%")], 0).unwrap();
        assert!((h.left - 0.107).abs() < 1e-9, "{h:?}");
        let h = read(&[("azure-openai-deployment-utilization", "104%")], 0).unwrap();
        assert_eq!((h.left, h.reset_ms), (0.0, 0));
    }

    #[test]
    fn what_does_not_parse_says_nothing() {
        for headers in [
            &[
                ("x-ratelimit-limit-tokens", "-1"),
                ("x-ratelimit-remaining-tokens", "-1"),
            ][..],
            &[("x-ratelimit-remaining-tokens", "5")],
            &[
                ("x-ratelimit-limit-tokens", "0"),
                ("x-ratelimit-remaining-tokens", "0"),
            ],
            &[
                ("x-ratelimit-limit-tokens", "1e3"),
                ("x-ratelimit-remaining-tokens", "1"),
            ],
            &[
                ("x-ratelimit-limit-bananas", "10"),
                ("x-ratelimit-remaining-bananas", "1"),
            ],
            &[("azure-openai-deployment-utilization", "high")],
            &[("anthropic-ratelimit-tokens", "5")],
            &[("x-ratelimit-", "")],
        ] {
            assert_eq!(read(headers, 0), None, "{headers:?}");
        }
        let h = read(
            &[
                ("x-ratelimit-limit-tokens", "10"),
                ("x-ratelimit-remaining-tokens", "50"),
                ("x-ratelimit-reset-tokens", "soon"),
            ],
            0,
        );
        assert_eq!(
            h,
            Some(Headroom {
                left: 1.0,
                reset_ms: 0
            })
        );
    }

    #[test]
    fn go_durations_and_rfc3339_times() {
        for (v, ms) in [
            ("1s", Some(1_000)),
            ("6m0s", Some(360_000)),
            ("1h2m3s", Some(3_723_000)),
            ("12ms", Some(12)),
            ("18.642s", Some(18_642)),
            ("0.5s", Some(500)),
            ("2m59.56s", Some(179_560)),
            ("", None),
            ("5", None),
            ("5d", None),
            ("25h", Some(90_000_000)),
            ("-1s", None),
        ] {
            assert_eq!(duration_ms(v.as_bytes()), ms, "{v}");
        }
        assert_eq!(rfc3339_ms(b"1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms(b"2000-03-01T00:00:00Z"), Some(951_868_800_000));
        assert_eq!(
            rfc3339_ms(b"2025-08-21T14:40:59+02:00"),
            rfc3339_ms(b"2025-08-21T12:40:59Z")
        );
        for bad in [
            &b"2025-13-01T00:00:00Z"[..],
            b"2025-08-21",
            b"2025-08-21T12:40:59",
            b"x",
        ] {
            assert_eq!(rfc3339_ms(bad), None, "{bad:?}");
        }
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Any header a provider (or whatever answers) sends: a figure in
        /// range or none, never a panic; and for the names read, values at
        /// the edges (huge, negative, fractional, empty, non-ASCII).
        #[test]
        fn any_header_gives_a_figure_in_range_or_none(
            headers in proptest::collection::vec(
                (
                    proptest::prop_oneof![
                        "x-ratelimit-(limit|remaining|reset)-(requests|tokens|bananas)",
                        "anthropic-ratelimit-(requests|tokens|input-tokens|x)-(limit|remaining|reset)",
                        proptest::strategy::Just("azure-openai-deployment-utilization".to_string()),
                        "[a-zA-Z-]{0,30}",
                    ],
                    proptest::prop_oneof![
                        "[0-9]{0,40}(\\.[0-9]{0,5})?%?",
                        "-?[0-9]{1,6}(h|m|s|ms|us|d)?([0-9]{1,3}(m|s|ms))?",
                        "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,9})?(Z|[+-][0-9]{2}:[0-9]{2})?",
                        proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)
                            .prop_map(|b: Vec<u8>| String::from_utf8_lossy(&b).into_owned()),
                    ],
                ),
                0..12,
            ),
            now in proptest::prelude::any::<u64>(),
        ) {
            let mut r = Reading::default();
            for (k, v) in &headers {
                if may_be(k.as_bytes()) {
                    r.feed(k.as_bytes(), v.as_bytes(), now);
                }
            }
            if let Some(h) = r.headroom() {
                proptest::prop_assert!((0.0..=1.0).contains(&h.left), "{h:?}");
            }
            for (_, v) in &headers {
                let _ = duration_ms(v.as_bytes());
                let _ = rfc3339_ms(v.as_bytes());
                let _ = retry_after_ms(Some(v.as_bytes()), Some(v.as_bytes()));
            }
        }
    }

    #[test]
    fn retry_after_prefers_milliseconds() {
        assert_eq!(retry_after_ms(Some(b"1500"), Some(b"2")), Some(1_500));
        assert_eq!(retry_after_ms(None, Some(b" 2 ")), Some(2_000));
        assert_eq!(retry_after_ms(Some(b"x"), Some(b"0.25")), Some(250));
        assert_eq!(
            retry_after_ms(None, Some(b"Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(
            retry_after_ms(Some(b"99999999999"), None),
            Some(99_999_999_999),
            "as said: health holds it to max_cooldown_ms"
        );
    }

    #[test]
    fn every_reset_is_read_as_said_however_far() {
        // Anthropic's reset at the end of time, OpenAI's a day and more
        // away, a `retry-after` of a year: each is read as it stands, and
        // `ace_core::health` holds a destination back at most
        // `health.max_cooldown_ms` for any of them.
        let now = rfc3339_ms(b"2025-08-21T12:40:00Z").unwrap();
        let far = read(
            &[
                ("anthropic-ratelimit-tokens-limit", "1000"),
                ("anthropic-ratelimit-tokens-remaining", "0"),
                ("anthropic-ratelimit-tokens-reset", "9999-12-31T23:59:59Z"),
            ],
            now,
        )
        .unwrap();
        assert_eq!(far.left, 0.0);
        assert_eq!(far.reset_ms, 253_402_300_799_000 - now);
        let openai = read(
            &[
                ("x-ratelimit-limit-requests", "10000"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "30h0m0s"),
            ],
            0,
        )
        .unwrap();
        assert_eq!(openai.reset_ms, 108_000_000);
        assert_eq!(duration_ms(b"99999999999999999999h"), Some(u64::MAX));
        assert_eq!(
            retry_after_ms(None, Some(b"31536000")),
            Some(31_536_000_000)
        );
        let p = ace_core::health::HealthPolicy::default();
        for h in [far, openai] {
            let mut health = ace_core::health::Health::default();
            let answer = ace_core::health::Outcome::Success {
                latency_ms: 1,
                slo_ms: None,
                headroom: Some(h),
            };
            health.observe(answer, now, &p);
            assert!(health.throttled(now + p.max_cooldown_ms - 1));
            assert!(!health.throttled(now + p.max_cooldown_ms), "{h:?}");
        }
    }
}
