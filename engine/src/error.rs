//! The engine's typed errors. Every variant names what was wrong and where (file, tensor,
//! field or byte offset). OWNER: readers helper (issue 2); other modules may add variants.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A configuration field breaks a rule (`field` is the config key, `rule` what it broke).
    #[error("config field `{field}`: {rule}")]
    Config { field: String, rule: String },
    /// A tensor is missing, has the wrong shape or dtype, or cannot be decoded.
    #[error("{file}: tensor `{tensor}`: {reason}")]
    Tensor {
        file: PathBuf,
        tensor: String,
        reason: String,
    },
    /// A file's bytes break its format at a byte offset.
    #[error("{file} @ byte {offset}: {reason}")]
    Format {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A tokenizer file is valid JSON but its content is unusable or unsupported
    /// (`field` is the JSON path, e.g. `model.merges[17]`).
    #[error("{file}: tokenizer field `{field}`: {reason}")]
    Tokenizer {
        file: PathBuf,
        field: String,
        reason: String,
    },
    /// A forward-pass precondition failed (e.g. a position beyond the caches).
    #[error("model: {0}")]
    Model(String),
}

impl Error {
    /// The variant's name, for checks that expect a particular kind of refusal.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Io { .. } => "Io",
            Error::Config { .. } => "Config",
            Error::Tensor { .. } => "Tensor",
            Error::Format { .. } => "Format",
            Error::Tokenizer { .. } => "Tokenizer",
            Error::Model(_) => "Model",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
