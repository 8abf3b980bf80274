//! An image's span in the language model's sequence (MODEL.md §6.1, §10.2; the official
//! `image_processor.py`): `[START] ([IMAGE]×n_llm_w [NEWLINE])×n_llm_h [END]`, every position
//! carrying `image_token_id` in the input ids, told apart only by its token type.
//!
//! A prompt names where images go with one `image_token_id` marker per image; [`expand_markers`]
//! replaces each marker by its image's span, as `prepare_vl_inputs` does.

use std::fmt;

use super::preprocess::ImagePatches;
use crate::{Error, Result};

/// The token types of `image_processor.py` (`TEXT` −1, then `IMAGE_START` … `IMAGE_END`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Text = -1,
    ImageStart = 0,
    Image = 1,
    ImageNewLine = 2,
    ImageEnd = 3,
}

impl TokenType {
    /// The integer code of the official pipeline (and of a trace's `token_types`).
    pub fn code(self) -> i64 {
        self as i64
    }

    /// A position inside an image span (`image_mask = token_types ≥ 0`).
    pub fn in_image(self) -> bool {
        self != TokenType::Text
    }
}

impl fmt::Display for TokenType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenType::Text => "TEXT",
            TokenType::ImageStart => "IMAGE_START",
            TokenType::Image => "IMAGE",
            TokenType::ImageNewLine => "IMAGE_NEW_LINE",
            TokenType::ImageEnd => "IMAGE_END",
        })
    }
}

/// The span of an `n_llm_h × n_llm_w` token grid (`image_token_types`).
pub fn span_types(n_llm_h: usize, n_llm_w: usize) -> Vec<TokenType> {
    let mut types = Vec::with_capacity(n_llm_h * (n_llm_w + 1) + 2);
    types.push(TokenType::ImageStart);
    for _ in 0..n_llm_h {
        types.extend(std::iter::repeat_n(TokenType::Image, n_llm_w));
        types.push(TokenType::ImageNewLine);
    }
    types.push(TokenType::ImageEnd);
    types
}

/// One image placed in a sequence: its patches and the position its span starts at.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInput {
    pub start: usize,
    pub patches: ImagePatches,
}

impl ImageInput {
    /// The aligner's token grid (rows, columns).
    pub fn llm_grid(&self) -> (usize, usize) {
        (self.patches.plan.n_llm_h, self.patches.plan.n_llm_w)
    }

    /// The span's token types.
    pub fn types(&self) -> Vec<TokenType> {
        let (h, w) = self.llm_grid();
        span_types(h, w)
    }

    /// Positions the span covers.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.patches.plan.num_image_tokens()
    }
}

/// Replace each `image_token_id` marker of `tokens` by the span of the next image, in order
/// (`prepare_vl_inputs`). The marker count must equal the image count.
pub fn expand_markers(
    tokens: &[u32],
    image_token_id: u32,
    images: Vec<ImagePatches>,
) -> Result<(Vec<u32>, Vec<ImageInput>)> {
    let markers = tokens.iter().filter(|&&t| t == image_token_id).count();
    if markers != images.len() {
        return Err(Error::Model(format!(
            "the prompt has {markers} image marker(s) (token {image_token_id}) but {} image(s) \
             were given",
            images.len()
        )));
    }
    let mut out = Vec::with_capacity(tokens.len());
    let mut placed = Vec::with_capacity(images.len());
    let mut next = images.into_iter();
    for &t in tokens {
        if t != image_token_id {
            out.push(t);
            continue;
        }
        let image = ImageInput {
            start: out.len(),
            patches: next.next().expect("counted above"),
        };
        out.extend(std::iter::repeat_n(image_token_id, image.span().len()));
        placed.push(image);
    }
    Ok((out, placed))
}

/// The token type of every position `0..len` of a sequence holding `images`, after checking
/// that the spans lie inside it, do not overlap and carry `image_token_id`.
pub fn sequence_types(
    tokens: &[u32],
    image_token_id: u32,
    images: &[ImageInput],
) -> Result<Vec<TokenType>> {
    let mut types = vec![TokenType::Text; tokens.len()];
    for (i, image) in images.iter().enumerate() {
        let span = image.span();
        if span.end > tokens.len() {
            return Err(Error::Model(format!(
                "image {i}: its span {}..{} runs past the {} tokens of the chunk",
                span.start,
                span.end,
                tokens.len()
            )));
        }
        if let Some(p) = span.clone().find(|&p| types[p] != TokenType::Text) {
            return Err(Error::Model(format!(
                "image {i}: its span {}..{} overlaps another image's at position {p}",
                span.start, span.end
            )));
        }
        if let Some(p) = span.clone().find(|&p| tokens[p] != image_token_id) {
            return Err(Error::Model(format!(
                "image {i}: position {p} of its span holds token {} instead of the image token \
                 {image_token_id}",
                tokens[p]
            )));
        }
        for (slot, t) in types[span].iter_mut().zip(image.types()) {
            *slot = t;
        }
    }
    Ok(types)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_layout_is_rows_of_images_then_a_newline() {
        use TokenType::*;
        assert_eq!(
            span_types(2, 3),
            vec![
                ImageStart,
                Image,
                Image,
                Image,
                ImageNewLine,
                Image,
                Image,
                Image,
                ImageNewLine,
                ImageEnd
            ]
        );
        assert_eq!(
            span_types(4, 1).len(),
            super::super::grid::num_image_tokens(4, 1)
        );
    }
}
