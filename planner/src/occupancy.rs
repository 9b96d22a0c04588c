//! Bitset occupancy of batch blocks, shared by FIFO, the greedy stand-in and
//! fast mode.
//!
//! Why bitsets: fast mode re-runs a list scheduler many times per call, and at
//! 1,024 GPUs the inner loop ("is GPU range [o, o+s) free for steps t..t+d?")
//! must be a few word operations, not a cell walk. One bit per GPU per step,
//! 1 = free; a window's free mask is the AND of its steps' masks.

/// Free GPUs per step as bitsets, plus the batch GPU count per step.
#[derive(Debug, Clone)]
pub struct Occupancy {
    words: usize,
    gpus: u32,
    free: Vec<u64>,
    /// Batch GPUs in use per step.
    pub used: Vec<u32>,
    scratch: Vec<u64>,
}

impl Occupancy {
    /// All GPUs free at every step.
    pub fn new(gpus: u32, steps: u32) -> Occupancy {
        let words = (gpus as usize).div_ceil(64);
        let mut row = vec![u64::MAX; words];
        let rem = gpus as usize % 64;
        if rem != 0 {
            row[words - 1] = (1u64 << rem) - 1;
        }
        let mut free = Vec::with_capacity(words * steps as usize);
        for _ in 0..steps {
            free.extend_from_slice(&row);
        }
        Occupancy {
            words,
            gpus,
            free,
            used: vec![0; steps as usize],
            scratch: vec![0; words],
        }
    }

    /// Resets to all free (keeps allocations).
    pub fn reset(&mut self) {
        let rem = self.gpus as usize % 64;
        for (i, w) in self.free.iter_mut().enumerate() {
            *w = if rem != 0 && i % self.words == self.words - 1 {
                (1u64 << rem) - 1
            } else {
                u64::MAX
            };
        }
        self.used.iter_mut().for_each(|u| *u = 0);
    }

    /// Computes the free mask of steps `t0..t0+len` into the scratch buffer.
    fn window(&mut self, t0: u32, len: u32) {
        let w = self.words;
        let base = t0 as usize * w;
        self.scratch.copy_from_slice(&self.free[base..base + w]);
        for t in 1..len as usize {
            let row = &self.free[base + t * w..base + (t + 1) * w];
            for (s, r) in self.scratch.iter_mut().zip(row) {
                *s &= r;
            }
        }
    }

    fn bit(&self, g: u32) -> bool {
        (self.scratch[(g / 64) as usize] >> (g % 64)) & 1 == 1
    }

    /// First free bit at or after `p`, below `hi`.
    fn next_one(&self, mut p: u32, hi: u32) -> Option<u32> {
        while p < hi {
            let wi = (p / 64) as usize;
            let word = self.scratch[wi] >> (p % 64);
            if word != 0 {
                let q = p + word.trailing_zeros();
                return (q < hi).then_some(q);
            }
            p = (wi as u32 + 1) * 64;
        }
        None
    }

    /// First busy bit at or after `p` (or `hi`).
    fn next_zero(&self, mut p: u32, hi: u32) -> u32 {
        while p < hi {
            let wi = (p / 64) as usize;
            let word = !self.scratch[wi] >> (p % 64);
            if word != 0 {
                return (p + word.trailing_zeros()).min(hi);
            }
            p = (wi as u32 + 1) * 64;
        }
        hi
    }

    /// Free runs `(start, len)` of the window's mask inside `[lo, hi)`.
    fn runs(&self, lo: u32, hi: u32, mut f: impl FnMut(u32, u32) -> bool) {
        let mut p = lo;
        while let Some(a) = self.next_one(p, hi) {
            let b = self.next_zero(a, hi);
            if !f(a, b - a) {
                return;
            }
            p = b;
        }
    }

    /// A free block of `size` GPUs in `[lo, hi)` for steps `t0..t0+len`.
    /// `best_fit` picks the tightest free run (ties: lowest index) instead of
    /// the lowest-index one. With `align`, offsets are multiples of `size`.
    #[allow(clippy::too_many_arguments)] // the hot path; a struct would be built per call
    pub fn find(
        &mut self,
        t0: u32,
        len: u32,
        size: u32,
        lo: u32,
        hi: u32,
        align: bool,
        best_fit: bool,
    ) -> Option<u32> {
        if len == 0 || size == 0 || hi < lo + size {
            return None;
        }
        self.window(t0, len);
        let mut best: Option<(u32, u32)> = None;
        self.runs(lo, hi, |a, l| {
            let start = if align { a.next_multiple_of(size) } else { a };
            if start + size <= a + l {
                let slack = a + l - (start + size) + (start - a);
                if !best_fit {
                    best = Some((start, slack));
                    return false;
                }
                if best.is_none_or(|(_, s)| slack < s) {
                    best = Some((start, slack));
                }
            }
            true
        });
        best.map(|(o, _)| o)
    }

    /// Whether GPUs `[o, o+size)` are free for steps `t0..t0+len`.
    pub fn is_free(&mut self, t0: u32, len: u32, o: u32, size: u32) -> bool {
        self.window(t0, len);
        (o..o + size).all(|g| self.bit(g))
    }

    /// Marks GPUs `[o, o+size)` busy for steps `t0..t0+len`.
    pub fn occupy(&mut self, t0: u32, len: u32, o: u32, size: u32) {
        let w = self.words;
        for t in t0..t0 + len {
            let base = t as usize * w;
            let mut g = o;
            let end = o + size;
            while g < end {
                let wi = (g / 64) as usize;
                let bit = g % 64;
                let n = (64 - bit).min(end - g);
                let mask = if n == 64 {
                    u64::MAX
                } else {
                    ((1u64 << n) - 1) << bit
                };
                self.free[base + wi] &= !mask;
                g += n;
            }
            self.used[t as usize] += size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_lowest_and_best_fit_blocks_across_words() {
        let mut o = Occupancy::new(130, 4);
        o.occupy(0, 2, 0, 3); // GPUs 0..3 busy at steps 0,1
        o.occupy(1, 1, 10, 60); // GPUs 10..70 busy at step 1
        assert_eq!(o.find(0, 2, 2, 0, 130, false, false), Some(3));
        assert_eq!(o.find(0, 2, 2, 0, 130, true, false), Some(4));
        // Runs at steps 0..2: [3,10) len 7 and [70,130) len 60; best fit for 4 is 3.
        assert_eq!(o.find(0, 2, 8, 0, 130, false, true), Some(70));
        assert_eq!(o.find(0, 2, 4, 0, 130, false, true), Some(3));
        assert_eq!(o.find(0, 1, 64, 0, 130, true, false), Some(64));
        assert!(o.is_free(2, 2, 0, 130));
        assert!(!o.is_free(0, 2, 2, 2));
        assert_eq!(o.used, vec![3, 63, 0, 0]);
        o.reset();
        assert!(o.is_free(0, 4, 0, 130));
        assert_eq!(o.find(0, 4, 128, 0, 130, true, false), Some(0));
        assert_eq!(o.find(0, 4, 128, 1, 130, true, false), None);
    }
}
