//! DSML, the DeepSeek-V4.1 chat format (DSML.md; reference: `encoding/encoding.py` at revision
//! `dba1be0a`, sha256 `502bdaec…35c1`).
//!
//! * [`render`] turns a [`Conversation`] into a [`Prompt`] byte-identical to `encode_messages`
//!   (§1 preprocessing in [`preprocess`], §2 grammar in [`render`](mod@render)). The prompt is a
//!   list of [`Segment`]s so user data stays on the text path when tokenized (§6).
//! * [`parse`] reads a completion back: [`Grammar::Strict`] is the reference parser
//!   `parse_message_from_completion_text` (§3), [`Grammar::Tolerant`] the documented server
//!   behaviours of §4 ([`tolerant`]).
//! * [`case`] loads the official test-case JSON format; [`json_py`] reproduces Python's
//!   `json.dumps` / `json.loads` where the prompt depends on them.
//!
//! Errors carry the Python exception class the reference raises for the same input
//! ([`Error::reference_error`] prints it like the probe files), or mark an input the
//! reference would mis-handle and this crate refuses explicitly.

pub mod case;
pub mod json_py;
pub mod message;
pub mod parse;
pub mod preprocess;
pub mod render;
pub mod segments;
pub mod tolerant;

pub use case::{load_case, load_cases, Case};
pub use message::{
    Block, Content, Conversation, Message, Namespace, ReasoningEffort, RenderOptions, Role, Task,
    ThinkingMode, Tool, ToolCall, ToolResultContent,
};
pub use parse::{parse, Grammar, ParseMode, ParsedMessage, ParsedToolCall, Recovery};
pub use render::{render, render_completion, render_message};
pub use segments::{Control, Prompt, Segment};

use std::fmt;

/// The Python exception class the reference raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyException {
    AssertionError,
    ValueError,
    NotImplementedError,
}

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The reference rejects the same input with this exception and the same message.
    Reference(PyException),
    /// Malformed input (wrong JSON shape, missing field), or input on which the reference
    /// would produce a Python accident (`None` rendered as text, a crash); refused here.
    Input,
}

/// A DSML render, load or parse error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// Where: `messages[3].tool_calls[0].function.arguments`, or empty.
    pub location: String,
    /// The message (for reference errors exactly the reference's).
    pub message: String,
    /// Extra explanation for a human, not part of the reference message.
    pub detail: Option<String>,
}

impl Error {
    pub fn reference(exception: PyException, message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Reference(exception),
            location: String::new(),
            message: message.into(),
            detail: None,
        }
    }

    pub fn input(location: &str, message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Input,
            location: location.to_string(),
            message: message.into(),
            detail: None,
        }
    }

    /// Sets the location unless one is already set (the innermost location wins).
    pub fn at(mut self, location: &str) -> Error {
        if self.location.is_empty() {
            self.location = location.to_string();
        }
        self
    }

    /// Prefixes the location with an outer path (`messages[2]` + `tool_calls[0]`).
    pub fn within(mut self, outer: &str) -> Error {
        self.location = match self.location.as_str() {
            "" => outer.to_string(),
            inner if inner.starts_with('[') => format!("{outer}{inner}"),
            inner => format!("{outer}.{inner}"),
        };
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Error {
        self.detail = Some(detail.into());
        self
    }

    /// `"<ExceptionType>: <message>"` as in `reference_probe_results.json`, for reference errors.
    pub fn reference_error(&self) -> Option<String> {
        match self.kind {
            ErrorKind::Reference(e) => Some(format!("{e:?}: {}", self.message)),
            ErrorKind::Input => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.location.is_empty() {
            write!(f, "{}: ", self.location)?;
        }
        f.write_str(&self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
