//! Goldens with provenance (goldens/README.md is the user-facing description).
//!
//! * [`provenance`] — the `<name>.provenance.json` sidecar: generator, command, input and
//!   output sha256;
//! * [`check`] — `ds41 goldens check`: every golden is covered by a record whose hashes match;
//! * [`bless`] — `ds41 goldens bless`: re-run the reference-engine commands, show a diff,
//!   rewrite outputs and records (never under CI);
//! * [`diff`] — what changed between two versions of a golden (per tensor for safetensors);
//! * [`errata`] — goldens/errata.yaml, the register of official-code defects and the
//!   behaviours cases can ask for.

pub mod bless;
pub mod check;
pub mod command;
pub mod diff;
pub mod errata;
pub mod hashing;
pub mod provenance;

use std::path::{Path, PathBuf};

pub use check::{check, CheckOptions, Finding, Report, Status};
pub use errata::Errata;
pub use provenance::Provenance;

/// Environment variable naming the shared upstream data directory.
pub const UPSTREAM_ENV: &str = "DS41_UPSTREAM";

#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    /// The OS reason is written inline, so it is not also a `source()` (a chain printer would
    /// repeat it).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: cannot parse: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: field `{field}`: {reason}")]
    Field {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{path}: command `{command}` failed: {reason}")]
    Command {
        path: PathBuf,
        command: String,
        reason: String,
    },
    #[error("{0}")]
    Refused(String),
}

impl GoldenError {
    pub fn io(path: &Path, source: std::io::Error) -> GoldenError {
        GoldenError::Io {
            path: path.to_path_buf(),
            error: source,
        }
    }
}

/// The repository root: the nearest ancestor of `start` holding `goldens/` and `Cargo.toml`.
pub fn find_repo_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|d| d.join("goldens").is_dir() && d.join("Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// `$DS41_UPSTREAM` if set and non-empty.
/// The release snapshot `ds41 goldens` verifies `release` inputs against (DS41_RELEASE, else
/// the hub cache); a set DS41_RELEASE that is not a directory is an error.
pub fn release_snapshot_dir() -> Result<Option<PathBuf>, GoldenError> {
    crate::locations::ReleaseSnapshot::locate(None)
        .map(|r| r.map(|r| r.dir))
        .map_err(|e| GoldenError::Refused(format!("{e:#}")))
}

pub fn upstream_from_env() -> Option<PathBuf> {
    std::env::var_os(UPSTREAM_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}
