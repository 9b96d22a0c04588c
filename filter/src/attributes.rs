//! Request attributes: from header values (and the body's `model`) to the
//! value indices that the policy tables are keyed by.
//!
//! A pure function, so it can be fuzzed and tested without a host. Values
//! are trimmed; a value the tables do not know maps to the unknown index,
//! which no permit row matches (fail closed). A missing value is refused or
//! replaced by the configured default, per `on_missing_attribute`.

use crate::config::{AttributeSource, OnMissing, Policy};
use crate::headers::Pairs;
use ace_core::tables::Tables;

/// Fill `values` (one slot per table attribute) for one request.
///
/// `headers` is the request's header map; each attribute's value is the
/// first value of its header (`AttributeSource::header`), found in one pass
/// over the pairs however many attributes there are. `body_model` is the
/// body's `model` field, used for an attribute named `model` when its
/// header is absent. ASCII whitespace around a value is ignored; a value
/// that is not UTF-8 is sent but matches nothing: the unknown index.
/// Returns the first attribute that is missing when the policy refuses
/// missing attributes.
pub fn resolve<'p>(
    tables: &Tables<'_>,
    policy: &'p Policy,
    headers: &Pairs,
    body_model: Option<&str>,
    values: &mut [u32],
) -> Result<(), &'p AttributeSource> {
    // Not yet seen: no value index is u32::MAX (tables refuse to load with
    // that many values).
    const UNSET: u32 = u32::MAX;
    let attributes = &policy.attributes;
    values.fill(UNSET);
    let mut unset = attributes.len().min(values.len());
    for (name, value) in headers.iter() {
        if unset == 0 {
            break;
        }
        for (i, (slot, a)) in values.iter_mut().zip(attributes).enumerate() {
            let header = a.header.as_bytes();
            // Envoy hands names over in lower case, as the configuration
            // holds them: an exact comparison (vectorised) settles the
            // match, the byte-by-byte one only a name sent otherwise.
            if *slot == UNSET
                && name.len() == header.len()
                && (name == header || name.eq_ignore_ascii_case(header))
            {
                // Bytes that are not UTF-8 match no value: unknown.
                *slot = tables.value_index_bytes(i as u32, value.trim_ascii());
                unset -= 1;
            }
        }
    }
    for (i, (slot, a)) in values.iter_mut().zip(attributes).enumerate() {
        if *slot != UNSET {
            continue;
        }
        *slot = match body_model.filter(|_| a.name == "model") {
            Some(m) => tables.value_index_bytes(i as u32, m.as_bytes().trim_ascii()),
            None if policy.on_missing == OnMissing::Reject => return Err(a),
            None => a.default_index,
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use ace_core::tables::{
        encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec, UNKNOWN,
    };
    use base64::Engine;

    fn config(on_missing: &str, defaults: &str) -> Config {
        try_config(on_missing, defaults).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_config(on_missing: &str, defaults: &str) -> Result<Config, crate::config::ConfigError> {
        let spec = TableSpec {
            destinations: vec![DestinationSpec {
                name: "a".into(),
                cluster: "a".into(),
            }],
            attributes: vec![
                AttributeSpec {
                    name: "data_class".into(),
                    values: vec!["personal_eu".into(), "public".into()],
                },
                AttributeSpec {
                    name: "model".into(),
                    values: vec!["m1".into()],
                },
            ],
            factors: vec![FactorSpec {
                kind: FactorKind::Permit,
                attributes: vec![],
                rows: vec![1],
            }],
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(encode(&spec).unwrap());
        let json = format!(
            r#"{{"destinations":[{{"name":"a","cluster":"a"}}],"tables_base64":"{b64}",
                "on_missing_attribute":"{on_missing}","attribute_defaults":{defaults}}}"#
        );
        Config::parse(json.as_bytes())
    }

    /// A request's headers: each attribute's header (by position in the
    /// policy) with the value given, if any, among unrelated headers.
    fn sent(p: &Policy, values: &[Option<&[u8]>]) -> Pairs {
        let mut list: Vec<(&[u8], &[u8])> = vec![(b":method", b"POST")];
        for (a, v) in p.attributes.iter().zip(values) {
            if let Some(v) = v {
                list.push((a.header.as_bytes(), v));
            }
        }
        list.push((b"content-type", b"application/json"));
        Pairs::encode(list)
    }

    #[test]
    fn maps_headers_and_the_body_model() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let r = resolve(
            &t,
            p,
            &sent(p, &[Some(b" public "), None]),
            Some("m1"),
            &mut v,
        );
        assert!(r.is_ok());
        assert_eq!(v, [2, 1]);
        let r = resolve(
            &t,
            p,
            &sent(p, &[Some(b"secret"), Some(b"m1")]),
            None,
            &mut v,
        );
        assert!(r.is_ok());
        assert_eq!(v, [UNKNOWN, 1], "unknown values fail closed");
        let r = resolve(&t, p, &sent(p, &[None, Some(b"m1")]), None, &mut v);
        assert_eq!(r.map_err(|a| a.header.as_str()), Err("x-ace-data-class"));
    }

    #[test]
    fn the_first_value_counts_and_names_ignore_case() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let headers = Pairs::encode([
            (&b"X-ACE-Data-Class"[..], &b"personal_eu"[..]),
            (b"x-ace-data-class", b"public"),
            (b"x-ace-model", b"m1"),
        ]);
        assert!(resolve(&t, p, &headers, None, &mut v).is_ok());
        assert_eq!(v, [1, 1], "personal_eu, the first value, not public");
    }

    #[test]
    fn a_value_that_is_not_utf8_is_sent_but_unknown() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let headers = sent(p, &[Some(b"publ\xffic"), Some(b"m1")]);
        let r = resolve(&t, p, &headers, None, &mut v);
        assert!(r.is_ok(), "sent, so not missing");
        assert_eq!(v, [UNKNOWN, 1]);
    }

    #[test]
    fn restrict_uses_the_default_or_unknown() {
        let c = config("restrict", r#"{"data_class":"personal_eu"}"#);
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        assert!(resolve(&t, p, &sent(p, &[None, None]), None, &mut v).is_ok());
        assert_eq!(v, [1, UNKNOWN]);
    }

    #[test]
    fn defaults_outside_the_domain_are_config_errors() {
        let e = try_config("restrict", r#"{"data_class":"nope"}"#).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.field),
            Err("attribute_defaults.data_class".to_string())
        );
        let e = try_config("restrict", r#"{"colour":"red"}"#).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.field),
            Err("attribute_defaults.colour".to_string())
        );
    }
}
