//! Example filter: header rewrite (after the SDK's `http_headers` example).
//!
//! Request: drops `x-debug`, rewrites a `/old/` path prefix to `/new/`, and
//! stamps `x-rewritten-by` with the plugin configuration (default
//! `proxy-wasm`). Response: adds `x-powered-by` and removes
//! `x-internal-secret`. Every header call uses the `Result`-returning
//! hostcalls, so a host status never panics the VM.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { stamp: String::from("proxy-wasm") })
    });
}}

struct Root {
    stamp: String,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        if let Ok(Some(bytes)) =
            hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if !text.is_empty() {
                self.stamp = text;
            }
        }
        log::info!("header-rewrite: stamping {}", self.stamp);
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Rewrite {
            stamp: self.stamp.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Rewrite {
    stamp: String,
}

impl Context for Rewrite {}

impl HttpContext for Rewrite {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let req = MapType::HttpRequestHeaders;
        let _ = hostcalls::set_map_value(req, "x-debug", None);
        if let Ok(Some(path)) = hostcalls::get_map_value(req, ":path") {
            if let Some(rest) = path.strip_prefix("/old/") {
                let new = format!("/new/{rest}");
                log::info!("header-rewrite: {path} -> {new}");
                let _ = hostcalls::set_map_value(req, ":path", Some(&new));
            }
        }
        let _ = hostcalls::set_map_value(req, "x-rewritten-by", Some(&self.stamp));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let resp = MapType::HttpResponseHeaders;
        let _ = hostcalls::add_map_value(resp, "x-powered-by", "proxy-wasm");
        let _ = hostcalls::set_map_value(resp, "x-internal-secret", None);
        Action::Continue
    }
}
