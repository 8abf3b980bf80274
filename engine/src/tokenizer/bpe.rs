//! Byte-level BPE merging (TOKENIZER.md §6): a pre-token's bytes start as byte symbols and the
//! adjacent pair with the lowest merge rank is merged, leftmost first on ties, until no pair
//! has a merge. This is the HF `tokenizers` order (its heap orders by rank, then position).
//!
//! Two equivalent strategies: short words (the vast majority) merge in place in a small
//! vector, rescanning a rank array; long words (e.g. 600 bytes of `=`) use a linked list and
//! a min-heap so the work stays O(n log n). A unit test checks that both agree.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The merge that joins a pair: its rank (position in `merges`) and the resulting token id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Merge {
    pub rank: u32,
    pub id: u32,
}

/// Words longer than this many bytes use the heap strategy.
const SMALL_WORD_MAX: usize = 48;

const NO_MERGE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct Bpe {
    /// Key: `left_id << 32 | right_id`.
    merges: foldhash::HashMap<u64, Merge>,
    /// Token id of each single-byte symbol.
    byte_ids: [u32; 256],
}

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// Reusable buffers for [`Bpe::encode_word`], so encoding a text does not allocate per word.
#[derive(Default)]
pub struct Scratch {
    symbols: Vec<u32>,
    ranks: Vec<u32>,
    nodes: Vec<Node>,
    heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
}

#[derive(Clone, Copy)]
struct Node {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NONE: u32 = u32::MAX;

impl Bpe {
    /// `merges` in rank order as (left id, right id, result id); later duplicates of a pair
    /// replace earlier ones, as in HF `tokenizers`.
    pub fn new(byte_ids: [u32; 256], merges: impl IntoIterator<Item = (u32, u32, u32)>) -> Self {
        let mut map = foldhash::HashMap::default();
        for (rank, (left, right, id)) in merges.into_iter().enumerate() {
            map.insert(
                pair_key(left, right),
                Merge {
                    rank: rank as u32,
                    id,
                },
            );
        }
        Bpe {
            merges: map,
            byte_ids,
        }
    }

    pub fn num_merges(&self) -> usize {
        self.merges.len()
    }

    #[inline]
    fn merge(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    #[inline]
    fn rank(&self, left: u32, right: u32) -> u32 {
        self.merge(left, right).map_or(NO_MERGE, |m| m.rank)
    }

    /// Appends the token ids of one pre-token to `out`.
    pub fn encode_word(&self, bytes: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        match bytes.len() {
            0 => {}
            1 => out.push(self.byte_ids[bytes[0] as usize]),
            n if n <= SMALL_WORD_MAX => self.encode_small(bytes, scratch, out),
            _ => self.encode_linked(bytes, scratch, out),
        }
    }

    /// In-place merging with a rank per adjacent pair; O(n²) compares but only two hash
    /// look-ups per merge.
    pub(crate) fn encode_small(&self, bytes: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let syms = &mut scratch.symbols;
        let ranks = &mut scratch.ranks;
        syms.clear();
        syms.extend(bytes.iter().map(|&b| self.byte_ids[b as usize]));
        ranks.clear();
        ranks.extend(syms.windows(2).map(|w| self.rank(w[0], w[1])));
        loop {
            let mut best = NO_MERGE;
            let mut at = 0;
            for (i, &r) in ranks.iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == NO_MERGE {
                break;
            }
            let merged = self
                .merge(syms[at], syms[at + 1])
                .expect("a finite rank has a merge");
            syms[at] = merged.id;
            syms.remove(at + 1);
            ranks.remove(at);
            if at < ranks.len() {
                ranks[at] = self.rank(syms[at], syms[at + 1]);
            }
            if at > 0 {
                ranks[at - 1] = self.rank(syms[at - 1], syms[at]);
            }
        }
        out.extend_from_slice(syms);
    }

    /// Linked list plus a min-heap of (rank, position); stale heap entries are recognised by
    /// the ids they were pushed with (a symbol's id only changes when its span grows).
    pub(crate) fn encode_linked(&self, bytes: &[u8], scratch: &mut Scratch, out: &mut Vec<u32>) {
        let n = bytes.len();
        let nodes = &mut scratch.nodes;
        let heap = &mut scratch.heap;
        nodes.clear();
        heap.clear();
        nodes.extend(bytes.iter().enumerate().map(|(i, &b)| Node {
            id: self.byte_ids[b as usize],
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i + 1 == n { NONE } else { i as u32 + 1 },
            alive: true,
        }));
        let push = |heap: &mut BinaryHeap<_>, nodes: &[Node], pos: u32| {
            let left = nodes[pos as usize];
            if left.next == NONE {
                return;
            }
            let right = nodes[left.next as usize].id;
            if let Some(m) = self.merge(left.id, right) {
                heap.push(Reverse((m.rank, pos, left.id, right)));
            }
        };
        for pos in 0..n as u32 - 1 {
            push(heap, nodes, pos);
        }
        while let Some(Reverse((_, pos, left_id, right_id))) = heap.pop() {
            let left = nodes[pos as usize];
            if !left.alive || left.id != left_id || left.next == NONE {
                continue;
            }
            let right_pos = left.next;
            let right = nodes[right_pos as usize];
            if right.id != right_id {
                continue;
            }
            let merged = self
                .merge(left_id, right_id)
                .expect("pushed pairs have a merge");
            nodes[pos as usize].id = merged.id;
            nodes[pos as usize].next = right.next;
            nodes[right_pos as usize].alive = false;
            if right.next != NONE {
                nodes[right.next as usize].prev = pos;
            }
            if left.prev != NONE {
                push(heap, nodes, left.prev);
            }
            push(heap, nodes, pos);
        }
        let mut at = 0u32;
        while at != NONE {
            let node = nodes[at as usize];
            out.push(node.id);
            at = node.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator for the synthetic tables below.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    /// Random merges over a 4-letter alphabet: both strategies must agree on every word, and
    /// a hand-checked case pins the rank/leftmost order.
    #[test]
    fn small_and_linked_strategies_agree() {
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = b as u32;
        }
        let mut state = 7u64;
        let mut merges = Vec::new();
        let mut next_id = 256u32;
        let mut known: Vec<u32> = (b'a'..=b'd').map(u32::from).collect();
        for _ in 0..200 {
            let l = known[(lcg(&mut state) % known.len() as u64) as usize];
            let r = known[(lcg(&mut state) % known.len() as u64) as usize];
            merges.push((l, r, next_id));
            known.push(next_id);
            next_id += 1;
        }
        let bpe = Bpe::new(byte_ids, merges);
        let mut scratch = Scratch::default();
        for len in 1..120 {
            for _ in 0..20 {
                let word: Vec<u8> = (0..len)
                    .map(|_| b'a' + (lcg(&mut state) % 4) as u8)
                    .collect();
                let (mut a, mut b) = (Vec::new(), Vec::new());
                bpe.encode_small(&word, &mut scratch, &mut a);
                bpe.encode_linked(&word, &mut scratch, &mut b);
                assert_eq!(a, b, "word {:?}", String::from_utf8_lossy(&word));
            }
        }
    }

    #[test]
    fn leftmost_first_on_equal_ranks() {
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = b as u32;
        }
        // "a a" -> 256, then "256 a" -> 257.
        let bpe = Bpe::new(byte_ids, [(97, 97, 256), (256, 97, 257)]);
        let mut scratch = Scratch::default();
        for strategy in [Bpe::encode_small, Bpe::encode_linked] {
            let mut out = Vec::new();
            strategy(&bpe, b"aaa", &mut scratch, &mut out);
            assert_eq!(out, vec![257]);
            out.clear();
            strategy(&bpe, b"aaaa", &mut scratch, &mut out);
            assert_eq!(out, vec![256, 256]);
        }
    }
}
