//! A Wasm HTTP filter that lets every request through untouched. Loaded in
//! Envoy exactly like ACE (same runtime, same VM settings), it isolates the
//! cost of the Wasm plumbing from the cost of ACE's own work.
//!
//! For calibration it can also make a fixed number of host calls of one
//! kind per request, so `envoy-load --calibrate` can price each kind of
//! call inside Envoy. Its configuration is then `KIND N`, one of:
//!
//! - `header_found N`: read a request header that is present (the host
//!   calls back into the VM to allocate the value);
//! - `header_missing N`: read one that is absent (no allocation);
//! - `header_pairs N`: read all request headers in one call;
//! - `shared_get N`: read a 64-byte shared-data entry;
//! - `shared_set N`: write it;
//! - `header_set N`: set a request header;
//! - `metric N`: increment a counter;
//! - `time N`: read the clock;
//! - `property N`: write a 300-byte filter-state value;
//! - `clear_route_cache N`: call that foreign function.
//!
//! An empty configuration is the plain no-op.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Noop::default()) });
}}

/// Which host call to repeat, and how often.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Calls {
    #[default]
    None,
    HeaderFound(u32),
    HeaderMissing(u32),
    HeaderPairs(u32),
    Property(u32),
    ClearRouteCache(u32),
    SharedGet(u32),
    SharedSet(u32),
    HeaderSet(u32),
    Metric(u32, u32),
    Time(u32),
}

#[derive(Debug, Default)]
struct Noop {
    calls: Calls,
}

impl Context for Noop {}

impl HttpContext for Noop {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let payload = [7u8; 64];
        match self.calls {
            Calls::None => {}
            Calls::HeaderFound(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_map_value(MapType::HttpRequestHeaders, "content-type");
            }),
            Calls::HeaderMissing(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_map_value(MapType::HttpRequestHeaders, "x-absent");
            }),
            Calls::HeaderPairs(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_map(MapType::HttpRequestHeaders);
            }),
            Calls::Property(n) => (0..n).for_each(|_| {
                let _ = hostcalls::set_property(vec!["calibration"], Some(&[b'x'; 300]));
            }),
            Calls::ClearRouteCache(n) => (0..n).for_each(|_| {
                let _ = hostcalls::call_foreign_function("clear_route_cache", None);
            }),
            Calls::SharedGet(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_shared_data("calibration");
            }),
            Calls::SharedSet(n) => (0..n).for_each(|_| {
                let _ = hostcalls::set_shared_data("calibration", Some(&payload), None);
            }),
            Calls::HeaderSet(n) => (0..n).for_each(|_| {
                let _ = hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    "x-calibration",
                    Some("1"),
                );
            }),
            Calls::Metric(n, id) => (0..n).for_each(|_| {
                let _ = hostcalls::increment_metric(id, 1);
            }),
            Calls::Time(n) => (0..n).for_each(|_| {
                let _ = hostcalls::get_current_time();
            }),
        }
        Action::Continue
    }
}

impl RootContext for Noop {
    fn on_configure(&mut self, _: usize) -> bool {
        let config = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        let mut words = text.split_whitespace();
        let (kind, n) = (words.next(), words.next().and_then(|n| n.parse().ok()));
        self.calls = match (kind, n) {
            (None, _) => Calls::None,
            (Some("header_found"), Some(n)) => Calls::HeaderFound(n),
            (Some("header_missing"), Some(n)) => Calls::HeaderMissing(n),
            (Some("shared_get"), Some(n)) => {
                let _ = hostcalls::set_shared_data("calibration", Some(&[7u8; 64]), None);
                Calls::SharedGet(n)
            }
            (Some("shared_set"), Some(n)) => Calls::SharedSet(n),
            (Some("header_pairs"), Some(n)) => Calls::HeaderPairs(n),
            (Some("property"), Some(n)) => Calls::Property(n),
            (Some("clear_route_cache"), Some(n)) => Calls::ClearRouteCache(n),
            (Some("header_set"), Some(n)) => Calls::HeaderSet(n),
            (Some("metric"), Some(n)) => {
                match hostcalls::define_metric(MetricType::Counter, "calibration") {
                    Ok(id) => Calls::Metric(n, id),
                    Err(_) => return false,
                }
            }
            (Some("time"), Some(n)) => Calls::Time(n),
            _ => {
                log::error!("calibration filter: expected `KIND N`, got `{text}`");
                return false;
            }
        };
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop { calls: self.calls }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
