//! The forward job: one request (model, tokens, schedule, options, replay or state files) in,
//! one trace (docs/TRACE.md) out. `ds41 forward` and the harness's in-process reference both
//! run exactly this, so what `certify` checks is what the command computes.

use std::path::PathBuf;

use super::{Forcing, Model, Options, Session, TokenMap};
use crate::trace::{Trace, TraceFile, TraceOptions};
use crate::vision::{expand_markers, ImageInput, ImagePatches};
use crate::Error;

/// An image of a job: a file (decoded and preprocessed with the model's vision config) or
/// patches made elsewhere (e.g. by `ds41 preprocess`).
#[derive(Debug, Clone)]
pub enum ImageSource {
    File(PathBuf),
    Patches(ImagePatches),
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct ForwardJob {
    /// Checkpoint directory (release layout or WASTE container).
    pub model: PathBuf,
    /// Token ids. Empty with `replay`: the golden's `input_ids`.
    pub tokens: Vec<u32>,
    /// Tokens processed as the first chunk at position 0. Default: all of them; with
    /// `replay` the golden's `prefill` metadata; after `load_state` 0 (every given token is
    /// a decode step).
    pub prefill: Option<usize>,
    pub options: Options,
    pub token_map: TokenMap,
    /// Teacher-forced replay against this golden (needs block_input, pre_mix, residual,
    /// final_pre).
    pub replay: Option<PathBuf>,
    /// Continue from this saved session state (docs/STATE.md).
    pub load_state: Option<PathBuf>,
    /// Save the session state after the tokens (atomic write).
    pub save_state: Option<PathBuf>,
    /// Record the sub-op tensors too (always with `replay`).
    pub sub_ops: bool,
    /// Images, in prompt order: each replaces one `image_token_id` marker of `tokens` and is
    /// expanded to its span (MODEL.md §10.2). `prefill` then counts the given tokens (a
    /// marker as one) and must cover every marker: spans lie in the first chunk. With
    /// `replay` and no `tokens`, the golden's spans (its `token_types`) are the markers.
    pub images: Vec<ImageSource>,
}

/// Why a job did not produce a trace: a request the engine will not run (a checkpoint it
/// cannot open, an impossible schedule, a state from another model), or a failure while
/// running one.
#[derive(Debug)]
pub enum JobError {
    Refused(Error),
    Failed(Error),
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::Refused(e) | JobError::Failed(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for JobError {}

/// The trace of a finished job, and the schedule it ran.
#[derive(Debug)]
pub struct JobOutput {
    pub trace: Trace,
    pub tokens: usize,
    pub prefill: usize,
}

/// Where an image span lies in a sequence: (start, length).
type SpanRange = (usize, usize);

/// The spans of a golden's sequence (from its `token_types`), and the sequence with each span
/// folded to its first id (the marker).
fn fold_spans(g: &TraceFile, tokens: &[u32]) -> crate::Result<(Vec<u32>, Vec<SpanRange>)> {
    let (_, types) = g.i64("token_types").ok_or_else(|| {
        Error::Model("images were given for a golden without `token_types`".into())
    })?;
    if types.len() != tokens.len() {
        return Err(Error::Model(format!(
            "golden `token_types` has {} entries for {} input ids",
            types.len(),
            tokens.len()
        )));
    }
    let (mut folded, mut spans) = (Vec::new(), Vec::new());
    let mut p = 0;
    while p < tokens.len() {
        if types[p] == crate::vision::TokenType::ImageStart.code() {
            let len = 1 + types[p + 1..].iter().take_while(|&&t| t > 0).count();
            spans.push((p, len));
            folded.push(tokens[p]);
            p += len;
        } else {
            folded.push(tokens[p]);
            p += 1;
        }
    }
    Ok((folded, spans))
}

impl ForwardJob {
    /// Preprocess the images and expand their markers in `tokens`; `prefill` (counting a
    /// marker as one token) becomes a count of expanded positions.
    fn place_images(
        &self,
        model: &Model,
        tokens: &[u32],
        prefill: usize,
    ) -> crate::Result<(Vec<u32>, Vec<ImageInput>, usize)> {
        if self.images.is_empty() {
            return Ok((tokens.to_vec(), Vec::new(), prefill));
        }
        let cfg = model.config();
        let (vision, marker) = match (&cfg.vision, cfg.image_token_id) {
            (Some(v), Some(id)) if v.n_layers > 0 => (v, id),
            _ => {
                return Err(Error::Model(format!(
                    "{}: the model has no vision tower, so it takes no images",
                    self.model.display()
                )))
            }
        };
        if let Some(late) = tokens[prefill..].iter().position(|&t| t == marker) {
            return Err(Error::Model(format!(
                "the image marker at token {} lies after the prefill of {prefill}: image spans \
                 must lie in the first chunk",
                prefill + late
            )));
        }
        let patches = self
            .images
            .iter()
            .map(|source| match source {
                ImageSource::File(path) => crate::vision::load_image(path, vision),
                ImageSource::Patches(p) => Ok(p.clone()),
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let (mut expanded, placed) = expand_markers(&tokens[..prefill], marker, patches)?;
        let expanded_prefill = expanded.len();
        expanded.extend_from_slice(&tokens[prefill..]);
        Ok((expanded, placed, expanded_prefill))
    }

    /// Run the job; the trace is returned, not written.
    pub fn run(&self) -> Result<JobOutput, JobError> {
        let refused = |reason: String| JobError::Refused(Error::Model(reason));
        let golden = match &self.replay {
            Some(p) => Some(TraceFile::read(p).map_err(JobError::Refused)?),
            None => None,
        };
        let mut tokens = match &golden {
            Some(g) if self.tokens.is_empty() => g.input_ids().map_err(JobError::Refused)?,
            _ => self.tokens.clone(),
        };
        // A golden's sequence holds expanded spans: its prefill counts them whole, and with
        // no tokens given each span folds back to its marker.
        let golden_spans = match &golden {
            Some(g) if !self.images.is_empty() => {
                let ids = g.input_ids().map_err(JobError::Refused)?;
                let (folded, spans) = fold_spans(g, &ids).map_err(JobError::Refused)?;
                if self.tokens.is_empty() {
                    tokens = folded;
                }
                spans
            }
            _ => Vec::new(),
        };
        let n = tokens.len();
        let restoring = self.load_state.is_some();
        if restoring && golden.is_some() {
            return Err(refused(
                "a loaded state cannot be combined with replay".into(),
            ));
        }
        let prefill = match (self.prefill, &golden) {
            (Some(p), _) => p,
            (None, Some(g)) => {
                let p = g.prefill().map_err(JobError::Refused)?.ok_or_else(|| {
                    refused("the golden does not state its prefill length; give it".into())
                })?;
                // The golden counts expanded positions; here a span counts as its marker.
                let folded: usize = golden_spans
                    .iter()
                    .filter(|&&(start, _)| start < p)
                    .map(|&(_, len)| len - 1)
                    .sum();
                p.saturating_sub(folded)
            }
            (None, None) if restoring => 0,
            (None, None) => n,
        };
        if n == 0 || prefill > n || (prefill == 0 && !restoring) {
            return Err(refused(format!(
                "prefill {prefill} must be between 1 and the number of tokens ({n})"
            )));
        }

        let model = Model::open_with_token_map(&self.model, self.token_map.clone())
            .map_err(JobError::Refused)?;
        let (tokens, images, prefill) = self
            .place_images(&model, &tokens, prefill)
            .map_err(JobError::Refused)?;
        let n = tokens.len();
        let sub_ops = self.sub_ops || golden.is_some();
        let mut trace = Trace::new(
            model.config(),
            TraceOptions {
                enabled: true,
                sub_ops,
            },
        );
        let mut session = Session::new(&model, self.options.clone());
        if let Some(p) = &self.load_state {
            // A state from another checkpoint or run configuration is refused, naming the field.
            crate::state::restore(&model, &mut session, p).map_err(JobError::Refused)?;
        }
        let start = session.position();
        let chunks = std::iter::once(&tokens[..prefill])
            .filter(|c| !c.is_empty())
            .chain(tokens[prefill..].chunks(1));
        let forcing = match &golden {
            Some(g) => Some(Forcing::from_golden(g, model.config()).map_err(JobError::Refused)?),
            None => None,
        };
        for (i, chunk) in chunks.enumerate() {
            // Image spans lie in the first chunk (`place_images` made sure of it).
            let images: &[ImageInput] = if i == 0 { &images } else { &[] };
            match &forcing {
                Some(f) => session.replay_with_images(chunk, images, f, &mut trace),
                None => session.prefill_with_images(chunk, images, &mut trace),
            }
            .map_err(JobError::Failed)?;
        }

        let m = &mut trace.metadata;
        let mut put = |k: &str, v: String| m.insert(k.into(), v);
        put("engine", crate::ENGINE_NAME.into());
        put("version", crate::ENGINE_VERSION.into());
        put("layout", format!("{:?}", model.layout()).to_lowercase());
        put("numerics", self.options.numerics.to_string());
        put("index-k", self.options.index_k.to_string());
        put(
            "tie_rule",
            "largest first; equal values -> lower index".into(),
        );
        put(
            "topk_convention",
            "compressed positions (no window offset), ascending, -1 = none".into(),
        );
        put(
            "logits_rows",
            "row 0 = prefill (last position), row i = decode step i".into(),
        );
        put("prefill", prefill.to_string());
        put("decode_steps", (n - prefill).to_string());
        put(
            "mode",
            if golden.is_some() {
                "replay"
            } else {
                "forward"
            }
            .into(),
        );
        if !self.options.defects.is_empty() {
            put("defects", self.options.defects.to_string());
        }
        if !images.is_empty() {
            put("images", images.len().to_string());
        }
        if let Some(p) = &self.load_state {
            put("loaded_state", p.display().to_string());
            put("start_position", start.to_string());
        }
        // Weights overwritten in place while the forward ran would change the results
        // silently: no trace or state is handed out then.
        model
            .checkpoint()
            .verify_unchanged()
            .map_err(JobError::Failed)?;
        if let Some(p) = &self.save_state {
            crate::state::save(&model, &session, p).map_err(JobError::Failed)?;
        }
        Ok(JobOutput {
            trace,
            tokens: n,
            prefill,
        })
    }
}
