//! Vision input (MODEL.md §10.2): image bytes → the ViT's patch tensor, exactly as the
//! official `inference/image_processor.py` makes it with Pillow.
//!
//! * [`decode`] — PNG bytes → RGB, as Pillow's `open` + `convert("RGB")`;
//! * [`grid`] — the pixel size and token grid of an image (upscale, multiples of 14, shrink);
//! * [`resample`] — Pillow's fixed-point BICUBIC resize;
//! * [`preprocess`] — `ImageOps.pad` on grey, bf16 normalisation, patches.

pub mod decode;
pub mod grid;
pub mod preprocess;
pub mod resample;

pub use grid::{plan_image_grid, GridPlan};
pub use preprocess::{load_image, preprocess_bytes, preprocess_rgb, ImagePatches};
pub use resample::RgbImage;
