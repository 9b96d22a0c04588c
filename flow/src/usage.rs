//! Token usage in a response, found as it streams by, without buffering it.
//!
//! Destinations report what a request used in the response itself, in one
//! of a few shapes the providers document (the fixtures of
//! `flow/tests/fixtures/usage/` are copies of their examples, each citing
//! its page):
//!
//! - a JSON body's top-level `usage` object: OpenAI chat completions and
//!   the Responses API, Azure OpenAI, Gemini's OpenAI-compatible
//!   endpoint, Anthropic Messages;
//! - a server-sent event stream, each `data:` line a JSON document:
//!   - OpenAI chat completions (and every OpenAI-compatible server): the
//!     top-level `usage` of a chunk, `null` on every chunk but the last
//!     when `stream_options.include_usage` asked for it (cumulative on
//!     every chunk for engines that report it so);
//!   - the Responses API: `response.usage` of the `response.completed`,
//!     `response.incomplete` and `response.failed` events (`null` in
//!     `response.created` and `response.in_progress`);
//!   - Anthropic Messages: `message.usage` of `message_start` (the input
//!     and cache counts, an output count that is not final) and the
//!     top-level `usage` of `message_delta`, whose counts are cumulative
//!     and may or may not repeat the input and cache counts.
//!
//! Across a stream each count is the latest value any event reported: an
//! event that leaves a count out (or says `null`) leaves it as it was,
//! and counts are never added up (they are totals so far, not
//! increments). A stream whose only usage is `message_start`'s has no
//! final output count and is not read.
//!
//! The response reaches the filter in chunks of any size, and a completion
//! can be large or a stream long, so [`UsageScanner`] reads it in one pass
//! with a few bytes of state: a JSON reader that follows only nesting and
//! strings, and looks at keys in a few places (the top-level object, its
//! `response` and `message` objects, a `usage` object there and its token
//! details). Nothing is held: memory stays constant whatever the
//! response's size, no allocation is made, and the response path runs no
//! general JSON parser (`serde_json` was most of the filter's
//! per-response instructions when it read the buffered body).
//!
//! The counts, with the input tokens a provider served from or wrote to
//! its prompt cache:
//!
//! - OpenAI (chat completions `usage.prompt_tokens_details.cached_tokens`
//!   and `cache_write_tokens`, the Responses API
//!   `usage.input_tokens_details.cached_tokens` and `cache_write_tokens`;
//!   `CompletionUsage` and `ResponseUsage` in OpenAI's OpenAPI
//!   description): the cached tokens are part of the input count;
//! - Anthropic (`cache_read_input_tokens`, `cache_creation_input_tokens`,
//!   `Usage` in anthropic-sdk-python's `types/usage.py`): cache reads and
//!   writes are *not* in `input_tokens`; the input booked is all three.
//!
//! The rules, which fail towards the request's estimate rather than
//! towards a guess:
//!
//! - a token count is a non-negative integer that fits in 64 bits, or
//!   `null` (not reported); anything else (a fraction, a negative number,
//!   a string, an object) makes that usage unreadable;
//! - an answer's usage must report its input tokens (`prompt_tokens` or
//!   `input_tokens`); an absent output count is 0 (embeddings have none);
//! - a document holding a usage must end (its top-level object closes,
//!   and only whitespace follows), so a truncated response keeps the
//!   estimate;
//! - keys are compared as written: one spelled with escapes
//!   (`"\u0075sage"`) is not recognised. A `usage` key that repeats in a
//!   document (at any of its places), a repeated `response` or `message`
//!   key, or a token field that repeats inside one `usage`
//!   (`prompt_tokens` and `input_tokens` count as the same field) makes
//!   the usage unreadable: which copy a reader takes differs between
//!   parsers, and an upstream could bill by one while ACE books the
//!   other. The rest of the document is not validated;
//! - one unreadable usage anywhere in a stream makes the whole answer's
//!   unreadable.
//!
//! An answer whose usage is unreadable, or that reports none, is booked at
//! the request's estimate (the flow counts it in `ace.usage.unread`).
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
    /// Of `input`, those written to it.
    pub cache_write: u32,
}

/// A count a `usage` object may report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// `prompt_tokens` or `input_tokens`.
    Input,
    /// `completion_tokens` or `output_tokens`.
    Output,
    /// Anthropic's `cache_read_input_tokens` (apart from the input).
    CacheRead,
    /// Anthropic's `cache_creation_input_tokens` (apart from the input).
    CacheWrite,
    /// OpenAI's `…_tokens_details.cached_tokens` (part of the input).
    Cached,
    /// OpenAI's `…_tokens_details.cache_write_tokens` (part of the input).
    CachedWrite,
}

impl Count {
    const ALL: [Count; 6] = [
        Count::Input,
        Count::Output,
        Count::CacheRead,
        Count::CacheWrite,
        Count::Cached,
        Count::CachedWrite,
    ];
}

/// The counts a `usage` object reported, each only if it gave one (a
/// count, not `null`): its value, and its bit in `given`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    n: [u32; 6],
    given: u8,
}

impl Counts {
    fn get(&self, c: Count) -> Option<u32> {
        let i = c as usize;
        if self.given & (1 << i) == 0 {
            return None;
        }
        self.n.get(i).copied()
    }

    fn set(&mut self, c: Count, v: Option<u32>) {
        let i = c as usize;
        match (v, self.n.get_mut(i)) {
            (Some(v), Some(slot)) => {
                *slot = v;
                self.given |= 1 << i;
            }
            _ => self.given &= !(1 << i),
        }
    }

    /// Each count `later` reported replaces this one's; the others stay.
    fn merge(&mut self, later: Counts) {
        for c in Count::ALL {
            if let Some(v) = later.get(c) {
                self.set(c, Some(v));
            }
        }
    }

    /// As booked: Anthropic's cache reads and writes added to its input
    /// (it counts them apart); OpenAI's cached tokens already in it (at
    /// most all of it). `None` without an input count.
    fn usage(&self) -> Option<Usage> {
        let input = self.get(Count::Input)?;
        let output = self.get(Count::Output).unwrap_or(0);
        let (read, write) = (self.get(Count::CacheRead), self.get(Count::CacheWrite));
        Some(if read.is_some() || write.is_some() {
            let (read, write) = (read.unwrap_or(0), write.unwrap_or(0));
            Usage {
                input: input.saturating_add(read).saturating_add(write),
                output,
                cache_read: read,
                cache_write: write,
            }
        } else {
            let read = self.get(Count::Cached).unwrap_or(0).min(input);
            Usage {
                input,
                output,
                cache_read: read,
                cache_write: self.get(Count::CachedWrite).unwrap_or(0).min(input - read),
            }
        })
    }
}

/// Where a `usage` object sits in its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The top-level object's `usage`.
    Top,
    /// `response.usage`: a Responses API event's.
    Response,
    /// `message.usage`: Anthropic's `message_start`, whose output count
    /// is not final.
    Message,
}

/// What one document said of usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// No usage (none there, or `null`).
    Nothing,
    /// A usage object, read.
    Counts(Counts, Place),
    /// A usage that is there but cannot be read.
    Unreadable,
}

/// The usage of a whole answer, document by document.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// The latest value of each count.
    counts: Counts,
    /// A usage that speaks for the answer was read (not only
    /// `message.usage`).
    settled: bool,
    /// A usage could not be read.
    unreadable: bool,
}

impl Tally {
    fn take(&mut self, found: Found) {
        match found {
            Found::Nothing => {}
            Found::Unreadable => self.unreadable = true,
            Found::Counts(counts, place) => {
                self.counts.merge(counts);
                self.settled |= place != Place::Message;
            }
        }
    }

    fn usage(&self) -> Option<Usage> {
        if self.unreadable || !self.settled {
            return None;
        }
        self.counts.usage()
    }
}

/// Finds token usage in a response fed chunk by chunk, JSON or SSE.
#[derive(Debug, Clone)]
pub struct UsageScanner {
    /// `Some` for server-sent events: where the current line stands.
    sse: Option<Line>,
    /// The JSON document being read: the body, or the current `data:` line.
    doc: Doc,
    /// What the documents read so far said.
    tally: Tally,
}

impl UsageScanner {
    /// A scanner for a response; `sse` when its content type is
    /// `text/event-stream`.
    #[inline]
    pub fn new(sse: bool) -> UsageScanner {
        UsageScanner {
            sse: sse.then_some(Line::Prefix(0)),
            doc: Doc::default(),
            tally: Tally::default(),
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
                    self.tally.take(self.doc.finish());
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

    /// The usage, once the whole response was fed: `None` when the answer
    /// reported none, or none that could be read.
    pub fn finish(&mut self) -> Option<Usage> {
        match self.sse {
            None => {
                self.tally.take(self.doc.finish());
                self.doc = Doc::default();
            }
            Some(line) => {
                // A last line without its newline still counts.
                if matches!(line, Line::Space | Line::Data) {
                    self.tally.take(self.doc.finish());
                }
                self.doc = Doc::default();
                self.sse = Some(Line::Prefix(0));
            }
        }
        self.tally.usage()
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
    /// The top-level `response` (a Responses API event's).
    Response,
    /// The top-level `message` (Anthropic's `message_start`).
    Message,
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
    /// `cache_write_tokens` in the details.
    CachedWrite,
}

impl Key {
    /// The count a token field gives.
    fn count(self) -> Option<Count> {
        match self {
            Key::Input => Some(Count::Input),
            Key::Output => Some(Count::Output),
            Key::CacheRead => Some(Count::CacheRead),
            Key::CacheWrite => Some(Count::CacheWrite),
            Key::Cached => Some(Count::Cached),
            Key::CachedWrite => Some(Count::CachedWrite),
            _ => None,
        }
    }

    /// Its bit in `fields_seen` (0: not a field counted).
    fn bit(self) -> u8 {
        match self {
            Key::Input => 1,
            Key::Output => 2,
            Key::CacheRead => 4,
            Key::CacheWrite => 8,
            Key::Details => 16,
            Key::Cached => 32,
            Key::CachedWrite => 64,
            Key::Other | Key::Usage | Key::Response | Key::Message => 0,
        }
    }
}

/// The longest key looked for (`cache_creation_input_tokens`).
const KEY_MAX: usize = 27;

/// A key length past [`KEY_MAX`]: the key matches nothing.
const KEY_LONG: u8 = KEY_MAX as u8 + 1;

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
    key_len: u8,
    /// The key whose value comes next, at a watched depth.
    key: Key,
    /// Inside the top-level `response` or `message` object (its members
    /// at depth 2), and which.
    holder: Option<Place>,
    /// Inside a `usage` object, whose members are at `usage_depth`.
    in_usage: bool,
    usage_depth: u32,
    usage_place: Option<Place>,
    /// Inside that `usage`'s token details (members at `usage_depth + 1`).
    in_details: bool,
    /// `usage` keys read where a usage may sit.
    usage_keys: u8,
    /// `response` and `message` keys read at the top (bits).
    holders_seen: u8,
    /// A `usage`, `response` or `message` key was read twice.
    duplicate: bool,
    /// Fields read so far in this `usage` ([`Key::bit`]).
    fields_seen: u8,
    /// A token field's value being read.
    value: Option<Value>,
    /// What this `usage` reported so far.
    counts: Counts,
    /// A token field of this `usage` is not a count.
    bad: bool,
    /// Where the `usage` object that closed sat (its counts are
    /// `counts`), if it could be read.
    closed: Option<Place>,
    /// A `usage` object that closed could not be read.
    closed_bad: bool,
}

impl Doc {
    /// Whether keys are looked at in the containers at `depth`.
    fn watched(&self, depth: u32) -> bool {
        depth == 1
            || (depth == 2 && self.holder.is_some())
            || (self.in_usage && depth == self.usage_depth)
            || (self.in_details && depth == self.usage_depth + 1)
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
            let at = usize::from(self.key_len);
            match self.key_buf.get_mut(at..at + run.len()) {
                Some(dst) => {
                    dst.copy_from_slice(run);
                    // At most KEY_MAX.
                    self.key_len = u8::try_from(at + run.len()).unwrap_or(u8::MAX);
                }
                None => self.key_len = KEY_LONG,
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
            self.key_len = KEY_LONG;
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
                if b == b'{' {
                    self.open(self.key);
                }
                self.depth = self.depth.saturating_add(1);
                self.key = Key::Other;
                self.key_next = b == b'{' && self.watched(self.depth);
            }
            b'}' | b']' => {
                self.close();
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

    /// An object opens as the value of `key` (at the current depth).
    fn open(&mut self, key: Key) {
        let depth = self.depth;
        match key {
            Key::Usage if depth == 1 => self.start_usage(Place::Top, 2),
            Key::Usage if depth == 2 && !self.in_usage => {
                if let Some(place) = self.holder {
                    self.start_usage(place, 3);
                }
            }
            Key::Response if depth == 1 => self.holder = Some(Place::Response),
            Key::Message if depth == 1 => self.holder = Some(Place::Message),
            Key::Details if self.in_usage && depth == self.usage_depth => self.in_details = true,
            _ => {}
        }
    }

    /// A `usage` object opens at `place`, its members at `depth`.
    fn start_usage(&mut self, place: Place, depth: u32) {
        self.in_usage = true;
        self.usage_depth = depth;
        self.usage_place = Some(place);
        self.counts = Counts::default();
        self.bad = false;
        self.fields_seen = 0;
    }

    /// The container whose members are at the current depth closes.
    fn close(&mut self) {
        let depth = self.depth;
        if self.in_details && depth == self.usage_depth + 1 {
            self.in_details = false;
        } else if self.in_usage && depth == self.usage_depth {
            self.in_usage = false;
            match self.usage_place {
                Some(place) if !self.bad => self.closed = Some(place),
                _ => self.closed_bad = true,
            }
        } else if depth == 2 && self.holder.is_some() {
            self.holder = None;
        }
    }

    /// The key just read, as one of those looked for (a token field seen
    /// twice in one `usage` marks it unreadable; a `usage`, `response` or
    /// `message` key seen twice, the document).
    fn captured(&mut self) -> Key {
        let Some(k) = self.key_buf.get(..usize::from(self.key_len)) else {
            return Key::Other;
        };
        let depth = self.depth;
        let key = if self.in_details && depth == self.usage_depth + 1 {
            match k {
                b"cached_tokens" => Key::Cached,
                b"cache_write_tokens" => Key::CachedWrite,
                _ => Key::Other,
            }
        } else if self.in_usage && depth == self.usage_depth {
            match k {
                b"prompt_tokens" | b"input_tokens" => Key::Input,
                b"completion_tokens" | b"output_tokens" => Key::Output,
                b"cache_read_input_tokens" => Key::CacheRead,
                b"cache_creation_input_tokens" => Key::CacheWrite,
                b"prompt_tokens_details" | b"input_tokens_details" => Key::Details,
                _ => Key::Other,
            }
        } else if depth == 1 {
            match k {
                b"usage" => Key::Usage,
                b"response" => Key::Response,
                b"message" => Key::Message,
                _ => Key::Other,
            }
        } else if depth == 2 && self.holder.is_some() && k == b"usage" {
            Key::Usage
        } else {
            Key::Other
        };
        let bit = key.bit();
        if bit != 0 {
            if self.fields_seen & bit != 0 {
                self.bad = true;
            }
            self.fields_seen |= bit;
        }
        match key {
            Key::Usage => {
                self.duplicate |= self.usage_keys > 0;
                self.usage_keys = self.usage_keys.saturating_add(1);
            }
            Key::Response | Key::Message => {
                let bit = if key == Key::Response { 1 } else { 2 };
                self.duplicate |= self.holders_seen & bit != 0;
                self.holders_seen |= bit;
            }
            _ => {}
        }
        key
    }

    /// Whether the next value is a token count of the `usage` being read.
    fn token_field(&self) -> bool {
        (self.in_usage
            && self.depth == self.usage_depth
            && matches!(
                self.key,
                Key::Input | Key::Output | Key::CacheRead | Key::CacheWrite
            ))
            || (self.in_details
                && self.depth == self.usage_depth + 1
                && matches!(self.key, Key::Cached | Key::CachedWrite))
    }

    /// A token field's bare value ended: book it (`null`: not reported).
    fn end_value(&mut self) {
        let Some(v) = self.value.take() else {
            return;
        };
        let n = match v {
            Value::Digits(n) => Some(n),
            Value::Null(4) => None,
            _ => {
                self.bad = true;
                None
            }
        };
        if let Some(c) = self.key.count() {
            self.counts.set(c, n.map(clamp));
        }
        self.key = Key::Other;
    }

    /// What the whole document said.
    fn finish(&mut self) -> Found {
        self.end_value();
        if self.usage_keys == 0 {
            Found::Nothing
        } else if self.dead || !self.done || self.duplicate || self.closed_bad {
            Found::Unreadable
        } else {
            self.closed
                .map_or(Found::Nothing, |place| Found::Counts(self.counts, place))
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

    /// What one parsed document says of usage, by the module's rules:
    /// the behaviour the scanner keeps without buffering. (A parsed value
    /// holds no repeated keys; those cases are tested apart.)
    fn reference_doc(doc: &Json) -> Found {
        let Json::Object(top) = doc else {
            return Found::Nothing;
        };
        let mut places = Vec::new();
        if let Some(u) = top.get("usage") {
            places.push((Place::Top, u));
        }
        for (k, place) in [("response", Place::Response), ("message", Place::Message)] {
            if let Some(u) = top.get(k).and_then(|h| h.as_object()?.get("usage")) {
                places.push((place, u));
            }
        }
        let (place, u) = match places.as_slice() {
            [] => return Found::Nothing,
            [one] => *one,
            _ => return Found::Unreadable,
        };
        let Json::Object(u) = u else {
            return Found::Nothing;
        };
        // One of two spellings, a count or null; anything else unreadable.
        let count = |m: &serde_json::Map<String, Json>, keys: &[&str]| -> Result<Option<u32>, ()> {
            let mut given = keys.iter().filter_map(|k| m.get(*k));
            let v = given.next();
            if given.next().is_some() {
                return Err(());
            }
            match v {
                None | Some(Json::Null) => Ok(None),
                Some(v) => v.as_u64().map(|n| Some(clamp(n))).ok_or(()),
            }
        };
        let read = || -> Result<Counts, ()> {
            let details = {
                let mut given = ["prompt_tokens_details", "input_tokens_details"]
                    .iter()
                    .filter_map(|k| u.get(*k));
                let d = given.next();
                if given.next().is_some() {
                    return Err(());
                }
                d
            };
            let (cached, cached_write) = match details {
                Some(Json::Object(d)) => (
                    count(d, &["cached_tokens"])?,
                    count(d, &["cache_write_tokens"])?,
                ),
                _ => (None, None),
            };
            let mut c = Counts::default();
            c.set(Count::Input, count(u, &["prompt_tokens", "input_tokens"])?);
            c.set(
                Count::Output,
                count(u, &["completion_tokens", "output_tokens"])?,
            );
            c.set(Count::CacheRead, count(u, &["cache_read_input_tokens"])?);
            c.set(
                Count::CacheWrite,
                count(u, &["cache_creation_input_tokens"])?,
            );
            c.set(Count::Cached, cached);
            c.set(Count::CachedWrite, cached_write);
            Ok(c)
        };
        read().map_or(Found::Unreadable, |c| Found::Counts(c, place))
    }

    /// The answer's usage from its documents, in order.
    fn reference_tally<'a>(docs: impl IntoIterator<Item = &'a Json>) -> Option<Usage> {
        let mut t = Tally::default();
        for d in docs {
            t.take(reference_doc(d));
        }
        t.usage()
    }

    /// [`reference_tally`] of one body, parsed whole by `serde_json`.
    fn reference(body: &[u8]) -> Option<Usage> {
        let doc: Json = serde_json::from_slice(body).ok()?;
        reference_tally([&doc])
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

    fn cached(input: u32, output: u32, cache_read: u32, cache_write: u32) -> Option<Usage> {
        Some(Usage {
            input,
            output,
            cache_read,
            cache_write,
        })
    }

    #[test]
    fn cached_input_in_each_providers_shape() {
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
            // OpenAI's cache writes (`cache_write_tokens`, in the details
            // of both APIs): part of the input too.
            (
                br#"{"usage":{"prompt_tokens":2600,"completion_tokens":9,
                   "prompt_tokens_details":{"cached_tokens":2000,"cache_write_tokens":400}}}"#,
                cached(2600, 9, 2000, 400),
            ),
            (
                br#"{"usage":{"input_tokens":100,"input_tokens_details":{"cached_tokens":80,"cache_write_tokens":50}}}"#,
                cached(100, 0, 80, 20),
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
            // A cached count that is not a count: unreadable.
            (
                br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":"5"}}}"#,
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
            scan(
                b"event: x\ndata:{\"usage\":{\"input_tokens\":1,\"output_tokens\":3}}",
                true,
                4
            ),
            usage(1, 3)
        );
    }

    /// Anthropic's stream: `message_start` (input and cache counts, an
    /// output count that is not final), then `message_delta` (cumulative
    /// counts, with or without the input and cache counts again).
    #[test]
    fn anthropic_message_start_and_message_delta() {
        let start = |usage: &str| {
            format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m\",\"content\":[],\"usage\":{usage}}}}}\n\n")
        };
        let delta = |usage: &str| {
            format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{usage}}}\n\n")
        };
        let body = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"usage\"}}\n\n";
        let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let cache_start = start(
            r#"{"input_tokens":3000,"cache_creation_input_tokens":500,"cache_read_input_tokens":2000,"output_tokens":1}"#,
        );
        for (stream, want) in [
            // The delta gives only the output: input and cache counts
            // stay as message_start gave them.
            (
                format!("{cache_start}{body}{}{stop}", delta(r#"{"output_tokens":50}"#)),
                cached(5500, 50, 2000, 500),
            ),
            // The delta repeats every count (cumulative): the latest wins,
            // nothing is added twice.
            (
                format!(
                    "{cache_start}{body}{}{stop}",
                    delta(r#"{"input_tokens":3000,"cache_creation_input_tokens":500,"cache_read_input_tokens":2000,"output_tokens":50}"#)
                ),
                cached(5500, 50, 2000, 500),
            ),
            // Counts that grew (a server tool read more input).
            (
                format!(
                    "{}{body}{}{stop}",
                    start(r#"{"input_tokens":2679,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}"#),
                    delta(r#"{"input_tokens":10682,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":510}"#)
                ),
                cached(10682, 510, 0, 0),
            ),
            // Several deltas, each cumulative: the last, not their sum.
            (
                format!(
                    "{cache_start}{}{}{stop}",
                    delta(r#"{"output_tokens":20}"#),
                    delta(r#"{"output_tokens":50,"cache_read_input_tokens":null}"#)
                ),
                cached(5500, 50, 2000, 500),
            ),
            // message_start alone: no final output count, not read.
            (format!("{cache_start}{body}{stop}"), None),
            // A delta alone: no input count, not read.
            (format!("{body}{}{stop}", delta(r#"{"output_tokens":50}"#)), None),
            // No usage anywhere (as the docs' extended thinking example).
            (
                format!(
                    "{}{body}{}{stop}",
                    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n",
                    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{}}\n\n"
                ),
                None,
            ),
            // An unreadable count anywhere: the whole answer unreadable.
            (
                format!("{cache_start}{}{stop}", delta(r#"{"output_tokens":"50"}"#)),
                None,
            ),
        ] {
            for chunk in [1, 2, 5, 64, stream.len()] {
                assert_eq!(scan(stream.as_bytes(), true, chunk), want, "{stream}chunks of {chunk}");
            }
        }
    }

    /// The Responses API's stream: usage in `response.usage` of its last
    /// event, `response.completed`, `response.incomplete` or
    /// `response.failed`; `null` before.
    #[test]
    fn responses_api_events() {
        let event = |kind: &str, usage: &str| {
            format!("event: {kind}\ndata: {{\"type\":\"{kind}\",\"response\":{{\"id\":\"r\",\"status\":\"x\",\"output\":[{{\"type\":\"message\",\"usage\":{{\"input_tokens\":9}}}}],\"usage\":{usage}}},\"sequence_number\":1}}\n\n")
        };
        let delta = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"i\",\"delta\":\"usage\"}\n\n";
        let counts = r#"{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096},"output_tokens":60,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5060}"#;
        for last in [
            "response.completed",
            "response.incomplete",
            "response.failed",
        ] {
            let stream = format!(
                "{}{}{delta}{}",
                event("response.created", "null"),
                event("response.in_progress", "null"),
                event(last, counts)
            );
            for chunk in [1, 3, 16, stream.len()] {
                assert_eq!(
                    scan(stream.as_bytes(), true, chunk),
                    cached(5000, 60, 4096, 0),
                    "{last} in chunks of {chunk}"
                );
            }
            // Its usage null (as the reference's examples of the last two):
            // nothing to read.
            let stream = format!(
                "{}{delta}{}",
                event("response.created", "null"),
                event(last, "null")
            );
            assert_eq!(
                scan(stream.as_bytes(), true, 7),
                None,
                "{last} without usage"
            );
        }
        // The Responses API's body (not streamed) has it at the top.
        assert_eq!(
            scan(
                br#"{"object":"response","output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#,
                false,
                5
            ),
            usage(3, 4)
        );
    }

    #[test]
    fn a_repeated_usage_or_token_field_is_unreadable() {
        for body in [
            &br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":4294967295}}"#[..],
            br#"{"usage":{"prompt_tokens":1},"usage":null}"#,
            br#"{"usage":{"prompt_tokens":1,"prompt_tokens":9}}"#,
            br#"{"usage":{"prompt_tokens":1,"input_tokens":9}}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":1,"output_tokens":9}}"#,
            br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1},"input_tokens_details":{}}}"#,
            br#"{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}"#,
            br#"{"usage":{"input_tokens":1,"cache_read_input_tokens":2,"cache_read_input_tokens":3}}"#,
            // At two places, or a holder twice.
            br#"{"usage":{"prompt_tokens":1},"response":{"usage":{"input_tokens":2}}}"#,
            br#"{"response":{"usage":{"input_tokens":2},"usage":{"input_tokens":2}}}"#,
            br#"{"response":{"usage":{"input_tokens":2}},"response":{}}"#,
            br#"{"message":{},"message":{"usage":{"input_tokens":2}},"usage":{"input_tokens":2}}"#,
        ] {
            for chunk in 1..body.len() {
                assert_eq!(
                    scan(body, false, chunk),
                    None,
                    "{} in chunks of {chunk}",
                    String::from_utf8_lossy(body)
                );
            }
            // In a stream, it spoils the answer's usage.
            let mut stream = b"data: {\"usage\":{\"prompt_tokens\":7}}\n\ndata: ".to_vec();
            stream.extend_from_slice(body);
            stream.extend_from_slice(b"\n\n");
            assert_eq!(scan(&stream, true, 3), None);
        }
        // Each SSE line is its own document: a later line's usage (engines
        // that report cumulative usage on every chunk) replaces the earlier.
        let stream = b"data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\n";
        assert_eq!(scan(stream, true, 5), usage(2, 0));
    }

    #[test]
    fn only_the_documented_places_count() {
        for (body, want) in [
            (&br#"{"choices":[{"usage":{"prompt_tokens":1}}]}"#[..], None),
            (br#"{"x":{"usage":{"prompt_tokens":1}}}"#, None),
            (br#"{"response":[{"usage":{"prompt_tokens":1}}]}"#, None),
            (br#"{"response":"{\"usage\":{\"prompt_tokens\":1}}"}"#, None),
            (br#"{"response":{"x":{"usage":{"prompt_tokens":1}}}}"#, None),
            (
                br#"{"response":{"output":[{"usage":{"input_tokens":8}}],"usage":{"input_tokens":7,"output_tokens":8}}}"#,
                usage(7, 8),
            ),
            (br#"{"usage":{"x":{"prompt_tokens":1}},"a":"usage"}"#, None),
            (
                br#"{"usage":{"input_tokens":7,"output_tokens":8}}"#,
                usage(7, 8),
            ),
            // A usage without an input count is not read (not booked as 0).
            (br#"{"usage":{"prompt_tokens":null}}"#, None),
            (br#"{"usage":{"completion_tokens":5}}"#, None),
            (br#"{"usage":{}}"#, None),
            // Embeddings report no output: 0.
            (br#"{"usage":{"prompt_tokens":8,"total_tokens":8}}"#, usage(8, 0)),
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
            // `message.usage` alone is Anthropic's message_start: not final.
            (br#"{"message":{"usage":{"input_tokens":2,"output_tokens":1}}}"#, None),
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
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":{}}}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":[1]}}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":true}}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":nul}}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":18446744073709551616}}"#,
            br#"{"response":{"usage":{"input_tokens":1,"output_tokens":-3}}}"#,
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
            // A stream whose last line is cut inside a usage: unreadable,
            // whatever came before.
            let mut stream = b"data: {\"usage\":{\"prompt_tokens\":7}}\n\ndata: ".to_vec();
            stream.extend_from_slice(body);
            let before = if body.starts_with(b"{") {
                None
            } else {
                usage(7, 0)
            };
            assert_eq!(scan(&stream, true, 2), before, "{stream:?}");
        }
        assert_eq!(
            scan(b" {\"usage\":{\"prompt_tokens\":0}} \n", false, 2),
            usage(0, 0)
        );
    }

    #[test]
    fn the_scanner_is_small() {
        // Its state is fixed: no buffer grows with the answer.
        let size = std::mem::size_of::<UsageScanner>();
        assert!(size <= 144, "{size} bytes");
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

    /// A usage object: input and output (either spelling, or none), other
    /// members, and OpenAI's details or Anthropic's cache counts.
    fn usage_object() -> impl Strategy<Value = Json> {
        (
            prop::option::weighted(0.9, (any::<bool>(), count())),
            prop::option::of((any::<bool>(), count())),
            prop::collection::btree_map("[a-z_]{1,10}", any_json(), 0..3),
            prop::option::of(prop_oneof![
                // OpenAI's details (an object with counts, or anything),
                // or Anthropic's cache counts.
                (
                    any::<bool>(),
                    prop::option::of(count()),
                    prop::option::of(count())
                )
                    .prop_map(|(alias, c, w)| {
                        let k = if alias {
                            "input_tokens_details"
                        } else {
                            "prompt_tokens_details"
                        };
                        let mut d = serde_json::Map::new();
                        if let Some(c) = c {
                            d.insert("cached_tokens".into(), c);
                        }
                        if let Some(w) = w {
                            d.insert("cache_write_tokens".into(), w);
                        }
                        vec![(k.to_string(), Json::Object(d))]
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
        )
            .prop_map(|(input, output, extra, cache)| {
                let mut u: serde_json::Map<String, Json> = extra.into_iter().collect();
                u.extend(cache.into_iter().flatten());
                if let Some((alias, v)) = input {
                    let k = if alias {
                        "input_tokens"
                    } else {
                        "prompt_tokens"
                    };
                    u.insert(k.into(), v);
                }
                if let Some((alias, v)) = output {
                    let k = if alias {
                        "output_tokens"
                    } else {
                        "completion_tokens"
                    };
                    u.insert(k.into(), v);
                }
                Json::Object(u)
            })
    }

    /// A document with usage objects at any of the places the scanner
    /// reads (the top, `response`, `message`) and where it must not
    /// (inside `choices`), or none.
    fn body() -> impl Strategy<Value = Json> {
        (
            prop::collection::btree_map("[a-z_]{1,10}", any_json(), 0..4),
            prop::collection::vec((0u8..5, usage_object()), 0..3),
        )
            .prop_map(|(rest, usages)| {
                let mut top: serde_json::Map<String, Json> = rest.into_iter().collect();
                for (at, u) in usages {
                    match at {
                        0 => {
                            top.insert("usage".into(), u);
                        }
                        1 => {
                            top.insert(
                                "response".into(),
                                json!({"id": "r", "usage": u, "output": [{"usage": 1}]}),
                            );
                        }
                        2 => {
                            top.insert("message".into(), json!({"content": [], "usage": u}));
                        }
                        3 => {
                            top.insert("choices".into(), json!([{ "usage": u }]));
                        }
                        _ => {
                            top.insert("usage".into(), Json::Null);
                        }
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

        /// A stream of events, each a document with or without usage,
        /// among comments, named events and `[DONE]`, in any chunking: the
        /// scanner finds what parsing each event whole and keeping the
        /// latest of each count finds.
        #[test]
        fn a_stream_matches_its_events_parsed_whole(
            events in prop::collection::vec((body(), 0u8..4), 0..6),
            chunk in 1usize..64,
        ) {
            let mut sse = String::new();
            for (doc, framing) in &events {
                let text = serde_json::to_string(doc).unwrap_or_default();
                match framing {
                    0 => sse.push_str(&format!("data: {text}\n\n")),
                    1 => sse.push_str(&format!("event: x\ndata:{text}\r\n\r\n")),
                    2 => sse.push_str(&format!(": keep-alive\n\ndata: {text}\n\n")),
                    _ => sse.push_str(&format!("id: 1\ndata: {text}\n\ndata: [DONE]\n\n")),
                }
            }
            let want = reference_tally(events.iter().map(|(d, _)| d));
            prop_assert_eq!(scan(sse.as_bytes(), true, chunk), want, "{}", sse);
        }

        /// The word-at-a-time search finds what a byte loop finds.
        #[test]
        fn find_is_a_byte_search(data in prop::collection::vec(prop::sample::select(b"ab\"\\{}[]".to_vec()), 0..40)) {
            let want = |t: &[u8]| data.iter().position(|c| t.contains(c)).unwrap_or(data.len());
            prop_assert_eq!(find(&data, b"\"\\"), want(b"\"\\"));
            prop_assert_eq!(find(&data, b"\"{[]}"), want(b"\"{[]}"));
        }

        /// Arbitrary bytes in any chunking: an answer, never a panic, and
        /// the same answer whatever the chunking.
        #[test]
        fn arbitrary_bytes_are_safe(data in prop::collection::vec(any::<u8>(), 0..300), chunk in 1usize..20) {
            for sse in [false, true] {
                prop_assert_eq!(scan(&data, sse, chunk), scan(&data, sse, data.len().max(1)));
            }
        }
    }
}
