//! Token usage in a response, found as it streams by, without buffering it.
//!
//! Destinations report what a request used in the response itself: the
//! top-level `usage` object of a JSON body or, for server-sent events, of
//! one `data:` line near the stream's end. The response reaches the filter
//! in chunks of any size, and a completion can be large or a stream long,
//! so [`UsageScanner`] reads it in one pass with a few bytes of state: a
//! JSON reader that follows only nesting and strings, and looks at keys in
//! just two places, the top-level object and its `usage` object. Nothing
//! is held: memory stays constant whatever the response's size, and the
//! response path runs no general JSON parser (`serde_json` was most of the
//! filter's per-response instructions when it read the buffered body).
//!
//! What counts matches reading the body as
//! `{"usage": {"prompt_tokens" | "input_tokens": u64, "completion_tokens" | "output_tokens": u64}}`,
//! with the input tokens a provider served from its prompt cache:
//!
//! - OpenAI (chat completions `usage.prompt_tokens_details.cached_tokens`,
//!   the Responses API `usage.input_tokens_details.cached_tokens`,
//!   `CompletionUsage` in openai-node's `completions.ts`): the cached
//!   tokens are part of the input count;
//! - Anthropic (`cache_read_input_tokens`, `cache_creation_input_tokens`,
//!   `Usage` in anthropic-sdk-python's `types/usage.py`): cache reads and
//!   writes are *not* in `input_tokens`; the input booked is all three.
//!
//! The rules:
//!
//! - the `usage` member of the top-level object, itself an object; a token
//!   field that is absent or `null` counts 0;
//! - a token field holding anything but a non-negative integer that fits
//!   in 64 bits (a fraction, a negative number, a string, an object) makes
//!   the whole usage unreadable, rather than guessed at;
//! - the document must end (its top-level object closes, and only
//!   whitespace follows), so a truncated response keeps the estimate;
//! - keys are compared as written: one spelled with escapes
//!   (`"\u0075sage"`) is not recognised. A `usage` key that repeats, or a
//!   token field that repeats inside it (`prompt_tokens` and
//!   `input_tokens` count as the same field), makes the usage unreadable:
//!   which copy a reader takes differs between parsers, and an upstream
//!   could bill by one while ACE books the other. The rest of the document
//!   is not validated.
//!
//! Counts above `u32::MAX` are clamped to it.

/// Token usage reported by a destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every input token: `prompt_tokens` (or `input_tokens`), plus
    /// Anthropic's cache reads and writes, which it counts apart.
    pub input: u32,
    /// `completion_tokens` (or `output_tokens`).
    pub output: u32,
    /// Of `input`, those read from the provider's prompt cache.
    pub cache_read: u32,
    /// Of `input`, those written to it (Anthropic bills them apart).
    pub cache_write: u32,
}

/// Finds token usage in a response fed chunk by chunk, JSON or SSE.
#[derive(Debug, Clone)]
pub struct UsageScanner {
    /// `Some` for server-sent events: where the current line stands.
    sse: Option<Line>,
    /// The JSON document being read: the body, or the current `data:` line.
    doc: Doc,
    /// The last usage an SSE line reported.
    found: Option<Usage>,
}

impl UsageScanner {
    /// A scanner for a response; `sse` when its content type is
    /// `text/event-stream`.
    #[inline]
    pub fn new(sse: bool) -> UsageScanner {
        UsageScanner {
            sse: sse.then_some(Line::Prefix(0)),
            doc: Doc::default(),
            found: None,
        }
    }

    /// Feed the next chunk.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        let Some(line) = self.sse.as_mut() else {
            self.doc.feed(chunk);
            return;
        };
        while !chunk.is_empty() {
            let in_line = *line == Line::Data || *line == Line::Skip;
            if in_line && chunk.first() != Some(&b'\n') {
                // The rest of the line, at once.
                let end = chunk.iter().position(|&b| b == b'\n');
                let (this, rest) = chunk.split_at(end.unwrap_or(chunk.len()));
                if *line == Line::Data {
                    self.doc.feed(this);
                }
                chunk = rest;
                continue;
            }
            let Some((&b, rest)) = chunk.split_first() else {
                break;
            };
            chunk = rest;
            if b == b'\n' {
                if *line != Line::Skip {
                    if let Some(u) = self.doc.finish() {
                        self.found = Some(u);
                    }
                }
                self.doc = Doc::default();
                *line = Line::Prefix(0);
                continue;
            }
            *line = match *line {
                Line::Prefix(n) => match DATA.get(usize::from(n)) {
                    Some(&want) if want == b => {
                        if usize::from(n) + 1 == DATA.len() {
                            Line::Space
                        } else {
                            Line::Prefix(n + 1)
                        }
                    }
                    _ => Line::Skip,
                },
                // One space after the field name belongs to the syntax.
                Line::Space => {
                    if b != b' ' {
                        self.doc.feed(&[b]);
                    }
                    Line::Data
                }
                other => other,
            };
        }
    }

    /// The usage, once the whole response was fed.
    pub fn finish(&mut self) -> Option<Usage> {
        match self.sse {
            None => self.doc.finish(),
            Some(line) => {
                // A last line without its newline still counts.
                if matches!(line, Line::Space | Line::Data) {
                    if let Some(u) = self.doc.finish() {
                        self.found = Some(u);
                    }
                }
                self.doc = Doc::default();
                self.sse = Some(Line::Prefix(0));
                self.found
            }
        }
    }
}

/// The SSE field whose lines carry JSON.
const DATA: &[u8] = b"data:";

/// Where an SSE line stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Matched this many bytes of [`DATA`].
    Prefix(u8),
    /// Just after `data:`.
    Space,
    /// In the data: bytes go to the JSON reader.
    Data,
    /// Not a data line.
    Skip,
}

/// The keys the reader looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Key {
    #[default]
    Other,
    Usage,
    Input,
    Output,
    /// Anthropic's `cache_read_input_tokens`.
    CacheRead,
    /// Anthropic's `cache_creation_input_tokens`.
    CacheWrite,
    /// OpenAI's `prompt_tokens_details` or `input_tokens_details`.
    Details,
    /// `cached_tokens` in the details.
    Cached,
}

impl Key {
    /// Its bit in `fields_seen` (0: not a field counted).
    fn bit(self) -> u8 {
        match self {
            Key::Input => 1,
            Key::Output => 2,
            Key::CacheRead => 4,
            Key::CacheWrite => 8,
            Key::Details => 16,
            Key::Cached => 32,
            Key::Other | Key::Usage => 0,
        }
    }
}

/// The longest key looked for (`cache_creation_input_tokens`).
const KEY_MAX: usize = 27;

/// A token field's value as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// Digits so far.
    Digits(u64),
    /// This many bytes of `null`.
    Null(u8),
    /// Not a count.
    Bad,
}

/// One JSON document's reader (see the module docs).
#[derive(Debug, Clone, Default)]
struct Doc {
    /// Containers open.
    depth: u32,
    /// The first byte that is not whitespace was seen.
    started: bool,
    /// The top-level object closed.
    done: bool,
    /// Nothing to find: not an object at the top, or bytes after its end.
    dead: bool,
    in_string: bool,
    escape: bool,
    /// The next string at a watched depth is a key.
    key_next: bool,
    /// The current string is a key being compared.
    capturing: bool,
    key_buf: [u8; KEY_MAX],
    /// Bytes of the key so far; above [`KEY_MAX`] it matches nothing.
    key_len: usize,
    /// The key whose value comes next, at a watched depth.
    key: Key,
    /// Depth 2 is the top-level object's `usage`.
    in_usage: bool,
    /// Depth 3 is that `usage`'s token details.
    in_details: bool,
    /// A `usage` key was read in this document.
    usage_seen: bool,
    /// The `usage` key was read twice.
    duplicate: bool,
    /// Fields read so far in this `usage` ([`Key::bit`]).
    fields_seen: u8,
    /// A token field's value being read.
    value: Option<Value>,
    input: u64,
    output: u64,
    /// Cache counts, clamped as read (their sum is clamped again).
    cache_read: u32,
    cache_write: u32,
    cached: u32,
    /// A token field of this `usage` is not a count.
    bad: bool,
    /// The last `usage` object that closed.
    usage: Option<Usage>,
}

impl Doc {
    /// Keys matter in the top-level object and in its `usage` object.
    fn watched(&self, depth: u32) -> bool {
        depth == 1 || (depth == 2 && self.in_usage) || (depth == 3 && self.in_details)
    }

    /// Read `bytes`. Strings are taken a run at a time (up to the next
    /// quote or backslash), and where no key is looked for everything but
    /// strings and brackets is skipped at once; the rest goes byte by byte.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !self.dead {
            if self.in_string {
                bytes = self.string_run(bytes);
                if bytes.is_empty() {
                    return;
                }
                continue;
            }
            let skip = if self.started && !self.done && !self.watched(self.depth) {
                find(bytes, b"\"{[]}")
            } else {
                0
            };
            let Some((&b, rest)) = bytes.get(skip..).and_then(|b| b.split_first()) else {
                return;
            };
            self.byte(b);
            bytes = rest;
        }
    }

    /// Inside a string: take bytes up to and including the next quote or
    /// backslash (and the byte a backslash escapes); returns the rest.
    fn string_run<'a>(&mut self, bytes: &'a [u8]) -> &'a [u8] {
        let mut bytes = bytes;
        if self.escape {
            let Some((_, rest)) = bytes.split_first() else {
                return bytes;
            };
            self.escape = false;
            bytes = rest;
        }
        let (run, rest) = bytes.split_at(find(bytes, b"\"\\"));
        if self.capturing {
            let at = self.key_len;
            match self.key_buf.get_mut(at..at + run.len()) {
                Some(dst) => {
                    dst.copy_from_slice(run);
                    self.key_len = at + run.len();
                }
                None => self.key_len = KEY_MAX + 1,
            }
        }
        let Some((&b, rest)) = rest.split_first() else {
            return rest;
        };
        if b == b'"' {
            self.in_string = false;
            if self.capturing {
                self.capturing = false;
                self.key = self.captured();
            }
        } else {
            // A backslash. Escaped keys are not decoded: this one
            // matches nothing.
            self.escape = true;
            self.key_len = KEY_MAX + 1;
        }
        rest
    }

    fn byte(&mut self, b: u8) {
        if self.dead {
            return;
        }
        let structural = matches!(
            b,
            b' ' | b'\t' | b'\n' | b'\r' | b'"' | b'{' | b'[' | b'}' | b']' | b',' | b':'
        );
        if structural {
            self.end_value();
        }
        if self.done {
            // Only whitespace may follow the document.
            if !b.is_ascii_whitespace() {
                self.dead = true;
                self.usage = None;
            }
            return;
        }
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => {}
            b'"' => {
                if !self.started {
                    self.dead = true;
                    return;
                }
                if self.token_field() {
                    self.bad = true;
                    self.key = Key::Other;
                }
                self.in_string = true;
                self.capturing = self.key_next && self.watched(self.depth);
                self.key_next = false;
                self.key_len = 0;
            }
            b'{' | b'[' => {
                if !self.started {
                    self.started = true;
                    if b == b'[' {
                        self.dead = true;
                        return;
                    }
                }
                if self.token_field() {
                    self.bad = true;
                }
                if self.depth == 1 && b == b'{' && self.key == Key::Usage {
                    self.in_usage = true;
                    self.input = 0;
                    self.output = 0;
                    self.cache_read = 0;
                    self.cache_write = 0;
                    self.cached = 0;
                    self.bad = false;
                    self.fields_seen = 0;
                }
                if self.depth == 2 && self.in_usage && b == b'{' && self.key == Key::Details {
                    self.in_details = true;
                }
                self.depth = self.depth.saturating_add(1);
                self.key = Key::Other;
                self.key_next = b == b'{' && self.watched(self.depth);
            }
            b'}' | b']' => {
                if self.depth == 3 && self.in_details {
                    self.in_details = false;
                }
                if self.depth == 2 && self.in_usage {
                    self.in_usage = false;
                    self.usage = (!self.bad).then(|| self.counted());
                }
                self.depth = self.depth.saturating_sub(1);
                self.key = Key::Other;
                self.key_next = false;
                if self.depth == 0 {
                    self.done = true;
                }
            }
            b',' => {
                if self.watched(self.depth) {
                    self.key = Key::Other;
                    self.key_next = true;
                }
            }
            b':' => {}
            _ => {
                if !self.started {
                    self.dead = true;
                } else if let Some(v) = self.value.as_mut() {
                    *v = v.next(b);
                } else if self.token_field() {
                    self.value = Some(Value::Digits(0).next(b));
                }
            }
        }
    }

    /// The key just read, as one of those looked for (a token field seen
    /// twice in one `usage` marks it unreadable).
    fn captured(&mut self) -> Key {
        let Some(k) = self.key_buf.get(..self.key_len) else {
            return Key::Other;
        };
        let key = match (self.depth, k) {
            (1, b"usage") => Key::Usage,
            (2, b"prompt_tokens" | b"input_tokens") => Key::Input,
            (2, b"completion_tokens" | b"output_tokens") => Key::Output,
            (2, b"cache_read_input_tokens") => Key::CacheRead,
            (2, b"cache_creation_input_tokens") => Key::CacheWrite,
            (2, b"prompt_tokens_details" | b"input_tokens_details") => Key::Details,
            (3, b"cached_tokens") => Key::Cached,
            _ => Key::Other,
        };
        let bit = key.bit();
        if bit != 0 && self.in_usage {
            if self.fields_seen & bit != 0 {
                self.bad = true;
            }
            self.fields_seen |= bit;
        }
        if key == Key::Usage {
            // A second `usage` key, whatever its value: unreadable.
            self.duplicate |= self.usage_seen;
            self.usage_seen = true;
        }
        key
    }

    /// Whether the next value is a token count of `usage`.
    fn token_field(&self) -> bool {
        (self.in_usage
            && self.depth == 2
            && matches!(
                self.key,
                Key::Input | Key::Output | Key::CacheRead | Key::CacheWrite
            ))
            || (self.in_details && self.depth == 3 && self.key == Key::Cached)
    }

    /// The `usage` object just closed, as booked: Anthropic's cache reads
    /// and writes added to its input (it counts them apart); OpenAI's
    /// cached tokens already in it (at most all of it).
    fn counted(&self) -> Usage {
        let anthropic = self.fields_seen & (Key::CacheRead.bit() | Key::CacheWrite.bit()) != 0;
        if anthropic {
            Usage {
                input: clamp(
                    self.input
                        .saturating_add(u64::from(self.cache_read))
                        .saturating_add(u64::from(self.cache_write)),
                ),
                output: clamp(self.output),
                cache_read: self.cache_read,
                cache_write: self.cache_write,
            }
        } else {
            Usage {
                input: clamp(self.input),
                output: clamp(self.output),
                cache_read: self.cached.min(clamp(self.input)),
                cache_write: 0,
            }
        }
    }

    /// A token field's bare value ended: book it.
    fn end_value(&mut self) {
        let Some(v) = self.value.take() else {
            return;
        };
        let n = match v {
            Value::Digits(n) => n,
            Value::Null(4) => 0,
            _ => {
                self.bad = true;
                0
            }
        };
        match self.key {
            Key::Input => self.input = n,
            Key::Output => self.output = n,
            Key::CacheRead => self.cache_read = clamp(n),
            Key::CacheWrite => self.cache_write = clamp(n),
            Key::Cached => self.cached = clamp(n),
            _ => {}
        }
        self.key = Key::Other;
    }

    fn finish(&mut self) -> Option<Usage> {
        self.end_value();
        if self.done && !self.dead && !self.duplicate {
            self.usage
        } else {
            None
        }
    }
}

impl Value {
    /// The value with one more byte. `Digits(0)` is also the start state:
    /// the first byte decides between a count and `null`.
    fn next(self, b: u8) -> Value {
        const NULL: &[u8] = b"null";
        match self {
            Value::Digits(n) if b.is_ascii_digit() => n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(b - b'0')))
                .map_or(Value::Bad, Value::Digits),
            Value::Digits(0) if b == b'n' => Value::Null(1),
            Value::Null(k) if NULL.get(usize::from(k)) == Some(&b) => Value::Null(k + 1),
            _ => Value::Bad,
        }
    }
}

/// The index of the first byte of `bytes` that is one of `targets`, or
/// `bytes.len()`: eight bytes at a time (responses are mostly long strings
/// with nothing to look at).
fn find<const N: usize>(bytes: &[u8], targets: &[u8; N]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        let x = u64::from_le_bytes(a);
        // A byte of `x ^ t` is zero <=> that byte is `t`; the lowest byte
        // flagged below is exact (a borrow only flags bytes above a zero).
        let hits = targets.iter().fold(0, |acc, &t| {
            let y = x ^ (ONES * u64::from(t));
            acc | (y.wrapping_sub(ONES) & !y & HIGH)
        });
        if hits != 0 {
            return at + (hits.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|c| targets.contains(c))
        .map_or(bytes.len(), |i| at + i)
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value as Json};

    /// What `serde_json` reads from a whole body: the behaviour the
    /// scanner keeps without buffering.
    fn reference(body: &[u8]) -> Option<Usage> {
        #[derive(serde::Deserialize)]
        struct Counts {
            #[serde(default, alias = "input_tokens")]
            prompt_tokens: Option<u64>,
            #[serde(default, alias = "output_tokens")]
            completion_tokens: Option<u64>,
            #[serde(default)]
            cache_read_input_tokens: Option<u64>,
            #[serde(default)]
            cache_creation_input_tokens: Option<u64>,
            #[serde(default, alias = "input_tokens_details")]
            prompt_tokens_details: Option<Json>,
        }
        #[derive(serde::Deserialize)]
        struct Body {
            #[serde(default)]
            usage: Option<Counts>,
        }
        let u = serde_json::from_slice::<Body>(body).ok()?.usage?;
        // Details count only as an object, whose `cached_tokens` is a
        // count or null.
        let cached = match u.prompt_tokens_details {
            Some(Json::Object(d)) => match d.get("cached_tokens") {
                None | Some(Json::Null) => 0,
                Some(v) => v.as_u64()?,
            },
            _ => 0,
        };
        let (input, read, write) = (
            u.prompt_tokens.unwrap_or(0),
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
        );
        Some(if read.is_some() || write.is_some() {
            let (read, write) = (read.unwrap_or(0), write.unwrap_or(0));
            Usage {
                input: clamp(input.saturating_add(read).saturating_add(write)),
                output: u.completion_tokens.map_or(0, clamp),
                cache_read: clamp(read),
                cache_write: clamp(write),
            }
        } else {
            Usage {
                input: clamp(input),
                output: u.completion_tokens.map_or(0, clamp),
                cache_read: clamp(cached.min(input)),
                cache_write: 0,
            }
        })
    }

    fn scan(body: &[u8], sse: bool, chunk: usize) -> Option<Usage> {
        let mut s = UsageScanner::new(sse);
        for c in body.chunks(chunk.max(1)) {
            s.feed(c);
        }
        s.finish()
    }

    fn usage(input: u32, output: u32) -> Option<Usage> {
        Some(Usage {
            input,
            output,
            ..Usage::default()
        })
    }

    #[test]
    fn cached_input_in_each_providers_shape() {
        let cached = |input, output, cache_read, cache_write| {
            Some(Usage {
                input,
                output,
                cache_read,
                cache_write,
            })
        };
        for (body, want) in [
            // OpenAI chat completions: cached tokens are part of the prompt.
            (
                &br#"{"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,
                   "prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},
                   "completion_tokens_details":{"reasoning_tokens":0}}}"#[..],
                cached(2006, 300, 1920, 0),
            ),
            // The Responses API.
            (
                br#"{"object":"response","usage":{"input_tokens":1300,"input_tokens_details":{"cached_tokens":1024},
                   "output_tokens":50,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1350}}"#,
                cached(1300, 50, 1024, 0),
            ),
            // Anthropic: reads and writes counted apart from input_tokens.
            (
                br#"{"type":"message","usage":{"input_tokens":21,"cache_creation_input_tokens":188086,
                   "cache_read_input_tokens":0,"output_tokens":393}}"#,
                cached(188_107, 393, 0, 188_086),
            ),
            (
                br#"{"usage":{"input_tokens":50,"cache_read_input_tokens":100000,"output_tokens":12}}"#,
                cached(100_050, 12, 100_000, 0),
            ),
            // Details that are not an object, or null counts: nothing cached.
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":null,"completion_tokens":1}}"#,
                cached(10, 1, 0, 0),
            ),
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":null}}}"#,
                cached(10, 0, 0, 0),
            ),
            // More cached than the prompt: at most all of it.
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":99}}}"#,
                cached(10, 0, 10, 0),
            ),
            // A cached count that is not a count, or given twice: unreadable.
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":"5"}}}"#,
                None,
            ),
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1},"input_tokens_details":{}}}"#,
                None,
            ),
            (
                br#"{"usage":{"input_tokens":1,"cache_read_input_tokens":2,"cache_read_input_tokens":3}}"#,
                None,
            ),
            // `cached_tokens` anywhere else is not the usage's.
            (
                br#"{"cached_tokens":5,"usage":{"prompt_tokens":10,"x":{"cached_tokens":7}}}"#,
                cached(10, 0, 0, 0),
            ),
        ] {
            let text = String::from_utf8_lossy(body);
            for chunk in [1, 3, 7, body.len()] {
                assert_eq!(scan(body, false, chunk), want, "{text} in chunks of {chunk}");
            }
            assert_eq!(reference(body), want, "the reference agrees: {text}");
        }
    }

    #[test]
    fn usage_from_a_json_body_in_chunks() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        for chunk in 1..body.len() {
            assert_eq!(scan(body, false, chunk), usage(12, 34), "chunk {chunk}");
        }
    }

    #[test]
    fn usage_from_an_sse_stream_split_anywhere() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\r\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut s = UsageScanner::new(true);
            let (a, b) = stream.split_at(split);
            s.feed(a);
            s.feed(b);
            assert_eq!(s.finish(), usage(5, 9), "split at {split}");
        }
        // The last line needs no newline; `data:` needs no space.
        assert_eq!(
            scan(b"event: x\ndata:{\"usage\":{\"output_tokens\":3}}", true, 4),
            usage(0, 3)
        );
    }

    #[test]
    fn a_repeated_usage_or_token_field_is_unreadable() {
        for body in [
            &br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":4294967295}}"#[..],
            br#"{"usage":{"prompt_tokens":1},"usage":null}"#,
            br#"{"usage":{"prompt_tokens":1,"prompt_tokens":9}}"#,
            br#"{"usage":{"prompt_tokens":1,"input_tokens":9}}"#,
            br#"{"usage":{"completion_tokens":1,"output_tokens":9}}"#,
        ] {
            for chunk in 1..body.len() {
                assert_eq!(
                    scan(body, false, chunk),
                    None,
                    "{} in chunks of {chunk}",
                    String::from_utf8_lossy(body)
                );
            }
        }
        // Each SSE line is its own document: a later line's usage (engines
        // that report cumulative usage on every chunk) replaces the earlier.
        let stream = b"data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\n";
        assert_eq!(scan(stream, true, 5), usage(2, 0));
    }

    #[test]
    fn only_the_top_level_usage_counts() {
        for (body, want) in [
            (&br#"{"choices":[{"usage":{"prompt_tokens":1}}]}"#[..], None),
            (br#"{"x":{"usage":{"prompt_tokens":1}}}"#, None),
            (
                br#"{"usage":{"x":{"prompt_tokens":1}},"a":"usage"}"#,
                usage(0, 0),
            ),
            (
                br#"{"usage":{"input_tokens":7,"output_tokens":8}}"#,
                usage(7, 8),
            ),
            (br#"{"usage":{"prompt_tokens":null}}"#, usage(0, 0)),
            (br#"{"usage":null}"#, None),
            (br#"{"usage":"{\"prompt_tokens\":1}"}"#, None),
            (
                br#"{"a":"}{\"usage\"","usage":{"prompt_tokens":2}}"#,
                usage(2, 0),
            ),
            (
                br#"{"usage":{"prompt_tokens":99999999999}}"#,
                usage(u32::MAX, 0),
            ),
        ] {
            assert_eq!(
                scan(body, false, 3),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(reference(body), want, "reference disagrees");
        }
        // serde reads a struct from an array too; here an array is not an
        // object, so it holds no usage.
        assert_eq!(scan(br#"[{"usage":{"prompt_tokens":1}}]"#, false, 3), None);
        assert_eq!(scan(br#"{"usage":[1]}"#, false, 3), None);
    }

    #[test]
    fn counts_that_are_not_counts_make_usage_unreadable() {
        for body in [
            &br#"{"usage":{"prompt_tokens":1.5}}"#[..],
            br#"{"usage":{"prompt_tokens":-1}}"#,
            br#"{"usage":{"prompt_tokens":1e3}}"#,
            br#"{"usage":{"prompt_tokens":"12"}}"#,
            br#"{"usage":{"completion_tokens":{}}}"#,
            br#"{"usage":{"completion_tokens":[1]}}"#,
            br#"{"usage":{"completion_tokens":true}}"#,
            br#"{"usage":{"completion_tokens":nul}}"#,
            br#"{"usage":{"completion_tokens":18446744073709551616}}"#,
        ] {
            let text = String::from_utf8_lossy(body);
            assert_eq!(scan(body, false, 5), None, "{text}");
            assert_eq!(reference(body), None, "reference disagrees on {text}");
        }
    }

    #[test]
    fn an_unfinished_or_trailing_document_books_nothing() {
        for body in [
            &br#"{"usage":{"prompt_tokens":4}"#[..],
            br#"{"usage":{"prompt_tokens":4}} x"#,
            br#"{"usage":{"prompt_tokens":4}}{}"#,
            b"",
            b"   ",
        ] {
            assert_eq!(scan(body, false, 2), None);
        }
        assert_eq!(scan(b" {\"usage\":{}} \n", false, 2), usage(0, 0));
    }

    /// A JSON value of some depth, for the property test.
    fn any_json() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::from),
            any::<i64>().prop_map(Json::from),
            (-1e6f64..1e6).prop_map(Json::from),
            "[a-z\"\\\\{}\\[\\]:, ]{0,8}".prop_map(Json::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Json::from),
                prop::collection::btree_map("[a-z_]{1,14}|usage|prompt_tokens", inner, 0..4)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A token field's value: mostly counts, sometimes not.
    fn count() -> impl Strategy<Value = Json> {
        prop_oneof![
            6 => any::<u64>().prop_map(Json::from),
            2 => (0u64..1000).prop_map(Json::from),
            1 => Just(Json::Null),
            1 => any_json(),
        ]
    }

    /// A response body with a usage object somewhere, or none.
    fn body() -> impl Strategy<Value = Json> {
        (
            prop::collection::btree_map("[a-z_]{1,10}", any_json(), 0..4),
            prop::option::of((
                prop::option::of((any::<bool>(), count())),
                prop::option::of((any::<bool>(), count())),
                prop::collection::btree_map("[a-z_]{1,10}", any_json(), 0..3),
                prop::option::of(prop_oneof![
                    // OpenAI's details (an object with a count, or
                    // anything), or Anthropic's cache counts.
                    (any::<bool>(), count()).prop_map(|(alias, c)| {
                        let k = if alias {
                            "input_tokens_details"
                        } else {
                            "prompt_tokens_details"
                        };
                        vec![(k.to_string(), json!({ "cached_tokens": c }))]
                    }),
                    any_json().prop_map(|v| vec![("prompt_tokens_details".to_string(), v)]),
                    (prop::option::of(count()), prop::option::of(count())).prop_map(|(r, w)| {
                        let mut v = Vec::new();
                        if let Some(r) = r {
                            v.push(("cache_read_input_tokens".to_string(), r));
                        }
                        if let Some(w) = w {
                            v.push(("cache_creation_input_tokens".to_string(), w));
                        }
                        v
                    }),
                ]),
            )),
            any::<bool>(),
        )
            .prop_map(|(rest, usage, nest)| {
                let mut top: serde_json::Map<String, Json> = rest.into_iter().collect();
                if let Some((input, output, extra, cache)) = usage {
                    let mut u: serde_json::Map<String, Json> = extra.into_iter().collect();
                    u.extend(cache.into_iter().flatten());
                    if let Some((alias, v)) = input {
                        u.insert(
                            if alias {
                                "input_tokens"
                            } else {
                                "prompt_tokens"
                            }
                            .into(),
                            v,
                        );
                    }
                    if let Some((alias, v)) = output {
                        let k = if alias {
                            "output_tokens"
                        } else {
                            "completion_tokens"
                        };
                        u.insert(k.into(), v);
                    }
                    let u = Json::Object(u);
                    if nest {
                        top.insert("choices".into(), json!([{ "usage": u }]));
                    } else {
                        top.insert("usage".into(), u);
                    }
                }
                Json::Object(top)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Streamed in any chunking, as JSON or as an SSE line, the scanner
        /// finds what a full parse of the whole body finds.
        #[test]
        fn matches_a_full_parse(b in body(), pretty in any::<bool>(), chunk in 1usize..40) {
            let text = if pretty {
                serde_json::to_string_pretty(&b)
            } else {
                serde_json::to_string(&b)
            }
            .unwrap_or_default();
            let want = reference(text.as_bytes());
            prop_assert_eq!(scan(text.as_bytes(), false, chunk), want, "{}", text);
            if !pretty {
                let sse = format!("data: {{}}\n\ndata: {text}\n\ndata: [DONE]\n\n");
                prop_assert_eq!(scan(sse.as_bytes(), true, chunk), want, "{}", sse);
            }
        }

        /// The word-at-a-time search finds what a byte loop finds.
        #[test]
        fn find_is_a_byte_search(data in prop::collection::vec(prop::sample::select(b"ab\"\\{}[]".to_vec()), 0..40)) {
            let want = |t: &[u8]| data.iter().position(|c| t.contains(c)).unwrap_or(data.len());
            prop_assert_eq!(find(&data, b"\"\\"), want(b"\"\\"));
            prop_assert_eq!(find(&data, b"\"{[]}"), want(b"\"{[]}"));
        }

        /// Arbitrary bytes in any chunking: an answer, never a panic.
        #[test]
        fn arbitrary_bytes_are_safe(data in prop::collection::vec(any::<u8>(), 0..300), chunk in 1usize..20) {
            let _ = scan(&data, false, chunk);
            let _ = scan(&data, true, chunk);
        }
    }
}
