//! The data a certify run needs, built into the binary (build.rs): the cases, the gates and
//! the goldens as they were when `ds41` was built, so an installed `ds41 certify` works from
//! any directory without the source tree. A run writes them out once into its work directory
//! ([`materialize`]) and reads them from there like a checkout.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};

mod generated {
    include!(concat!(env!("OUT_DIR"), "/embedded_files.rs"));
}

/// Every embedded file: (path relative to the repository root, contents), sorted by path.
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    generated::FILES
}

/// The embedded trees, relative to the repository root, and what is left out of them (the
/// lists live in build.rs).
pub use generated::{EXCLUDED, TREES};

/// Where a materialized copy puts the cases and the gates, relative to its root.
pub const CASES_DIR: &str = "conformance/cases";
pub const GATES_DIR: &str = "gates";

/// Write every embedded file below `root` (created; it must not hold other files of the same
/// names) and return `root`, which then stands for the repository root: `root/conformance/cases`,
/// `root/gates`, `root/goldens/...`.
pub fn materialize(root: &Path) -> anyhow::Result<PathBuf> {
    for (rel, bytes) in files() {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| anyhow!("{}: {e}", parent.display()))?;
        }
        if path.exists() {
            bail!(
                "{}: already exists (materialize the embedded data into a fresh directory)",
                path.display()
            );
        }
        std::fs::write(&path, bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    }
    Ok(root.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_files(root: &Path, rel: &str, out: &mut Vec<String>) {
        if EXCLUDED.contains(&rel) {
            return;
        }
        for e in std::fs::read_dir(root.join(rel)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let child = format!("{rel}/{name}");
            let meta = std::fs::symlink_metadata(root.join(&child)).unwrap();
            if meta.is_dir() {
                tree_files(root, &child, out);
            } else if meta.is_file() {
                out.push(child);
            }
        }
    }

    /// The binary certifies against exactly the tree it was built from: same files, same bytes.
    #[test]
    fn embedded_data_equals_the_source_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut in_tree = Vec::new();
        for t in TREES {
            tree_files(&root, t, &mut in_tree);
        }
        in_tree.sort();
        let embedded: Vec<String> = files().iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(
            embedded, in_tree,
            "embedded file list differs from the tree"
        );
        for (rel, bytes) in files() {
            let on_disk = std::fs::read(root.join(rel)).unwrap();
            assert!(
                on_disk == *bytes,
                "{rel}: embedded bytes differ from the tree"
            );
        }
        assert!(embedded.iter().any(|p| p.starts_with("conformance/cases/")));
        assert!(embedded.iter().any(|p| p.starts_with("gates/")));
        assert!(embedded.iter().any(|p| p.starts_with("goldens/traces/")));
    }

    #[test]
    fn materialized_copy_loads_as_a_suite() {
        let d = tempfile::tempdir().unwrap();
        let root = materialize(d.path()).unwrap();
        let cases = crate::runner::load_suite(&root.join(CASES_DIR)).unwrap();
        assert!(!cases.is_empty());
        crate::gates::GateSet::load(&root.join(GATES_DIR)).unwrap();
        assert!(materialize(d.path()).is_err(), "refuses to overwrite");
    }
}
