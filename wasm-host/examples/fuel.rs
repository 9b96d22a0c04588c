//! Wasm instructions (fuel) per request for a filter build: a
//! load-independent cost, for comparing builds (e.g. opt-levels) and
//! commits.
//!
//! ```sh
//! cargo run --release -p ace-wasm-host --example fuel -- FILTER.wasm CONFIG.json [REQUESTS]
//! ```
//! Each request: request headers (POST, JSON), response headers (200), a
//! small JSON body with usage, then the stream's end; the first request is
//! excluded (one-time work).

use ace_wasm_host::{FilterModule, Vm};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(wasm), Some(config)) = (args.get(1), args.get(2)) else {
        return Err("usage: fuel FILTER.wasm CONFIG.json [REQUESTS]".into());
    };
    let n: u64 = args.get(3).map_or(Ok(100), |s| s.parse())?;
    let engine = ace_wasm_host::wasmtime::Engine::new(
        ace_wasm_host::wasmtime::Config::new().consume_fuel(true),
    )?;
    let module = FilterModule::with_engine(&engine, &std::fs::read(wasm)?)?;
    let config = std::fs::read_to_string(config)?;
    let mut vm = Vm::builder(&module)
        .configuration(config)
        .fuel_per_callback(100_000_000)
        .start()?;
    let one = |vm: &mut Vm| -> Result<(), Box<dyn std::error::Error>> {
        let mut s = vm.http_stream()?;
        s.send_request_headers(
            [
                (":path", "/v1/chat/completions"),
                (":method", "POST"),
                ("content-type", "application/json"),
                ("content-length", "120"),
            ],
            true,
        )?;
        s.send_response_headers(
            [(":status", "200"), ("content-type", "application/json")],
            false,
        )?;
        s.send_response_body(
            br#"{"usage":{"prompt_tokens":30,"completion_tokens":12}}"#,
            true,
        )?;
        s.finish()?;
        Ok(())
    };
    one(&mut vm)?;
    let before = vm.fuel_consumed();
    for _ in 0..n {
        one(&mut vm)?;
    }
    let per = (vm.fuel_consumed() - before) / n;
    println!(
        "{wasm}: {per} Wasm instructions per request ({} bytes)",
        std::fs::metadata(wasm)?.len()
    );
    Ok(())
}
