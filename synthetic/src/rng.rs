//! Deterministic random streams.
//!
//! Two generators, both written out here so the bytes never depend on a crate version:
//!
//! * [`SplitMix64`] (Steele, Lea & Flood 2014; the constants are the published ones) drives every
//!   native preset. **Stream order:** every stored tensor (and every other drawn object, e.g. a
//!   codebook) owns its own stream, seeded by [`SplitMix64::for_object`] from the user seed
//!   and the object's name. Within a stream, draws run row-major over the tensor's elements.
//!   A tensor's bytes therefore depend only on `(seed, preset, name)`: sharding, mutants and
//!   the order of writing cannot change them, and one tensor can be re-drawn on its own.
//! * [`PyRandom`] is CPython's `random.Random` (MT19937, `init_by_array` seeding,
//!   `getrandbits`/`_randbelow`/`random()` as in CPython 3.11). It exists only to reproduce
//!   WASTE's synthetic test container byte for byte (CONTAINER.md §10.2), which draws from one
//!   `random.Random(seed)` stream.

/// SplitMix64: 64-bit state, one addition and a finaliser per draw.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over the UTF-8 bytes of a name (64-bit offset basis and prime).
fn fnv1a64(name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The stream of one named object: state = mix64(seed · γ ⊕ fnv1a64(name)).
    pub fn for_object(seed: u64, name: &str) -> Self {
        Self::new(mix64(seed.wrapping_mul(GOLDEN_GAMMA) ^ fnv1a64(name)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in [0, n), unbiased (rejection of the incomplete top range).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let r = self.next_u64();
            if r < zone {
                return r % n;
            }
        }
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }
}

/// CPython's Mersenne Twister `random.Random`, as far as WASTE's generator uses it.
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; 624],
    index: usize,
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed (CPython `random_seed`: the
    /// absolute value split into 32-bit little-endian words, at least one word).
    pub fn new(seed: u64) -> Self {
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut r = Self {
            mt: [0; 624],
            index: 624,
        };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..624 {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = 624;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let n = 624usize;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..n.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= n {
                self.mt[0] = self.mt[n - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..n - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= n {
                self.mt[0] = self.mt[n - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn genrand_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7FFF_FFFF);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_B0DF;
                }
                self.mt[k] = v;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }

    /// `random.random()`: 53 bits from two draws.
    pub fn random(&mut self) -> f64 {
        let a = (self.genrand_u32() >> 5) as f64;
        let b = (self.genrand_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `random.getrandbits(k)` for 1 ≤ k ≤ 32.
    fn getrandbits(&mut self, k: u32) -> u32 {
        debug_assert!((1..=32).contains(&k));
        self.genrand_u32() >> (32 - k)
    }

    /// `random.randrange(n)` = `_randbelow_with_getrandbits(n)`: k = n.bit_length(), reject ≥ n.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `random.randrange(lo, hi)` (hi exclusive).
    pub fn randrange(&mut self, lo: i64, hi: i64) -> i64 {
        lo + i64::from(self.randbelow((hi - lo) as u32))
    }

    /// `random.uniform(a, b)` = a + (b − a)·random().
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of SplitMix64 seeded with 1234567 (values from the reference C code).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn pyrandom_matches_cpython() {
        // CPython 3.11: random.Random(0).random() -> 0.8444218515250481,
        // then 0.7579544029403025; random.Random(0).randrange(256) -> 197 (getrandbits(9) rejection).
        let mut r = PyRandom::new(0);
        assert_eq!(r.random(), 0.8444218515250481);
        assert_eq!(r.random(), 0.7579544029403025);
        let mut r = PyRandom::new(0);
        assert_eq!(r.randbelow(256), 197);
        // Seeds above 2^32 are split into two key words: Random(2**40 + 5).random().
        let mut r = PyRandom::new((1 << 40) + 5);
        assert_eq!(r.random(), 0.5043802970418443);
    }
}
