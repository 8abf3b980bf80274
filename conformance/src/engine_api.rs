//! The engine-under-test abstraction (CONTRACT.md §2, PROTOCOL.md): one small surface that the
//! built-in reference (in process), a JSON-lines adapter (subprocess) and a YAML command
//! profile all implement. Requests name files; bulk tensors travel as safetensors files in the
//! trace format (docs/TRACE.md).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What an engine can do, declared up front (hello / profile). A case that needs a capability
/// the engine lacks is NotSupported, never Pass. PROTOCOL.md lists the promise of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Capability {
    /// Open a checkpoint and either accept it or refuse it with a reason.
    #[serde(rename = "load")]
    Load,
    /// `load` with `verify: true`: the read-time payload check (expert CRCs of a container).
    #[serde(rename = "load.verify")]
    LoadVerify,
    /// Reads checkpoints in the official release layout (`config.json` + safetensors).
    #[serde(rename = "layout.release")]
    LayoutRelease,
    /// Reads WASTE v0 containers (`manifest.json` + records).
    #[serde(rename = "layout.container")]
    LayoutContainer,
    /// Encode text on the text path (no control tokens) and on the markup path.
    #[serde(rename = "tokenize")]
    Tokenize,
    /// Render a conversation to a DSML prompt.
    #[serde(rename = "render")]
    Render,
    /// Parse a DSML completion.
    #[serde(rename = "parse")]
    Parse,
    /// Run tokens and write a trace file.
    #[serde(rename = "forward")]
    Forward,
    /// Shorthand for every `trace.*` capability (kept for engines written before they existed).
    #[serde(rename = "trace")]
    Trace,
    /// The trace carries `logits` (and optionally `logits_positions`).
    #[serde(rename = "trace.logits")]
    TraceLogits,
    /// The trace carries `residual`, every block's output stream.
    #[serde(rename = "trace.residual")]
    TraceResidual,
    /// The trace carries `experts` (and optionally `expert_weights`).
    #[serde(rename = "trace.experts")]
    TraceExperts,
    /// The trace carries the indexer selections `topk.L{l}`.
    #[serde(rename = "trace.topk")]
    TraceTopk,
    /// The trace carries the Engram hash ids `engram_hash`.
    #[serde(rename = "trace.engram_hash")]
    TraceEngramHash,
    /// The trace carries the sub-op tensors (`attn_out`, `moe_out`, ...).
    #[serde(rename = "trace.sub_ops")]
    TraceSubOps,
    /// Prefill more than one token in one chunk (otherwise token at a time only).
    #[serde(rename = "prefill")]
    Prefill,
    /// Save and restore session state.
    #[serde(rename = "state")]
    State,
    /// Teacher-forced replay from a golden's block inputs.
    #[serde(rename = "replay")]
    Replay,
    #[serde(rename = "numerics.exact")]
    NumericsExact,
    #[serde(rename = "numerics.upstream")]
    NumericsUpstream,
    #[serde(rename = "index_k.as_shipped")]
    IndexKAsShipped,
    #[serde(rename = "index_k.owner")]
    IndexKOwner,
    /// Engram hash ids from token ids alone (no weights): `engram_hash`.
    #[serde(rename = "engram_hash")]
    EngramHash,
    /// The DSpark draft head (MODEL.md §10.1): `dspark` writes a DSpark trace (docs/TRACE.md
    /// "DSpark"); with `replay`, teacher-forced from a golden. Release layout only.
    #[serde(rename = "dspark")]
    Dspark,
    /// Shorthand for every `vision.*` capability.
    #[serde(rename = "vision")]
    Vision,
    /// `vision_preprocess`: an image file → its patch file (MODEL.md §10.2 preprocessing).
    #[serde(rename = "vision.preprocess")]
    VisionPreprocess,
    /// `vision_tower`: patches → every ViT stage and the aligner rows of a checkpoint's tower.
    #[serde(rename = "vision.tower")]
    VisionTower,
    /// `vision_span`: a prompt with image markers and its images → token ids and types.
    #[serde(rename = "vision.span")]
    VisionSpan,
    /// `forward` with `images`: image spans in the language model.
    #[serde(rename = "vision.forward")]
    VisionForward,
}

impl Capability {
    pub const ALL: [Capability; 29] = [
        Capability::Load,
        Capability::LoadVerify,
        Capability::LayoutRelease,
        Capability::LayoutContainer,
        Capability::Tokenize,
        Capability::Render,
        Capability::Parse,
        Capability::Forward,
        Capability::Trace,
        Capability::TraceLogits,
        Capability::TraceResidual,
        Capability::TraceExperts,
        Capability::TraceTopk,
        Capability::TraceEngramHash,
        Capability::TraceSubOps,
        Capability::Prefill,
        Capability::State,
        Capability::Replay,
        Capability::NumericsExact,
        Capability::NumericsUpstream,
        Capability::IndexKAsShipped,
        Capability::IndexKOwner,
        Capability::EngramHash,
        Capability::Dspark,
        Capability::Vision,
        Capability::VisionPreprocess,
        Capability::VisionTower,
        Capability::VisionSpan,
        Capability::VisionForward,
    ];
    /// The vision parts the shorthand `vision` stands for.
    pub const VISION_PARTS: [Capability; 4] = [
        Capability::VisionPreprocess,
        Capability::VisionTower,
        Capability::VisionSpan,
        Capability::VisionForward,
    ];
    /// The per-tensor trace capabilities the shorthand `trace` stands for.
    pub const TRACE_PARTS: [Capability; 6] = [
        Capability::TraceLogits,
        Capability::TraceResidual,
        Capability::TraceExperts,
        Capability::TraceTopk,
        Capability::TraceEngramHash,
        Capability::TraceSubOps,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Load => "load",
            Capability::LoadVerify => "load.verify",
            Capability::LayoutRelease => "layout.release",
            Capability::LayoutContainer => "layout.container",
            Capability::Tokenize => "tokenize",
            Capability::Render => "render",
            Capability::Parse => "parse",
            Capability::Forward => "forward",
            Capability::Trace => "trace",
            Capability::TraceLogits => "trace.logits",
            Capability::TraceResidual => "trace.residual",
            Capability::TraceExperts => "trace.experts",
            Capability::TraceTopk => "trace.topk",
            Capability::TraceEngramHash => "trace.engram_hash",
            Capability::TraceSubOps => "trace.sub_ops",
            Capability::Prefill => "prefill",
            Capability::State => "state",
            Capability::Replay => "replay",
            Capability::NumericsExact => "numerics.exact",
            Capability::NumericsUpstream => "numerics.upstream",
            Capability::IndexKAsShipped => "index_k.as_shipped",
            Capability::IndexKOwner => "index_k.owner",
            Capability::EngramHash => "engram_hash",
            Capability::Dspark => "dspark",
            Capability::Vision => "vision",
            Capability::VisionPreprocess => "vision.preprocess",
            Capability::VisionTower => "vision.tower",
            Capability::VisionSpan => "vision.span",
            Capability::VisionForward => "vision.forward",
        }
    }
    pub fn parse(s: &str) -> Option<Capability> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The trace capability a dump tensor needs (docs/TRACE.md, PROTOCOL.md `forward`):
    /// `topk.L{l}` and `candidates.L{c}` by their family name; None for a name that is not a
    /// dump tensor an engine can be asked for.
    pub fn for_trace_tensor(name: &str) -> Option<Capability> {
        let family = name.split_once(".L").map_or(name, |(f, _)| f);
        TRACE_TENSORS
            .iter()
            .find(|(n, _)| *n == family)
            .map(|&(_, c)| c)
    }

    /// The capability an engine needs to read a checkpoint of `layout`.
    pub fn for_layout(layout: ds41_engine::checkpoint::Layout) -> Capability {
        match layout {
            ds41_engine::checkpoint::Layout::Release => Capability::LayoutRelease,
            ds41_engine::checkpoint::Layout::Container => Capability::LayoutContainer,
        }
    }
}

/// Every dump tensor a case may `require` and the capability that promises it (docs/TRACE.md;
/// `topk` and `candidates` stand for their per-layer `.L{l}` tensors). The documentation
/// tables are checked against this list (tests/capabilities.rs).
pub const TRACE_TENSORS: [(&str, Capability); 14] = [
    ("logits", Capability::TraceLogits),
    ("logits_positions", Capability::TraceLogits),
    ("residual", Capability::TraceResidual),
    ("experts", Capability::TraceExperts),
    ("expert_weights", Capability::TraceExperts),
    ("topk", Capability::TraceTopk),
    ("engram_hash", Capability::TraceEngramHash),
    ("block_input", Capability::TraceSubOps),
    ("pre_mix", Capability::TraceSubOps),
    ("mid", Capability::TraceSubOps),
    ("attn_out", Capability::TraceSubOps),
    ("moe_out", Capability::TraceSubOps),
    ("engram_gate", Capability::TraceSubOps),
    ("candidates", Capability::TraceSubOps),
];

/// The capabilities an engine declared (hello / profile), by name, and what they imply
/// (PROTOCOL.md "Capabilities"): `trace` stands for every `trace.*`; `forward` without any
/// `trace.*` keeps its original promise of `trace.logits`; an engine naming no `layout.*`
/// keeps the original promise of reading both layouts. Unknown names are returned apart.
pub fn declared_capabilities<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> (BTreeSet<Capability>, Vec<String>) {
    let mut caps = BTreeSet::new();
    let mut unknown = Vec::new();
    for n in names {
        match Capability::parse(n) {
            Some(c) => {
                caps.insert(c);
            }
            None => unknown.push(n.to_string()),
        }
    }
    if caps.contains(&Capability::Trace) {
        caps.extend(Capability::TRACE_PARTS);
    }
    if caps.contains(&Capability::Vision) {
        caps.extend(Capability::VISION_PARTS);
    }
    if caps.contains(&Capability::Forward)
        && !Capability::TRACE_PARTS.iter().any(|c| caps.contains(c))
    {
        caps.insert(Capability::TraceLogits);
    }
    if !caps.contains(&Capability::LayoutRelease) && !caps.contains(&Capability::LayoutContainer) {
        caps.insert(Capability::LayoutRelease);
        caps.insert(Capability::LayoutContainer);
    }
    (caps, unknown)
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who the engine says it is; recorded in reports and certificates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineIdentity {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub commit: Option<String>,
    /// How it was plugged in: `reference`, `adapter: CMD`, `profile: FILE`.
    #[serde(default)]
    pub driver: String,
}

/// The run-time choices of a forward are the engine's own types (one definition); this
/// names the capability an engine must declare to be asked for each.
pub use ds41_engine::model::{IndexK, Numerics};

pub trait RequiredCapability {
    fn capability(self) -> Capability;
}

impl RequiredCapability for Numerics {
    fn capability(self) -> Capability {
        match self {
            Numerics::Exact => Capability::NumericsExact,
            Numerics::Upstream => Capability::NumericsUpstream,
        }
    }
}

impl RequiredCapability for IndexK {
    fn capability(self) -> Capability {
        match self {
            IndexK::AsShipped => Capability::IndexKAsShipped,
            IndexK::Owner => Capability::IndexKOwner,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadRequest {
    pub model: PathBuf,
    /// After opening, also run the read-time payload check (expert CRCs of a container); a
    /// load alone must not read the whole expert bank.
    #[serde(default)]
    pub verify: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    /// A checkpoint directory (its tokenizer) or a `tokenizer.json` file.
    pub tokenizer: PathBuf,
    pub texts: Vec<String>,
    /// true: recognise added/control tokens (markup path); false: text path.
    pub markup: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderRequest {
    /// The conversation in the official test-case format (DSML.md).
    pub conversation: serde_json::Value,
    #[serde(default)]
    pub thinking_mode: Option<String>,
    #[serde(default)]
    pub reasoning_effort: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParseRequest {
    pub completion: String,
    pub thinking: bool,
    pub tolerant: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardRequest {
    pub model: PathBuf,
    pub tokens: Vec<u32>,
    /// Tokens processed as the first chunk (None: all, or all after a loaded state: 0).
    #[serde(default)]
    pub prefill: Option<usize>,
    pub numerics: Numerics,
    pub index_k: IndexK,
    /// Where the engine writes its trace (safetensors, trace format).
    pub out: PathBuf,
    #[serde(default)]
    pub save_state: Option<PathBuf>,
    #[serde(default)]
    pub load_state: Option<PathBuf>,
    /// Teacher-forced replay from this golden's block inputs.
    #[serde(default)]
    pub replay: Option<PathBuf>,
    /// A file whose Engram token map replaces the checkpoint's own (int32 `.npy`, or a
    /// safetensors file with an `engram_token_map` tensor).
    #[serde(default)]
    pub engram_token_map: Option<PathBuf>,
    /// Image files, one per image marker (`image_token_id`) of `tokens`, in order; each marker
    /// becomes its image's span (capability `vision.forward`). Markers lie in the first chunk;
    /// `prefill` counts a marker as one token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<PathBuf>,
}

/// The DSpark draft head over a schedule of the main model (PROTOCOL.md `dspark`): a prefill
/// of `prefill` tokens, then single-token decode steps, a draft block after every decode step
/// (temperature 0: argmax ids, errata `dspark_sampling`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DsparkRequest {
    /// A release-layout checkpoint with `mtp.*` stages.
    pub model: PathBuf,
    pub tokens: Vec<u32>,
    pub prefill: usize,
    pub numerics: Numerics,
    /// Where the engine writes its DSpark trace (safetensors, docs/TRACE.md "DSpark").
    pub out: PathBuf,
    /// Teacher-forced: take `main_hidden`, the draft ids, every stage's input stream and
    /// `pre`, and the ids sampled before each Markov step from this golden.
    #[serde(default)]
    pub replay: Option<PathBuf>,
}

/// The preprocessing fields of a vision config (`config.json`'s `vision_config` names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionPreprocessConfig {
    pub patch_size: usize,
    pub downsample_ratio: usize,
    pub max_image_tokens: usize,
    pub min_pixels: usize,
    #[serde(default)]
    pub max_wh_ratio: Option<f64>,
}

impl VisionPreprocessConfig {
    /// A vision config holding these preprocessing fields (the tower's left at zero).
    pub fn vision_config(&self) -> ds41_engine::config::VisionConfig {
        ds41_engine::config::VisionConfig {
            n_layers: 0,
            dim: 0,
            n_heads: 0,
            inter_dim: 0,
            patch_size: self.patch_size,
            downsample_ratio: self.downsample_ratio,
            max_n_token: self.max_image_tokens,
            min_pixels: self.min_pixels,
            max_wh_ratio: self.max_wh_ratio,
            rope_theta: 0.0,
        }
    }
}

/// One image → its patch file (PROTOCOL.md `vision_preprocess`; the format of
/// `ds41_engine::vision::patch_file`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionPreprocessRequest {
    pub image: PathBuf,
    pub config: VisionPreprocessConfig,
    pub out: PathBuf,
}

/// A checkpoint's vision tower and aligner on one image's patches (PROTOCOL.md `vision_tower`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionTowerRequest {
    /// A checkpoint with a vision tower.
    pub model: PathBuf,
    /// A patch file (`patches`, `grid`).
    pub patches: PathBuf,
    pub numerics: Numerics,
    /// Where the engine writes the stages (`vision.embed`, `vision.blocks`, `vision.norm`,
    /// `vision.aligner`).
    pub out: PathBuf,
    /// Teacher-forced: each stage from this file's previous stage (same names).
    #[serde(default)]
    pub replay: Option<PathBuf>,
}

/// A prompt with image markers and its images → the expanded token ids and token types
/// (PROTOCOL.md `vision_span`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionSpanRequest {
    /// A checkpoint or weightless model directory: `config.json` (its `vision_config` and
    /// `image_token_id`) and `tokenizer.json`.
    pub model: PathBuf,
    pub prompt: String,
    /// One image file per marker, in order.
    pub images: Vec<PathBuf>,
}

/// The answer to a `vision_span` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionSpan {
    pub tokens: Vec<u32>,
    pub token_types: Vec<i64>,
}

/// Engram hash ids (MODEL.md §6.6.1) of a token sequence, without weights (PROTOCOL.md
/// `engram_hash`): the constants and the compressed token map are those of `model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngramHashRequest {
    /// A checkpoint directory, or a weightless model directory (`config.json` and
    /// `tokenizer.json`, optionally `engram_token_map_int32.npy`): hashing reads no weights.
    pub model: PathBuf,
    /// Raw token ids; the engine maps them through its compressed token map.
    pub tokens: Vec<u32>,
    /// Positions whose history slot is DEAD (image positions); their token is ignored.
    #[serde(default)]
    pub dead: Vec<usize>,
    /// A safetensors file whose `engram_token_map` tensor replaces the model's map.
    #[serde(default)]
    pub engram_token_map: Option<PathBuf>,
}

/// Hash ids `[tokens][n_engram_layers][(max_ngram − 1) · n_heads]`, column
/// `(n − 2) · n_heads + head`, layers in `engram_layer_ids` order.
pub type EngramHashes = Vec<Vec<Vec<i64>>>;

/// Why an engine call did not produce an answer. `Refused` is an answer (the engine rejected
/// the input, e.g. a broken checkpoint); the rest are failures of the engine or its driver.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineError {
    /// The engine lacks the capability; the optional reason is the engine's own words.
    Unsupported(Capability, Option<String>),
    Refused(String),
    /// The deadline passed; the optional detail says what the engine was doing (e.g. not
    /// reading its input).
    Timeout(Duration, Option<String>),
    Crashed(String),
    Garbage(String),
    Failed(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Unsupported(c, None) => write!(f, "engine lacks capability `{c}`"),
            EngineError::Unsupported(c, Some(why)) => {
                write!(f, "engine lacks capability `{c}`: {why}")
            }
            EngineError::Refused(m) => write!(f, "engine refused: {m}"),
            EngineError::Timeout(d, None) => {
                write!(f, "engine timed out after {:.1}s", d.as_secs_f64())
            }
            EngineError::Timeout(d, Some(why)) => {
                write!(f, "engine timed out after {:.1}s: {why}", d.as_secs_f64())
            }
            EngineError::Crashed(m) => write!(f, "engine crashed: {m}"),
            EngineError::Garbage(m) => write!(f, "engine answered garbage: {m}"),
            EngineError::Failed(m) => write!(f, "engine failed: {m}"),
        }
    }
}

pub type EngineResult<T> = Result<T, EngineError>;

/// An engine under test. Every call carries the case's timeout; a driver that cannot stop
/// its engine in time must still return `Timeout` and leave itself usable for the next case.
pub trait Engine: Send {
    fn identity(&self) -> EngineIdentity;
    fn capabilities(&self) -> BTreeSet<Capability>;
    /// `Unsupported(c)` unless the engine declared `c`: every request checks this before it
    /// reaches the engine, so a missing capability is NotSupported, never a failure.
    fn need(&self, c: Capability) -> EngineResult<()> {
        if self.capabilities().contains(&c) {
            Ok(())
        } else {
            Err(EngineError::Unsupported(c, None))
        }
    }
    fn load(&mut self, req: &LoadRequest, timeout: Duration) -> EngineResult<()>;
    fn tokenize(&mut self, req: &TokenizeRequest, timeout: Duration)
        -> EngineResult<Vec<Vec<u32>>>;
    fn render(&mut self, req: &RenderRequest, timeout: Duration) -> EngineResult<String>;
    fn parse(&mut self, req: &ParseRequest, timeout: Duration) -> EngineResult<serde_json::Value>;
    /// Run the request; on success the trace file `req.out` exists.
    fn forward(&mut self, req: &ForwardRequest, timeout: Duration) -> EngineResult<()>;
    /// Engram hash ids of a token sequence. Engines without the capability keep the default.
    fn engram_hash(
        &mut self,
        _req: &EngramHashRequest,
        _timeout: Duration,
    ) -> EngineResult<EngramHashes> {
        Err(EngineError::Unsupported(Capability::EngramHash, None))
    }
    /// Run the DSpark draft head; on success the trace file `req.out` exists. Engines without
    /// the capability keep the default.
    fn dspark(&mut self, _req: &DsparkRequest, _timeout: Duration) -> EngineResult<()> {
        Err(EngineError::Unsupported(Capability::Dspark, None))
    }
    /// Preprocess an image; on success the patch file `req.out` exists.
    fn vision_preprocess(
        &mut self,
        _req: &VisionPreprocessRequest,
        _timeout: Duration,
    ) -> EngineResult<()> {
        Err(EngineError::Unsupported(Capability::VisionPreprocess, None))
    }
    /// Run the vision tower; on success the stage file `req.out` exists.
    fn vision_tower(&mut self, _req: &VisionTowerRequest, _timeout: Duration) -> EngineResult<()> {
        Err(EngineError::Unsupported(Capability::VisionTower, None))
    }
    /// Expand a prompt's image markers.
    fn vision_span(
        &mut self,
        _req: &VisionSpanRequest,
        _timeout: Duration,
    ) -> EngineResult<VisionSpan> {
        Err(EngineError::Unsupported(Capability::VisionSpan, None))
    }
}
