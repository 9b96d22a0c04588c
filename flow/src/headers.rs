//! A header map read in one host call.
//!
//! Reading headers one at a time costs a host call each, and inside Envoy
//! every value found costs a second crossing: the host calls back into the
//! VM to allocate the copy. `proxy_get_header_map_pairs` returns the whole
//! map in one buffer (one call, one allocation), and [`Pairs`] finds values
//! in it without copying. A request's headers are a dozen or so pairs, so a
//! linear scan per lookup is cheaper than any index.
//!
//! The buffer is the ABI's pair encoding: the number of pairs (u32, little
//! endian), then each pair's name and value lengths (u32 each), then each
//! name and value, each followed by a NUL. It comes from the host, but it
//! is read with checked slicing anyway: a malformed buffer yields the pairs
//! before the damage, never a panic.

/// A header map's pairs, as the host encoded them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pairs {
    buf: Vec<u8>,
}

impl Pairs {
    /// The encoded buffer.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Wrap an encoded pair buffer (see the module docs).
    pub fn from_encoded(buf: Vec<u8>) -> Pairs {
        Pairs { buf }
    }

    /// The ABI encoding of `pairs`: for hosts that hand a header map over
    /// as a list (Envoy's dynamic modules), for tests and for fuzzing. Two
    /// passes over the pairs (sizes, then bytes), so the one allocation is
    /// the buffer itself.
    pub fn encode<'a, I>(pairs: I) -> Pairs
    where
        I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
        I::IntoIter: Clone,
    {
        let pairs = pairs.into_iter();
        let (count, size) = pairs.clone().fold((0usize, 0usize), |(n, s), (k, v)| {
            (n + 1, s + 10 + k.len() + v.len())
        });
        let mut buf = Vec::with_capacity(4 + size);
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
        buf.extend_from_slice(&len(count));
        for (k, v) in pairs.clone() {
            buf.extend_from_slice(&len(k.len()));
            buf.extend_from_slice(&len(v.len()));
        }
        for (k, v) in pairs {
            buf.extend_from_slice(k);
            buf.push(0);
            buf.extend_from_slice(v);
            buf.push(0);
        }
        Pairs { buf }
    }

    /// Every (name, value) pair, in the host's order.
    pub fn iter(&self) -> Iter<'_> {
        let count = self
            .buf
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, |b| u32::from_le_bytes(b) as usize);
        // Each pair needs 8 bytes of lengths: a count that the buffer
        // cannot hold is damage, not a reason to loop for long.
        let count = count.min(self.buf.len().saturating_sub(4) / 8);
        Iter {
            buf: &self.buf,
            index: 0,
            count,
            data: 4 + 8 * count,
        }
    }

    /// The first value of header `name` (ASCII case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes();
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The first value of each of `names` (ASCII case-insensitive), in one
    /// pass over the pairs: cheaper than a [`Pairs::get`] per name once
    /// there are a few names to find.
    pub fn find<const N: usize>(&self, names: [&str; N]) -> [Option<&[u8]>; N] {
        let mut found = [None; N];
        let mut missing = N;
        for (k, v) in self.iter() {
            for (slot, name) in found.iter_mut().zip(names) {
                if slot.is_none()
                    && k.len() == name.len()
                    && k.eq_ignore_ascii_case(name.as_bytes())
                {
                    *slot = Some(v);
                    missing -= 1;
                }
            }
            if missing == 0 {
                break;
            }
        }
        found
    }

    /// Whether header `name` is present and contains `needle` (ASCII
    /// case-insensitive), e.g. a content type naming `json`.
    pub fn contains(&self, name: &str, needle: &str) -> bool {
        has(self.get(name), needle)
    }

    /// [`Pairs::get`] parsed as a number (see [`number`]).
    pub fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        number(self.get(name))
    }
}

/// A header value parsed as a number (surrounding spaces allowed).
pub fn number<T: std::str::FromStr>(value: Option<&[u8]>) -> Option<T> {
    std::str::from_utf8(value?).ok()?.trim().parse().ok()
}

/// Whether `value` contains `needle`, ASCII case-insensitive.
#[inline]
pub fn has(value: Option<&[u8]>, needle: &str) -> bool {
    let needle = needle.as_bytes();
    value.is_some_and(|v| {
        needle.is_empty()
            || v.windows(needle.len())
                .any(|w| w.eq_ignore_ascii_case(needle))
    })
}

/// Where a value lies in a [`Pairs`] buffer: lets a request keep header
/// values without copying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: u32,
    len: u32,
}

impl Pairs {
    /// The span of `value`, a slice this buffer handed out (`None` for
    /// any other slice).
    pub fn span(&self, value: &[u8]) -> Option<Span> {
        let start = (value.as_ptr() as usize).checked_sub(self.buf.as_ptr() as usize)?;
        let end = start.checked_add(value.len())?;
        if end > self.buf.len() {
            return None;
        }
        Some(Span {
            start: u32::try_from(start).ok()?,
            len: u32::try_from(value.len()).ok()?,
        })
    }

    /// The bytes at `span` (`None` if it does not fit this buffer).
    pub fn at(&self, span: Span) -> Option<&[u8]> {
        let start = span.start as usize;
        self.buf.get(start..start.checked_add(span.len as usize)?)
    }
}

/// The pairs of a [`Pairs`] buffer.
#[derive(Debug)]
pub struct Iter<'a> {
    buf: &'a [u8],
    index: usize,
    count: usize,
    /// Where the next pair's name starts.
    data: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.index >= self.count {
            return None;
        }
        let at = 4 + 8 * self.index;
        let word = |o: usize| {
            self.buf
                .get(o..o + 4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(|b| u32::from_le_bytes(b) as usize)
        };
        let (Some(klen), Some(vlen)) = (word(at), word(at + 4)) else {
            self.index = self.count;
            return None;
        };
        let key_end = self.data.checked_add(klen)?;
        let value_start = key_end.checked_add(1)?;
        let value_end = value_start.checked_add(vlen)?;
        // Both the name and the value end with a NUL; anything else is damage.
        let (Some(k), Some(v), Some(0), Some(0)) = (
            self.buf.get(self.data..key_end),
            self.buf.get(value_start..value_end),
            self.buf.get(key_end),
            self.buf.get(value_end),
        ) else {
            self.index = self.count;
            return None;
        };
        self.index += 1;
        self.data = value_end + 1;
        Some((k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Pairs {
        Pairs::encode(list.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())))
    }

    #[test]
    fn finds_values_by_name_case_insensitively() {
        let p = pairs(&[
            (":method", "POST"),
            ("x-ace-tenant", "acme"),
            ("x-ace-tenant", "second"),
            ("content-length", ""),
        ]);
        assert_eq!(p.get("X-ACE-Tenant"), Some(&b"acme"[..]), "the first value");
        assert_eq!(p.get("content-length"), Some(&b""[..]));
        assert_eq!(p.get("x-absent"), None);
        assert_eq!(p.iter().count(), 4);
        assert_eq!(p.get(":method"), Some(&b"POST"[..]));
        assert_eq!(
            p.find(["content-length", "x-absent", "X-ACE-TENANT"]),
            [Some(&b""[..]), None, Some(&b"acme"[..])]
        );
    }

    #[test]
    fn numbers_and_substrings() {
        let p = pairs(&[
            (":status", "429"),
            ("retry-after", " 7 "),
            ("content-type", "Text/Event-Stream; charset=utf-8"),
        ]);
        assert_eq!(p.number::<u32>(":status"), Some(429));
        assert_eq!(p.number::<u64>("retry-after"), Some(7));
        assert_eq!(p.number::<u64>("content-type"), None);
        assert!(p.contains("content-type", "text/event-stream"));
        assert!(!p.contains("content-type", "json"));
        assert!(!p.contains("x-absent", ""));
    }

    #[test]
    fn spans_point_back_into_the_buffer() {
        let p = pairs(&[("x-request-id", "r-1"), ("x-ace-tenant", "acme")]);
        let [id, tenant] = p.find(["x-request-id", "x-ace-tenant"]);
        let (id, tenant) = (id.and_then(|v| p.span(v)), tenant.and_then(|v| p.span(v)));
        assert_eq!(id.and_then(|s| p.at(s)), Some(&b"r-1"[..]));
        assert_eq!(tenant.and_then(|s| p.at(s)), Some(&b"acme"[..]));
        // Slices of anything else have no span; spans of a larger buffer
        // do not fit a smaller one.
        assert_eq!(p.span(b"r-1"), None);
        let empty = Pairs::default();
        assert_eq!(tenant.and_then(|s| empty.at(s)), None);
    }

    #[test]
    fn non_utf8_values_come_back_as_sent() {
        // Values stay bytes: a value that is not UTF-8 is no error here; it
        // equals no table value (unknown, so policy fails closed) and the
        // event repairs it when it writes the line.
        let p = Pairs::encode([(&b"x-ace-tenant"[..], &b"ac\xffme"[..])]);
        assert_eq!(p.get("x-ace-tenant"), Some(&b"ac\xffme"[..]));
        assert_eq!(p.number::<u32>("x-ace-tenant"), None);
    }

    #[test]
    fn damaged_buffers_yield_what_precedes_the_damage() {
        let whole = pairs(&[("a", "1"), ("b", "22")]);
        let bytes = whole.buf.clone();
        for cut in 0..bytes.len() {
            let p = Pairs::from_encoded(bytes.get(..cut).unwrap_or_default().to_vec());
            assert!(p.iter().count() <= 2, "cut at {cut}");
            let _ = p.get("b");
        }
        // A missing or wrong terminator.
        let mut bad = bytes.clone();
        if let Some(last) = bad.last_mut() {
            *last = b'x';
        }
        assert_eq!(Pairs::from_encoded(bad).iter().count(), 1);
        // A count far beyond the buffer, and lengths that overflow.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Pairs::from_encoded(huge).iter().count(), 0);
        assert_eq!(Pairs::default().iter().count(), 0);
    }
}
