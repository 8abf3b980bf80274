//! Byte-level decoding of the stored number formats (MODEL.md §4.5): e4m3, e2m1, e8m0, bf16, f16.
//! OWNER: readers helper (issue 2).
