//! Instructions to find token usage in a 4.4 KB chat completion, fed in
//! 1 KiB chunks: the streaming scanner (`ace_flow::usage`) against
//! buffering the body and parsing it with `serde_json` (the filter's
//! earlier way). Count with callgrind, minus a run with 0 iterations:
//!
//! ```sh
//! cargo build --release -p ace-flow --example usage_scan
//! valgrind --tool=callgrind target/release/examples/usage_scan 1000 [serde]
//! valgrind --tool=callgrind target/release/examples/usage_scan 0
//! ```

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let serde = args.next().as_deref() == Some("serde");
    let content = "lorem ipsum dolor sit amet, ".repeat(150);
    let body = format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":30,"completion_tokens":12,"total_tokens":42}}}}"#
    );
    let mut sum = 0u64;
    for _ in 0..n {
        let b = std::hint::black_box(body.as_bytes());
        if serde {
            #[derive(serde::Deserialize)]
            struct U {
                prompt_tokens: Option<u64>,
            }
            #[derive(serde::Deserialize)]
            struct W {
                usage: Option<U>,
            }
            let mut buf = Vec::new();
            for c in b.chunks(1024) {
                buf.extend_from_slice(c);
            }
            let w: Option<W> = serde_json::from_slice(&buf).ok();
            sum += w
                .and_then(|w| w.usage)
                .and_then(|u| u.prompt_tokens)
                .unwrap_or(0);
        } else {
            let mut s = ace_flow::usage::UsageScanner::new(false);
            for c in b.chunks(1024) {
                s.feed(c);
            }
            sum += s.finish().map_or(0, |u| u64::from(u.input));
        }
    }
    println!("{sum} ({} bytes)", body.len());
}
