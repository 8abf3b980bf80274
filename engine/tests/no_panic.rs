//! No input can make the readers panic: property tests over safetensors
//! header bytes, manifest JSON values and bank/codebook bytes. Every outcome must be `Ok` or a
//! typed error; when a mutated checkpoint still opens, decoding every tensor must not panic.
#![recursion_limit = "256"]
mod common;

use common::container::*;
use common::*;
use ds41_engine::checkpoint::{self, Checkpoint};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::OnceLock;

fn decode_all(ck: &dyn Checkpoint) {
    for n in ck.names() {
        let _ = ck.tensor_f32(&n);
        let _ = ck.quant_view(&n);
    }
    let _ = ck.engram_constants();
}

fn open_and_decode(dir: &Path) {
    if let Ok(ck) = checkpoint::open(dir) {
        decode_all(ck.as_ref());
    }
}

fn good_release() -> &'static Vec<u8> {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| safetensors_bytes(&release_tensors(&tiny_config())))
}

fn good_manifest() -> &'static (tempfile::TempDir, Value) {
    static M: OnceLock<(tempfile::TempDir, Value)> = OnceLock::new();
    M.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let m = write_container(d.path());
        (d, m)
    })
}

/// Copy the reference container into a fresh tempdir.
fn fresh_container() -> tempfile::TempDir {
    let (src, _) = good_manifest();
    let d = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(src.path()).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), d.path().join(f.file_name())).unwrap();
    }
    d
}

/// JSON values likely to break a reader: wrong types, huge, negative, empty.
fn nasty_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(3)),
        Just(json!(u64::MAX)),
        Just(json!(1u64 << 40)),
        Just(json!(4097)),
        Just(json!(0.5)),
        Just(json!("x")),
        Just(json!([])),
        Just(json!([0, 0])),
        Just(json!([1u64 << 33, 1u64 << 33])),
        Just(json!({})),
        any::<u32>().prop_map(|x| json!(x)),
    ]
}

/// Every path to a scalar or array inside `v`.
fn leaf_paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                prefix.push(k.clone());
                leaf_paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            out.push(prefix.clone());
            for (i, x) in a.iter().enumerate().take(6) {
                prefix.push(i.to_string());
                leaf_paths(x, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push(prefix.clone()),
    }
}

fn set_path(v: &mut Value, path: &[String], new: Value) {
    let mut cur = v;
    for p in path {
        cur = match cur {
            Value::Object(o) => o.get_mut(p).unwrap(),
            Value::Array(a) => &mut a[p.parse::<usize>().unwrap()],
            _ => unreachable!(),
        };
    }
    *cur = new;
}

// A smoke run in the default tests, from a fixed seed (deterministic): the same readers are
// fuzzed for millions of inputs by the campaign of fuzz/ (fuzz/README.md), which is where depth
// comes from.
proptest! {
    #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(41), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_safetensors_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let d = tempfile::tempdir().unwrap();
        write_release(d.path(), &tiny_release_config(), &[]);
        std::fs::write(d.path().join("model.safetensors"), &bytes).unwrap();
        open_and_decode(d.path());
    }

    #[test]
    fn mutated_safetensors_headers_never_panic(edits in proptest::collection::vec((0usize..4096, any::<u8>()), 1..6)) {
        let mut b = good_release().clone();
        let hl = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize + 8;
        for (at, x) in edits {
            let i = at % hl;
            b[i] = x;
        }
        let d = tempfile::tempdir().unwrap();
        write_release(d.path(), &tiny_release_config(), &[]);
        std::fs::write(d.path().join("model.safetensors"), &b).unwrap();
        open_and_decode(d.path());
    }

    #[test]
    fn mutated_manifest_values_never_panic(pick in any::<prop::sample::Index>(), new in nasty_value()) {
        let (_, m) = good_manifest();
        let mut paths = Vec::new();
        leaf_paths(m, &mut Vec::new(), &mut paths);
        let path = pick.get(&paths).clone();
        let mut m2 = m.clone();
        set_path(&mut m2, &path, new);
        let d = fresh_container();
        write_manifest(d.path(), &m2);
        open_and_decode(d.path());
    }

    #[test]
    fn arbitrary_manifest_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let d = fresh_container();
        std::fs::write(d.path().join("manifest.json"), &bytes).unwrap();
        open_and_decode(d.path());
    }

    #[test]
    fn mutated_bank_and_codebook_bytes_never_panic(
        file in 0usize..3,
        edits in proptest::collection::vec((0usize..8192, any::<u8>()), 1..8),
    ) {
        let d = fresh_container();
        let name = ["experts-L1.bin", "codebooks.bin", "engram.json"][file];
        let p = d.path().join(name);
        let mut b = std::fs::read(&p).unwrap();
        for (at, x) in edits {
            let i = at % b.len();
            b[i] = x;
        }
        std::fs::write(&p, &b).unwrap();
        open_and_decode(d.path());
    }
}
