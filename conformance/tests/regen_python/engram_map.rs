//! The engine's Engram token map against the official `build_compressed_token_map`, run by
//! goldens/regen/engram_token_map.py from the release `inference/` directory named by
//! `DS41_OFFICIAL_INFERENCE`: on the committed tokenizers of goldens/engram_maps/ (whose
//! committed maps must also be what the official code builds today), on the release
//! tokenizer.json when a release snapshot is given (`DS41_RELEASE`) and on official_a's
//! tokenizer when the external set is (`DS41_UPSTREAM`).

use std::path::{Path, PathBuf};
use std::process::Command;

use ds41_engine::tokenizer::engram_map::token_map_from_file;

fn tokenizer_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            tokenizer_files(&p, out);
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "tokenizer.json" || n.ends_with(".tokenizer.json"))
        {
            out.push(p);
        }
    }
}

pub fn engram_map_equals_official(
    python: &Path,
    inference: &Path,
    release: Option<&Path>,
    upstream: Option<&Path>,
) {
    let root = super::repo_root();
    let goldens = root.join("goldens/engram_maps");
    let mut files = Vec::new();
    tokenizer_files(&goldens, &mut files);
    files.extend(release.map(|r| r.join("tokenizer.json")));
    files.extend(upstream.map(|u| u.join("official_a/checkpoint/tokenizer.json")));
    files.sort();
    assert!(files.len() >= 3, "no tokenizers found");
    let out = Command::new(python)
        .arg("-B")
        .arg(root.join("goldens/regen/engram_token_map.py"))
        .arg("--inference")
        .arg(inference)
        .args(&files)
        .output()
        .expect("run engram_token_map.py");
    assert!(
        out.status.success(),
        "engram_token_map.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), files.len());
    let mut failures = Vec::new();
    for (file, record) in files.iter().zip(&records) {
        let official: Vec<i32> = record["map"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        let ours = token_map_from_file(file).unwrap();
        if ours != official {
            let first = (0..ours.len().min(official.len())).find(|&i| ours[i] != official[i]);
            failures.push(format!(
                "{}: {} vs {} ids, first difference at {first:?}",
                file.display(),
                ours.len(),
                official.len()
            ));
        }
        // The committed golden must be what the official code builds today.
        let name = file.file_name().unwrap().to_str().unwrap();
        if let Some(stem) = name.strip_suffix(".tokenizer.json") {
            let golden: serde_json::Value = serde_json::from_slice(
                &std::fs::read(goldens.join(format!("{stem}.map.json"))).unwrap(),
            )
            .unwrap();
            if golden != *record {
                failures.push(format!("goldens/engram_maps/{stem}.map.json is stale"));
            }
        }
        eprintln!(
            "{}: {} ids -> {} compressed, equal to the official map",
            file.display(),
            official.len(),
            record["compressed_vocab_size"]
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
