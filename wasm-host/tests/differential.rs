//! Differential suite: the same scenarios in a real Envoy 1.40 (through
//! `ace-harness`) and on ace-wasm-host, comparing what the client and every
//! upstream observe: status, headers, body, which upstream (or callout
//! cluster) was reached and with what.
//!
//! Needs `envoy` on PATH (or `ACE_ENVOY`): without it these tests fail, they
//! never skip. Each group of scenarios shares one Envoy, so the suite starts
//! a handful of Envoys, not one per scenario.
//!
//! Headers whose values are inherently per-run (`date`, `x-request-id`,
//! `x-envoy-upstream-service-time`) or that only the route's timeout sets
//! (`x-envoy-expected-rq-timeout-ms`) are compared by presence only; all
//! others are compared by value, order-insensitively. A client that gets no
//! answer (Envoy holding the request) records `<no response>`, as does the
//! host for a hung or reset exchange.
//!
//! Debugging a difference: `ACE_ENVOY_LOG_LEVEL=debug` sets Envoy's log
//! level, and `ACE_ENVOY_LOG_DUMP=/path` writes each group's bootstrap and
//! Envoy log there (waiting ~11 s for Envoy to flush it).

#[path = "common/mod.rs"]
mod common;
#[path = "differential/extras.rs"]
mod extras;
#[path = "differential/fidelity.rs"]
mod fidelity;
#[path = "differential/grpc.rs"]
mod grpc;
#[path = "differential/metadata.rs"]
mod metadata;
#[path = "differential/third_party.rs"]
mod third_party;

use ace_harness::client;
use ace_harness::envoy::{wasm_filter_json, EnvoyBuilder};
use ace_harness::upstream::{Behavior, Upstream};
use ace_wasm_host::{
    CallRequest, CallResponse, Process, Request, Response, Route, StreamInfo, UpstreamRequest, Vm,
    VmBuilder,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One client request.
#[derive(Clone, Debug)]
struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: &'static str,
    /// Sent over HTTP/2 (prior knowledge) by `nghttp`, the body without
    /// `content-length`; otherwise HTTP/1.1 by the harness client.
    h2: bool,
    /// Request trailers (HTTP/2 only).
    trailers: Vec<(&'static str, &'static str)>,
    /// Compare the order of the headers each upstream received, too.
    ordered: bool,
}

fn case(name: &'static str, method: &'static str, path: &'static str) -> Case {
    Case {
        name,
        method,
        path,
        headers: Vec::new(),
        body: "",
        h2: false,
        trailers: Vec::new(),
        ordered: false,
    }
}

impl Case {
    fn header(mut self, k: &'static str, v: &'static str) -> Case {
        self.headers.push((k, v));
        self
    }
    fn body(mut self, b: &'static str) -> Case {
        self.body = b;
        self
    }
    fn h2(mut self) -> Case {
        self.h2 = true;
        self
    }
    fn ordered(mut self) -> Case {
        self.ordered = true;
        self
    }
    /// Adds a request trailer: the request goes over HTTP/2.
    fn trailer(mut self, k: &'static str, v: &'static str) -> Case {
        self.trailers.push((k, v));
        self.h2()
    }
}

/// The filter under test.
#[derive(Clone, Copy)]
enum Guest {
    /// A workspace cdylib, built for wasm32-wasip1.
    Package(&'static str),
    /// A hand-written module: (name, WAT text).
    Wat(&'static str, &'static str),
    /// An example the published `proxy-wasm` 0.2.0 package ships, built
    /// from cargo's registry cache (`ace_harness::wasm::build_proxy_wasm_example`).
    Example(&'static str),
}

impl Guest {
    fn name(self) -> &'static str {
        match self {
            Guest::Package(p) => p,
            Guest::Wat(name, _) | Guest::Example(name) => name,
        }
    }

    fn wasm_file(self) -> std::path::PathBuf {
        match self {
            Guest::Package(p) => ace_harness::wasm::build(p).unwrap_or_else(|e| panic!("{e}")),
            Guest::Example(e) => {
                ace_harness::wasm::build_proxy_wasm_example(e).unwrap_or_else(|e| panic!("{e}"))
            }
            Guest::Wat(name, text) => {
                let bytes = wat::parse_str(common::wat_guest(text))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let path = temp_file(&format!("{name}.wasm"));
                std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                path
            }
        }
    }

    fn module(self) -> ace_wasm_host::FilterModule {
        match self {
            Guest::Package(p) => common::module(p),
            Guest::Example(_) => {
                let path = self.wasm_file();
                ace_wasm_host::FilterModule::from_file(&path)
                    .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
            }
            Guest::Wat(name, text) => {
                ace_wasm_host::FilterModule::from_bytes(common::wat_guest(text).as_bytes())
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
            }
        }
    }
}

/// Scenarios sharing one filter, configuration, route and set of clusters.
struct Group {
    package: Guest,
    configuration: &'static str,
    /// `Some(header)`: route with `cluster_header`; `None`: fixed cluster
    /// "backend".
    cluster_header: Option<&'static str>,
    /// Every cluster Envoy knows, with what its upstream does. Callout
    /// targets are clusters too.
    clusters: Vec<(&'static str, Behavior)>,
    /// `PluginConfig.allow_on_headers_stop_iteration`.
    allow_stop_iteration: bool,
    cases: Vec<Case>,
}

/// What a group changes in Envoy's configuration and, to match, on the
/// host; the default changes nothing.
#[derive(Default, Clone, Copy)]
struct Setup {
    /// Applied to Envoy's bootstrap (listener, workers).
    envoy: Option<fn(EnvoyBuilder) -> EnvoyBuilder>,
    /// Applied to the route action (`{"cluster": .., "timeout": "30s"}`).
    route: Option<fn(&mut serde_json::Value)>,
    /// Applied to the host's VMs.
    host: Option<for<'m> fn(VmBuilder<'m>) -> VmBuilder<'m>>,
    /// Envoy's worker threads (`--concurrency`, the harness's 2 when
    /// `None`); the host starts a VM for each.
    workers: Option<u32>,
}

/// What a client and the upstreams saw, normalized for comparison.
#[derive(Debug, PartialEq, Clone)]
struct Observed {
    status: u16,
    headers: Vec<(String, String)>,
    /// Response header names in arrival order (only for [`Case::ordered`]).
    order: Vec<String>,
    body: String,
    trailers: Vec<(String, String)>,
    upstreams: Vec<Seen>,
    /// What each compared gRPC cluster received ([`extras::Extras::grpc`]).
    grpc: Vec<extras::GrpcSeen>,
}

#[derive(Debug, PartialEq, Clone)]
struct Seen {
    cluster: String,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
    trailers: Vec<(String, String)>,
    /// Header names in arrival order (only for [`Case::ordered`]).
    order: Vec<String>,
}

/// The body recorded when the client got no response (a timeout: the
/// request is held forever, or a reset).
const NO_RESPONSE: &str = "<no response>";

/// Hop-by-hop headers of the client's own HTTP/1.1 connection.
const TRANSPORT: &[&str] = &["connection", "keep-alive", "transfer-encoding"];

/// The header names in order, pseudo-headers and hop-by-hop ones left
/// out; empty unless the case compares order.
fn order(c: &Case, headers: &[(String, String)]) -> Vec<String> {
    headers
        .iter()
        .map(|(k, _)| k.clone())
        .filter(|k| c.ordered && !k.starts_with(':') && !TRANSPORT.contains(&k.as_str()))
        .collect()
}

const VOLATILE: &[&str] = &[
    "date",
    "x-request-id",
    "x-envoy-upstream-service-time",
    "x-envoy-expected-rq-timeout-ms",
];

fn normalize(headers: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = headers
        .into_iter()
        .filter(|(k, _)| !k.starts_with(':') && !TRANSPORT.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = if VOLATILE.contains(&k.as_str()) {
                "<present>".to_string()
            } else {
                v
            };
            (k, v)
        })
        .collect();
    v.sort();
    v
}

/// What the harness's upstream sends for `b` (mirrors `ace_harness::upstream`).
fn upstream_response(name: &str, b: &Behavior) -> Response {
    if let Behavior::RespondWithTrailers {
        status,
        headers,
        body,
        trailers,
    } = b
    {
        let mut r = Response::new(*status)
            .header("x-upstream", name)
            .body(body.clone());
        for (k, v) in headers {
            r = r.header(k, v);
        }
        for (k, v) in trailers {
            r = r.trailer(k, v);
        }
        return r;
    }
    let json_body = |status: u16| {
        json!({"upstream": name, "status": status})
            .to_string()
            .into_bytes()
    };
    let (status, extra, body) = match b {
        Behavior::Status(code) => (*code, vec![], json_body(*code)),
        Behavior::Respond {
            status,
            headers,
            body,
        } => (*status, headers.clone(), body.clone()),
        _ => (200, vec![], json_body(200)),
    };
    let mut headers = vec![
        ("content-length".to_string(), body.len().to_string()),
        ("x-upstream".to_string(), name.to_string()),
    ];
    if !extra
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        headers.push(("content-type".into(), "application/json".into()));
    }
    headers.extend(extra);
    let mut r = Response::new(status).body(body);
    for (k, v) in headers {
        r = r.header(&k, &v);
    }
    r
}

fn run_in_envoy(group: &Group, setup: Setup, extras: &extras::Extras) -> Vec<Observed> {
    let wasm = group.package.wasm_file();
    let grpc = extras.start_grpc_upstreams();
    let upstreams: Vec<(String, Upstream)> = group
        .clusters
        .iter()
        .map(|(name, behavior)| {
            let u = Upstream::start(name).unwrap_or_else(|e| panic!("upstream {name}: {e}"));
            u.set_behavior(behavior.clone());
            (name.to_string(), u)
        })
        .collect();
    let mut filter = wasm_filter_json("ace", &wasm, group.configuration);
    if group.allow_stop_iteration {
        filter["typed_config"]["config"]["allow_on_headers_stop_iteration"] = json!(true);
    }
    let mut b = extras.envoy(EnvoyBuilder::new(), &grpc).http_filter(filter);
    if let Some(f) = setup.envoy {
        b = f(b);
    }
    if let Some(n) = setup.workers {
        b = b.concurrency(n);
    }
    for (name, u) in &upstreams {
        // HTTP/1 upstreams with trailers on (chunked bodies carry them).
        b = b.cluster_json(json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http_protocol_options": {"enable_trailers": true}}
                }
            },
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                    "socket_address": {"address": "127.0.0.1", "port_value": u.port()}
                }}}]}]
            }
        }));
    }
    let mut route = match group.cluster_header {
        Some(h) => json!({"cluster_header": h, "timeout": "30s"}),
        None => json!({"cluster": "backend", "timeout": "30s"}),
    };
    if let Some(f) = setup.route {
        f(&mut route);
    }
    b = b.route(route);
    if let Ok(level) = std::env::var("ACE_ENVOY_LOG_LEVEL") {
        b = b.log_level(&level);
    }
    let envoy = b
        .start()
        .unwrap_or_else(|e| panic!("Envoy did not start: {e}"));
    let observed = group
        .cases
        .iter()
        .map(|c| {
            for (_, u) in &upstreams {
                u.clear();
            }
            extras::clear_grpc(&grpc);
            let (r, trailers) = if c.h2 {
                send_h2(envoy.port(), c)
            } else {
                (send_h1(envoy.port(), c), Vec::new())
            };
            let mut seen = Vec::new();
            for (name, u) in &upstreams {
                for rec in u.requests() {
                    seen.push(Seen {
                        cluster: name.clone(),
                        method: rec.method,
                        path: rec.path,
                        order: order(c, &rec.headers),
                        headers: normalize(rec.headers),
                        body: String::from_utf8_lossy(&rec.body).into_owned(),
                        trailers: normalize(rec.trailers),
                    });
                }
            }
            seen.sort_by(|a, b| a.cluster.cmp(&b.cluster));
            Observed {
                status: r.status,
                order: order(c, &r.headers),
                headers: normalize(r.headers),
                body: String::from_utf8_lossy(&r.body).into_owned(),
                trailers: normalize(trailers),
                upstreams: seen,
                grpc: extras.grpc_seen_in_envoy(&grpc),
            }
        })
        .collect();
    if let Ok(path) = std::env::var("ACE_ENVOY_LOG_DUMP") {
        // Envoy flushes its log file about every 10 s.
        envoy.wait_log("\u{0}never", std::time::Duration::from_secs(11));
        let bootstrap = std::fs::read_to_string(envoy.dir().join("envoy.json")).unwrap_or_default();
        let _ = std::fs::write(path, format!("{bootstrap}\n{}", envoy.log()));
    }
    observed
}

/// Sends `c` over HTTP/1.1 with the harness client.
fn send_h1(port: u16, c: &Case) -> client::Response {
    let mut req = client::Request::get(c.path);
    req.method = c.method.to_string();
    req.timeout = std::time::Duration::from_secs(10);
    req.body = c.body.as_bytes().to_vec();
    for (k, v) in &c.headers {
        req = req.header(k, v);
    }
    // A client-side failure (e.g. a timeout: Envoy held the request) is an
    // observation too, status 0.
    req.send(port).unwrap_or_else(|e| {
        eprintln!("differential: {}: no response from Envoy: {e}", c.name);
        no_response()
    })
}

fn no_response() -> client::Response {
    client::Response {
        status: 0,
        headers: Vec::new(),
        body: NO_RESPONSE.as_bytes().to_vec(),
    }
}

/// A path of its own in the temporary directory. Tests run in parallel and
/// share case and guest names, so a name alone is not enough: a shared one
/// let one test delete the body file another was still sending.
fn temp_file(name: &str) -> std::path::PathBuf {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "ace-differential-{}-{}-{name}",
        std::process::id(),
        MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// What `nghttp` sends besides the case's headers (`user-agent` replaced,
/// as its default names its version).
const NGHTTP_HEADERS: &[(&str, &str)] = &[
    ("accept", "*/*"),
    ("accept-encoding", "gzip, deflate"),
    ("user-agent", "ace-differential"),
];

/// Sends `c` over HTTP/2 with prior knowledge through Debian's `nghttp`
/// (nghttp2-client): the harness client speaks HTTP/1.1, which has no
/// request trailers. Returns the response and its trailers, parsed from
/// `nghttp -v` (headers and trailers are the `recv (stream_id=N)` lines
/// before the first and the second HEADERS frame; the body is printed
/// right before each DATA frame's line, `length` bytes of it).
fn send_h2(port: u16, c: &Case) -> (client::Response, Vec<(String, String)>) {
    let body_file = temp_file(&format!("h2-body-{}", c.name.replace(' ', "-")));
    let mut cmd = std::process::Command::new("nghttp");
    cmd.arg("-v")
        .arg("--timeout=10s")
        .arg("--no-content-length")
        .arg("-H")
        .arg(":authority: ace.test")
        .arg("-H")
        .arg(format!(":method: {}", c.method));
    for (k, v) in NGHTTP_HEADERS.iter().filter(|(k, _)| *k == "user-agent") {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    for (k, v) in &c.headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    if !c.body.is_empty() || !c.trailers.is_empty() {
        std::fs::write(&body_file, c.body)
            .unwrap_or_else(|e| panic!("{}: {e}", body_file.display()));
        cmd.arg("-d").arg(&body_file);
    }
    for (k, v) in &c.trailers {
        cmd.arg(format!("--trailer={k}: {v}"));
    }
    cmd.arg(format!("http://127.0.0.1:{port}{}", c.path));
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run nghttp (Debian's nghttp2-client): {e}"));
    let _ = std::fs::remove_file(&body_file);
    let text = &out.stdout;
    let mut blocks: Vec<Vec<(String, String)>> = vec![Vec::new()];
    let mut body = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let end = text[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |i| at + i + 1);
        let line = String::from_utf8_lossy(&text[at..end]).into_owned();
        if let Some(i) = line.find("] recv DATA frame <length=") {
            // The body chunk sits right before this line's `[`.
            let start = line.rfind("[").filter(|&b| b < i).unwrap_or(0);
            let len: usize = line[i + 26..]
                .split(',')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let data_end = at + start;
            body.extend_from_slice(&text[data_end.saturating_sub(len)..data_end]);
        } else if let Some(i) = line.find(" recv (stream_id=") {
            let rest = &line[i..];
            if let Some(j) = rest.find(") ") {
                let field = rest[j + 2..].trim_end();
                if let Some(colon) = field[1..].find(": ") {
                    let (k, v) = (&field[..colon + 1], &field[colon + 3..]);
                    if let Some(b) = blocks.last_mut() {
                        b.push((k.to_string(), v.to_string()));
                    }
                }
            }
        } else if line.contains("] recv HEADERS frame") {
            blocks.push(Vec::new());
        }
        at = end;
    }
    let mut blocks = blocks.into_iter().filter(|b| !b.is_empty());
    let headers = blocks.next().unwrap_or_default();
    let trailers = blocks.next().unwrap_or_default();
    let status = headers
        .iter()
        .find(|(k, _)| k == ":status")
        .and_then(|(_, v)| v.parse().ok());
    match status {
        Some(status) => (
            client::Response {
                status,
                headers,
                body,
            },
            trailers,
        ),
        None => {
            eprintln!(
                "differential: {}: no HTTP/2 response from Envoy (nghttp: {}, {})",
                c.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            (no_response(), Vec::new())
        }
    }
}

/// A request in HTTP/1 form, as an upstream records it.
fn h1_seen(
    cluster: &str,
    headers: &ace_wasm_host::Headers,
    body: &[u8],
    trailers: &ace_wasm_host::Headers,
    ordered: bool,
) -> Seen {
    let mut rest = Vec::new();
    for (k, v) in headers.to_vec() {
        match k.as_str() {
            ":authority" => rest.push(("host".to_string(), v)),
            k if k.starts_with(':') => {}
            _ => rest.push((k, v)),
        }
    }
    Seen {
        cluster: cluster.to_string(),
        method: headers.get(":method").unwrap_or_default().to_string(),
        path: headers.get(":path").unwrap_or_default().to_string(),
        order: match ordered {
            true => rest.iter().map(|(k, _)| k.clone()).collect(),
            false => Vec::new(),
        },
        headers: normalize(rest),
        body: String::from_utf8_lossy(body).into_owned(),
        // Envoy's HTTP/1 codec sends trailers only with a chunked body.
        trailers: if headers.contains("content-length") {
            Vec::new()
        } else {
            normalize(trailers.to_vec())
        },
    }
}

fn run_on_host(group: &Group, setup: Setup, extras: &extras::Extras) -> Vec<Observed> {
    let module = group.package.module();
    serve_on_host(group, setup, extras, &module)
}

fn serve_on_host<'m>(
    group: &Group,
    setup: Setup,
    extras: &extras::Extras,
    module: &'m ace_wasm_host::FilterModule,
) -> Vec<Observed> {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let process = Process::new();
    let grpc_seen: extras::GrpcLog = Arc::default();
    let plugin = |b: VmBuilder<'m>| -> VmBuilder<'m> {
        let b = b
            .process(&process)
            .plugin_name("ace")
            .root_id("ace")
            .vm_id("ace")
            .allow_on_headers_stop_iteration(group.allow_stop_iteration)
            // The harness's route configuration: virtual host "all", unnamed route.
            .stream_info(StreamInfo {
                virtual_host_name: "all".into(),
                ..StreamInfo::default()
            })
            .configuration(group.configuration);
        let b = match setup.host {
            Some(f) => f(b),
            None => b,
        };
        extras.host(b, &grpc_seen)
    };
    let mut builder = plugin(Vm::builder(module));
    let behaviors: BTreeMap<String, Behavior> = group
        .clusters
        .iter()
        .map(|(n, b)| (n.to_string(), b.clone()))
        .collect();
    let mut latencies = Vec::new();
    // Whether the current case compares header order.
    let ordered = Arc::new(AtomicBool::new(false));
    for (name, behavior) in &group.clusters {
        if let Behavior::Slow(latency) = behavior {
            // Registered below; the latency applies once it is.
            latencies.push((*name, *latency));
        }
        let (name, behavior, seen) = (name.to_string(), behavior.clone(), seen.clone());
        let ordered = ordered.clone();
        builder = builder.cluster_with(&name.clone(), move |req: &CallRequest| {
            seen.lock().unwrap_or_else(|e| e.into_inner()).push(h1_seen(
                &name,
                &req.headers,
                &req.body,
                &ace_wasm_host::Headers::new(),
                ordered.load(Ordering::SeqCst),
            ));
            let u = upstream_response(&name, &behavior);
            let mut r = CallResponse::new(u.status()).body(u.body);
            for (k, v) in u.headers.to_vec() {
                if !k.starts_with(':') {
                    r = r.header(&k, &v);
                }
            }
            r.into()
        });
    }
    for (name, latency) in latencies {
        builder = builder.cluster_latency(name, latency);
    }
    // Envoy's VMs: after the validation VM, the main thread's, then one
    // per worker; the last worker serves the requests.
    let vm_error = |e| panic!("host VM: {e}");
    let _main_thread = builder.start().unwrap_or_else(vm_error);
    let mut workers: Vec<Vm> = (0..setup.workers.unwrap_or(2))
        .map(|_| {
            plugin(Vm::builder(module))
                .validation_vm(false)
                .start()
                .unwrap_or_else(vm_error)
        })
        .collect();
    let Some(mut vm) = workers.pop() else {
        panic!("a group needs at least one worker");
    };
    let route = match group.cluster_header {
        Some(h) => Route::ClusterHeader(h.to_string()),
        None => Route::Cluster("backend".to_string()),
    };
    group
        .cases
        .iter()
        .map(|c| {
            seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
            grpc_seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
            ordered.store(c.ordered, Ordering::SeqCst);
            let mut req = Request::new(c.method, c.path).authority("ace.test");
            if c.h2 {
                // What nghttp sends, as Envoy's HTTP/2 codec hands it on.
                req = req.http2();
                for (k, v) in NGHTTP_HEADERS {
                    req = req.header(k, v);
                }
                let names: Vec<&str> = c.trailers.iter().map(|(k, _)| *k).collect();
                if !names.is_empty() {
                    req = req.header("trailer", &names.join(", "));
                }
            } else {
                // What the harness client sends, as Envoy's HTTP/1 codec hands it on.
                req = req.header("content-length", &c.body.len().to_string());
            }
            for (k, v) in &c.headers {
                req = req.header(k, v);
            }
            let mut req = req.body(c.body.as_bytes().to_vec());
            for (k, v) in &c.trailers {
                req = req.trailer(k, v);
            }
            let ex = vm
                .exchange(&route, req, |up: &UpstreamRequest| {
                    let behavior = behaviors.get(&up.cluster)?;
                    seen.lock().unwrap_or_else(|e| e.into_inner()).push(h1_seen(
                        &up.cluster,
                        &up.headers,
                        &up.body,
                        &up.trailers,
                        c.ordered,
                    ));
                    Some(upstream_response(&up.cluster, behavior))
                })
                .unwrap_or_else(|e| panic!("{}: host exchange failed: {e}", c.name));
            let r = ex.response.unwrap_or_else(|| {
                eprintln!(
                    "differential: {}: no response on the host (reset {}, hung {})",
                    c.name, ex.reset, ex.hung
                );
                Response::new(0).body(NO_RESPONSE)
            });
            let mut ups = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            ups.sort_by(|a, b| a.cluster.cmp(&b.cluster));
            let headers = r.headers.to_vec();
            Observed {
                status: r.status(),
                order: order(c, &headers),
                headers: normalize(headers),
                body: r.text(),
                trailers: normalize(r.trailers.to_vec()),
                upstreams: ups,
                grpc: extras::sorted(&grpc_seen),
            }
        })
        .collect()
}

/// The fields that differ, one per line.
fn describe(e: &Observed, h: &Observed) -> String {
    let mut out = String::new();
    let mut field = |name: &str, a: String, b: String| {
        if a != b {
            let (a, b) = (clip(&a), clip(&b));
            out.push_str(&format!("  {name}:\n    envoy: {a}\n    host:  {b}\n"));
        }
    };
    field("status", e.status.to_string(), h.status.to_string());
    field(
        "headers",
        format!("{:?}", e.headers),
        format!("{:?}", h.headers),
    );
    field("order", format!("{:?}", e.order), format!("{:?}", h.order));
    field("body", format!("{:?}", e.body), format!("{:?}", h.body));
    field(
        "trailers",
        format!("{:?}", e.trailers),
        format!("{:?}", h.trailers),
    );
    field(
        "upstreams",
        format!("{:?}", e.upstreams),
        format!("{:?}", h.upstreams),
    );
    field("grpc", format!("{:?}", e.grpc), format!("{:?}", h.grpc));
    out
}

/// A field cut to a readable length (bodies of a megabyte and more).
fn clip(text: &str) -> String {
    const MAX: usize = 600;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], text.len()),
        None => text.to_string(),
    }
}

/// Runs a group both ways and asserts every scenario matches.
fn differential(group: Group) {
    compare(group, Setup::default(), &extras::Extras::default());
}

/// [`differential`], with Envoy and the host changed alike by `setup`.
fn differential_with(group: Group, setup: Setup) {
    compare(group, setup, &extras::Extras::default());
}

/// [`differential`] with gRPC clusters or dynamic metadata.
fn differential_extras(group: Group, extras: &extras::Extras) {
    compare(group, Setup::default(), extras);
}

/// Runs `group` in Envoy and on the host, and asserts every scenario
/// matches.
fn compare(group: Group, setup: Setup, extras: &extras::Extras) {
    let envoy = run_in_envoy(&group, setup, extras);
    let host = run_on_host(&group, setup, extras);
    let mut failures = Vec::new();
    for ((c, e), h) in group.cases.iter().zip(&envoy).zip(&host) {
        if e == h {
            eprintln!("differential: {} / {}: same", group.package.name(), c.name);
        } else {
            failures.push(format!(
                "{} / {}:\n{}",
                group.package.name(),
                c.name,
                describe(e, h)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios differ:\n{}",
        failures.len(),
        group.cases.len(),
        failures.join("\n")
    );
    assert_eq!(envoy.len(), group.cases.len());
}

#[test]
fn ace_filter_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-filter"),
        configuration: common::ace_config(),
        cluster_header: Some("x-ace-destination"),
        allow_stop_iteration: false,
        clusters: vec![
            ("cluster_a", Behavior::Ok),
            ("cluster_b", Behavior::Status(503)),
        ],
        cases: vec![
            case("routes to the cheapest destination", "GET", "/v1/models"),
            case("a client-chosen destination is overridden", "GET", "/")
                .header("x-ace-destination", "cluster_a"),
            case(
                "a POST body reaches the upstream unchanged",
                "POST",
                "/v1/chat",
            )
            .header("content-type", "application/json")
            .body(r#"{"model":"m","messages":[]}"#),
        ],
    });
}

#[test]
fn header_rewrite_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-header-rewrite"),
        configuration: "differential",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![(
            "backend",
            Behavior::Respond {
                status: 200,
                headers: vec![
                    ("x-internal-secret".into(), "hunter2".into()),
                    ("content-type".into(), "text/plain".into()),
                ],
                body: b"hello".to_vec(),
            },
        )],
        cases: vec![
            case("an /old/ path is rewritten", "GET", "/old/a/b?x=1").header("x-debug", "yes"),
            case("other paths are left alone", "GET", "/keep/me").header("x-other", "1"),
            // Envoy's setCopy removes the header and appends it again.
            case("a replaced header moves to the end", "GET", "/old/c")
                .header("x-rewritten-by", "client")
                .header("x-after", "1")
                .ordered(),
            case("a POST body passes untouched", "POST", "/old/form")
                .header("content-type", "text/plain")
                .body("a=1&b=2"),
        ],
    });
}

#[test]
fn local_auth_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-local-auth"),
        configuration: "s3cret",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![
            case("no credential gets the local 401", "GET", "/private"),
            case("a wrong credential gets the local 401", "POST", "/private")
                .header("authorization", "Bearer nope")
                .body("payload"),
            case(
                "the right credential goes upstream without it",
                "GET",
                "/private",
            )
            .header("authorization", "Bearer s3cret"),
            // A gRPC client gets the same refusal as a trailers-only gRPC
            // response (Envoy maps 401 to grpc-status 16).
            case(
                "a gRPC request without a credential",
                "POST",
                "/pkg.Svc/Call",
            )
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body("\0\0\0\0\0")
            .h2(),
            case(
                "a gRPC request with the credential goes upstream",
                "POST",
                "/pkg.Svc/Call",
            )
            .header("content-type", "application/grpc")
            .header("authorization", "Bearer s3cret")
            .body("\0\0\0\0\0")
            .h2(),
        ],
    });
}

#[test]
fn http_callout_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-http-callout"),
        configuration: "authz",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![
            ("backend", Behavior::Ok),
            (
                "authz",
                Behavior::Respond {
                    status: 200,
                    headers: vec![("content-type".into(), "text/plain".into())],
                    body: b"ann@corp".to_vec(),
                },
            ),
        ],
        cases: vec![
            case("an allowed callout resumes the request", "GET", "/x").header("x-user", "ann")
        ],
    });
}

#[test]
fn http_callout_denials_match_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-http-callout"),
        configuration: "authz",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok), ("authz", Behavior::Status(401))],
        cases: vec![
            case("a denied callout becomes a local 403", "GET", "/x").header("x-user", "eve")
        ],
    });
}

#[test]
fn http_callout_to_an_unknown_cluster_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-http-callout"),
        configuration: "no-such-cluster",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![case(
            "dispatch to an unknown cluster fails locally",
            "GET",
            "/",
        )],
    });
}

#[test]
fn http_callout_then_a_failing_backend_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-http-callout"),
        configuration: "authz",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![
            ("backend", Behavior::Status(500)),
            ("authz", Behavior::Status(200)),
        ],
        cases: vec![
            case("the backend's 500 reaches the client", "GET", "/x").header("x-user", "ann")
        ],
    });
}

#[test]
fn body_rewrite_matches_envoy() {
    differential(Group {
        package: Guest::Package("ace-example-body-rewrite"),
        configuration: "upstream",
        cluster_header: None,
        allow_stop_iteration: true,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![
            case(
                "the request body is counted before routing",
                "POST",
                "/count",
            )
            .header("content-type", "text/plain")
            .body("hello, buffered world"),
            case("a bodyless request and a rewritten response", "GET", "/"),
        ],
    });
}

#[test]
fn body_pause_without_the_knob_hangs_like_envoy() {
    // Without allow_on_headers_stop_iteration a headers Pause stops
    // everything: the body callbacks never come and the client times out.
    differential(Group {
        package: Guest::Package("ace-example-body-rewrite"),
        configuration: "upstream",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![case("a body never reaches the filter", "POST", "/count").body("held")],
    });
}

/// Traps in `on_request_headers`, as a panicking SDK filter does.
const TRAPPING: &str = r#"(module
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable))"#;

#[test]
fn a_trapping_filter_fails_closed_like_envoy() {
    differential(Group {
        package: Guest::Wat("trapping", TRAPPING),
        configuration: "",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![
            case("the trapping request gets a 503", "GET", "/"),
            case("so does the next one: the VM is gone", "GET", "/"),
        ],
    });
}

/// Copies Envoy attributes into headers `p-*` (or `!<status>` when the
/// attribute is not there): the request-header ones into the request (the
/// upstream sees them), all of them into the response (the client sees
/// them), so both phases are compared.
const PROPERTIES: &str = r#"(module
    (import "env" "proxy_get_property" (func $prop (param i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (data (i32.const 1024) "p-path")
    (data (i32.const 1056) "request\00path")
    (data (i32.const 1104) "p-url-path")
    (data (i32.const 1136) "request\00url_path")
    (data (i32.const 1184) "p-query")
    (data (i32.const 1216) "request\00query")
    (data (i32.const 1264) "p-host")
    (data (i32.const 1296) "request\00host")
    (data (i32.const 1344) "p-method")
    (data (i32.const 1376) "request\00method")
    (data (i32.const 1424) "p-scheme")
    (data (i32.const 1456) "request\00scheme")
    (data (i32.const 1504) "p-protocol")
    (data (i32.const 1536) "request\00protocol")
    (data (i32.const 1584) "p-useragent")
    (data (i32.const 1616) "request\00useragent")
    (data (i32.const 1664) "p-plugin-name")
    (data (i32.const 1696) "plugin_name")
    (data (i32.const 1744) "p-root-id")
    (data (i32.const 1776) "plugin_root_id")
    (data (i32.const 1824) "p-vm-id")
    (data (i32.const 1856) "plugin_vm_id")
    (data (i32.const 1904) "p-cluster")
    (data (i32.const 1936) "xds\00cluster_name")
    (data (i32.const 1984) "p-route")
    (data (i32.const 2016) "xds\00route_name")
    (data (i32.const 2064) "p-vhost")
    (data (i32.const 2096) "xds\00virtual_host_name")
    (data (i32.const 2144) "p-details")
    (data (i32.const 2176) "response\00code_details")
    (data (i32.const 2224) "p-unknown")
    (data (i32.const 2256) "no_such_attribute")
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    (func $copy (param $map i32) (param $h i32) (param $hl i32) (param $p i32) (param $pl i32) (local $st i32)
        (local.set $st (call $prop (local.get $p) (local.get $pl) (i32.const 300) (i32.const 304)))
        (if (i32.eqz (local.get $st))
            (then (drop (call $add (local.get $map) (local.get $h) (local.get $hl)
                (i32.load (i32.const 300)) (i32.load (i32.const 304)))))
            (else
                (i32.store8 (i32.const 400) (i32.const 33))
                (i32.store8 (i32.const 401) (i32.add (i32.const 48) (local.get $st)))
                (drop (call $add (local.get $map) (local.get $h) (local.get $hl) (i32.const 400) (i32.const 2))))))
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (call $copy (i32.const 0) (i32.const 1024) (i32.const 6) (i32.const 1056) (i32.const 12))
        (call $copy (i32.const 0) (i32.const 1104) (i32.const 10) (i32.const 1136) (i32.const 16))
        (call $copy (i32.const 0) (i32.const 1184) (i32.const 7) (i32.const 1216) (i32.const 13))
        (call $copy (i32.const 0) (i32.const 1264) (i32.const 6) (i32.const 1296) (i32.const 12))
        (call $copy (i32.const 0) (i32.const 1344) (i32.const 8) (i32.const 1376) (i32.const 14))
        (call $copy (i32.const 0) (i32.const 1424) (i32.const 8) (i32.const 1456) (i32.const 14))
        i32.const 0)
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
        (call $copy (i32.const 2) (i32.const 1024) (i32.const 6) (i32.const 1056) (i32.const 12))
        (call $copy (i32.const 2) (i32.const 1104) (i32.const 10) (i32.const 1136) (i32.const 16))
        (call $copy (i32.const 2) (i32.const 1184) (i32.const 7) (i32.const 1216) (i32.const 13))
        (call $copy (i32.const 2) (i32.const 1264) (i32.const 6) (i32.const 1296) (i32.const 12))
        (call $copy (i32.const 2) (i32.const 1344) (i32.const 8) (i32.const 1376) (i32.const 14))
        (call $copy (i32.const 2) (i32.const 1424) (i32.const 8) (i32.const 1456) (i32.const 14))
        (call $copy (i32.const 2) (i32.const 1504) (i32.const 10) (i32.const 1536) (i32.const 16))
        (call $copy (i32.const 2) (i32.const 1584) (i32.const 11) (i32.const 1616) (i32.const 17))
        (call $copy (i32.const 2) (i32.const 1664) (i32.const 13) (i32.const 1696) (i32.const 11))
        (call $copy (i32.const 2) (i32.const 1744) (i32.const 9) (i32.const 1776) (i32.const 14))
        (call $copy (i32.const 2) (i32.const 1824) (i32.const 7) (i32.const 1856) (i32.const 12))
        (call $copy (i32.const 2) (i32.const 1904) (i32.const 9) (i32.const 1936) (i32.const 16))
        (call $copy (i32.const 2) (i32.const 1984) (i32.const 7) (i32.const 2016) (i32.const 14))
        (call $copy (i32.const 2) (i32.const 2064) (i32.const 7) (i32.const 2096) (i32.const 21))
        (call $copy (i32.const 2) (i32.const 2144) (i32.const 9) (i32.const 2176) (i32.const 21))
        (call $copy (i32.const 2) (i32.const 2224) (i32.const 9) (i32.const 2256) (i32.const 17))
        i32.const 0))"#;

#[test]
fn properties_match_envoy() {
    differential(Group {
        package: Guest::Wat("properties", PROPERTIES),
        configuration: "",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![case("attributes a filter reads", "GET", "/p/a?q=1&r=2")],
    });
}

/// Reports, as headers `s-<call>: <status>`, the status Envoy gives for
/// host calls a filter gets wrong easily: header maps outside their phase,
/// bodies and configuration outside their callbacks, shared data and queues
/// that do not exist, a stale CAS, bad metrics, unknown foreign functions,
/// malformed callouts. Request-phase results go upstream (`r-*`), the rest
/// to the client.
const STATUSES: &str = r#"(module
    (import "env" "proxy_get_header_map_value" (func $get (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_replace_header_map_value" (func $rep (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_remove_header_map_value" (func $rm (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_header_map_pairs" (func $pairs (param i32 i32 i32) (result i32)))
    (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_property" (func $setprop (param i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_get_shared_data" (func $sget (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_set_shared_data" (func $sset (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_resolve_shared_queue" (func $resolve (param i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_dequeue_shared_queue" (func $deq (param i32 i32 i32) (result i32)))
    (import "env" "proxy_enqueue_shared_queue" (func $enq (param i32 i32 i32) (result i32)))
    (import "env" "proxy_define_metric" (func $def (param i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_increment_metric" (func $inc (param i32 i64) (result i32)))
    (import "env" "proxy_record_metric" (func $rec (param i32 i64) (result i32)))
    (import "env" "proxy_get_metric" (func $getm (param i32 i32) (result i32)))
    (import "env" "proxy_call_foreign_function" (func $ff (param i32 i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_http_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
    (import "env" "proxy_continue_stream" (func $cont (param i32) (result i32)))
    (import "env" "proxy_set_effective_context" (func $eff (param i32) (result i32)))
    (data (i32.const 0) ":path")
    (data (i32.const 8) "x-new")
    (data (i32.const 16) "v")
    (data (i32.const 24) "x-absent")
    (data (i32.const 40) "no_such_function")
    (data (i32.const 64) "clear_route_cache")
    (data (i32.const 88) "backend")
    (data (i32.const 96) "status-probe-key")
    (data (i32.const 120) "nope")
    (data (i32.const 128) "probe_counter")
    (data (i32.const 144) "probe_histogram")
    (data (i32.const 160) "probe_gauge")
    ;; header names, 8 bytes apart from 1024: r-get r-add r-missing
    (data (i32.const 1024) "r-get")
    (data (i32.const 1032) "r-add")
    (data (i32.const 1040) "r-miss")
    (data (i32.const 1048) "r-rm")
    (data (i32.const 1056) "r-rmabs")
    (data (i32.const 1064) "r-cfg")
    (data (i32.const 1072) "r-body")
    (data (i32.const 1080) "r-prop")
    (data (i32.const 1088) "s-get")
    (data (i32.const 1096) "s-add")
    (data (i32.const 1104) "s-rep")
    (data (i32.const 1112) "s-rm")
    (data (i32.const 1120) "s-pairs")
    (data (i32.const 1128) "s-plen")
    (data (i32.const 1136) "s-rtget")
    (data (i32.const 1144) "s-body")
    (data (i32.const 1152) "s-cfg")
    (data (i32.const 1160) "s-vmcfg")
    (data (i32.const 1168) "s-sget")
    (data (i32.const 1176) "s-sset1")
    (data (i32.const 1184) "s-sset2")
    (data (i32.const 1192) "s-resol")
    (data (i32.const 1200) "s-deq")
    (data (i32.const 1208) "s-enq")
    (data (i32.const 1216) "s-inc0")
    (data (i32.const 1224) "s-inc1")
    (data (i32.const 1232) "s-gdec")
    (data (i32.const 1240) "s-hget")
    (data (i32.const 1248) "s-mbad")
    (data (i32.const 1256) "s-ffno")
    (data (i32.const 1264) "s-ffcrc")
    (data (i32.const 1272) "s-call")
    (data (i32.const 1280) "s-cont")
    (data (i32.const 1288) "s-eff")
    (data (i32.const 1296) "s-incb")
    (data (i32.const 1304) "s-recb")
    (data (i32.const 1312) "s-incu")
    (data (i32.const 1320) "s-getu")
    (data (i32.const 1328) "s-rech")
    (data (i32.const 1336) "s-inch")
    ;; ABI_AND_ALLOCATOR
    (func (export "proxy_on_context_create") (param i32 i32))
    (func (export "proxy_on_vm_start") (param i32 i32) (result i32) i32.const 1)
    (func (export "proxy_on_configure") (param i32 i32) (result i32) i32.const 1)
    ;; adds header (name at $n, length $l) = decimal $st to map $map
    (func $put (param $map i32) (param $n i32) (param $l i32) (param $st i32)
        (i32.store8 (i32.const 500) (i32.add (i32.const 48) (i32.div_u (local.get $st) (i32.const 10))))
        (i32.store8 (i32.const 501) (i32.add (i32.const 48) (i32.rem_u (local.get $st) (i32.const 10))))
        (drop (call $add (local.get $map) (local.get $n) (local.get $l) (i32.const 500) (i32.const 2))))
    (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
        (call $put (i32.const 0) (i32.const 1024) (i32.const 5)
            (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 0) (i32.const 1032) (i32.const 5)
            (call $add (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        (call $put (i32.const 0) (i32.const 1040) (i32.const 6)
            (call $get (i32.const 0) (i32.const 24) (i32.const 8) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 0) (i32.const 1048) (i32.const 4)
            (call $rm (i32.const 0) (i32.const 8) (i32.const 5)))
        (call $put (i32.const 0) (i32.const 1056) (i32.const 7)
            (call $rm (i32.const 0) (i32.const 24) (i32.const 8)))
        (call $put (i32.const 0) (i32.const 1064) (i32.const 5)
            (call $buf (i32.const 7) (i32.const 0) (i32.const 10) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 0) (i32.const 1072) (i32.const 6)
            (call $buf (i32.const 0) (i32.const 0) (i32.const 10) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 0) (i32.const 1080) (i32.const 6)
            (call $setprop (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        i32.const 0)
    (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (local $id i32)
        ;; request maps after the request went on
        (call $put (i32.const 2) (i32.const 1088) (i32.const 5)
            (call $get (i32.const 0) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1096) (i32.const 5)
            (call $add (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        (call $put (i32.const 2) (i32.const 1104) (i32.const 5)
            (call $rep (i32.const 0) (i32.const 8) (i32.const 5) (i32.const 16) (i32.const 1)))
        (call $put (i32.const 2) (i32.const 1112) (i32.const 4)
            (call $rm (i32.const 0) (i32.const 8) (i32.const 5)))
        (i32.store (i32.const 304) (i32.const 77))
        (call $put (i32.const 2) (i32.const 1120) (i32.const 7)
            (call $pairs (i32.const 0) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1128) (i32.const 6) (i32.load (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1136) (i32.const 7)
            (call $get (i32.const 1) (i32.const 0) (i32.const 5) (i32.const 300) (i32.const 304)))
        ;; buffers outside their callbacks
        (call $put (i32.const 2) (i32.const 1144) (i32.const 6)
            (call $buf (i32.const 0) (i32.const 0) (i32.const 10) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1152) (i32.const 5)
            (call $buf (i32.const 7) (i32.const 0) (i32.const 10) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1160) (i32.const 7)
            (call $buf (i32.const 6) (i32.const 0) (i32.const 10) (i32.const 300) (i32.const 304)))
        ;; shared data: missing key; CAS on a new key; the same CAS again is stale
        (call $put (i32.const 2) (i32.const 1168) (i32.const 6)
            (call $sget (i32.const 120) (i32.const 4) (i32.const 300) (i32.const 304) (i32.const 308)))
        (call $put (i32.const 2) (i32.const 1176) (i32.const 7)
            (call $sset (i32.const 96) (i32.const 16) (i32.const 16) (i32.const 1) (i32.const 12345)))
        (call $put (i32.const 2) (i32.const 1184) (i32.const 7)
            (call $sset (i32.const 96) (i32.const 16) (i32.const 16) (i32.const 1) (i32.const 12345)))
        ;; queues that do not exist
        (call $put (i32.const 2) (i32.const 1192) (i32.const 7)
            (call $resolve (i32.const 120) (i32.const 0) (i32.const 120) (i32.const 4) (i32.const 300)))
        (call $put (i32.const 2) (i32.const 1200) (i32.const 5)
            (call $deq (i32.const 999) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1208) (i32.const 5)
            (call $enq (i32.const 999) (i32.const 16) (i32.const 1)))
        ;; metrics: counter +0 and +1, gauge -1, histogram read, unknown id
        (drop (call $def (i32.const 0) (i32.const 128) (i32.const 13) (i32.const 300)))
        (local.set $id (i32.load (i32.const 300)))
        (call $put (i32.const 2) (i32.const 1216) (i32.const 6) (call $inc (local.get $id) (i64.const 0)))
        (call $put (i32.const 2) (i32.const 1224) (i32.const 6) (call $inc (local.get $id) (i64.const 1)))
        (drop (call $def (i32.const 1) (i32.const 160) (i32.const 11) (i32.const 300)))
        (call $put (i32.const 2) (i32.const 1232) (i32.const 6)
            (call $inc (i32.load (i32.const 300)) (i64.const -1)))
        (drop (call $def (i32.const 2) (i32.const 144) (i32.const 15) (i32.const 300)))
        (drop (call $rec (i32.load (i32.const 300)) (i64.const 5)))
        (call $put (i32.const 2) (i32.const 1240) (i32.const 6)
            (call $getm (i32.load (i32.const 300)) (i32.const 400)))
        (call $put (i32.const 2) (i32.const 1248) (i32.const 6)
            (call $getm (i32.const 99999) (i32.const 400)))
        ;; ids Envoy never issued: type bits 3, then counter bits
        (call $put (i32.const 2) (i32.const 1296) (i32.const 6) (call $inc (i32.const 99999) (i64.const 1)))
        (call $put (i32.const 2) (i32.const 1304) (i32.const 6) (call $rec (i32.const 99999) (i64.const 1)))
        (call $put (i32.const 2) (i32.const 1312) (i32.const 6) (call $inc (i32.const 40000) (i64.const 1)))
        (call $put (i32.const 2) (i32.const 1320) (i32.const 6) (call $getm (i32.const 40000) (i32.const 400)))
        ;; a histogram: record works, increment does not
        (call $put (i32.const 2) (i32.const 1328) (i32.const 6) (call $rec (i32.load (i32.const 300)) (i64.const 7)))
        (call $put (i32.const 2) (i32.const 1336) (i32.const 6) (call $inc (i32.load (i32.const 300)) (i64.const 7)))
        ;; foreign functions
        (call $put (i32.const 2) (i32.const 1256) (i32.const 6)
            (call $ff (i32.const 40) (i32.const 16) (i32.const 0) (i32.const 0) (i32.const 300) (i32.const 304)))
        (call $put (i32.const 2) (i32.const 1264) (i32.const 7)
            (call $ff (i32.const 64) (i32.const 17) (i32.const 0) (i32.const 0) (i32.const 300) (i32.const 304)))
        ;; a callout without :path/:method/:authority
        (call $put (i32.const 2) (i32.const 1272) (i32.const 6)
            (call $call (i32.const 88) (i32.const 7) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)
                (i32.const 0) (i32.const 0) (i32.const 1000) (i32.const 300)))
        ;; an unknown stream type; an unknown context
        (call $put (i32.const 2) (i32.const 1280) (i32.const 6) (call $cont (i32.const 7)))
        (call $put (i32.const 2) (i32.const 1288) (i32.const 5) (call $eff (i32.const 424242)))
        i32.const 0))"#;

#[test]
fn host_call_statuses_match_envoy() {
    differential(Group {
        package: Guest::Wat("statuses", STATUSES),
        configuration: "cfg",
        cluster_header: None,
        allow_stop_iteration: false,
        clusters: vec![("backend", Behavior::Ok)],
        cases: vec![case(
            "statuses of host calls in and out of phase",
            "GET",
            "/s",
        )],
    });
}

/// An upstream answering with a chunked body and a trailer.
fn trailing_upstream() -> Behavior {
    Behavior::RespondWithTrailers {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        body: b"hello".to_vec(),
        trailers: vec![("x-up-trailer".into(), "t1".into())],
    }
}

/// A group of the callback-log filter in `mode` against an upstream whose
/// response has trailers.
fn callback_log(mode: &'static str, allow_stop_iteration: bool, cases: Vec<Case>) -> Group {
    Group {
        package: Guest::Package("ace-example-callback-log"),
        configuration: mode,
        cluster_header: None,
        allow_stop_iteration,
        clusters: vec![("backend", trailing_upstream())],
        cases,
    }
}

/// An HTTP/2 POST with a body and a trailer.
fn body_and_trailers() -> Case {
    case("a body and trailers", "POST", "/t")
        .body("hello")
        .trailer("x-client-trailer", "c1")
}

#[test]
fn trailers_after_a_headers_pause_match_envoy() {
    // A filter that reads the body (a headers Pause, then a body Pause until
    // the end of the stream) still gets the trailers of an HTTP/2 request,
    // and their Continue releases the held request: headers (with what the
    // filter wrote meanwhile), body and trailers reach the upstream. The same
    // on the response path.
    differential(callback_log(
        "pause",
        true,
        vec![
            body_and_trailers(),
            case("trailers without a body", "POST", "/t").trailer("x-client-trailer", "c1"),
            case("a body without trailers", "POST", "/t")
                .body("hello")
                .h2(),
            case("no body", "GET", "/t").h2(),
        ],
    ));
}

#[test]
fn trailers_after_a_body_continue_match_envoy() {
    // A body Continue releases a headers Pause (the response headers leave
    // then: a later write does not reach the client); the trailers still
    // come, and the header maps stay writable (Envoy keeps them for the
    // filter unless a headers callback itself returns Continue). The request
    // headers reach the upstream as they stand when the router encodes them:
    // on a fresh upstream connection (opened asynchronously, as here) that
    // is after the trailers callback, which is what the host sends.
    differential(callback_log("headers", true, vec![body_and_trailers()]));
}

#[test]
fn trailers_then_a_resume_match_envoy() {
    // The trailers let through with resume_http_request (and _response) and
    // a Pause: headers, buffered body and trailers go on. (A resume from the
    // last body callback instead loses that chunk in Envoy: the upstream
    // gets `content-length: 0` and no body. The host does not emulate
    // that; see the README.)
    differential(callback_log("resume", true, vec![body_and_trailers()]));
}

#[test]
fn trailers_without_a_pause_match_envoy() {
    // Nothing held: the header maps are gone by the trailers callbacks.
    differential(callback_log("continue", false, vec![body_and_trailers()]));
}

#[test]
fn trailers_after_a_stop_all_pause_hang_like_envoy() {
    // Without allow_on_headers_stop_iteration a headers Pause stops
    // everything: neither the body nor the trailers reach the filter, and
    // the client waits.
    differential(callback_log("pause", false, vec![body_and_trailers()]));
}
