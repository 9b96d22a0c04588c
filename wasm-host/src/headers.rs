//! An ordered, multi-valued header map with Envoy's conventions.
//!
//! Envoy lower-cases names on the way in, keeps insertion order, allows the
//! same name several times, and answers single-value lookups with the first
//! value. Values are bytes: a guest may store anything, and the host must
//! not panic on non-UTF-8 (the SDK's `String` getters would).

use std::fmt;

/// Header (or trailer) map: ordered `(name, value)` pairs, names lower-cased.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Headers {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.pairs.iter().map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            }))
            .finish()
    }
}

fn lower(name: &[u8]) -> Vec<u8> {
    name.to_ascii_lowercase()
}

impl Headers {
    /// An empty map.
    pub fn new() -> Headers {
        Headers::default()
    }

    /// Builds a map from pairs, lower-casing the names.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Headers {
        let mut h = Headers::new();
        for (k, v) in pairs {
            h.add(k, v);
        }
        h
    }

    /// Appends a value (keeps existing values of the same name). As in
    /// Envoy's header map, pseudo-headers stay first: one is appended after
    /// the last pseudo-header.
    pub fn add(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let name = lower(name.as_ref());
        let value = value.as_ref().to_vec();
        if name.starts_with(b":") {
            let at = self
                .pairs
                .iter()
                .position(|(k, _)| !k.starts_with(b":"))
                .unwrap_or(self.pairs.len());
            self.pairs.insert(at, (name, value));
        } else {
            self.pairs.push((name, value));
        }
    }

    /// Sets a header as Envoy 1.40's `setCopy` does (what
    /// `proxy_replace_header_map_value` calls): removes every value, then
    /// appends the new one at the end (a pseudo-header at the end of the
    /// pseudo-headers). A replaced header moves to the end; a filter that
    /// lists the pairs afterwards, and the upstream, see it there.
    pub fn set(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let name = lower(name.as_ref());
        self.pairs.retain(|(k, _)| *k != name);
        self.add(name, value);
    }

    /// Replaces the first value in place and drops the others, or appends
    /// when absent: not what a filter's replace does (see
    /// [`Headers::set`]), but how a codec fills in a header it parsed.
    pub fn replace_in_place(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let name = lower(name.as_ref());
        let value = value.as_ref().to_vec();
        match self.pairs.iter().position(|(k, _)| *k == name) {
            Some(first) => {
                if let Some(slot) = self.pairs.get_mut(first) {
                    slot.1 = value;
                }
                let mut i = 0usize;
                self.pairs.retain(|(k, _)| {
                    let keep = i <= first || *k != name;
                    i += 1;
                    keep
                });
            }
            None => self.pairs.push((name, value)),
        }
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: impl AsRef<[u8]>) {
        let name = lower(name.as_ref());
        self.pairs.retain(|(k, _)| *k != name);
    }

    /// The first value of `name` as text (`None` if absent or not UTF-8).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.get_bytes(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first value of `name` as bytes.
    pub fn get_bytes(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        let name = lower(name.as_ref());
        self.pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Every value of `name`, in order, as lossy text.
    pub fn get_all(&self, name: &str) -> Vec<String> {
        let name = lower(name.as_bytes());
        self.pairs
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// Whether `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.get_bytes(name).is_some()
    }

    /// Number of entries (a name present twice counts twice), as Envoy
    /// passes to `on_*_headers`.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The pairs as bytes, in order.
    pub fn pairs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.pairs
    }

    /// The pairs as lossy text, in order: convenient in assertions.
    pub fn to_vec(&self) -> Vec<(String, String)> {
        self.pairs
            .iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    /// Replaces the whole map, as `proxy_set_header_map_pairs` does in
    /// Envoy: every header removed, then each pair added in order (so a
    /// pseudo-header listed after a regular one still goes first).
    pub(crate) fn replace_all(&mut self, pairs: Vec<(Vec<u8>, Vec<u8>)>) {
        self.pairs.clear();
        for (k, v) in pairs {
            self.add(k, v);
        }
    }

    /// Serialized in the ABI's pair format.
    pub fn encode(&self) -> Vec<u8> {
        crate::abi::encode_pairs(&self.pairs)
    }

    /// Total size of names and values, as Envoy's `byteSize`.
    pub fn byte_size(&self) -> usize {
        self.pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Headers {
        let mut h = Headers::new();
        for (k, v) in iter {
            h.add(k, v);
        }
        h
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>, const N: usize> From<[(K, V); N]> for Headers {
    fn from(pairs: [(K, V); N]) -> Headers {
        pairs.into_iter().collect()
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> From<Vec<(K, V)>> for Headers {
    fn from(pairs: Vec<(K, V)>) -> Headers {
        pairs.into_iter().collect()
    }
}

impl From<&Headers> for Headers {
    fn from(h: &Headers) -> Headers {
        h.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_removes_every_value_and_appends_like_envoy() {
        let mut h = Headers::from_pairs(&[("A", "1"), ("b", "2"), ("a", "3")]);
        h.set("a", "9");
        assert_eq!(
            h.to_vec(),
            vec![("b".into(), "2".into()), ("a".into(), "9".into())]
        );
        assert_eq!(h.get("A"), Some("9"));
        h.remove("A");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn pseudo_headers_stay_first() {
        let mut h = Headers::from_pairs(&[(":path", "/"), (":method", "GET"), ("x", "1")]);
        h.set(":path", "/new");
        h.add(":scheme", "http");
        let names: Vec<String> = h.to_vec().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, [":method", ":path", ":scheme", "x"]);
    }

    #[test]
    fn replacing_every_pair_keeps_pseudo_headers_first() {
        let mut h = Headers::from_pairs(&[(":path", "/"), ("a", "1")]);
        h.replace_all(vec![
            (b"B".to_vec(), b"2".to_vec()),
            (b":path".to_vec(), b"/x".to_vec()),
        ]);
        let names: Vec<String> = h.to_vec().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, [":path", "b"]);
    }

    #[test]
    fn replace_in_place_keeps_the_position() {
        let mut h = Headers::from_pairs(&[("a", "1"), ("b", "2"), ("a", "3")]);
        h.replace_in_place("a", "9");
        assert_eq!(
            h.to_vec(),
            vec![("a".into(), "9".into()), ("b".into(), "2".into())]
        );
    }
}
