//! The header-map reader on arbitrary host buffers: lookups never panic and
//! every pair lies inside the buffer; and pairs encoded the ABI's way read
//! back as themselves.
#![no_main]
#![forbid(unsafe_code)]
use ace_flow::headers::Pairs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = Pairs::from_encoded(data.to_vec());
    let mut bytes = 0usize;
    for (k, v) in p.iter() {
        bytes += k.len() + v.len() + 2 + 8;
    }
    assert!(bytes + 4 <= data.len().max(4), "pairs reach past the buffer");
    let _ = p.find(["x-ace-tenant", ":status", "content-length", "x-request-id"]);
    let _ = p.number::<u64>("content-length");
    let _ = p.get("x-ace-tenant");
    let _ = p.contains("content-type", "json");

    // Round trip: the input cut into name/value pairs at NUL bytes.
    let parts: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    let pairs: Vec<(&[u8], &[u8])> = parts.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    let encoded = Pairs::encode(pairs.iter().copied());
    assert!(encoded.iter().eq(pairs.iter().copied()), "round trip");
    for (k, _) in &pairs {
        let name = String::from_utf8_lossy(k);
        if name.as_bytes() == *k {
            // The first pair with this name (ASCII case-insensitive) wins.
            let first = pairs.iter().find(|(x, _)| x.eq_ignore_ascii_case(k)).map(|(_, v)| *v);
            assert_eq!(encoded.get(&name), first);
        }
    }
});
