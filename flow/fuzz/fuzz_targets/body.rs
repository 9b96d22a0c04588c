//! The body scanners on arbitrary bytes: the request scanner must return
//! an error or a value; the usage scanner must give the same answer
//! whatever the chunking, for JSON and for SSE.
#![no_main]
#![forbid(unsafe_code)]
use ace_flow::body::scan_request;
use ace_flow::usage::UsageScanner;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = scan_request(data, data.len());
    let _ = scan_request(data, data.len() + 1);
    let split = data.first().map_or(1, |b| usize::from(*b).max(1));
    for sse in [false, true] {
        let mut whole = UsageScanner::new(sse);
        whole.feed(data);
        let mut chunked = UsageScanner::new(sse);
        for chunk in data.chunks(split) {
            chunked.feed(chunk);
        }
        assert_eq!(whole.finish(), chunked.finish());
    }
});
