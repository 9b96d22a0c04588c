//! The body scanners on arbitrary bytes: the request scanner must return
//! an error or a value, and the usage scanner must stay bounded whatever
//! the chunking, for JSON and for SSE.
#![no_main]
use ace_filter::body::{scan_request, UsageScanner};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = scan_request(data, data.len());
    let _ = scan_request(data, data.len() + 1);
    let split = data.first().map_or(1, |b| usize::from(*b).max(1));
    for sse in [false, true] {
        let mut s = UsageScanner::new(sse, 512);
        for chunk in data.chunks(split) {
            s.feed(chunk);
        }
        let _ = s.finish();
    }
});
