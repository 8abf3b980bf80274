//! Engram statements of a conversion (CONTAINER.md §6): the token map must be the release's
//! (token id → compressed id, every id), the hash constants the release's (multipliers, primes,
//! offsets, sizes; the pad as the compressed id of the release's pad token), and each table's
//! values within their quantisation step ([`EngramSteps`], used by the round trip).

use std::collections::BTreeMap;
use std::path::Path;

use ds41_engine::checkpoint::Checkpoint;
use ds41_engine::config::EngramPad;
use ds41_engine::io::{map_file, MappedFile};
use ds41_engine::model::TokenMap;
use half::f16;
use serde::Serialize;
use serde_json::Value;

use super::roundtrip::StepSource;

#[derive(Debug, Clone, Default, Serialize)]
pub struct EngramReport {
    pub layers: usize,
    /// Token ids compared, and those whose compressed id differs (first few).
    pub token_map_ids: usize,
    pub token_map_differences: usize,
    pub failures: Vec<String>,
}

/// Compare the token maps and the hash constants.
pub fn check(
    release: &dyn Checkpoint,
    release_dir: &Path,
    container: &dyn Checkpoint,
) -> EngramReport {
    let mut r = EngramReport::default();
    let cfg = release.config();
    if cfg.engram_layer_ids.is_empty() {
        return r;
    }
    r.layers = cfg.engram_layer_ids.len();
    let release_map = match release
        .engram_token_map()
        .and_then(|shipped| TokenMap::FromCheckpoint.resolve(release_dir, shipped, cfg))
    {
        Ok(m) => m,
        Err(e) => {
            r.failures.push(format!(
                "the release's Engram token map cannot be built: {e}"
            ));
            return r;
        }
    };
    match container.engram_token_map() {
        Ok(Some(map)) => {
            r.token_map_ids = release_map.len().max(map.len());
            let diffs: Vec<usize> = (0..r.token_map_ids)
                .filter(|&t| release_map.get(t) != map.get(t))
                .collect();
            r.token_map_differences = diffs.len();
            if let Some(&t) = diffs.first() {
                let show = |m: &[i32]| m.get(t).map_or("none".into(), |x| x.to_string());
                r.failures.push(format!(
                    "engram-tokmap.bin: {} of {} token ids map differently; first token {t}: container {}, release {}",
                    diffs.len(),
                    r.token_map_ids,
                    show(&map),
                    show(&release_map)
                ));
            }
        }
        Ok(None) => r
            .failures
            .push("engram-tokmap.bin: the container ships no token map".into()),
        Err(e) => r.failures.push(format!("engram-tokmap.bin: {e}")),
    }
    let (rk, ck) = match (release.engram_constants(), container.engram_constants()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) => {
            r.failures
                .push(format!("the release's Engram hash constants: {e}"));
            return r;
        }
        (_, Err(e)) => {
            r.failures.push(format!("engram.json: {e}"));
            return r;
        }
    };
    let mut out = Vec::new();
    let mut diff = |field: String, a: String, b: String| {
        if a != b {
            out.push(format!("engram.json `{field}`: container {b}, release {a}"));
        }
    };
    diff(
        "max_ngram_size".into(),
        rk.max_ngram_size.to_string(),
        ck.max_ngram_size.to_string(),
    );
    diff(
        "n_heads".into(),
        rk.n_heads.to_string(),
        ck.n_heads.to_string(),
    );
    diff(
        "compressed_vocab_size".into(),
        rk.compressed_vocab_size.to_string(),
        ck.compressed_vocab_size.to_string(),
    );
    let release_pad = match rk.pad {
        EngramPad::RawToken(t) => usize::try_from(t)
            .ok()
            .and_then(|t| release_map.get(t))
            .map(|&c| i64::from(c)),
        EngramPad::Compressed(c) => Some(c),
    };
    let container_pad = match ck.pad {
        EngramPad::Compressed(c) => Some(c),
        EngramPad::RawToken(t) => usize::try_from(t)
            .ok()
            .and_then(|t| release_map.get(t))
            .map(|&c| i64::from(c)),
    };
    if rk.layers.len() != ck.layers.len() {
        diff(
            "layers".into(),
            format!("{} layers", rk.layers.len()),
            format!("{} layers", ck.layers.len()),
        );
    }
    for (i, (a, b)) in rk.layers.iter().zip(&ck.layers).enumerate() {
        diff(
            format!("layers[{i}].layer"),
            a.layer.to_string(),
            b.layer.to_string(),
        );
        diff(
            format!("layers[{i}].multipliers"),
            format!("{:?}", a.multipliers),
            format!("{:?}", b.multipliers),
        );
        diff(
            format!("layers[{i}].primes"),
            format!("{:?}", a.primes),
            format!("{:?}", b.primes),
        );
        diff(
            format!("layers[{i}].offsets"),
            format!("{:?}", a.offsets),
            format!("{:?}", b.offsets),
        );
    }
    r.failures.extend(out);
    if release_pad != container_pad {
        r.failures.push(format!(
            "engram.json `pad_id`: container {container_pad:?}, release {release_pad:?} (the compressed id of its pad {:?})",
            rk.pad
        ));
    }
    r
}

struct Table {
    map: MappedFile,
    dim: usize,
    group: usize,
    bits: usize,
    row_bytes: usize,
    rows: usize,
}

/// The f16 group scales of a container's Engram tables, read from `engram-L{l}.bin` as the
/// manifest lays them out (CONTAINER.md §6).
#[derive(Default)]
pub struct EngramSteps {
    tables: BTreeMap<usize, Table>,
}

impl EngramSteps {
    /// Tables whose manifest entry is complete and whose file maps; the bits of each.
    pub fn open(dir: &Path, manifest: &Value) -> (EngramSteps, BTreeMap<usize, usize>) {
        let mut s = EngramSteps::default();
        let mut bits = BTreeMap::new();
        let Some(obj) = manifest.get("engram").and_then(Value::as_object) else {
            return (s, bits);
        };
        for (k, v) in obj {
            let get = |key: &str| v.get(key).and_then(Value::as_u64).map(|x| x as usize);
            let (Ok(l), Some(rows), Some(dim), Some(group), Some(b), Some(row_bytes)) = (
                k.parse::<usize>(),
                get("rows"),
                get("dim"),
                get("group"),
                get("bits"),
                get("row_bytes"),
            ) else {
                continue;
            };
            bits.insert(l, b);
            if group == 0 || dim % group != 0 || row_bytes != dim * b / 8 + dim / group * 2 {
                continue;
            }
            if let Ok(map) = map_file(&dir.join(format!("engram-L{l}.bin"))) {
                if map.len() >= rows * row_bytes {
                    s.tables.insert(
                        l,
                        Table {
                            map,
                            dim,
                            group,
                            bits: b,
                            row_bytes,
                            rows,
                        },
                    );
                }
            }
        }
        (s, bits)
    }
}

impl StepSource for EngramSteps {
    fn steps(&self, name: &str, first_row: usize, out: &mut [f32]) -> Option<()> {
        let l: usize = name
            .strip_prefix("layers.")?
            .strip_suffix(".engram.embed.weight")?
            .parse()
            .ok()?;
        let t = self.tables.get(&l)?;
        let n = out.len() / t.dim;
        if first_row + n > t.rows {
            return None;
        }
        for j in 0..n {
            let row = &t.map[(first_row + j) * t.row_bytes..(first_row + j + 1) * t.row_bytes];
            let at = t.dim * t.bits / 8;
            for c in 0..t.dim {
                let o = at + 2 * (c / t.group);
                out[j * t.dim + c] =
                    f16::from_bits(u16::from_le_bytes([row[o], row[o + 1]])).to_f32();
            }
        }
        Some(())
    }
}
