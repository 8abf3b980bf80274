//! Image spans in a prompt (MODEL.md §10.2, "In the LLM"; the official
//! `image_processor.prepare_vl_inputs`): every image marker of the tokenized prompt (the token
//! `image_token_id`) becomes its image's span, `[START] ([IMAGE]×n_llm_w [NEWLINE])×n_llm_h
//! [END]`, every position of which carries `image_token_id`; only the token types tell them
//! apart. Text positions have type [`TEXT`](super::patch_file::TEXT).

use super::grid::GridPlan;
use super::patch_file::{span_token_types, TEXT};
use crate::{Error, Result};

/// A prompt with its image spans expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandedPrompt {
    pub tokens: Vec<u32>,
    /// One per token: [`TEXT`](super::patch_file::TEXT) or the span types.
    pub token_types: Vec<i64>,
    /// Position of each image's `[START]`, in image order.
    pub image_starts: Vec<usize>,
}

/// Expand each `image_token_id` of `prompt` into the span of the next image's grid, in order.
/// The number of markers must equal the number of images (the official code raises otherwise).
pub fn expand_image_spans(
    prompt: &[u32],
    image_token_id: u32,
    images: &[GridPlan],
) -> Result<ExpandedPrompt> {
    let markers = prompt.iter().filter(|&&t| t == image_token_id).count();
    if markers != images.len() {
        return Err(Error::Model(format!(
            "the prompt has {markers} image markers (token {image_token_id}) but {} images were given",
            images.len()
        )));
    }
    let mut out = ExpandedPrompt {
        tokens: Vec::with_capacity(prompt.len()),
        token_types: Vec::with_capacity(prompt.len()),
        image_starts: Vec::with_capacity(images.len()),
    };
    let mut next = images.iter();
    for &t in prompt {
        if t != image_token_id {
            out.tokens.push(t);
            out.token_types.push(TEXT);
            continue;
        }
        let plan = next.next().expect("markers counted above");
        let types = span_token_types(plan.n_llm_h, plan.n_llm_w);
        out.image_starts.push(out.tokens.len());
        out.tokens
            .extend(std::iter::repeat_n(image_token_id, types.len()));
        out.token_types.extend(types);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n_llm_h: usize, n_llm_w: usize) -> GridPlan {
        GridPlan {
            n_llm_h,
            n_llm_w,
            best_height: 42 * n_llm_h,
            best_width: 42 * n_llm_w,
        }
    }

    #[test]
    fn markers_become_spans_in_order() {
        let e = expand_image_spans(&[5, 9, 6, 9], 9, &[plan(1, 2), plan(2, 1)]).unwrap();
        assert_eq!(e.tokens, [5, 9, 9, 9, 9, 9, 6, 9, 9, 9, 9, 9, 9]);
        assert_eq!(e.token_types, [-1, 0, 1, 1, 2, 3, -1, 0, 1, 2, 1, 2, 3]);
        assert_eq!(e.image_starts, [1, 7]);
    }

    #[test]
    fn a_count_mismatch_is_refused() {
        let err = expand_image_spans(&[5, 9, 9], 9, &[plan(1, 1)]).unwrap_err();
        assert!(err.to_string().contains("2 image markers"), "{err}");
    }
}
