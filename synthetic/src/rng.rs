//! Deterministic random streams, written out so the bytes never depend on a crate version:
//!
//! * [`SplitMix64`] (Steele, Lea & Flood 2014; the constants are the published ones) drives every
//!   native preset. **Stream order:** every stored tensor (and every other drawn object, e.g. a
//!   codebook) owns its own stream, seeded by [`SplitMix64::for_object`] from the user seed
//!   and the object's name. Within a stream, draws run row-major over the tensor's elements.
//!   A tensor's bytes therefore depend only on `(seed, preset, name)`: sharding, mutants and
//!   the order of writing cannot change them, and one tensor can be re-drawn on its own.
//! * CPython's `random.Random` (MT19937), which reproduces WASTE's synthetic test container
//!   byte for byte (CONTAINER.md §10.2), is the engine's
//!   [`ds41_engine::tokenizer::python_random::PythonRandom`] (one implementation for the
//!   tokenizer corpus and the container).

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
}
