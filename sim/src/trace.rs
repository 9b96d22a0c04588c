//! Traffic: the requests a simulation replays, and when they arrive.
//!
//! The shared Azure LLM inference trace (Patel et al., "Splitwise", ISCA
//! 2024; CC-BY-4.0) gives real arrival burstiness and real prompt and
//! output sizes, but only for one hour. A fleet's economics are decided by
//! the day: owned GPUs idle at night and overflow at the peak. So a day is
//! built from the hour ([`Shape::Day`]): the trace is laid end to end
//! `copies` times and time is warped so that the arrival rate follows a
//! diurnal curve ([`DIURNAL`]) while each stretch keeps the trace's own
//! burst structure. [`Shape::Replay`] plays the trace as recorded, sped up.
//!
//! Any CSV with the trace's columns (`TIMESTAMP`, `ContextTokens`,
//! `GeneratedTokens`, any order, extra columns ignored) can be given; a bad
//! one is refused with the line and column of the first problem.
//!
//! The Mooncake trace format (Qin et al., "Mooncake", FAST 2025;
//! `kvcache-ai/Mooncake`, `FAST25-release/traces/*.jsonl`) is read too
//! ([`Trace::parse_jsonl`]): JSON lines `{"timestamp": ms, "input_length":
//! tokens, "output_length": tokens, "hash_ids": [...]}`, where `hash_ids`
//! names the prompt's [`BLOCK_TOKENS`]-token blocks and two requests that
//! share their first k ids share a 512·k-token prefix. Its rows carry their
//! block ids ([`Blocks`]), which the simulated engines' and providers'
//! prompt caches and ACE's request bodies follow. [`Trace::read`] takes a
//! file ending `.jsonl` or `.ndjson`, or whose first non-blank byte is `{`,
//! as JSON lines, anything else as CSV; a bad line is refused with its
//! number and the field at fault.

use crate::rng::Rng;
use std::fmt;

/// One request of a trace: when (ms after the trace's first request) and
/// how big.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Arrival, ms after the first row.
    pub at_ms: u64,
    /// Prompt (context) tokens.
    pub prompt: u32,
    /// Generated (output) tokens.
    pub output: u32,
    /// Its prompt's blocks (none for a trace without them).
    pub blocks: Blocks,
}

/// Tokens in one prompt block of the Mooncake trace.
pub const BLOCK_TOKENS: u32 = 512;

/// One request of the run, as the engine and the metrics read it.
#[derive(Clone, Copy, Debug)]
pub struct Req {
    /// Arrival, ms into the run.
    pub at_ms: u64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Output tokens.
    pub output: u32,
    /// Its [`Profile`](crate::mix::Profile).
    pub profile: u32,
    /// Its prompt's blocks (a trace with prefix structure), into
    /// [`World::block_ids`](crate::engine::World::block_ids).
    pub blocks: Blocks,
}

/// A request's prompt blocks: `len` ids from `start` of its trace's
/// [`Trace::block_ids`], in copy `copy` of the trace ([`Shape::Day`] lays
/// copies end to end; each copy's blocks are distinct from another's, a
/// copy being other conversations of the same shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Blocks {
    /// First id's index.
    pub start: u32,
    /// Ids.
    pub len: u32,
    /// The copy of the trace.
    pub copy: u32,
}

impl Blocks {
    /// The blocks' keys in `ids` (the trace's [`Trace::block_ids`]): the
    /// id, with the copy in the high half, so that copies never share.
    pub fn keys<'a>(&self, ids: &'a [u32]) -> impl Iterator<Item = u64> + 'a {
        let copy = u64::from(self.copy) << 32;
        let (a, b) = (self.start as usize, self.start as usize + self.len as usize);
        ids.get(a..b)
            .unwrap_or_default()
            .iter()
            .map(move |id| copy | u64::from(*id))
    }

    /// Whether the request has no blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A request trace, sorted by arrival.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Where it came from (a path, or "synthetic").
    pub source: String,
    /// Its requests, by arrival.
    pub rows: Vec<Row>,
    /// The prompt block ids its rows' [`Blocks`] point into (empty for a
    /// trace without them).
    pub block_ids: Vec<u32>,
}

/// A trace that cannot be read: where and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The input's name.
    pub source: String,
    /// 1-based line (0: the input as a whole).
    pub line: usize,
    /// 1-based column (field) number, when one field is at fault.
    pub column: Option<usize>,
    /// What is wrong and what is accepted.
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}: {}", self.source, self.message),
            (l, Some(c)) => write!(f, "{}:{l}, column {c}: {}", self.source, self.message),
            (l, None) => write!(f, "{}:{l}: {}", self.source, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// The columns a trace must have.
pub const COLUMNS: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

/// The largest token count accepted in one row (a bigger one is a broken
/// file, not a request).
pub const MAX_TOKENS: u32 = 10_000_000;

impl Trace {
    /// Parse CSV `text` (named `source` in errors).
    pub fn parse(source: &str, text: &str) -> Result<Trace, TraceError> {
        let err = |line: usize, column: Option<usize>, message: String| TraceError {
            source: source.to_string(),
            line,
            column,
            message,
        };
        let mut lines = text.lines().enumerate();
        let Some((_, header)) = lines.next() else {
            return Err(err(0, None, "empty file: expected a header row".into()));
        };
        let names: Vec<&str> = header
            .trim_end_matches('\r')
            .split(',')
            .map(str::trim)
            .collect();
        let mut at = [0usize; 3];
        for (slot, want) in at.iter_mut().zip(COLUMNS) {
            *slot = names.iter().position(|n| *n == want).ok_or_else(|| {
                err(
                    1,
                    None,
                    format!(
                        "no `{want}` column (the header has {}); a trace needs {}",
                        names.join(","),
                        COLUMNS.join(", ")
                    ),
                )
            })?;
        }
        // Each column as (its position in a row, its name).
        let [timestamp, input, output] = {
            let [t, i, o] = at;
            let [tn, i_n, on] = COLUMNS;
            [(t, tn), (i, i_n), (o, on)]
        };
        let mut raw: Vec<(u64, Row)> = Vec::new();
        for (i, line) in lines {
            let n = i + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').collect();
            let field = |(at, name): (usize, &str)| {
                fields.get(at).map(|s| s.trim()).ok_or_else(|| {
                    err(
                        n,
                        Some(at + 1),
                        format!(
                            "missing field `{name}` (the row has {} fields)",
                            fields.len()
                        ),
                    )
                })
            };
            let ts =
                parse_timestamp(field(timestamp)?).map_err(|m| err(n, Some(timestamp.0 + 1), m))?;
            let tokens = |(at, name): (usize, &str)| -> Result<u32, TraceError> {
                let s = field((at, name))?;
                match s.parse::<u32>() {
                    Ok(v) if v <= MAX_TOKENS => Ok(v),
                    _ => Err(err(
                        n,
                        Some(at + 1),
                        format!(
                            "`{s}` is not a token count for `{name}` (a whole number 0..={MAX_TOKENS})"
                        ),
                    )),
                }
            };
            let row = Row {
                at_ms: 0,
                prompt: tokens(input)?,
                output: tokens(output)?,
                blocks: Blocks::default(),
            };
            raw.push((ts, row));
        }
        if raw.is_empty() {
            return Err(err(0, None, "no rows after the header".into()));
        }
        Ok(Trace::by_arrival(source, raw, Vec::new()))
    }

    /// Parse Mooncake JSON lines `text` (named `source` in errors): one
    /// object a line with `timestamp` (ms, a whole number), `input_length`
    /// and `output_length` (tokens, 0..=[`MAX_TOKENS`]) and `hash_ids` (the
    /// prompt's [`BLOCK_TOKENS`]-token blocks: exactly
    /// `ceil(input_length / 512)` whole numbers below 2^32); other fields
    /// are ignored, blank lines skipped. Rows are sorted by timestamp
    /// (ties in file order) and timed from the first.
    pub fn parse_jsonl(source: &str, text: &str) -> Result<Trace, TraceError> {
        let err = |line: usize, message: String| TraceError {
            source: source.to_string(),
            line,
            column: None,
            message,
        };
        let mut raw: Vec<(u64, Row)> = Vec::new();
        let mut block_ids: Vec<u32> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| err(n, format!("not a JSON object: {e}")))?;
            let Some(o) = v.as_object() else {
                return Err(err(
                    n,
                    "not a JSON object; expected {\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}".into(),
                ));
            };
            let field = |name: &str| {
                o.get(name).ok_or_else(|| {
                    err(
                        n,
                        format!(
                            "field `{name}`: missing (a Mooncake line has timestamp, input_length, output_length and hash_ids)"
                        ),
                    )
                })
            };
            let whole = |name: &str, max: u64, what: &str| -> Result<u64, TraceError> {
                let v = field(name)?;
                v.as_u64().filter(|x| *x <= max).ok_or_else(|| {
                    err(
                        n,
                        format!("field `{name}`: `{v}` is not {what} (a whole number 0..={max})"),
                    )
                })
            };
            let ts = whole("timestamp", u64::MAX / 2, "a time in ms")?;
            let cap = u64::from(MAX_TOKENS);
            let prompt = whole("input_length", cap, "a token count")? as u32;
            let output = whole("output_length", cap, "a token count")? as u32;
            let ids = field("hash_ids")?;
            let Some(ids) = ids.as_array() else {
                return Err(err(
                    n,
                    format!("field `hash_ids`: `{ids}` is not an array of block ids"),
                ));
            };
            let want = prompt.div_ceil(BLOCK_TOKENS) as usize;
            if ids.len() != want {
                return Err(err(
                    n,
                    format!(
                        "field `hash_ids`: {} block ids for input_length {prompt}; {BLOCK_TOKENS}-token blocks make {want}",
                        ids.len()
                    ),
                ));
            }
            let start = u32::try_from(block_ids.len()).map_err(|_| {
                err(
                    n,
                    "field `hash_ids`: more than 2^32 block ids in one trace".into(),
                )
            })?;
            for (k, id) in ids.iter().enumerate() {
                let id = id
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        err(
                            n,
                            format!(
                                "field `hash_ids`: element {k} `{id}` is not a block id (a whole number 0..={})",
                                u32::MAX
                            ),
                        )
                    })?;
                block_ids.push(id);
            }
            let blocks = Blocks {
                start,
                len: want as u32,
                copy: 0,
            };
            raw.push((
                ts,
                Row {
                    at_ms: 0,
                    prompt,
                    output,
                    blocks,
                },
            ));
        }
        if raw.is_empty() {
            return Err(err(0, "no request lines".into()));
        }
        Ok(Trace::by_arrival(source, raw, block_ids))
    }

    /// The trace of `raw` rows (arrival in ms, the row), sorted by arrival
    /// and counted from the first. Traces are mostly sorted; a stable sort
    /// keeps ties in file order.
    fn by_arrival(source: &str, mut raw: Vec<(u64, Row)>, block_ids: Vec<u32>) -> Trace {
        raw.sort_by_key(|r| r.0);
        let first = raw.first().map_or(0, |r| r.0);
        Trace {
            source: source.to_string(),
            rows: raw
                .into_iter()
                .map(|(t, r)| Row {
                    at_ms: t - first,
                    ..r
                })
                .collect(),
            block_ids,
        }
    }

    /// Whether `path` and its `text` are JSON lines (the Mooncake format):
    /// a name ending `.jsonl` or `.ndjson`, or a first non-blank byte `{`.
    pub fn is_jsonl(path: &std::path::Path, text: &str) -> bool {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        matches!(ext.as_deref(), Some("jsonl" | "ndjson")) || text.trim_start().starts_with('{')
    }

    /// Read and parse the trace file at `path`: JSON lines
    /// ([`Trace::is_jsonl`]), else CSV.
    pub fn read(path: &std::path::Path) -> Result<Trace, TraceError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TraceError {
            source: source.clone(),
            line: 0,
            column: None,
            message: format!("cannot read it: {e}"),
        })?;
        if Trace::is_jsonl(path, &text) {
            Trace::parse_jsonl(&source, &text)
        } else {
            Trace::parse(&source, &text)
        }
    }

    /// Whether its rows carry prompt blocks.
    pub fn has_blocks(&self) -> bool {
        !self.block_ids.is_empty()
    }

    /// A synthetic trace for tests: `n` Poisson arrivals at `per_s` per
    /// second, prompt and output sizes log-normal around the Azure
    /// conversation trace's medians (about 1,020 prompt and 129 output
    /// tokens).
    pub fn synthetic(seed: u64, n: usize, per_s: f64) -> Trace {
        let mut rng = Rng::new(seed ^ 0x5eed_7ace);
        let mut t = 0.0f64;
        let rows = (0..n)
            .map(|_| {
                t += rng.exponential(per_s.max(1e-9)) * 1000.0;
                Row {
                    at_ms: t as u64,
                    prompt: rng.log_normal(1020.0, 0.9).clamp(1.0, 32_000.0) as u32,
                    output: rng.log_normal(129.0, 1.0).clamp(1.0, 4_000.0) as u32,
                    blocks: Blocks::default(),
                }
            })
            .collect();
        Trace {
            source: "synthetic".into(),
            rows,
            block_ids: Vec::new(),
        }
    }

    /// The span from the first to the last request, ms (at least 1).
    pub fn span_ms(&self) -> u64 {
        self.rows.last().map_or(1, |r| r.at_ms.max(1))
    }
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` (UTC) as ms since the Unix epoch.
fn parse_timestamp(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a timestamp (expected `YYYY-MM-DD HH:MM:SS.fffffff`, UTC)");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (Some(Ok(y)), Some(Ok(mo)), Some(Ok(day)), None) = (d.next(), d.next(), d.next(), d.next())
    else {
        return Err(bad());
    };
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<i64>());
    let (Some(Ok(h)), Some(Ok(mi)), Some(Ok(sec)), None) = (t.next(), t.next(), t.next(), t.next())
    else {
        return Err(bad());
    };
    if !(1..=12).contains(&mo)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&h)
        || !(0..60).contains(&mi)
        || !(0..61).contains(&sec)
        || !(1970..=9999).contains(&y)
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let ms_frac = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
    let days = days_from_civil(y, mo, day);
    let ms = ((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms_frac;
    u64::try_from(ms).map_err(|_| bad())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Relative request rate by hour of day (UTC), linearly interpolated: the
/// weekday conversation shape of `../shared/docs/scheduling.md` §4.1 (Azure
/// LLM 2024 conversation traffic: peak to trough about 2.5:1, a morning
/// hump and a larger afternoon one; BurstGPT's lunch dip between them).
pub const DIURNAL: [f64; 24] = [
    0.55, 0.48, 0.43, 0.41, 0.40, 0.40, 0.42, 0.48, 0.58, 0.72, 0.85, 0.92, 0.88, 0.84, 0.88, 0.95,
    1.00, 1.00, 0.97, 0.90, 0.80, 0.72, 0.65, 0.60,
];

/// One day, ms.
pub const DAY_MS: u64 = 86_400_000;

/// How a trace becomes the simulation's arrivals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// As recorded, time divided by `speedup`.
    Replay {
        /// 2.0 plays an hour in 30 minutes.
        speedup: f64,
    },
    /// `copies` of the trace laid end to end and warped onto one day whose
    /// rate follows [`DIURNAL`].
    Day {
        /// How many times the trace repeats over the day.
        copies: u32,
    },
}

/// The arrivals of `trace` under `shape`, sorted.
pub fn arrivals(trace: &Trace, shape: Shape) -> Vec<Row> {
    match shape {
        Shape::Replay { speedup } => {
            let s = if speedup.is_finite() && speedup > 0.0 {
                speedup
            } else {
                1.0
            };
            trace
                .rows
                .iter()
                .map(|r| Row {
                    at_ms: (r.at_ms as f64 / s) as u64,
                    ..*r
                })
                .collect()
        }
        Shape::Day { copies } => {
            let warp = Warp::new();
            let span = trace.span_ms() as f64;
            let total = span * f64::from(copies.max(1));
            let mut out = Vec::with_capacity(trace.rows.len() * copies.max(1) as usize);
            for k in 0..copies.max(1) {
                for r in &trace.rows {
                    let u = (f64::from(k) * span + r.at_ms as f64) / total;
                    out.push(Row {
                        at_ms: warp.at(u),
                        blocks: Blocks {
                            copy: k,
                            ..r.blocks
                        },
                        ..*r
                    });
                }
            }
            out
        }
    }
}

/// Maps a fraction of the day's requests to the time of day at which that
/// fraction has arrived, under [`DIURNAL`] (the inverse of the cumulative
/// rate, per minute).
struct Warp {
    /// Cumulative rate at the end of each minute, normalised to 1.
    cumulative: Vec<f64>,
}

impl Warp {
    fn new() -> Warp {
        let mut acc = 0.0;
        let mut cumulative: Vec<f64> = (0..1440)
            .map(|m| {
                acc += rate_at(f64::from(m) + 0.5);
                acc
            })
            .collect();
        for c in &mut cumulative {
            *c /= acc;
        }
        Warp { cumulative }
    }

    /// The time (ms into the day) by which fraction `u` has arrived.
    fn at(&self, u: f64) -> u64 {
        let u = u.clamp(0.0, 1.0);
        let m = self.cumulative.partition_point(|c| *c < u);
        let before = if m == 0 {
            0.0
        } else {
            self.cumulative.get(m - 1).copied().unwrap_or(0.0)
        };
        let end = self.cumulative.get(m).copied().unwrap_or(1.0);
        let within = if end > before {
            (u - before) / (end - before)
        } else {
            0.0
        };
        (((m as f64) + within) * 60_000.0).min((DAY_MS - 1) as f64) as u64
    }
}

/// [`DIURNAL`] at minute `m` of the day, interpolated between hours.
pub fn rate_at(minute: f64) -> f64 {
    let h = (minute / 60.0 - 0.5).rem_euclid(24.0);
    let i = h.floor() as usize % 24;
    let f = h - h.floor();
    let a = DIURNAL.get(i).copied().unwrap_or(1.0);
    let b = DIURNAL.get((i + 1) % 24).copied().unwrap_or(1.0);
    a + (b - a) * f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_azure_timestamp_format_parses_to_ms() {
        let t = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
        assert_eq!(t, 1_700_158_546_680);
        assert_eq!(parse_timestamp("1970-01-01 00:00:01").unwrap(), 1000);
        for bad in [
            "",
            "2023-11-16",
            "2023-13-01 00:00:00",
            "2023-11-16 25:00:00",
            "x y",
            "2023-11-16 18:15:46.68a",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_row_is_named_by_line_and_column() {
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:47.0,12,-3\r\n";
        let e = Trace::parse("t.csv", csv).unwrap_err();
        assert_eq!((e.line, e.column), (3, Some(3)), "{e}");
        assert!(e.to_string().starts_with("t.csv:3, column 3:"), "{e}");
        let e = Trace::parse("t.csv", "TIMESTAMP,Prompt\n").unwrap_err();
        assert!(e.message.contains("ContextTokens"), "{e}");
        let e = Trace::parse(
            "t.csv",
            "GeneratedTokens,TIMESTAMP,ContextTokens\n5,nope,1\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (2, Some(2)), "{e}");
        assert!(Trace::parse("t.csv", "").is_err());
        assert!(Trace::parse("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n").is_err());
    }

    #[test]
    fn columns_may_come_in_any_order_and_rows_are_sorted() {
        let csv = "x,GeneratedTokens,ContextTokens,TIMESTAMP\n\
                   a,7,70,2023-11-16 00:00:02.5\n\
                   b,5,50,2023-11-16 00:00:01\n";
        let t = Trace::parse("t", csv).unwrap();
        assert_eq!(
            t.rows,
            vec![
                Row {
                    at_ms: 0,
                    prompt: 50,
                    output: 5,
                    blocks: Blocks::default(),
                },
                Row {
                    at_ms: 1500,
                    prompt: 70,
                    output: 7,
                    blocks: Blocks::default(),
                }
            ]
        );
    }

    #[test]
    fn a_day_follows_the_diurnal_curve() {
        let trace = Trace::synthetic(1, 20_000, 5.0);
        let day = arrivals(&trace, Shape::Day { copies: 3 });
        assert_eq!(day.len(), 60_000);
        assert!(day.iter().all(|r| r.at_ms < DAY_MS));
        let mut per_hour = [0u32; 24];
        for r in &day {
            per_hour[(r.at_ms / 3_600_000) as usize] += 1;
        }
        let (lo, hi) = (per_hour[4], per_hour[16]);
        let ratio = f64::from(hi) / f64::from(lo);
        assert!(
            (2.1..2.9).contains(&ratio),
            "peak/trough {ratio} ({per_hour:?})"
        );
    }

    #[test]
    fn mooncake_lines_carry_their_blocks_and_bad_ones_are_named() {
        let text = "{\"timestamp\": 30, \"input_length\": 1100, \"output_length\": 7, \"hash_ids\": [0, 5, 6]}\n\n\
                    {\"timestamp\": 10, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 4]}\n";
        let t = Trace::parse_jsonl("m.jsonl", text).unwrap();
        assert!(t.has_blocks());
        assert_eq!(t.rows.len(), 2);
        assert_eq!((t.rows[0].at_ms, t.rows[0].prompt), (0, 600));
        assert_eq!(t.rows[1].at_ms, 20);
        let keys: Vec<u64> = t.rows[1].blocks.keys(&t.block_ids).collect();
        assert_eq!(keys, vec![0, 5, 6]);
        let copy = Blocks {
            copy: 2,
            ..t.rows[0].blocks
        };
        assert_eq!(
            copy.keys(&t.block_ids).collect::<Vec<_>>(),
            vec![2 << 32, (2 << 32) | 4]
        );
        for (bad, line, field) in [
            ("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1}", 1, "hash_ids"),
            ("{\"timestamp\": -1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}", 1, "timestamp"),
            ("{\"timestamp\": 1, \"input_length\": \"x\", \"output_length\": 1, \"hash_ids\": [1]}", 1, "input_length"),
            ("{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1]}", 1, "hash_ids"),
            ("{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-3]}", 1, "hash_ids"),
        ] {
            let e = Trace::parse_jsonl("m.jsonl", bad).unwrap_err();
            assert_eq!(e.line, line, "{e}");
            assert!(e.message.starts_with(&format!("field `{field}`")), "{e}");
            assert!(e.to_string().starts_with("m.jsonl:1: field"), "{e}");
        }
        let e = Trace::parse_jsonl("m.jsonl", "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n[1]\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(Trace::parse_jsonl("m.jsonl", "{oops\n").is_err());
        assert!(Trace::parse_jsonl("m.jsonl", "\n").is_err());
        let p = std::path::Path::new;
        assert!(Trace::is_jsonl(p("t.JSONL"), "TIMESTAMP"));
        assert!(Trace::is_jsonl(p("t.txt"), "  {\"timestamp\": 1}"));
        assert!(!Trace::is_jsonl(p("t.csv"), "TIMESTAMP,ContextTokens"));
    }
}
