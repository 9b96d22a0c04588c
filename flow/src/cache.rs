//! The exact-match response cache: the rung of the merit order below
//! every destination, at near-zero marginal cost.
//!
//! Why in the proxy: a hit must be decided where the request's policy is
//! known (its tenant, data class and feasible set come from the same
//! tables as its routing), and answering it must cost less than the
//! cheapest destination. An in-proxy store answers with no network hop:
//! Envoy's shared data for the Wasm filter (every worker of one Envoy
//! shares it) and process memory for the dynamic module. It is a fixed
//! number of slots (`cache.slots`) of bounded size (`cache.max_entry_bytes`),
//! addressed by the key's hash, so memory is bounded and a new entry
//! replaces the one in its slot. Sharing across Envoys (a Valkey or Redis
//! behind every proxy) would add a round trip to every lookup and a
//! second failure mode; the shared store ([`crate::store::cache_get`],
//! [`crate::store::cache_put`]) is where such a store would plug in.
//!
//! What is cached, and for whom:
//!
//! - only requests that are safe to answer twice: deterministic sampling
//!   (`temperature` 0, one choice) and no tools or functions (a tool call
//!   may act on the world; ACE cannot tell which do);
//! - only when the tables allow it: the computed Bool attribute `cached`
//!   is true for a hit, so a policy forbidding `context.cached` for a
//!   tenant or a data class keeps it out (opt-in is a permit-narrowing
//!   forbid like every other rule);
//! - keyed by the configuration, every policy attribute's value (tenant
//!   and data class included), the path and the exact body bytes: an
//!   entry is never found by a request of another tenant or data class;
//! - served only when the destination that produced it is feasible for
//!   this request, with `cached` true, for the model it served: a cached
//!   answer never reaches a request that could not have reached its
//!   producer;
//! - a response is stored whole (a 2xx whose body ended within the bound)
//!   or not at all, streams included: an SSE answer is replayed as one
//!   body.
//!
//! A false hit is a wrong answer, so a fraction of hits
//! (`cache.check_fraction`) goes to the upstream as well: the fresh
//! answer is served and compared with the entry (the `choices`, ignoring
//! ids and timestamps), counted in `ace.cache.checks` and
//! `ace.cache.false_hits`, and logged on the event (reason `cache_check`,
//! `cache_false_hit`), where the ledger forfeits a window's caching
//! savings when the rate passes its bound.

use ace_config::ConfigError;
use ace_core::tables::Tables;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use ace_config::CACHED;

/// The event's reasons for an answer from the cache and for a hit sent
/// upstream to be checked (part of the line's contract, `ace-event`).
pub use ace_event::reason::{CACHE_CHECK as CHECK_REASON, CACHE_HIT as HIT_REASON};

pub use ace_config::CacheSettings;

/// The cache, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Cache {
    /// Slots.
    pub slots: u32,
    /// Largest body stored.
    pub max_entry_bytes: usize,
    /// Entry lifetime, ms.
    pub ttl_ms: u64,
    /// Every this many hits on a worker, one is checked (0: never).
    pub check_every: u64,
    /// Position of `cached` among the tables' attributes, and the value
    /// index of `true`.
    attribute: usize,
    yes: u32,
}

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

impl Cache {
    /// Validate `s` against `tables` (the configuration checked that the
    /// body is read: the cache key is the request body).
    pub fn build(s: &CacheSettings, tables: Option<&Tables<'_>>) -> Result<Cache, ConfigError> {
        let Some(tables) = tables else {
            return Err(err(
                "cache",
                "needs compiled policy tables (tables_base64): which tenants and data classes \
                 may be answered from the cache is a policy decision",
            ));
        };
        let Some(attribute) = tables.attribute_index(CACHED) else {
            return Err(err(
                "cache",
                "the tables have no `cached` attribute: declare `cached: Bool` in the context of \
                 `dispatch` (ace.cedarschema), say in a policy who may be answered from the \
                 cache, and recompile",
            ));
        };
        let yes = tables.value_index(attribute, "true");
        let slots = s.slots.unwrap_or(1024);
        if !(1..=1 << 20).contains(&slots) {
            return Err(err("cache.slots", "must be between 1 and 1048576"));
        }
        let max_entry_bytes = s.max_entry_bytes.unwrap_or(64 * 1024);
        if !(64..=4 * 1024 * 1024).contains(&max_entry_bytes) {
            return Err(err(
                "cache.max_entry_bytes",
                "must be between 64 and 4194304",
            ));
        }
        let ttl_ms = s.ttl_ms.unwrap_or(300_000);
        if ttl_ms == 0 {
            return Err(err("cache.ttl_ms", "must be at least 1"));
        }
        let fraction = s.check_fraction.unwrap_or(0.01);
        if !(fraction.is_finite() && (0.0..=1.0).contains(&fraction)) {
            return Err(err(
                "cache.check_fraction",
                "must be a fraction in [0, 1] (0: never check a hit)",
            ));
        }
        let check_every = if fraction > 0.0 {
            (1.0 / fraction).round().max(1.0) as u64
        } else {
            0
        };
        Ok(Cache {
            slots,
            max_entry_bytes,
            ttl_ms,
            check_every,
            attribute: attribute as usize,
            yes,
        })
    }

    /// Position of `cached` among the tables' attributes.
    pub fn attribute(&self) -> usize {
        self.attribute
    }

    /// The value index of `cached` = true.
    pub fn yes(&self) -> u32 {
        self.yes
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &[u8; 32]) -> u32 {
        let k = u32::from_le_bytes([key[0], key[1], key[2], key[3]]);
        k % self.slots.max(1)
    }
}

/// The cache key: configuration, every attribute value, tenant and data
/// class as sent, path, body.
pub fn key(
    config: &str,
    values: &[u32],
    tenant: Option<&[u8]>,
    data_class: Option<&[u8]>,
    path: Option<&[u8]>,
    body: &[u8],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"ace.cache/1\0");
    h.update(config.as_bytes());
    for v in values {
        h.update(v.to_le_bytes());
    }
    for part in [tenant, data_class, path] {
        let part = part.unwrap_or(b"");
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(body);
    h.finalize().into()
}

/// One stored answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<'a> {
    /// The key it was stored under.
    pub key: [u8; 32],
    /// When, ms since the epoch.
    pub created_ms: u64,
    /// The destination that produced it.
    pub producer: usize,
    /// The model that produced it.
    pub model: &'a str,
    /// Its status.
    pub status: u16,
    /// Its `content-type`.
    pub content_type: &'a str,
    /// Tokens in and out, and whether they are estimates.
    pub tokens_in: u32,
    /// See [`Entry::tokens_in`].
    pub tokens_out: u32,
    /// See [`Entry::tokens_in`].
    pub estimated: bool,
    /// The digest of what the answer says ([`content_digest`]).
    pub digest: [u8; 32],
    /// The body.
    pub body: &'a [u8],
}

const MAGIC: &[u8; 5] = b"ACEC1";

impl<'a> Entry<'a> {
    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        out.extend_from_slice(&(self.producer as u32).to_le_bytes());
        for text in [self.model, self.content_type] {
            let b = text.as_bytes();
            let len = b.len().min(u16::MAX as usize);
            out.extend_from_slice(&(len as u16).to_le_bytes());
            out.extend_from_slice(b.get(..len).unwrap_or_default());
        }
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.tokens_in.to_le_bytes());
        out.extend_from_slice(&self.tokens_out.to_le_bytes());
        out.push(u8::from(self.estimated));
        out.extend_from_slice(&self.digest);
        out.extend_from_slice(self.body);
        out
    }

    /// Read stored bytes; `None` for anything else (a torn or foreign
    /// value is a miss, never an answer).
    pub fn decode(bytes: &'a [u8]) -> Option<Entry<'a>> {
        let mut c = Cursor(bytes);
        if c.take(5)? != MAGIC {
            return None;
        }
        let key = c.array::<32>()?;
        let created_ms = u64::from_le_bytes(c.array::<8>()?);
        let producer = u32::from_le_bytes(c.array::<4>()?) as usize;
        let model = c.text()?;
        let content_type = c.text()?;
        let status = u16::from_le_bytes(c.array::<2>()?);
        let tokens_in = u32::from_le_bytes(c.array::<4>()?);
        let tokens_out = u32::from_le_bytes(c.array::<4>()?);
        let estimated = c.take(1)? != [0];
        let digest = c.array::<32>()?;
        Some(Entry {
            key,
            created_ms,
            producer,
            model,
            status,
            content_type,
            tokens_in,
            tokens_out,
            estimated,
            digest,
            body: c.0,
        })
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn text(&mut self) -> Option<&'a str> {
        let len = u16::from_le_bytes(self.array::<2>()?) as usize;
        std::str::from_utf8(self.take(len)?).ok()
    }
}

/// What an answer says, as a digest: its `choices` (for an SSE stream,
/// every event's `choices` in order), without the ids, timestamps and
/// usage that differ between two answers saying the same; the whole body
/// when it is neither.
pub fn content_digest(body: &[u8], sse: bool) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut any = false;
    let choices = |json: &[u8], h: &mut Sha256| {
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            choices: Option<serde_json::Value>,
        }
        if let Ok(Answer { choices: Some(c) }) = serde_json::from_slice::<Answer>(json) {
            h.update(c.to_string().as_bytes());
            true
        } else {
            false
        }
    };
    if sse {
        for line in body.split(|b| *b == b'\n') {
            if let Some(data) = line.trim_ascii().strip_prefix(b"data:") {
                any |= choices(data.trim_ascii(), &mut h);
            }
        }
    } else {
        any = choices(body, &mut h);
    }
    if !any {
        h.update(body);
    }
    h.finalize().into()
}

/// Per-request cache state while a miss or a check is answered upstream.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    /// The key and its slot.
    pub key: [u8; 32],
    /// See [`Pending::key`].
    pub slot: u32,
    /// A checked hit's digest, to compare with the fresh answer.
    pub check: Option<[u8; 32]>,
    /// The response body so far (while it fits).
    pub body: Vec<u8>,
    /// The response's `content-type`.
    pub content_type: String,
    /// Whether the response is still storable (a 2xx, not encoded, within
    /// the bound).
    pub storable: bool,
    /// Whether the response outgrew `max_entry_bytes` (so it differs from
    /// any entry, which fits).
    pub oversize: bool,
    /// Whether it is an SSE stream.
    pub sse: bool,
}

/// Whether cache entry `e` may answer this request: the destination that
/// produced it is feasible for the request (its attribute values in
/// `lookup`), with the model that produced it, `substituted` as that model
/// is to the one named, and `cached` true. The request's values are left
/// as they were.
#[allow(clippy::too_many_arguments)]
pub fn may_serve(
    cfg: &ace_config::Config,
    tables: &ace_core::tables::Tables<'_>,
    lookup: &mut crate::request::Lookup,
    scratch: &mut Vec<u64>,
    cache: &Cache,
    routing: Option<&crate::routing::Routing>,
    asked: Option<crate::routing::Asked>,
    e: &Entry<'_>,
) -> bool {
    let Some(policy) = cfg.policy.as_ref() else {
        return false;
    };
    let values = &mut lookup.values;
    let saved: [Option<(usize, u32)>; 3] = [
        policy.model,
        Some(cache.attribute()),
        routing.map(|r| r.substituted_attribute()),
    ]
    .map(|i| i.and_then(|i| values.get(i).map(|v| (i, *v))));
    if let Some(m) = policy.model {
        let v = tables.value_index(m as u32, e.model);
        if let Some(slot) = values.get_mut(m) {
            *slot = v;
        }
    }
    if let Some(slot) = values.get_mut(cache.attribute()) {
        *slot = cache.yes();
    }
    if let Some(r) = routing {
        let named = asked.and_then(|a| r.reference(a)).map(|m| m.name.as_str());
        let substituted = asked.is_some_and(|a| a.member.is_some()) && named != Some(e.model);
        if let Some(slot) = values.get_mut(r.substituted_attribute()) {
            *slot = r.substituted_value(substituted);
        }
    }
    scratch.resize(lookup.mask.len(), 0);
    let allowed =
        tables.feasible(values, scratch).is_ok() && ace_core::dispatch::bit(scratch, e.producer);
    for (i, v) in saved.into_iter().flatten() {
        if let Some(slot) = values.get_mut(i) {
            *slot = v;
        }
    }
    allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_junk_is_a_miss() {
        let e = Entry {
            key: [7; 32],
            created_ms: 42,
            producer: 3,
            model: "llama-3.1-8b",
            status: 200,
            content_type: "application/json",
            tokens_in: 10,
            tokens_out: 20,
            estimated: false,
            digest: [9; 32],
            body: b"{\"choices\":[]}",
        };
        let bytes = e.encode();
        assert_eq!(Entry::decode(&bytes), Some(e));
        for cut in 0..bytes.len() - 14 {
            assert_eq!(Entry::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Entry::decode(b"xxxxx"), None);
    }

    #[test]
    fn digests_see_the_answer_not_its_ids() {
        let a = br#"{"id":"1","created":1,"choices":[{"message":{"content":"hi"}}],"usage":{}}"#;
        let b = br#"{"id":"2","created":2,"choices":[{"message":{"content":"hi"}}]}"#;
        let c = br#"{"id":"1","choices":[{"message":{"content":"ho"}}]}"#;
        assert_eq!(content_digest(a, false), content_digest(b, false));
        assert_ne!(content_digest(a, false), content_digest(c, false));
        let s1 = b"data: {\"id\":\"a\",\"choices\":[{\"delta\":{\"content\":\"h\"}}]}\n\ndata: [DONE]\n\n";
        let s2 = b"data: {\"id\":\"b\",\"choices\":[{\"delta\":{\"content\":\"h\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(content_digest(s1, true), content_digest(s2, true));
        assert_ne!(content_digest(b"x", false), content_digest(b"y", false));
    }

    #[test]
    fn keys_differ_by_tenant_data_class_and_body() {
        let k = |t: &[u8], d: &[u8], b: &[u8]| key("c", &[1, 2], Some(t), Some(d), None, b);
        let base = k(b"a", b"public", b"{}");
        assert_ne!(base, k(b"b", b"public", b"{}"));
        assert_ne!(base, k(b"a", b"internal", b"{}"));
        assert_ne!(base, k(b"a", b"public", b"{ }"));
        assert_ne!(
            k(b"ab", b"c", b"{}"),
            k(b"a", b"bc", b"{}"),
            "lengths delimit"
        );
    }
}
