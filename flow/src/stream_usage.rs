//! Asking a stream for its usage on the client's behalf, and giving the
//! client the stream it asked for.
//!
//! An OpenAI-compatible chat or text completion that streams reports its
//! token usage only when the request sets `stream_options.include_usage`
//! (OpenAI API reference, "Create chat completion", `stream_options`).
//! Without it ACE could book only its estimate. So when a client streams
//! without saying, ACE adds `"stream_options":{"include_usage":true}` to
//! the body it sends ([`ask`]), and takes out of the answer what that
//! option adds ([`Strip`]):
//!
//! - the extra last event, whose `choices` is empty and whose `usage` is
//!   the count (`data: {…,"choices":[],"usage":{…}}` and its blank line);
//! - `"usage":null`, which OpenAI adds to every other event (the same
//!   reference: "All other chunks will also include a usage field, but with
//!   a null value"), where it is written as the event's last member,
//!   `,"usage":null}`, as OpenAI and vLLM serialise it. (vLLM leaves the
//!   member out of the other events.)
//!
//! Events are cut at line ends; a line split across chunks is held until
//! its end arrives (at most one line, bounded by [`MAX_LINE`]: a longer
//! line passes unchanged). A client that set `stream_options` itself gets
//! the stream untouched.

/// The longest line held back while waiting for its end; a longer one
/// passes as it is (it is not a usage event).
pub const MAX_LINE: usize = 64 * 1024;

/// The member ACE adds to a request body.
const OPTION: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// `body` with `stream_options.include_usage` asked for, when it is a JSON
/// object (the caller checked it streams and has no `stream_options`).
pub fn ask(body: &[u8]) -> Option<Vec<u8>> {
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let rest = body.get(open + 1..)?;
    let empty = rest
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let mut out = Vec::with_capacity(body.len() + OPTION.len());
    out.extend_from_slice(body.get(..=open)?);
    out.extend_from_slice(if empty {
        OPTION.strip_suffix(b",").unwrap_or(OPTION)
    } else {
        OPTION
    });
    out.extend_from_slice(rest);
    Some(out)
}

/// Takes what `include_usage` added out of a stream, chunk by chunk.
#[derive(Debug, Default, Clone)]
pub struct Strip {
    /// The start of a line whose end has not arrived.
    held: Vec<u8>,
    /// A usage event was dropped: drop the blank line that ends it.
    drop_blank: bool,
    /// A line outgrew [`MAX_LINE`]: pass the rest of it as it comes.
    passing: bool,
}

impl Strip {
    /// The bytes to send for `chunk` (the whole rest at `end`).
    pub fn chunk(&mut self, chunk: &[u8], end: bool, out: &mut Vec<u8>) {
        out.clear();
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = rest.split_at(nl + 1);
            rest = after;
            if self.passing {
                out.extend_from_slice(line);
                self.passing = false;
                continue;
            }
            if self.held.is_empty() {
                self.line(line, out);
            } else {
                let mut whole = std::mem::take(&mut self.held);
                whole.extend_from_slice(line);
                self.line(&whole, out);
                whole.clear();
                self.held = whole;
            }
        }
        if self.passing {
            out.extend_from_slice(rest);
        } else if self.held.len() + rest.len() > MAX_LINE {
            out.extend_from_slice(&self.held);
            out.extend_from_slice(rest);
            self.held.clear();
            self.passing = true;
        } else {
            self.held.extend_from_slice(rest);
        }
        if end {
            let held = std::mem::take(&mut self.held);
            self.line(&held, out);
        }
    }

    /// One whole line (with its `\n`, unless the stream ended without
    /// one).
    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if line.is_empty() {
            return;
        }
        let text = line
            .strip_suffix(b"\n")
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .unwrap_or(line);
        if std::mem::take(&mut self.drop_blank) && text.is_empty() {
            return;
        }
        if let Some(data) = text.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if contains(data, br#""choices":[]"#) && contains(data, br#""usage":{"#) {
                self.drop_blank = true;
                return;
            }
            if let Some(kept) = data.strip_suffix(br#","usage":null}"#) {
                // `data:` (and its space), the event less the member, the
                // line's end.
                let start = text.len() - data.len();
                out.extend_from_slice(line.get(..start).unwrap_or_default());
                out.extend_from_slice(kept);
                out.push(b'}');
                out.extend_from_slice(line.get(text.len()..).unwrap_or_default());
                return;
            }
        }
        out.extend_from_slice(line);
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_adds_the_option_first() {
        assert_eq!(
            ask(br#" {"model":"m","stream":true}"#).as_deref(),
            Some(&br#" {"stream_options":{"include_usage":true},"model":"m","stream":true}"#[..])
        );
        assert_eq!(
            ask(b"{ }").as_deref(),
            Some(&br#"{"stream_options":{"include_usage":true} }"#[..])
        );
        assert_eq!(ask(b"[1]"), None);
        assert_eq!(ask(b""), None);
        let v: serde_json::Value =
            serde_json::from_slice(&ask(br#"{"stream":true}"#).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    /// What the client would have got without `include_usage`, and what
    /// the upstream sent with it (OpenAI's shape: `"usage":null` last in
    /// every event, and the usage event before `[DONE]`).
    const PLAIN: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: [DONE]\n\n";
    const WITH: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n";

    fn strip(stream: &[u8], chunk: usize) -> Vec<u8> {
        let mut s = Strip::default();
        let mut all = Vec::new();
        let mut out = Vec::new();
        let chunks: Vec<&[u8]> = stream.chunks(chunk.max(1)).collect();
        for (i, c) in chunks.iter().enumerate() {
            s.chunk(c, i + 1 == chunks.len(), &mut out);
            all.extend_from_slice(&out);
        }
        all
    }

    #[test]
    fn the_client_gets_the_stream_it_asked_for_in_any_chunking() {
        for chunk in 1..=WITH.len() {
            assert_eq!(
                String::from_utf8(strip(WITH.as_bytes(), chunk)).unwrap(),
                PLAIN,
                "chunks of {chunk}"
            );
        }
        // vLLM leaves the member out of the other events; CRLF lines too.
        let vllm = WITH.replace(",\"usage\":null", "");
        assert_eq!(strip(vllm.as_bytes(), 7), PLAIN.as_bytes());
        let crlf = WITH.replace('\n', "\r\n");
        assert_eq!(
            strip(crlf.as_bytes(), 5),
            PLAIN.replace('\n', "\r\n").as_bytes()
        );
    }

    proptest::proptest! {
        /// Whatever the upstream streams, in whatever chunking: no panic,
        /// nothing held past the end, and a stream with no usage to take
        /// out (no `usage` in it) reaches the client byte for byte.
        #[test]
        fn any_stream_in_any_chunking(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"data: {}[]\"choices:usage,null\r\nx".to_vec()),
                0..300,
            ),
            chunk in 1usize..40,
        ) {
            let out = strip(&bytes, chunk);
            if !bytes.windows(5).any(|w| w == b"usage") {
                proptest::prop_assert_eq!(out, bytes);
            } else {
                proptest::prop_assert!(out.len() <= bytes.len());
            }
        }

        /// The usage event and the nulls go, whatever the chunking, even
        /// around events with no usage and comments.
        #[test]
        fn usage_goes_in_any_chunking(chunk in 1usize..64, extra in 0usize..4) {
            let pad = ": keep-alive\n\n".repeat(extra);
            let with = format!("{pad}{WITH}");
            let plain = format!("{pad}{PLAIN}");
            proptest::prop_assert_eq!(strip(with.as_bytes(), chunk), plain.as_bytes());
        }
    }

    #[test]
    fn other_streams_pass_unchanged() {
        for s in [
            PLAIN,
            "event: x\ndata: {\"usage\":null,\"a\":1}\n\n",
            "data: {\"choices\":[],\"note\":\"no usage\"}\n\nno newline at the end",
            "",
        ] {
            assert_eq!(strip(s.as_bytes(), 3), s.as_bytes(), "{s}");
        }
        let long = format!("data: {}\n\n", "x".repeat(MAX_LINE + 10));
        assert_eq!(strip(long.as_bytes(), 4096), long.as_bytes());
    }
}
