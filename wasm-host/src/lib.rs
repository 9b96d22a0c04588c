//! ace-wasm-host: A proxy-wasm ABI 0.2.1 host on wasmtime for testing filters. (being built; see the issue that owns it).
