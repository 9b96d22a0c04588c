//! A Wasm HTTP filter that lets every request through untouched. Loaded in
//! Envoy exactly like ACE (same runtime, same VM settings), it isolates the
//! cost of the Wasm plumbing from the cost of ACE's own work.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Noop) });
}}

#[derive(Debug)]
struct Noop;

impl Context for Noop {}

impl HttpContext for Noop {}

impl RootContext for Noop {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Noop))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
