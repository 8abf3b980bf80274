//! The DS41 text forward pass (MODEL.md §5–§7). OWNER: forward-pass helper (issue 4).

pub mod linear;
pub mod numerics;
pub mod quant;
pub mod sparse_attention;
