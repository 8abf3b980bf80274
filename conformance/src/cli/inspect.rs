//! `ds41 inspect <PATH> [--json]`: describe a checkpoint (MODEL.md §2–§4, CONTAINER.md §1–§9).
//!
//! PATH is a checkpoint directory (release or WASTE container, detected), or a bare
//! `config.json` (release HF form or `inference/config.json`) / `manifest.json`, in which case
//! only the config, the layer roles and the parameter counts the config implies are shown.
//! Opening a checkpoint runs every load-time check of `engine::checkpoint`; a refused
//! checkpoint is an error (exit 2) that names the file, tensor or field.

use ds41_engine::checkpoint::{self, names::expected_tensors, Checkpoint, Layout};
use ds41_engine::config::{Config, LayerRole};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory, or a config.json / manifest.json file.
    pub path: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Containers: verify the CRC-32 of every expert record.
    #[arg(long)]
    pub verify: bool,
}

/// What `inspect` reports (also its `--json` form).
#[derive(Debug, Serialize)]
pub struct Report {
    pub path: PathBuf,
    /// "release", "container", or "config" for a bare config file.
    pub layout: String,
    pub config: Config,
    pub roles: Vec<RoleRow>,
    pub params: ParamCounts,
    /// Tensor count per storage kind (checkpoints only).
    pub storage: BTreeMap<String, usize>,
    /// Notes worth a reader's attention (e.g. MODEL.md §2.2 item 8).
    pub warnings: Vec<String>,
    /// Expert records whose CRC was verified (`--verify` on a container).
    pub crc_verified: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct RoleRow {
    pub role: String,
    #[serde(flatten)]
    pub detail: LayerRole,
}

/// Parameter counts (logical elements) of the tensors the config implies (MODEL.md §4.2–§4.4),
/// by group; `stored` counts every tensor the checkpoint serves except `.scale` companions
/// (MTP stages and vision included).
#[derive(Debug, Default, Serialize)]
pub struct ParamCounts {
    pub embed_head: u64,
    pub attention: u64,
    pub routed_experts: u64,
    pub shared_experts: u64,
    pub router: u64,
    pub hyper_connections: u64,
    pub norms: u64,
    pub engram_tables: u64,
    pub engram_other: u64,
    pub total: u64,
    /// Per token: everything but the routed experts and Engram tables, plus k of n experts and
    /// the looked-up Engram rows.
    pub active_per_token: u64,
    pub stored: Option<u64>,
}

/// The role label of one layer (MODEL.md §3 vocabulary).
pub fn role_label(r: &LayerRole) -> String {
    if r.mtp {
        return "MTP stage (window-only)".into();
    }
    if r.window_only {
        return "window-only".into();
    }
    let mut s = if r.kv_source {
        format!("KV source (r={}), index-key owner", r.ratio)
    } else if r.index_source {
        "index source (index-only)".to_string()
    } else {
        "consumer".to_string()
    };
    if r.candidate_writer {
        s.push_str(", candidate writer");
    }
    if r.candidate_consumer {
        s.push_str(", candidate consumer");
    }
    s
}

fn param_counts(cfg: &Config) -> ParamCounts {
    let mut p = ParamCounts::default();
    for t in expected_tensors(cfg) {
        let n: u64 = t.shape.iter().map(|&d| d as u64).product();
        let name = t.name.as_str();
        let slot = if name == "embed.weight" || name == "head.weight" {
            &mut p.embed_head
        } else if name.contains(".engram.embed.") {
            &mut p.engram_tables
        } else if name.contains(".engram.") {
            &mut p.engram_other
        } else if name.contains(".ffn.experts.") {
            &mut p.routed_experts
        } else if name.contains(".shared_experts.") {
            &mut p.shared_experts
        } else if name.contains(".ffn.gate.") {
            &mut p.router
        } else if name.contains(".hc_") {
            &mut p.hyper_connections
        } else if name.contains(".attn.") {
            &mut p.attention
        } else {
            &mut p.norms
        };
        *slot += n;
    }
    p.total = p.embed_head
        + p.attention
        + p.routed_experts
        + p.shared_experts
        + p.router
        + p.hyper_connections
        + p.norms
        + p.engram_tables
        + p.engram_other;
    let n = cfg.n_routed_experts.max(1) as u64;
    let k = cfg.n_activated_experts as u64;
    let engram_rows =
        (cfg.engram_layer_ids.len() * cfg.engram_columns() * cfg.engram_head_dim) as u64;
    // The head is used per token; the embedding is one row per token.
    p.active_per_token =
        p.total - p.routed_experts - p.engram_tables - (cfg.vocab_size as u64 - 1) * cfg.dim as u64
            + p.routed_experts / n * k
            + engram_rows;
    p
}

/// Build the report for a directory or a config file.
pub fn report(path: &Path, verify: bool) -> anyhow::Result<Report> {
    let mut storage = BTreeMap::new();
    let mut crc_verified = None;
    let (layout, config, stored) = if path.is_dir() {
        let ck: Box<dyn Checkpoint> =
            if verify && checkpoint::detect_layout(path)? == Layout::Container {
                let c = checkpoint::ContainerCheckpoint::open(path)?;
                crc_verified = Some(c.verify_all_crc()?);
                Box::new(c)
            } else {
                checkpoint::open(path)?
            };
        let mut stored = 0u64;
        for n in ck.names() {
            *storage.entry(format!("{:?}", ck.storage(&n)?)).or_insert(0) += 1;
            if !n.ends_with(".scale") {
                stored += ck.shape(&n)?.iter().map(|&d| d as u64).product::<u64>();
            }
        }
        let layout = match ck.layout() {
            Layout::Release => "release",
            Layout::Container => "container",
        };
        (layout.to_string(), ck.config().clone(), Some(stored))
    } else {
        (String::from("config"), config_from_file(path)?, None)
    };
    let roles = config
        .layer_roles()
        .into_iter()
        .map(|r| RoleRow {
            role: role_label(&r),
            detail: r,
        })
        .collect();
    let mut params = param_counts(&config);
    params.stored = stored;
    let mut warnings = Vec::new();
    if !config.candidate_coverage_ok() {
        warnings.push(format!(
            "MODEL.md §2.2 item 8: (candidate_topk_blocks − 1)·candidate_block_size + 1 = {} < index_topk = {}; selected −∞ entries can be attended",
            config.candidate_topk_blocks.saturating_sub(1) * config.candidate_block_size + 1,
            config.index_topk
        ));
    }
    if config.validate_upstream_kernels().is_err() {
        warnings.push(
            "dimensions break the FP8/FP4 kernel rules (MODEL.md §2.2 item 7): exact regime only"
                .into(),
        );
    }
    Ok(Report {
        path: path.to_path_buf(),
        layout,
        config,
        roles,
        params,
        storage,
        warnings,
        crc_verified,
    })
}

/// A bare file: a WASTE manifest, an HF config.json, or inference/config.json (ModelArgs).
fn config_from_file(path: &Path) -> anyhow::Result<Config> {
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", path.display()))?;
    Ok(
        if v.get("format_version").is_some() && v.get("config").is_some() {
            Config::from_container_manifest(path)?
        } else if v.get("dim").is_some() || v.get("model_args").is_some() {
            Config::from_inference_json(path)?
        } else {
            Config::from_release_json(path)?
        },
    )
}

fn layers_text(ids: &[usize]) -> String {
    format!("{ids:?}")
}

fn opt(x: Option<usize>) -> String {
    x.map_or("-".into(), |v| v.to_string())
}

/// The human-readable form.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write;
    let c = &r.config;
    let mut s = String::new();
    let _ = writeln!(s, "path:    {}", r.path.display());
    let _ = writeln!(s, "layout:  {}", r.layout);
    let _ = writeln!(s, "\nconfig");
    let _ = writeln!(
        s,
        "  vocab {}  dim {}  layers {} (+{} MTP)  hc {}×{} Sinkhorn iters",
        c.vocab_size, c.dim, c.n_layers, c.n_mtp_layers, c.hc_mult, c.hc_sinkhorn_iters
    );
    let _ = writeln!(
        s,
        "  attention: {} heads × {} (rope {}), q_lora {}, o {}×{}, window {}",
        c.n_heads,
        c.head_dim,
        c.rope_head_dim,
        c.q_lora_rank,
        c.o_groups,
        c.o_lora_rank,
        c.window_size
    );
    let _ = writeln!(
        s,
        "  sources: KV {}  index {}  candidate {} ({} blocks × {})  indexer {}×{} top-{}",
        layers_text(&c.kv_source_layers),
        layers_text(&c.index_source_layers),
        opt(c.candidate_source_layer),
        c.candidate_topk_blocks,
        c.candidate_block_size,
        c.index_n_heads,
        c.index_head_dim,
        c.index_topk
    );
    let _ = writeln!(
        s,
        "  MoE: {} routed (top-{}) + {} shared, inter {}, {}, route_scale {}, swiglu_limit {}",
        c.n_routed_experts,
        c.n_activated_experts,
        c.n_shared_experts,
        c.moe_inter_dim,
        c.score_func,
        c.route_scale,
        c.swiglu_limit
    );
    let _ = writeln!(
        s,
        "  rope θ {} / compressed θ {} (YaRN ×{}, orig {}, β {}/{}), norm_eps {:e}",
        c.rope_theta,
        c.compress_rope_theta,
        c.rope_factor,
        c.original_seq_len,
        c.beta_fast,
        c.beta_slow,
        c.norm_eps
    );
    let _ = writeln!(
        s,
        "  Engram: layers {} rows {:?}, {}-grams × {} heads × {}, pad {} ({}), compressed vocab {}",
        layers_text(&c.engram_layer_ids),
        c.engram_num_embeddings,
        c.engram_max_ngram_size,
        c.engram_n_heads,
        c.engram_head_dim,
        c.engram_pad_id,
        if c.engram_pad_is_compressed {
            "compressed id"
        } else {
            "raw token id"
        },
        c.engram_compressed_vocab_size
    );
    let _ = writeln!(s, "\nlayer roles (MODEL.md §3)");
    let _ = writeln!(
        s,
        "  {:>5} {:>5}  {:<52} {:>7} {:>7} {:>7}  Engram",
        "layer", "ratio", "role", "KV from", "top-k", "keys"
    );
    for row in &r.roles {
        let d = &row.detail;
        let _ = writeln!(
            s,
            "  {:>5} {:>5}  {:<52} {:>7} {:>7} {:>7}  {}",
            d.layer,
            d.ratio,
            row.role,
            opt(d.kv_from),
            opt(d.topk_from),
            opt(d.index_keys_from),
            d.engram.map_or(String::new(), |i| format!("lookup #{i}"))
        );
    }
    let p = &r.params;
    let _ = writeln!(s, "\nparameters (implied by the config, backbone only)");
    for (k, v) in [
        ("embed + head", p.embed_head),
        ("attention", p.attention),
        ("routed experts", p.routed_experts),
        ("shared experts", p.shared_experts),
        ("router", p.router),
        ("hyper-connections", p.hyper_connections),
        ("norms", p.norms),
        ("Engram tables", p.engram_tables),
        ("Engram other", p.engram_other),
        ("total", p.total),
        ("active per token", p.active_per_token),
    ] {
        let _ = writeln!(s, "  {k:<18} {v:>16}  ({:.3} B)", v as f64 / 1e9);
    }
    if let Some(st) = p.stored {
        let _ = writeln!(
            s,
            "  {:<18} {st:>16}  ({:.3} B, every stored tensor)",
            "stored",
            st as f64 / 1e9
        );
    }
    if !r.storage.is_empty() {
        let _ = writeln!(
            s,
            "\nstorage: {}",
            r.storage
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if let Some(n) = r.crc_verified {
        let _ = writeln!(s, "CRC verified: {n} expert records");
    }
    for w in &r.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    use std::io::Write;
    let r = report(&args.path, args.verify)?;
    let text = if args.json {
        serde_json::to_string_pretty(&r)? + "\n"
    } else {
        render_text(&r)
    };
    // A closed pipe (`ds41 inspect ... | head`) is not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MODEL.md §3 on the real release config.json.
    #[test]
    #[cfg_attr(
        not(ds41_release),
        ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
    )]
    fn release_config_roles() {
        let release = ds41_engine::testing::release();
        let r = report(&release.join("config.json"), false).unwrap();
        assert_eq!(r.layout, "config");
        assert_eq!(r.roles.len(), 43);
        let role = |l: usize| r.roles[l].role.as_str();
        for l in [0, 1] {
            assert_eq!(role(l), "window-only");
        }
        for l in [2, 8, 14] {
            assert_eq!(role(l), "KV source (r=2), index-key owner");
        }
        assert_eq!(
            role(20),
            "KV source (r=1), index-key owner, candidate writer"
        );
        for l in [24, 28, 32, 36] {
            assert_eq!(role(l), "index source (index-only), candidate consumer");
            assert_eq!(r.roles[l].detail.index_keys_from, Some(20));
        }
        for l in (3..8)
            .chain(9..14)
            .chain(15..20)
            .chain(21..24)
            .chain([25, 27, 31, 39])
        {
            assert_eq!(role(l), "consumer", "layer {l}");
        }
        assert_eq!(r.roles[9].detail.kv_from, Some(8));
        assert_eq!(r.roles[27].detail.topk_from, Some(24));
        for l in 40..43 {
            assert_eq!(role(l), "MTP stage (window-only)");
        }
        assert_eq!(r.roles[1].detail.engram, Some(0));
        assert_eq!(r.roles[14].detail.engram, Some(1));
        let text = render_text(&r);
        assert!(
            text.contains("KV [2, 8, 14, 20]") && text.contains("candidate 20"),
            "{text}"
        );
        // 40 × 384 × 3 routed matrices of 2304 × 5120
        assert_eq!(r.params.routed_experts, 40 * 384 * 3 * 2304 * 5120);
        assert_eq!(r.params.engram_tables, (384006168 + 384016682) * 256);
        assert!(r.params.active_per_token < r.params.total / 10);
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(json["roles"][20]["candidate_writer"], true);
        assert_eq!(
            json["roles"][20]["role"],
            "KV source (r=1), index-key owner, candidate writer"
        );
    }

    #[test]
    #[cfg_attr(
        not(ds41_upstream),
        ignore = "DS41_UPSTREAM not set (the official_a set)"
    )]
    fn official_a_directory() {
        let up = ds41_engine::testing::upstream();
        let r = report(&up.join("official_a/checkpoint"), false).unwrap();
        assert_eq!(r.layout, "release");
        assert_eq!(r.storage["Fp4"], 84);
        assert_eq!(
            r.roles[6].role,
            "index source (index-only), candidate consumer"
        );
    }

    /// WASTE's synthetic test container (`waste-tiny` seed 0) as a directory and as a bare
    /// manifest.
    #[test]
    fn container_directory_and_manifest() {
        let d = tempfile::tempdir().unwrap();
        ds41_synthetic::waste_test_container(d.path()).unwrap();
        let r = report(d.path(), true).unwrap();
        assert_eq!(r.layout, "container");
        assert_eq!(r.crc_verified, Some(48));
        assert_eq!(r.storage["Vq3r"], 6 * 8 * 3);
        assert!(r.warnings.iter().any(|w| w.contains("item 8")));
        let r = report(&d.path().join("manifest.json"), false).unwrap();
        assert_eq!(r.layout, "config");
        assert_eq!(r.config.norm_eps, 1e-5);
    }

    #[test]
    #[cfg_attr(
        not(ds41_release),
        ignore = "DS41_RELEASE not set (a DeepSeek-V4.1-Flash release snapshot)"
    )]
    fn release_inference_config() {
        let release = ds41_engine::testing::release();
        let r = report(&release.join("inference/config.json"), false).unwrap();
        assert_eq!(r.config.kv_source_layers, [2, 8, 14, 20]);
    }

    #[test]
    fn bare_config_without_upstream_data() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.json");
        let cfg: serde_json::Value = serde_json::from_str(
            r#"{"model_args": {
            "vocab_size": 64, "dim": 64, "moe_inter_dim": 32, "n_layers": 3, "n_mtp_layers": 0,
            "n_heads": 2, "n_routed_experts": 2, "n_shared_experts": 1, "n_activated_experts": 1,
            "score_func": "sqrtsoftplus", "route_scale": 1.5, "swiglu_limit": 1.0, "q_lora_rank": 32,
            "head_dim": 32, "rope_head_dim": 8, "norm_eps": 1e-20, "o_groups": 2, "o_lora_rank": 16,
            "window_size": 8, "compress_ratios": [0, 1, 1], "kv_source_layers": [1],
            "index_source_layers": [1, 2], "candidate_source_layer": 1, "candidate_topk_blocks": 2,
            "candidate_block_size": 4, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
            "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "original_seq_len": 32,
            "rope_factor": 4, "beta_fast": 32, "beta_slow": 1, "hc_mult": 4, "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6, "engram_layer_ids": [], "engram_vocab_size": 100,
            "engram_num_embeddings": [], "engram_max_ngram_size": 3, "engram_n_heads": 2,
            "engram_head_dim": 32, "engram_pad_id": 2, "engram_compressed_vocab_size": 64
        }}"#,
        )
        .unwrap();
        std::fs::write(&p, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let r = report(&p, false).unwrap();
        assert_eq!(r.roles[0].role, "window-only");
        assert_eq!(
            r.roles[1].role,
            "KV source (r=1), index-key owner, candidate writer"
        );
        assert_eq!(
            r.roles[2].role,
            "index source (index-only), candidate consumer"
        );
        assert_eq!(r.params.engram_tables, 0);
        // a broken config is an error naming the field
        let mut bad = cfg.clone();
        bad["model_args"]["index_source_layers"] = serde_json::json!([2]);
        std::fs::write(&p, serde_json::to_vec(&bad).unwrap()).unwrap();
        let e = report(&p, false).unwrap_err().to_string();
        assert!(
            e.contains("kv_source_layers") && e.contains("index source"),
            "{e}"
        );
    }
}
