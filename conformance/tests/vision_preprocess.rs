//! Vision preprocessing (MODEL.md §10.2) bit for bit against the official
//! `image_processor.load_image` on the project's PNG corpus, and the vision tower against the
//! official `vision.py`. The corpus (goldens/vision/preprocess/, made by
//! goldens/regen/vision_preprocess.py): every colour type and bit depth, interlaced files,
//! sizes from 1x1 to 100000x1, upscale, shrink, single row / column, pad-only and the
//! `max_wh_ratio` stretch.

use std::path::PathBuf;
use std::time::Instant;

use ds41_conformance::vision_goldens::{check_corpus, check_tower};

#[test]
fn preprocessing_equals_the_official_pipeline_on_the_png_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision/preprocess");
    let start = Instant::now();
    let report = check_corpus(&dir).unwrap();
    eprintln!(
        "{} images, {} cases, {} bit-exact (Pillow {}), {:.1} s",
        report.images,
        report.cases,
        report.exact,
        report.pillow,
        start.elapsed().as_secs_f64()
    );
    assert!(
        report.cases >= 70,
        "the corpus shrank: {} cases",
        report.cases
    );
    assert!(
        report.failures.is_empty(),
        "{} of {} cases differ from the official pipeline:\n{}",
        report.failures.len(),
        report.cases,
        report.failures.join("\n")
    );
}

/// The vision tower and aligner (both numerics profiles) against the official `vision.py`'s
/// outputs on small random weights (goldens/vision/tower/, goldens/regen/vision_tower.py).
#[test]
fn vision_tower_matches_the_official_goldens() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision");
    let report = check_tower(&root.join("tower"), &root.join("preprocess/images")).unwrap();
    eprintln!("{}", report.summary());
    assert_eq!(report.profiles.len(), 2);
    assert!(report.profiles.iter().all(|p| p.1 == 3), "{report:?}");
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n"));
}

/// The tower read from a release-layout checkpoint (a synthetic `tiny-sharded` with a tower
/// added as one more shard and a `vision_config`: the tower goldens' ViT weights, an aligner
/// drawn for the checkpoint's width) computes what the same weights read directly compute, bit
/// for bit; a checkpoint without a tower is refused, and so is an aligner of the wrong width.
#[test]
fn vision_tower_reads_from_a_release_checkpoint() {
    use ds41_engine::model::Numerics;
    use ds41_engine::trace::{safetensors_bytes, RawTensor};
    use ds41_engine::vision::tower::VisionTower;
    use safetensors::Dtype;

    let goldens = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    ds41_synthetic::generate("tiny-sharded", ds41_synthetic::Layout::Release, 1, &dir).unwrap();
    let plain = ds41_engine::checkpoint::open(&dir).unwrap();
    let err = VisionTower::from_checkpoint(plain.as_ref(), Numerics::Upstream)
        .err()
        .expect("a checkpoint without a tower is refused");
    assert!(err.to_string().contains("no vision tower"), "{err}");
    let llm_dim = plain.config().dim;

    // The tower's tensors, bf16 bits by name: the goldens' ViT, an aligner of width llm_dim.
    let weights = std::fs::read(goldens.join("tower/weights.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&weights).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&weights).unwrap();
    let small: serde_json::Value =
        serde_json::from_str(&meta.metadata().as_ref().unwrap()["config"]).unwrap();
    let mut tensors: std::collections::BTreeMap<String, (Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n.starts_with("vision."))
        .map(|(n, t)| (n, (t.shape().to_vec(), t.data().to_vec())))
        .collect();
    let cell = small["vision_dim"].as_u64().unwrap() as usize * 9;
    for (name, shape) in [
        ("aligner.w1.weight", vec![llm_dim, cell]),
        ("aligner.w1.bias", vec![llm_dim]),
        ("aligner.w2.weight", vec![llm_dim, llm_dim]),
        ("aligner.w2.bias", vec![llm_dim]),
    ] {
        let n: usize = shape.iter().product();
        let bits = (0..n)
            .flat_map(|i| {
                let v = ((i * 7919 % 1000) as f32 / 1000.0 - 0.5)
                    / (shape[shape.len() - 1] as f32).sqrt();
                half::bf16::from_f32(v).to_bits().to_le_bytes()
            })
            .collect();
        tensors.insert(name.into(), (shape, bits));
    }
    let raw = tensors
        .iter()
        .map(|(n, (shape, data))| RawTensor {
            name: n.clone(),
            dtype: Dtype::BF16,
            shape: shape.clone(),
            data: data.clone(),
        })
        .collect();
    let shard = safetensors_bytes(raw, &Default::default()).unwrap();
    std::fs::write(dir.join("model-vision.safetensors"), shard).unwrap();
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    for name in tensors.keys() {
        index["weight_map"][name] = "model-vision.safetensors".into();
    }
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let config_path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config["vision_config"] = serde_json::json!({
        "num_hidden_layers": small["vision_n_layers"],
        "hidden_size": small["vision_dim"],
        "num_attention_heads": small["vision_n_heads"],
        "intermediate_size": small["vision_inter_dim"],
        "patch_size": small["vision_patch_size"],
        "downsample_ratio": small["vision_downsample_ratio"],
        "max_image_tokens": small["vision_max_n_token"],
        "min_pixels": small["vision_min_pixels"],
        "max_wh_ratio": null,
        "rope_theta": small["vision_rope_theta"],
    });
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();

    let ckpt = ds41_engine::checkpoint::open(&dir).unwrap();
    let vision = ckpt.config().vision.clone().unwrap();
    let from_map = |name: &str| -> ds41_engine::Result<Vec<f32>> {
        let (_, data) = &tensors[name];
        Ok(data
            .chunks_exact(2)
            .map(|b| ds41_engine::dtype::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect())
    };
    let image = goldens.join("preprocess/images/rgb8_601x599_odd.png");
    let patches = ds41_engine::vision::load_image(&image, &vision).unwrap();
    for numerics in [Numerics::Upstream, Numerics::Exact] {
        let direct = VisionTower::load(&vision, llm_dim, numerics, from_map).unwrap();
        let read = VisionTower::from_checkpoint(ckpt.as_ref(), numerics).unwrap();
        let (a, b) = (
            direct.forward(&patches).unwrap(),
            read.forward(&patches).unwrap(),
        );
        assert_eq!(a.aligner.len(), 25 * llm_dim);
        let first_diff = |x: &[f32], y: &[f32]| x.iter().zip(y).position(|(p, q)| p != q);
        assert_eq!(
            first_diff(&a.aligner, &b.aligner),
            None,
            "{numerics}: aligner"
        );
        for (i, (x, y)) in a.blocks.iter().zip(&b.blocks).enumerate() {
            assert_eq!(first_diff(x, y), None, "{numerics}: block {i}");
        }
    }
    // An aligner of another width than the language model's is refused, naming the tensor.
    let err = VisionTower::load(&vision, llm_dim + 1, Numerics::Upstream, from_map)
        .err()
        .unwrap();
    assert!(err.to_string().contains("aligner.w1.weight"), "{err}");
}
