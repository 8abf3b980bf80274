//! Fixtures shared by the fuzz targets: small valid checkpoints generated once per process
//! (the synthetic `tiny` release and `waste-tiny` container), and a way to put one fuzzed
//! file into an otherwise valid checkpoint directory.
//!
//! A target that fuzzes one file of a checkpoint works in a directory whose other files are
//! symlinks to the pristine fixture; only the fuzzed file is written per input, so an input
//! costs one small write, not a copy of the checkpoint.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ds41_synthetic::Layout;

/// A generated checkpoint and a scratch directory of symlinks to its files.
pub struct Fixture {
    _root: tempfile::TempDir,
    pub pristine: PathBuf,
    pub work: PathBuf,
}

fn build(preset: &str, layout: Layout) -> Fixture {
    let root = tempfile::tempdir().expect("temporary directory");
    let pristine = root.path().join("pristine");
    ds41_synthetic::generate(preset, layout, 1, &pristine).expect("synthetic checkpoint");
    let work = root.path().join("work");
    std::fs::create_dir(&work).expect("work directory");
    for entry in std::fs::read_dir(&pristine).expect("fixture listing") {
        let entry = entry.expect("fixture entry");
        std::os::unix::fs::symlink(entry.path(), work.join(entry.file_name()))
            .expect("fixture symlink");
    }
    Fixture {
        _root: root,
        pristine,
        work,
    }
}

/// The synthetic `tiny` release checkpoint (config.json + model.safetensors).
pub fn release() -> &'static Fixture {
    static CELL: OnceLock<Fixture> = OnceLock::new();
    CELL.get_or_init(|| build("tiny", Layout::Release))
}

/// The synthetic `tiny-sharded` release checkpoint (an index and several shards).
pub fn release_sharded() -> &'static Fixture {
    static CELL: OnceLock<Fixture> = OnceLock::new();
    CELL.get_or_init(|| build("tiny-sharded", Layout::Release))
}

/// The synthetic `waste-tiny` WASTE container.
pub fn container() -> &'static Fixture {
    static CELL: OnceLock<Fixture> = OnceLock::new();
    CELL.get_or_init(|| build("waste-tiny", Layout::Container))
}

impl Fixture {
    /// Files of the fixture whose names satisfy `keep`, sorted.
    pub fn files(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.pristine)
            .expect("fixture listing")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| keep(n))
            .collect();
        v.sort();
        v
    }

    /// Run `f` on the work directory with `name` replaced by a regular file holding `data`;
    /// the symlink to the pristine file is restored afterwards.
    pub fn with_file<R>(&self, name: &str, data: &[u8], f: impl FnOnce(&Path) -> R) -> R {
        let path = self.work.join(name);
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, data).expect("write fuzzed file");
        let r = f(&self.work);
        let _ = std::fs::remove_file(&path);
        if self.pristine.join(name).exists() {
            std::os::unix::fs::symlink(self.pristine.join(name), &path).expect("restore");
        }
        r
    }
}

/// A scratch file for parsers that take a path.
pub fn scratch_file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join(name);
    std::fs::write(&path, data).expect("write fuzzed file");
    (dir, path)
}

/// The repository root (this crate lives in `fuzz/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuzz/ has a parent")
        .to_path_buf()
}
