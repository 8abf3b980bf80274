//! Tokenizer throughput, engine vs the HF `tokenizers` crate (TOKENIZER.md).
//!
//! `DS41_RELEASE=/path/to/release-snapshot cargo bench -p ds41-engine --bench tokenizer`
//!
//! Workloads (each about 2 MB of UTF-8, built in memory):
//! * `dsml`: the five official DSML golden prompts (English, code, JSON, control tokens);
//! * `wide`: the wide corpus strings (every script, whitespace runs), joined by newlines;
//! * `mixed`: both interleaved.
//!
//! Each is encoded as one string and line by line, both sequentially on one thread, with
//! `encode_markup` (the HF `encode` equivalent). The best of several runs is reported in MB/s.
//! The ids are compared before timing so the numbers are for identical output.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ds41_engine::tokenizer::{corpus, Tokenizer};

const TARGET_BYTES: usize = 2 << 20;
const RUNS: usize = 3;

fn repeat_to(parts: &[String], target: usize) -> String {
    let mut out = String::with_capacity(target + 4096);
    while out.len() < target {
        for p in parts {
            out.push_str(p);
            out.push('\n');
        }
    }
    out
}

fn best_of(mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut n = 0;
    for _ in 0..RUNS {
        let t0 = Instant::now();
        n = f();
        best = best.min(t0.elapsed());
    }
    (best, n)
}

fn mb_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn main() {
    let Some(release) = std::env::var_os("DS41_RELEASE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
    else {
        eprintln!("SKIPPED: DS41_RELEASE not set (the benchmark needs the release tokenizer.json)");
        return;
    };
    let path = release.join("tokenizer.json");
    let t0 = Instant::now();
    let engine = Tokenizer::from_file(&path).expect("engine loads tokenizer.json");
    let engine_load = t0.elapsed();
    let t0 = Instant::now();
    let hf = tokenizers::Tokenizer::from_file(&path).expect("HF loads tokenizer.json");
    let hf_load = t0.elapsed();
    println!("load: engine {engine_load:.2?}, hf {hf_load:.2?}");

    let dsml: Vec<String> = (1..=5)
        .map(|n| {
            std::fs::read_to_string(release.join(format!("encoding/tests/test_output_{n}.txt")))
                .unwrap()
        })
        .collect();
    let mut wide: Vec<String> = corpus::wide(20_000, 11)
        .into_iter()
        .map(|s| s.text)
        .collect();
    wide.extend(corpus::extra().into_iter().map(|s| s.text));
    let mixed: Vec<String> = wide
        .chunks(200)
        .zip(dsml.iter().cycle())
        .flat_map(|(chunk, prompt)| chunk.iter().cloned().chain(std::iter::once(prompt.clone())))
        .collect();

    println!(
        "{:<8} {:<9} {:>9} {:>12} {:>12} {:>7}",
        "text", "mode", "MB", "engine MB/s", "hf MB/s", "ratio"
    );
    for (name, parts) in [("dsml", &dsml), ("wide", &wide), ("mixed", &mixed)] {
        let text = repeat_to(parts, TARGET_BYTES);
        let lines: Vec<&str> = text.lines().collect();
        let hf_ids = |s: &str| hf.encode(s, false).expect("HF encodes").get_ids().to_vec();
        assert_eq!(
            engine.encode_markup(&text),
            hf_ids(&text),
            "{name}: ids differ"
        );

        let (e_one, n_e) = best_of(|| engine.encode_markup(&text).len());
        let (h_one, n_h) = best_of(|| hf_ids(&text).len());
        assert_eq!(n_e, n_h);
        let (e_lines, _) = best_of(|| lines.iter().map(|l| engine.encode_markup(l).len()).sum());
        let (h_lines, _) = best_of(|| lines.iter().map(|l| hf_ids(l).len()).sum());
        let mb = text.len() as f64 / 1e6;
        for (mode, e, h) in [("one call", e_one, h_one), ("per line", e_lines, h_lines)] {
            println!(
                "{name:<8} {mode:<9} {mb:>9.2} {:>12.1} {:>12.1} {:>6.2}x",
                mb_s(text.len(), e),
                mb_s(text.len(), h),
                h.as_secs_f64() / e.as_secs_f64()
            );
        }
        println!("{name:<8} tokens {n_e}");
    }
}
