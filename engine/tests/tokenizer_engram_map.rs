//! The Engram compressed token map built from the release tokenizer equals the map the
//! official engram.py builds (MODEL.md §6.6.1), and the hash constants and the full-size hash
//! goldens agree with it: goldens/engram/ (goldens/regen/engram_release.py runs the official
//! engram.py on the release config and tokenizer). The release tokenizer comes from
//! `DS41_RELEASE`.

use std::path::Path;
use std::time::Instant;

use ds41_engine::testing::release;
use ds41_engine::tokenizer::engram_map::{compressed_vocab_size, normalize, token_map_from_file};
use ds41_engine::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Reads a 1-D little-endian int32 `.npy` (format 1.0/2.0/3.0), checking the header.
fn read_npy_i32(path: &Path) -> Result<Vec<i32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path:?}: {e}"))?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(format!("{path:?}: not an .npy file (bad magic)"));
    }
    let (header_len, header_start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("{path:?}: unsupported .npy version {v}")),
    };
    let data_start = header_start + header_len;
    let header = std::str::from_utf8(
        bytes
            .get(header_start..data_start)
            .ok_or("truncated header")?,
    )
    .map_err(|e| format!("{path:?}: header is not text: {e}"))?;
    let compact: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("'descr':'<i4'") {
        return Err(format!("{path:?}: dtype is not '<i4': {header}"));
    }
    if !compact.contains("'fortran_order':False") {
        return Err(format!("{path:?}: fortran order not supported: {header}"));
    }
    let shape = compact
        .split("'shape':(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| format!("{path:?}: no shape in {header}"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|e| format!("{path:?}: shape {shape}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let [n] = dims[..] else {
        return Err(format!(
            "{path:?}: expected a 1-D array, shape is ({shape})"
        ));
    };
    let payload = &bytes[data_start..];
    if payload.len() != 4 * n {
        return Err(format!(
            "{path:?}: {} payload bytes for {n} int32",
            payload.len()
        ));
    }
    Ok(payload
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[test]
fn npy_reader_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let npy = |descr: &str, shape: &str, payload: &[u8]| {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(payload);
        b
    };
    let good = write(
        "good.npy",
        &npy("<i4", "(2,)", &[1, 0, 0, 0, 255, 255, 255, 255]),
    );
    assert_eq!(read_npy_i32(&good).unwrap(), vec![1, -1]);
    assert!(read_npy_i32(&write("f4.npy", &npy("<f4", "(2,)", &[0; 8]))).is_err());
    assert!(read_npy_i32(&write("short.npy", &npy("<i4", "(3,)", &[0; 8]))).is_err());
    assert!(read_npy_i32(&write("2d.npy", &npy("<i4", "(1, 2)", &[0; 8]))).is_err());
    assert!(read_npy_i32(&write("magic.npy", b"NOTNUMPY\x01\x00")).is_err());
}

/// The official engram.py's outputs on the release files (goldens/engram/).
fn golden(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../goldens/engram")
        .join(name)
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn engram_map_release() {
    let tok = Tokenizer::from_file(release().join("tokenizer.json")).unwrap();
    let t0 = Instant::now();
    let map = token_map_from_file(&release().join("tokenizer.json")).unwrap();
    eprintln!("token_map_from_file: {:?}", t0.elapsed());
    let want = read_npy_i32(&golden("release_token_map_int32.npy")).unwrap();
    assert_eq!(want.len(), 129_280);
    let raw: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        hex::encode(Sha256::digest(&raw)),
        "c60a86322ec17b4142bfef3c57a8d81fb428550cdf487f88a4320cb59fe46481"
    );
    assert_eq!(map.len(), 129_280);
    let diffs: Vec<String> = (0..map.len())
        .filter(|&i| map[i] != want[i])
        .take(20)
        .map(|i| {
            format!(
                "id {i} {:?}: got {} want {}",
                tok.token(i as u32),
                map[i],
                want[i]
            )
        })
        .collect();
    let n_diff = (0..map.len()).filter(|&i| map[i] != want[i]).count();
    assert_eq!(n_diff, 0, "{n_diff} ids differ, first: {diffs:#?}");
    assert_eq!(compressed_vocab_size(&map), 99_092);
    assert_eq!(map[2], 2, "pad id 2 maps to 2");
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn is_prime(n: u64) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// Primes: the smallest primes above `engram_vocab_size - 1`, handed out in order (layer 1
/// first; within a layer n = 2, 3, 4 and heads 0..7); sums equal `engram_num_embeddings`;
/// offsets are their exclusive prefix sums; multipliers are odd and below 2 * bound + 1.
#[test]
fn engram_hash_constants_release() {
    let c = json(&golden("release_constants.json"));
    let vocab = c["engram_vocab_size"].as_u64().unwrap();
    assert_eq!(vocab, 16_000_000);
    let mut candidates = (vocab..).filter(|&n| is_prime(n));
    let mut sums = Vec::new();
    for layer in 0..2 {
        let mut flat = Vec::new();
        for n in 0..3 {
            let listed = i64s(&c["primes"][layer][n]);
            assert_eq!(listed.len(), 8);
            for p in listed {
                assert_eq!(
                    p as u64,
                    candidates.next().unwrap(),
                    "layer {layer} n={} prime",
                    n + 2
                );
                flat.push(p);
            }
        }
        let offsets = i64s(&c["offsets"][layer]);
        let mut acc = 0;
        for (col, &p) in flat.iter().enumerate() {
            assert_eq!(offsets[col], acc, "layer {layer} offset {col}");
            acc += p;
        }
        sums.push(acc);
    }
    assert_eq!(
        sums,
        vec![384_006_168, 384_016_682],
        "engram_num_embeddings of the release config"
    );
    assert_eq!(sums, i64s(&c["prime_sums"]));
    let compressed = c["compressed_vocab_size"].as_i64().unwrap();
    assert_eq!(compressed, 99_092);
    let bound = (i64::MAX / compressed) / 2;
    assert_eq!(bound, 46_539_438_283_891);
    assert_eq!(c["bound"].as_i64().unwrap(), bound);
    let spec = [
        [
            76632096046245i64,
            4839876093313,
            35959672319349,
            73987337458391,
        ],
        [
            67716810739261,
            51510806800915,
            30921347202721,
            82619226485591,
        ],
    ];
    for layer in 0..2 {
        let m = i64s(&c["multipliers"][layer]);
        assert_eq!(m, spec[layer], "MODEL.md §6.6.1 multipliers");
        for &x in &m {
            assert!(
                x % 2 == 1 && x < 2 * bound + 1,
                "multiplier {x} is 2 * draw + 1, draw < bound"
            );
            // The product with any compressed id fits in int64.
            assert!((x as i128) * (compressed as i128) < i64::MAX as i128);
        }
    }
}

/// A test-local transcription of the hash of MODEL.md §6.6.1 (the engine's own lives in the
/// model's Engram module); used only to tie the token map and constants to the golden.
fn hash_ids(map: &[i32], c: &Value, input_ids: &[i64], dead: &[usize]) -> Vec<[[i64; 24]; 2]> {
    const DEAD: i64 = -1;
    let pad = map[2] as i64;
    let hist: Vec<i64> = input_ids
        .iter()
        .enumerate()
        .map(|(p, &t)| {
            if dead.contains(&p) {
                DEAD
            } else {
                map[t as usize] as i64
            }
        })
        .collect();
    (0..hist.len())
        .map(|p| {
            let mut out = [[0i64; 24]; 2];
            for (layer, row) in out.iter_mut().enumerate() {
                let m = i64s(&c["multipliers"][layer]);
                let offsets = i64s(&c["offsets"][layer]);
                let mut blocked = false;
                let mut x = 0i64;
                let mut xs = [0i64; 4];
                for d in 0..4 {
                    blocked = blocked || p < d || hist[p - d] == DEAD;
                    let tok = if blocked { pad } else { hist[p - d] };
                    x ^= tok * m[d];
                    xs[d] = x;
                }
                for n in 2..=4 {
                    let primes = i64s(&c["primes"][layer][n - 2]);
                    for h in 0..8 {
                        let col = (n - 2) * 8 + h;
                        row[col] = xs[n - 1] % primes[h] + offsets[col];
                    }
                }
            }
            out
        })
        .collect()
}

/// Tokenizer → token map → hash ids reproduces the official hash goldens of the project's
/// probe texts (text only, and with a DEAD span).
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn engram_hash_goldens_from_engine_map() {
    let tok = Tokenizer::from_file(release().join("tokenizer.json")).unwrap();
    let map = token_map_from_file(&release().join("tokenizer.json")).unwrap();
    let c = json(&golden("release_constants.json"));
    for probe in ["folding", "code"] {
        let g = json(&golden(&format!("release_hashes_{probe}.json")));
        let input_ids = i64s(&g["input_ids"][0]);
        let mut ours: Vec<i64> = vec![0];
        ours.extend(
            tok.encode_text(g["text"].as_str().unwrap())
                .iter()
                .map(|&x| x as i64),
        );
        assert_eq!(
            ours, input_ids,
            "{probe}: BOS + encode_text(text) equals the golden's input ids"
        );
        let dead: Vec<usize> = i64s(&g["dead_positions"])
            .iter()
            .map(|&p| p as usize)
            .collect();
        assert!(!dead.is_empty());
        for (key, dead) in [
            ("hash_prefill_then_decode", vec![]),
            ("hash_with_dead", dead),
        ] {
            let got = hash_ids(&map, &c, &input_ids, &dead);
            let want = &g[key][0];
            assert_eq!(want.as_array().unwrap().len(), input_ids.len());
            for (p, row) in got.iter().enumerate() {
                for layer in 0..2 {
                    assert_eq!(
                        row[layer].to_vec(),
                        i64s(&want[p][layer]),
                        "{probe} {key} position {p} layer {layer}"
                    );
                }
            }
        }
    }
}

/// The upstream normaliser built from HF `tokenizers` normalizers (what `engram.py` runs).
fn hf_normalizer() -> tokenizers::normalizers::Sequence {
    use tokenizers::normalizers::replace::ReplacePattern;
    use tokenizers::normalizers::{Lowercase, Replace, Sequence, Strip, StripAccents, NFD, NFKC};
    let replace = |p: ReplacePattern, c: &str| Replace::new(p, c).unwrap().into();
    Sequence::new(vec![
        NFKC.into(),
        NFD.into(),
        StripAccents.into(),
        Lowercase.into(),
        replace(ReplacePattern::Regex("[ \t\r\n]+".into()), " "),
        replace(ReplacePattern::Regex("^ $".into()), "\u{E000}"),
        Strip::new(true, true).into(),
        replace(ReplacePattern::String("\u{E000}".into()), " "),
    ])
}

fn hf_normalize(n: &tokenizers::normalizers::Sequence, text: &str) -> String {
    use tokenizers::{NormalizedString, Normalizer};
    let mut s = NormalizedString::from(text);
    n.normalize(&mut s).unwrap();
    s.get().to_string()
}

/// `engram_map::normalize` equals the HF normaliser chain (the same Unicode 9.0
/// normalisation tables) on every decoded token of the release tokenizer and on every string
/// of the wide corpus, which is full of code points assigned after Unicode 9.0.
#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn normalizer_equals_hf() {
    let tok = Tokenizer::from_file(release().join("tokenizer.json")).unwrap();
    let hf = hf_normalizer();
    let mut equal = 0;
    for id in 0..tok.vocab_size() as u32 {
        let text = tok.decode(&[id], false).unwrap();
        assert_eq!(
            normalize(&text),
            hf_normalize(&hf, &text),
            "id {id} {text:?}"
        );
        equal += 1;
    }
    assert_eq!(equal, 129_280);
    let corpus = ds41_engine::tokenizer::corpus::wide(20_000, 11);
    let mut equal = 0;
    for s in &corpus {
        assert_eq!(
            normalize(&s.text),
            hf_normalize(&hf, &s.text),
            "{:?}",
            s.text
        );
        equal += 1;
    }
    assert_eq!(equal, 24_021);
}
