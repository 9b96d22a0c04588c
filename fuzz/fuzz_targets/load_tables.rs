//! Arbitrary bytes into the table loader: it must return an error or a
//! table whose lookups never panic.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    common::exercise(data);
});
