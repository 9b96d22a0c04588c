//! Example filter: an HTTP call out to a cluster (after the SDK's
//! `http_auth_random` callout).
//!
//! The plugin configuration is the cluster name (default `authz`),
//! optionally followed by the callout timeout in milliseconds (default
//! 5000), e.g. `authz 1000`. Each
//! request pauses while `GET /check` goes to that cluster with the client's
//! `x-user`; a 200 resumes the request with `x-authz-user` set from the
//! callout's body, any other status becomes a local 403 carrying the
//! callout's status, and a failed call a local 503.
#![forbid(unsafe_code)]

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::time::Duration;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root { cluster: String::from("authz"), timeout: Duration::from_secs(5) })
    });
}}

struct Root {
    cluster: String,
    timeout: Duration,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        if let Ok(Some(b)) = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            let text = String::from_utf8_lossy(&b).into_owned();
            let mut words = text.split_whitespace();
            if let Some(c) = words.next() {
                self.cluster = c.to_string();
            }
            if let Some(ms) = words.next() {
                match ms.parse() {
                    Ok(ms) => self.timeout = Duration::from_millis(ms),
                    Err(_) => {
                        log::error!("http-callout: timeout {ms:?} is not milliseconds");
                        return false;
                    }
                }
            }
        }
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Callout {
            cluster: self.cluster.clone(),
            timeout: self.timeout,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Callout {
    cluster: String,
    timeout: Duration,
}

impl Callout {
    fn reply(&self, status: u32, body: &str) {
        if let Err(s) = hostcalls::send_http_response(status, vec![], Some(body.as_bytes())) {
            log::error!("http-callout: cannot reply: {s:?}");
        }
    }
}

impl Context for Callout {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        n_headers: usize,
        body_size: usize,
        _t: usize,
    ) {
        if n_headers == 0 {
            self.reply(503, "authz unavailable");
            return;
        }
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        if status != "200" {
            self.reply(403, &format!("denied by authz ({status})"));
            return;
        }
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let user = String::from_utf8_lossy(&body).trim().to_string();
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, "x-authz-user", Some(&user));
        let _ = hostcalls::resume_http_request();
    }
}

impl HttpContext for Callout {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        let user = hostcalls::get_map_value(MapType::HttpRequestHeaders, "x-user")
            .ok()
            .flatten()
            .unwrap_or_default();
        let path = format!("/check?user={user}");
        match self.dispatch_http_call(
            &self.cluster,
            vec![
                (":method", "GET"),
                (":path", &path),
                (":authority", "authz"),
            ],
            None,
            vec![],
            self.timeout,
        ) {
            Ok(_) => Action::Pause,
            Err(s) => {
                log::error!("http-callout: dispatch to {} failed: {s:?}", self.cluster);
                self.reply(500, "callout failed");
                Action::Pause
            }
        }
    }
}
