//! The metrics of CONTRACT.md §5.

/// rel L2 = ||e - g|| / ||g|| (||e - g|| when g = 0); non-finite engine values give +inf.
pub fn rel_l2(e: &[f64], g: &[f64]) -> f64 {
    if e.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = e
        .iter()
        .zip(g)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let n: f64 = g.iter().map(|b| b * b).sum::<f64>().sqrt();
    if n > 0.0 {
        d / n
    } else {
        d
    }
}

pub fn max_abs(e: &[f64], g: &[f64]) -> f64 {
    e.iter()
        .zip(g)
        .map(|(a, b)| {
            if a.is_finite() {
                (a - b).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Index of the largest value, ties -> lower index.
pub fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Indices of the `k` largest values (ties -> lower index).
pub fn top_k(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        v[b].partial_cmp(&v[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}
