//! NumPy's random streams, bit for bit, so that a seed gives the same
//! workload here as in `vllm bench serve`:
//!
//! - [`Generator`]: `np.random.default_rng(seed)` (SeedSequence → PCG64) and
//!   its `integers(low, high, size)`, which vLLM's `RandomDataset` draws its
//!   prompt lengths, vocabulary offsets and prefix tokens from;
//! - [`RandomState`]: the legacy global `np.random.seed(seed)` (MT19937) and
//!   its `gamma(shape, scale)`, which vLLM's `get_request` draws the
//!   inter-arrival times from.
//!
//! The algorithms follow NumPy 2's `bit_generator.pyx` (SeedSequence),
//! `pcg64.h`, `mt19937.c`, `distributions.c` (bounded integers) and
//! `legacy-distributions.c` (gamma); the unit tests hold values NumPy 2.3
//! printed.

/// `np.random.SeedSequence(seed).generate_state(n_words, np.uint64)` for a
/// non-negative integer seed (no spawn key), with NumPy's pool of 4 words.
pub fn seed_sequence_u64(seed: u64, n_words: usize) -> Vec<u64> {
    const INIT_A: u32 = 0x43b0_d7e5;
    const MULT_A: u32 = 0x931e_8875;
    const INIT_B: u32 = 0x8b51_f9dd;
    const MULT_B: u32 = 0x58f3_8ded;
    const MIX_MULT_L: u32 = 0xca01_f9dd;
    const MIX_MULT_R: u32 = 0x4973_f715;
    const XSHIFT: u32 = 16;
    const POOL: usize = 4;

    fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
        let mut value = value ^ *hash_const;
        *hash_const = hash_const.wrapping_mul(MULT_A);
        value = value.wrapping_mul(*hash_const);
        value ^ (value >> XSHIFT)
    }
    fn mix(x: u32, y: u32) -> u32 {
        let r = MIX_MULT_L
            .wrapping_mul(x)
            .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
        r ^ (r >> XSHIFT)
    }

    // The integer as little-endian 32-bit words; 0 is one zero word.
    let mut entropy = vec![seed as u32];
    if seed >> 32 != 0 {
        entropy.push((seed >> 32) as u32);
    }

    let mut pool = [0u32; POOL];
    let mut hash_const = INIT_A;
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hash_const);
    }
    for i_src in 0..POOL {
        for i_dst in 0..POOL {
            if i_src != i_dst {
                let h = hashmix(pool[i_src], &mut hash_const);
                pool[i_dst] = mix(pool[i_dst], h);
            }
        }
    }
    for &word in entropy.iter().skip(POOL) {
        for slot in pool.iter_mut() {
            let h = hashmix(word, &mut hash_const);
            *slot = mix(*slot, h);
        }
    }

    let mut hash_const = INIT_B;
    let words: Vec<u32> = (0..n_words * 2)
        .map(|i| {
            let mut v = pool[i % POOL] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hash_const);
            v ^ (v >> XSHIFT)
        })
        .collect();
    words
        .chunks(2)
        .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
        .collect()
}

/// `np.random.default_rng(seed)`: PCG64 (XSL-RR output) seeded through
/// SeedSequence.
#[derive(Clone, Debug)]
pub struct Generator {
    state: u128,
    inc: u128,
    /// PCG64 hands out 32-bit values in halves of one 64-bit draw; the high
    /// half waits here for the next 32-bit request (NumPy's `has_uint32`).
    pending_u32: Option<u32>,
}

const PCG_MULT: u128 = (2_549_297_995_355_413_924u128 << 64) | 4_865_540_595_714_422_341u128;

impl Generator {
    pub fn new(seed: u64) -> Self {
        let v = seed_sequence_u64(seed, 4);
        let init_state = (u128::from(v[0]) << 64) | u128::from(v[1]);
        let init_seq = (u128::from(v[2]) << 64) | u128::from(v[3]);
        let mut g = Generator {
            state: 0,
            inc: (init_seq << 1) | 1,
            pending_u32: None,
        };
        g.step();
        g.state = g.state.wrapping_add(init_state);
        g.step();
        g
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        let xored = ((s >> 64) as u64) ^ (s as u64);
        xored.rotate_right((s >> 122) as u32)
    }

    pub fn next_u32(&mut self) -> u32 {
        if let Some(v) = self.pending_u32.take() {
            return v;
        }
        let next = self.next_u64();
        self.pending_u32 = Some((next >> 32) as u32);
        next as u32
    }

    /// One value of `[off, off + rng]` (closed), as NumPy's
    /// `random_bounded_uint64_fill` draws it (Lemire's method, through the
    /// 32-bit stream when the range fits 32 bits).
    fn bounded(&mut self, off: u64, rng: u64) -> u64 {
        if rng == 0 {
            return off;
        }
        if rng <= u64::from(u32::MAX) {
            if rng == u64::from(u32::MAX) {
                return off.wrapping_add(u64::from(self.next_u32()));
            }
            let rng = rng as u32;
            let excl = rng + 1;
            let mut m = u64::from(self.next_u32()) * u64::from(excl);
            let mut leftover = m as u32;
            if leftover < excl {
                let threshold = (u32::MAX - rng) % excl;
                while leftover < threshold {
                    m = u64::from(self.next_u32()) * u64::from(excl);
                    leftover = m as u32;
                }
            }
            return off.wrapping_add(m >> 32);
        }
        if rng == u64::MAX {
            return off.wrapping_add(self.next_u64());
        }
        let excl = rng + 1;
        let mut m = u128::from(self.next_u64()) * u128::from(excl);
        let mut leftover = m as u64;
        if leftover < excl {
            let threshold = (u64::MAX - rng) % excl;
            while leftover < threshold {
                m = u128::from(self.next_u64()) * u128::from(excl);
                leftover = m as u64;
            }
        }
        off.wrapping_add((m >> 64) as u64)
    }

    /// `rng.integers(low, high, size=n)`: `n` values of `[low, high)`
    /// (`high > low`; an empty range returns `low`, as a 0-width range does).
    pub fn integers(&mut self, low: i64, high: i64, n: usize) -> Vec<i64> {
        let rng = (high.wrapping_sub(low).wrapping_sub(1)) as u64;
        let rng = if high <= low { 0 } else { rng };
        (0..n)
            .map(|_| self.bounded(low as u64, rng) as i64)
            .collect()
    }
}

/// The legacy `np.random` global state after `np.random.seed(seed)`:
/// MT19937 with its Gaussian cache.
#[derive(Clone)]
pub struct RandomState {
    key: [u32; 624],
    pos: usize,
    gauss: Option<f64>,
}

impl RandomState {
    pub fn new(seed: u32) -> Self {
        let mut key = [0u32; 624];
        let mut s = seed;
        for (pos, k) in key.iter_mut().enumerate() {
            *k = s;
            s = 1_812_433_253u32
                .wrapping_mul(s ^ (s >> 30))
                .wrapping_add(pos as u32 + 1);
        }
        RandomState {
            key,
            pos: 624,
            gauss: None,
        }
    }

    fn regenerate(&mut self) {
        const N: usize = 624;
        const M: usize = 397;
        const MATRIX_A: u32 = 0x9908_b0df;
        let twist = |a: u32, b: u32| {
            let y = (a & 0x8000_0000) | (b & 0x7fff_ffff);
            (y >> 1) ^ if y & 1 == 1 { MATRIX_A } else { 0 }
        };
        for i in 0..N {
            let t = twist(self.key[i], self.key[(i + 1) % N]);
            self.key[i] = self.key[(i + M) % N] ^ t;
        }
        self.pos = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.pos == 624 {
            self.regenerate();
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// A double of `[0, 1)` from 53 random bits (`legacy_double`).
    pub fn next_f64(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }

    fn gauss(&mut self) -> f64 {
        if let Some(g) = self.gauss.take() {
            return g;
        }
        // Marsaglia's polar method; the second value is kept for the next
        // call, as NumPy does.
        loop {
            let x1 = 2.0 * self.next_f64() - 1.0;
            let x2 = 2.0 * self.next_f64() - 1.0;
            let r2 = x1 * x1 + x2 * x2;
            if r2 < 1.0 && r2 != 0.0 {
                let f = (-2.0 * r2.ln() / r2).sqrt();
                self.gauss = Some(f * x1);
                return f * x2;
            }
        }
    }

    fn standard_exponential(&mut self) -> f64 {
        -(1.0 - self.next_f64()).ln()
    }

    fn standard_gamma(&mut self, shape: f64) -> f64 {
        if shape == 1.0 {
            return self.standard_exponential();
        }
        if shape == 0.0 {
            return 0.0;
        }
        if shape < 1.0 {
            loop {
                let u = self.next_f64();
                let v = self.standard_exponential();
                if u <= 1.0 - shape {
                    let x = u.powf(1.0 / shape);
                    if x <= v {
                        return x;
                    }
                } else {
                    let y = -((1.0 - u) / shape).ln();
                    let x = (1.0 - shape + shape * y).powf(1.0 / shape);
                    if x <= v + y {
                        return x;
                    }
                }
            }
        }
        // Marsaglia and Tsang.
        let b = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * b).sqrt();
        loop {
            let (mut x, mut v);
            loop {
                x = self.gauss();
                v = 1.0 + c * x;
                if v > 0.0 {
                    break;
                }
            }
            v = v * v * v;
            let u = self.next_f64();
            if u < 1.0 - 0.0331 * (x * x) * (x * x) {
                return b * v;
            }
            if u.ln() < 0.5 * x * x + b * (1.0 - v + v.ln()) {
                return b * v;
            }
        }
    }

    /// `np.random.gamma(shape, scale)`.
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        scale * self.standard_gamma(shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values printed by NumPy 2.3.5 (see each test for the expression).

    #[test]
    fn seed_sequence_matches_numpy() {
        // np.random.SeedSequence(0).generate_state(4, np.uint64)
        assert_eq!(
            seed_sequence_u64(0, 4),
            SEED_SEQ_0.to_vec(),
            "SeedSequence(0)"
        );
        // np.random.SeedSequence(2**40 + 7).generate_state(4, np.uint64)
        assert_eq!(seed_sequence_u64((1 << 40) + 7, 4), SEED_SEQ_BIG.to_vec());
    }

    #[test]
    fn pcg64_integers_match_numpy() {
        // r = np.random.default_rng(0); r.integers(0, 1000, 8),
        // r.integers(5, 6, 3), r.integers(0, 151643, 5),
        // r.integers(0, 2**40, 3)
        let mut r = Generator::new(0);
        assert_eq!(r.integers(0, 1000, 8), INTS_A.to_vec());
        assert_eq!(r.integers(5, 6, 3), vec![5, 5, 5]);
        assert_eq!(r.integers(0, 151_643, 5), INTS_B.to_vec());
        assert_eq!(r.integers(0, 1 << 40, 3), INTS_C.to_vec());
        // np.random.default_rng(1234).integers(100, 120, 6)
        assert_eq!(Generator::new(1234).integers(100, 120, 6), INTS_D.to_vec());
    }

    #[test]
    fn legacy_gamma_matches_numpy() {
        // np.random.seed(0); [np.random.gamma(1.0, 0.5) for _ in range(4)]
        let mut s = RandomState::new(0);
        let got: Vec<f64> = (0..4).map(|_| s.gamma(1.0, 0.5)).collect();
        assert_close(&got, &GAMMA_1);
        // np.random.seed(3); [np.random.gamma(0.3, 2.0) for _ in range(4)]
        let mut s = RandomState::new(3);
        let got: Vec<f64> = (0..4).map(|_| s.gamma(0.3, 2.0)).collect();
        assert_close(&got, &GAMMA_03);
        // np.random.seed(7); [np.random.gamma(4.0, 0.25) for _ in range(5)]
        let mut s = RandomState::new(7);
        let got: Vec<f64> = (0..5).map(|_| s.gamma(4.0, 0.25)).collect();
        assert_close(&got, &GAMMA_4);
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{got:?} != {want:?}"
            );
        }
    }

    const SEED_SEQ_0: [u64; 4] = [
        15793235383387715774,
        12390638538380655177,
        2361836109651742017,
        3188717715514472916,
    ];
    const SEED_SEQ_BIG: [u64; 4] = [
        974592680304384533,
        11164224302760304993,
        11068753026110695683,
        4650291916314288918,
    ];
    const INTS_A: [i64; 8] = [850, 636, 511, 269, 307, 40, 75, 16];
    const INTS_B: [i64; 5] = [26578, 123326, 98479, 138412, 76371];
    const INTS_C: [i64; 3] = [802089951224, 597721999265, 1028123002767];
    const INTS_D: [i64; 6] = [119, 119, 119, 107, 103, 118];
    const GAMMA_1: [f64; 4] = [
        0.397937254081555,
        0.6279653814829189,
        0.4616115729020344,
        0.39360057615863536,
    ];
    const GAMMA_03: [f64; 4] = [
        0.27394975834926044,
        0.0326236575174,
        2.061568040984234,
        0.0019837768027034966,
    ];
    const GAMMA_4: [f64; 5] = [
        1.987462440347401,
        0.7112184728506378,
        0.5884908003443384,
        0.9176558400051682,
        1.4952318608436268,
    ];
}
