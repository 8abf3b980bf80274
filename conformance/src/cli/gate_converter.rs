//! `ds41 gate converter`: run the converter gate (`ds41_conformance::converter_gate`) and
//! print its report (a table, or `--json`). Exit 0 when the container passes, 1 when it does
//! not, 2 on bad input.

use anyhow::Context;
use ds41_conformance::converter_gate::{self, ConverterGates, ConverterReport};
use ds41_conformance::gates::GateSet;

use super::gate::ConverterArgs;

pub fn run(a: ConverterArgs) -> anyhow::Result<i32> {
    let _embedded;
    let dir = match &a.gates {
        Some(d) => d.clone(),
        None => {
            _embedded = ds41_conformance::interrupt::ScratchDir::new("ds41-gates-")?;
            ds41_conformance::embedded::materialize(_embedded.path())?
                .join(ds41_conformance::embedded::GATES_DIR)
        }
    };
    let g = ConverterGates::load(&dir)?;
    let profiles = GateSet::load(&dir)?;
    let forward = (!a.no_forward).then(|| g.forward.apply(profiles.get(g.forward.profile)));
    let report = converter_gate::run(&a.release, &a.container, &g, forward.as_ref())?;
    if let Some(dir) = &a.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("converter.json");
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, &g);
    }
    Ok(if report.pass { 0 } else { 1 })
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.3}%", 100.0 * x)
    } else {
        "inf".into()
    }
}

fn print_report(r: &ConverterReport, g: &ConverterGates) {
    let a = &r.accounting;
    println!(
        "converter gate: {} -> {}",
        r.release.display(),
        r.container.display()
    );
    println!(
        "accounting: {} release tensors: {} real names, {} unrenamed; {} scale companions folded; renamed {} trunk, {} expert matrices, {} Engram tables; dropped {} (MTP); missing {}, extra {}, reshaped {}",
        a.release_tensors,
        a.real_names,
        a.unrenamed.len(),
        a.scale_companions,
        a.renamed_trunk,
        a.renamed_expert_matrices,
        a.renamed_engram_tables,
        a.dropped.len(),
        a.missing.len(),
        a.extra.len(),
        a.shape_mismatch.len()
    );
    if let Some(why) = &r.container_refused {
        println!("{why}");
    } else {
        println!(
            "config: {}",
            if r.config_differences.is_empty() {
                "the release's model".to_string()
            } else {
                format!("{} fields differ", r.config_differences.len())
            }
        );
        println!("round trip, rel L2 against the release's exact dequantisation:");
        println!(
            "  {:<8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "format", "tensors", "min", "median", "max", "limit", "failed"
        );
        for f in &r.formats {
            println!(
                "  {:<8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>7}",
                f.format,
                f.tensors,
                pct(f.min),
                pct(f.median),
                pct(f.max),
                pct(f.limit),
                f.failed
            );
        }
        if let Some(e) = &r.experts {
            println!(
                "  per expert (w1+w3+w2): {} experts, {} – {} (median {}), worst {}",
                e.experts,
                pct(e.min),
                pct(e.max),
                pct(e.median),
                e.worst
            );
            let layers: Vec<String> = e
                .per_layer
                .iter()
                .map(|(l, a, b)| format!("L{l} {}–{}", pct(*a), pct(*b)))
                .collect();
            println!("    by layer: {}", layers.join(", "));
        }
        let mut worst: Vec<_> = r.tensors.iter().filter(|t| t.limit > 0.0).collect();
        worst.sort_by(|x, y| (y.rel_l2 / y.limit).total_cmp(&(x.rel_l2 / x.limit)));
        if !worst.is_empty() {
            println!("  closest to their limits:");
            for t in worst.iter().take(5) {
                println!(
                    "    {:<44} {:<8} {:>9} (limit {}; worst row {} at {})",
                    t.name,
                    t.format,
                    pct(t.rel_l2),
                    pct(t.limit),
                    t.worst_row,
                    pct(t.worst_row_rel_l2)
                );
            }
        }
        let e = &r.engram;
        if e.layers > 0 {
            let steps = r
                .tensors
                .iter()
                .filter_map(|t| t.max_steps)
                .fold(0f64, f64::max);
            println!(
                "engram: {} tables within {steps:.2} steps (limit {}); token map {} of {} ids differ; hash constants {}",
                e.layers,
                g.engram.max_steps,
                e.token_map_differences,
                e.token_map_ids,
                if e.failures.iter().any(|f| f.starts_with("engram.json")) {
                    "differ"
                } else {
                    "identical"
                }
            );
        }
        if let Some(f) = &r.forward {
            println!(
                "forward ({} profile, exact numerics, {} tokens, prefill {}):",
                f.profile,
                f.tokens.len(),
                f.prefill
            );
            let e2e = if f.end_to_end_judged {
                "end to end"
            } else {
                "end to end (reported, not judged)"
            };
            let replay = match &f.replay_not_judged {
                None => "replay".to_string(),
                Some(why) => format!("replay (reported, not judged: {why})"),
            };
            for (what, c) in [(replay.as_str(), &f.replay), (e2e, &f.end_to_end)] {
                println!(
                    "  {what}: {}{}; {} decision flips excused",
                    if c.failed() { "FAIL, " } else { "" },
                    c.first_divergence
                        .as_ref()
                        .map_or("no divergence".into(), |d| format!(
                            "first divergence {}",
                            d.headline()
                        )),
                    c.excused_flips()
                );
                for m in &c.metrics {
                    println!(
                        "    {:<16} {:<8} {}",
                        m.name,
                        format!("{:?}", m.status),
                        m.text
                    );
                }
            }
        }
    }
    if r.pass {
        println!("PASS");
    } else {
        println!("FAIL: {} problems", r.failures.len());
        for f in &r.failures {
            println!("  {f}");
        }
    }
}
