//! Test filter: reads the body the way a routing filter does (a headers
//! Pause, then a Pause per body chunk until the end of the stream) and
//! reports every stream callback it got, so the differential suite can
//! compare the callback sequence of Envoy and the host.
//!
//! - Request callbacks are recorded as `rqh(eos)`, `rqb(size,eos)` and
//!   `rqt(count,hdr)` (`hdr`: the status of replacing the request header
//!   `x-at-request-trailers` from the trailers callback, 0 for Ok) and reported to the client in the response
//!   header `x-request-callbacks`. The trailers callback also adds the
//!   request trailer `x-filter-trailer: 1` and returns Continue, as the
//!   SDK's default `on_http_request_trailers` does.
//! - Response callbacks are recorded the same way (`rsh`, `rsb`, `rst`) and
//!   reported in the response trailer `x-response-callbacks` when the
//!   response has trailers, else in the response body's last line.
//!
//! The configuration picks what the headers and body callbacks return:
//! `pause` (default: Pause until the end of the stream), `headers` (Pause
//! in the headers callbacks only), `resume` (like `pause`, but the end of
//! the stream, a last body chunk or the trailers, is let through with
//! `resume_http_request`/`resume_http_response` and a Pause instead of a
//! Continue) or `continue`. `rsh(eos,req)` also
//! records the status of replacing the request header `x-late` in
//! `on_http_response_headers`: whether the request headers are still
//! writable after the request went on.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { mode: Mode::Pause })
    });
}}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pause,
    Headers,
    Resume,
    Continue,
}

struct Root {
    mode: Mode,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        if let Ok(Some(b)) = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            self.mode = match String::from_utf8_lossy(&b).trim() {
                "continue" => Mode::Continue,
                "headers" => Mode::Headers,
                "resume" => Mode::Resume,
                _ => Mode::Pause,
            };
        }
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Log {
            mode: self.mode,
            request: Vec::new(),
            response: Vec::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Log {
    mode: Mode,
    request: Vec<String>,
    response: Vec<String>,
}

impl Log {
    fn hold(&self, request: bool, headers: bool, end_of_stream: bool) -> Action {
        let pause = match self.mode {
            Mode::Pause | Mode::Resume => true,
            Mode::Headers => headers,
            Mode::Continue => false,
        };
        if pause && !end_of_stream {
            Action::Pause
        } else if self.mode == Mode::Resume && !headers {
            self.release(request)
        } else {
            Action::Continue
        }
    }

    /// The end of a stream direction: Continue, or in `resume` mode a
    /// resume and a Pause.
    fn release(&self, request: bool) -> Action {
        if self.mode != Mode::Resume {
            return Action::Continue;
        }
        let _ = if request {
            hostcalls::resume_http_request()
        } else {
            hostcalls::resume_http_response()
        };
        Action::Pause
    }
}

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
}

/// Replaces header `name` with `1` in `map` and returns the raw status
/// (the SDK's `set_map_value` panics on the BadArgument Envoy gives for a
/// header map that went on already).
fn try_set(map: MapType, name: &str) -> u32 {
    // SAFETY: both pointers are valid for the given lengths during the call.
    unsafe {
        proxy_replace_header_map_value(map as u32, name.as_ptr(), name.len(), b"1".as_ptr(), 1)
    }
}

impl Context for Log {}

impl HttpContext for Log {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        self.request.push(format!("rqh({end_of_stream})"));
        log::info!("callback-log: {}", self.request.join(" "));
        self.hold(true, true, end_of_stream)
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.request.push(format!("rqb({size},{end_of_stream})"));
        log::info!("callback-log: {}", self.request.join(" "));
        self.hold(true, false, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, n: usize) -> Action {
        let hdr = try_set(MapType::HttpRequestHeaders, "x-at-request-trailers");
        let _ = hostcalls::add_map_value(MapType::HttpRequestTrailers, "x-filter-trailer", "1");
        self.request.push(format!("rqt({n},{hdr})"));
        log::info!("callback-log: {}", self.request.join(" "));
        self.release(true)
    }

    fn on_http_response_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        let req = try_set(MapType::HttpRequestHeaders, "x-late");
        self.response.push(format!("rsh({end_of_stream},{req})"));
        let _ = hostcalls::set_map_value(
            MapType::HttpResponseHeaders,
            "x-request-callbacks",
            Some(&self.request.join(" ")),
        );
        // The body's length changes when the log is appended to it.
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, "content-length", None);
        self.hold(false, true, end_of_stream)
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.response.push(format!("rsb({size},{end_of_stream})"));
        if end_of_stream {
            let line = format!("\n{}", self.response.join(" "));
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, size, 0, line.as_bytes());
        }
        self.hold(false, false, end_of_stream)
    }

    fn on_http_response_trailers(&mut self, n: usize) -> Action {
        let hdr = try_set(MapType::HttpResponseHeaders, "x-at-response-trailers");
        self.response.push(format!("rst({n},{hdr})"));
        let _ = hostcalls::add_map_value(
            MapType::HttpResponseTrailers,
            "x-response-callbacks",
            &self.response.join(" "),
        );
        self.release(false)
    }
}
