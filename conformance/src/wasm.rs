//! `ace_filter.wasm` (built from source with `scripts/build-wasm.sh`, as
//! the wasm-host tests build it) on `ace-wasm-host`'s [`Vm`]: one Envoy
//! worker with its virtual clock at [`T0`], reading bodies
//! (`allow_on_headers_stop_iteration`, as `body.read` needs in Envoy), and
//! the control service as cluster `ace_control`, answered as the
//! [`Service`] says. The filter polls it itself, on its ticks, when it
//! holds the lease; counters are read after the filter hands them to
//! Envoy on a tick.

use crate::mock::request_headers;
use crate::{Answer, Driver, HostKind, Req, Seen, Service, T0};
use ace_wasm_host::{CallResponse, CallResult, FilterModule, Headers, Vm};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

/// `ace_filter.wasm`, built once per test binary.
fn module() -> FilterModule {
    static MODULE: OnceLock<FilterModule> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let out = Command::new("bash")
                .arg(root.join("scripts/build-wasm.sh"))
                .arg("ace-filter")
                .current_dir(&root)
                .output()
                .unwrap_or_else(|e| panic!("cannot run scripts/build-wasm.sh: {e}"));
            assert!(
                out.status.success(),
                "building ace-filter for wasm32-wasip1 failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
            FilterModule::from_file(&path)
                .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
        })
        .clone()
}

/// The control service as the cluster answers.
fn answer(service: &Mutex<Service>, call: &ace_wasm_host::CallRequest) -> CallResult {
    match &*service.lock().unwrap_or_else(|p| p.into_inner()) {
        Service::Down => CallResult::Reset,
        Service::NotModified => CallResponse::new(304).into(),
        Service::Serves(bytes) => {
            let etag = ace_snapshot::etag(bytes).unwrap_or_else(|| "\"x\"".into());
            if call.header("if-none-match") == Some(etag.as_str()) {
                return CallResponse::new(304).header("etag", &etag).into();
            }
            CallResponse::new(200)
                .header("etag", &etag)
                .body(bytes.clone())
                .into()
        }
    }
}

/// A request in flight: its stream and where it went.
#[derive(Debug)]
struct InFlight {
    stream: u32,
    upstream: Option<String>,
    sent: Option<Vec<(String, String)>>,
    local: Option<(u32, Vec<u8>, Headers)>,
}

/// The Wasm filter behind the [`Driver`] trait.
pub struct WasmDriver {
    vm: Vm,
    service: Arc<Mutex<Service>>,
    flows: HashMap<u64, InFlight>,
    next: u64,
}

impl std::fmt::Debug for WasmDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WasmDriver")
    }
}

impl WasmDriver {
    /// The filter running `config`.
    pub fn new(config: &str) -> WasmDriver {
        let service = Arc::new(Mutex::new(Service::Down));
        let s = service.clone();
        let vm = Vm::builder(&module())
            .clock(UNIX_EPOCH + Duration::from_millis(T0))
            .allow_on_headers_stop_iteration(true)
            .cluster_with("ace_control", move |call| answer(&s, call))
            .configuration(config)
            .start()
            .unwrap_or_else(|e| panic!("the filter refused the configuration: {e}"));
        WasmDriver {
            vm,
            service,
            flows: HashMap::new(),
            next: 0,
        }
    }

    fn ms(&self) -> u64 {
        self.vm
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

fn headers(pairs: &[(String, String)]) -> Headers {
    pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

impl Driver for WasmDriver {
    fn kind(&self) -> HostKind {
        HostKind::Wasm
    }

    fn now(&self) -> u64 {
        self.ms()
    }

    fn open(&mut self, req: &Req) -> u64 {
        let mut s = self.vm.http_stream().unwrap();
        let h = headers(&request_headers(req));
        s.send_request_headers(h, req.body.is_empty()).unwrap();
        // Envoy hands an HTTP/1 body over as its data, then an empty
        // end-of-stream frame.
        for chunk in &req.body {
            if s.local_response().is_some() {
                break;
            }
            s.send_request_body(chunk, false).unwrap();
        }
        if !req.body.is_empty() && s.local_response().is_none() {
            s.send_request_body(b"", true).unwrap();
        }
        let local = s
            .local_response()
            .map(|l| (l.status, l.body.clone(), l.headers.clone()));
        let upstream = match local {
            Some(_) => None,
            None => {
                assert!(!s.request_paused(), "a whole request is never left held");
                s.request_headers()
                    .get("x-ace-destination")
                    .map(str::to_string)
            }
        };
        let sent = upstream.as_ref().map(|_| s.request_headers().to_vec());
        self.next += 1;
        self.flows.insert(
            self.next,
            InFlight {
                stream: s.id(),
                upstream,
                sent,
                local,
            },
        );
        self.next
    }

    fn upstream(&self, id: u64) -> Option<String> {
        self.flows.get(&id).and_then(|f| f.upstream.clone())
    }

    fn sent(&self, id: u64) -> Option<Vec<(String, String)>> {
        self.flows.get(&id).and_then(|f| f.sent.clone())
    }

    fn close(&mut self, id: u64, answer: &Answer) -> Seen {
        let f = self.flows.remove(&id).expect("a request in flight");
        let mut seen = Seen::default();
        if f.upstream.is_some() {
            self.vm
                .advance(Duration::from_millis(answer.took_ms))
                .unwrap();
        }
        let mut s = self.vm.stream(f.stream).unwrap();
        match &f.local {
            None => {
                let mut h: Vec<(String, String)> =
                    vec![(":status".into(), answer.status.to_string())];
                h.extend(
                    answer
                        .headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone())),
                );
                s.send_response_headers(headers(&h), answer.body.is_empty())
                    .unwrap();
                for (i, chunk) in answer.body.iter().enumerate() {
                    s.send_response_body(chunk, i + 1 == answer.body.len())
                        .unwrap();
                }
                seen.status = answer.status;
            }
            Some((status, body, extra)) => {
                // Envoy sends the local reply back through the filter.
                let mut h = vec![(":status".to_string(), status.to_string())];
                h.extend(extra.to_vec());
                s.send_response_headers(headers(&h), false).unwrap();
                s.send_response_body(body, true).unwrap();
                seen.status = *status;
                seen.reply = serde_json::from_slice(body).ok();
            }
        }
        seen.headers = Some(s.response_headers().to_vec());
        let logged = s.finish_logged().unwrap();
        let line = logged
            .get(ace_flow::event::PROPERTY.as_bytes())
            .unwrap_or_else(|| panic!("no event in filter state: {logged:?}"));
        seen.event = serde_json::from_slice(line).unwrap();
        seen.upstream = f.upstream;
        seen
    }

    fn service(&mut self, service: Service) {
        *self.service.lock().unwrap_or_else(|p| p.into_inner()) = service;
    }

    fn advance(&mut self, ms: u64) {
        self.vm.advance(Duration::from_millis(ms)).unwrap();
    }

    fn counter(&mut self, name: &str) -> Option<u64> {
        // Handed to Envoy on the worker's tick.
        let period = self.vm.tick_period().unwrap_or(Duration::from_millis(500));
        self.vm.advance(period).unwrap();
        Some(self.vm.process().metric_value(name).unwrap_or(0) as u64)
    }
}
