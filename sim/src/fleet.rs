//! The simulated fleet: what each destination does with a request sent to
//! it, whichever policy sent it.
//!
//! Every destination comes from the fleet manifest (tier, capacity, knee,
//! throughput, prices, models); what the manifest does not say, a
//! simulation has to assume, and the assumptions are here, in one place,
//! the same for every policy:
//!
//! - **GPU servers** (in-house, reserved, spot, on-demand) batch
//!   continuously: `capacity` sequences at once, each decoding at a speed
//!   that falls as the batch fills and falls faster past the knee (the
//!   manifest's `throughput_tps` is the whole server's at a full batch);
//!   past the knee, time to first token climbs on an M/M/1 shape
//!   ([`FleetModel::past_knee_wait_ms`]: new sequences wait for prefill
//!   behind a full batch); requests beyond the batch wait in a FIFO queue.
//!   The knee here is the engine's own, which need not be the manifest's:
//!   the manifest is what ACE prices and an operator caps by, the engine
//!   is what the traffic meets ([`FleetModel::knee_factor`]).
//! - **Reserved blocks** have a tokens-per-minute commitment; past it they
//!   answer 429 until the minute turns, unless the manifest gives an
//!   overage price (a PTU spill-over deployment), when they serve on.
//! - **Spot** servers are evicted as an alternating renewal process (up
//!   time log-normal with a median of 1 h for 1-2 GPUs, 0.5 h for 4 and
//!   0.33 h for 8; down time median 0.4 h; `scheduling.md` §4.2), with 2
//!   minutes' notice in `us-*` regions (AWS) and 30 s elsewhere (GCP,
//!   Azure). Requests in flight at eviction fail. Their hourly price moves
//!   as an AR(1) series around the list price.
//! - **Pay-as-you-go APIs** answer after a log-normal time to first token
//!   (median 450 ms), decode at 70 tokens/s, and enforce requests- and
//!   tokens-per-minute limits with 429.
//!
//! The engines' and APIs' figures are a [`FleetModel`], apart from the
//! manifest and from ACE's price model, and the same for every policy:
//! `ace sim --fleet-model FILE` or `--fleet-knee FACTOR` changes them, to
//! see what happens when the manifest is wrong.
//! - **Injected failures** ([`Fault`]): 5xx bursts, outages and slowdowns,
//!   at seeded times.
//! - A GPU server holds as many models as the manifest lists resident; a
//!   request for another loads it first (30 s, and its `cold_load_usd`),
//!   evicting the least recently used.
//! - **Prompt caches** ([`PromptCache`]), for requests whose prompt blocks
//!   the trace names (the Mooncake format; a trace without blocks meets no
//!   cache and is served exactly as before). An engine (in-house, spot,
//!   on-demand) keeps a prefix cache as vLLM's automatic prefix caching
//!   and SGLang's radix cache do: whole blocks, least recently used evicted
//!   past its capacity ([`KV_BLOCKS_PER_GPU`] a GPU); a request's prefill
//!   is only its blocks past the longest cached prefix. A provider
//!   (pay-as-you-go, and reserved blocks, which are a provider's
//!   deployments) caches a prompt prefix of at least [`PROVIDER_MIN_TOKENS`]
//!   for [`PROVIDER_TTL_MS`] after its last use (OpenAI's and Azure
//!   OpenAI's prompt caching: prompts of 1,024 tokens or more, cleared
//!   after 5-10 minutes of inactivity; Anthropic's default cache lifetime,
//!   5 minutes, refreshed on each hit), unbounded. Either reports what it
//!   read in its usage (`prompt_tokens_details.cached_tokens`, as OpenAI
//!   and vLLM do), which the books price at the destination's
//!   `cached_input_factor`. A reserved block's prefill is cut too (it is
//!   simulated as a GPU server); an API's time to first token has no
//!   prompt-size term here, so a cache hit there shows in the bill only.

use crate::rng::Rng;
use crate::trace::DAY_MS;
use ace_core::cost::{CostModel, Tier};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// What the simulated engines and APIs do, apart from what the manifest
/// says of them. The manifest's knee is what ACE prices and what a careful
/// operator caps a gateway by; the engine's knee is where its latency
/// really starts climbing, and a simulation in which the two are always
/// equal would reward whoever reads the manifest. Every policy meets the
/// same fleet model.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetModel {
    /// The engines' knee as a multiple of the manifest's (capped at 0.99
    /// of a full batch): 1, the manifest measured it right; 0.75, latency
    /// starts climbing at three quarters of the utilisation the manifest
    /// assumes.
    pub knee_factor: f64,
    /// Extra time to first token per unit of M/M/1 queue past the
    /// engine's knee, ms.
    pub knee_wait_ms: f64,
    /// How much slower a sequence decodes in a full batch than alone,
    /// before the knee's share (0.5: half as slow again).
    pub batch_slowdown: f64,
    /// How much slower again from the knee to a full batch.
    pub past_knee_slowdown: f64,
    /// Prompt tokens per second a GPU server prefills.
    pub prefill_tps: f64,
    /// Pay-as-you-go time to first token, median, ms.
    pub api_ttft_median_ms: f64,
    /// Its log-normal shape (sigma).
    pub api_ttft_sigma: f64,
    /// Pay-as-you-go decode speed, tokens per second.
    pub api_tokens_per_s: f64,
}

impl Default for FleetModel {
    fn default() -> FleetModel {
        FleetModel {
            knee_factor: 1.0,
            knee_wait_ms: 250.0,
            batch_slowdown: 0.5,
            past_knee_slowdown: 1.5,
            prefill_tps: 12_000.0,
            api_ttft_median_ms: 450.0,
            api_ttft_sigma: 0.5,
            api_tokens_per_s: 70.0,
        }
    }
}

impl FleetModel {
    /// The model, or the first field out of its range, named.
    pub fn checked(self) -> Result<FleetModel, String> {
        let fields = [
            ("knee_factor", self.knee_factor, 0.01, 10.0),
            ("knee_wait_ms", self.knee_wait_ms, 0.0, 600_000.0),
            ("batch_slowdown", self.batch_slowdown, 0.0, 100.0),
            ("past_knee_slowdown", self.past_knee_slowdown, 0.0, 100.0),
            ("prefill_tps", self.prefill_tps, 1.0, 1e9),
            (
                "api_ttft_median_ms",
                self.api_ttft_median_ms,
                1.0,
                600_000.0,
            ),
            ("api_ttft_sigma", self.api_ttft_sigma, 0.0, 5.0),
            ("api_tokens_per_s", self.api_tokens_per_s, 0.01, 1e6),
        ];
        for (name, v, lo, hi) in fields {
            if !(v.is_finite() && (lo..=hi).contains(&v)) {
                return Err(format!("{name} = {v}: must be a number from {lo} to {hi}"));
            }
        }
        Ok(self)
    }

    /// The engine's knee for a destination whose manifest says `manifest`.
    pub fn knee(&self, manifest: f64) -> f64 {
        (manifest * self.knee_factor).clamp(0.01, 0.99)
    }

    /// How much slower a sequence decodes at utilisation `u` than alone,
    /// relative: rises gently with the batch, steeply past `knee`.
    pub fn slowdown(&self, u: f64, knee: f64) -> f64 {
        let past = ((u - knee) / (1.0 - knee).max(0.01)).max(0.0);
        1.0 + self.batch_slowdown * u.min(1.0) + self.past_knee_slowdown * past.min(1.0)
    }

    /// Extra time to first token at utilisation `u` past `knee`, ms: the
    /// M/M/1 shape measured from the knee, capped at utilisation 0.99.
    pub fn past_knee_wait_ms(&self, u: f64, knee: f64) -> f64 {
        if u <= knee {
            return 0.0;
        }
        let wait = |r: f64| {
            let r = r.min(0.99);
            r / (1.0 - r)
        };
        (wait(u) - wait(knee)) * self.knee_wait_ms
    }

    /// Pay-as-you-go decode time per token, ms.
    pub fn api_tpot_ms(&self) -> f64 {
        1000.0 / self.api_tokens_per_s
    }
}

/// What the simulation assumes of one destination.
#[derive(Clone, Debug)]
pub struct Params {
    /// Manifest name.
    pub name: String,
    /// Tier.
    pub tier: Tier,
    /// Concurrent sequences (GPU servers); `None` for an API.
    pub slots: Option<u32>,
    /// Time per output token per sequence at a full batch, ms.
    pub tpot_full_ms: f64,
    /// The engine's knee: utilisation past which decoding slows faster
    /// and time to first token climbs ([`FleetModel::knee`] of the
    /// manifest's, which is `cost.knee`).
    pub knee: f64,
    /// What the engines and APIs do.
    pub model: FleetModel,
    /// Reserved: tokens per minute committed (`None`: no cap).
    pub tpm_cap: Option<u64>,
    /// Reserved: serves past the cap at an overage price.
    pub overage: bool,
    /// Spot: its eviction process.
    pub spot: Option<SpotProcess>,
    /// API: requests and tokens per minute before 429.
    pub api_limits: Option<(u32, u64)>,
    /// In the EU (for the gateways' region rules).
    pub eu: bool,
    /// Certified for PHI (a BAA).
    pub baa: bool,
    /// Models it serves.
    pub models: Vec<String>,
    /// Models resident at the start.
    pub warm: Vec<String>,
    /// Cold-load cost, USD.
    pub cold_load_usd: f64,
    /// Its SLO, ms (time to response headers), from the configuration.
    pub slo_ms: Option<u64>,
    /// The cost curve (the filter's).
    pub cost: CostModel,
    /// An engine's prefix cache, in blocks ([`KV_BLOCKS_PER_GPU`] a GPU).
    pub cache_blocks: u32,
}

/// A spot server's eviction statistics.
#[derive(Clone, Copy, Debug)]
pub struct SpotProcess {
    /// Notice before eviction, ms.
    pub notice_ms: u64,
    /// Median up time, ms.
    pub up_median_ms: f64,
    /// Median down time, ms.
    pub down_median_ms: f64,
}

/// An injected failure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    /// Destination index.
    pub dest: usize,
    /// From, ms into the run.
    pub from_ms: u64,
    /// To, ms.
    pub to_ms: u64,
    /// What goes wrong.
    pub kind: FaultKind,
}

/// The kinds of injected failure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    /// This fraction of requests answer 500.
    Errors(f64),
    /// Nothing answers (connection refused: 503).
    Outage,
    /// Everything takes this many times longer.
    Slowdown(f64),
}

/// Pay-as-you-go limits per minute: requests, tokens.
pub const API_LIMITS: (u32, u64) = (10_000, 20_000_000);
/// Per-sequence decode speed at a full batch when the manifest gives no
/// throughput, tokens/s.
pub const DEFAULT_SEQ_TPS: f64 = 25.0;
/// Time to load a model that is not resident, ms.
pub const COLD_LOAD_MS: u64 = 30_000;

/// An engine's prefix cache per GPU, in 512-token blocks: 20 GB of KV
/// memory a GPU (an 80 GB GPU at vLLM's default `gpu_memory_utilization`
/// 0.9 holding its share of a tensor-parallel 70B-class model's weights
/// and the running batch's own KV) over a 70B-class model's KV per block
/// (Llama-3.1-70B: 80 layers x 8 KV heads x 128 dimensions x K and V x 2
/// bytes = 320 KiB a token, 160 MiB a block): 128 blocks, 65,536 tokens a
/// GPU. An assumption, the same for every policy.
pub const KV_BLOCKS_PER_GPU: u32 = 128;

/// A provider's prompt cache lifetime after last use, ms (5 minutes).
pub const PROVIDER_TTL_MS: u64 = 300_000;

/// The shortest prefix a provider caches, tokens.
pub const PROVIDER_MIN_TOKENS: u32 = 1024;

/// Tokens a prompt block holds ([`crate::trace::BLOCK_TOKENS`]).
const BLOCK: u32 = crate::trace::BLOCK_TOKENS;

/// A destination's prompt cache, keyed by (model, block).
#[derive(Clone, Debug)]
pub enum PromptCache {
    /// An engine's: at most `capacity` blocks, least recently used out.
    Engine {
        /// Blocks it holds.
        capacity: u32,
        /// Block key to its last use's stamp.
        stamp: HashMap<u64, u64>,
        /// Stamp to block key, oldest first.
        order: BTreeMap<u64, u64>,
        /// The next stamp.
        next: u64,
    },
    /// A provider's: every prefix of at least [`PROVIDER_MIN_TOKENS`], for
    /// [`PROVIDER_TTL_MS`] after its last use.
    Provider {
        /// Block key to its last use, ms.
        last: HashMap<u64, u64>,
        /// Size at which expired blocks are next swept.
        sweep_at: usize,
    },
}

impl PromptCache {
    /// The cache of a destination of `tier`; an engine's holds
    /// `cache_blocks` blocks.
    pub fn of(tier: Tier, cache_blocks: u32) -> PromptCache {
        match tier {
            Tier::Payg | Tier::Reserved => PromptCache::Provider {
                last: HashMap::new(),
                sweep_at: 1 << 16,
            },
            Tier::InHouse | Tier::Spot | Tier::OnDemand => PromptCache::Engine {
                capacity: cache_blocks,
                stamp: HashMap::new(),
                order: BTreeMap::new(),
                next: 0,
            },
        }
    }

    /// A request for `model` with prompt `blocks` (keys) of `prompt`
    /// tokens is served at `now`: the tokens read from the cache (the
    /// longest cached prefix), and its blocks are cached.
    pub fn serve(&mut self, now: u64, model: &str, blocks: &[u64], prompt: u32) -> u32 {
        if blocks.is_empty() {
            return 0;
        }
        let m = model_key(model);
        let key = |b: u64| mix64(b ^ m);
        match self {
            PromptCache::Engine {
                capacity,
                stamp,
                order,
                next,
            } => {
                let hit = blocks
                    .iter()
                    .take_while(|b| stamp.contains_key(&key(**b)))
                    .count() as u32;
                // Whole blocks only are kept (a partial last one is not).
                let whole = (prompt / BLOCK) as usize;
                for b in blocks.iter().take(whole) {
                    let k = key(*b);
                    if let Some(old) = stamp.insert(k, *next) {
                        order.remove(&old);
                    }
                    order.insert(*next, k);
                    *next += 1;
                }
                while order.len() > *capacity as usize {
                    let Some((_, k)) = order.pop_first() else {
                        break;
                    };
                    stamp.remove(&k);
                }
                (hit * BLOCK).min(prompt)
            }
            PromptCache::Provider { last, sweep_at } => {
                let hit = blocks
                    .iter()
                    .take_while(|b| {
                        last.get(&key(**b))
                            .is_some_and(|t| now.saturating_sub(*t) < PROVIDER_TTL_MS)
                    })
                    .count() as u32;
                let cached = (hit * BLOCK).min(prompt);
                // A prompt below the minimum is not cached at all.
                if prompt >= PROVIDER_MIN_TOKENS {
                    for b in blocks {
                        last.insert(key(*b), now);
                    }
                }
                if last.len() >= *sweep_at {
                    last.retain(|_, t| now.saturating_sub(*t) < PROVIDER_TTL_MS);
                    *sweep_at = (last.len() * 2).max(1 << 16);
                }
                if cached >= PROVIDER_MIN_TOKENS {
                    cached
                } else {
                    0
                }
            }
        }
    }

    /// Blocks it holds (expired ones included until swept).
    pub fn len(&self) -> usize {
        match self {
            PromptCache::Engine { stamp, .. } => stamp.len(),
            PromptCache::Provider { last, .. } => last.len(),
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The longest prefix of `blocks` (keys) for `model` it holds at `now`,
    /// in blocks, without touching it (what an engine-side router's
    /// view of its workers' caches reads).
    pub fn held_blocks(&self, now: u64, model: &str, blocks: &[u64]) -> u32 {
        let m = model_key(model);
        let key = |b: u64| mix64(b ^ m);
        match self {
            PromptCache::Engine { stamp, .. } => blocks
                .iter()
                .take_while(|b| stamp.contains_key(&key(**b)))
                .count() as u32,
            PromptCache::Provider { last, .. } => blocks
                .iter()
                .take_while(|b| {
                    last.get(&key(**b))
                        .is_some_and(|t| now.saturating_sub(*t) < PROVIDER_TTL_MS)
                })
                .count() as u32,
        }
    }
}

/// A model's part of a block's key (FNV-1a).
fn model_key(model: &str) -> u64 {
    model.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a destination answers an attempt: the status, and when the first
/// byte and the last arrive after admission.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Time to first byte (response headers), ms after the attempt.
    pub first_ms: u64,
    /// Time to the end of the response, ms after the attempt.
    pub done_ms: u64,
    /// `retry-after`, s (429).
    pub retry_after_s: Option<u32>,
    /// Whether a model had to be loaded first.
    pub cold: bool,
    /// Whether a reserved block served past its commitment.
    pub overage: bool,
    /// Input tokens read from its prompt cache.
    pub cached: u32,
}

impl Answer {
    /// A failure answered at once.
    pub fn failed(status: u16) -> Answer {
        Answer {
            status,
            first_ms: 0,
            done_ms: 0,
            retry_after_s: None,
            cold: false,
            overage: false,
            cached: 0,
        }
    }
}

/// One destination's state during a run.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Its parameters.
    pub p: Params,
    /// Sequences running.
    pub running: u32,
    /// Attempts waiting for a slot (id, generation).
    pub queue: VecDeque<(u32, u32)>,
    /// Current minute and its usage: requests, tokens.
    minute: u64,
    minute_requests: u32,
    minute_tokens: u64,
    prev_minute_tokens: u64,
    /// Spot: (notice, eviction, return) times, ms.
    pub evictions: Vec<(u64, u64, u64)>,
    /// Spot: hourly price multipliers.
    pub price_factor: Vec<f64>,
    /// Models resident now, and when each was last used.
    pub resident: Vec<String>,
    last_used: Vec<u64>,
    /// Faults on this destination.
    pub faults: Vec<Fault>,
    /// Its prompt cache.
    pub prompt_cache: PromptCache,
}

impl Upstream {
    /// A fresh destination for a run of `days` days seeded by `rng`.
    pub fn new(p: Params, rng: &mut Rng, days: u64) -> Upstream {
        let horizon = DAY_MS * days.max(1);
        let mut evictions = Vec::new();
        if let Some(s) = p.spot {
            let mut t = rng.log_normal(s.up_median_ms, 1.2);
            while (t as u64) < horizon {
                let evict = t as u64;
                let back = evict + rng.log_normal(s.down_median_ms, 1.0).max(60_000.0) as u64;
                evictions.push((evict.saturating_sub(s.notice_ms), evict, back));
                t = back as f64 + rng.log_normal(s.up_median_ms, 1.2);
            }
        }
        let mut price_factor = Vec::new();
        if p.tier == Tier::Spot {
            let mut m: f64 = 1.0;
            for _ in 0..(horizon / 3_600_000 + 1) {
                price_factor.push(m);
                m = (1.0 + 0.7 * (m - 1.0) + 0.08 * rng.normal()).clamp(0.6, 1.8);
            }
        }
        Upstream {
            prompt_cache: PromptCache::of(p.tier, p.cache_blocks),
            resident: p.warm.clone(),
            last_used: vec![0; p.warm.len()],
            p,
            running: 0,
            queue: VecDeque::new(),
            minute: u64::MAX,
            minute_requests: 0,
            minute_tokens: 0,
            prev_minute_tokens: 0,
            evictions,
            price_factor,
            faults: Vec::new(),
        }
    }

    /// Requests in the server: running and waiting (what its metrics
    /// report).
    pub fn load(&self) -> u32 {
        self.running + self.queue.len() as u32
    }

    /// A committed block's use of its commitment over the last minute at
    /// `now` (what Azure reports as PTU utilisation), 0 without a
    /// commitment.
    pub fn commitment_used(&self, now: u64) -> f64 {
        let Some(cap) = self.p.tpm_cap.filter(|c| *c > 0) else {
            return 0.0;
        };
        let minute = now / 60_000;
        let into = (now % 60_000) as f64 / 60_000.0;
        let (cur, prev) = if minute == self.minute {
            (self.minute_tokens, self.prev_minute_tokens)
        } else if minute == self.minute.wrapping_add(1) {
            (0, self.minute_tokens)
        } else {
            (0, 0)
        };
        (cur as f64 + prev as f64 * (1.0 - into)) / cap as f64
    }

    /// Whether it answers at all at `now` (not evicted, no outage).
    pub fn up(&self, now: u64) -> bool {
        !self
            .evictions
            .iter()
            .any(|(_, e, b)| (*e..*b).contains(&now))
            && self
                .fault(now, |k| matches!(k, FaultKind::Outage))
                .is_none()
    }

    /// An eviction notice in force at `now`: until when it will be gone.
    pub fn notice(&self, now: u64) -> Option<u64> {
        self.evictions
            .iter()
            .find(|(n, _, b)| (*n..*b).contains(&now))
            .map(|(_, _, b)| *b)
    }

    /// The spot price factor at `now`.
    pub fn price_factor(&self, now: u64) -> f64 {
        self.price_factor
            .get((now / 3_600_000) as usize)
            .copied()
            .unwrap_or(1.0)
    }

    /// The cost curve as priced at `now` (spot prices move).
    pub fn cost_at(&self, now: u64) -> CostModel {
        let mut m = self.p.cost;
        m.usd_per_gpu_hour *= self.price_factor(now);
        m
    }

    fn fault(&self, now: u64, f: impl Fn(&FaultKind) -> bool) -> Option<FaultKind> {
        self.faults
            .iter()
            .find(|x| (x.from_ms..x.to_ms).contains(&now) && f(&x.kind))
            .map(|x| x.kind)
    }

    /// Whether an attempt arriving now must wait for a slot.
    pub fn must_queue(&self) -> bool {
        self.p.slots.is_some_and(|s| self.running >= s)
    }

    /// Admit an attempt for `prompt` + `output` tokens of `model` at `now`
    /// (`waited_ms` in the queue first): what it will answer. A 2xx
    /// holds a running slot until `done_ms`; anything else frees it at
    /// `first_ms` (the caller calls [`Upstream::finish`] either way).
    pub fn admit(
        &mut self,
        now: u64,
        prompt: u32,
        output: u32,
        model: &str,
        rng: &mut Rng,
    ) -> Answer {
        self.admit_blocks(now, prompt, output, model, &[], rng)
    }

    /// [`Upstream::admit`] for a prompt of `blocks` (keys; empty: none
    /// named, no cache): what its prompt cache holds of them is not
    /// prefilled, and is reported as [`Answer::cached`].
    pub fn admit_blocks(
        &mut self,
        now: u64,
        prompt: u32,
        output: u32,
        model: &str,
        blocks: &[u64],
        rng: &mut Rng,
    ) -> Answer {
        let fail = |status: u16, after: u64, retry: Option<u32>| Answer {
            status,
            first_ms: after,
            done_ms: after,
            retry_after_s: retry,
            cold: false,
            overage: false,
            cached: 0,
        };
        if !self.up(now) {
            return fail(503, 5, None);
        }
        let minute = now / 60_000;
        if minute != self.minute {
            self.prev_minute_tokens = if minute == self.minute.wrapping_add(1) {
                self.minute_tokens
            } else {
                0
            };
            self.minute = minute;
            self.minute_requests = 0;
            self.minute_tokens = 0;
        }
        let tokens = u64::from(prompt) + u64::from(output);
        let to_next_minute = (60 - (now / 1000) % 60).max(1) as u32;
        let mut overage = false;
        if let Some((rpm, tpm)) = self.p.api_limits {
            if self.minute_requests >= rpm || self.minute_tokens + tokens > tpm {
                return fail(429, 20, Some(to_next_minute));
            }
        }
        if let Some(cap) = self.p.tpm_cap {
            if self.minute_tokens + tokens > cap {
                if self.p.overage {
                    overage = true;
                } else {
                    return fail(429, 10, Some(to_next_minute));
                }
            }
        }
        self.minute_requests += 1;
        self.minute_tokens += tokens;
        let slow = match self.fault(now, |k| matches!(k, FaultKind::Slowdown(_))) {
            Some(FaultKind::Slowdown(f)) => f,
            _ => 1.0,
        };
        if let Some(FaultKind::Errors(p)) = self.fault(now, |k| matches!(k, FaultKind::Errors(_))) {
            if rng.chance(p) {
                return fail(500, (50.0 * slow) as u64, None);
            }
        }
        let out = f64::from(output);
        let cached = self.prompt_cache.serve(now, model, blocks, prompt);
        let (ttft, tpot, cold) = match self.p.slots {
            None => {
                let m = &self.p.model;
                let ttft = rng.log_normal(m.api_ttft_median_ms, m.api_ttft_sigma);
                (ttft, m.api_tpot_ms(), false)
            }
            Some(slots) => {
                self.running += 1;
                let u = f64::from(self.running) / f64::from(slots.max(1));
                let (m, knee) = (self.p.model, self.p.knee);
                let rel = m.slowdown(u, knee) / m.slowdown(1.0, knee);
                let tpot = self.p.tpot_full_ms * rel;
                let prefill =
                    f64::from(prompt - cached.min(prompt)) / m.prefill_tps * 1000.0 * (1.0 + u);
                let cold = self.touch(model, now);
                let load = if cold { COLD_LOAD_MS as f64 } else { 0.0 };
                let wait = m.past_knee_wait_ms(u, knee);
                (30.0 + prefill + wait + load, tpot, cold)
            }
        };
        let first = (ttft * slow).max(1.0);
        Answer {
            status: 200,
            first_ms: first as u64,
            done_ms: (first + out * tpot * slow) as u64,
            retry_after_s: None,
            cold,
            overage,
            cached,
        }
    }

    /// `model` is used at `now`: whether it had to be loaded. A server
    /// holds as many models as the manifest lists resident (at least
    /// one); loading another evicts the least recently used.
    fn touch(&mut self, model: &str, now: u64) -> bool {
        if let Some(i) = self.resident.iter().position(|m| m == model) {
            if let Some(t) = self.last_used.get_mut(i) {
                *t = now;
            }
            return false;
        }
        let room = self.p.warm.len().max(1);
        if self.resident.len() >= room {
            let lru = self
                .last_used
                .iter()
                .enumerate()
                .min_by_key(|(_, t)| **t)
                .map_or(0, |(i, _)| i);
            if lru < self.resident.len() {
                self.resident.remove(lru);
                self.last_used.remove(lru);
            }
        }
        self.resident.push(model.to_string());
        self.last_used.push(now);
        true
    }

    /// An attempt that held a slot is over.
    pub fn finish(&mut self) {
        self.running = self.running.saturating_sub(1);
    }
}

/// Whether an answer with `status` holds a running slot on a destination
/// with `slots` (a GPU server's 2xx does until its last byte; an API holds
/// none, and a failure frees its slot at once).
pub fn holds_slot(slots: Option<u32>, status: u16) -> bool {
    slots.is_some() && (200..300).contains(&status)
}

/// A GPU server of `slots` sequences serving model `m`, for tests.
#[cfg(test)]
pub(crate) fn test_gpu(slots: u32) -> Params {
    Params {
        name: "g".into(),
        tier: Tier::InHouse,
        slots: Some(slots),
        tpot_full_ms: 40.0,
        knee: 0.8,
        model: FleetModel::default(),
        tpm_cap: None,
        overage: false,
        spot: None,
        api_limits: None,
        eu: false,
        baa: false,
        models: vec!["m".into()],
        warm: vec!["m".into()],
        cold_load_usd: 0.0,
        slo_ms: None,
        cost: CostModel {
            knee: 0.8,
            ..CostModel::default()
        },
        cache_blocks: 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(slots: u32) -> Params {
        test_gpu(slots)
    }

    #[test]
    fn decoding_slows_as_the_batch_fills_and_faster_past_the_knee() {
        let mut u = Upstream::new(gpu(10), &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        let alone = u.admit(0, 100, 100, "m", &mut rng);
        for _ in 0..7 {
            u.admit(0, 100, 100, "m", &mut rng);
        }
        let at_knee = u.admit(0, 100, 100, "m", &mut rng);
        let full = u.admit(0, 100, 100, "m", &mut rng);
        let d = |a: Answer| a.done_ms - a.first_ms;
        assert!(
            d(alone) < d(at_knee) && d(at_knee) < d(full),
            "{alone:?} {at_knee:?} {full:?}"
        );
        assert_eq!(
            d(full),
            4000,
            "a full batch decodes at the manifest's throughput"
        );
        assert!(u.must_queue());
        u.finish();
        assert!(!u.must_queue());
    }

    #[test]
    fn an_engine_whose_knee_is_below_the_manifests_queues_earlier() {
        // The manifest says 0.8; the engine stutters from 0.6.
        let model = FleetModel {
            knee_factor: 0.75,
            ..FleetModel::default()
        };
        let mut p = gpu(10);
        p.knee = model.knee(p.cost.knee);
        p.model = model;
        assert!((p.knee - 0.6).abs() < 1e-12);
        let mut honest = Upstream::new(gpu(10), &mut Rng::new(1), 1);
        let mut wrong = Upstream::new(p, &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        let (mut a, mut b) = (Answer::failed(0), Answer::failed(0));
        for _ in 0..7 {
            a = honest.admit(0, 100, 100, "m", &mut rng.clone());
            b = wrong.admit(0, 100, 100, "m", &mut rng);
        }
        // Seven of ten slots: below the manifest's knee, past the engine's.
        assert!(b.first_ms > a.first_ms + 100, "{a:?} {b:?}");
        assert!(
            b.done_ms - b.first_ms > a.done_ms - a.first_ms,
            "{a:?} {b:?}"
        );
    }

    #[test]
    fn a_fleet_model_out_of_range_is_named() {
        let bad = FleetModel {
            knee_factor: 0.0,
            ..FleetModel::default()
        };
        let e = bad.checked().unwrap_err();
        assert!(e.starts_with("knee_factor = 0"), "{e}");
        let nan = FleetModel {
            api_tokens_per_s: f64::NAN,
            ..FleetModel::default()
        };
        assert!(nan.checked().unwrap_err().starts_with("api_tokens_per_s"));
        assert_eq!(FleetModel::default().checked(), Ok(FleetModel::default()));
    }

    #[test]
    fn a_reserved_block_answers_429_past_its_commitment_unless_it_has_overage() {
        let mut p = gpu(100);
        p.tier = Tier::Reserved;
        p.tpm_cap = Some(1000);
        let mut u = Upstream::new(p.clone(), &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        assert_eq!(u.admit(1000, 400, 100, "m", &mut rng).status, 200);
        assert_eq!(u.admit(1000, 400, 100, "m", &mut rng).status, 200);
        let a = u.admit(1000, 1, 0, "m", &mut rng);
        assert_eq!((a.status, a.retry_after_s), (429, Some(59)));
        assert_eq!(
            u.admit(61_000, 400, 100, "m", &mut rng).status,
            200,
            "a new minute"
        );
        p.overage = true;
        let mut u = Upstream::new(p, &mut Rng::new(1), 1);
        u.admit(0, 900, 0, "m", &mut rng);
        let a = u.admit(0, 900, 0, "m", &mut rng);
        assert_eq!((a.status, a.overage), (200, true));
    }

    #[test]
    fn spot_servers_are_evicted_with_notice_and_come_back() {
        let mut p = gpu(4);
        p.tier = Tier::Spot;
        p.spot = Some(SpotProcess {
            notice_ms: 120_000,
            up_median_ms: 3_600_000.0,
            down_median_ms: 1_440_000.0,
        });
        let u = Upstream::new(p, &mut Rng::new(5), 1);
        assert!(!u.evictions.is_empty(), "a day has evictions");
        let (n, e, b) = u.evictions[0];
        assert_eq!(e - n, 120_000);
        assert!(u.up(n) && u.notice(n) == Some(b));
        assert!(!u.up(e) && u.up(b));
        assert_eq!(u.price_factor.len(), 25);
    }

    #[test]
    fn a_cold_model_is_loaded_and_evicts_the_least_recently_used() {
        let mut u = Upstream::new(gpu(4), &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        let a = u.admit(0, 10, 10, "other", &mut rng);
        assert!(a.cold && a.first_ms >= COLD_LOAD_MS);
        let b = u.admit(1, 10, 10, "other", &mut rng);
        assert!(!b.cold);
        assert_eq!(u.resident, vec!["other".to_string()], "room for one model");
        assert!(u.admit(2, 10, 10, "m", &mut rng).cold, "swapped back");
    }

    #[test]
    fn an_engine_prefills_only_what_its_prefix_cache_misses() {
        let mut u = Upstream::new(gpu(10), &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        let a = u.admit_blocks(0, 2048, 10, "m", &[1, 2, 3, 4], &mut rng);
        u.finish();
        assert_eq!(a.cached, 0);
        let b = u.admit_blocks(10, 2300, 10, "m", &[1, 2, 3, 9, 10], &mut rng);
        u.finish();
        assert_eq!(b.cached, 3 * 512);
        assert!(b.first_ms < a.first_ms, "{a:?} {b:?}");
        // Another model shares nothing; 8 blocks of room: the oldest go.
        assert_eq!(
            u.admit_blocks(20, 600, 1, "other", &[1, 2], &mut rng)
                .cached,
            0
        );
        u.finish();
        u.admit_blocks(
            30,
            4096,
            1,
            "m",
            &[20, 21, 22, 23, 24, 25, 26, 27],
            &mut rng,
        );
        u.finish();
        assert_eq!(
            u.admit_blocks(40, 1024, 1, "m", &[1, 2], &mut rng).cached,
            0
        );
    }

    #[test]
    fn a_provider_caches_a_long_prefix_for_five_minutes_after_last_use() {
        let mut p = gpu(10);
        p.tier = Tier::Payg;
        p.slots = None;
        p.api_limits = Some(API_LIMITS);
        let mut u = Upstream::new(p, &mut Rng::new(1), 1);
        let mut rng = Rng::new(2);
        assert_eq!(
            u.admit_blocks(0, 1500, 1, "m", &[1, 2, 3], &mut rng).cached,
            0
        );
        assert_eq!(
            u.admit_blocks(1000, 1500, 1, "m", &[1, 2, 3], &mut rng)
                .cached,
            1500
        );
        assert_eq!(
            u.admit_blocks(2000, 1500, 1, "m", &[1, 4, 5], &mut rng)
                .cached,
            0,
            "512 < 1024"
        );
        assert_eq!(
            u.admit_blocks(299_000, 2048, 1, "m", &[1, 2, 6, 7], &mut rng)
                .cached,
            1024
        );
        // Refreshed at 299 s: still there at 598 s, gone at 600 s.
        assert_eq!(
            u.admit_blocks(598_000, 1100, 1, "m", &[1, 2, 8], &mut rng)
                .cached,
            1024
        );
        assert_eq!(
            u.admit_blocks(898_001, 1100, 1, "m", &[1, 2, 8], &mut rng)
                .cached,
            0
        );
    }
}
