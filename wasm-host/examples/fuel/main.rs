//! Wasm instructions (fuel) per request for a filter build: a
//! load-independent cost, for comparing builds (e.g. opt-levels) and
//! commits.
//!
//! ```sh
//! cargo run --release -p ace-wasm-host --example fuel -- FILTER.wasm CONFIG.json [REQUESTS]
//! ```
//! Each request: request headers (POST, JSON), response headers (200), a
//! small JSON body with usage, then the stream's end; the first request is
//! excluded (one-time work). Prints the total and its split by phase, in
//! Wasm instructions and in host calls (inside Envoy the calls dominate).
//!
//! `ACE_FUEL_BODY` sends that request body after the headers (its own
//! phase), as a configuration that reads bodies needs; `content-length`
//! follows it.
//!
//! `ACE_FUEL_HEADERS` sets or adds request headers (or removes them, given
//! no value), as `name=value` pairs separated by commas, e.g. attribute values that the configuration's
//! policy tables know (the defaults name a tenant and a model that the
//! example fleet does not have):
//!
//! ```sh
//! cargo run --release -p ace-cli -- plugin-config policies > /tmp/fleet.json
//! ACE_FUEL_HEADERS=x-ace-tenant=globex,x-ace-model=llama-3.1-70b,x-ace-tp-degree=1 \
//!     cargo run --release -p ace-wasm-host --example fuel -- FILTER.wasm /tmp/fleet.json
//! ```
//!
//! To see where the instructions go, build the filter unstripped (for
//! the function names) and set `ACE_FUEL_PROFILE=ROWS`: the module is
//! instrumented with a counter per function (see `profile.rs`), and the
//! ROWS costliest functions are listed with their instructions, the bytes
//! their `memory.copy` and `memory.fill` move (wasmtime charges a unit of
//! fuel per byte) and their calls, per request (the counts are exact; the
//! total comes out a little below the uninstrumented fuel figure; the
//! phase figures printed then include the counters). `ACE_FUEL_PICK=TEXT`
//! adds, for each function whose name contains TEXT, its code in
//! straight-line runs, each with how often it ran. Comparing two builds
//! function by function is how the one request flow's fuel was brought
//! back under the old tree's (issue 17):
//!
//! ```sh
//! CARGO_PROFILE_WASM_STRIP=false ACE_WASM_TARGET_DIR=target/wasm-named scripts/build-wasm.sh
//! ACE_FUEL_PROFILE=40 cargo run --release -p ace-wasm-host --example fuel -- \
//!     target/wasm-named/wasm32-wasip1/wasm/ace_filter.wasm CONFIG
//! ```
//!
//! Or sample it with perf (wasmtime writes a perf map of the JIT code):
//!
//! ```sh
//! CARGO_PROFILE_WASM_STRIP=false ACE_WASM_TARGET_DIR=target/wasm-named scripts/build-wasm.sh
//! ACE_PERFMAP=1 perf record -e cpu-clock -F 20000 -o /tmp/ace.perf -- \
//!     target/release/examples/fuel target/wasm-named/wasm32-wasip1/wasm/ace_filter.wasm CONFIG 200000
//! perf report -i /tmp/ace.perf --no-children --sort symbol
//! ```

mod profile;

use ace_wasm_host::{FilterModule, Headers, Vm};

type Error = Box<dyn std::error::Error>;

const PHASES: [&str; 5] = [
    "request headers",
    "request body",
    "response headers",
    "response body",
    "log + done + delete",
];

/// Fuel and host calls so far.
fn mark(vm: &Vm) -> [u64; 2] {
    [vm.fuel_consumed(), vm.host_calls()]
}

/// One request; adds each phase's (fuel, host calls) to `phases` and
/// returns what became of it (the destination, or the filter's refusal).
fn one(
    vm: &mut Vm,
    extra: &[(String, String)],
    body: Option<&str>,
    phases: &mut [[u64; 2]; 5],
) -> Result<String, Error> {
    let t0 = mark(vm);
    let mut s = vm.http_stream()?;
    let mut headers: Headers = [
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        ("content-type", "application/json"),
        ("content-length", "120"),
        ("x-request-id", "2f1c9a54-0d7e-4c36-9d55-6f0b8e8a1c11"),
        ("x-ace-tenant", "acme"),
        ("x-ace-data-class", "public"),
        ("x-ace-latency-class", "interactive"),
        ("x-ace-model", "llama-3-70b"),
    ]
    .into_iter()
    .collect();
    for (name, value) in extra {
        if value.is_empty() {
            headers.remove(name);
        } else {
            headers.set(name, value);
        }
    }
    if let Some(b) = body {
        headers.set("content-length", b.len().to_string());
    }
    s.send_request_headers(headers, body.is_none())?;
    let tb = mark(s.vm());
    if let Some(b) = body {
        s.send_request_body(b, true)?;
    }
    let outcome = match (
        s.local_response(),
        s.request_headers().get("x-ace-destination"),
    ) {
        (Some(r), _) => format!(
            "refused with {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        ),
        (None, Some(d)) => format!("routed to cluster {d}"),
        (None, None) => "neither routed nor refused".to_string(),
    };
    let t1 = mark(s.vm());
    s.send_response_headers(
        [(":status", "200"), ("content-type", "application/json")],
        false,
    )?;
    let t2 = mark(s.vm());
    s.send_response_body(
        br#"{"usage":{"prompt_tokens":30,"completion_tokens":12}}"#,
        true,
    )?;
    let t3 = mark(s.vm());
    s.finish()?;
    let t4 = mark(vm);
    for (p, (a, b)) in phases
        .iter_mut()
        .zip([(t0, tb), (tb, t1), (t1, t2), (t2, t3), (t3, t4)])
    {
        p[0] += b[0] - a[0];
        p[1] += b[1] - a[1];
    }
    Ok(outcome)
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(wasm), Some(config)) = (args.get(1), args.get(2)) else {
        return Err("usage: fuel FILTER.wasm CONFIG.json [REQUESTS]".into());
    };
    let n: u64 = args.get(3).map_or(Ok(100), |s| s.parse())?;
    let mut engine_config = ace_wasm_host::wasmtime::Config::new();
    engine_config.consume_fuel(true);
    if std::env::var_os("ACE_PERFMAP").is_some() {
        engine_config.profiler(ace_wasm_host::wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = ace_wasm_host::wasmtime::Engine::new(&engine_config)?;
    let mut bytes = std::fs::read(wasm)?;
    let mut profile = match std::env::var("ACE_FUEL_PROFILE") {
        Ok(rows) => {
            let pick = std::env::var("ACE_FUEL_PICK").ok();
            let (instrumented, p) = profile::Profile::instrument(&bytes, rows.parse()?, pick)?;
            bytes = instrumented;
            Some(p)
        }
        Err(_) => None,
    };
    let module = FilterModule::with_engine(&engine, &bytes)?;
    let config = std::fs::read_to_string(config)?;
    let mut vm = Vm::builder(&module)
        .configuration(config)
        .fuel_per_callback(100_000_000)
        .count_host_calls()
        .start()?;
    let extra: Vec<(String, String)> = match std::env::var("ACE_FUEL_HEADERS") {
        Ok(list) => list
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                    .ok_or_else(|| {
                        format!("ACE_FUEL_HEADERS: `{p}` is not `name=value` (pairs are separated by commas)")
                    })
            })
            .collect::<Result<_, _>>()?,
        Err(_) => Vec::new(),
    };
    let body = std::env::var("ACE_FUEL_BODY").ok();
    let body = body.as_deref();
    let mut phases = [[0u64; 2]; 5];
    let first = one(&mut vm, &extra, body, &mut phases)?;
    phases = [[0; 2]; 5];
    if let Some(p) = profile.as_mut() {
        p.start(&mut vm);
    }
    let mut last = first.clone();
    for _ in 0..n {
        last = one(&mut vm, &extra, body, &mut phases)?;
    }
    println!("first request {first}; last {last}");
    let fuel: u64 = phases.iter().map(|p| p[0]).sum::<u64>() / n;
    let calls: u64 = phases.iter().map(|p| p[1]).sum::<u64>();
    println!(
        "{wasm}: {fuel} Wasm instructions and {:.1} host calls per request ({} bytes)",
        calls as f64 / n as f64,
        std::fs::metadata(wasm)?.len()
    );
    for (name, [f, c]) in PHASES.iter().zip(phases) {
        println!(
            "  {name:<20} {:>7} instructions {:>5.1} host calls",
            f / n,
            c as f64 / n as f64
        );
    }
    if let Some(profile) = profile {
        profile.report(&mut vm, n)?;
    }
    Ok(())
}
