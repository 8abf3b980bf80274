//! Per-sequence state (MODEL.md §7.1). See [`state`].
pub mod state;
