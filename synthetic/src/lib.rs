//! ds41-synthetic: seeded DS41 test checkpoints in both layouts, and mutants.
//! OWNER: synthetic helper (issue 3).
