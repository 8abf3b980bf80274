//! What changed between two versions of a golden: per tensor for safetensors traces (max abs,
//! relative L2 = ‖new − old‖₂ / ‖old‖₂, elements differing), per line for text.

use std::collections::BTreeSet;
use std::fmt;

use safetensors::{Dtype, SafeTensors};

#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Identical,
    /// Different bytes, same content: safetensors with equal tensors and metadata whose
    /// header was serialised in another key order.
    Equivalent,
    Tensors(Vec<TensorChange>),
    Text {
        lines_old: usize,
        lines_new: usize,
        differing: usize,
        first: Option<usize>,
    },
    Bytes {
        old: usize,
        new: usize,
    },
    New,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TensorChange {
    pub name: String,
    pub what: TensorDiff,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TensorDiff {
    Added,
    Removed,
    Layout {
        old: String,
        new: String,
    },
    Values {
        differing: usize,
        total: usize,
        max_abs: f64,
        rel_l2: f64,
    },
    Metadata,
}

impl Change {
    /// Whether the content is unchanged (byte-identical or equivalent).
    pub fn is_unchanged(&self) -> bool {
        matches!(self, Change::Identical | Change::Equivalent)
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Identical => write!(f, "unchanged"),
            Change::Equivalent => write!(
                f,
                "unchanged (same tensors and metadata; header bytes differ)"
            ),
            Change::New => write!(f, "new file"),
            Change::Bytes { old, new } => write!(f, "bytes differ ({old} -> {new} bytes)"),
            Change::Text {
                lines_old,
                lines_new,
                differing,
                first,
            } => {
                write!(
                    f,
                    "{differing} line(s) differ ({lines_old} -> {lines_new} lines)"
                )?;
                if let Some(l) = first {
                    write!(f, ", first at line {}", l + 1)?;
                }
                Ok(())
            }
            Change::Tensors(list) => {
                writeln!(f, "{} tensor(s) changed", list.len())?;
                for t in list {
                    match &t.what {
                        TensorDiff::Added => writeln!(f, "    {}: added", t.name)?,
                        TensorDiff::Removed => writeln!(f, "    {}: removed", t.name)?,
                        TensorDiff::Layout { old, new } => {
                            writeln!(f, "    {}: {old} -> {new}", t.name)?
                        }
                        TensorDiff::Metadata => writeln!(f, "    (metadata changed)")?,
                        TensorDiff::Values {
                            differing,
                            total,
                            max_abs,
                            rel_l2,
                        } => writeln!(
                            f,
                            "    {}: {differing}/{total} differ, max |d| {max_abs:.3e}, rel L2 {rel_l2:.3e}",
                            t.name
                        )?,
                    }
                }
                Ok(())
            }
        }
    }
}

/// Compare two versions of a file named `name` (the extension picks the method).
pub fn diff(name: &str, old: &[u8], new: &[u8]) -> Change {
    if old == new {
        return Change::Identical;
    }
    if name.ends_with(".safetensors") {
        if let (Ok(a), Ok(b)) = (SafeTensors::deserialize(old), SafeTensors::deserialize(new)) {
            let mut changes = diff_tensors(&a, &b);
            if metadata(old) != metadata(new) {
                changes.push(TensorChange {
                    name: "__metadata__".into(),
                    what: TensorDiff::Metadata,
                });
            }
            if changes.is_empty() {
                return Change::Equivalent;
            }
            return Change::Tensors(changes);
        }
    }
    match (std::str::from_utf8(old), std::str::from_utf8(new)) {
        (Ok(a), Ok(b)) => {
            let la: Vec<&str> = a.lines().collect();
            let lb: Vec<&str> = b.lines().collect();
            let n = la.len().max(lb.len());
            let differs = |i: usize| la.get(i) != lb.get(i);
            Change::Text {
                lines_old: la.len(),
                lines_new: lb.len(),
                differing: (0..n).filter(|&i| differs(i)).count(),
                first: (0..n).find(|&i| differs(i)),
            }
        }
        _ => Change::Bytes {
            old: old.len(),
            new: new.len(),
        },
    }
}

fn metadata(bytes: &[u8]) -> Option<std::collections::HashMap<String, String>> {
    SafeTensors::read_metadata(bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().clone())
}

fn diff_tensors(a: &SafeTensors, b: &SafeTensors) -> Vec<TensorChange> {
    let names: BTreeSet<String> = a
        .names()
        .into_iter()
        .chain(b.names())
        .map(|n| n.to_string())
        .collect();
    let mut out = Vec::new();
    for name in names {
        let what = match (a.tensor(&name), b.tensor(&name)) {
            (Ok(_), Err(_)) => TensorDiff::Removed,
            (Err(_), Ok(_)) => TensorDiff::Added,
            (Ok(x), Ok(y)) => {
                let lx = format!("{:?}{:?}", x.dtype(), x.shape());
                let ly = format!("{:?}{:?}", y.dtype(), y.shape());
                if lx != ly {
                    TensorDiff::Layout { old: lx, new: ly }
                } else if x.data() == y.data() {
                    continue;
                } else {
                    match (as_f64(x.dtype(), x.data()), as_f64(y.dtype(), y.data())) {
                        (Some(u), Some(v)) => value_diff(&u, &v),
                        _ => TensorDiff::Values {
                            differing: x
                                .data()
                                .iter()
                                .zip(y.data())
                                .filter(|(p, q)| p != q)
                                .count(),
                            total: x.data().len(),
                            max_abs: f64::NAN,
                            rel_l2: f64::NAN,
                        },
                    }
                }
            }
            (Err(_), Err(_)) => continue,
        };
        out.push(TensorChange { name, what });
    }
    out
}

fn value_diff(old: &[f64], new: &[f64]) -> TensorDiff {
    let mut differing = 0;
    let mut max_abs: f64 = 0.0;
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &n) in old.iter().zip(new) {
        // Bitwise inequality counts (NaN payloads, -0 vs +0) even where the value is equal.
        if o.to_bits() != n.to_bits() {
            differing += 1;
        }
        let d = n - o;
        max_abs = max_abs.max(d.abs());
        num += d * d;
        den += o * o;
    }
    let rel_l2 = if den > 0.0 {
        (num / den).sqrt()
    } else if num == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    TensorDiff::Values {
        differing,
        total: old.len(),
        max_abs,
        rel_l2,
    }
}

fn as_f64(dtype: Dtype, data: &[u8]) -> Option<Vec<f64>> {
    fn chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        data.chunks_exact(N)
            .map(|c| c.try_into().expect("exact chunk"))
    }
    Some(match dtype {
        Dtype::F64 => chunks::<8>(data).map(f64::from_le_bytes).collect(),
        Dtype::F32 => chunks::<4>(data)
            .map(|c| f32::from_le_bytes(c) as f64)
            .collect(),
        Dtype::BF16 => chunks::<2>(data)
            .map(|c| half::bf16::from_le_bytes(c).to_f64())
            .collect(),
        Dtype::F16 => chunks::<2>(data)
            .map(|c| half::f16::from_le_bytes(c).to_f64())
            .collect(),
        Dtype::I64 => chunks::<8>(data)
            .map(|c| i64::from_le_bytes(c) as f64)
            .collect(),
        Dtype::I32 => chunks::<4>(data)
            .map(|c| i32::from_le_bytes(c) as f64)
            .collect(),
        Dtype::I16 => chunks::<2>(data)
            .map(|c| i16::from_le_bytes(c) as f64)
            .collect(),
        Dtype::I8 => data.iter().map(|&b| b as i8 as f64).collect(),
        Dtype::U8 => data.iter().map(|&b| b as f64).collect(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn st(tensors: &[(&str, Vec<f32>)]) -> Vec<u8> {
        let bytes: Vec<(String, Vec<u8>, usize)> = tensors
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    v.len(),
                )
            })
            .collect();
        let views: Vec<(String, TensorView)> = bytes
            .iter()
            .map(|(n, b, len)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, vec![*len], b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn reports_per_tensor_max_abs_and_rel_l2() {
        let old = st(&[("logits", vec![3.0, 4.0]), ("gone", vec![1.0])]);
        let new = st(&[("logits", vec![3.0, 4.5]), ("fresh", vec![1.0])]);
        let Change::Tensors(list) = diff("t.safetensors", &old, &new) else {
            panic!("expected a tensor diff")
        };
        assert_eq!(list.len(), 3);
        let logits = list.iter().find(|t| t.name == "logits").unwrap();
        match &logits.what {
            TensorDiff::Values {
                differing,
                total,
                max_abs,
                rel_l2,
            } => {
                assert_eq!((*differing, *total), (1, 2));
                assert_eq!(*max_abs, 0.5);
                assert!((rel_l2 - 0.1).abs() < 1e-12);
            }
            other => panic!("{other:?}"),
        }
        assert!(list.iter().any(|t| t.what == TensorDiff::Added));
        assert!(list.iter().any(|t| t.what == TensorDiff::Removed));
    }

    #[test]
    fn reordered_metadata_is_equivalent_not_changed() {
        let bytes: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = TensorView::new(Dtype::F32, vec![2], &bytes).unwrap();
        let meta: std::collections::HashMap<String, String> = [("a", "1"), ("b", "2"), ("c", "3")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let old = safetensors::serialize(vec![("t", view)], Some(meta)).unwrap();
        // Rewrite the header with the metadata keys in reverse order (same length).
        let n = u64::from_le_bytes(old[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&old[8..8 + n]).unwrap();
        let mut header = header.as_object().unwrap().clone();
        let meta = header["__metadata__"].as_object().unwrap().clone();
        let reversed: serde_json::Map<String, serde_json::Value> = meta.into_iter().rev().collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(reversed));
        let mut text = serde_json::to_vec(&header).unwrap();
        text.resize(n, b' ');
        let mut new = old[..8].to_vec();
        new.extend_from_slice(&text);
        new.extend_from_slice(&old[8 + n..]);
        assert_ne!(old, new);
        assert_eq!(diff("t.safetensors", &old, &new), Change::Equivalent);
        assert!(diff("t.safetensors", &old, &new).is_unchanged());
    }

    #[test]
    fn text_diff_counts_lines() {
        let c = diff("a.jsonl", b"x\ny\nz\n", b"x\nY\nz\nw\n");
        assert_eq!(
            c,
            Change::Text {
                lines_old: 3,
                lines_new: 4,
                differing: 2,
                first: Some(1)
            }
        );
        assert_eq!(diff("a", b"same", b"same"), Change::Identical);
    }
}
