//! The project's top-k tie rule (MODEL.md §5.10): larger value first; among equal values the
//! lower index wins. Used by MoE routing, candidate blocks and index selection. +∞ and −∞
//! are ordinary values; NaN is an error, never a value.

use super::pool::PoolVec;
use crate::{Error, Result};

/// Indices of the `k` largest `values`, in selection order (largest first, ties → lower
/// index). `ties_reversed` is the negative control `Defect::TopkTiesReversed` (ties →
/// higher index). `what` names the decision in the NaN error.
pub fn topk(values: &[f32], k: usize, ties_reversed: bool, what: &str) -> Result<PoolVec<usize>> {
    if let Some(i) = values.iter().position(|v| v.is_nan()) {
        return Err(Error::Model(format!("{what}: NaN score at index {i}")));
    }
    let mut order: PoolVec<usize> = (0..values.len()).collect();
    // NaN-free, so partial_cmp is total here. (An unstable sort: the comparison is total and
    // breaks every tie by index, so the order is unique, and it needs no buffer.)
    order.sort_unstable_by(|&a, &b| {
        let by_value = values[b]
            .partial_cmp(&values[a])
            .unwrap_or(std::cmp::Ordering::Equal);
        by_value.then(if ties_reversed { b.cmp(&a) } else { a.cmp(&b) })
    });
    order.truncate(k.min(values.len()));
    Ok(order)
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
}
