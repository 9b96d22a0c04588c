//! Example filter: local auth reply (after the SDK's `http_auth_random`,
//! made deterministic).
//!
//! The plugin configuration is the expected bearer token. A request without
//! `authorization: Bearer <token>` gets a local 401 with
//! `www-authenticate: Bearer` and a JSON body; an allowed one goes upstream
//! with the credential removed. Counters `auth_allowed` / `auth_denied`.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { token: String::new(), allowed: 0, denied: 0 })
    });
}}

struct Root {
    token: String,
    allowed: u32,
    denied: u32,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let token = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(b)) => String::from_utf8_lossy(&b).trim().to_string(),
            _ => String::new(),
        };
        if token.is_empty() {
            log::error!("local-auth: the configuration must be the expected token");
            return false;
        }
        self.token = token;
        match (
            hostcalls::define_metric(MetricType::Counter, "auth_allowed"),
            hostcalls::define_metric(MetricType::Counter, "auth_denied"),
        ) {
            (Ok(a), Ok(d)) => {
                self.allowed = a;
                self.denied = d;
                true
            }
            _ => false,
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Auth {
            expected: format!("Bearer {}", self.token),
            allowed: self.allowed,
            denied: self.denied,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Auth {
    expected: String,
    allowed: u32,
    denied: u32,
}

impl Context for Auth {}

impl HttpContext for Auth {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let req = MapType::HttpRequestHeaders;
        let given = hostcalls::get_map_value(req, "authorization")
            .ok()
            .flatten();
        if given.as_deref() == Some(self.expected.as_str()) {
            let _ = hostcalls::increment_metric(self.allowed, 1);
            let _ = hostcalls::set_map_value(req, "authorization", None);
            return Action::Continue;
        }
        let _ = hostcalls::increment_metric(self.denied, 1);
        log::warn!(
            "local-auth: denied (credential {})",
            if given.is_some() { "wrong" } else { "missing" }
        );
        if let Err(s) = hostcalls::send_http_response(
            401,
            vec![
                ("www-authenticate", "Bearer"),
                ("content-type", "application/json"),
            ],
            Some(b"{\"error\":\"unauthorized\"}"),
        ) {
            log::error!("local-auth: cannot reply: {s:?}");
        }
        Action::Pause
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, "x-auth-checked", Some("1"));
        Action::Continue
    }
}
