//! The attribute extractor on arbitrary header values: every request maps to
//! value indices inside each attribute's domain (or unknown), or is refused
//! naming an attribute; never a panic.
#![no_main]
#![forbid(unsafe_code)]
use ace_core::tables::{
    encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec, Tables,
};
use ace_flow::attributes::{no_trusted, resolve, AttributeError};
use ace_config::Config;
use ace_flow::headers::Pairs;
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
                    "tables_base64":"{b64}","on_missing_attribute":"{mode}","body":{{"read":true}}}}"#
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
    // Fields split on 0xff: three header values (raw bytes, not always
    // UTF-8, as on the wire), a body model, then a second value for the
    // first attribute's header (repeated headers: the first one counts).
    // Bit 1 of the first byte writes the header names in upper case.
    let upper = data.first().is_some_and(|b| b & 2 != 0);
    let mut parts = data.get(1..).unwrap_or(&[]).split(|b| *b == 0xff);
    let sent: Vec<Option<&[u8]>> = (0..3)
        .map(|_| parts.next().filter(|p| !p.is_empty()))
        .collect();
    let body_model = parts
        .next()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let repeat = parts.next();
    let names: Vec<Vec<u8>> = policy
        .attributes
        .iter()
        .map(|a| {
            let n = a.header.as_bytes().to_vec();
            if upper {
                n.to_ascii_uppercase()
            } else {
                n
            }
        })
        .collect();
    let mut list: Vec<(&[u8], &[u8])> = vec![(b":method", b"POST")];
    for (name, value) in names.iter().zip(&sent) {
        if let Some(v) = value {
            list.push((name, v));
        }
    }
    if let (Some(name), Some(v)) = (names.first(), repeat) {
        list.push((name, v));
    }
    let headers = Pairs::encode(list);
    // The first attribute's header sent again with another value: refused.
    let conflict = match (sent.first().copied().flatten(), repeat) {
        (Some(first), Some(again)) => first.trim_ascii() != again.trim_ascii(),
        _ => false,
    };
    // The oracle: one lookup per attribute.
    let expected: Option<Vec<u32>> = policy
        .attributes
        .iter()
        .enumerate()
        .map(|(i, a)| match headers.get(&a.header) {
            Some(v) => Some(tables.value_index_bytes(i as u32, v.trim_ascii())),
            None => match body_model.as_deref().filter(|_| a.name == "model") {
                Some(m) => Some(tables.value_index(i as u32, m.trim_ascii())),
                None if reject => None,
                None => Some(a.default_index),
            },
        })
        .collect();
    let mut values = [u32::MAX; 3];
    match resolve(
        &tables,
        policy,
        &headers,
        body_model.as_deref(),
        no_trusted,
        &mut values,
    ) {
        Ok(()) => {
            assert!(!conflict, "a header repeated with another value was accepted");
            assert_eq!(
                Some(values.to_vec()),
                expected,
                "one pass = one lookup per attribute"
            );
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
        Err(AttributeError::Conflicting(a)) => {
            assert!(conflict, "refused a repeat of one value");
            assert_eq!(Some(a), policy.attributes.first());
        }
        Err(AttributeError::Missing(a)) => {
            assert!(!conflict, "a conflict is found before anything is missing");
            assert!(reject && policy.attributes.iter().any(|x| x.name == a.name));
            assert_eq!(expected, None, "refused only when an attribute is missing");
        }
    }
});
