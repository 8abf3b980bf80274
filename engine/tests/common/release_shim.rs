//! TEST-ONLY minimal reader of a release-layout checkpoint (single model.safetensors), used
//! until the readers branch's `checkpoint::open` lands. Dequantises exactly per MODEL.md §4.5.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ds41_engine::checkpoint::{Checkpoint, Layout, Storage};
use ds41_engine::config::Config;
use ds41_engine::model::engram::{EngramHasher, EngramLayerConsts};

struct Entry {
    dtype: String,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct ReleaseShim {
    cfg: Config,
    map: memmap2::Mmap,
    base: usize,
    entries: HashMap<String, Entry>,
}

fn e4m3(b: u8) -> f32 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    s * if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}
fn e8m0(b: u8) -> f32 {
    2f32.powi(b as i32 - 127)
}
const FP4: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

impl ReleaseShim {
    pub fn open(dir: &Path) -> ReleaseShim {
        let f = std::fs::File::open(dir.join("model.safetensors")).unwrap();
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        let n = u64::from_le_bytes(map[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&map[8..8 + n]).unwrap();
        let mut entries = HashMap::new();
        for (k, v) in header.as_object().unwrap() {
            if k == "__metadata__" {
                continue;
            }
            let off = v["data_offsets"].as_array().unwrap();
            entries.insert(
                k.clone(),
                Entry {
                    dtype: v["dtype"].as_str().unwrap().to_string(),
                    shape: v["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect(),
                    start: off[0].as_u64().unwrap() as usize,
                    end: off[1].as_u64().unwrap() as usize,
                },
            );
        }
        let mut inf: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("inference/config.json")).unwrap())
                .unwrap();
        let o = inf.as_object_mut().unwrap();
        let c = o["candidate_source_layer"].as_i64().unwrap();
        o.insert(
            "candidate_source_layer".into(),
            if c < 0 {
                serde_json::Value::Null
            } else {
                c.into()
            },
        );
        o.entry("routing_bias_vl").or_insert(false.into());
        o.entry("bos_token_id").or_insert(0.into());
        o.entry("eos_token_id").or_insert(1.into());
        o.entry("image_token_id").or_insert(serde_json::Value::Null);
        o.entry("vision").or_insert(serde_json::Value::Null);
        o.entry("norm_topk_prob").or_insert(true.into());
        let cfg: Config = serde_json::from_value(inf).unwrap();
        ReleaseShim {
            cfg,
            map,
            base: 8 + n,
            entries,
        }
    }

    fn entry(&self, name: &str) -> ds41_engine::Result<&Entry> {
        self.entries
            .get(name)
            .ok_or_else(|| ds41_engine::Error::Model(format!("shim: no tensor {name}")))
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        &self.map[self.base + e.start..self.base + e.end]
    }

    /// The official_a Engram hasher: primes from the config, multipliers from numpy
    /// `default_rng(10007·layer)` (computed offline for this checkpoint), map t<4→t, else t/2+2.
    pub fn official_a_hasher(&self) -> EngramHasher {
        let primes = [[101i64, 103, 107, 109], [113, 127, 131, 137]];
        let mult = [
            vec![29432665354320283i64, 1858887604025671, 13811301742127767],
            vec![29384799188111579i64, 14248433020453935, 8698351662722477],
        ];
        let layers = (0..2)
            .map(|i| {
                let p = primes[i].to_vec();
                let mut off = vec![0i64; 4];
                for c in 1..4 {
                    off[c] = off[c - 1] + p[c - 1];
                }
                EngramLayerConsts {
                    multipliers: mult[i].clone(),
                    primes: p,
                    offsets: off,
                }
            })
            .collect();
        let map: Vec<i32> = (0..512)
            .map(|t| if t < 4 { t } else { t / 2 + 2 })
            .collect();
        EngramHasher {
            layers,
            pad: map[2] as i64,
            token_map: Arc::new(map),
            max_ngram: 3,
            n_heads: 2,
        }
    }
}

impl Checkpoint for ReleaseShim {
    fn layout(&self) -> Layout {
        Layout::Release
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
    fn shape(&self, name: &str) -> ds41_engine::Result<Vec<usize>> {
        let e = self.entry(name)?;
        let mut s = e.shape.clone();
        if e.dtype == "I8" {
            *s.last_mut().unwrap() *= 2;
        }
        Ok(s)
    }
    fn storage(&self, name: &str) -> ds41_engine::Result<Storage> {
        Ok(match self.entry(name)?.dtype.as_str() {
            "F8_E4M3" => Storage::Fp8Block,
            "I8" => Storage::Fp4,
            "BF16" => Storage::Bf16,
            _ => Storage::F32,
        })
    }
    fn tensor_f32(&self, name: &str) -> ds41_engine::Result<Vec<f32>> {
        let n: usize = self.shape(name)?.iter().product();
        let mut out = vec![0.0; n];
        self.rows_f32(name, 0, &mut out)?;
        Ok(out)
    }
    fn rows_f32(&self, name: &str, first: usize, out: &mut [f32]) -> ds41_engine::Result<()> {
        let e = self.entry(name)?;
        let shape = self.shape(name)?;
        let cols = if shape.len() >= 2 {
            shape[1..].iter().product()
        } else {
            shape.iter().product::<usize>()
        };
        let rows_total = if shape.len() >= 2 { shape[0] } else { 1 };
        let n_rows = out.len() / cols;
        assert!(
            first + n_rows <= rows_total,
            "{name}: rows {first}+{n_rows} of {rows_total}"
        );
        let b = self.bytes(e);
        match e.dtype.as_str() {
            "F32" => {
                for (i, o) in out.iter_mut().enumerate() {
                    let k = (first * cols + i) * 4;
                    *o = f32::from_le_bytes(b[k..k + 4].try_into().unwrap());
                }
            }
            "BF16" => {
                for (i, o) in out.iter_mut().enumerate() {
                    let k = (first * cols + i) * 2;
                    *o = f32::from_bits((u16::from_le_bytes([b[k], b[k + 1]]) as u32) << 16);
                }
            }
            "F8_E4M3" => {
                let s = self.entry(&name.replace(".weight", ".scale"))?;
                let sb = self.bytes(s);
                let per_row = s.shape[0] == rows_total;
                let scols = s.shape[1];
                for r in 0..n_rows {
                    let row = first + r;
                    for j in 0..cols {
                        let srow = if per_row { row } else { row / 32 };
                        let sc = e8m0(sb[srow * scols + j / 32]);
                        out[r * cols + j] = e4m3(b[row * cols + j]) * sc;
                    }
                }
            }
            "I8" => {
                let s = self.entry(&name.replace(".weight", ".scale"))?;
                let sb = self.bytes(s);
                let scols = s.shape[1];
                for r in 0..n_rows {
                    let row = first + r;
                    for j in 0..cols {
                        let byte = b[row * cols / 2 + j / 2];
                        let nib = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        let v = FP4[(nib & 7) as usize] * if nib & 8 != 0 { -1.0 } else { 1.0 };
                        out[r * cols + j] = v * e8m0(sb[row * scols + j / 32]);
                    }
                }
            }
            d => panic!("shim: dtype {d}"),
        }
        Ok(())
    }
}
