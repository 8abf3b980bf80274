//! Build script: the test switches for external data (../build-support/external_data_cfg.rs)
//! and the data a certify run needs, embedded in the binary so that an installed `ds41` works
//! without the source tree (src/embedded.rs): the cases, the gates and the goldens (without
//! the regen scripts and the insta snapshots, which only the developer commands use).

include!("../build-support/external_data_cfg.rs");

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Embedded trees, relative to the repository root.
const TREES: [&str; 3] = ["conformance/cases", "gates", "goldens"];
/// Left out (relative to the repository root).
const EXCLUDED: [&str; 2] = ["goldens/regen", "goldens/snapshots"];

fn collect(root: &Path, rel: &str, out: &mut Vec<String>) {
    if EXCLUDED.contains(&rel) {
        return;
    }
    let dir = root.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").file_name())
        .collect();
    entries.sort();
    for name in entries {
        let name = name.to_str().expect("data file names are UTF-8");
        let child = format!("{rel}/{name}");
        let path = root.join(&child);
        // Symlinks are not followed: the embedded tree holds regular files only.
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        if meta.is_dir() {
            collect(root, &child, out);
        } else if meta.is_file() {
            out.push(child);
        }
    }
}

fn main() {
    external_data_cfg();
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let mut files = Vec::new();
    for tree in TREES {
        println!("cargo::rerun-if-changed=../{tree}");
        collect(&root, tree, &mut files);
    }
    let mut src = format!(
        "pub const TREES: [&str; {}] = {TREES:?};\n\
         pub const EXCLUDED: [&str; {}] = {EXCLUDED:?};\n\
         pub static FILES: &[(&str, &[u8])] = &[\n",
        TREES.len(),
        EXCLUDED.len()
    );
    for f in &files {
        let abs = root.join(f).canonicalize().expect("canonical path");
        writeln!(
            src,
            "    ({f:?}, include_bytes!({:?})),",
            abs.display().to_string()
        )
        .unwrap();
    }
    src.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("embedded_files.rs");
    std::fs::write(out, src).expect("write embedded_files.rs");
}
