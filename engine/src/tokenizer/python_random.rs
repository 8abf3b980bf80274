//! CPython's `random` module, as far as this project needs it: MT19937 seeded like
//! `random.seed(int)` (`init_by_array` over the 32-bit words of the seed), `getrandbits`,
//! `randint`, `randrange` and `choice` with CPython's rejection sampling, and `random()` /
//! `uniform` from 53 bits. With it the wide tokenizer corpus (TOKENIZER.md §9) reproduces the
//! WASTE/CPython 3.11 strings exactly, and ds41-synthetic reproduces WASTE's synthetic test
//! container byte for byte (CONTAINER.md §10.2). The one implementation of both.

const N: usize = 624;
const M: usize = 397;

#[derive(Clone)]
pub struct PythonRandom {
    mt: [u32; N],
    index: usize,
}

impl PythonRandom {
    /// `random.seed(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut r = PythonRandom {
            mt: [0; N],
            index: N,
        };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.mt[i] & 0x8000_0000) | (self.mt[(i + 1) % N] & 0x7fff_ffff);
            let mag = if y & 1 == 0 { 0 } else { 0x9908_b0df };
            self.mt[i] = self.mt[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// `genrand_uint32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for 1 ≤ k ≤ 32.
    pub fn getrandbits(&mut self, k: u32) -> u32 {
        debug_assert!((1..=32).contains(&k));
        self.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)` for n ≥ 1: draw bit_length(n) bits until the value is below n.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        assert!(n >= 1, "randbelow(0)");
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `randrange(lo, hi)` (hi exclusive, `hi - lo` at most 2^32 - 1).
    pub fn randrange(&mut self, lo: i64, hi: i64) -> i64 {
        lo + i64::from(self.randbelow((hi - lo) as u32))
    }

    /// `random()`: 53 bits from two draws (`genrand_res53`).
    pub fn random(&mut self) -> f64 {
        let a = f64::from(self.next_u32() >> 5);
        let b = f64::from(self.next_u32() >> 6);
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `uniform(a, b)` = a + (b − a)·random().
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `randint(a, b)`, both ends included.
    pub fn randint(&mut self, a: u32, b: u32) -> u32 {
        a + self.randbelow(b - a + 1)
    }

    /// `choice(seq)`.
    pub fn choice<'a, T>(&mut self, seq: &'a [T]) -> &'a T {
        &seq[self.randbelow(seq.len() as u32) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by CPython: `random.seed(11); [random.getrandbits(32) for _ in
    /// range(3)]`, and MT19937's reference first output for `init_by_array([0x123, 0x234,
    /// 0x345, 0x456])` (mt19937ar.out).
    #[test]
    fn matches_reference_streams() {
        let mut r = PythonRandom {
            mt: [0; N],
            index: N,
        };
        r.init_by_array(&[0x123, 0x234, 0x345, 0x456]);
        assert_eq!(r.next_u32(), 1_067_595_299);
        assert_eq!(r.next_u32(), 955_945_823);

        let mut r = PythonRandom::new(11);
        let bits: Vec<u32> = (0..3).map(|_| r.getrandbits(32)).collect();
        assert_eq!(bits, [1_942_955_373, 3_718_334_796, 2_404_204_071]);
        // random.seed(11); [random.randint(1, 24) for _ in range(5)], random.choice(range(27790))
        let mut r = PythonRandom::new(11);
        let ints: Vec<u32> = (0..5).map(|_| r.randint(1, 24)).collect();
        assert_eq!(ints, [15, 18, 15, 15, 17]);
        let pool: Vec<u32> = (0..27_790).collect();
        assert_eq!(*r.choice(&pool), 19_247);
    }

    /// CPython 3.11: `random.Random(0).random()` → 0.8444218515250481, then
    /// 0.7579544029403025; `random.Random(0).randrange(256)` → 197 (getrandbits(9) with a
    /// rejection); seeds above 2^32 take two key words: `Random(2**40 + 5).random()`.
    #[test]
    fn random_and_randrange_match_cpython() {
        let mut r = PythonRandom::new(0);
        assert_eq!(r.random(), 0.8444218515250481);
        assert_eq!(r.random(), 0.7579544029403025);
        let mut r = PythonRandom::new(0);
        assert_eq!(r.randrange(0, 256), 197);
        let mut r = PythonRandom::new((1 << 40) + 5);
        assert_eq!(r.random(), 0.5043802970418443);
    }
}
