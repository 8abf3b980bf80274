//! Layer roles (MODEL.md §3): which layer a layer reads compressed KV, top-k lists and
//! index keys from. "Most recent" = the highest source layer id at or below l.

/// The highest entry of `sources` that is ≤ `layer`.
pub fn most_recent(sources: &[usize], layer: usize) -> Option<usize> {
    sources.iter().copied().filter(|&s| s <= layer).max()
}
