//! The engine's typed errors. Every variant names what was wrong and where (file, tensor,
//! field or byte offset). Other modules may add variants.

use std::path::PathBuf;

/// Each message is complete on its own: `Io` writes the operating system's reason inline and
/// therefore does not also return it from `source()` (a chain printer such as anyhow's `{:#}`
/// would print it twice). No variant wraps another error.
#[derive(Debug)]
pub enum Error {
    /// Reading or writing `path` failed.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A configuration field breaks a rule (`field` is the config key, `rule` what it broke).
    Config { field: String, rule: String },
    /// A tensor is missing, has the wrong shape or dtype, or cannot be decoded.
    Tensor {
        file: PathBuf,
        tensor: String,
        reason: String,
    },
    /// A file's bytes break its format at a byte offset.
    Format {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A tokenizer file is valid JSON but its content is unusable or unsupported
    /// (`field` is the JSON path, e.g. `model.merges[17]`).
    Tokenizer {
        file: PathBuf,
        field: String,
        reason: String,
    },
    /// A forward-pass precondition failed (e.g. a position beyond the caches).
    Model(String),
    /// An input path is not a regular file (a FIFO, a device, a directory, a socket): reading
    /// it could block forever or never end, so it is refused before it is read.
    NotRegularFile { path: PathBuf, found: &'static str },
    /// A file is larger than its format allows; refused before it is read.
    TooLarge {
        path: PathBuf,
        len: u64,
        limit: u64,
        what: &'static str,
    },
    /// A file the engine has memory-mapped changed on disk (identity, length or modification
    /// time) after it was opened: results computed from it cannot be trusted.
    Changed { path: PathBuf, reason: String },
    /// An image file cannot be used: corrupt, unsupported format, or too large.
    Image { file: PathBuf, reason: String },
    /// A forward or a restored state reaches beyond the model's maximum position
    /// (`max_position_embeddings`).
    PositionLimit { end: u64, max: usize },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Config { field, rule } => write!(f, "config field `{field}`: {rule}"),
            Error::Tensor {
                file,
                tensor,
                reason,
            } => write!(f, "{}: tensor `{tensor}`: {reason}", file.display()),
            Error::Format {
                file,
                offset,
                reason,
            } => write!(f, "{} @ byte {offset}: {reason}", file.display()),
            Error::Tokenizer {
                file,
                field,
                reason,
            } => write!(f, "{}: tokenizer field `{field}`: {reason}", file.display()),
            Error::Model(message) => write!(f, "model: {message}"),
            Error::NotRegularFile { path, found } => write!(
                f,
                "{}: is {found}, not a regular file (refused: reading it could block or never end)",
                path.display()
            ),
            Error::TooLarge {
                path,
                len,
                limit,
                what,
            } => write!(
                f,
                "{}: {len} bytes, more than the {limit} bytes a {what} may have (refused before reading)",
                path.display()
            ),
            Error::Changed { path, reason } => write!(
                f,
                "{}: changed on disk while in use ({reason}); results computed from it are not trusted",
                path.display()
            ),
            Error::Image { file, reason } => write!(f, "{}: image: {reason}", file.display()),
            Error::PositionLimit { end, max } => write!(
                f,
                "position {end} is beyond the model's maximum of {max} positions \
                 (config max_position_embeddings)"
            ),
        }
    }
}

impl std::error::Error for Error {}

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
            Error::NotRegularFile { .. } => "NotRegularFile",
            Error::TooLarge { .. } => "TooLarge",
            Error::Changed { .. } => "Changed",
            Error::Image { .. } => "Image",
            Error::PositionLimit { .. } => "PositionLimit",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The OS reason appears once in a full chain (`{:#}` of anyhow walks `source()`).
    #[test]
    fn io_error_names_the_path_and_the_reason_once() {
        let source = std::fs::read("/nonexistent/ds41/x").unwrap_err();
        let reason = source.to_string();
        let err = Error::Io {
            path: PathBuf::from("/nonexistent/ds41/x"),
            source,
        };
        assert_eq!(err.to_string(), format!("/nonexistent/ds41/x: {reason}"));
        assert!(std::error::Error::source(&err).is_none());
    }
}
