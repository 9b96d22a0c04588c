//! Example filter: reads the attributes a request names and reports their
//! bytes, so a test can compare how a host serialises them.
//!
//! Each `x-read` request header is one attribute path with `/` between
//! segments (`metadata/filter_metadata/acme/user`). The filter answers
//! locally with 200 and one line per path: the value's bytes in hex,
//! `none` when the attribute is not there, or the error status.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Probe))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Probe;

impl Context for Probe {}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let headers = hostcalls::get_map(MapType::HttpRequestHeaders).unwrap_or_default();
        let mut lines = Vec::new();
        for (_, path) in headers.iter().filter(|(k, _)| k == "x-read") {
            let segments: Vec<&str> = path.split('/').collect();
            let value = match hostcalls::get_property(segments) {
                Ok(Some(v)) => hex(&v),
                Ok(None) => "none".to_string(),
                Err(s) => format!("{s:?}"),
            };
            lines.push(format!("{path} = {value}"));
        }
        let body = lines.join("\n");
        if let Err(s) = hostcalls::send_http_response(200, vec![], Some(body.as_bytes())) {
            log::error!("metadata-probe: cannot reply: {s:?}");
        }
        Action::Pause
    }
}
