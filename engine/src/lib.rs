//! ds41-engine: a clear reference engine for DeepSeek-V4.1-Flash (DS41).
//!
//! Module map (each names the spec section it implements at its top):
//! * [`config`], [`checkpoint`], [`dtype`] — reading a checkpoint in either layout;
//! * [`model`] — the text forward pass and its two numerics profiles;
//! * [`tokenizer`] — the DS41 byte-level BPE and the Engram compressed token map;
//! * [`dsml`] — the V4.1 chat format;
//! * [`vision`] — image preprocessing for the vision tower, exact to the official pipeline;
//! * `testing` (feature `test-support`) — schedule helpers shared by the tests.

pub mod checkpoint;
pub mod config;
pub mod dsml;
pub mod dtype;
pub mod error;
pub mod io;
pub mod model;
pub mod state;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tokenizer;
pub mod trace;
pub mod vision;

pub use error::{Error, Result};

/// Engine identity recorded in every trace and report.
pub const ENGINE_NAME: &str = "ds41-reference";
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
