//! Config readers, `cfg_sane` invariants (MODEL.md §2.2, CONTAINER.md §9) and layer roles
//! (MODEL.md §3).
#![recursion_limit = "256"]
mod common;

use common::*;
use ds41_engine::config::{Config, EngramHashConstants, EngramPad};
use ds41_engine::testing::release;
use ds41_engine::Error;
use serde_json::json;

fn release_config() -> Config {
    Config::from_release_json(&release().join("config.json")).unwrap()
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn release_config_parses_with_inference_names() {
    let c = release_config();
    assert_eq!(
        (
            c.vocab_size,
            c.dim,
            c.moe_inter_dim,
            c.n_layers,
            c.n_mtp_layers
        ),
        (129280, 5120, 2304, 40, 3)
    );
    assert_eq!(
        (
            c.n_heads,
            c.n_routed_experts,
            c.n_shared_experts,
            c.n_activated_experts
        ),
        (64, 384, 1, 6)
    );
    assert_eq!(
        (c.route_scale, c.swiglu_limit, c.norm_eps, c.hc_eps),
        (1.5, 10.0, 1e-20, 1e-6)
    );
    assert_eq!(
        (
            c.q_lora_rank,
            c.head_dim,
            c.rope_head_dim,
            c.o_groups,
            c.o_lora_rank,
            c.window_size
        ),
        (1280, 512, 64, 8, 1024, 128)
    );
    assert_eq!(c.compress_ratios.len(), 43);
    assert_eq!(c.kv_source_layers, [2, 8, 14, 20]);
    assert_eq!(c.index_source_layers, [2, 8, 14, 20, 24, 28, 32, 36]);
    assert_eq!(c.candidate_source_layer, Some(20));
    assert_eq!(
        (
            c.candidate_topk_blocks,
            c.candidate_block_size,
            c.index_n_heads,
            c.index_head_dim,
            c.index_topk
        ),
        (2048, 8, 32, 128, 512)
    );
    assert_eq!(
        (
            c.rope_theta,
            c.compress_rope_theta,
            c.original_seq_len,
            c.rope_factor,
            c.beta_fast,
            c.beta_slow
        ),
        (10000.0, 160000.0, 65536, 16.0, 32.0, 1.0)
    );
    assert_eq!(c.engram_num_embeddings, [384006168, 384016682]);
    assert_eq!(
        (
            c.engram_pad_id,
            c.engram_pad_is_compressed,
            c.engram_compressed_vocab_size
        ),
        (2, false, 99092)
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_id, c.image_token_id),
        (Some(0), Some(1), Some(129264))
    );
    assert!(c.routing_bias_vl);
    assert_eq!(c.vision.as_ref().unwrap().n_layers, 32);
    assert!(c.candidate_coverage_ok());
    c.validate_upstream_kernels().unwrap();
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn inference_config_agrees_with_release_config() {
    let hf = Config::from_release_json(&release().join("config.json")).unwrap();
    let mut inf = Config::from_inference_json(&release().join("inference/config.json")).unwrap();
    // inference/config.json has no bos/eos ids and no max_position_embeddings (model.py's
    // `max_seq_len` is a cache allocation, not the model's limit).
    inf.bos_token_id = hf.bos_token_id;
    inf.eos_token_id = hf.eos_token_id;
    assert_eq!(inf.max_position, None);
    inf.max_position = hf.max_position;
    assert_eq!(inf, hf);
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn release_layer_roles_match_model_md_section_3() {
    let c = release_config();
    for l in 0..43 {
        let r = c.layer_role(l);
        let (ratio, kv_from, topk_from, keys_from, writer, consumer) = match l {
            0 | 1 => (0, None, None, None, false, false),
            2 | 8 | 14 => (2, Some(l), Some(l), Some(l), false, false),
            3..=7 => (2, Some(2), Some(2), None, false, false),
            9..=13 => (2, Some(8), Some(8), None, false, false),
            15..=19 => (2, Some(14), Some(14), None, false, false),
            20 => (1, Some(20), Some(20), Some(20), true, false),
            21..=23 => (1, Some(20), Some(20), None, false, false),
            24 | 28 | 32 | 36 => (1, Some(20), Some(l), Some(20), false, true),
            25..=39 => (1, Some(20), Some(l - (l - 24) % 4), None, false, false),
            _ => (0, None, None, None, false, false),
        };
        assert_eq!(r.ratio, ratio, "layer {l}");
        assert_eq!(r.kv_from, kv_from, "layer {l}");
        assert_eq!(r.topk_from, topk_from, "layer {l}");
        assert_eq!(r.index_keys_from, keys_from, "layer {l}");
        assert_eq!(r.candidate_writer, writer, "layer {l}");
        assert_eq!(r.candidate_consumer, consumer, "layer {l}");
        assert_eq!(r.kv_source, [2, 8, 14, 20].contains(&l), "layer {l}");
        assert_eq!(r.engram, [1, 14].iter().position(|&e| e == l), "layer {l}");
        assert_eq!(r.mtp, l >= 40);
        assert_eq!(c.kv_source_for(l), kv_from);
        assert_eq!(c.index_source_for(l), topk_from);
    }
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn release_engram_constants_reproduce_model_md() {
    let c = release_config();
    let k = EngramHashConstants::for_release(&c).unwrap();
    assert_eq!(
        k.layers[0].multipliers,
        [
            76632096046245,
            4839876093313,
            35959672319349,
            73987337458391
        ]
    );
    assert_eq!(
        k.layers[1].multipliers,
        [
            67716810739261,
            51510806800915,
            30921347202721,
            82619226485591
        ]
    );
    assert_eq!(
        k.layers[0].primes[0],
        [16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183]
    );
    assert_eq!(
        k.layers[1].primes[2],
        [16000781, 16000799, 16000813, 16000819, 16000841, 16000877, 16000879, 16000889]
    );
    assert_eq!(k.layers[0].offsets[23], 368005705);
    assert_eq!(k.layers[1].offsets[8], 128004290);
    assert_eq!(
        (k.layers[0].rows(), k.layers[1].rows()),
        (384006168, 384016682)
    );
    assert_eq!(k.pad, EngramPad::RawToken(2));
    k.check_against(&c, "release").unwrap();
    // and the official engram.py's constants (goldens/engram/) agree field by field
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../goldens/engram/release_constants.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for (i, l) in k.layers.iter().enumerate() {
        assert_eq!(
            serde_json::to_value(&l.multipliers).unwrap(),
            v["multipliers"][i]
        );
        assert_eq!(serde_json::to_value(&l.primes).unwrap(), v["primes"][i]);
        assert_eq!(serde_json::to_value(&l.offsets).unwrap(), v["offsets"][i]);
    }
}

/// The ModelArgs of a 6-layer test model with Engram on layers 0 and 1 (engram_vocab_size
/// 100, two heads, n-grams up to 3, compressed vocab 256).
fn tiny_engram_model_args() -> serde_json::Value {
    serde_json::json!({"max_batch_size": 1, "max_seq_len": 64, "temperature": 0.0, "dtype": "fp8", "expert_dtype": "fp4", "vocab_size": 512, "dim": 128, "moe_inter_dim": 64, "n_layers": 6, "n_mtp_layers": 0, "n_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "n_activated_experts": 2, "score_func": "sqrtsoftplus", "gate_temp": 1.0, "norm_topk_prob": true, "route_scale": 1.5, "swiglu_limit": 1.0, "q_lora_rank": 64, "head_dim": 64, "rope_head_dim": 16, "norm_eps": 1e-20, "o_groups": 2, "o_lora_rank": 32, "window_size": 8, "compress_ratios": [0, 2, 2, 1, 1, 1], "kv_source_layers": [1, 3], "index_source_layers": [1, 3, 5], "compress_rope_theta": 160000.0, "original_seq_len": 32, "rope_theta": 10000.0, "rope_factor": 4, "beta_fast": 32, "beta_slow": 1, "index_n_heads": 16, "index_head_dim": 32, "index_topk": 8, "candidate_source_layer": 3, "candidate_topk_blocks": 3, "candidate_block_size": 4, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "engram_layer_ids": [0, 1], "engram_num_embeddings": [420, 508], "engram_max_ngram_size": 3, "engram_vocab_size": 100, "engram_n_heads": 2, "engram_head_dim": 32, "engram_pad_id": 2, "engram_compressed_vocab_size": 256, "vision_n_layers": 0, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816, "vision_patch_size": 14, "vision_rope_theta": 10000.0, "vision_downsample_ratio": 3, "vision_max_n_token": 1024, "vision_min_pixels": 295936, "vision_max_wh_ratio": null, "image_token_id": 129264, "dspark_block_size": 0, "dspark_noise_token_id": 0, "dspark_target_layer_ids": [], "dspark_markov_rank": 256, "dspark_n_routed_experts": 0, "dspark_n_activated_experts": 0})
}

#[test]
fn tiny_engram_constants() {
    // primes 101,103|107,109 and 113,127|131,137 (the smallest above engram_vocab_size - 1,
    // handed out in order); multipliers from numpy default_rng(10007·layer).
    let c = Config::from_inference_value(&tiny_engram_model_args()).unwrap();
    let k = EngramHashConstants::for_release(&c).unwrap();
    assert_eq!(k.layers[0].primes, [[101, 103], [107, 109]]);
    assert_eq!(k.layers[1].primes, [[113, 127], [131, 137]]);
    assert_eq!(
        k.layers[0].multipliers,
        [22948963341361471, 9720090748611819, 1476226777048821]
    );
    assert_eq!(
        k.layers[1].multipliers,
        [29662608052400909, 1873410163432121, 13919202536988139]
    );
    assert_eq!((k.layers[0].rows(), k.layers[1].rows()), (420, 508));
}

#[test]
#[cfg_attr(
    not(ds41_upstream),
    ignore = "DS41_UPSTREAM not set (the official_a set)"
)]
fn official_a_engram_constants() {
    let up = upstream();
    // official_a: layers 1,2, cvocab 258 (README); rows 420, 508.
    let a = Config::from_release_json(&up.join("official_a/checkpoint/config.json")).unwrap();
    let k = EngramHashConstants::for_release(&a).unwrap();
    assert_eq!((k.layers[0].rows(), k.layers[1].rows()), (420, 508));
    assert_eq!(k.layers[0].multipliers.len(), 3);
}

#[test]
fn container_config_synthetic_flat_form() {
    // WASTE's synthetic test container (make_test_container.py --ds41 = waste-tiny seed 0).
    let d = tempfile::tempdir().unwrap();
    ds41_synthetic::waste_test_container(d.path()).unwrap();
    let c = Config::from_container_manifest(d.path()).unwrap();
    assert_eq!((c.norm_eps, c.route_scale), (1e-5, 2.0));
    assert_eq!(
        (
            c.n_layers,
            c.n_mtp_layers,
            c.n_routed_experts,
            c.n_activated_experts,
            c.n_shared_experts
        ),
        (6, 0, 8, 2, 1)
    );
    assert_eq!(
        (c.original_seq_len, c.rope_factor, c.compress_rope_theta),
        (16, 4.0, 40000.0)
    );
    assert_eq!(c.candidate_source_layer, Some(4));
    assert!(c.routing_bias_vl);
    assert!(!c.candidate_coverage_ok()); // CONTAINER.md §10.3 item 2
    assert!(c.validate_upstream_kernels().is_err()); // q_lora 48: exact regime only
}

#[test]
#[cfg_attr(
    not(ds41_release),
    ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
)]
fn container_config_converted_form_with_outer() {
    let root: serde_json::Value =
        serde_json::from_slice(&std::fs::read(release().join("config.json")).unwrap()).unwrap();
    let mut flat = root["text_config"].clone();
    flat["_outer"] = root.clone();
    flat["num_experts"] = json!(384);
    flat["num_experts_per_token"] = json!(6);
    flat["num_shared_experts"] = json!(1);
    flat["moe_renormalize"] = json!(true);
    flat["first_k_dense_replace"] = json!(0);
    let c = Config::from_container_config(&flat).unwrap();
    assert_eq!(c, Config::from_release_value(&root).unwrap());
    flat["num_experts"] = json!(383);
    let e = Config::from_container_config(&flat)
        .unwrap_err()
        .to_string();
    assert!(e.contains("num_experts") && e.contains("disagrees"), "{e}");
    flat["num_experts"] = json!(384);
    flat["first_k_dense_replace"] = json!(1);
    assert!(Config::from_container_config(&flat)
        .unwrap_err()
        .to_string()
        .contains("first_k_dense_replace"));
}

/// Mutate a valid tiny config; validation must fail naming `field` and mentioning `words`.
fn refuse(field: &str, words: &str, f: impl FnOnce(&mut Config)) {
    let mut c = tiny_config();
    c.validate().unwrap();
    f(&mut c);
    match c.validate().and_then(|_| c.validate_upstream_kernels()) {
        Err(Error::Config { field: got, rule }) => {
            assert_eq!(got, field, "rule: {rule}");
            assert!(rule.contains(words), "{field}: {rule:?} lacks {words:?}");
        }
        other => panic!("{field}: expected a refusal, got {other:?}"),
    }
}

#[test]
fn every_invariant_refuses_with_field_and_rule() {
    // §2.2 item 1
    refuse("n_shared_experts", "must be 1", |c| c.n_shared_experts = 2);
    // item 2
    refuse("compress_ratios", "entries", |c| c.compress_ratios.push(0));
    refuse("compress_ratios", "MTP entry 4 must be 0", |c| {
        c.n_mtp_layers = 1;
        c.compress_ratios.push(1)
    });
    // item 3: a ratio>0 layer without a KV source at or below it
    refuse("kv_source_layers", "no KV source at or below", |c| {
        c.compress_ratios = vec![2, 2, 2, 1];
        c.kv_source_layers = vec![1, 3];
    });
    // item 3: most recent KV source of another ratio
    refuse(
        "compress_ratios",
        "most recent KV source 1 has ratio 2",
        |c| c.compress_ratios = vec![0, 2, 1, 1],
    );
    // item 3 for index sources is implied by the KV rule and item 4 (an index source's own
    // most recent KV source is the consumer's, so their ratios agree): it cannot fail alone.
    // item 4
    refuse("kv_source_layers", "must also be an index source", |c| {
        c.index_source_layers = vec![3]
    });
    // item 5
    refuse("candidate_source_layer", "must have ratio 1", |c| {
        c.candidate_source_layer = Some(1)
    });
    refuse("candidate_source_layer", "must be an index source", |c| {
        c.candidate_source_layer = Some(2)
    });
    // item 6
    refuse(
        "engram_num_embeddings",
        "sum of that layer's primes is 240",
        |c| c.engram_num_embeddings[0] += 1,
    );
    refuse("engram_num_embeddings", "one entry per Engram layer", |c| {
        c.engram_num_embeddings.pop();
    });
    // item 7: kernels and shapes
    refuse("o_groups", "divisible", |c| c.n_heads = 3);
    refuse("head_dim", "multiple of 32", |c| {
        c.head_dim = 48;
    });
    refuse("dim", "multiple of 32", |c| c.dim = 48);
    refuse("q_lora_rank", "multiple of 32", |c| c.q_lora_rank = 48);
    refuse("index_head_dim", "multiple of 32", |c| {
        c.index_head_dim = 24
    });
    refuse("moe_inter_dim", "multiple of 32", |c| c.moe_inter_dim = 40);
    refuse("index_head_dim", "must be >= rope_head_dim", |c| {
        c.index_head_dim = 4
    });
    refuse("rope_head_dim", "even", |c| c.rope_head_dim = 7);
    refuse("hc_mult", "power of two", |c| c.hc_mult = 3);
    // CONTAINER.md §9: a container's ratio groups each start with their source; the release
    // layout allows a window-only layer between a source and its consumer (MODEL.md §6.4.5).
    let mut split = tiny_config();
    split.kv_source_layers = vec![1];
    split.index_source_layers = vec![1];
    split.candidate_source_layer = None;
    split.compress_ratios = vec![0, 1, 0, 1];
    split.validate().unwrap();
    match split.validate_container() {
        Err(Error::Config { field, rule }) => {
            assert_eq!(field, "compress_ratios", "rule: {rule}");
            assert!(
                rule.contains("starts a run of ratio 1 but is not a KV source"),
                "{rule}"
            );
        }
        other => panic!("split ratio group: expected a refusal, got {other:?}"),
    }
    // bounds
    refuse("score_func", "sqrtsoftplus", |c| {
        c.score_func = "softmax".into()
    });
    refuse("n_activated_experts", "outside the sane range", |c| {
        c.n_activated_experts = 3
    });
    refuse("norm_eps", "finite", |c| c.norm_eps = f32::NAN);
    refuse("route_scale", "> 0", |c| c.route_scale = 0.0);
    refuse("window_size", "outside the sane range", |c| {
        c.window_size = 0
    });
    refuse("vocab_size", "outside the sane range", |c| c.vocab_size = 0);
    refuse("rope_factor", ">= 1", |c| c.rope_factor = 0.5);
    refuse("kv_source_layers", "strictly increasing", |c| {
        c.kv_source_layers = vec![3, 1]
    });
    refuse("engram_layer_ids", "not a backbone layer", |c| {
        c.engram_layer_ids = vec![0, 9]
    });
    refuse("engram_pad_id", "not a token id", |c| c.engram_pad_id = 64);
    refuse("engram_pad_id", "not a compressed id", |c| {
        c.engram_pad_is_compressed = true;
        c.engram_pad_id = 32
    });
    refuse("bos_token_id", "not a token id", |c| {
        c.bos_token_id = Some(64)
    });
    refuse(
        "engram_compressed_vocab_size",
        "outside the sane range",
        |c| c.engram_compressed_vocab_size = 65,
    );
}

#[test]
fn missing_and_mistyped_keys_name_the_key() {
    let mut v = tiny_release_config();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("hidden_size");
    match Config::from_release_value(&v) {
        Err(Error::Config { field, rule }) => {
            assert_eq!(field, "text_config.hidden_size");
            assert!(rule.contains("missing"));
        }
        e => panic!("{e:?}"),
    }
    let mut v = tiny_release_config();
    v["text_config"]["compress_ratios"][2] = json!("two");
    match Config::from_release_value(&v) {
        Err(Error::Config { field, .. }) => assert_eq!(field, "text_config.compress_ratios[2]"),
        e => panic!("{e:?}"),
    }
    let mut v = tiny_release_config();
    v["text_config"]["rope_scaling"]["rope_type"] = json!("linear");
    assert!(Config::from_release_value(&v)
        .unwrap_err()
        .to_string()
        .contains("yarn"));
    let mut v = tiny_release_config();
    v["text_config"]["candidate_source_layer_id"] = json!(-1);
    assert_eq!(
        Config::from_release_value(&v)
            .unwrap()
            .candidate_source_layer,
        None
    );
    // a JSON syntax error names the file and byte offset
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("config.json");
    std::fs::write(&p, b"{\n  \"a\": 1,\n  oops\n}").unwrap();
    match Config::from_release_json(&p) {
        Err(Error::Format { file, offset, .. }) => {
            assert_eq!(file, p);
            assert_eq!(offset, 14); // the `o` of `oops`
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn another_model_familys_config_is_refused_by_its_model_type() {
    let mut v = tiny_release_config();
    v["text_config"]["model_type"] = json!("deepseek_v3");
    match Config::from_release_value(&v) {
        Err(Error::Config { field, rule }) => {
            assert_eq!(field, "text_config.model_type");
            assert!(
                rule.contains("deepseek_v3") && rule.contains("DeepSeek-V4.1"),
                "{rule}"
            );
        }
        e => panic!("{e:?}"),
    }
    let mut v = tiny_release_config();
    v["model_type"] = json!("kimi_linear");
    match Config::from_release_value(&v) {
        Err(Error::Config { field, .. }) => assert_eq!(field, "model_type"),
        e => panic!("{e:?}"),
    }
    // Descriptive only: absent, or any deepseek_v4 spelling, is read.
    let mut v = tiny_release_config();
    v.as_object_mut().unwrap().remove("model_type");
    v["text_config"]["model_type"] = json!("deepseek_v4_flash_text");
    Config::from_release_value(&v).unwrap();

    // A WASTE container of another model (make_test_container.py without --ds41: Kimi-Linear)
    // is refused by its config's model_type, before the DS41-only keys it breaks.
    let d = tempfile::tempdir().unwrap();
    ds41_synthetic::waste_test_container(d.path()).unwrap();
    let manifest = d.path().join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["config"]["model_type"] = json!("kimi_linear");
    m["config"]["first_k_dense_replace"] = json!(1);
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    let e = Config::from_container_manifest(d.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("config.model_type") && e.contains("kimi_linear") && e.contains("manifest.json"),
        "{e}"
    );
}

/// The official_a README states only the recipe for its Engram constants; the constants
/// `for_release` derives (numpy PCG64 port, prime hand-out) must reproduce the golden hash
/// ids the official `engram.py` produced, with the golden's own token map.
#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_engram_constants_reproduce_golden_hash_ids() {
    let up = upstream();
    let cfg = Config::from_release_json(&up.join("official_a/checkpoint/config.json")).unwrap();
    let k = EngramHashConstants::for_release(&cfg).unwrap();
    let bytes =
        std::fs::read(up.join("official_a/p48_d00/golden_prefill_only.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let i64s = |n: &str| -> Vec<i64> {
        st.tensor(n)
            .unwrap()
            .data()
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let ids = i64s("input_ids");
    let golden = i64s("engram_hash");
    let map: Vec<i64> = st
        .tensor("engram_token_map")
        .unwrap()
        .data()
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
        .collect();
    let EngramPad::RawToken(raw_pad) = k.pad else {
        panic!()
    };
    let pad = map[raw_pad as usize];
    let hist: Vec<i64> = ids.iter().map(|&t| map[t as usize]).collect();
    let cols = cfg.engram_columns();
    let mut checked = 0;
    for p in 0..hist.len() {
        for (li, l) in k.layers.iter().enumerate() {
            let mut x = 0i64;
            for d in 0..k.max_ngram_size {
                let tok = if p < d { pad } else { hist[p - d] };
                x ^= tok * l.multipliers[d];
                if d == 0 {
                    continue;
                }
                for h in 0..k.n_heads {
                    let c = (d - 1) * k.n_heads + h;
                    let id = x.rem_euclid(l.primes[d - 1][h] as i64) + l.offsets[c] as i64;
                    assert_eq!(
                        id,
                        golden[(p * k.layers.len() + li) * cols + c],
                        "pos {p} layer {li} col {c}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 48 * 2 * 4);
}
