//! DSML, the V4.1 chat format (DSML.md). OWNER: DSML helper (issue 6).
