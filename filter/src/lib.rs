//! ace-filter: ACE's proxy-wasm HTTP filter for Envoy.
//!
//! A thin adapter: it turns Envoy callbacks into inputs for `ace-core`, and
//! the core's answer into a routing header. All decisions live in the core;
//! all parsing happens once, in `on_configure`.
//!
//! Request path: strip any client-supplied destination header (clients never
//! choose), ask the core for the cheapest destination, write its Envoy cluster
//! into the destination header, and clear Envoy's route cache so the route's
//! `cluster_header` sees the new value. Envoy 1.40 already clears the cache
//! after a header mutation for ABI 0.2.1 modules; the explicit
//! `clear_route_cache` call keeps that true for newer ABIs too.
//!
//! The filter must never panic (a panic kills the worker's VM): every host
//! call that can fail goes through `hostcalls`' `Result`s, and a failure is
//! logged and answered, never unwrapped.

pub mod config;

use config::Config;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType};
use std::rc::Rc;

/// Response header that tells the client which destination served it.
pub const RESPONSE_DESTINATION_HEADER: &str = "x-ace-destination";
/// Response header with the reason code of the decision.
pub const RESPONSE_REASON_HEADER: &str = "x-ace-reason";

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(AceRoot { config: None })
    });
}}

/// The plugin (root) context: holds the validated configuration.
#[derive(Debug)]
struct AceRoot {
    config: Option<Rc<Config>>,
}

impl Context for AceRoot {}

impl RootContext for AceRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(
            proxy_wasm::types::BufferType::PluginConfiguration,
            0,
            usize::MAX,
        ) {
            Ok(b) => b.unwrap_or_default(),
            Err(status) => {
                log::error!("cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        match Config::parse(&bytes) {
            Ok(cfg) => {
                log::info!(
                    "configured {} destinations, routing header {}",
                    cfg.destinations.len(),
                    cfg.destination_header
                );
                self.config = Some(Rc::new(cfg));
                true
            }
            Err(e) => {
                // Keep the last good configuration, if any, and refuse this one.
                log::error!("{e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(AceStream {
            config: self.config.clone(),
            chosen: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Per-request state.
#[derive(Debug)]
struct AceStream {
    config: Option<Rc<Config>>,
    /// (destination index, reason) once decided.
    chosen: Option<(usize, ace_core::merit::Reason)>,
}

impl Context for AceStream {}

impl AceStream {
    fn reply_json(&self, status: u32, kind: &str, message: &str) -> Action {
        let body = format!(
            "{{\"error\":{{\"type\":\"{kind}\",\"message\":{}}}}}",
            json_string(message)
        );
        if let Err(s) = hostcalls::send_http_response(
            status,
            vec![("content-type", "application/json")],
            Some(body.as_bytes()),
        ) {
            log::error!("cannot send local reply: {s:?}");
        }
        Action::Pause
    }
}

impl HttpContext for AceStream {
    fn on_http_request_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        let Some(cfg) = self.config.clone() else {
            return self.reply_json(
                503,
                "not_configured",
                "the ACE filter has no valid configuration",
            );
        };
        // Clients never choose: drop any destination header they sent.
        if let Err(s) =
            hostcalls::set_map_value(MapType::HttpRequestHeaders, &cfg.destination_header, None)
        {
            log::warn!("cannot strip client destination header: {s:?}");
            return self.reply_json(500, "internal", "cannot sanitise request headers");
        }
        let Some(choice) = ace_core::merit::choose(&cfg.offers) else {
            return self.reply_json(
                503,
                "no_feasible_destination",
                "no configured destination can serve this request",
            );
        };
        let Some(dest) = cfg.destinations.get(choice.index) else {
            return self.reply_json(500, "internal", "decision index out of range");
        };
        if let Err(s) = hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            &cfg.destination_header,
            Some(&dest.cluster),
        ) {
            log::warn!("cannot set destination header: {s:?}");
            return self.reply_json(500, "internal", "cannot set the destination header");
        }
        // Explicit, so routing stays right on ABIs that no longer clear the
        // route cache automatically. Older Envoys lack it; that is fine.
        let _ = hostcalls::call_foreign_function("clear_route_cache", None);
        self.chosen = Some((choice.index, choice.reason));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _eos: bool) -> Action {
        if let (Some(cfg), Some((index, reason))) = (self.config.as_ref(), self.chosen) {
            if let Some(dest) = cfg.destinations.get(index) {
                let _ = hostcalls::set_map_value(
                    MapType::HttpResponseHeaders,
                    RESPONSE_DESTINATION_HEADER,
                    Some(&dest.name),
                );
                let _ = hostcalls::set_map_value(
                    MapType::HttpResponseHeaders,
                    RESPONSE_REASON_HEADER,
                    Some(reason.as_str()),
                );
            }
        }
        Action::Continue
    }
}

/// Encode `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}
