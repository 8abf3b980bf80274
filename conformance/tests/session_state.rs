//! Session state save / restore on synthetic presets in both layouts:
//! bit-identical continuation at every boundary split point, refusal of mismatched or damaged
//! state files (never a panic), and the metamorphic checks of `engine::state::metamorphic`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ds41_engine::checkpoint::Layout;
use ds41_engine::model::{IndexK, Model, Numerics, Options, Session};
use ds41_engine::state::{self, metamorphic};
use ds41_engine::trace::{Trace, TraceOptions};

/// Generated once per test binary: (release `tiny`, container `waste-tiny`). The TempDir
/// lives in the static for the whole run.
fn presets() -> (&'static Path, &'static Path) {
    static DIRS: OnceLock<(tempfile::TempDir, PathBuf, PathBuf)> = OnceLock::new();
    let d = DIRS.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let rel = tmp.path().join("tiny");
        let con = tmp.path().join("waste-tiny");
        ds41_synthetic::generate("tiny", Layout::Release, 7, &rel).unwrap();
        ds41_synthetic::generate("waste-tiny", Layout::Container, 7, &con).unwrap();
        (tmp, rel, con)
    });
    (&d.1, &d.2)
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11) % vocab as u32)
        .collect()
}

fn traced(model: &Model) -> Trace {
    Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: false,
        },
    )
}

/// prefill(ids[..split]) (nothing when split = 0) then decode the rest, into `trace`.
fn run(s: &mut Session, ids: &[u32], split: usize, trace: &mut Trace) {
    if split > 0 {
        s.prefill(&ids[..split], trace).unwrap();
    }
    for &t in &ids[split..] {
        s.decode(t, trace).unwrap();
    }
}

fn assert_bits_equal(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {} instead of {}", got[i], want[i]);
    }
}

/// Every per-token tensor of `part` (tokens from `first` on) equals `whole`'s, bit for bit.
fn assert_rows_equal(whole: &Trace, part: &Trace, first: usize, what: &str) {
    let per_tok = |total: usize, tokens: usize| total / tokens.max(1);
    let w = per_tok(whole.residual.len(), whole.tokens);
    for t in 0..part.tokens {
        let cell = |tr: &Trace, tok: usize| tr.residual[tok * w..(tok + 1) * w].to_vec();
        assert_bits_equal(
            &cell(part, t),
            &cell(whole, first + t),
            &format!("{what}: residual of token {}", first + t),
        );
    }
    let e = per_tok(whole.experts.len(), whole.tokens);
    assert_eq!(
        whole.experts[first * e..],
        part.experts[..],
        "{what}: experts"
    );
    assert_bits_equal(
        &part.expert_weights,
        &whole.expert_weights[first * e..],
        &format!("{what}: expert weights"),
    );
    for (l, v) in &whole.topk {
        let k = per_tok(v.len(), whole.tokens);
        assert_eq!(v[first * k..], part.topk[l][..], "{what}: topk.L{l}");
    }
    let h = per_tok(whole.engram_hash.len(), whole.tokens);
    assert_eq!(
        whole.engram_hash[first * h..],
        part.engram_hash[..],
        "{what}: engram_hash"
    );
}

/// prefill(a) + save + a fresh model and session load + continue == uninterrupted, for every
/// split point (logits of every step and every per-token trace tensor).
fn check_splits(dir: &Path, profiles: &[Numerics], splits: &[usize], total: usize) {
    check_splits_with(
        &|| Model::open(dir).unwrap(),
        &dir.display().to_string(),
        profiles,
        splits,
        total,
    )
}

fn check_splits_with(
    open: &dyn Fn() -> Model,
    label: &str,
    profiles: &[Numerics],
    splits: &[usize],
    total: usize,
) {
    for &numerics in profiles {
        for index_k in [IndexK::Owner, IndexK::AsShipped] {
            let options = Options {
                numerics,
                index_k,
                ..Options::default()
            };
            let model = open();
            let ids = tokens(total, model.config().vocab_size);
            for &split in splits {
                let what = format!("{label} {numerics} {index_k} split {split}");
                // The uninterrupted run, saved at the split on the way (saving reads the
                // session and leaves it as it was).
                let tmp = tempfile::tempdir().unwrap();
                let file = tmp.path().join("s.ds41state");
                let mut whole = traced(&model);
                let mut s = Session::new(&model, options.clone());
                run(&mut s, &ids[..split], split, &mut whole);
                state::save(&model, &s, &file).unwrap();
                run(&mut s, &ids[split..], 0, &mut whole);
                drop(s);

                let fresh_model = open();
                let mut s2 = Session::new(&fresh_model, options.clone());
                state::restore(&fresh_model, &mut s2, &file).unwrap();
                assert_eq!(s2.position(), split);
                let mut second = traced(&fresh_model);
                run(&mut s2, &ids[split..], 0, &mut second);

                let steps_before = whole.logits.len() - second.logits.len();
                assert_rows_equal(&whole, &second, split, &what);
                assert_bits_equal(
                    &second.logits,
                    &whole.logits[steps_before..],
                    &format!("{what}: logits"),
                );
            }
        }
    }
}

#[test]
fn release_tiny_continues_bit_exactly_at_every_boundary() {
    // tiny: window 8, ratio-2 source at layer 1, ratio-1 candidate source at layer 3 with
    // 3 kept blocks of 4 entries (first removal once 13 entries exist).
    // Splits: positions 0/1, inside (3, 5) and at the end (2, 4) of a ratio-2 group, before /
    // at / after the ring wrap (7, 8, 9), before / after the first candidate-block removal
    // (12, 13, 14), and a late odd split (17).
    check_splits(
        presets().0,
        &[Numerics::Exact],
        &[0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 17],
        19,
    );
    // Where a split falls is a property of the cache geometry, not of the numerics; the
    // upstream profile's state (its bf16-rounded caches) is checked at one split of each
    // kind: decode only, inside a ratio-2 group, at the ring wrap, at the first removal.
    check_splits(presets().0, &[Numerics::Upstream], &[0, 3, 8, 13], 19);
}

#[test]
fn container_waste_tiny_continues_bit_exactly() {
    // waste-tiny: window 4; splits around its ratio-2 groups and ring wrap. Its widths
    // (q_lora 48) are not 32-block multiples, so only the exact profile applies.
    check_splits(
        presets().1,
        &[Numerics::Exact],
        &[0, 1, 2, 3, 4, 5, 8, 9],
        14,
    );
}

#[test]
#[cfg_attr(not(ds41_upstream), ignore = "DS41_UPSTREAM not set (upstream data)")]
fn official_a_continues_bit_exactly_at_every_boundary() {
    let up = ds41_engine::testing::upstream();
    // official_a: window 8, ratio-2 source at layer 2, ratio-1 candidate source at layer 4
    // (3 kept blocks of 4). The Engram map comes from a golden (the release ships none).
    let golden = ds41_engine::trace::TraceFile::read(
        &up.join("official_a/p48_d00/golden_prefill_only.safetensors"),
    )
    .unwrap();
    let map: Vec<i32> = golden
        .i64("engram_token_map")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as i32)
        .collect();
    let dir = up.join("official_a/checkpoint");
    let open = || Model::open_with_token_map(&dir, Some(map.clone())).unwrap();
    check_splits_with(
        &open,
        "official_a",
        &[Numerics::Upstream, Numerics::Exact],
        &[0, 1, 2, 3, 7, 8, 9, 12, 13, 14],
        17,
    );
}

/// A state file of the tiny preset after 10 tokens, with its model and options.
fn sample_state() -> (Model, Options, Vec<u8>) {
    state_after(10)
}

/// A state file of the tiny preset after `n` tokens, with its model and options.
fn state_after(n: usize) -> (Model, Options, Vec<u8>) {
    let model = Model::open(presets().0).unwrap();
    let options = Options {
        numerics: Numerics::Exact,
        index_k: IndexK::AsShipped,
        ..Options::default()
    };
    let mut s = Session::new(&model, options.clone());
    let ids = tokens(n, model.config().vocab_size);
    s.prefill(&ids, &mut Trace::disabled()).unwrap();
    let bytes = state::encode(s.state(), model.config(), &options).unwrap();
    drop(s);
    (model, options, bytes)
}

/// Rewrite the JSON header of a state file (recomputing lengths and checksum), to test the
/// checks behind the checksum.
fn with_header(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    use sha2::Digest;
    let hl = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[64..64 + hl]).unwrap();
    edit(&mut header);
    let hb = serde_json::to_vec(&header).unwrap();
    let payload = &bytes[64 + hl..];
    let mut out = bytes[..64].to_vec();
    out[12..16].copy_from_slice(&(hb.len() as u32).to_le_bytes());
    let mut h = sha2::Sha256::new();
    h.update(&hb);
    h.update(payload);
    out[32..64].copy_from_slice(&h.finalize());
    out.extend_from_slice(&hb);
    out.extend_from_slice(payload);
    out
}

/// The file offset of element `i` of payload array `name` and its element size.
fn element_at(bytes: &[u8], name: &str, i: usize) -> (usize, usize) {
    let hl = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[64..64 + hl]).unwrap();
    let mut at = 64 + hl;
    for a in header["arrays"].as_array().unwrap() {
        let size = if a["dtype"] == "i64" { 8 } else { 4 };
        let len = a["len"].as_u64().unwrap() as usize;
        if a["name"] == name {
            assert!(i < len, "{name} has {len} elements");
            return (at + i * size, size);
        }
        at += len * size;
    }
    panic!("no array {name}")
}

/// The state with element `i` of array `name` set to `value` (its little-endian bytes) and
/// the checksum recomputed, to test the checks behind the checksum.
fn with_element(bytes: &[u8], name: &str, i: usize, value: &[u8]) -> Vec<u8> {
    let (at, size) = element_at(bytes, name, i);
    assert_eq!(value.len(), size);
    let mut out = bytes.to_vec();
    out[at..at + size].copy_from_slice(value);
    with_header(&out, |_| {})
}

fn decode_err(bytes: &[u8], model: &Model, options: &Options) -> String {
    match state::decode(bytes, Path::new("s.ds41state"), model.config(), options) {
        Ok(_) => panic!("a damaged or mismatched state was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_sample_state_round_trips() {
    let (model, options, bytes) = sample_state();
    let st = state::decode(&bytes, Path::new("s"), model.config(), &options).unwrap();
    assert_eq!(st.position, 10);
    assert_eq!(state::encode(&st, model.config(), &options).unwrap(), bytes);
    // The re-checksummed header edit helper is faithful (so the tests below test the checks).
    assert!(state::decode(
        &with_header(&bytes, |_| {}),
        Path::new("s"),
        model.config(),
        &options
    )
    .is_ok());
}

#[test]
fn every_differing_fingerprint_field_is_refused_by_name() {
    let (model, options, bytes) = sample_state();
    let fields: Vec<String> = state::fingerprint(model.config(), &options)
        .keys()
        .cloned()
        .collect();
    assert!(fields.len() >= 15);
    for field in fields {
        let edited = with_header(&bytes, |h| {
            let v = &mut h["fingerprint"][&field];
            *v = match v.take() {
                serde_json::Value::Number(n) => (n.as_u64().unwrap_or(0) + 1).into(),
                serde_json::Value::String(s) => format!("{s}x").into(),
                serde_json::Value::Array(mut a) => {
                    a.push(1.into());
                    a.into()
                }
                _ => 99.into(),
            };
        });
        let e = decode_err(&edited, &model, &options);
        assert!(e.contains(&format!("fingerprint.{field}")), "{field}: {e}");
    }
    // Run options are part of the fingerprint: numerics and index-k.
    for other in [
        Options {
            numerics: Numerics::Upstream,
            ..options.clone()
        },
        Options {
            index_k: IndexK::Owner,
            ..options.clone()
        },
    ] {
        let e = decode_err(&bytes, &model, &other);
        assert!(e.contains("fingerprint."), "{e}");
    }
    // And another checkpoint geometry.
    let other = Model::open(presets().1).unwrap();
    assert!(decode_err(&bytes, &other, &options).contains("fingerprint."));
}

#[test]
fn truncated_extended_and_bit_flipped_files_are_refused() {
    let (model, options, bytes) = sample_state();
    for len in 0..bytes.len() {
        decode_err(&bytes[..len], &model, &options);
    }
    for extra in [1usize, 7, 4096] {
        let mut b = bytes.clone();
        b.extend(std::iter::repeat_n(0u8, extra));
        let e = decode_err(&b, &model, &options);
        assert!(e.contains("payload_len"), "{e}");
    }
    // Every bit of the prefix and header, and a spread of payload bits.
    let hl = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let positions: Vec<usize> = (0..64 + hl)
        .chain((64 + hl..bytes.len()).step_by(13))
        .collect();
    for &i in &positions {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            decode_err(&b, &model, &options);
        }
    }
}

#[test]
fn header_consistency_checks_name_the_field() {
    let (model, options, bytes) = sample_state();
    // A position the arrays do not fit.
    let e = decode_err(
        &with_header(&bytes, |h| h["position"] = 11.into()),
        &model,
        &options,
    );
    assert!(e.contains("engram_history") || e.contains("latents"), "{e}");
    // An array table that does not add up to payload_len.
    let e = decode_err(
        &with_header(&bytes, |h| h["arrays"][0]["len"] = 3.into()),
        &model,
        &options,
    );
    assert!(e.contains("payload_len"), "{e}");
    // A published index_k owner that is not an owner.
    let e = decode_err(
        &with_header(&bytes, |h| h["published_index_k"] = 0.into()),
        &model,
        &options,
    );
    assert!(e.contains("published_index_k"), "{e}");
    // Bad magic / version.
    let mut b = bytes.clone();
    b[0] = b'X';
    assert!(decode_err(&b, &model, &options).contains("magic"));
    let mut b = bytes.clone();
    b[8] = 2;
    assert!(decode_err(&b, &model, &options).contains("version"));
}

#[test]
fn elements_no_run_could_write_are_refused_at_their_byte() {
    // After 5 tokens: window slots 5..8 never reached, and the ratio-2 layers' open group
    // has slot 0 filled and slot 1 not.
    let (model, options, bytes) = state_after(5);
    let cfg = model.config();
    assert!(cfg.window_size > 5 && !cfg.engram_layer_ids.is_empty());
    let l = (0..cfg.n_layers)
        .find(|&l| cfg.compress_ratios[l] == 2 && cfg.kv_source_layers.contains(&l))
        .expect("a ratio-2 KV source");
    let hd = cfg.head_dim;
    let ok = |b: &[u8]| state::decode(b, Path::new("s"), cfg, &options).is_ok();
    let one = 1.0f32.to_le_bytes();
    let refused = |name: &str, i: usize, value: &[u8], rule: &str| {
        let e = decode_err(&with_element(&bytes, name, i, value), &model, &options);
        let at = element_at(&bytes, name, i).0;
        assert!(
            e.contains(&format!("{name}[{i}]")) && e.contains(rule) && e.contains(&at.to_string()),
            "{name}[{i}] (byte {at}): {e}"
        );
    };
    let window = format!("layers.{l}.window");
    refused(&window, 5 * hd, &one, "+0.0");
    refused(&window, 8 * hd - 1, &(-0.0f32).to_le_bytes(), "+0.0");
    assert!(ok(&with_element(&bytes, &window, 5 * hd - 1, &one)));
    for (name, unfilled) in [
        (format!("layers.{l}.group_kv"), 0.0f32),
        (format!("layers.{l}.group_score"), f32::NEG_INFINITY),
    ] {
        refused(&name, hd, &one, "not yet filled");
        refused(&name, 2 * hd - 1, &f32::NAN.to_le_bytes(), "not yet filled");
        assert!(ok(&with_element(&bytes, &name, hd - 1, &one)));
        assert!(ok(&with_element(
            &bytes,
            &name,
            hd,
            &unfilled.to_le_bytes()
        )));
    }
    let ids = cfg.engram_compressed_vocab_size as i64;
    for bad in [ids, -2, i64::MIN, i64::MAX] {
        refused("engram_history", 3, &bad.to_le_bytes(), "DEAD");
    }
    for good in [-1, 0, ids - 1] {
        assert!(ok(&with_element(
            &bytes,
            "engram_history",
            3,
            &good.to_le_bytes()
        )));
    }
}

#[test]
fn saving_is_atomic_and_load_reads_files() {
    let (model, options, bytes) = sample_state();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("x.state");
    std::fs::write(&file, b"old").unwrap();
    state::write_atomic(&file, &bytes).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    assert_eq!(
        state::load(&file, model.config(), &options)
            .unwrap()
            .position,
        10
    );
    std::fs::write(&file, &bytes[..100]).unwrap();
    assert!(state::load(&file, model.config(), &options).is_err());
    assert!(state::load(&tmp.path().join("missing"), model.config(), &options).is_err());
    // Writing into a missing directory fails cleanly.
    assert!(state::write_atomic(&tmp.path().join("no/such/dir/f"), &bytes).is_err());
}

#[test]
fn metamorphic_checks_pass_on_the_reference_in_both_layouts() {
    for dir in [presets().0, presets().1] {
        let model = Model::open(dir).unwrap();
        let v = model.config().vocab_size;
        let ids = tokens(30, v);
        // The container's widths (q_lora 48) are not 32-block multiples: exact numerics only.
        let profiles: &[Numerics] = if dir == presets().1 {
            &[Numerics::Exact]
        } else {
            &[Numerics::Exact, Numerics::Upstream]
        };
        for &numerics in profiles {
            let options = Options {
                numerics,
                ..Options::default()
            };
            let mut fresh = || Ok(metamorphic::Reference::new(&model, options.clone()));
            for split in [1usize, 6, 9] {
                let v = metamorphic::snapshot_restore(&mut fresh, &ids[..split], &ids[split..18])
                    .unwrap();
                assert!(v.passed, "{v:?}");
            }
            let v = metamorphic::prefix_reuse(&mut fresh, &ids[..7], &ids[7..20], &ids[20..26])
                .unwrap();
            assert!(v.passed, "{v:?}");
            let v = metamorphic::reset_replay(&mut fresh, &ids[..9], &ids[9..14], &ids[14..20])
                .unwrap();
            assert!(v.passed, "{v:?}");
        }
    }
}

/// A deliberately broken engine (restore keeps the old window rings, the classic prefix-cache
/// bug) must fail the checks: the checks can fail.
#[test]
fn metamorphic_checks_catch_a_stale_window() {
    struct Stale<'m>(metamorphic::Reference<'m>, &'m Model, Session<'m>);
    impl metamorphic::StatefulEngine for Stale<'_> {
        fn prefill(&mut self, t: &[u32]) -> ds41_engine::Result<Vec<f32>> {
            self.2.prefill(t, &mut Trace::disabled())?;
            Ok(self.2.logits().to_vec())
        }
        fn decode(&mut self, t: u32) -> ds41_engine::Result<Vec<f32>> {
            self.2.decode(t, &mut Trace::disabled())?;
            Ok(self.2.logits().to_vec())
        }
        fn snapshot(&self) -> ds41_engine::Result<Vec<u8>> {
            state::encode(self.2.state(), self.1.config(), self.2.options())
        }
        fn restore(&mut self, snap: &[u8]) -> ds41_engine::Result<()> {
            let mut st = state::decode(snap, Path::new("s"), self.1.config(), self.2.options())?;
            for (new, old) in st.layers.iter_mut().zip(&self.2.state().layers) {
                new.window = old.window.clone(); // the bug
            }
            self.2.set_state(st)
        }
        fn reset(&mut self) -> ds41_engine::Result<()> {
            self.0.reset()
        }
    }
    let model = Model::open(presets().0).unwrap();
    let ids = tokens(26, model.config().vocab_size);
    let options = Options {
        numerics: Numerics::Exact,
        ..Options::default()
    };
    let mut fresh = || {
        Ok(Stale(
            metamorphic::Reference::new(&model, options.clone()),
            &model,
            Session::new(&model, options.clone()),
        ))
    };
    let v = metamorphic::prefix_reuse(&mut fresh, &ids[..7], &ids[7..20], &ids[20..26]).unwrap();
    assert!(!v.passed, "{v:?}");
}

/// `ds41 forward --save-state` then a second process `--load-state` continues bit-exactly
/// (MODEL.md §7.1): the continued run's logits rows equal the uninterrupted run's.
#[test]
fn cli_save_then_load_state_continues_the_run() {
    use ds41_engine::trace::TraceFile;
    let dir = presets().0;
    let tmp = tempfile::tempdir().unwrap();
    let ids = tokens(16, 512);
    let list = |v: &[u32]| {
        v.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let ds41 = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ds41"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |n: &str| tmp.path().join(n).display().to_string();
    let d = dir.display().to_string();
    ds41(&[
        "forward",
        "--model",
        &d,
        "--tokens",
        &list(&ids),
        "--prefill",
        "9",
        "--numerics",
        "exact",
        "--out",
        &p("whole.st"),
    ]);
    ds41(&[
        "forward",
        "--model",
        &d,
        "--tokens",
        &list(&ids[..9]),
        "--numerics",
        "exact",
        "--out",
        &p("a.st"),
        "--save-state",
        &p("s.state"),
    ]);
    ds41(&[
        "forward",
        "--model",
        &d,
        "--tokens",
        &list(&ids[9..]),
        "--numerics",
        "exact",
        "--out",
        &p("b.st"),
        "--load-state",
        &p("s.state"),
    ]);
    let logits = |n: &str| {
        TraceFile::read(Path::new(&p(n)))
            .unwrap()
            .f32("logits")
            .unwrap()
            .1
            .to_vec()
    };
    let mut joined = logits("a.st");
    joined.extend(logits("b.st"));
    assert_bits_equal(&joined, &logits("whole.st"), "cli logits");
    // A mismatched run option is refused with the field named.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ds41"))
        .args([
            "forward",
            "--model",
            &d,
            "--tokens",
            "1",
            "--numerics",
            "upstream",
            "--out",
            &p("c.st"),
            "--load-state",
            &p("s.state"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fingerprint.numerics"));
}
