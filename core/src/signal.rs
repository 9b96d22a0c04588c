//! What the world outside the proxy says about each destination (a drain
//! or an eviction notice, the model server's own load, a capacity or a
//! price change): each a [`Signal`] from the control service, kept per
//! destination in [`Live`] and folded into the price ([`Live::adjust`]).
//!
//! The fleet state keeps one [`Live`] per destination
//! ([`crate::fleet::FleetState::live`]) and the decision prices with it
//! ([`crate::dispatch`]): both use this module, which uses neither.

use crate::cost::CostModel;

/// What the world outside the proxy says about one destination (the
/// control service's signals), folded into its price. Every field starts
/// neutral; [`Live::apply`] changes one.
///
/// A signal moves price, capacity and openness only: which destinations
/// may serve a request is the compiled policy's alone, and nothing here
/// can make a forbidden destination feasible.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Live {
    /// Closed to new requests until this instant (ms): a spot eviction
    /// notice or an operator's drain. 0: not drained.
    pub drained_until_ms: u64,
    /// Requests the model server reports running or waiting (over every
    /// client, ACE's own included); the price uses the larger of this and
    /// ACE's own count.
    pub reported_load: u32,
    /// Until when `reported_load` is priced, ms, when the figures are held
    /// (the server stopped answering its scrapes): from then on only ACE's
    /// own count remains. `None`: current figures, no end.
    pub load_until_ms: Option<u64>,
    /// Concurrent requests the destination holds now, when the owned or
    /// committed capacity changed since the configuration was written.
    pub capacity: Option<u32>,
    /// The current per-token prices (input, output), USD, when they
    /// changed since the configuration was written.
    pub usd_per_token: Option<(f64, f64)>,
    /// The current hourly price of the destination's GPUs, USD, when it
    /// changed since the configuration was written (GPU-hour tiers).
    pub usd_per_hour: Option<f64>,
}

/// One signal about one destination, as the control service reports it.
/// A new kind of signal is a variant here, its field in [`Live`], and its
/// effect in [`Live::adjust`]: the compiler lists the matches to extend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Signal {
    /// No new requests until `until_ms` (an eviction notice, a drain); a
    /// time in the past lifts it.
    Drain {
        /// When the destination may take requests again, ms.
        until_ms: u64,
    },
    /// The model server's own count of requests running and waiting.
    Load {
        /// Requests in the server now.
        requests: u32,
        /// For held figures (the server's last good scrape, while its
        /// scrapes fail), the instant after which they are no longer
        /// priced, ms; `None` for current figures.
        until_ms: Option<u64>,
    },
    /// The destination's concurrent-request capacity changed (GPUs added
    /// or taken away).
    Capacity {
        /// Requests it can hold now.
        slots: u32,
    },
    /// The hourly price of the destination's GPUs changed (spot and
    /// on-demand destinations, which are priced by the GPU-hour).
    HourlyPrice {
        /// USD per hour for all of the destination's GPUs.
        usd_per_hour: f64,
    },
    /// The destination's per-token prices changed (destinations priced by
    /// the token).
    Price {
        /// USD per input token.
        usd_per_input_token: f64,
        /// USD per output token.
        usd_per_output_token: f64,
    },
}

/// A signal that cannot be applied, naming why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalError {
    /// No destination has this index.
    NoSuchDestination(usize),
    /// A price that is negative, NaN or infinite.
    BadPrice,
}

impl core::fmt::Display for SignalError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SignalError::NoSuchDestination(d) => write!(f, "no destination has index {d}"),
            SignalError::BadPrice => {
                f.write_str("a price must be a finite, non-negative number of USD")
            }
        }
    }
}

impl Live {
    /// Fold `signal` in.
    pub fn apply(&mut self, signal: Signal) -> Result<(), SignalError> {
        match signal {
            Signal::Drain { until_ms } => self.drained_until_ms = until_ms,
            Signal::Load { requests, until_ms } => {
                self.reported_load = requests;
                self.load_until_ms = until_ms;
            }
            Signal::Capacity { slots } => self.capacity = Some(slots),
            Signal::HourlyPrice { usd_per_hour: h } => {
                if !(h.is_finite() && h >= 0.0) {
                    return Err(SignalError::BadPrice);
                }
                self.usd_per_hour = Some(h);
            }
            Signal::Price {
                usd_per_input_token: i,
                usd_per_output_token: o,
            } => {
                if !(i.is_finite() && o.is_finite() && i >= 0.0 && o >= 0.0) {
                    return Err(SignalError::BadPrice);
                }
                self.usd_per_token = Some((i, o));
            }
        }
        Ok(())
    }

    /// Whether no signal has said anything (every field at its default).
    #[inline]
    pub fn is_neutral(&self) -> bool {
        self.drained_until_ms == 0
            && self.reported_load == 0
            && self.load_until_ms.is_none()
            && self.capacity.is_none()
            && self.usd_per_token.is_none()
            && self.usd_per_hour.is_none()
    }

    /// `model` and `in_flight` as the signals have them at `now_ms`, and
    /// whether the destination is drained.
    pub fn adjust(&self, model: &CostModel, in_flight: u32, now_ms: u64) -> (CostModel, u32, bool) {
        let mut m = *model;
        if let Some((i, o)) = self.usd_per_token {
            m.usd_per_input_token = i;
            m.usd_per_output_token = o;
        }
        if let Some(h) = self.usd_per_hour {
            m.usd_per_gpu_hour = h;
        }
        let mut drained = now_ms < self.drained_until_ms;
        match self.capacity {
            // No slots left (its GPUs taken away): closed, not unlimited.
            Some(0) if model.capacity != 0 => drained = true,
            Some(c) => m.capacity = c,
            None => {}
        }
        (m, in_flight.max(self.reported_load_at(now_ms)), drained)
    }

    /// The reported load priced at `now_ms`: held figures count until
    /// their end, then nothing.
    #[inline]
    pub fn reported_load_at(&self, now_ms: u64) -> u32 {
        match self.load_until_ms {
            Some(until) if now_ms >= until => 0,
            _ => self.reported_load,
        }
    }

    /// Whether the price moves with time alone (a drain that ends, held
    /// load figures that expire).
    pub fn depends_on_time(&self, now_ms: u64) -> bool {
        now_ms < self.drained_until_ms
            || (self.reported_load > 0 && self.load_until_ms.is_some_and(|t| now_ms < t))
    }
}
