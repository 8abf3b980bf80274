//! A port of the verdict rules of `shared/tools/compare.py` (normal and `--replay` modes) for
//! the model tests: decisions exact except fragile flips, Engram hashes exact, per-cell
//! residual / sub-op rel L2, logits rel L2 / max |d| / argmax.

use std::collections::{BTreeMap, BTreeSet};

use ds41_engine::trace::{Trace, TraceFile};

use super::{argmax, rel_l2};

#[derive(Debug, Clone)]
pub struct Limits {
    pub residual: f64,
    pub logits_rel: f64,
    pub logits_abs: f64,
    pub attn: f64,
    pub moe: f64,
    pub engram: f64,
    pub floor: f64,
}

impl Limits {
    /// Parse `recommended_compare_args` / `recommended_replay_args` of a meta.json.
    pub fn from_args(args: &[String]) -> Limits {
        let mut l = Limits {
            residual: 0.2,
            logits_rel: 0.2,
            logits_abs: 0.5,
            attn: 0.1,
            moe: 0.1,
            engram: 0.01,
            floor: 0.005,
        };
        let mut it = args.iter();
        while let Some(k) = it.next() {
            if k == "--replay" {
                l.floor = 0.004;
                continue;
            }
            let v: f64 = it.next().unwrap().parse().unwrap();
            match k.as_str() {
                "--residual-rel-l2" => l.residual = v,
                "--logits-rel-l2" => l.logits_rel = v,
                "--logits-max-abs" => l.logits_abs = v,
                "--attn-rel-l2" => l.attn = v,
                "--moe-rel-l2" => l.moe = v,
                "--engram-rel-l2" => l.engram = v,
                "--fragile-floor" => l.floor = v,
                other => panic!("unknown compare arg {other}"),
            }
        }
        l
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub failures: Vec<String>,
    pub fragile_flips: usize,
    pub decisions_compared: usize,
    /// Worst compared rel L2 per layer, per tensor name.
    pub worst: BTreeMap<String, Vec<f64>>,
    pub logits_worst_rel: f64,
    pub logits_worst_abs: f64,
    pub logits_compared: usize,
    pub logits_steps: usize,
}

fn set_of(v: &[i64]) -> BTreeSet<i64> {
    v.iter().copied().filter(|&x| x >= 0).collect()
}

fn trace_topk(tr: &Trace, l: usize, t: usize) -> Vec<i64> {
    let k = tr.index_topk;
    tr.topk[&l][t * k..(t + 1) * k]
        .iter()
        .map(|&x| x as i64)
        .collect()
}

fn margins(g: &TraceFile, name: &str, n: usize) -> Vec<f32> {
    g.f32(name)
        .map(|(_, d)| d.to_vec())
        .unwrap_or(vec![f32::INFINITY; n])
}

/// compare.py's normal mode.
pub fn compare(g: &TraceFile, tr: &Trace, lim: &Limits) -> Report {
    let mut rep = Report::default();
    let (t_n, l_n) = (tr.tokens, tr.n_layers);
    let ke = tr.topk_experts;
    if g.i64("engram_hash").unwrap().1 != &tr.engram_hash[..] {
        rep.failures.push("engram_hash differs".into());
    }
    let gm_exp = margins(g, "margin.experts", t_n * l_n);
    let topk_layers: Vec<usize> = tr.index_layers.clone();
    let gm_topk: BTreeMap<usize, Vec<f32>> = topk_layers
        .iter()
        .map(|&l| (l, margins(g, &format!("margin.topk.L{l}"), t_n)))
        .collect();
    let gres = g.f32("residual").unwrap().1;
    let gexp = g.i64("experts").unwrap().1;
    let w = tr.hc * tr.dim;
    let mut colmax = vec![0.0f64; l_n];
    let mut frontier = l_n;
    let mut excl = vec![l_n; t_n];
    let mut worst = vec![0.0f64; l_n];
    for t in 0..t_n {
        excl[t] = frontier;
        for l in 0..l_n {
            if l >= frontier {
                break;
            }
            let allowed = |cap: f64, colmax: &[f64]| {
                let up = colmax[..l].iter().copied().fold(0.0, f64::max);
                cap.min(lim.floor + 15.0 * up)
            };
            let mut flip = None;
            if let Some(m) = gm_topk.get(&l) {
                rep.decisions_compared += 1;
                let gk = &g.i64(&format!("topk.L{l}")).unwrap().1;
                let k = gk.len() / t_n;
                if set_of(&gk[t * k..(t + 1) * k]) != set_of(&trace_topk(tr, l, t)) {
                    flip = Some(("topk", m[t] as f64, allowed(0.3, &colmax)));
                }
            }
            if flip.is_none() {
                rep.decisions_compared += 1;
                let c = (t * l_n + l) * ke;
                let e: Vec<i64> = tr.experts[c..c + ke].iter().map(|&x| x as i64).collect();
                if set_of(&gexp[c..c + ke]) != set_of(&e) {
                    flip = Some((
                        "experts",
                        gm_exp[t * l_n + l] as f64,
                        allowed(0.05, &colmax),
                    ));
                }
            }
            if let Some((kind, margin, lim_here)) = flip {
                if margin <= lim_here {
                    rep.fragile_flips += 1;
                } else {
                    rep.failures.push(format!("ROBUST {kind} mismatch at token {t} layer {l} (margin {margin:.3e} > {lim_here:.3e})"));
                }
                frontier = frontier.min(l);
                excl[t] = excl[t].min(l);
                break;
            }
            let c = (t * l_n + l) * w;
            let r = rel_l2(&tr.residual[c..c + w], &gres[c..c + w]);
            colmax[l] = colmax[l].max(r);
            worst[l] = worst[l].max(r);
            if r > lim.residual {
                rep.failures.push(format!(
                    "residual token {t} layer {l}: rel L2 {r:.3e} > {}",
                    lim.residual
                ));
            }
        }
        excl[t] = excl[t].min(frontier);
    }
    rep.worst.insert("residual".into(), worst);
    logits(g, tr, lim, |p| excl[p] >= l_n, &mut rep);
    rep
}

fn logits(
    g: &TraceFile,
    tr: &Trace,
    lim: &Limits,
    compared: impl Fn(usize) -> bool,
    rep: &mut Report,
) {
    let gl = g.f32("logits").unwrap().1;
    let gpos = g.i64("logits_positions").unwrap().1;
    let v = tr.vocab;
    for (i, &p) in gpos.iter().enumerate() {
        rep.logits_steps += 1;
        let Some(r) = tr.logits_positions.iter().position(|&q| q == p) else {
            rep.failures.push(format!("no logits row for position {p}"));
            continue;
        };
        if !compared(p as usize) {
            continue;
        }
        rep.logits_compared += 1;
        let (a, b) = (&tr.logits[r * v..(r + 1) * v], &gl[i * v..(i + 1) * v]);
        let rl = rel_l2(a, b);
        let ma = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() as f64)
            .fold(0.0, f64::max);
        rep.logits_worst_rel = rep.logits_worst_rel.max(rl);
        rep.logits_worst_abs = rep.logits_worst_abs.max(ma);
        if rl > lim.logits_rel || ma > lim.logits_abs || argmax(a) != argmax(b) {
            rep.failures.push(format!(
                "logits at position {p}: rel L2 {rl:.3e}, max|d| {ma:.3e}, argmax {}/{}",
                argmax(b),
                argmax(a)
            ));
        }
    }
}

/// compare.py's `--replay` mode.
pub fn compare_replay(g: &TraceFile, tr: &Trace, lim: &Limits) -> Report {
    let mut rep = Report::default();
    let (t_n, l_n) = (tr.tokens, tr.n_layers);
    let ke = tr.topk_experts;
    if g.i64("engram_hash").unwrap().1 != &tr.engram_hash[..] {
        rep.failures.push("engram_hash differs".into());
    }
    let gm_exp = margins(g, "margin.experts", t_n * l_n);
    let topk_layers = tr.index_layers.clone();
    let mut skip_all = vec![false; t_n * l_n];
    let mut skip_moe = vec![false; t_n * l_n];
    let gexp = g.i64("experts").unwrap().1;
    for t in 0..t_n {
        for l in 0..l_n {
            if topk_layers.contains(&l) {
                rep.decisions_compared += 1;
                let gk = &g.i64(&format!("topk.L{l}")).unwrap().1;
                let k = gk.len() / t_n;
                if set_of(&gk[t * k..(t + 1) * k]) != set_of(&trace_topk(tr, l, t)) {
                    let m = margins(g, &format!("margin.topk.L{l}"), t_n)[t] as f64;
                    if m <= lim.floor {
                        rep.fragile_flips += 1;
                        let next = topk_layers
                            .iter()
                            .copied()
                            .filter(|&x| x > l)
                            .min()
                            .unwrap_or(l_n);
                        for x in l..next {
                            skip_all[t * l_n + x] = true;
                        }
                    } else {
                        rep.failures.push(format!(
                            "ROBUST topk.L{l} flip at token {t} (margin {m:.3e})"
                        ));
                    }
                }
            }
            if !skip_all[t * l_n + l] {
                rep.decisions_compared += 1;
                let c = (t * l_n + l) * ke;
                let e: Vec<i64> = tr.experts[c..c + ke].iter().map(|&x| x as i64).collect();
                if set_of(&gexp[c..c + ke]) != set_of(&e) {
                    let m = gm_exp[t * l_n + l] as f64;
                    if m <= lim.floor {
                        rep.fragile_flips += 1;
                        skip_moe[t * l_n + l] = true;
                    } else {
                        rep.failures.push(format!(
                            "ROBUST expert flip at token {t} layer {l} (margin {m:.3e})"
                        ));
                    }
                }
            }
        }
    }
    let (hc, d) = (tr.hc, tr.dim);
    for (name, width, limit, mine) in [
        ("attn_out", d, lim.attn, &tr.attn_out),
        ("moe_out", d, lim.moe, &tr.moe_out),
        ("residual", hc * d, lim.residual, &tr.residual),
        ("block_input", hc * d, lim.engram, &tr.block_input),
    ] {
        let gd = g.f32(name).unwrap().1;
        let mut worst = vec![0.0f64; l_n];
        for t in 0..t_n {
            for l in 0..l_n {
                let i = t * l_n + l;
                if name != "block_input" && (skip_all[i] || (name != "attn_out" && skip_moe[i])) {
                    continue;
                }
                let c = i * width;
                let r = rel_l2(&mine[c..c + width], &gd[c..c + width]);
                worst[l] = worst[l].max(r);
                if r > limit {
                    rep.failures.push(format!(
                        "{name} token {t} layer {l}: rel L2 {r:.3e} > {limit}"
                    ));
                }
            }
        }
        rep.worst.insert(name.into(), worst);
    }
    logits(g, tr, lim, |_| true, &mut rep);
    rep
}
