//! Index keys and queries as small integers, so that their dot products are exact integer
//! sums (MODEL.md §6.4.4, rule C2 of §5.4).
//!
//! Upstream, index keys and queries are FP4/E8M0-QDQ'd in blocks of 32 (§5.3): every value is
//! an e2m1 value times the block's power of two. For `u = 2^(floor(log2 max|v|) − 6)` every
//! value of such a block is an integer `c · u` with |c| ≤ 127 ([`GridBlock::of`] checks this on
//! the values themselves and declines a block where it does not hold, e.g. any block of the
//! exact profile). A key · query dot is then `Σ_b u_qb · u_kb · Σ_{k∈b} c_q c_k`, each block's
//! integer sum exact in 32 bits (|Σ| ≤ 32 · 127² < 2^19).
//!
//! Rule C2 defines the dot as one f64 chain in increasing index. Every product is a multiple of
//! the smallest `U = u_q · u_k` among the blocks, and every partial sum is bounded by
//! `blocks · 2^19 · U_max`; where `U_max / U_min` is small enough ([`MAX_SPREAD`]) every partial
//! sum is exactly the real number, so the chain's result is the exact sum, which the integer
//! form gives in any order: the same f64 (`simd::vnni::index_dots_vnni`; a zero may differ in
//! sign, which the score's ReLU and its sum from +0 over heads erase).

use super::pool::{poolable, PoolVec};
use super::quant::BLOCK;

/// Keys per tile: the keys one scorer call takes, one per lane (`indexer::KEY_LANES`).
pub const TILE_KEYS: usize = 32;

/// Largest `log2(U_max / U_min)` over one dot's blocks for which the chain is exact: partial
/// sums, multiples of `U_min`, stay below `2^(19 + 10 + MAX_SPREAD) · U_min = 2^53 · U_min`
/// for up to 2^10 blocks, so each is an f64.
pub const MAX_SPREAD: i32 = 24;

/// Most 32-value blocks per key for which [`MAX_SPREAD`] holds (`2^10`).
const MAX_BLOCKS: usize = 1 << 10;

/// One 32-value block on its integer grid: `value[k] = codes[k] · unit`.
#[derive(Clone, Copy, Debug)]
pub struct GridBlock {
    pub codes: [i8; BLOCK],
    pub unit: f64,
    /// `log2 unit`, `None` for a block of zeros (its products add exact zeros at any unit).
    pub exp: Option<i32>,
}

impl GridBlock {
    /// The block's integer form, or `None` where a value is not finite or not an integer
    /// multiple of the unit chosen from the largest magnitude.
    pub fn of(x: &[f32]) -> Option<GridBlock> {
        debug_assert_eq!(x.len(), BLOCK);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut block = GridBlock {
            codes: [0; BLOCK],
            unit: 1.0,
            exp: None,
        };
        if amax == 0.0 {
            // `max` passes over a NaN: every value must be a zero.
            return x.iter().all(|&v| v == 0.0).then_some(block);
        }
        if !amax.is_finite() {
            return None;
        }
        // floor(log2 amax) of an f32 (subnormals included), read off its f64 widening.
        let e = ((f64::from(amax).to_bits() >> 52) as i32) - 1023;
        let exp = e - 6;
        let (unit, to_codes) = (pow2(exp), pow2(-exp));
        for (c, &v) in block.codes.iter_mut().zip(x) {
            // Exact: a power of two far from the f64 limits. |n| < 128 by the choice of unit.
            let n = f64::from(v) * to_codes;
            let i = n as i32;
            if f64::from(i) != n {
                return None;
            }
            *c = i as i8;
        }
        block.unit = unit;
        block.exp = Some(exp);
        Some(block)
    }
}

/// `2^e` for |e| < 1023.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Smallest and largest exponent of a set of blocks (`None`: no nonzero block).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExpRange(Option<(i32, i32)>);

impl ExpRange {
    fn add(&mut self, exp: Option<i32>) {
        if let Some(e) = exp {
            self.0 = Some(self.0.map_or((e, e), |(lo, hi)| (lo.min(e), hi.max(e))));
        }
    }

    /// Whether every dot between a member of `self` and one of `other` is exact in the chain.
    pub fn fits_with(self, other: ExpRange) -> bool {
        match (self.0, other.0) {
            (Some((a_lo, a_hi)), Some((b_lo, b_hi))) => (a_hi + b_hi) - (a_lo + b_lo) <= MAX_SPREAD,
            _ => true,
        }
    }
}

/// The integer form of index keys, [`TILE_KEYS`] keys per tile, laid out for the VNNI
/// scorer: per tile and block, eight groups of four dimensions, each the tile's keys side by
/// side (a key's four codes one 32-bit lane). A tile with a key off the grid has none.
#[derive(Clone, Debug, Default)]
pub struct KeyTiles {
    blocks: usize,
    count: usize,
    /// Per (tile, block, group of four dimensions): `[key][4]` codes.
    codes: Vec<[i8; 4 * TILE_KEYS]>,
    /// Per (tile, block): each key's unit.
    units: Vec<[f64; TILE_KEYS]>,
    /// Per (tile, block): each key's sum of codes (for the queries' +128 bias).
    sums: Vec<[i32; TILE_KEYS]>,
    /// Per tile: its exponents, `None` once a key is off the grid.
    ranges: Vec<Option<ExpRange>>,
}

/// One tile of [`KeyTiles`], as the scorer reads it.
#[derive(Clone, Copy, Debug)]
pub struct KeyTile<'a> {
    pub codes: &'a [[i8; 4 * TILE_KEYS]],
    pub units: &'a [[f64; TILE_KEYS]],
    pub sums: &'a [[i32; TILE_KEYS]],
    pub range: ExpRange,
}

impl KeyTile<'_> {
    /// One query head's dots with the tile's keys by definition, in scalar code (what
    /// `simd::vnni::index_dots_vnni` computes, operation for operation): per key, from −0.0,
    /// block by block in order, `+= (Σ (c_q + 128) c_k − 128 Σ c_k) · u_k · u_q`.
    pub fn dots(&self, (biased, q_units): (&[[u8; BLOCK]], &[f64])) -> [f64; TILE_KEYS] {
        let mut dots = [-0.0f64; TILE_KEYS];
        for (b, (q, &q_unit)) in biased.iter().zip(q_units).enumerate() {
            for (j, d) in dots.iter_mut().enumerate() {
                let biased_sum: i32 = (0..BLOCK)
                    .map(|k| i32::from(q[k]) * i32::from(self.codes[8 * b + k / 4][4 * j + k % 4]))
                    .sum();
                let sum = biased_sum - 128 * self.sums[b][j];
                *d += f64::from(sum) * self.units[b][j] * q_unit;
            }
        }
        dots
    }
}

impl KeyTiles {
    /// Empty tiles for keys of `dim` values (no integer form unless a multiple of 32).
    pub fn new(dim: usize) -> KeyTiles {
        let blocks = if dim.is_multiple_of(BLOCK) && dim / BLOCK <= MAX_BLOCKS {
            dim / BLOCK
        } else {
            0
        };
        KeyTiles {
            blocks,
            ..KeyTiles::default()
        }
    }

    /// Append keys (`[n, dim]`).
    pub fn extend(&mut self, keys: &[f32], dim: usize) {
        if dim == 0 {
            return;
        }
        for key in keys.chunks_exact(dim) {
            self.push(key);
        }
    }

    fn push(&mut self, key: &[f32]) {
        let nb = self.blocks;
        let (tile, lane) = (self.count / TILE_KEYS, self.count % TILE_KEYS);
        self.count += 1;
        if lane == 0 {
            self.codes.resize((tile + 1) * nb * 8, [0; 4 * TILE_KEYS]);
            self.units.resize((tile + 1) * nb, [1.0; TILE_KEYS]);
            self.sums.resize((tile + 1) * nb, [0; TILE_KEYS]);
            self.ranges.push(if nb > 0 {
                Some(ExpRange::default())
            } else {
                None
            });
        }
        let Some(mut range) = self.ranges[tile] else {
            return;
        };
        for (b, values) in key.chunks_exact(BLOCK).enumerate() {
            let Some(g) = GridBlock::of(values) else {
                self.ranges[tile] = None;
                return;
            };
            let at = tile * nb + b;
            for (group, codes) in g.codes.chunks_exact(4).enumerate() {
                self.codes[8 * at + group][4 * lane..][..4].copy_from_slice(codes);
            }
            self.units[at][lane] = g.unit;
            self.sums[at][lane] = g.codes.iter().map(|&c| i32::from(c)).sum();
            range.add(g.exp);
        }
        self.ranges[tile] = Some(range);
    }

    /// Capacity for `keys` keys in all (capacity only), so appending never reallocates
    /// inside a step.
    pub fn reserve(&mut self, keys: usize) {
        let (tiles, nb) = (keys.div_ceil(TILE_KEYS), self.blocks);
        let more = |have: usize, want: usize| want.saturating_sub(have);
        self.codes.reserve(more(self.codes.len(), tiles * nb * 8));
        self.units.reserve(more(self.units.len(), tiles * nb));
        self.sums.reserve(more(self.sums.len(), tiles * nb));
        self.ranges.reserve(more(self.ranges.len(), tiles));
    }

    /// Tile `t`, if all its keys are on the grid.
    pub fn tile(&self, t: usize) -> Option<KeyTile<'_>> {
        let range = (*self.ranges.get(t)?)?;
        let nb = self.blocks;
        Some(KeyTile {
            codes: &self.codes[8 * t * nb..8 * (t + 1) * nb],
            units: &self.units[t * nb..(t + 1) * nb],
            sums: &self.sums[t * nb..(t + 1) * nb],
            range,
        })
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }
}

/// One query's index heads on the grid: per (head, block) the codes biased by +128 (as
/// unsigned bytes, the VNNI kernel's unsigned operand) and the unit.
#[derive(Debug)]
pub struct QueryGrid {
    blocks: usize,
    biased: PoolVec<[u8; BLOCK]>,
    units: PoolVec<f64>,
    pub range: ExpRange,
}

poolable!([u8; BLOCK] => QUERY_CODE_BUFFERS);

impl QueryGrid {
    /// The grid form of `iq` (`[heads, dim]`), or `None` where a block is off the grid.
    pub fn of(iq: &[f32], dim: usize, blocks: usize) -> Option<QueryGrid> {
        if blocks == 0 || dim != blocks * BLOCK {
            return None;
        }
        let mut q = QueryGrid {
            blocks,
            biased: PoolVec::new(),
            units: PoolVec::new(),
            range: ExpRange::default(),
        };
        for values in iq.chunks_exact(BLOCK) {
            let g = GridBlock::of(values)?;
            q.biased.push(g.codes.map(|c| (i32::from(c) + 128) as u8));
            q.units.push(g.unit);
            q.range.add(g.exp);
        }
        Some(q)
    }

    /// Head `h`: its blocks' biased codes and units.
    pub fn head(&self, h: usize) -> (&[[u8; BLOCK]], &[f64]) {
        let nb = self.blocks;
        (
            &self.biased[h * nb..(h + 1) * nb],
            &self.units[h * nb..(h + 1) * nb],
        )
    }
}
