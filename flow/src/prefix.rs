//! Prefix locality: what each destination already holds of a request's
//! prompt, priced into the merit order.
//!
//! Why: most of a request's input is a prefix some destination has seen
//! (the system prompt, the tools, the earlier turns of a conversation).
//! A provider bills a cached prefix at a fraction of its input price
//! (OpenAI: automatic for prompts of 1,024 tokens or more, half or a tenth
//! of the input price by model; Anthropic: a tenth for cache reads), and
//! an engine with prefix caching (vLLM's automatic prefix caching,
//! SGLang's radix cache) skips the prefill of a resident prefix. The
//! engine-side routers exploit the second but know no prices, tiers or
//! policy; ACE knows those, so it prices locality as one more term of the
//! same merit order ([`ace_core::dispatch::Held`]).
//!
//! Three parts:
//!
//! - **The fingerprint** ([`Fingerprint`]), computed while the body is
//!   parsed (no tokenizer): a chain of hashes over the prompt's messages
//!   (each boundary's hash covers every message before it), or over
//!   [`BLOCK_BYTES`]-byte blocks of a completion prompt, with the byte
//!   count at each boundary (tokens are estimated as bytes over four, as
//!   everywhere in the filter). It keeps the first boundary (a shared
//!   system prompt) and the last [`TAIL`] (the earlier turns of a
//!   conversation: turn n's prompt is turn n-1's plus the answer and the
//!   next question, so turn n-1's whole prompt is two boundaries back).
//!   The session hint clients send (`prompt_cache_key`, else `user`, else
//!   the configured session header) is kept too, for requests whose prompt
//!   is not in the body (the Responses API's `previous_response_id`).
//! - **The table** ([`Record`]): in the host's shared memory (Envoy's
//!   shared data for the Wasm filter, process memory for the dynamic
//!   module), a fixed number of slots (`locality.slots_per_destination`
//!   times the destinations), each holding one prefix's tag, its size and
//!   up to [`HOLDERS`] destinations with when each was last sent it. A new
//!   prefix replaces the one in its slot and a fourth holder the oldest:
//!   lossy, bounded ([`RECORD_BYTES`] a slot), and a miss only costs the
//!   discount. A holder counts only within its destination's cache
//!   lifetime ([`Rule::ttl_ms`]). Updated from where ACE sends requests:
//!   on a decision, the destination chosen holds every boundary kept (a
//!   boundary it was already recorded holding within [`REFRESH_MS`] is not
//!   written again, so a conversation's turn writes only its new ones).
//! - **The price** ([`Locality::held`]): per feasible destination, the
//!   longest prefix it holds, in tokens, if at least its cache's minimum;
//!   as full-price input tokens it will not charge (times one minus its
//!   `cached_input_factor`) and prefill seconds it will skip (over its
//!   `prefill_tokens_per_s`). Only feasible destinations are looked at,
//!   and the core ranks only open ones: locality never adds a candidate,
//!   and a trip, a full cap or a drain closes a destination whatever it
//!   holds.
//!
//! Tenants never see each other's locality: every key is a SipHash of the
//! tenant, the model named, the tools and the chain, under a secret key
//! the first worker draws once and every worker shares
//! ([`crate::store::locality_secret`]; no secret, no locality). Two tenants' prompts never share a slot's tag unless they
//! collide in 64 bits of a keyed hash, which a tenant cannot steer without
//! the key; a tenant's own collisions move only its own prices. The
//! chain's per-message hash is fast and unkeyed; the keyed step over its
//! 64 bits is what separates tenants.
//!
//! False positives: a tag is 64 bits, so a lookup finds another prefix's
//! record with probability about `probes / 2^64` (nil); what is lossy is
//! the other way (a record overwritten, a prefix evicted by its engine
//! before its lifetime, a provider's cache missing on another machine): a
//! held prefix priced that is not there costs at most the discount on one
//! request, and the ledger books what the provider's usage says.

use ace_config::{Config, ConfigError, Destination};
use ace_core::cost::Tier;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Boundaries kept after the first.
pub const TAIL: usize = 3;

/// Boundaries a fingerprint keeps: the first and the last [`TAIL`].
pub const KEPT: usize = TAIL + 1;

/// A completion prompt (one string) is chained in blocks of this many
/// bytes (about 512 tokens, the Mooncake trace's block).
pub const BLOCK_BYTES: usize = 2048;

/// Destinations one record holds.
pub const HOLDERS: usize = 3;

/// Bytes of one record in the host's table.
pub const RECORD_BYTES: usize = 16 + 8 * HOLDERS;

/// Records per destination when `locality.slots_per_destination` is unset.
pub const DEFAULT_SLOTS_PER_DESTINATION: u32 = 4096;

/// A holder sent the same prefix again within this long is not written
/// again (a shared-data write is most of locality's cost in the Wasm
/// filter): its lifetime then counts from up to this much earlier.
pub const REFRESH_MS: u64 = 30_000;

/// A request's prompt as chained hashes at its boundaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    /// Boundaries kept (0: no prompt read), shortest first.
    len: u8,
    chain: [u64; KEPT],
    bytes: [u32; KEPT],
    /// The tools' hash (0: none): part of every key, as the tools are part
    /// of the prompt a provider caches.
    tools: u64,
    /// The session hint's hash (0: none).
    hint: u64,
}

impl Fingerprint {
    /// Whether the body gave no prompt and no hint.
    pub fn is_empty(&self) -> bool {
        self.len == 0 && self.hint == 0
    }

    /// The boundaries kept, shortest first: (chain hash, bytes up to it).
    pub fn boundaries(&self) -> impl DoubleEndedIterator<Item = (u64, u32)> + '_ {
        self.chain
            .iter()
            .zip(&self.bytes)
            .take(usize::from(self.len))
            .map(|(c, b)| (*c, *b))
    }

    /// The session hint's hash, if the request sent one.
    pub fn hint(&self) -> Option<u64> {
        (self.hint != 0).then_some(self.hint)
    }

    /// Set the session hint from a header value, unless the body gave one.
    pub fn hint_from_header(&mut self, value: &[u8]) {
        if self.hint == 0 && !value.is_empty() {
            self.hint = mix(SEED ^ 2, value) | 1;
        }
    }
}

/// The chain's seed.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// A fast, unkeyed 64-bit hash of `bytes` from `h`: eight bytes a step
/// (a multiply and a rotate), then the length. Not collision-resistant:
/// only the keyed step ([`Secret::key`]) separates tenants.
#[inline]
fn mix(mut h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9fb2_1c65_1e98_df25;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(a)).wrapping_mul(K).rotate_left(29);
    }
    let rest = words.remainder();
    let mut a = [0u8; 8];
    if let Some(dst) = a.get_mut(..rest.len()) {
        dst.copy_from_slice(rest);
    }
    h = (h ^ u64::from_le_bytes(a)).wrapping_mul(K).rotate_left(29);
    (h ^ bytes.len() as u64).wrapping_mul(K) ^ (h >> 31)
}

/// Builds a [`Fingerprint`] as the body is parsed.
#[derive(Default)]
struct Chain {
    h: u64,
    bytes: u32,
    count: u32,
    first: (u64, u32),
    /// The last boundaries, a ring of [`TAIL`].
    tail: [(u64, u32); TAIL],
}

impl Chain {
    fn push(&mut self, element: &[u8]) {
        self.h = mix(self.h ^ SEED, element);
        self.bytes = self
            .bytes
            .saturating_add(u32::try_from(element.len()).unwrap_or(u32::MAX));
        self.count = self.count.saturating_add(1);
        let at = (self.h, self.bytes);
        if self.count == 1 {
            self.first = at;
        } else if let Some(slot) = self.tail.get_mut((self.count as usize - 2) % TAIL) {
            *slot = at;
        }
    }

    fn finish(&self, into: &mut Fingerprint) {
        let mut len = 0usize;
        let mut put = |(c, b): (u64, u32)| {
            if let (Some(cs), Some(bs)) = (into.chain.get_mut(len), into.bytes.get_mut(len)) {
                *cs = c;
                *bs = b;
                len += 1;
            }
        };
        if self.count == 0 {
            return;
        }
        put(self.first);
        // The tail in order, oldest first.
        let in_tail = (self.count as usize - 1).min(TAIL);
        let next = (self.count as usize - 1) % TAIL;
        for i in 0..in_tail {
            let at = (next + TAIL - in_tail + i) % TAIL;
            if let Some(t) = self.tail.get(at) {
                put(*t);
            }
        }
        into.len = len as u8;
    }
}

/// The body's `messages` (or `input`, the Responses API's), chained one
/// element at a time as it is parsed, borrowing each element's bytes.
#[derive(Default)]
pub(crate) struct Messages(Fingerprint);

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of messages or a prompt string")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Messages, A::Error> {
                let mut chain = Chain::default();
                while let Some(m) = seq.next_element::<&'de RawValue>()? {
                    chain.push(m.get().as_bytes());
                }
                let mut fp = Fingerprint::default();
                chain.finish(&mut fp);
                Ok(Messages(fp))
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, s: &'de str) -> Result<Messages, E> {
                Ok(Messages(blocks(s.as_bytes())))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Messages, E> {
                Ok(Messages(blocks(s.as_bytes())))
            }
            // Anything else is no prompt ACE can chain (the upstream
            // judges it): no fingerprint, never an error here.
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Messages, A::Error> {
                use serde::de::IgnoredAny;
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Messages::default())
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Messages, E> {
                Ok(Messages::default())
            }
        }
        d.deserialize_any(V)
    }
}

impl Messages {
    pub(crate) fn into_fingerprint(self) -> Fingerprint {
        self.0
    }
}

/// A prompt string in [`BLOCK_BYTES`] blocks.
fn blocks(bytes: &[u8]) -> Fingerprint {
    let mut chain = Chain::default();
    for b in bytes.chunks(BLOCK_BYTES) {
        chain.push(b);
    }
    let mut fp = Fingerprint::default();
    chain.finish(&mut fp);
    fp
}

/// The tools' hash, for [`Fingerprint`]'s keys.
pub(crate) fn tools_hash(raw: &RawValue) -> u64 {
    mix(SEED ^ 1, raw.get().as_bytes()) | 1
}

/// The body's session hint's hash (its JSON value's bytes; 0 for none).
pub(crate) fn hint_hash(raw: &RawValue) -> u64 {
    match raw.get() {
        "null" | "\"\"" => 0,
        v => mix(SEED ^ 2, v.as_bytes()) | 1,
    }
}

/// Complete a fingerprint with what the body said beside the prompt.
pub(crate) fn fingerprint(prompt: Option<Messages>, tools: u64, hint: u64) -> Fingerprint {
    let mut fp = prompt.map(Messages::into_fingerprint).unwrap_or_default();
    fp.tools = tools;
    fp.hint = hint;
    fp
}

/// The host's secret for keying the table: two SipHash keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Secret(pub [u64; 2]);

impl Secret {
    /// The record key of boundary `chain` of a request of `tenant` for
    /// `model` with `tools` (`kind` 0 for a prompt boundary, 1 for a
    /// session hint), never 0.
    #[allow(deprecated)] // SipHash-2-4 with keys: what std keeps for this.
    pub fn key(&self, kind: u8, tenant: &[u8], model: &[u8], tools: u64, chain: u64) -> u64 {
        use std::hash::Hasher;
        let mut h = std::hash::SipHasher::new_with_keys(self.0[0], self.0[1]);
        h.write_u8(kind);
        h.write_usize(tenant.len());
        h.write(tenant);
        h.write_usize(model.len());
        h.write(model);
        h.write_u64(tools);
        h.write_u64(chain);
        h.finish() | 1
    }
}

/// One destination's prompt cache, as ACE models it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// How long a prefix stays after its last use, ms.
    pub ttl_ms: u64,
    /// The shortest prefix it caches, tokens.
    pub min_tokens: u32,
    /// Of a held input token's price, the part not charged (one minus the
    /// destination's `cached_input_factor`, at least 0).
    pub saved: f64,
    /// Prompt tokens it prefills per second (0: time not priced).
    pub prefill_tokens_per_s: f64,
}

impl Rule {
    /// Providers' prompt caches (OpenAI's, Azure OpenAI's: "cleared
    /// within 5-10 minutes of inactivity", prompts of 1,024 tokens or
    /// more; Anthropic's default lifetime is 5 minutes). Reserved blocks
    /// are a provider's deployments.
    pub const PROVIDER: (u64, u32) = (300_000, 1024);

    /// Engines' prefix caches (vLLM's automatic prefix caching keeps whole
    /// KV blocks, 16 tokens by default, until memory pressure evicts the
    /// least recently used: two minutes stands for that).
    pub const ENGINE: (u64, u32) = (120_000, 16);

    /// The rule of destination `d`.
    pub fn of(d: &Destination) -> Rule {
        let (ttl, min) = match d.tier {
            Tier::Payg | Tier::Reserved => Rule::PROVIDER,
            Tier::InHouse | Tier::Spot | Tier::OnDemand => Rule::ENGINE,
        };
        let p = d.prefix_cache.clone().unwrap_or_default();
        let (read, _) = d.cache_factors();
        Rule {
            ttl_ms: p.ttl_ms.unwrap_or(ttl),
            min_tokens: p.min_tokens.unwrap_or(min),
            saved: (1.0 - read).max(0.0),
            prefill_tokens_per_s: p.prefill_tokens_per_s.unwrap_or(0.0),
        }
    }
}

/// One slot of the table, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The key of the prefix it holds (0: empty).
    pub tag: u64,
    /// The prefix's size, bytes.
    pub bytes: u32,
    /// Holders: (destination, last sent at ms); destination `u16::MAX`
    /// is an empty place.
    pub holders: [(u16, u64); HOLDERS],
}

const EMPTY: u16 = u16::MAX;

impl Record {
    /// A record of `tag` held by nobody yet.
    fn new(tag: u64, bytes: u32) -> Record {
        Record {
            tag,
            bytes,
            holders: [(EMPTY, 0); HOLDERS],
        }
    }

    /// The bytes the host stores.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        let mut put = |at: usize, v: &[u8]| {
            if let Some(dst) = out.get_mut(at..at + v.len()) {
                dst.copy_from_slice(v);
            }
        };
        put(0, &self.tag.to_le_bytes());
        put(8, &self.bytes.to_le_bytes());
        for (i, (d, ms)) in self.holders.iter().enumerate() {
            let packed = (u64::from(*d) << 48) | (ms & ((1 << 48) - 1));
            put(16 + 8 * i, &packed.to_le_bytes());
        }
        out
    }

    /// A record from the host's bytes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Record> {
        if bytes.len() != RECORD_BYTES {
            return None;
        }
        let word = |at: usize| -> Option<u64> {
            let mut a = [0u8; 8];
            a.copy_from_slice(bytes.get(at..at + 8)?);
            Some(u64::from_le_bytes(a))
        };
        let mut r = Record::new(word(0)?, (word(8)? & 0xffff_ffff) as u32);
        for (i, h) in r.holders.iter_mut().enumerate() {
            let p = word(16 + 8 * i)?;
            *h = ((p >> 48) as u16, p & ((1 << 48) - 1));
        }
        Some(r)
    }

    /// Destination `d` holds it as of `now_ms`: its place refreshed, else
    /// an empty place, else the oldest one's.
    fn hold(&mut self, d: u16, now_ms: u64) {
        let at = self
            .holders
            .iter()
            .position(|(h, _)| *h == d)
            .or_else(|| self.holders.iter().position(|(h, _)| *h == EMPTY))
            .or_else(|| (0..HOLDERS).min_by_key(|i| self.holders.get(*i).map_or(0, |(_, ms)| *ms)));
        if let Some(h) = at.and_then(|i| self.holders.get_mut(i)) {
            *h = (d, now_ms);
        }
    }
}

/// Prefix locality, validated against the destinations.
#[derive(Clone, Debug, PartialEq)]
pub struct Locality {
    /// Slots in the table (per destination times destinations).
    pub slots: u32,
    /// The configured session header, lowercase.
    pub session_header: Option<String>,
    /// Per destination, in configuration order.
    pub rules: Vec<Rule>,
}

/// What the table says of one request, per destination: filled by
/// [`Locality::held`], read by the merit order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldBuf {
    /// Full-price input tokens not charged ([`ace_core::dispatch::Held::tokens`]).
    pub tokens: Vec<f64>,
    /// Prefill seconds skipped.
    pub seconds: Vec<f64>,
    /// Expected cached tokens (for the event).
    pub cached: Vec<u32>,
    /// The slots read by the lookup, by key (`None`: the slot held
    /// another prefix or nothing), so that recording the decision reads
    /// none of them again.
    seen: [(u64, Option<Record>); KEPT],
    seen_len: usize,
}

impl HeldBuf {
    /// What the lookup read of `key`'s slot, if it read it.
    fn seen(&self, key: u64) -> Option<Option<Record>> {
        self.seen
            .iter()
            .take(self.seen_len)
            .find(|(k, _)| *k == key)
            .map(|(_, r)| *r)
    }
}

impl HeldBuf {
    /// As the core reads it.
    pub fn as_held(&self) -> ace_core::dispatch::Held<'_> {
        ace_core::dispatch::Held {
            tokens: &self.tokens,
            seconds: &self.seconds,
        }
    }
}

/// The request's identity in the table's keys.
#[derive(Clone, Copy, Debug)]
pub struct Whose<'a> {
    /// The tenant's value (empty: none).
    pub tenant: &'a [u8],
    /// The model named.
    pub model: &'a [u8],
}

impl<'a> Whose<'a> {
    /// The tenant and the model named of the request `event` logs.
    pub fn of(event: &'a crate::event::Event) -> Whose<'a> {
        Whose {
            tenant: event.bytes(&event.tenant).unwrap_or_default(),
            model: event.bytes(&event.model_requested).unwrap_or_default(),
        }
    }
}

/// Where the table lives: the host's shared memory, by slot.
pub trait Table {
    /// Slot `slot`'s bytes, if it holds any.
    fn get(&mut self, slot: u32, into: &mut [u8; RECORD_BYTES]) -> bool;
    /// Store slot `slot`.
    fn put(&mut self, slot: u32, bytes: &[u8; RECORD_BYTES]) -> bool;
}

impl Locality {
    /// Built from the configuration, if it asks for locality.
    pub fn build(cfg: &Config) -> Result<Option<Locality>, ConfigError> {
        let Some(s) = &cfg.locality else {
            return Ok(None);
        };
        let per = s
            .slots_per_destination
            .unwrap_or(DEFAULT_SLOTS_PER_DESTINATION);
        let n = u32::try_from(cfg.destinations.len()).unwrap_or(u32::MAX);
        let slots = per.checked_mul(n.max(1)).ok_or_else(|| ConfigError {
            field: "locality.slots_per_destination".into(),
            message: format!(
                "{per} slots for each of {n} destinations is more than a table can hold; lower it"
            ),
        })?;
        Ok(Some(Locality {
            slots,
            session_header: s.session_header.clone(),
            rules: cfg.destinations.iter().map(Rule::of).collect(),
        }))
    }

    /// Bytes of the whole table, when every slot is written.
    pub fn table_bytes(&self) -> u64 {
        u64::from(self.slots) * RECORD_BYTES as u64
    }

    fn slot(&self, key: u64) -> u32 {
        (key % u64::from(self.slots.max(1))) as u32
    }

    /// What each `feasible` destination holds of the request's prompt,
    /// into `out` (sized to the destinations); whether any holds some.
    /// `tokens_in` is the request's input estimate (a hint's record is
    /// bounded by it).
    #[allow(clippy::too_many_arguments)]
    pub fn held(
        &self,
        table: &mut impl Table,
        secret: &Secret,
        who: Whose<'_>,
        fp: &Fingerprint,
        feasible: &[u64],
        now_ms: u64,
        out: &mut HeldBuf,
    ) -> bool {
        let n = self.rules.len();
        for v in [&mut out.tokens, &mut out.seconds] {
            v.clear();
            v.resize(n, 0.0);
        }
        out.cached.clear();
        out.cached.resize(n, 0);
        out.seen_len = 0;
        let mut any = false;
        let mut buf = [0u8; RECORD_BYTES];
        let mut look = |key: u64, own_bytes: Option<u32>, out: &mut HeldBuf| {
            buf.fill(0);
            let found = table
                .get(self.slot(key), &mut buf)
                .then(|| Record::decode(&buf))
                .flatten()
                .filter(|r| r.tag == key);
            if let Some(s) = out.seen.get_mut(out.seen_len) {
                *s = (key, found);
                out.seen_len += 1;
            }
            let Some(r) = found else {
                return;
            };
            // A prompt boundary holds what both sizes say (the same
            // prefix); a session's record at most the request's own prompt.
            let bytes = own_bytes.map_or(r.bytes, |b| b.min(r.bytes));
            let tokens = crate::tokens::estimate_tokens(bytes as usize);
            for (d, at) in r.holders {
                let d = usize::from(d);
                let (Some(rule), Some(c)) = (self.rules.get(d), out.cached.get_mut(d)) else {
                    continue;
                };
                let fresh = now_ms.saturating_sub(at) < rule.ttl_ms && at <= now_ms;
                if !fresh || tokens < rule.min_tokens || !ace_core::dispatch::bit(feasible, d) {
                    continue;
                }
                if tokens > *c {
                    *c = tokens;
                    any = true;
                }
            }
        };
        let tenant = who.tenant;
        if fp.len > 0 {
            for (chain, bytes) in fp.boundaries().rev() {
                let key = secret.key(0, tenant, who.model, fp.tools, chain);
                look(key, Some(bytes), out);
            }
        } else if let Some(hint) = fp.hint() {
            let key = secret.key(1, tenant, who.model, fp.tools, hint);
            look(key, None, out);
        }
        if !any {
            return false;
        }
        for (d, rule) in self.rules.iter().enumerate() {
            let c = f64::from(out.cached.get(d).copied().unwrap_or(0));
            if let Some(t) = out.tokens.get_mut(d) {
                *t = c * rule.saved;
            }
            if let Some(s) = out.seconds.get_mut(d) {
                *s = if rule.prefill_tokens_per_s > 0.0 {
                    c / rule.prefill_tokens_per_s
                } else {
                    0.0
                };
            }
        }
        true
    }

    /// Destination `d` was sent the request at `now_ms`: it holds every
    /// boundary kept (and the session's prompt).
    /// `seen` is what [`Locality::held`] read for this request: those
    /// slots are not read again, and one that already names `d` as a
    /// holder within [`REFRESH_MS`] is not written again.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        table: &mut impl Table,
        secret: &Secret,
        who: Whose<'_>,
        fp: &Fingerprint,
        d: usize,
        now_ms: u64,
        seen: &HeldBuf,
    ) {
        let Ok(d) = u16::try_from(d) else {
            return;
        };
        if usize::from(d) >= self.rules.len() || d == EMPTY {
            return;
        }
        let mut write = |key: u64, bytes: u32| {
            let slot = self.slot(key);
            let read = seen.seen(key).unwrap_or_else(|| {
                let mut buf = [0u8; RECORD_BYTES];
                table
                    .get(slot, &mut buf)
                    .then(|| Record::decode(&buf))
                    .flatten()
                    .filter(|r| r.tag == key)
            });
            let fresh = read.is_some_and(|r| {
                r.bytes == bytes
                    && r.holders
                        .iter()
                        .any(|(h, at)| *h == d && *at <= now_ms && now_ms - at < REFRESH_MS)
            });
            if fresh {
                return;
            }
            let mut r = read.unwrap_or_else(|| Record::new(key, bytes));
            r.bytes = bytes;
            r.hold(d, now_ms);
            table.put(slot, &r.encode());
        };
        // Every boundary kept: the next turn finds the whole prompt, and a
        // turn that replaced the last message (a regenerated answer, or a
        // prompt cut in fixed blocks whose last block grew) the one
        // before. A boundary the lookup found fresh here costs nothing.
        for (chain, bytes) in fp.boundaries() {
            write(secret.key(0, who.tenant, who.model, fp.tools, chain), bytes);
        }
        let whole = fp.boundaries().last();
        if let (Some(hint), Some((_, bytes))) = (fp.hint(), whole) {
            write(secret.key(1, who.tenant, who.model, fp.tools, hint), bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Mem(HashMap<u32, [u8; RECORD_BYTES]>);
    impl Table for Mem {
        fn get(&mut self, slot: u32, into: &mut [u8; RECORD_BYTES]) -> bool {
            self.0.get(&slot).map(|b| *into = *b).is_some()
        }
        fn put(&mut self, slot: u32, bytes: &[u8; RECORD_BYTES]) -> bool {
            self.0.insert(slot, *bytes);
            true
        }
    }

    fn fp(body: &str) -> Fingerprint {
        crate::body::scan_request(body.as_bytes(), body.len())
            .map(|b| b.prefix)
            .unwrap_or_default()
    }

    fn turn(n: usize) -> String {
        let sys = "You are a careful assistant. ".repeat(200);
        let mut m = format!(r#"{{"role":"system","content":"{sys}"}}"#);
        for i in 0..n {
            if i > 0 {
                m.push_str(&format!(
                    r#",{{"role":"assistant","content":"answer {i}"}}"#
                ));
            }
            m.push_str(&format!(r#",{{"role":"user","content":"question {i}"}}"#));
        }
        format!(r#"{{"model":"m","messages":[{m}]}}"#)
    }

    fn locality(n: usize) -> Locality {
        Locality {
            slots: 64,
            session_header: None,
            rules: vec![
                Rule {
                    ttl_ms: 1000,
                    min_tokens: 16,
                    saved: 0.5,
                    prefill_tokens_per_s: 0.0,
                };
                n
            ],
        }
    }

    const SECRET: Secret = Secret([7, 11]);

    #[test]
    fn a_conversations_next_turn_finds_its_last_prompt_where_it_was_sent() {
        let l = locality(3);
        let mut t = Mem::default();
        let who = Whose {
            tenant: b"acme",
            model: b"m",
        };
        let mut out = HeldBuf::default();
        let first = fp(&turn(1));
        assert!(!l.held(&mut t, &SECRET, who, &first, &[0b111], 0, &mut out));
        l.record(&mut t, &SECRET, who, &first, 2, 0, &HeldBuf::default());
        let second = fp(&turn(2));
        assert!(l.held(&mut t, &SECRET, who, &second, &[0b111], 10, &mut out));
        let whole_first = first.boundaries().last().map(|(_, b)| b).unwrap_or(0);
        assert_eq!(
            out.cached[2],
            crate::tokens::estimate_tokens(whole_first as usize)
        );
        assert_eq!((out.cached[0], out.cached[1]), (0, 0));
        assert_eq!(out.tokens[2], f64::from(out.cached[2]) * 0.5);
        // Not for an infeasible destination, another tenant or model, or
        // past the cache's lifetime.
        assert!(!l.held(&mut t, &SECRET, who, &second, &[0b011], 10, &mut out));
        for other in [
            Whose {
                tenant: b"rival",
                model: b"m",
            },
            Whose {
                tenant: b"acme",
                model: b"m2",
            },
        ] {
            assert!(!l.held(&mut t, &SECRET, other, &second, &[0b111], 10, &mut out));
        }
        assert!(!l.held(&mut t, &SECRET, who, &second, &[0b111], 1000, &mut out));
        // Another secret finds nothing either.
        assert!(!l.held(
            &mut t,
            &Secret([1, 2]),
            who,
            &second,
            &[0b111],
            10,
            &mut out
        ));
    }

    #[test]
    fn the_fingerprint_keeps_the_first_and_last_boundaries_in_order() {
        let f = fp(&turn(5));
        let b: Vec<u32> = f.boundaries().map(|(_, b)| b).collect();
        assert_eq!(b.len(), KEPT);
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        // A prefix of the conversation shares its boundaries.
        let g = fp(&turn(4));
        let shared: Vec<u64> = g.boundaries().map(|(c, _)| c).collect();
        assert!(f.boundaries().any(|(c, _)| shared.contains(&c)));
        assert_eq!(fp(r#"{"model":"m"}"#), Fingerprint::default());
        let p = fp(&format!(r#"{{"prompt":"{}"}}"#, "x".repeat(5000)));
        assert_eq!(p.boundaries().count(), 3);
        let h = fp(r#"{"model":"m","prompt_cache_key":"k","input":"hi"}"#);
        assert!(h.hint().is_some());
    }

    proptest::proptest! {
        /// Whatever one tenant sends and where, another tenant's lookups
        /// find nothing (no cross-tenant cache-timing signal), and hostile
        /// bodies never panic the scan.
        #[test]
        fn one_tenants_prefixes_never_show_to_another(
            turns in proptest::collection::vec((0usize..4, 1usize..6, 0usize..3), 1..30),
            tenants in proptest::sample::subsequence(vec!["a", "b", "c", ""], 2),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let l = locality(3);
            let mut t = Mem::default();
            let (mine, theirs) = (tenants[0].as_bytes(), tenants[1].as_bytes());
            let mut out = HeldBuf::default();
            let bodies = ["tax", "law", "art", "sea"];
            for (topic, n, d) in &turns {
                let body = turn(*n).replace("careful", bodies[*topic]);
                let f = fp(&body);
                l.record(&mut t, &SECRET, Whose { tenant: mine, model: b"m" }, &f, *d, 5, &HeldBuf::default());
                let other = Whose { tenant: theirs, model: b"m" };
                let found = l.held(&mut t, &SECRET, other, &f, &[0b111], 6, &mut out);
                proptest::prop_assert!(!found, "another tenant's prefix showed");
            }
            let _ = crate::body::scan_request(&junk, junk.len());
        }
    }

    /// A repeated prompt on the same holder costs one read and no write
    /// within [`REFRESH_MS`]; after it, one write refreshes the holder.
    #[test]
    fn a_fresh_holder_is_not_written_again() {
        #[derive(Default)]
        struct Counting(Mem, usize, usize);
        impl Table for Counting {
            fn get(&mut self, slot: u32, into: &mut [u8; RECORD_BYTES]) -> bool {
                self.1 += 1;
                self.0.get(slot, into)
            }
            fn put(&mut self, slot: u32, bytes: &[u8; RECORD_BYTES]) -> bool {
                self.2 += 1;
                self.0.put(slot, bytes)
            }
        }
        let mut l = locality(2);
        l.rules.iter_mut().for_each(|r| r.ttl_ms = 600_000);
        let mut t = Counting::default();
        let who = Whose {
            tenant: b"acme",
            model: b"m",
        };
        let f = fp(
            r#"{"model":"m","messages":[{"role":"user","content":"the same question, asked again and again"}]}"#,
        );
        let mut out = HeldBuf::default();
        l.held(&mut t, &SECRET, who, &f, &[0b11], 0, &mut out);
        l.record(&mut t, &SECRET, who, &f, 1, 0, &out);
        assert_eq!((t.1, t.2), (1, 1), "one lookup, one write");
        for now in [10, REFRESH_MS - 1] {
            assert!(l.held(&mut t, &SECRET, who, &f, &[0b11], now, &mut out));
            l.record(&mut t, &SECRET, who, &f, 1, now, &out);
        }
        assert_eq!((t.1, t.2), (3, 1), "fresh: read, never written");
        l.held(&mut t, &SECRET, who, &f, &[0b11], REFRESH_MS, &mut out);
        l.record(&mut t, &SECRET, who, &f, 1, REFRESH_MS, &out);
        assert_eq!((t.1, t.2), (4, 2), "refreshed once it is old");
    }

    #[test]
    fn records_round_trip_and_a_fourth_holder_replaces_the_oldest() {
        let mut r = Record::new(42, 100);
        for (d, at) in [(0, 5), (1, 3), (2, 9), (3, 10)] {
            r.hold(d, at);
        }
        assert_eq!(r.holders, [(0, 5), (3, 10), (2, 9)]);
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(&[0; 3]), None);
    }
}
