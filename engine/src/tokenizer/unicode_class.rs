//! Unicode classes used by the DS41 pre-tokenizer (TOKENIZER.md §5.2): general categories
//! L, M, N, P, S and the White_Space property (`\s`).
//!
//! The data is the generated range table in `unicode_tables.rs`, pinned to Unicode
//! [`UNICODE_VERSION`]. That is the version of `regex-syntax` 0.8.12, whose tables the HF
//! `tokenizers` crate uses; the release wide corpus (HF Python 0.23.3) agrees with it on all
//! 24,021 strings. The test `tokenizer_unicode_tables` regenerates the ranges from
//! `regex-syntax` and fails if they drift.

use std::sync::OnceLock;

pub use super::unicode_tables::{CLASS_RANGES, UNICODE_VERSION};

/// Bit flags of one code point's classes.
pub const LETTER: u8 = 1;
pub const MARK: u8 = 2;
pub const NUMBER: u8 = 4;
pub const PUNCTUATION: u8 = 8;
pub const SYMBOL: u8 = 16;
pub const WHITE_SPACE: u8 = 32;

const BLOCK_BITS: u32 = 7;
const BLOCK_LEN: usize = 1 << BLOCK_BITS;

/// Two-stage lookup table: `blocks[index[cp >> 7]][cp & 127]`. Built once from the ranges
/// (about 60 KB after de-duplicating identical blocks).
struct ClassTable {
    index: Vec<u16>,
    blocks: Vec<[u8; BLOCK_LEN]>,
}

fn table() -> &'static ClassTable {
    static TABLE: OnceLock<ClassTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut flat = vec![0u8; 0x11_0000];
        for &(start, end, mask) in CLASS_RANGES {
            for m in &mut flat[start as usize..=end as usize] {
                *m |= mask;
            }
        }
        let mut blocks: Vec<[u8; BLOCK_LEN]> = Vec::new();
        let mut seen = foldhash::HashMap::<[u8; BLOCK_LEN], u16>::default();
        let index = flat
            .chunks_exact(BLOCK_LEN)
            .map(|chunk| {
                let block: [u8; BLOCK_LEN] = chunk.try_into().expect("chunk has BLOCK_LEN bytes");
                *seen.entry(block).or_insert_with(|| {
                    blocks.push(block);
                    (blocks.len() - 1) as u16
                })
            })
            .collect();
        ClassTable { index, blocks }
    })
}

/// The class flags of `c` (0 for unassigned code points and for categories C and Z
/// that are not White_Space).
#[inline]
pub fn classes(c: char) -> u8 {
    let cp = c as u32;
    let t = table();
    t.blocks[t.index[(cp >> BLOCK_BITS) as usize] as usize][(cp as usize) & (BLOCK_LEN - 1)]
}
