//! ds41-conformance: the harness that certifies DS41 engines. OWNER: harness helper (issue 8).
pub mod goldens;
