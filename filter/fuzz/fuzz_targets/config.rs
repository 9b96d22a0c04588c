//! The plugin configuration parser on arbitrary bytes: a configuration or an
//! error naming a field; never a panic.
#![no_main]
#![forbid(unsafe_code)]
use ace_filter::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = Config::parse(data) {
        assert!(!e.field.is_empty());
    }
});
