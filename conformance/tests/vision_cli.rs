//! `ds41 preprocess` end to end on the built binary: the patches it writes are the official
//! pipeline's (the corpus golden's digest), and bad images get a typed error naming the file,
//! exit 2, never a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

fn ds41(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args(args)
        .output()
        .expect("run ds41")
}

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../goldens/vision/preprocess")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn preprocess(image: &Path, out: &Path) -> Output {
    ds41(&[
        "preprocess",
        "--image",
        image.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
}

#[test]
fn preprocess_writes_the_official_patches_and_grid() {
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus().join("expected.json")).unwrap()).unwrap();
    let case = expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["image"] == "images/rgb8_1333x2999_shrink.png" && c["config"] == "release")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.safetensors");
    let o = preprocess(&corpus().join("images/rgb8_1333x2999_shrink.png"), &out);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let patches = st.tensor("patches").unwrap();
    assert_eq!(patches.dtype(), safetensors::Dtype::BF16);
    let shape: Vec<u64> = case["patches_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(
        patches
            .shape()
            .iter()
            .map(|&d| d as u64)
            .collect::<Vec<_>>(),
        shape
    );
    assert_eq!(
        hex::encode(Sha256::digest(patches.data())),
        case["patches_sha256"].as_str().unwrap()
    );
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    let n_llm = [&meta["n_llm_h"], &meta["n_llm_w"]].map(|v| v.parse::<u64>().unwrap());
    assert_eq!(
        n_llm.to_vec(),
        case["n_llm"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect::<Vec<_>>()
    );
    let types = st.tensor("token_types").unwrap();
    let span = n_llm[0] * (n_llm[1] + 1) + 2;
    assert_eq!(types.shape(), [span as usize]);
    assert_eq!(meta["num_image_tokens"], span.to_string());
}

/// CRC-32 (ISO 3309, as PNG chunks use), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG header that claims `width` × `height` pixels, and nothing else.
fn png_header_only(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(13u32.to_be_bytes());
    out.extend(&ihdr);
    out.extend(crc32(&ihdr).to_be_bytes());
    out
}

#[test]
fn bad_images_are_refused_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(corpus().join("images/rgb8_640x480.png")).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated.png",
            good[..good.len() / 2].to_vec(),
            "corrupt PNG",
        ),
        (
            "random.png",
            (0..200u8).map(|i| i.wrapping_mul(37)).collect(),
            "not a PNG",
        ),
        (
            "photo.jpg",
            b"\xff\xd8\xff\xe0\0\x10JFIF".to_vec(),
            "JPEG images are not supported",
        ),
        ("empty.png", Vec::new(), "not a PNG"),
        (
            "bomb.png",
            png_header_only(20_000, 20_000),
            "more than the 178956970 allowed",
        ),
    ];
    for (name, bytes, why) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = dir.path().join("out.safetensors");
        let o = preprocess(&path, &out);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(path.to_str().unwrap()) && err.contains(why),
            "{name}: {err}"
        );
        assert!(!out.exists(), "{name}: an output was written");
    }
    // The output is never the input.
    let image = dir.path().join("keep.png");
    std::fs::write(&image, &good).unwrap();
    let o = preprocess(&image, &image);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("refusing to overwrite"));
    assert_eq!(std::fs::read(&image).unwrap(), good);
}

/// Truncations and byte flips of corpus PNGs never panic the decoder: each is an image or a
/// typed `Image` error.
#[test]
fn damaged_pngs_never_panic() {
    let cfg = ds41_engine::vision::release_vision_config();
    let mut seen = (0, 0);
    for name in [
        "palette2_interlaced_33x17",
        "greyalpha16_interlaced_21x23",
        "grey1_97x61",
    ] {
        let path = corpus().join(format!("images/{name}.png"));
        let good = std::fs::read(&path).unwrap();
        let mut state = 0x9e37_79b9_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as usize
        };
        let mut variants: Vec<Vec<u8>> = (0..good.len())
            .step_by(7)
            .map(|n| good[..n].to_vec())
            .collect();
        for _ in 0..150 {
            let mut bad = good.clone();
            let at = next() % bad.len();
            bad[at] ^= 1 << (next() % 8);
            variants.push(bad);
        }
        // Damage inside the compressed image data with the chunk's CRC made right again, so
        // the inflater and the unfilterer see it, not just the CRC check.
        let idat = good.windows(4).position(|w| w == b"IDAT").unwrap();
        let len = u32::from_be_bytes(good[idat - 4..idat].try_into().unwrap()) as usize;
        for _ in 0..150 {
            let mut bad = good.clone();
            let at = idat + 4 + next() % len;
            bad[at] ^= 1 << (next() % 8);
            let crc = crc32(&bad[idat..idat + 4 + len]);
            bad[idat + 4 + len..idat + 8 + len].copy_from_slice(&crc.to_be_bytes());
            variants.push(bad);
        }
        for bad in variants {
            match ds41_engine::vision::preprocess_bytes(&bad, &path, &cfg) {
                Ok(_) => seen.0 += 1,
                Err(e) => {
                    assert_eq!(e.kind(), "Image", "{e}");
                    seen.1 += 1;
                }
            }
        }
    }
    assert!(seen.0 > 0 && seen.1 > 100, "(decoded, refused) = {seen:?}");
    eprintln!("damaged PNGs: (decoded, refused) = {seen:?}");
}

/// `ds41 forward --image`: each image replaces one marker of `--tokens` (the model's
/// `image_token_id`), expanded to its span; the trace carries the span's token types and the
/// vision stages. Requests it will not run are refused naming the reason.
#[test]
fn forward_with_images_expands_markers_and_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("vision");
    ds41_synthetic::generate("vision", ds41_synthetic::Layout::Release, 7, &model).unwrap();
    let marker = ds41_synthetic::preset::VISION_IMAGE_TOKEN.to_string();
    let image = corpus().join("images/rgb8_100x37_upscale.png");
    let out = dir.path().join("t.safetensors");
    let forward = |tokens: &str, images: &[&Path], model: &Path, prefill: Option<&str>| {
        let mut args = vec![
            "forward".to_string(),
            "--model".into(),
            model.to_str().unwrap().into(),
            "--tokens".into(),
            tokens.into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ];
        for i in images {
            args.extend(["--image".into(), i.to_str().unwrap().to_string()]);
        }
        if let Some(p) = prefill {
            args.extend(["--prefill".into(), p.into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ds41(&args)
    };
    let o = forward(&format!("5,{marker},6,7"), &[&image], &model, Some("3"));
    assert!(o.status.success(), "{}", stderr(&o));
    let t = ds41_engine::trace::TraceFile::read(&out).unwrap();
    // 100x37 → a 1x3 token grid: START, 3 IMAGE, NEWLINE, END.
    assert_eq!(
        t.i64("token_types").unwrap().1,
        &[-1, 0, 1, 1, 1, 2, 3, -1, -1]
    );
    let m: i64 = marker.parse().unwrap();
    assert_eq!(t.i64("input_ids").unwrap().1, &[5, m, m, m, m, m, m, 6, 7]);
    assert_eq!(t.metadata.get("prefill").map(String::as_str), Some("8"));
    assert_eq!(t.f32("vision.I0.aligner").unwrap().0, &[3, 64]);
    assert_eq!(t.i64("vision.I0.grid").unwrap().1, &[1, 3, 8, 1, 3]);

    let refused = |o: Output, want: &str| {
        assert!(!o.status.success(), "accepted; wanted `{want}`");
        assert!(
            stderr(&o).contains(want),
            "`{}` does not say `{want}`",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    };
    refused(forward("5,6", &[&image], &model, None), "0 image marker(s)");
    refused(
        forward(&format!("5,{marker},{marker}"), &[&image], &model, None),
        "2 image marker(s)",
    );
    refused(
        forward(&format!("5,6,{marker}"), &[&image], &model, Some("2")),
        "must lie in the first chunk",
    );
    let missing = dir.path().join("missing.png");
    refused(
        forward(&format!("5,{marker}"), &[&missing], &model, None),
        "missing.png",
    );
    let tiny = dir.path().join("tiny");
    ds41_synthetic::generate("tiny", ds41_synthetic::Layout::Release, 1, &tiny).unwrap();
    refused(forward("5,6", &[&image], &tiny, None), "no vision tower");
}

/// `ds41 convert` carries the vision tower into the container (trunk tensors and
/// `vision.json`, CONTAINER.md §7), and the converted container takes images.
#[test]
fn converted_container_keeps_the_vision_tower() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    ds41_synthetic::generate("vision", ds41_synthetic::Layout::Release, 7, &release).unwrap();
    let container = dir.path().join("container");
    let o = ds41(&[
        "convert",
        "--release",
        release.to_str().unwrap(),
        "--out",
        container.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(container.join("vision.json")).unwrap()).unwrap();
    assert_eq!(v["tower"], "ds41");
    assert_eq!(v["media_placeholder_token_id"], 511);
    let ck = ds41_engine::checkpoint::open(&container).unwrap();
    let rel = ds41_engine::checkpoint::open(&release).unwrap();
    assert_eq!(ck.config().vision, rel.config().vision);
    assert!(ck.contains("vision.blocks.0.attn.wqkv.weight") && ck.contains("image_start"));
    let out = dir.path().join("t.safetensors");
    let image = corpus().join("images/rgb8_100x37_upscale.png");
    let o = ds41(&[
        "forward",
        "--model",
        container.to_str().unwrap(),
        "--tokens",
        "5,511,6",
        "--image",
        image.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = ds41_engine::trace::TraceFile::read(&out).unwrap();
    assert_eq!(t.i64("token_types").unwrap().1, &[-1, 0, 1, 1, 1, 2, 3, -1]);
}
