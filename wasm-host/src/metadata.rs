//! Dynamic metadata: what other filters (or the test) set on a request,
//! read through the `metadata` attribute as Envoy serves it.
//!
//! Envoy walks `get_property(["metadata", ...])` over the stream's
//! `envoy.config.core.v3.Metadata` message with CEL: `metadata` alone is
//! the message's protobuf encoding; `filter_metadata` is a map from
//! namespace to `google.protobuf.Struct`, which CEL unwraps into maps, so
//! it and each namespace serialize in the ABI's pair format, as does a
//! struct value; a leaf value is a string's raw bytes, a number's 8-byte
//! little-endian double, a bool's single byte, a list as pairs with the
//! items as keys and empty values; `null` cannot be serialized
//! (`SerializationFailure`). A missing namespace or key is NotFound.
//! Map entries come out sorted by key here; Envoy's order follows its
//! hash maps, so compare multi-entry maps by content.

use crate::abi::{encode_pairs, Status};
use std::collections::BTreeMap;

/// One `google.protobuf.Value`.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// `null_value`.
    Null,
    /// `number_value` (JSON numbers are doubles).
    Number(f64),
    /// `string_value`.
    String(String),
    /// `bool_value`.
    Bool(bool),
    /// `struct_value`.
    Struct(BTreeMap<String, MetadataValue>),
    /// `list_value`.
    List(Vec<MetadataValue>),
}

impl From<&str> for MetadataValue {
    fn from(s: &str) -> MetadataValue {
        MetadataValue::String(s.to_string())
    }
}

impl From<f64> for MetadataValue {
    fn from(n: f64) -> MetadataValue {
        MetadataValue::Number(n)
    }
}

impl From<bool> for MetadataValue {
    fn from(b: bool) -> MetadataValue {
        MetadataValue::Bool(b)
    }
}

/// A stream's dynamic metadata (`filter_metadata`): namespace → struct.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    namespaces: BTreeMap<String, BTreeMap<String, MetadataValue>>,
}

impl Metadata {
    /// Sets `key` in namespace `ns` (as `set_metadata` or a Lua filter's
    /// `dynamicMetadata():set` would).
    pub fn set(&mut self, ns: &str, key: &str, value: impl Into<MetadataValue>) {
        self.namespaces
            .entry(ns.to_string())
            .or_default()
            .insert(key.to_string(), value.into());
    }

    /// A value, if set.
    pub fn get(&self, ns: &str, key: &str) -> Option<&MetadataValue> {
        self.namespaces.get(ns)?.get(key)
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// Adds everything `other` sets, its values winning.
    pub(crate) fn merge(&mut self, other: &Metadata) {
        for (ns, fields) in &other.namespaces {
            let mine = self.namespaces.entry(ns.clone()).or_default();
            for (k, v) in fields {
                mine.insert(k.clone(), v.clone());
            }
        }
    }

    /// `get_property(["metadata", rest...])`: `Err(NotFound)` or
    /// `Err(SerializationFailure)` as Envoy answers.
    pub(crate) fn property(&self, rest: &[&[u8]]) -> Result<Vec<u8>, Status> {
        let Some((first, rest)) = rest.split_first() else {
            return Ok(self.protobuf());
        };
        match *first {
            b"filter_metadata" => {}
            // An empty `map<string, Any>`.
            b"typed_filter_metadata" if rest.is_empty() => {
                return Ok(encode_pairs::<&[u8], &[u8]>(&[]))
            }
            _ => return Err(Status::NotFound),
        }
        let Some((ns, rest)) = rest.split_first() else {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = self
                .namespaces
                .iter()
                .map(|(k, v)| Ok((k.as_bytes().to_vec(), struct_pairs(v)?)))
                .collect::<Result<_, Status>>()?;
            return Ok(encode_pairs(&pairs));
        };
        let fields = self
            .namespaces
            .get(std::str::from_utf8(ns).map_err(|_| Status::NotFound)?)
            .ok_or(Status::NotFound)?;
        let mut value = match rest.split_first() {
            None => return struct_pairs(fields),
            Some((key, _)) => fields
                .get(std::str::from_utf8(key).map_err(|_| Status::NotFound)?)
                .ok_or(Status::NotFound)?,
        };
        for seg in rest.iter().skip(1) {
            value = match value {
                MetadataValue::Struct(m) => m
                    .get(std::str::from_utf8(seg).map_err(|_| Status::NotFound)?)
                    .ok_or(Status::NotFound)?,
                _ => return Err(Status::NotFound),
            };
        }
        serialize(value)
    }

    /// `envoy.config.core.v3.Metadata` in protobuf wire format.
    fn protobuf(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (ns, fields) in &self.namespaces {
            let mut entry = Vec::new();
            bytes_field(&mut entry, 1, ns.as_bytes());
            bytes_field(&mut entry, 2, &struct_proto(fields));
            bytes_field(&mut out, 1, &entry);
        }
        out
    }
}

/// A value as Envoy's `serializeValue` writes the CEL value it becomes.
fn serialize(v: &MetadataValue) -> Result<Vec<u8>, Status> {
    match v {
        MetadataValue::Null => Err(Status::SerializationFailure),
        MetadataValue::Number(n) => Ok(n.to_le_bytes().to_vec()),
        MetadataValue::String(s) => Ok(s.as_bytes().to_vec()),
        MetadataValue::Bool(b) => Ok(vec![u8::from(*b)]),
        MetadataValue::Struct(m) => struct_pairs(m),
        MetadataValue::List(items) => {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = items
                .iter()
                .map(|i| Ok((serialize(i)?, Vec::new())))
                .collect::<Result<_, Status>>()?;
            Ok(encode_pairs(&pairs))
        }
    }
}

fn struct_pairs(m: &BTreeMap<String, MetadataValue>) -> Result<Vec<u8>, Status> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = m
        .iter()
        .map(|(k, v)| Ok((k.as_bytes().to_vec(), serialize(v)?)))
        .collect::<Result<_, Status>>()?;
    Ok(encode_pairs(&pairs))
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn struct_proto(m: &BTreeMap<String, MetadataValue>) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in m {
        let mut entry = Vec::new();
        bytes_field(&mut entry, 1, k.as_bytes());
        bytes_field(&mut entry, 2, &value_proto(v));
        bytes_field(&mut out, 1, &entry);
    }
    out
}

fn value_proto(v: &MetadataValue) -> Vec<u8> {
    let mut out = Vec::new();
    match v {
        MetadataValue::Null => {
            varint(&mut out, 1 << 3);
            varint(&mut out, 0);
        }
        MetadataValue::Number(n) => {
            varint(&mut out, 2 << 3 | 1);
            out.extend_from_slice(&n.to_le_bytes());
        }
        MetadataValue::String(s) => bytes_field(&mut out, 3, s.as_bytes()),
        MetadataValue::Bool(b) => {
            varint(&mut out, 4 << 3);
            varint(&mut out, u64::from(*b));
        }
        MetadataValue::Struct(m) => bytes_field(&mut out, 5, &struct_proto(m)),
        MetadataValue::List(items) => {
            let mut list = Vec::new();
            for i in items {
                bytes_field(&mut list, 1, &value_proto(i));
            }
            bytes_field(&mut out, 6, &list);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Metadata {
        let mut m = Metadata::default();
        m.set("acme", "user", "ann");
        m.set("acme", "n", 3.0);
        m.set("acme", "ok", true);
        m
    }

    #[test]
    fn leaves_serialize_as_envoy_does() {
        let m = meta();
        let get = |p: &[&[u8]]| m.property(p);
        assert_eq!(
            get(&[b"filter_metadata", b"acme", b"user"]),
            Ok(b"ann".to_vec())
        );
        assert_eq!(
            get(&[b"filter_metadata", b"acme", b"n"]),
            Ok(3.0f64.to_le_bytes().to_vec())
        );
        assert_eq!(get(&[b"filter_metadata", b"acme", b"ok"]), Ok(vec![1]));
        assert_eq!(
            get(&[b"filter_metadata", b"acme", b"x"]),
            Err(Status::NotFound)
        );
        assert_eq!(get(&[b"filter_metadata", b"nope"]), Err(Status::NotFound));
        assert_eq!(get(&[b"nope"]), Err(Status::NotFound));
    }

    #[test]
    fn the_whole_message_is_protobuf() {
        let mut m = Metadata::default();
        m.set("a", "k", "v");
        // filter_metadata {key: "a" value {fields {key: "k" value {string_value: "v"}}}}
        let want = vec![
            0x0a, 15, 0x0a, 1, b'a', 0x12, 10, 0x0a, 8, 0x0a, 1, b'k', 0x12, 3, 0x1a, 1, b'v',
        ];
        assert_eq!(m.property(&[]), Ok(want));
    }
}
