//! The simulation's random numbers: seeded, platform-independent, fast.
//!
//! Reproducibility is a promise of `ace sim` (same seed, same bytes), so
//! the generator is written out here (xoshiro256**, seeded through
//! splitmix64) rather than taken from a crate whose stream may change
//! between versions. Every stochastic part of a run (the request mix, each
//! destination's failures and evictions, each policy's own draws) gets its
//! own stream ([`Rng::fork`]), so adding a draw in one part never shifts
//! another's.

/// A xoshiro256** generator.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        Rng {
            s: [
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
            ],
        }
    }

    /// An independent stream for part `label` of a run seeded `seed`.
    pub fn fork(seed: u64, label: &str) -> Rng {
        let h = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Rng::new(seed ^ h.rotate_left(17))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.s;
        let result = s1.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (((self.next_u64() >> 32) * n as u64) >> 32) as usize
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform() < p
    }

    /// Exponential with rate `rate` (mean 1/rate).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - self.uniform()).ln() / rate
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Log-normal with median `median` and shape `sigma`.
    pub fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// An index drawn with probability proportional to `weights` (0 when
    /// they are all zero).
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        if total.is_nan() || total <= 0.0 {
            return 0;
        }
        let mut x = self.uniform() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_stream_and_forks_differ() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            Rng::fork(7, "mix").next_u64(),
            Rng::fork(7, "fleet").next_u64()
        );
        // The stream is fixed: a change here changes every published figure.
        assert_eq!(Rng::new(0).next_u64(), 0x99ec_5f36_cb75_f2b4);
    }

    #[test]
    fn draws_have_the_right_means() {
        let mut r = Rng::new(3);
        let n = 200_000;
        let mean = (0..n).map(|_| r.exponential(2.0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let mut v: Vec<f64> = (0..n).map(|_| r.log_normal(100.0, 0.8)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[n / 2];
        assert!((median - 100.0).abs() < 2.0, "{median}");
        let picks = (0..n).filter(|_| r.weighted(&[1.0, 3.0]) == 1).count();
        assert!((picks as f64 / n as f64 - 0.75).abs() < 0.01);
        assert!((0..1000).all(|_| r.below(3) < 3));
    }
}
