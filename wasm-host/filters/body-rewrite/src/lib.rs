//! Example filter: body buffering and rewrite (after the SDK's `http_body`
//! example, plus the read-the-body-before-routing pattern).
//!
//! Request: with a body, `on_request_headers` pauses (this needs Envoy's
//! `allow_on_headers_stop_iteration`, or the body never arrives); each body
//! chunk pauses until the end of the stream, then the filter stamps
//! `x-body-bytes` with the total size on the still-held request headers.
//! Response: drops `content-length`, buffers the whole body and upper-cases
//! every occurrence of the configured word (default `upstream`).
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { word: String::from("upstream") })
    });
}}

struct Root {
    word: String,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        if let Ok(Some(b)) = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            let w = String::from_utf8_lossy(&b).trim().to_string();
            if !w.is_empty() {
                self.word = w;
            }
        }
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Body {
            word: self.word.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Body {
    word: String,
}

impl Context for Body {}

impl HttpContext for Body {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        log::info!("body-rewrite: request headers, end_of_stream={end_of_stream}");
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        log::info!("body-rewrite: request body, {body_size} bytes, end_of_stream={end_of_stream}");
        if !end_of_stream {
            return Action::Pause;
        }
        let size = body_size.to_string();
        if let Err(s) =
            hostcalls::set_map_value(MapType::HttpRequestHeaders, "x-body-bytes", Some(&size))
        {
            log::warn!("body-rewrite: cannot stamp the request: {s:?}");
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, "content-length", None);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = match hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(s) => {
                log::warn!("body-rewrite: cannot read the body: {s:?}");
                return Action::Continue;
            }
        };
        let text = String::from_utf8_lossy(&body);
        let rewritten = text.replace(&self.word, &self.word.to_uppercase());
        if let Err(s) = hostcalls::set_buffer(
            BufferType::HttpResponseBody,
            0,
            body_size,
            rewritten.as_bytes(),
        ) {
            log::warn!("body-rewrite: cannot replace the body: {s:?}");
        }
        Action::Continue
    }
}
