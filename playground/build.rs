//! The page's module gets an 8 MiB stack instead of wasm-ld's 1 MiB.
//!
//! Why: Cedar's parser recurses once per nesting level and chained
//! operator, and on wasm32 its frames live on the module's own stack in
//! linear memory. A policy within `ace_policy::limits` exhausted 1 MiB
//! ("memory access out of bounds"); 8 MiB is a native main thread's room,
//! which those limits are measured against. The memory is reserved in the
//! module's linear memory, not allocated per call.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg=-zstack-size=8388608");
    }
}
