//! Example filter: gRPC calls and streams, reporting everything it sees.
//!
//! Request headers choose what happens, so one plugin covers every case:
//!
//! - `x-grpc-cluster`: the target (default `grpc`);
//! - `x-grpc-mode`: `call` (default), `cancel` or `stream`;
//! - `x-grpc-message`: the call's message (default `hello`), or for a
//!   stream the messages, comma-separated;
//! - `x-grpc-timeout-ms`: the call's timeout (default 5000);
//! - `x-grpc-end`: for a stream, `send` (end of stream on the last
//!   message), `close` (`close_grpc_stream` after the messages, the
//!   default) or `cancel` (`cancel_grpc_stream` once the first message
//!   arrives).
//!
//! A call or stream pauses the request; when it ends, the filter answers
//! locally with status 200, `x-grpc-status` / `x-grpc-message` from
//! `get_grpc_status`, and a body with one line per callback it got (sizes,
//! metadata, messages). A failed dispatch answers 500 naming the status.
//! `cancel` cancels the call right away (twice: the second is NotFound)
//! and lets the request go upstream with both statuses in headers.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Grpc::default()))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Default)]
struct Grpc {
    log: Vec<String>,
    end: String,
}

fn header(name: &str) -> Option<String> {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
}

/// A metadata map as `k=v;k=v`, leaving out what varies between runs.
fn metadata(map: MapType) -> String {
    match hostcalls::get_map_bytes(map) {
        Ok(pairs) => pairs
            .iter()
            .filter(|(k, _)| k != "date")
            .map(|(k, v)| match k.as_str() {
                // Milliseconds: the value varies from run to run.
                "x-envoy-upstream-service-time" => format!("{k}=<ms>"),
                _ => format!("{k}={}", String::from_utf8_lossy(v)),
            })
            .collect::<Vec<_>>()
            .join(";"),
        Err(s) => format!("{s:?}"),
    }
}

fn buffer(size: usize) -> String {
    match hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size) {
        Ok(b) => String::from_utf8_lossy(&b.unwrap_or_default()).into_owned(),
        Err(s) => format!("{s:?}"),
    }
}

impl Grpc {
    fn finish(&mut self) {
        let (code, message) = hostcalls::get_grpc_status().unwrap_or((99, None));
        let code = code.to_string();
        let message = message.unwrap_or_default();
        let body = self.log.join("\n");
        let headers = vec![
            ("x-grpc-status", code.as_str()),
            ("x-grpc-message", message.as_str()),
        ];
        if let Err(s) = hostcalls::send_http_response(200, headers, Some(body.as_bytes())) {
            log::error!("grpc-callout: cannot reply: {s:?}");
        }
    }

    fn failed(&self, what: &str, s: proxy_wasm::types::Status) -> Action {
        let body = format!("{what} failed: {s:?}");
        let _ = hostcalls::send_http_response(500, vec![], Some(body.as_bytes()));
        Action::Pause
    }
}

impl Context for Grpc {
    fn on_grpc_call_response(&mut self, _token: u32, status: u32, size: usize) {
        self.log
            .push(format!("call response: status {status}, {size} bytes"));
        if size > 0 {
            self.log.push(format!("message: {}", buffer(size)));
        }
        self.finish();
    }

    fn on_grpc_stream_initial_metadata(&mut self, _token: u32, n: u32) {
        let m = metadata(MapType::GrpcReceiveInitialMetadata);
        self.log.push(format!("initial metadata ({n}): {m}"));
    }

    fn on_grpc_stream_message(&mut self, token: u32, size: usize) {
        self.log.push(format!("message ({size}): {}", buffer(size)));
        if self.end == "cancel" {
            let s = hostcalls::cancel_grpc_stream(token);
            self.log.push(format!("cancel: {s:?}"));
            let again = hostcalls::send_grpc_stream_message(token, Some(b"late"), false);
            self.log.push(format!("send after cancel: {again:?}"));
            self.finish();
        }
    }

    fn on_grpc_stream_trailing_metadata(&mut self, _token: u32, n: u32) {
        let m = metadata(MapType::GrpcReceiveTrailingMetadata);
        self.log.push(format!("trailing metadata ({n}): {m}"));
    }

    fn on_grpc_stream_close(&mut self, _token: u32, status: u32) {
        self.log.push(format!("close: status {status}"));
        self.finish();
    }
}

impl HttpContext for Grpc {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let cluster = header("x-grpc-cluster").unwrap_or_else(|| "grpc".into());
        let mode = header("x-grpc-mode").unwrap_or_else(|| "call".into());
        let message = header("x-grpc-message").unwrap_or_else(|| "hello".into());
        let timeout = header("x-grpc-timeout-ms")
            .and_then(|t| t.parse().ok())
            .unwrap_or(5000);
        let meta: Vec<(&str, &[u8])> = vec![("x-meta", b"m1")];
        if mode == "stream" {
            self.end = header("x-grpc-end").unwrap_or_else(|| "close".into());
            let token = match hostcalls::open_grpc_stream(&cluster, "test.Echo", "Chat", meta) {
                Ok(t) => t,
                Err(s) => return self.failed("open", s),
            };
            let messages: Vec<&str> = message.split(',').collect();
            for (i, m) in messages.iter().enumerate() {
                let end = self.end == "send" && i + 1 == messages.len();
                let s = hostcalls::send_grpc_stream_message(token, Some(m.as_bytes()), end);
                self.log.push(format!("send {m}: {s:?}"));
            }
            if self.end == "close" {
                let s = hostcalls::close_grpc_stream(token);
                self.log.push(format!("close_grpc_stream: {s:?}"));
            }
            return Action::Pause;
        }
        let token = match hostcalls::dispatch_grpc_call(
            &cluster,
            "test.Echo",
            "Say",
            meta,
            Some(message.as_bytes()),
            Duration::from_millis(timeout),
        ) {
            Ok(t) => t,
            Err(s) => return self.failed("dispatch", s),
        };
        if mode == "cancel" {
            let first = hostcalls::cancel_grpc_call(token);
            let again = hostcalls::cancel_grpc_call(token);
            let _ = hostcalls::set_map_value(
                MapType::HttpRequestHeaders,
                "x-grpc-cancel",
                Some(&format!("{first:?}")),
            );
            let _ = hostcalls::set_map_value(
                MapType::HttpRequestHeaders,
                "x-grpc-cancel-again",
                Some(&format!("{again:?}")),
            );
            return Action::Continue;
        }
        Action::Pause
    }
}
