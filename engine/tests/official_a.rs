//! Upstream profile vs the official model (`DS41_UPSTREAM/official_a`), MODEL.md §5.1.

mod model_common;
use model_common as common;

use std::path::Path;

use ds41_engine::model::{IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::{Trace, TraceFile, TraceOptions};

fn open_model(dir: &Path) -> Model {
    common::official_a_model(dir)
}

fn run(model: &Model, ids: &[u32], prefill: usize, options: Options) -> Trace {
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: true,
        },
    );
    let mut s = Session::new(model, options);
    s.prefill(&ids[..prefill], &mut trace).unwrap();
    for &t in &ids[prefill..] {
        s.decode(t, &mut trace).unwrap();
    }
    trace
}

#[test]
fn official_a_prefill_debug() {
    let Some(up) = common::upstream("official_a_prefill_debug") else {
        return;
    };
    let model = open_model(&up);
    let g =
        TraceFile::read(&up.join("official_a/p48_d00/golden_prefill_only.safetensors")).unwrap();
    let ids: Vec<u32> = g
        .i64("input_ids")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as u32)
        .collect();
    let opts = Options {
        numerics: Numerics::Upstream,
        index_k: IndexK::AsShipped,
        ..Options::default()
    };
    let tr = run(&model, &ids, ids.len(), opts);
    let cfg = model.config();
    let (l, hc, d) = (cfg.n_layers, cfg.hc_mult, cfg.dim);
    assert_eq!(g.i64("engram_hash").unwrap().1, &tr.engram_hash[..]);
    for name in ["block_input", "mid", "residual"] {
        let gd = g.f32(name).unwrap().1;
        let ed: &[f32] = match name {
            "block_input" => &tr.block_input,
            "mid" => &tr.mid,
            _ => &tr.residual,
        };
        for layer in 0..l {
            let mut worst: f64 = 0.0;
            for t in 0..ids.len() {
                let c = (t * l + layer) * hc * d;
                worst = worst.max(common::rel_l2(&ed[c..c + hc * d], &gd[c..c + hc * d]));
            }
            eprintln!("{name} L{layer}: worst rel L2 {worst:.3e}");
        }
    }
    for name in ["attn_out", "moe_out"] {
        let gd = g.f32(name).unwrap().1;
        let ed: &[f32] = if name == "attn_out" {
            &tr.attn_out
        } else {
            &tr.moe_out
        };
        for layer in 0..l {
            let mut worst: f64 = 0.0;
            for t in 0..ids.len() {
                let c = (t * l + layer) * d;
                worst = worst.max(common::rel_l2(&ed[c..c + d], &gd[c..c + d]));
            }
            eprintln!("{name} L{layer}: worst rel L2 {worst:.3e}");
        }
    }
    let gl = g.f32("logits").unwrap().1;
    eprintln!("logits rel L2 {:.3e}", common::rel_l2(&tr.logits, gl));
    tr.write(Path::new("/tmp/fwd_p48.safetensors")).unwrap();
}

fn replay(model: &Model, g: &TraceFile, prefill: usize, options: Options) -> Trace {
    let ids: Vec<u32> = g
        .i64("input_ids")
        .unwrap()
        .1
        .iter()
        .map(|&x| x as u32)
        .collect();
    let forcing = ds41_engine::model::Forcing::from_golden(g, model.config()).unwrap();
    let mut trace = Trace::new(
        model.config(),
        TraceOptions {
            enabled: true,
            sub_ops: true,
        },
    );
    let mut s = Session::new(model, options);
    s.replay(&ids[..prefill], &forcing, &mut trace).unwrap();
    for i in prefill..ids.len() {
        s.replay(&ids[i..i + 1], &forcing, &mut trace).unwrap();
    }
    trace
}

fn per_layer(g: &TraceFile, tr: &Trace, name: &str, width: usize) -> Vec<(f64, usize)> {
    let gd = g.f32(name).unwrap().1;
    let ed: &[f32] = match name {
        "block_input" => &tr.block_input,
        "mid" => &tr.mid,
        "attn_out" => &tr.attn_out,
        "moe_out" => &tr.moe_out,
        _ => &tr.residual,
    };
    let l = tr.n_layers;
    (0..l)
        .map(|layer| {
            let mut worst = (0.0f64, 0usize);
            for t in 0..tr.tokens {
                let c = (t * l + layer) * width;
                let r = common::rel_l2(&ed[c..c + width], &gd[c..c + width]);
                if r > worst.0 {
                    worst = (r, t);
                }
            }
            worst
        })
        .collect()
}

#[test]
fn official_a_replay_debug() {
    let Some(up) = common::upstream("official_a_replay_debug") else {
        return;
    };
    let model = open_model(&up);
    let sched = std::env::var("SCHED").unwrap_or("p48_d00/golden_prefill_only".into());
    let prefill: usize = sched[1..3].parse().unwrap();
    let g = TraceFile::read(&up.join(format!("official_a/{sched}.safetensors"))).unwrap();
    let index_k = if sched.contains("owner") {
        IndexK::Owner
    } else {
        IndexK::AsShipped
    };
    let tr = replay(
        &model,
        &g,
        prefill,
        Options {
            numerics: Numerics::Upstream,
            index_k,
            ..Options::default()
        },
    );
    let (hc, d) = (model.config().hc_mult, model.config().dim);
    for (name, w) in [
        ("block_input", hc * d),
        ("attn_out", d),
        ("mid", hc * d),
        ("moe_out", d),
        ("residual", hc * d),
    ] {
        let v = per_layer(&g, &tr, name, w);
        eprintln!(
            "{name:12} {}",
            v.iter()
                .map(|(r, t)| format!("{r:.2e}@{t}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    for l in model.config().index_source_layers.clone() {
        let gt = g.i64(&format!("topk.L{l}")).unwrap().1;
        let et = &tr.topk[&l];
        let k = tr.index_topk;
        let mut bad = vec![];
        for t in 0..tr.tokens {
            let mut a: Vec<i64> = gt[t * k..(t + 1) * k]
                .iter()
                .copied()
                .filter(|&x| x >= 0)
                .collect();
            let mut b: Vec<i64> = et[t * k..(t + 1) * k]
                .iter()
                .map(|&x| x as i64)
                .filter(|&x| x >= 0)
                .collect();
            a.sort();
            b.sort();
            if a != b {
                bad.push((t, a, b));
            }
        }
        eprintln!(
            "topk.L{l}: {} rows differ; first {:?}",
            bad.len(),
            bad.first()
        );
    }
    let ge = g.i64("experts").unwrap().1;
    let mut bad = 0;
    for (i, c) in ge.chunks(2).enumerate() {
        let mut a = c.to_vec();
        let mut b: Vec<i64> = tr.experts[i * 2..i * 2 + 2]
            .iter()
            .map(|&x| x as i64)
            .collect();
        a.sort();
        b.sort();
        if a != b {
            bad += 1;
        }
    }
    eprintln!("experts: {bad} cells differ");
    let gl = g.f32("logits").unwrap().1;
    eprintln!("logits rel L2 {:.3e}", common::rel_l2(&tr.logits, gl));
}
