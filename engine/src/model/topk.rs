//! The project's top-k tie rule (MODEL.md §5.10): larger value first; among equal values the
//! lower index wins. Used by MoE routing, candidate blocks and index selection. +∞ and −∞
//! are ordinary values; NaN is an error, never a value.
//!
//! Every selection also reports its margin, the distance of the decision from a flip, defined
//! as the official goldens define it (upstream `official_a/README.md`, `margin.*`):
//! (k-th − (k+1)-th largest value) / max |finite value|. 0 is an exact tie; ∞ means there is
//! no competition: k = 0, k ≥ n, or the k-th value is already −∞ (every scored entry is taken
//! and the rest are −∞ alike).

use super::pool::PoolVec;
use crate::{Error, Result};

/// The indices a top-k chose, in selection order, and how close the choice was to a flip.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub indices: PoolVec<usize>,
    /// See the module documentation.
    pub margin: f32,
}

/// Indices of the `k` largest `values`, in selection order (largest first, ties → lower
/// index). `ties_reversed` is the negative control `Defect::TopkTiesReversed` (ties →
/// higher index). `what` names the decision in the NaN error.
pub fn topk(values: &[f32], k: usize, ties_reversed: bool, what: &str) -> Result<PoolVec<usize>> {
    Ok(select(values, k, ties_reversed, what)?.indices)
}

/// [`topk`] with the selection margin.
pub fn select(values: &[f32], k: usize, ties_reversed: bool, what: &str) -> Result<Selection> {
    if let Some(i) = values.iter().position(|v| v.is_nan()) {
        return Err(Error::Model(format!("{what}: NaN score at index {i}")));
    }
    // NaN-free, so partial_cmp is total here, and every tie is broken by index: the order is
    // unique, so an unstable sort is exact and needs no buffer.
    let rule = |&a: &usize, &b: &usize| {
        let by_value = values[b]
            .partial_cmp(&values[a])
            .unwrap_or(std::cmp::Ordering::Equal);
        by_value.then(if ties_reversed { b.cmp(&a) } else { a.cmp(&b) })
    };
    let mut order = if k < values.len() {
        first_places(values, k + 1, ties_reversed, rule)
    } else {
        let mut order: PoolVec<usize> = (0..values.len()).collect();
        order.sort_unstable_by(rule);
        order
    };
    let margin = margin(values, &order, k);
    order.truncate(k.min(values.len()));
    Ok(Selection {
        indices: order,
        margin,
    })
}

/// The first `places` (< values.len()) indices in the order of the tie rule (`rule`), in that
/// order. Only they are needed (the selection and the margin's runner-up). With `t` the
/// `places`-th largest value, they are the values above `t`, sorted (fewer than `places`),
/// then the values equal to `t` in index order (the tie rule), as many as are left: found by
/// one selection over the values themselves and one pass, not by ordering all indices.
fn first_places(
    values: &[f32],
    places: usize,
    ties_reversed: bool,
    rule: impl Fn(&usize, &usize) -> std::cmp::Ordering,
) -> PoolVec<usize> {
    let mut scratch = PoolVec::from_slice(values);
    let (_, &mut t, _) = scratch.select_nth_unstable_by(places - 1, |a, b| {
        b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal)
    });
    drop(scratch);
    let mut order: PoolVec<usize> = (0..values.len()).filter(|&i| values[i] > t).collect();
    order.sort_unstable_by(&rule);
    let left = places - order.len();
    let tied = |i: &usize| values[*i] == t;
    if ties_reversed {
        order.extend((0..values.len()).rev().filter(tied).take(left));
    } else {
        order.extend((0..values.len()).filter(tied).take(left));
    }
    order
}

/// The margin of choosing the first `k` of `order` (all indices; the first k + 1 in the order
/// of the tie rule).
fn margin(values: &[f32], order: &[usize], k: usize) -> f32 {
    if k == 0 || k >= order.len() {
        return f32::INFINITY;
    }
    let (kth, next) = (values[order[k - 1]], values[order[k]]);
    if kth == f32::NEG_INFINITY {
        return f32::INFINITY;
    }
    let scale = values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(1e-30);
    // f32 arithmetic as the golden's recorder does it; +∞ − finite is +∞ (a pinned block).
    let m = (kth - next) / scale;
    if m.is_nan() {
        0.0
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_index() {
        let v = [1.0, 3.0, 3.0, f32::NEG_INFINITY, 3.0, f32::INFINITY];
        assert_eq!(topk(&v, 3, false, "t").unwrap(), vec![5, 1, 2]);
        assert_eq!(topk(&v, 3, true, "t").unwrap(), vec![5, 4, 2]);
        assert_eq!(topk(&v, 10, false, "t").unwrap(), vec![5, 1, 2, 4, 0, 3]);
    }

    #[test]
    fn nan_is_an_error() {
        assert!(topk(&[0.0, f32::NAN], 1, false, "router").is_err());
    }

    #[test]
    fn margins_follow_the_golden_definition() {
        let m = |v: &[f32], k| select(v, k, false, "t").unwrap().margin;
        // (k-th − (k+1)-th) / max |finite|.
        assert_eq!(m(&[4.0, 1.0, 2.0, -8.0], 2), (2.0 - 1.0) / 8.0);
        assert_eq!(m(&[1.0, 3.0, 3.0], 1), 0.0, "exact tie at the boundary");
        assert_eq!(
            m(&[1.0, 3.0, 3.0], 2),
            2.0 / 3.0,
            "the tie is inside the selection"
        );
        assert_eq!(m(&[1.0, 2.0], 2), f32::INFINITY, "k = n: nothing left out");
        assert_eq!(m(&[1.0, 2.0], 0), f32::INFINITY);
        let inf = f32::INFINITY;
        let ninf = f32::NEG_INFINITY;
        // A pinned +∞ block is not part of the scale; the gap below it is finite.
        assert_eq!(m(&[inf, 2.0, 1.0, 0.5], 2), (2.0 - 1.0) / 2.0);
        // Finite entries all taken, −∞ beyond: no competition.
        assert_eq!(m(&[2.0, ninf, ninf], 1), inf);
        assert_eq!(m(&[2.0, ninf, ninf], 2), inf);
        // All zero (every ReLU off): a tie, the scale floor keeps it finite.
        assert_eq!(m(&[0.0, 0.0, 0.0], 1), 0.0);
    }

    /// The partitioned selection gives exactly the places a full sort gives, for every k, on
    /// values full of ties and infinities, in both tie modes.
    #[test]
    fn partial_selection_equals_the_full_sort() {
        let mut state = 9u64;
        for n in 0..60usize {
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    match (state >> 33) % 9 {
                        0 => f32::INFINITY,
                        1 => f32::NEG_INFINITY,
                        // Equal to +0 (r = 4) in value: a tie by the rule.
                        2 => -0.0,
                        r => r as f32 * 0.5 - 2.0,
                    }
                })
                .collect();
            for reversed in [false, true] {
                let mut full: Vec<usize> = (0..n).collect();
                full.sort_by(|&a, &b| {
                    values[b]
                        .partial_cmp(&values[a])
                        .unwrap()
                        .then(if reversed { b.cmp(&a) } else { a.cmp(&b) })
                });
                for k in 0..=n + 1 {
                    let got = select(&values, k, reversed, "t").unwrap();
                    assert_eq!(&got.indices[..], &full[..k.min(n)], "n {n} k {k}");
                    let want = margin(&values, &full, k);
                    assert!(
                        got.margin.to_bits() == want.to_bits(),
                        "n {n} k {k}: margin {} want {want}",
                        got.margin
                    );
                }
            }
        }
    }
}
