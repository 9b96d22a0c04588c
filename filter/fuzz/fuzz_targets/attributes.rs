//! The attribute extractor on arbitrary header values: every request maps to
//! value indices inside each attribute's domain (or unknown), or is refused
//! naming an attribute; never a panic.
#![no_main]
use ace_core::tables::{
    encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec, Tables,
};
use ace_filter::attributes::resolve;
use ace_filter::config::Config;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn config(reject: bool) -> &'static Config {
    static C: OnceLock<[Config; 2]> = OnceLock::new();
    let both = C.get_or_init(|| {
        let spec = TableSpec {
            destinations: vec![
                DestinationSpec {
                    name: "eu".into(),
                    cluster: "eu".into(),
                },
                DestinationSpec {
                    name: "us".into(),
                    cluster: "us".into(),
                },
            ],
            attributes: vec![
                AttributeSpec {
                    name: "data_class".into(),
                    values: vec!["personal_eu".into(), "public".into()],
                },
                AttributeSpec {
                    name: "model".into(),
                    values: vec!["a".into(), "b".into(), "c".into()],
                },
                AttributeSpec {
                    name: "tenant".into(),
                    values: vec!["t1".into()],
                },
            ],
            factors: vec![
                FactorSpec {
                    kind: FactorKind::Permit,
                    attributes: vec![1],
                    rows: vec![0, 3, 1, 2],
                },
                FactorSpec {
                    kind: FactorKind::Forbid,
                    attributes: vec![0],
                    rows: vec![3, 2, 0],
                },
            ],
        };
        let bytes = encode(&spec).expect("fixture encodes");
        let b64 = base64_encode(&bytes);
        let make = |mode: &str| {
            let json = format!(
                r#"{{"destinations":[{{"name":"eu","cluster":"eu"}},{{"name":"us","cluster":"us"}}],
                    "tables_base64":"{b64}","on_missing_attribute":"{mode}"}}"#
            );
            Config::parse(json.as_bytes()).expect("fixture config parses")
        };
        [make("reject"), make("restrict")]
    });
    &both[usize::from(!reject)]
}

fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let reject = data.first().is_some_and(|b| b & 1 == 0);
    let cfg = config(reject);
    let Some(policy) = cfg.policy.as_ref() else {
        return;
    };
    let tables = Tables::load(policy.tables).expect("fixture tables load");
    // Split the input into up to four fields: three header values and a body model.
    let mut parts = data.get(1..).unwrap_or(&[]).split(|b| *b == 0xff);
    // Header values stay raw bytes (not always UTF-8, as on the wire).
    let headers: Vec<Option<&[u8]>> = (0..3)
        .map(|_| parts.next().filter(|p| !p.is_empty()))
        .collect();
    let body_model = parts
        .next()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let mut values = [u32::MAX; 3];
    let header = |i: usize, _: &_| headers.get(i).copied().flatten();
    match resolve(&tables, policy, header, body_model.as_deref(), &mut values) {
        Ok(()) => {
            for (a, v) in values.iter().enumerate() {
                assert!(
                    *v <= tables.value_count(a as u32),
                    "index outside the domain"
                );
            }
            let mut mask = [0u64; 1];
            tables.feasible(&values, &mut mask).expect("lookup works");
            assert_eq!(mask[0] & !0b11, 0, "no bits past the destinations");
        }
        Err(a) => assert!(reject && policy.attributes.iter().any(|x| x.name == a.name)),
    }
});
