//! `ds41 forward --sub-ops` and the harness's in-process reference run one forward job: the
//! same request gives byte-identical trace files (metadata, sub-ops and margins included), in a
//! plain run, after a restored state, and in teacher-forced replay. Needs no upstream data.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ds41_conformance::engine_api::{Engine, ForwardRequest};
use ds41_conformance::reference::ReferenceEngine;
use ds41_engine::checkpoint::Layout;
use ds41_engine::model::{IndexK, Numerics};

fn cli(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_ds41"))
        .arg("forward")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ds41 forward {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn reference(req: &ForwardRequest) {
    ReferenceEngine::new()
        .forward(req, Duration::from_secs(600))
        .unwrap();
}

fn same_bytes(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(
        x == y,
        "{} and {} differ ({} vs {} bytes)",
        a.display(),
        b.display(),
        x.len(),
        y.len()
    );
}

#[test]
fn cli_and_reference_write_the_same_trace() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("tiny");
    ds41_synthetic::generate("tiny", Layout::Release, 3, &model).unwrap();
    let tokens: Vec<u32> = (0..20u32).map(|i| (i * 37 + 11) % 509 + 3).collect();
    let list = |t: &[u32]| {
        t.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let request = |tokens: &[u32], prefill, out: &Path| ForwardRequest {
        model: model.clone(),
        tokens: tokens.to_vec(),
        prefill,
        numerics: Numerics::Upstream,
        index_k: IndexK::AsShipped,
        out: out.to_path_buf(),
        save_state: None,
        load_state: None,
        replay: None,
        engram_token_map: None,
        images: Vec::new(),
    };

    // Prefill 5, decode 15, state saved.
    let (cli_out, ref_out) = (d.join("cli.safetensors"), d.join("ref.safetensors"));
    let (cli_state, ref_state) = (d.join("cli.state"), d.join("ref.state"));
    cli(&[
        "--model",
        &s(&model),
        "--tokens",
        &list(&tokens[..12]),
        "--prefill",
        "5",
        "--sub-ops",
        "--out",
        &s(&cli_out),
        "--save-state",
        &s(&cli_state),
    ]);
    reference(&ForwardRequest {
        save_state: Some(ref_state.clone()),
        ..request(&tokens[..12], Some(5), &ref_out)
    });
    same_bytes(&cli_out, &ref_out);
    let margins = ds41_engine::trace::TraceFile::read(&cli_out).unwrap();
    assert!(margins.get("margin.experts").is_some() && margins.get("attn_out").is_some());

    // Continued from the saved state (metadata names the state file, so both use one).
    let (cli_more, ref_more) = (
        d.join("cli_more.safetensors"),
        d.join("ref_more.safetensors"),
    );
    cli(&[
        "--model",
        &s(&model),
        "--tokens",
        &list(&tokens[12..]),
        "--sub-ops",
        "--load-state",
        &s(&cli_state),
        "--out",
        &s(&cli_more),
    ]);
    reference(&ForwardRequest {
        load_state: Some(cli_state.clone()),
        ..request(&tokens[12..], None, &ref_more)
    });
    same_bytes(&cli_more, &ref_more);

    // Teacher-forced replay on the first trace as the golden.
    let (cli_replay, ref_replay) = (d.join("cli_r.safetensors"), d.join("ref_r.safetensors"));
    cli(&[
        "--model",
        &s(&model),
        "--replay",
        &s(&cli_out),
        "--out",
        &s(&cli_replay),
    ]);
    reference(&ForwardRequest {
        replay: Some(cli_out.clone()),
        ..request(&tokens[..12], Some(5), &ref_replay)
    });
    same_bytes(&cli_replay, &ref_replay);
}
