//! Money as integer nano-dollars.
//!
//! Per-token prices are tiny fractions of a dollar, and a report sums
//! millions of requests: float sums drift and would break the promise that
//! the four savings add up to the total exactly. Each event's cost is
//! computed once from the cost curves (in `f64`, as the core prices it),
//! rounded to the nearest nano-dollar, and only integers are summed after
//! that. An `i64` of nano-dollars holds ±9.2 billion dollars.

/// Nano-dollars (1e-9 USD).
pub type Nano = i64;

/// Nano-dollars per dollar.
pub const PER_USD: i64 = 1_000_000_000;

/// `usd` rounded to the nearest nano-dollar (`None` if not finite or out
/// of range).
pub fn from_usd(usd: f64) -> Option<Nano> {
    let n = (usd * PER_USD as f64).round();
    (n.is_finite() && n.abs() < 9.0e18).then_some(n as i64)
}

/// `usd` rounded to the nearest nano-dollar, held to the range of
/// [`from_usd`] at its ends (0 for NaN): for a figure that must exist even
/// when a stored value is absurd.
pub fn from_usd_saturating(usd: f64) -> Nano {
    if usd.is_nan() {
        return 0;
    }
    from_usd(usd.clamp(-8.999_999_999e9, 8.999_999_999e9)).unwrap_or(0)
}

/// What capacity bought by the hour (owned GPUs, a reserved block) costs
/// over `period_ms`, used or not: `usd_per_hour` × the period in hours.
/// The one rule for standing cost, the ledger's chargeback and the
/// simulator's reports alike; a negative period is none.
pub fn standing(usd_per_hour: f64, period_ms: i64) -> Nano {
    from_usd_saturating(usd_per_hour * (period_ms.max(0) as f64 / 3_600_000.0))
}

/// Dollars with nine decimals, exactly (no float on the way).
pub fn usd(n: Nano) -> String {
    let sign = if n < 0 { "-" } else { "" };
    let a = n.unsigned_abs();
    let per = PER_USD as u64;
    format!("{sign}{}.{:09}", a / per, a % per)
}

/// Dollars as a float, for charts and ratios only (never summed).
pub fn usd_f64(n: Nano) -> f64 {
    n as f64 / PER_USD as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_and_prints_exactly() {
        assert_eq!(from_usd(2.5e-6 * 1000.0), Some(2_500_000));
        assert_eq!(from_usd(1.4e-9), Some(1));
        assert_eq!(from_usd(f64::NAN), None);
        assert_eq!(usd(1_234_567_891), "1.234567891");
        assert_eq!(usd(-5), "-0.000000005");
        assert_eq!(usd(0), "0.000000000");
    }

    #[test]
    fn standing_cost_is_the_hourly_rate_over_the_period() {
        assert_eq!(standing(17.12, 24 * 3_600_000), 410_880_000_000);
        assert_eq!(standing(2.0, 90 * 60_000), 3_000_000_000);
        assert_eq!(standing(2.0, -1), 0);
        assert_eq!(standing(f64::NAN, 3_600_000), 0);
    }
}
