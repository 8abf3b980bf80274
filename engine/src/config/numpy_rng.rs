//! A port of the few pieces of numpy's random machinery that the Engram multipliers depend
//! on (MODEL.md §6.6.1): `np.random.default_rng(seed).integers(0, bound, size=n,
//! dtype=np.int64)` = `SeedSequence` → `PCG64` (XSL-RR 128/64) → Lemire's bounded integers.
//!
//! Why port it: the release multipliers are published (MODEL.md §6.6.1, golden_tiny README),
//! but tiny release checkpoints such as `official_a` only state the recipe. The port
//! reproduces every published value (see the tests), so the recipe becomes checkable.
//! Constants are numpy's (`bit_generator.pyx`, `pcg64.h`, `distributions.c`), facts only.

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL_SIZE: usize = 4;
const PCG_MULT: u128 = (0x2360_ED05_1FC6_5DA4u128 << 64) | 0x4385_DF64_9FCC_F645;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// `SeedSequence(seed).pool` for a non-negative integer seed (no spawn key).
fn seed_pool(seed: u128) -> [u32; POOL_SIZE] {
    let mut entropy = Vec::new();
    let mut n = seed;
    loop {
        entropy.push(n as u32);
        n >>= 32;
        if n == 0 {
            break;
        }
    }
    let mut pool = [0u32; POOL_SIZE];
    let mut hc = INIT_A;
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
    }
    for src in 0..POOL_SIZE {
        for dst in 0..POOL_SIZE {
            if src != dst {
                let h = hashmix(pool[src], &mut hc);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &e in entropy.iter().skip(POOL_SIZE) {
        for slot in pool.iter_mut() {
            let h = hashmix(e, &mut hc);
            *slot = mix(*slot, h);
        }
    }
    pool
}

/// `SeedSequence.generate_state(n, np.uint64)`.
fn generate_state_u64(pool: &[u32; POOL_SIZE], n: usize) -> Vec<u64> {
    let mut hc = INIT_B;
    let words: Vec<u32> = (0..2 * n)
        .map(|i| {
            let mut v = pool[i % POOL_SIZE] ^ hc;
            hc = hc.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hc);
            v ^ (v >> XSHIFT)
        })
        .collect();
    words
        .chunks(2)
        .map(|w| w[0] as u64 | ((w[1] as u64) << 32))
        .collect()
}

/// numpy's `PCG64` bit generator.
pub(crate) struct Pcg64 {
    state: u128,
    inc: u128,
}

impl Pcg64 {
    /// `np.random.default_rng(seed)`'s bit generator.
    pub(crate) fn from_seed(seed: u128) -> Self {
        let s = generate_state_u64(&seed_pool(seed), 4);
        let initstate = ((s[0] as u128) << 64) | s[1] as u128;
        let initseq = ((s[2] as u128) << 64) | s[3] as u128;
        let mut rng = Pcg64 {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(initstate);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        ((s >> 64) as u64 ^ s as u64).rotate_right((s >> 122) as u32)
    }

    /// `integers(0, bound, dtype=int64)` for one value, Lemire's method as numpy runs it for
    /// ranges wider than 32 bits. `None` for bounds that numpy serves from its 32-bit path
    /// (not ported) or that are empty.
    pub(crate) fn bounded_u64(&mut self, bound: u64) -> Option<u64> {
        let rng = bound.checked_sub(1)?;
        if rng <= u32::MAX as u64 {
            return None;
        }
        let excl = bound;
        let mut m = self.next_u64() as u128 * excl as u128;
        let mut leftover = m as u64;
        if leftover < excl {
            let threshold = (u64::MAX - rng) % excl;
            while leftover < threshold {
                m = self.next_u64() as u128 * excl as u128;
                leftover = m as u64;
            }
        }
        Some((m >> 64) as u64)
    }
}

/// The Engram multipliers of one layer: `2·draw + 1` for `n` draws of
/// `default_rng(10007·layer_id).integers(0, bound)`, `bound = ((2^63−1) div cvocab) div 2`.
/// `None` when the bound is outside the ported 64-bit path.
pub(crate) fn engram_multipliers(
    layer_id: usize,
    compressed_vocab: u64,
    n: usize,
) -> Option<Vec<i64>> {
    if compressed_vocab == 0 {
        return None;
    }
    let bound = (i64::MAX as u64 / compressed_vocab) / 2;
    let mut rng = Pcg64::from_seed(10007u128 * layer_id as u128);
    (0..n)
        .map(|_| rng.bounded_u64(bound).map(|d| (2 * d + 1) as i64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published values: MODEL.md §6.6.1 (release, cvocab 99092, layers 1 and 14) and
    /// golden_tiny/README.md (cvocab 256, layers 0 and 1).
    #[test]
    fn reproduces_published_multipliers() {
        assert_eq!(
            engram_multipliers(1, 99092, 4).unwrap(),
            [
                76632096046245,
                4839876093313,
                35959672319349,
                73987337458391
            ]
        );
        assert_eq!(
            engram_multipliers(14, 99092, 4).unwrap(),
            [
                67716810739261,
                51510806800915,
                30921347202721,
                82619226485591
            ]
        );
        assert_eq!(
            engram_multipliers(0, 256, 3).unwrap(),
            [22948963341361471, 9720090748611819, 1476226777048821]
        );
        assert_eq!(
            engram_multipliers(1, 256, 3).unwrap(),
            [29662608052400909, 1873410163432121, 13919202536988139]
        );
    }

    #[test]
    fn bound_matches_published_value() {
        assert_eq!((i64::MAX as u64 / 99092) / 2, 46539438283891);
        assert_eq!((i64::MAX as u64 / 256) / 2, 18014398509481983);
    }

    #[test]
    fn small_bounds_are_not_guessed() {
        let mut r = Pcg64::from_seed(1);
        assert_eq!(r.bounded_u64(1000), None);
        assert_eq!(r.bounded_u64(0), None);
    }
}
