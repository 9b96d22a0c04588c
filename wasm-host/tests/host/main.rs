//! Filters running on ace-wasm-host, no Envoy needed.
//!
//! One test binary (wasmtime links once); each guest is built and compiled
//! once per binary.

#[path = "../common/mod.rs"]
mod common;

mod ace_filter;
mod ace_filter_props;
mod control;
mod examples;
mod grpc;
mod limits;
mod loading;
mod metadata;
mod rules;
mod shared;
mod trailers;
