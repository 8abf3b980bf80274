//! Reader throughput, printed, never asserted (run:
//! `cargo test -p ds41-engine --release --test reader_throughput -- --ignored --nocapture`).
#![recursion_limit = "256"]
mod common;

use common::*;
use ds41_engine::checkpoint::{self, Checkpoint, ContainerCheckpoint};
use std::time::Instant;

fn time<T>(label: &str, elems: usize, mut f: impl FnMut() -> T) {
    f(); // warm the page cache
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    let s = t.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{label:<42} {:>9.3} ms  {:>8.1} M elem/s",
        s * 1e3,
        elems as f64 / s / 1e6
    );
}

#[test]
#[ignore = "benchmark: prints numbers, run with --ignored --nocapture in release mode"]
fn release_dequant_throughput() {
    let (r, c) = (2304usize, 5120usize);
    let mut g = Bytes::new(3);
    let mut ts = release_tensors(&tiny_config());
    ts.extend([
        T {
            name: "bench.fp8.weight".into(),
            dtype: "F8_E4M3",
            shape: vec![r, c],
            data: g.fill(r * c, |b| b & 0x7E),
        },
        T {
            name: "bench.fp8.scale".into(),
            dtype: "F8_E8M0",
            shape: vec![r / 32, c / 32],
            data: g.fill(r * c / 1024, |b| 120 + b % 8),
        },
        T {
            name: "bench.fp4.weight".into(),
            dtype: "I8",
            shape: vec![r, c / 2],
            data: g.fill(r * c / 2, |b| b),
        },
        T {
            name: "bench.fp4.scale".into(),
            dtype: "F8_E8M0",
            shape: vec![r, c / 32],
            data: g.fill(r * c / 32, |b| 120 + b % 8),
        },
        T {
            name: "bench.bf16.weight".into(),
            dtype: "BF16",
            shape: vec![r, c],
            data: g.fill(r * c * 2, |b| b & 0x3F),
        },
    ]);
    let d = tempfile::tempdir().unwrap();
    write_release(d.path(), &tiny_release_config(), &ts);
    let t = Instant::now();
    let ck = checkpoint::open(d.path()).unwrap();
    println!(
        "open (config + map + headers + checks): {:.3} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    for n in ["bench.fp8.weight", "bench.fp4.weight", "bench.bf16.weight"] {
        time(&format!("tensor_f32 {n} [{r}x{c}]"), r * c, || {
            ck.tensor_f32(n).unwrap()
        });
        let mut row = vec![0.0f32; c];
        time(&format!("rows_f32 {n} (1 row)"), c, || {
            ck.rows_f32(n, 1000, &mut row).unwrap()
        });
    }
    let d = tempfile::tempdir().unwrap();
    common::container::write_container(d.path());
    let ck = ContainerCheckpoint::open(d.path()).unwrap();
    let n = "layers.2.ffn.experts.1.w2.weight";
    let el = ck.shape(n).unwrap().iter().product();
    time(&format!("container VQ3R expert {n}"), el, || {
        ck.tensor_f32(n).unwrap()
    });
    let n = "layers.2.attn.wq_b.weight";
    let el = ck.shape(n).unwrap().iter().product();
    time(&format!("container Q4G trunk {n}"), el, || {
        ck.tensor_f32(n).unwrap()
    });
}
