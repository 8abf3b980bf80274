//! WASTE v0 container reader (CONTAINER.md §1–§9): decoding, name mapping, refusals.
#![recursion_limit = "256"]
// Reference values are the exact f64 reprs of f32 results from an independent decode.
#![allow(clippy::excessive_precision, clippy::too_many_arguments)]
mod common;

use common::container::*;
use ds41_engine::checkpoint::container::{ContainerCheckpoint, ContainerOptions};
use ds41_engine::checkpoint::names::{expected_tensors, release_to_container, ContainerName};
use ds41_engine::checkpoint::{self, Checkpoint, Layout, Storage};
use ds41_engine::config::EngramPad;
use ds41_engine::Error;
use serde_json::{json, Value};
use std::path::Path;

fn f16_at(b: &[u8], o: usize) -> f32 {
    half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32()
}

fn refused(dir: &Path) -> String {
    match ContainerCheckpoint::open(dir) {
        Ok(_) => panic!("container should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiny_container_reads_and_decodes() {
    let d = tempfile::tempdir().unwrap();
    let manifest = write_container(d.path());
    let ck = checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.layout(), Layout::Container);
    let c = ck.config();
    // the container's own constants, never the release's
    assert_eq!((c.norm_eps, c.route_scale), (1e-5, 2.0));
    assert_eq!((c.engram_pad_id, c.engram_pad_is_compressed), (1, true));
    let k = ck.engram_constants().unwrap();
    assert_eq!(k.pad, EngramPad::Compressed(1));
    assert_eq!(k.layers[0].multipliers, [1209691, 1899629, 1499525]);
    assert_eq!(k.layers[1].primes, [[71, 73], [79, 83]]);
    let map = ck.engram_token_map().unwrap().unwrap();
    assert_eq!((map.len(), map[9]), (64, 4));

    let trunk = std::fs::read(d.path().join("trunk.bin")).unwrap();
    let entry = |n: &str| {
        manifest["trunk"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .unwrap()
            .clone()
    };
    // Q4G: nibble − 8 times the f16 group scale
    let e = entry("model.layers.1.self_attn.q_a_proj.weight");
    assert_eq!(
        ck.storage("layers.1.attn.wq_a.weight").unwrap(),
        Storage::Q4G
    );
    let w = ck.tensor_f32("layers.1.attn.wq_a.weight").unwrap();
    let (off, soff) = (
        e["off"].as_u64().unwrap() as usize,
        e["scale_off"].as_u64().unwrap() as usize,
    );
    let cols = 64;
    for r in [0, 5, 31] {
        for c in [0, 1, 7, 63] {
            let b = trunk[off + r * 64 + c / 2];
            let q = if c % 2 == 0 { b & 0xF } else { b >> 4 } as i32 - 8;
            assert_eq!(
                w[r * cols + c],
                q as f32 * f16_at(&trunk, soff + r * 2),
                "({r},{c})"
            );
        }
    }
    // Q8G with padding to 128: row length 128 bytes although N = 64
    let e = entry("model.embed_tokens.weight");
    let (off, soff) = (
        e["off"].as_u64().unwrap() as usize,
        e["scale_off"].as_u64().unwrap() as usize,
    );
    let mut row = vec![0.0; 64];
    ck.rows_f32("embed.weight", 9, &mut row).unwrap();
    for c in 0..64 {
        assert_eq!(
            row[c],
            trunk[off + 9 * 128 + c] as i8 as f32 * f16_at(&trunk, soff + 9 * 2)
        );
    }
    // F32
    let e = entry("model.layers.3.self_attn.attn_sink");
    let off = e["off"].as_u64().unwrap() as usize;
    let sink = ck.tensor_f32("layers.3.attn.attn_sink").unwrap();
    assert_eq!(
        sink[1],
        f32::from_le_bytes(trunk[off + 4..off + 8].try_into().unwrap())
    );

    // an expert matrix: record E, kind up (w3), decoded per CONTAINER.md §4.2
    let bank = std::fs::read(d.path().join("experts-L2.bin")).unwrap();
    let cb = std::fs::read(d.path().join("codebooks.bin")).unwrap();
    let rs = 4096 * u32::from_le_bytes(bank[16..20].try_into().unwrap()) as usize;
    let rec = &bank[rs..2 * rs];
    let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().unwrap()) as usize;
    let (up_off, chan) = (u32_at(24), u32_at(32));
    let base = manifest["layers"]["2"]["codebook_base"].as_u64().unwrap() as usize;
    let cbv = |id: usize, e: usize, t: usize| f16_at(&cb, id * (16 + 4096) + 16 + (e * 8 + t) * 2);
    let w3 = ck.tensor_f32("layers.2.ffn.experts.1.w3.weight").unwrap();
    assert_eq!(
        ck.shape("layers.2.ffn.experts.1.w3.weight").unwrap(),
        vec![32, 64]
    );
    for m in [0, 17, 31] {
        for col in [0, 9, 63] {
            let v = col / 8;
            let at = up_off + ((m / 64) * 8 + v) * 64 * 3 + (m % 64) * 3;
            let mut acc = 0.0f32;
            for s in 0..3 {
                acc += cbv(base + 3 + s, rec[at + s] as usize, col % 8);
            }
            let scale = f16_at(rec, chan + 2 * (32 + m));
            assert_eq!(w3[m * 64 + col], scale * acc, "({m},{col})");
        }
    }
    // rows_f32 of an expert equals the slice of the whole matrix
    let w2 = ck.tensor_f32("layers.0.ffn.experts.0.w2.weight").unwrap();
    let mut part = vec![0.0; 2 * 32];
    ck.rows_f32("layers.0.ffn.experts.0.w2.weight", 40, &mut part)
        .unwrap();
    assert_eq!(&part[..], &w2[40 * 32..42 * 32]);

    // Engram rows: 4-bit, group 32, f16 scales after the data
    let t = std::fs::read(d.path().join("engram-L1.bin")).unwrap();
    let mut r = vec![0.0; 32];
    ck.rows_f32("layers.1.engram.embed.weight", 300, &mut r)
        .unwrap();
    let row = &t[300 * 18..301 * 18]; // 16 data bytes + one f16 scale
    for dd in 0..32 {
        let q = if dd % 2 == 0 {
            row[dd / 2] & 0xF
        } else {
            row[dd / 2] >> 4
        } as i32
            - 8;
        assert_eq!(r[dd], q as f32 * f16_at(row, 16));
    }
    assert_eq!(
        ck.shape("layers.1.engram.embed.weight").unwrap(),
        vec![306, 32]
    );
    assert!(ck
        .quant_view("layers.1.engram.embed.weight")
        .unwrap()
        .is_none());

    // names: every expected tensor is served
    let names = ck.names();
    for t in expected_tensors(ck.config()) {
        assert!(
            names.contains(&t.name) && ck.contains(&t.name),
            "{}",
            t.name
        );
    }
    assert!(!ck.contains("layers.0.attn.wq_a.scale"));
    assert!(ck.tensor_f32("layers.0.ffn.experts.2.w1.weight").is_err());
}

#[test]
fn specials_decode_every_json_escape() {
    let d = tempfile::tempdir().unwrap();
    write_container(d.path());
    let ck = ContainerCheckpoint::open(d.path()).unwrap();
    let s = ck.specials();
    assert_eq!(s[0].text, "<\u{ff5c}User\u{ff5c}>");
    assert_eq!(s[0].text, "<｜User｜>");
    assert_eq!(s[1].text, "\u{1F600}\n\"q\""); // surrogate pair, \n and \"
                                               // broken escapes are refused with the byte offset
    std::fs::write(
        d.path().join("specials.json"),
        "[{\"id\": 3, \"text\": \"<\\uZZZZ>\"}]",
    )
    .unwrap();
    let e = refused(d.path());
    assert!(e.contains("specials.json") && e.contains("@ byte"), "{e}");
    std::fs::write(
        d.path().join("specials.json"),
        "[{\"id\": 999, \"text\": \"x\"}]",
    )
    .unwrap();
    assert!(refused(d.path()).contains("vocab_size"));
}

#[test]
fn crc_is_verified_on_request() {
    let d = tempfile::tempdir().unwrap();
    write_container(d.path());
    let ck = ContainerCheckpoint::open(d.path()).unwrap();
    assert_eq!(ck.verify_all_crc().unwrap(), 8);
    // flip one payload bit of record 1 in layer 3
    let p = d.path().join("experts-L3.bin");
    let mut b = std::fs::read(&p).unwrap();
    let rs = b.len() / 2;
    b[rs + 100] ^= 0x10;
    std::fs::write(&p, &b).unwrap();
    let ck = ContainerCheckpoint::open(d.path()).unwrap(); // header still valid
    assert!(ck.tensor_f32("layers.3.ffn.experts.1.w1.weight").is_ok()); // no verification
    let e = ck.verify_record_crc(3, 1).unwrap_err().to_string();
    assert!(
        e.contains("checksum mismatch for expert 1 of layer 3"),
        "{e}"
    );
    assert!(ck.verify_all_crc().is_err());
    let ck =
        ContainerCheckpoint::open_with(d.path(), ContainerOptions { verify_crc: true }).unwrap();
    assert!(ck
        .tensor_f32("layers.3.ffn.experts.1.w1.weight")
        .unwrap_err()
        .to_string()
        .contains("checksum mismatch"));
    assert!(ck.tensor_f32("layers.3.ffn.experts.0.w1.weight").is_ok());
}

#[test]
fn bank_record_headers_are_validated() {
    let cases: &[(usize, &[u8], &str)] = &[
        (0, b"WEXQ", "bad magic"),
        (4, &[9, 0], "header says layer 9"),
        (6, &[1, 0], "header says expert 1"),
        (8, &[8], "fmt 8"),
        (10, &[77, 0], "codebook_id 77"),
        (12, &[1, 0], "lowrank_id"),
        (16, &[9, 0, 0, 0], "rec_4k_blocks"),
        (24, &[0xFF, 0xFF, 0, 0], "section at"),
    ];
    for (off, bytes, words) in cases {
        let d = tempfile::tempdir().unwrap();
        write_container(d.path());
        let p = d.path().join("experts-L2.bin");
        let mut b = std::fs::read(&p).unwrap();
        b[*off..*off + bytes.len()].copy_from_slice(bytes);
        std::fs::write(&p, &b).unwrap();
        let e = refused(d.path());
        assert!(
            e.contains("experts-L2.bin") && e.contains(words),
            "{words}: {e}"
        );
        assert!(e.contains(&format!("@ byte {off}")), "{e}");
    }
    // truncated bank
    let d = tempfile::tempdir().unwrap();
    write_container(d.path());
    let p = d.path().join("experts-L1.bin");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 4096]).unwrap();
    assert!(refused(d.path()).contains("truncated"));
    // codebook with a bad magic
    let d = tempfile::tempdir().unwrap();
    write_container(d.path());
    let p = d.path().join("codebooks.bin");
    let mut b = std::fs::read(&p).unwrap();
    b[16 + 4096] = b'X';
    std::fs::write(&p, &b).unwrap();
    let e = refused(d.path());
    assert!(e.contains("codebook 1") && e.contains("WCBK"), "{e}");
}

fn mutate(f: impl FnOnce(&mut Value, &Path)) -> String {
    let d = tempfile::tempdir().unwrap();
    let mut m = write_container(d.path());
    f(&mut m, d.path());
    write_manifest(d.path(), &m);
    refused(d.path())
}

fn trunk_idx(m: &Value, name: &str) -> usize {
    m["trunk"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| e["name"] == name)
        .unwrap()
}

#[test]
fn manifest_refusals() {
    // WASTE run.sh DS41 check 2: a container without layers.0 attn_sink is refused, by name
    let e = mutate(|m, _| {
        let i = trunk_idx(m, "model.layers.0.self_attn.attn_sink");
        m["trunk"].as_array_mut().unwrap().remove(i);
    });
    assert!(
        e.contains("`layers.0.attn.attn_sink`")
            && e.contains("model.layers.0.self_attn.attn_sink")
            && e.contains("missing"),
        "{e}"
    );
    // format_version
    assert!(mutate(|m, _| m["format_version"] = json!(1)).contains("format_version"));
    assert!(mutate(|m, _| m["format_version"] = json!("0")).contains("must be 0"));
    assert!(mutate(|m, _| {
        m.as_object_mut().unwrap().remove("format_version");
    })
    .contains("format_version"));
    // a tensor prefix that hides every trunk tensor
    assert!(mutate(|m, _| m["tensor_prefix"] = json!("language_model.")).contains("missing"));
    // trunk entries: out of range, overlap, wrong byte count, unknown or unused format
    let e = mutate(|m, _| {
        let i = trunk_idx(m, "lm_head.weight");
        m["trunk"][i]["scale_off"] = json!(1u64 << 30);
    });
    assert!(
        e.contains("lm_head.weight") && e.contains("beyond the end"),
        "{e}"
    );
    let e = mutate(|m, _| {
        let i = trunk_idx(m, "model.layers.2.self_attn.attn_sink");
        let off = m["trunk"][i - 1]["off"].clone();
        m["trunk"][i]["off"] = off;
    });
    assert!(e.contains("overlaps"), "{e}");
    assert!(mutate(|m, _| {
        let i = trunk_idx(m, "model.norm.weight");
        m["trunk"][i]["bytes"] = json!(4);
    })
    .contains("`bytes` is 4"));
    // A Q8G entry relabelled Q3G: its bytes are not a 3-bit stream's.
    let e = mutate(|m, _| m["trunk"][0]["fmt"] = json!(7));
    assert!(e.contains("`bytes` is") && e.contains("need"), "{e}");
    assert!(mutate(|m, _| m["trunk"][0]["fmt"] = json!(5)).contains("unknown trunk format 5"));
    // wrong shape
    let e = mutate(|m, _| {
        let i = trunk_idx(m, "model.layers.1.self_attn.attn_sink");
        m["trunk"][i]["shape"] = json!([1, 2]);
    });
    assert!(
        e.contains("layers.1.attn.attn_sink") && e.contains("shape"),
        "{e}"
    );
    // expert banks
    assert!(mutate(|m, _| {
        m["layers"].as_object_mut().unwrap().remove("3");
    })
    .contains("layers.3.ffn.experts.0.w1.weight"));
    assert!(mutate(|m, _| m["layers"]["0"]["experts"] = json!(3)).contains("routed experts"));
    assert!(mutate(|m, _| m["layers"]["0"]["file"] = json!("../x.bin")).contains("plain file name"));
    assert!(
        mutate(|m, _| m["layers"]["0"]["codebook_base"] = json!(1000)).contains("codebook_base")
    );
    assert!(mutate(|m, _| m["expert_quant"]["fmt"] = json!("VQ9")).contains("VQ9"));
    // Engram: rows disagreeing with the primes, engram.json disagreeing with the config
    assert!(mutate(|m, _| m["engram"]["1"]["rows"] = json!(305)).contains("engram.1.rows"));
    // Twice the stated row size (WASTE's --engram-bits 8 rows): the per-row figure is named.
    let e = mutate(|m, _| {
        let b = m["engram"]["1"]["bytes"].as_u64().unwrap();
        m["engram"]["1"]["bytes"] = json!(2 * b);
    });
    assert!(
        e.contains("engram.1.bytes") && e.contains("bytes per row"),
        "{e}"
    );
    let e = mutate(|_, d| {
        let p = d.join("engram.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        v["layers"][0]["primes"][0][0] = json!(57);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    });
    assert!(e.contains("57 is not prime"), "{e}");
    let e = mutate(|_, d| {
        let p = d.join("engram.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        v["pad_id"] = json!(40);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    });
    assert!(
        e.contains("engram_pad_id") && e.contains("compressed"),
        "{e}"
    );
    assert!(
        mutate(|_, d| std::fs::write(d.join("engram-tokmap.bin"), [0u8; 12]).unwrap())
            .contains("vocab_size")
    );
    assert!(
        mutate(|_, d| std::fs::write(d.join("engram-tokmap.bin"), [0xFFu8; 256]).unwrap())
            .contains("maps to -1")
    );
    // config: the container must carry its own valid config
    assert!(
        mutate(|m, _| m["config"]["num_shared_experts"] = json!(2)).contains("n_shared_experts")
    );
}

#[test]
fn every_missing_trunk_tensor_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let m = write_container(d.path());
    let cfg = ContainerCheckpoint::open(d.path())
        .unwrap()
        .config()
        .clone();
    for t in expected_tensors(&cfg) {
        let ContainerName::Trunk(cname) = release_to_container(&t.name) else {
            continue;
        };
        let mut mm = m.clone();
        let i = trunk_idx(&mm, &cname);
        mm["trunk"].as_array_mut().unwrap().remove(i);
        write_manifest(d.path(), &mm);
        let e = refused(d.path());
        assert!(
            e.contains(&format!("`{}`", t.name)) && e.contains("missing"),
            "{}: {e}",
            t.name
        );
    }
}

/// WASTE's synthetic test container (`waste-tiny` seed 0, byte-identical to WASTE's
/// make_test_container.py --ds41).
fn waste_container() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("c");
    ds41_synthetic::waste_test_container(&dir).unwrap();
    (d, dir)
}

/// Values from an independent Python decode of WASTE's container.
#[test]
fn waste_synthetic_container_decodes_like_the_oracle() {
    let (_guard, dir) = waste_container();
    let ck = ContainerCheckpoint::open(&dir).unwrap();
    assert_eq!(ck.verify_all_crc().unwrap(), 48);
    let c = ck.config();
    assert_eq!(
        (
            c.norm_eps,
            c.route_scale,
            c.engram_pad_id,
            c.engram_pad_is_compressed
        ),
        (1e-5, 2.0, 2, true)
    );
    let k = ck.engram_constants().unwrap();
    assert_eq!(k.layers[0].multipliers, [1209691, 1899629, 1499525]);
    assert_eq!(k.layers[1].multipliers, [1483693, 396131, 548221]);
    assert_eq!(k.layers[1].offsets, [0, 1031, 2064, 3103]);
    assert_eq!(
        ck.engram_token_map().unwrap().unwrap(),
        (0..256).collect::<Vec<i32>>()
    );
    assert!(ck.specials().is_empty());
    let check = |name: &str, len: usize, sum: f64, e7: f32, last: f32| {
        let v = ck.tensor_f32(name).unwrap();
        assert_eq!(v.len(), len, "{name}");
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert_eq!(
            (s, v[7.min(len - 1)], v[len - 1]),
            (sum, e7, last),
            "{name}"
        );
    };
    check(
        "embed.weight",
        32768,
        -24.64943504333496,
        0.5181884765625,
        0.2808074951171875,
    );
    check(
        "layers.2.attn.wq_a.weight",
        6144,
        -29.927095413208008,
        0.0787353515625,
        -0.0053863525390625,
    );
    check(
        "layers.4.attn.attn_sink",
        4,
        -1.290440559387207e-05,
        0.3944655656814575,
        0.3944655656814575,
    );
    check(
        "head.weight",
        32768,
        -130.2225799560547,
        1.44525146484375,
        -1.3086700439453125,
    );
    let expert = |name: &str, cols: usize, sum: f64, e57: f32, last: f32| {
        let v = ck.tensor_f32(name).unwrap();
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert_eq!(
            (s, v[5 * cols + 7], v[v.len() - 1]),
            (sum, e57, last),
            "{name}"
        );
    };
    expert(
        "layers.0.ffn.experts.0.w1.weight",
        128,
        -0.6523160053329775,
        -0.006424754858016968,
        -0.0020759962499141693,
    );
    expert(
        "layers.3.ffn.experts.5.w3.weight",
        128,
        -1.9894543259215425,
        -0.006253356114029884,
        0.0005974620580673218,
    );
    expert(
        "layers.5.ffn.experts.7.w2.weight",
        64,
        -0.85882498013234,
        -0.004782713949680328,
        -0.013426434248685837,
    );
    let engram = |l: usize, r: usize, sum: f64, e3: f32, last: f32| {
        let mut v = vec![0.0; 64];
        ck.rows_f32(&format!("layers.{l}.engram.embed.weight"), r, &mut v)
            .unwrap();
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert_eq!((s, v[3], v[63]), (sum, e3, last));
    };
    engram(
        1,
        0,
        -1.803558349609375,
        0.0207672119140625,
        -0.11785888671875,
    );
    engram(3, 4151, -0.13916015625, 0.16552734375, -0.2032470703125);
    engram(
        1,
        2000,
        -1.0807723999023438,
        -0.062164306640625,
        0.04278564453125,
    );
    assert_eq!(ck.record_header(2, 3).unwrap().crc32, 2277347166);
    assert_eq!(
        ck.container_name("layers.0.attn.attn_sink"),
        Some("model.layers.0.self_attn.attn_sink")
    );
}

#[test]
fn waste_container_without_attn_sink_is_refused() {
    let (_guard, src) = waste_container();
    let d = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), d.path().join(f.file_name())).unwrap();
    }
    let mut m: Value =
        serde_json::from_slice(&std::fs::read(d.path().join("manifest.json")).unwrap()).unwrap();
    let i = trunk_idx(&m, "model.layers.0.self_attn.attn_sink");
    m["trunk"].as_array_mut().unwrap().remove(i);
    write_manifest(d.path(), &m);
    match checkpoint::open(d.path()) {
        Err(Error::Tensor { tensor, .. }) => assert_eq!(tensor, "layers.0.attn.attn_sink"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("must refuse"),
    }
}

/// Q3G (fmt 7, WASTE's `convert.py --trunk-bits 3`): per row, the values + 4 as 3-bit fields
/// LSB-first at bit 3c, then one guard byte; f16 group scales after all rows. Rows of 64
/// columns pad to one 128-group: 48 bytes of stream and the guard, so every other row starts
/// mid-pattern and fields straddle bytes.
#[test]
fn q3g_trunk_tensors_decode_as_wastes_bit_stream() {
    let d = tempfile::tempdir().unwrap();
    let mut m = write_container(d.path());
    let name = "model.layers.1.self_attn.q_a_proj.weight";
    let i = trunk_idx(&m, name);
    let shape: Vec<usize> = serde_json::from_value(m["trunk"][i]["shape"].clone()).unwrap();
    let (rows, cols, padded) = (shape[0], shape[1], 128);
    let row_bytes = 3 * padded / 8 + 1;
    let value = |r: usize, c: usize| ((r * 5 + c * 3) % 8) as u32; // biased: v + 4
    let mut trunk = std::fs::read(d.path().join("trunk.bin")).unwrap();
    let off = trunk.len();
    for r in 0..rows {
        let mut row = vec![0u8; row_bytes];
        for c in 0..cols {
            let bit = 3 * c;
            let two = value(r, c) << (bit % 8);
            row[bit / 8] |= two as u8;
            row[bit / 8 + 1] |= (two >> 8) as u8;
        }
        trunk.extend(row);
    }
    let scale_off = trunk.len();
    let scale = |r: usize| half::f16::from_f32(0.25 + r as f32 / 64.0);
    for r in 0..rows {
        trunk.extend(scale(r).to_le_bytes());
    }
    std::fs::write(d.path().join("trunk.bin"), &trunk).unwrap();
    m["trunk"][i] = json!({"name": name, "fmt": 7, "off": off, "shape": shape, "group": 128,
                            "scale_off": scale_off, "bytes": trunk.len() - off});
    write_manifest(d.path(), &m);
    let ck = checkpoint::open(d.path()).unwrap();
    assert_eq!(
        ck.storage("layers.1.attn.wq_a.weight").unwrap(),
        Storage::Q3G
    );
    let w = ck.tensor_f32("layers.1.attn.wq_a.weight").unwrap();
    for r in 0..rows {
        for c in 0..cols {
            let want = (value(r, c) as f32 - 4.0) * scale(r).to_f32();
            assert_eq!(w[r * cols + c], want, "({r},{c})");
        }
    }
    // A declared byte count that is not the stream's is refused, naming the tensor.
    m["trunk"][i]["bytes"] = json!(trunk.len() - off - 1);
    write_manifest(d.path(), &m);
    let e = refused(d.path());
    assert!(e.contains("q_a_proj") && e.contains("bytes"), "{e}");
}

/// A container with Engram layers but without one of its two hashing-constant files (what
/// WASTE's convert.py writes without `--reclaim`) is refused naming the file and what needs it.
#[test]
fn engram_side_files_missing_are_refused_by_name() {
    for name in ["engram.json", "engram-tokmap.bin"] {
        let (_guard, dir) = waste_container();
        std::fs::remove_file(dir.join(name)).unwrap();
        let e = refused(&dir);
        assert!(
            e.contains(&format!("{name}: missing")) && e.contains("engram_layer_ids"),
            "{e}"
        );
    }
}

/// The kernels' view of every expert matrix decodes exactly as `rows_f32`: each vector alone,
/// and eight rows at once (an index band's run, and rows across a band's end), and a CRC
/// check on request withholds the view (every read must then be checked).
#[test]
fn expert_views_decode_like_rows_f32() {
    use ds41_engine::checkpoint::{WeightView, VQ_WIDTH};
    let (_guard, dir) = waste_container();
    let ck = ContainerCheckpoint::open(&dir).unwrap();
    let mut seen = 0;
    for name in ck.names().into_iter().filter(|n| n.contains(".experts.")) {
        let Some(WeightView::Vq(v)) = ck.weight_view(&name).unwrap() else {
            panic!("{name}: no VQ view");
        };
        let mut rows = vec![0f32; v.rows * v.cols];
        ck.rows_f32(&name, 0, &mut rows).unwrap();
        let at = |r: usize, c: usize| rows[r * v.cols + c].to_bits();
        for r in 0..v.rows {
            for vec in 0..v.cols / VQ_WIDTH {
                let got = v.vector(r, vec).map(f32::to_bits);
                let want: [u32; VQ_WIDTH] = std::array::from_fn(|t| at(r, vec * VQ_WIDTH + t));
                assert_eq!(got, want, "{name} row {r} vector {vec}");
            }
        }
        for r in (0..v.rows.saturating_sub(8)).step_by(5) {
            let mut block = [[0f32; 16]; 8];
            v.vectors(r, 1, &mut block);
            for (i, row) in block.iter().enumerate() {
                for (c, x) in row.iter().enumerate() {
                    assert_eq!(x.to_bits(), at(r + i, VQ_WIDTH + c), "{name} rows {r}+{i}");
                }
            }
        }
        seen += 1;
    }
    assert!(seen > 0);
    let checked =
        ContainerCheckpoint::open_with(&dir, ContainerOptions { verify_crc: true }).unwrap();
    let name = "layers.0.ffn.experts.0.w1.weight";
    assert!(checked.weight_view(name).unwrap().is_none());
}
