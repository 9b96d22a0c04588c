//! Request attributes: from header values (and the body's `model`) to the
//! value indices that the policy tables are keyed by.
//!
//! A pure function, so it can be fuzzed and tested without a host. Values
//! are trimmed; a value the tables do not know maps to the unknown index,
//! which no permit row matches (fail closed). A missing value is refused or
//! replaced by the configured default, per `on_missing_attribute`.

use crate::config::{AttributeSource, OnMissing, Policy};
use ace_core::tables::{Tables, UNKNOWN};

/// Fill `values` (one slot per table attribute) for one request.
///
/// `header(i, a)` is the value of attribute `i`'s header (`a.header`), if
/// sent: a lookup into the request's header buffer, so nothing is copied.
/// `body_model` is the body's `model` field, used for an attribute named
/// `model` when its header is absent. A value that is not UTF-8 is sent but
/// matches nothing: the unknown index. Returns the first attribute that is
/// missing when the policy refuses missing attributes.
pub fn resolve<'p, 'h>(
    tables: &Tables<'_>,
    policy: &'p Policy,
    header: impl Fn(usize, &AttributeSource) -> Option<&'h [u8]>,
    body_model: Option<&str>,
    values: &mut [u32],
) -> Result<(), &'p AttributeSource> {
    for (i, a) in policy.attributes.iter().enumerate() {
        let index = match header(i, a) {
            Some(v) => match std::str::from_utf8(v) {
                Ok(v) => tables.value_index(i as u32, v.trim()),
                Err(_) => UNKNOWN,
            },
            None => match body_model.filter(|_| a.name == "model") {
                Some(v) => tables.value_index(i as u32, v.trim()),
                None if policy.on_missing == OnMissing::Reject => return Err(a),
                None => a.default_index,
            },
        };
        if let Some(slot) = values.get_mut(i) {
            *slot = index;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use ace_core::tables::{
        encode, AttributeSpec, DestinationSpec, FactorKind, FactorSpec, TableSpec,
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

    /// Header values by attribute position.
    fn sent<'a>(
        values: &'a [Option<&'a str>],
    ) -> impl Fn(usize, &AttributeSource) -> Option<&'a [u8]> + 'a {
        |i, _| values.get(i).copied().flatten().map(str::as_bytes)
    }

    #[test]
    fn maps_headers_and_the_body_model() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let r = resolve(&t, p, sent(&[Some(" public "), None]), Some("m1"), &mut v);
        assert!(r.is_ok());
        assert_eq!(v, [2, 1]);
        let r = resolve(&t, p, sent(&[Some("secret"), Some("m1")]), None, &mut v);
        assert!(r.is_ok());
        assert_eq!(v, [UNKNOWN, 1], "unknown values fail closed");
        let r = resolve(&t, p, sent(&[None, Some("m1")]), None, &mut v);
        assert_eq!(r.map_err(|a| a.header.as_str()), Err("x-ace-data-class"));
    }

    #[test]
    fn a_value_that_is_not_utf8_is_sent_but_unknown() {
        let c = config("reject", "{}");
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        let bad: &[u8] = b"publ\xffic";
        let r = resolve(&t, p, |i, _| [Some(bad), Some(&b"m1"[..])][i], None, &mut v);
        assert!(r.is_ok(), "sent, so not missing");
        assert_eq!(v, [UNKNOWN, 1]);
    }

    #[test]
    fn restrict_uses_the_default_or_unknown() {
        let c = config("restrict", r#"{"data_class":"personal_eu"}"#);
        let p = c.policy.as_ref().unwrap();
        let t = Tables::load(p.tables).unwrap();
        let mut v = [9u32; 2];
        assert!(resolve(&t, p, sent(&[None, None]), None, &mut v).is_ok());
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
