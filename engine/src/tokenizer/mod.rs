//! The DS41 tokenizer (TOKENIZER.md) and the Engram compressed token map (MODEL.md §6.6.1).
//! OWNER: tokenizer helper (issue 5).
