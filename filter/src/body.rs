//! Reading an OpenAI-compatible request body, and usage from responses.
//!
//! Requests: the filter may need the body's `model`, its output budget
//! (`max_tokens` / `max_completion_tokens`) and whether it streams. It buffers
//! at most the configured bound and parses once with `serde_json`, which
//! rejects malformed input with an error instead of panicking; unknown fields
//! are skipped without being stored. The input-token estimate is the
//! prompt's size in bytes over four (a standard rule of thumb for English
//! BPE tokenizers), taken from the body length.
//!
//! Responses: token usage arrives either in a JSON body (`usage`) or, for
//! streams, in a server-sent event near the end. [`UsageScanner`] is fed the
//! response in arbitrary chunks and keeps only a bounded tail of the current
//! line, so a stream is never buffered whole.

use serde::Deserialize;

/// What the filter takes from a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestBody {
    /// The `model` field.
    pub model: Option<String>,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u32>,
    /// The `stream` field.
    pub stream: bool,
    /// Estimated input tokens.
    pub tokens_in: u32,
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    max_tokens: Option<serde_json::Value>,
    #[serde(default)]
    max_completion_tokens: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
}

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError(pub String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

fn token_count(v: &Option<serde_json::Value>, field: &str) -> Result<Option<u32>, BodyError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .map(|n| Some(n.min(u64::from(u32::MAX)) as u32))
            .ok_or_else(|| BodyError(format!("`{field}` must be a non-negative integer"))),
        Some(_) => Err(BodyError(format!(
            "`{field}` must be a non-negative integer"
        ))),
    }
}

/// Estimate tokens from a byte count (about four bytes per token).
pub fn estimate_tokens(bytes: usize) -> u32 {
    ((bytes / 4).max(1)).min(u32::MAX as usize) as u32
}

/// Parse a request body. `total_len` is the whole body's size (the bytes
/// given may be a prefix if the body was larger than the bound: then only
/// the estimate is used and the error says so).
pub fn scan_request(bytes: &[u8], total_len: usize) -> Result<RequestBody, BodyError> {
    if bytes.len() < total_len {
        return Err(BodyError(format!(
            "the body is {total_len} bytes, more than the {} the filter reads; send the model in the x-ace-model header or raise body.max_bytes",
            bytes.len()
        )));
    }
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BodyError(
            "the request body is not a JSON object; expected an OpenAI-style request".into(),
        ));
    }
    let wire: Wire<'_> = serde_json::from_slice(bytes).map_err(|e| {
        BodyError(format!(
            "the request body is not the JSON object expected: {e}"
        ))
    })?;
    let completion = token_count(&wire.max_completion_tokens, "max_completion_tokens")?;
    let max = token_count(&wire.max_tokens, "max_tokens")?;
    Ok(RequestBody {
        model: wire.model.map(|m| m.into_owned()),
        max_output_tokens: completion.or(max),
        stream: wire.stream.unwrap_or(false),
        tokens_in: estimate_tokens(total_len),
    })
}

/// Token usage reported by a destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens` (or `input_tokens`).
    pub input: u32,
    /// `completion_tokens` (or `output_tokens`).
    pub output: u32,
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default, alias = "input_tokens")]
    prompt_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<UsageWire>,
}

fn usage_of(json: &[u8]) -> Option<Usage> {
    let w: WithUsage = serde_json::from_slice(json).ok()?;
    let u = w.usage?;
    let clamp = |v: Option<u64>| v.map_or(0, |n| n.min(u64::from(u32::MAX)) as u32);
    Some(Usage {
        input: clamp(u.prompt_tokens),
        output: clamp(u.completion_tokens),
    })
}

/// Finds token usage in a response fed chunk by chunk, JSON or SSE.
#[derive(Debug, Clone)]
pub struct UsageScanner {
    sse: bool,
    /// JSON: the body so far (bounded). SSE: the current line (bounded).
    buf: Vec<u8>,
    max: usize,
    overflow: bool,
    found: Option<Usage>,
}

impl UsageScanner {
    /// A scanner for a response; `sse` when its content type is
    /// `text/event-stream`. At most `max` bytes are held at any time.
    pub fn new(sse: bool, max: usize) -> UsageScanner {
        UsageScanner {
            sse,
            buf: Vec::new(),
            max,
            overflow: false,
            found: None,
        }
    }

    /// Feed the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buf.len() + chunk.len() > self.max {
                self.overflow = true;
                self.buf.clear();
            } else if !self.overflow {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        for &b in chunk {
            if b == b'\n' {
                self.line();
                self.buf.clear();
                self.overflow = false;
            } else if self.buf.len() < self.max {
                self.buf.push(b);
            } else {
                self.overflow = true;
            }
        }
    }

    fn line(&mut self) {
        if self.overflow {
            return;
        }
        let line = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
        if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if let Some(u) = usage_of(data) {
                self.found = Some(u);
            }
        }
    }

    /// The usage, once the whole response was fed.
    pub fn finish(&mut self) -> Option<Usage> {
        if self.sse {
            if !self.buf.is_empty() {
                self.line();
                self.buf.clear();
            }
        } else if !self.overflow {
            self.found = usage_of(&self.buf);
        }
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_it_needs() {
        let b = br#"{"model":"llama-3.1-70b","messages":[{"role":"user","content":"hi"}],"max_tokens":300,"stream":true}"#;
        let r = scan_request(b, b.len()).map_err(|e| e.0);
        assert_eq!(
            r,
            Ok(RequestBody {
                model: Some("llama-3.1-70b".into()),
                max_output_tokens: Some(300),
                stream: true,
                tokens_in: (b.len() / 4) as u32
            })
        );
        let b = br#"{"model":"m","max_tokens":10,"max_completion_tokens":20}"#;
        assert_eq!(
            scan_request(b, b.len()).map(|r| r.max_output_tokens),
            Ok(Some(20))
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
            b"\xff\xfe",
        ] {
            assert!(scan_request(b, b.len()).is_err(), "{b:?}");
        }
        assert!(scan_request(b"{}", 10).is_err(), "truncated");
    }

    #[test]
    fn usage_from_a_json_body_in_chunks() {
        let body =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        let mut s = UsageScanner::new(false, 1 << 16);
        for c in body.chunks(7) {
            s.feed(c);
        }
        assert_eq!(
            s.finish(),
            Some(Usage {
                input: 12,
                output: 34
            })
        );
    }

    #[test]
    fn usage_from_an_sse_stream_split_anywhere() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut s = UsageScanner::new(true, 4096);
            let (a, b) = stream.split_at(split);
            s.feed(a);
            s.feed(b);
            assert_eq!(
                s.finish(),
                Some(Usage {
                    input: 5,
                    output: 9
                }),
                "split at {split}"
            );
        }
    }

    #[test]
    fn the_scanner_stays_bounded() {
        let mut s = UsageScanner::new(false, 8);
        s.feed(b"0123456789");
        assert_eq!(s.finish(), None);
        let mut s = UsageScanner::new(true, 8);
        s.feed(&[b'x'; 100]);
        assert!(s.buf.len() <= 8);
    }
}
