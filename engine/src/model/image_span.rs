//! Image spans in the language model (MODEL.md §6.1 step 3 and §10.2 "In the LLM"; model.py's
//! `encode_image` and `merge_image_embeddings`): each image goes through the vision tower and
//! aligner, and its span's rows of the embedding are overwritten — `IMAGE` slots with the
//! aligner's rows in reading order, `IMAGE_START` / `IMAGE_END` / `IMAGE_NEW_LINE` with the
//! learned `image_start` / `image_end` / `image_newline`. What else an image position does
//! differently (routing with `gate.bias_vl`, DEAD in the Engram history with gate 0) is
//! decided where those steps run, from the chunk's token types.

use super::numerics::Numerics;
use super::DefectSet;
use super::Model;
use crate::vision::tower::{TowerOutput, VisionTower};
use crate::vision::{ImageInput, TokenType};
use crate::{Error, Result};

/// What the vision stage computed for one image (traced as `vision.I{i}.*`, docs/TRACE.md).
#[derive(Debug, Clone)]
pub struct EncodedImage {
    /// Position of the span's `IMAGE_START`.
    pub start: usize,
    /// The ViT patch grid and the aligner's token grid (rows, columns).
    pub vit_grid: (usize, usize),
    pub llm_grid: (usize, usize),
    pub tower: TowerOutput,
}

/// The vision tower and the span delimiters of a model, in one numerics profile.
pub struct ImageEncoder {
    tower: VisionTower,
    start: Vec<f32>,
    end: Vec<f32>,
    newline: Vec<f32>,
}

impl ImageEncoder {
    /// Read the tower (with the run's injected tower defects) and the delimiter rows; a model
    /// without a vision tower is refused.
    pub fn load(model: &Model, numerics: Numerics, defects: &DefectSet) -> Result<ImageEncoder> {
        let ckpt = model.checkpoint().as_ref();
        let tower = VisionTower::from_checkpoint(ckpt, numerics)?.with_defects(defects.clone());
        let dim = model.config().dim;
        let row = |name: &str| -> Result<Vec<f32>> {
            let mut v = ckpt.tensor_f32(name)?;
            if v.len() != dim {
                return Err(Error::Model(format!(
                    "tensor `{name}` has {} values, the language model's width is {dim}",
                    v.len()
                )));
            }
            numerics.round(&mut v);
            Ok(v)
        };
        Ok(ImageEncoder {
            tower,
            start: row("image_start")?,
            end: row("image_end")?,
            newline: row("image_newline")?,
        })
    }

    /// Encode every image and write its span into `x` ([rows, hc, dim], the expanded
    /// embedding of a chunk at position 0), all hc copies alike.
    pub fn merge(
        &self,
        images: &[ImageInput],
        types: &[TokenType],
        x: &mut [f32],
        hc: usize,
        numerics: Numerics,
    ) -> Result<Vec<EncodedImage>> {
        let d = self.start.len();
        let mut encoded = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let tower = self
                .tower
                .forward(&image.patches)
                .map_err(|e| Error::Model(format!("image {i}: {e}")))?;
            let mut rows = tower.aligner.chunks_exact(d);
            for p in image.span() {
                let value: &[f32] = match types[p] {
                    TokenType::ImageStart => &self.start,
                    TokenType::ImageEnd => &self.end,
                    TokenType::ImageNewLine => &self.newline,
                    TokenType::Image => rows.next().ok_or_else(|| {
                        Error::Model(format!("image {i}: the aligner made fewer rows than slots"))
                    })?,
                    TokenType::Text => unreachable!("a span holds image types only"),
                };
                // Rounded once into the first copy, which the others repeat.
                let row = &mut x[p * hc * d..(p + 1) * hc * d];
                let (first, rest) = row.split_at_mut(d);
                first.copy_from_slice(value);
                numerics.round(first);
                for copy in rest.chunks_exact_mut(d) {
                    copy.copy_from_slice(first);
                }
            }
            encoded.push(EncodedImage {
                start: image.start,
                vit_grid: image.patches.vit_grid(),
                llm_grid: image.llm_grid(),
                tower,
            });
        }
        Ok(encoded)
    }
}
