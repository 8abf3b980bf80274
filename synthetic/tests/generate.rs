//! Generation without a reader: file structure, determinism, pinned bytes, overwrite policy.

use ds41_synthetic::release::{plan_files, stored_tensors};
use ds41_synthetic::{generate, generate_with, hash_files, Layout, Options, Preset, SynthError};
use sha2::{Digest, Sha256};
use std::path::Path;

/// One digest over every file's name and sha256 (sorted by name).
fn dir_digest(dir: &Path, files: &[String]) -> String {
    let hashes = hash_files(dir, files).unwrap();
    let mut h = Sha256::new();
    for (name, sha) in &hashes {
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(sha.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

/// A safetensors file parsed by hand: the `safetensors` 0.4 crate does not know `F8_E8M0`.
/// name → (dtype, shape, data bytes), checking offsets tile the data exactly.
fn parse_st(bytes: &[u8]) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut spans = Vec::new();
    let mut out = std::collections::BTreeMap::new();
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let off: Vec<usize> = serde_json::from_value(v["data_offsets"].clone()).unwrap();
        spans.push((off[0], off[1]));
        let shape: Vec<usize> = serde_json::from_value(v["shape"].clone()).unwrap();
        out.insert(
            name,
            (
                v["dtype"].as_str().unwrap().to_string(),
                shape,
                data[off[0]..off[1]].to_vec(),
            ),
        );
    }
    spans.sort();
    let mut at = 0;
    for (a, b) in spans {
        assert_eq!(a, at, "tensors tile the data");
        at = b;
    }
    assert_eq!(at, data.len(), "no trailing bytes");
    out
}

fn gen(preset: &str, layout: Layout, seed: u64) -> (tempfile::TempDir, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let g = generate(preset, layout, seed, &tmp.path().join("ck")).unwrap();
    (tmp, g.files)
}

#[test]
fn tiny_release_safetensors_hold_every_tensor_with_release_dtype_and_shape() {
    let (tmp, files) = gen("tiny", Layout::Release, 0);
    let dir = tmp.path().join("ck");
    assert!(files.contains(&"model.safetensors".to_string()));
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = parse_st(&bytes);
    let p = Preset::by_name("tiny").unwrap();
    let want = stored_tensors(&p.geometry);
    assert_eq!(st.len(), want.len());
    for w in &want {
        let (dtype, shape, data) = st
            .get(&w.name)
            .unwrap_or_else(|| panic!("{} missing", w.name));
        assert_eq!(dtype, w.dtype, "{}", w.name);
        assert_eq!(shape, &w.shape, "{}", w.name);
        assert_eq!(data.len(), w.nbytes(), "{}", w.name);
    }
    // MODEL.md §4.6 at toy size: 30 common tensors per layer (bias_vl included) + 6 per routed
    // expert; role extras of §4.3 (ratio-2 source 8, ratio-1 source 7, index-only 3); 6 per
    // Engram layer; embed, head, norm.
    assert_eq!(want.len(), 6 * (30 + 4 * 6) + (8 + 7 + 3) + 2 * 6 + 3);
}

#[test]
fn sharded_index_names_every_tensor_once_and_every_shard_exists() {
    let (tmp, files) = gen("tiny-sharded", Layout::Release, 0);
    let dir = tmp.path().join("ck");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let p = Preset::by_name("tiny-sharded").unwrap();
    let want = stored_tensors(&p.geometry);
    assert_eq!(map.len(), want.len());
    let shards: std::collections::BTreeSet<&str> =
        map.values().map(|v| v.as_str().unwrap()).collect();
    assert!(shards.len() >= 4, "several shards: {shards:?}");
    let mut total = 0;
    for s in &shards {
        assert!(files.contains(&s.to_string()));
        let bytes = std::fs::read(dir.join(s)).unwrap();
        for (name, (_, _, data)) in parse_st(&bytes) {
            assert_eq!(
                map[&name].as_str().unwrap(),
                *s,
                "{name} is in the shard the index names"
            );
            total += data.len();
        }
    }
    assert_eq!(
        index["metadata"]["total_size"].as_u64().unwrap() as usize,
        total
    );
    // Same tensors, same bytes as the single-file preset (streams are per tensor name).
    let (tmp1, _) = gen("tiny", Layout::Release, 0);
    let single = std::fs::read(tmp1.path().join("ck/model.safetensors")).unwrap();
    let single = parse_st(&single);
    for s in &shards {
        let bytes = std::fs::read(dir.join(s)).unwrap();
        for (name, (_, _, data)) in parse_st(&bytes) {
            assert_eq!(data, single[&name].2, "{name}");
        }
    }
}

#[test]
fn wide_header_plan_is_consistent_without_writing_it() {
    // Cheap header-level check of the benchmark preset: shapes at release widths, ~2 GB.
    let p = Preset::by_name("wide").unwrap();
    let plan = plan_files(&p);
    let total: usize = plan
        .iter()
        .flat_map(|(_, ts)| ts.iter().map(|t| t.nbytes()))
        .sum();
    assert!(total > 1_500_000_000 && total < 3_000_000_000, "{total}");
    let all: Vec<_> = plan.iter().flat_map(|(_, ts)| ts.iter()).collect();
    let find = |n: &str| {
        all.iter()
            .find(|t| t.name == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    assert_eq!(find("layers.0.attn.wq_b.weight").shape, vec![32768, 1280]);
    assert_eq!(find("layers.0.attn.wq_b.scale").shape, vec![1024, 40]);
    assert_eq!(find("layers.0.attn.wo_a.weight").shape, vec![8192, 4096]);
    assert_eq!(
        find("layers.0.ffn.experts.15.w1.weight").shape,
        vec![2304, 2560]
    );
    assert_eq!(
        find("layers.0.ffn.experts.15.w2.scale").shape,
        vec![5120, 72]
    );
    assert_eq!(
        find("layers.1.attn.indexer.wq_b.weight").shape,
        vec![4096, 1280]
    );
    assert_eq!(find("layers.0.hc_attn_fn").shape, vec![24, 20480]);
    assert_eq!(find("layers.1.engram.wkv.weight").shape, vec![25600, 6144]);
    for (_, ts) in &plan {
        let h = ds41_synthetic::release::safetensors_header(ts);
        serde_json::from_slice::<serde_json::Value>(&h).unwrap();
    }
}

#[test]
fn wide_deep_plan_is_larger_than_a_25_gb_machine_and_a_valid_config() {
    // The larger-than-memory benchmark preset (README "Measuring speed"): only its plan here.
    let p = Preset::by_name("wide-deep").unwrap();
    p.geometry.validate().unwrap();
    let total: usize = plan_files(&p)
        .iter()
        .flat_map(|(_, ts)| ts.iter().map(|t| t.nbytes()))
        .sum();
    assert!(total > 25_300_000_000 && total < 30_000_000_000, "{total}");
    let wide = Preset::by_name("wide").unwrap();
    assert_eq!(
        (p.geometry.dim, p.geometry.n_heads),
        (wide.geometry.dim, wide.geometry.n_heads)
    );
}

#[test]
fn grouped_is_four_indexed_shards_and_window_mtp_stores_the_dspark_stage() {
    let (tmp, files) = gen("grouped", Layout::Release, 0);
    let shards = files.iter().filter(|f| f.ends_with(".safetensors")).count();
    assert_eq!(shards, 4, "{files:?}");
    assert!(files.contains(&"model.safetensors.index.json".to_string()));
    drop(tmp);

    // MODEL.md §4.4 / model.py `DSparkBlock`: a window-only block under `mtp.0.` plus the
    // first stage's main_proj / main_norm and the last stage's norm, Markov and confidence heads.
    let (tmp, _) = gen("window-mtp", Layout::Release, 0);
    let st = parse_st(&std::fs::read(tmp.path().join("ck/model.safetensors")).unwrap());
    let shape = |n: &str| st.get(n).unwrap_or_else(|| panic!("{n} missing")).1.clone();
    assert_eq!(shape("mtp.0.main_proj.weight"), vec![64, 128]); // dim x dim * 2 target layers
    assert_eq!(st["mtp.0.main_proj.weight"].0, "F8_E4M3");
    assert_eq!(shape("mtp.0.markov_head.embed.weight"), vec![512, 32]);
    assert_eq!(shape("mtp.0.markov_head.head.weight"), vec![512, 32]);
    assert_eq!(shape("mtp.0.confidence_head.proj.weight"), vec![1, 96]);
    for n in [
        "mtp.0.main_proj.scale",
        "mtp.0.main_norm.weight",
        "mtp.0.norm.weight",
        "mtp.0.attn.wq_a.weight",
        "mtp.0.attn.attn_sink",
        "mtp.0.hc_ffn_fn",
        "mtp.0.ffn.gate.bias",
        "mtp.0.ffn.experts.3.w2.weight",
    ] {
        shape(n);
    }
    assert!(!st.keys().any(|k| k.starts_with("mtp.0.attn.compressor")
        || k.starts_with("mtp.0.attn.indexer")
        || k.starts_with("mtp.0.engram")
        || k == "mtp.0.embed.weight"
        || k == "mtp.0.head.weight"));
    let cfg: serde_json::Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("ck/inference/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["n_mtp_layers"], 1);
    assert_eq!(cfg["compress_ratios"], serde_json::json!([0, 2, 1, 1, 0]));
    assert_eq!(cfg["dspark_target_layer_ids"], serde_json::json!([2, 3]));
}

/// Pinned digests (one sha256 over every file's name and sha256): the bytes a (preset,
/// layout, seed) produces never change silently. Bump `GENERATOR_VERSION` and these together
/// when a change is intended; the failure message prints the new table.
const PINS: &str = "
tiny         release   0 5968a96903d28ab5bbcd8d0b297669efc9ada3263c3298ad2fddf19b2fd8012b
tiny         container 0 b3f93b26dd545c56cb4c0eeb0d916dc424fea23a8efc7ab51368c58b64077a89
tiny-sharded release   0 eb0ffcb9846bcacbd45f9a66818214f1c173d5de23b57325e763e400cf5cd14a
waste-tiny   container 0 3f932dbcc18490c16fac8ce0de2b493503e2b45d2cf707035ec3f83ef07ddb98
waste-tiny   container 7 7637d16f855ec4096058c882807784dc50b0e5fcc3dd74bd98a722798b7f5bcd
grouped      release   3 8f2d3e5f2b7723dd3d383881fe9e7ec56356619f828a21b65a7029b44233a03c
window-mtp   release   4 d408f24d70164e6332e59966634b113bb19a97ee0790c713ffc944a1e83917ea
dspark       release   6 65ba72351531979adf1b6b13beefc3a114ad1af8c5ddebb05d77fbb2b1dba33d
tied-router  release   5 9f5d6c632498061f67d5d84a795244ac4428aeaa68c66a73d2e06a619669b73c
tied-router  container 5 f93319d4e118e6c90ec86768067307bb7ef603a1543b1121f6d93f5c58bdbdd6
off-release  release   8 4630b041c396a103abcaaa8ce8fecdf93dd363f11df36d2d8e70e2caf708ba0b
vision       release   7 eb2ee3560aa6844b78c22ce8d561447fc78c29a99728aef872280ce2f402af3c
vision       container 7 6ca4be1266ce9c960a06cdd9b5261ea3c4e56389faf525f37a8c3e8b0274942e
";

#[test]
fn same_seed_gives_pinned_bytes() {
    let mut table = Vec::new();
    let mut changed = false;
    for line in PINS.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let layout = if f[1] == "release" {
            Layout::Release
        } else {
            Layout::Container
        };
        let seed: u64 = f[2].parse().unwrap();
        let (tmp, files) = gen(f[0], layout, seed);
        let got = dir_digest(&tmp.path().join("ck"), &files);
        // Twice in a row: identical.
        let (tmp2, files2) = gen(f[0], layout, seed);
        assert_eq!(got, dir_digest(&tmp2.path().join("ck"), &files2), "{line}");
        changed |= got != f[3];
        table.push(format!("{:<12} {:<9} {} {got}", f[0], f[1], f[2]));
    }
    assert!(
        !changed,
        "digests changed; new table:\n{}",
        table.join("\n")
    );
}

#[test]
fn seeds_change_values_but_not_structure() {
    let (a, fa) = gen("tiny", Layout::Release, 1);
    let (b, fb) = gen("tiny", Layout::Release, 2);
    assert_eq!(fa, fb);
    let ha = hash_files(&a.path().join("ck"), &fa).unwrap();
    let hb = hash_files(&b.path().join("ck"), &fb).unwrap();
    assert_ne!(ha["model.safetensors"], hb["model.safetensors"]);
    assert_eq!(ha["config.json"], hb["config.json"]);
    assert_eq!(ha["tokenizer.json"], hb["tokenizer.json"]);
}

#[test]
fn a_non_empty_directory_is_refused_and_force_keeps_foreign_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let err = generate("tiny", Layout::Release, 0, &dir).unwrap_err();
    assert!(matches!(err, SynthError::NonEmptyDir(_)), "{err}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "nothing written"
    );
    let opts = |preset: &str, layout| Options {
        preset: preset.into(),
        layout,
        seed: 0,
        out_dir: dir.clone(),
        mutant: None,
        force: true,
        overrides: Vec::new(),
    };
    let g = generate_with(&opts("tiny-sharded", Layout::Release)).unwrap();
    assert_eq!(g.kept, vec!["notes.txt".to_string()]);
    // Replacing a sharded release by a container removes every shard we wrote, nothing else.
    let g = generate_with(&opts("tiny", Layout::Container)).unwrap();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut want = g.files.clone();
    want.push("notes.txt".into());
    want.sort();
    assert_eq!(present, want);
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn unknown_preset_and_inapplicable_mutant_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let e = generate("huge", Layout::Release, 0, tmp.path()).unwrap_err();
    assert!(matches!(e, SynthError::UnknownPreset(_)));
    let o = Options {
        preset: "tiny".into(),
        layout: Layout::Release,
        seed: 0,
        out_dir: tmp.path().join("x"),
        mutant: Some("index-missing-shard".into()),
        force: false,
        overrides: Vec::new(),
    };
    assert!(matches!(
        generate_with(&o).unwrap_err(),
        SynthError::MutantNotApplicable { .. }
    ));
    let o = Options {
        mutant: Some("bad-crc".into()),
        ..o
    };
    assert!(matches!(
        generate_with(&o).unwrap_err(),
        SynthError::MutantNotApplicable { .. }
    ));
    let o = Options {
        mutant: Some("nope".into()),
        ..o
    };
    assert!(matches!(
        generate_with(&o).unwrap_err(),
        SynthError::UnknownMutant(_)
    ));
}

#[test]
fn container_specials_are_escaped_and_decode_to_the_markers() {
    let (tmp, _) = gen("tiny", Layout::Container, 0);
    let raw = std::fs::read_to_string(tmp.path().join("ck/specials.json")).unwrap();
    assert!(raw.is_ascii(), "non-ASCII is written as \\u escapes");
    assert!(raw.contains("<\\uff5cbegin\\u2581of\\u2581sentence\\uff5c>"));
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(
        v[0]["text"],
        "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>"
    );
    assert_eq!(v[2]["id"], 2);
}

#[test]
fn container_tokmap_is_the_tokenizer_map_and_pad_is_not_identity() {
    let (tmp, _) = gen("tiny", Layout::Container, 0);
    let dir = tmp.path().join("ck");
    let tokmap: Vec<i32> = std::fs::read(dir.join("engram-tokmap.bin"))
        .unwrap()
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(tokmap.len(), 512);
    let engram: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("engram.json")).unwrap()).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let raw_pad = manifest["config"]["engram_pad_token_id"].as_u64().unwrap() as usize;
    assert_eq!(raw_pad, 67);
    assert_eq!(
        engram["pad_id"].as_i64().unwrap(),
        i64::from(tokmap[raw_pad])
    );
    assert_ne!(
        tokmap[raw_pad] as usize, raw_pad,
        "pad must not be the identity"
    );
    let distinct: std::collections::BTreeSet<_> = tokmap.iter().collect();
    assert_eq!(
        engram["compressed_vocab_size"].as_u64().unwrap() as usize,
        distinct.len()
    );
    assert_eq!(
        manifest["config"]["engram_compressed_vocab_size"],
        engram["compressed_vocab_size"]
    );
}

/// `--set`: the preset at another geometry. The written config reads back with the new values
/// and recomputed Engram rows, the tensors have the new shapes, the record lists the
/// overrides, and a plain preset's record does not mention them.
#[test]
fn overrides_change_the_geometry_and_are_recorded() {
    use ds41_engine::config::Config;
    let tmp = tempfile::tempdir().unwrap();
    let with = |dir: &str, overrides: Vec<(&str, serde_json::Value)>| Options {
        preset: "tiny".into(),
        layout: Layout::Release,
        seed: 0,
        out_dir: tmp.path().join(dir),
        mutant: None,
        force: false,
        overrides: overrides
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    };
    generate_with(&with(
        "a",
        vec![
            ("hc_mult", serde_json::json!(2)),
            ("engram_vocab_size", serde_json::json!(1000)),
            ("compress_ratios", serde_json::json!([0, 2, 0, 2, 1, 1])),
            ("kv_source_layer_ids", serde_json::json!([1, 4])),
            ("index_source_layer_ids", serde_json::json!([1, 4, 5])),
            ("candidate_source_layer_id", serde_json::json!(4)),
        ],
    ))
    .unwrap();
    let dir = tmp.path().join("a");
    let cfg = Config::from_release_json(&dir.join("config.json")).unwrap();
    assert_eq!(cfg.hc_mult, 2);
    assert_eq!(cfg.compress_ratios, vec![0, 2, 0, 2, 1, 1]);
    let plain = Config::from_release_json(
        &gen("tiny", Layout::Release, 0)
            .0
            .path()
            .join("ck/config.json"),
    )
    .unwrap();
    assert!(
        cfg.engram_num_embeddings
            .iter()
            .zip(&plain.engram_num_embeddings)
            .all(|(a, b)| a > b),
        "Engram rows recomputed for the larger vocabulary: {:?} vs {:?}",
        cfg.engram_num_embeddings,
        plain.engram_num_embeddings
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("ds41-synthetic.json")).unwrap()).unwrap();
    assert_eq!(record["overrides"]["hc_mult"], 2);
    assert_eq!(
        record["overrides"]["compress_ratios"],
        serde_json::json!([0, 2, 0, 2, 1, 1])
    );
    let header = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&header[8..8 + n]).unwrap();
    assert_eq!(
        header["layers.0.hc_attn_base"]["shape"],
        serde_json::json!([2 * (2 + 2)]),
        "hc_mult 2: 2 + 2 + 2x2 mixes"
    );
    assert!(header.get("layers.2.attn.compressor.wkv.weight").is_none());
    assert!(header.get("layers.4.attn.compressor.wkv.weight").is_some());

    let plain_record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            gen("tiny", Layout::Release, 0)
                .0
                .path()
                .join("ck/ds41-synthetic.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(plain_record.get("overrides").is_none());
}

#[test]
fn overrides_that_cannot_apply_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |layout, key: &str, value: serde_json::Value| {
        let o = Options {
            preset: "tiny".into(),
            layout,
            seed: 0,
            out_dir: tmp.path().join("x"),
            mutant: None,
            force: false,
            overrides: vec![(key.to_string(), value)],
        };
        match generate_with(&o).unwrap_err() {
            SynthError::Override { key: k, reason } => {
                assert_eq!(k, key);
                reason
            }
            other => panic!("{key}: {other}"),
        }
    };
    assert!(refused(Layout::Release, "hc_mul", serde_json::json!(2)).contains("hc_mult"));
    assert!(refused(
        Layout::Release,
        "engram_num_embeddings",
        serde_json::json!([1, 2])
    )
    .contains("derived"));
    assert!(
        refused(Layout::Release, "hidden_size", serde_json::json!(100)).contains("multiple of 32")
    );
    assert!(
        refused(Layout::Release, "hidden_size", serde_json::json!("wide")).contains("hidden_size")
    );
    // The preset's tokenizer bounds the vocabulary: 3 specials and 256 bytes at least, and
    // its word list's merges at most.
    assert!(refused(Layout::Release, "vocab_size", serde_json::json!(100)).contains("259"));
    assert!(refused(Layout::Release, "vocab_size", serde_json::json!(100_000)).contains("at most"));
    // A container's ratio groups must each start with their source (CONTAINER.md §9).
    let o = Options {
        preset: "tiny".into(),
        layout: Layout::Container,
        seed: 0,
        out_dir: tmp.path().join("x"),
        mutant: None,
        force: false,
        overrides: vec![
            (
                "compress_ratios".into(),
                serde_json::json!([0, 2, 0, 2, 1, 1]),
            ),
            ("kv_source_layer_ids".into(), serde_json::json!([1, 4])),
            (
                "index_source_layer_ids".into(),
                serde_json::json!([1, 4, 5]),
            ),
            ("candidate_source_layer_id".into(), serde_json::json!(4)),
        ],
    };
    let e = generate_with(&o).unwrap_err().to_string();
    assert!(e.contains("starts a run of ratio 2"), "{e}");
    assert!(!tmp.path().join("x").exists(), "nothing written");
}
