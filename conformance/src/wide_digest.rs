//! The wide tokenizer corpus as a digest (goldens/README.md "wide digest"): the corpus is not
//! stored but regenerated from its seed and size (TOKENIZER.md §9, the engine's generator with
//! CPython's MT19937), and the expected ids are known by sha256, per chunk of strings, of the
//! canonical streams — texts as `u32le(len utf8) ++ utf8`, ids as `u32le(count) ++ u32le(id)…`.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Deserialize)]
pub struct WideDigest {
    pub seed: u64,
    pub n: usize,
    pub strings: usize,
    pub chunk_size: usize,
    pub texts_sha256: String,
    pub ids_sha256: String,
    pub chunks: Vec<Chunk>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Chunk {
    pub first: usize,
    pub texts_sha256: String,
    pub ids_sha256: String,
}

/// Which stream of a digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Texts,
    Ids,
}

/// A stream compared with the digest: the sha256 of the whole stream and the first string of
/// every chunk whose hash differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub total_sha256: String,
    pub total_equal: bool,
    pub differing_chunks: Vec<usize>,
}

impl Comparison {
    pub fn equal(&self) -> bool {
        self.total_equal && self.differing_chunks.is_empty()
    }
}

pub fn text_record(text: &str) -> Vec<u8> {
    let mut out = (text.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

pub fn ids_record(ids: &[u32]) -> Vec<u8> {
    let mut out = (ids.len() as u32).to_le_bytes().to_vec();
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

impl WideDigest {
    pub fn load(path: &Path) -> Result<WideDigest, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let d: WideDigest = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a wide-corpus digest: {e}", path.display()))?;
        let expected_chunks = d.strings.div_ceil(d.chunk_size.max(1));
        if d.chunk_size == 0 || d.chunks.len() != expected_chunks {
            return Err(format!(
                "{}: {} chunks of {} for {} strings",
                path.display(),
                d.chunks.len(),
                d.chunk_size,
                d.strings
            ));
        }
        Ok(d)
    }

    /// The strings the digest covers (the recipe's random and whitespace strings; its curated
    /// strings are excluded), regenerated from the seed.
    pub fn strings(&self) -> Vec<String> {
        ds41_engine::tokenizer::corpus::wide(self.n, self.seed)
            .into_iter()
            .filter(|s| s.kind != "curated")
            .map(|s| s.text)
            .collect()
    }

    /// Compare one stream's records (one per string, in order) with the digest.
    pub fn compare(&self, stream: Stream, records: &[Vec<u8>]) -> Comparison {
        let mut all = Sha256::new();
        let mut differing = Vec::new();
        for (i, chunk) in records.chunks(self.chunk_size).enumerate() {
            let mut h = Sha256::new();
            for r in chunk {
                h.update(r);
                all.update(r);
            }
            let want = self.chunks.get(i).map(|c| match stream {
                Stream::Texts => c.texts_sha256.as_str(),
                Stream::Ids => c.ids_sha256.as_str(),
            });
            if want != Some(hex::encode(h.finalize()).as_str()) {
                differing.push(i * self.chunk_size);
            }
        }
        let total = hex::encode(all.finalize());
        let want_total = match stream {
            Stream::Texts => &self.texts_sha256,
            Stream::Ids => &self.ids_sha256,
        };
        Comparison {
            total_equal: &total == want_total && records.len() == self.strings,
            total_sha256: total,
            differing_chunks: differing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> WideDigest {
        WideDigest::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../goldens/tokenizer/wide_seed11_n20000.digest.json"),
        )
        .unwrap()
    }

    /// The engine's generator reproduces the digest's texts, so the corpus needs no file.
    #[test]
    fn regenerated_corpus_matches_the_committed_text_digest() {
        let d = digest();
        let strings = d.strings();
        assert_eq!(strings.len(), d.strings);
        let records: Vec<Vec<u8>> = strings.iter().map(|s| text_record(s)).collect();
        let c = d.compare(Stream::Texts, &records);
        assert!(c.equal(), "{c:?}");
        // One changed string shows as its chunk, and the total.
        let mut broken = records.clone();
        broken[2500] = text_record("x");
        let c = d.compare(Stream::Texts, &broken);
        assert_eq!((c.total_equal, c.differing_chunks), (false, vec![2000]));
        // A truncated stream is never equal.
        let c = d.compare(Stream::Texts, &records[..records.len() - 1]);
        assert!(!c.equal());
    }
}
