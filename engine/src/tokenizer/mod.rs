//! The DS41 tokenizer (TOKENIZER.md) and the Engram compressed token map (MODEL.md §6.6.1).
//!
//! [`Tokenizer`] loads a HF byte-level-BPE `tokenizer.json` with the DS41 pre-tokenizer and
//! has two encoding entry points whose difference is a security boundary (TOKENIZER.md §5.1,
//! DSML.md §6):
//! * [`Tokenizer::encode_text`] treats the input as data: added-token spellings such as
//!   `<｜User｜>` or `｜DSML｜` become ordinary BPE tokens, never control ids;
//! * [`Tokenizer::encode_markup`] recognises added tokens (leftmost-longest, as HF `encode`).
//!
//! Module map: [`load`] (reading and checking the file), [`byte_level`] (the byte map),
//! [`unicode_class`] (Unicode 16.0 class table), [`pretokenize`] (the three splits),
//! [`bpe`] (merging), [`added_tokens`] (splitting on added tokens), [`engram_map`]
//! (the Engram compressed token map), [`corpus`] (the wide test corpus).

pub mod added_tokens;
pub mod bpe;
pub mod byte_level;
pub mod corpus;
pub mod engram_map;
pub mod load;
pub mod pretokenize;
pub mod python_random;
pub mod unicode_class;
mod unicode_tables;

use std::path::{Path, PathBuf};

pub use added_tokens::AddedToken;
use added_tokens::{AddedTokenSplitter, Segment};
use bpe::Bpe;

use crate::{Error, Result};

/// A loaded byte-level BPE tokenizer. Immutable; share it freely across threads.
pub struct Tokenizer {
    source: PathBuf,
    /// Token string of every id: the vocab spelling in byte symbols, or an added token's text.
    tokens: Vec<String>,
    /// The bytes each id decodes to, back to back; id `i` is `decoded[offsets[i]..offsets[i+1]]`.
    decoded: Vec<u8>,
    offsets: Vec<u32>,
    /// Skipped by `decode(.., skip_special_tokens = true)`: ids whose token string is the
    /// content of a `special: true` added token (HF compares strings, not ids).
    special: Vec<bool>,
    is_added: Vec<bool>,
    token_ids: foldhash::HashMap<String, u32>,
    added: Vec<AddedToken>,
    splitter: AddedTokenSplitter,
    bpe: Bpe,
}

/// Buffers reused across encoding calls on one thread, so short inputs do not allocate.
#[derive(Default)]
struct Scratch {
    pre: pretokenize::Scratch,
    bpe: bpe::Scratch,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Pieces already encoded in this call, and where their ids sit in the output. Only worth
/// its hashing for inputs long enough to repeat words.
type PieceCache<'t> = foldhash::HashMap<&'t str, (u32, u32)>;
const CACHE_MIN_BYTES: usize = 256;

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Scratch::default()),
    })
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("added_tokens", &self.added.len())
            .field("merges", &self.bpe.num_merges())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::from_json_bytes(&load::read_file(path)?, path)
    }

    /// Parses the bytes of a `tokenizer.json`; `source` names it in errors.
    pub fn from_json_bytes(bytes: &[u8], source: &Path) -> Result<Self> {
        let parts = load::parse(bytes, source)?;
        let special_contents: foldhash::HashSet<&str> = parts
            .added
            .iter()
            .filter(|t| t.special)
            .map(|t| t.content.as_str())
            .collect();
        let special = parts
            .tokens
            .iter()
            .map(|t| special_contents.contains(t.as_str()))
            .collect();
        let mut is_added = vec![false; parts.tokens.len()];
        for t in &parts.added {
            is_added[t.id as usize] = true;
        }
        let mut decoded = Vec::new();
        let mut offsets = Vec::with_capacity(parts.tokens.len() + 1);
        offsets.push(0u32);
        for t in &parts.tokens {
            decoded.extend(byte_level::token_bytes(t));
            offsets.push(u32::try_from(decoded.len()).map_err(|_| Error::Tokenizer {
                file: source.to_path_buf(),
                field: "model.vocab".into(),
                reason: "token strings exceed 4 GiB".into(),
            })?);
        }
        let token_ids = parts
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), id as u32))
            .collect();
        Ok(Tokenizer {
            source: source.to_path_buf(),
            splitter: AddedTokenSplitter::new(&parts.added),
            bpe: Bpe::new(parts.byte_ids, parts.merges),
            tokens: parts.tokens,
            decoded,
            offsets,
            special,
            is_added,
            token_ids,
            added: parts.added,
        })
    }

    /// The file this tokenizer was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Number of ids, added tokens included (129,280 for DS41).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The added tokens in file order.
    pub fn added_tokens(&self) -> &[AddedToken] {
        &self.added
    }

    /// The token string of `id` (HF `id_to_token`): byte symbols such as `Ġworld`, or an added
    /// token's content.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token string (HF `token_to_id`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.token_ids.get(token).copied()
    }

    /// Whether `decode` with skipping drops `id`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether `id` is an added token (ids 0–2 and 128000.. in DS41).
    pub fn is_added(&self, id: u32) -> bool {
        self.is_added.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes untrusted text: added-token spellings are ordinary text.
    pub fn encode_text(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut cache = PieceCache::default();
        with_scratch(|scratch| {
            self.encode_plain(text, 0, text.len(), scratch, &mut cache, &mut out)
        });
        out
    }

    /// Encodes markup: every added token's content becomes its id (leftmost-longest; HF
    /// `encode(text, add_special_tokens=False)`).
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut cache = PieceCache::default();
        with_scratch(|scratch| {
            self.splitter.split(text, &mut |segment| match segment {
                Segment::Token(id) => out.push(id),
                Segment::Text { start, end } => {
                    self.encode_plain(text, start, end, scratch, &mut cache, &mut out)
                }
            })
        });
        out
    }

    /// The pre-tokens of `text` (no added-token handling), for inspection and tests.
    pub fn pre_tokenize<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut out = Vec::new();
        pretokenize::split(text, &mut pretokenize::Scratch::default(), |a, b| {
            out.push(&text[a..b])
        });
        out
    }

    fn encode_plain<'t>(
        &self,
        text: &'t str,
        start: usize,
        end: usize,
        scratch: &mut Scratch,
        cache: &mut PieceCache<'t>,
        out: &mut Vec<u32>,
    ) {
        let stretch = &text[start..end];
        let Scratch { pre, bpe } = scratch;
        let use_cache = text.len() >= CACHE_MIN_BYTES;
        pretokenize::split(stretch, pre, |a, b| {
            let piece = &stretch[a..b];
            if !use_cache || piece.len() == 1 {
                self.bpe.encode_word(piece.as_bytes(), bpe, out);
                return;
            }
            if let Some(&(at, len)) = cache.get(piece) {
                out.extend_from_within(at as usize..(at + len) as usize);
                return;
            }
            let at = out.len();
            self.bpe.encode_word(piece.as_bytes(), bpe, out);
            cache.insert(piece, (at as u32, (out.len() - at) as u32));
        });
    }

    /// The bytes `ids` decode to (HF `ByteLevel` decoder, before UTF-8 decoding).
    pub fn decode_bytes(&self, ids: &[u32], skip_special_tokens: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let k = id as usize;
            if k >= self.tokens.len() {
                return Err(Error::Tokenizer {
                    file: self.source.clone(),
                    field: format!("ids[{i}]"),
                    reason: format!("id {id} is outside the vocabulary of {}", self.tokens.len()),
                });
            }
            if skip_special_tokens && self.special[k] {
                continue;
            }
            out.extend_from_slice(
                &self.decoded[self.offsets[k] as usize..self.offsets[k + 1] as usize],
            );
        }
        Ok(out)
    }

    /// Decodes ids to text; incomplete UTF-8 becomes U+FFFD. With `skip_special_tokens`, only
    /// `special: true` tokens are dropped (`<｜System｜>` is kept in V4.1).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let bytes = self.decode_bytes(ids, skip_special_tokens)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}
