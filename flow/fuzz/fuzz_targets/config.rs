//! The plugin configuration on arbitrary bytes, parsed and built as a host
//! does when one arrives (schema, tables, model routing, cache): a setup or
//! an error naming a field; never a panic.
#![no_main]
#![forbid(unsafe_code)]
use ace_flow::Setup;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = Setup::parse(data) {
        assert!(!e.field.is_empty());
    }
});
