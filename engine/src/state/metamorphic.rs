//! Metamorphic checks of session state: relations between runs of one
//! engine that need no stored golden, so they apply to any engine that can prefill, decode,
//! snapshot, restore and reset.
//!
//! * [`snapshot_restore`]: prefill(a) → snapshot → a *fresh* engine restores → decode(b)
//!   equals prefill(a) → decode(b) uninterrupted;
//! * [`prefix_reuse`]: prefill(a) → snapshot → decode(b) → restore the shorter snapshot into
//!   the *same* engine → decode(c) equals a fresh prefill(a) → decode(c) (the stale-window /
//!   stale-cache bug of prefix caches);
//! * [`reset_replay`]: prefill(a) → reset → prefill(b) equals a fresh prefill(b).
//!
//! Equality is bit-exact on every logits row: an engine's state restore either reproduces
//! its own uninterrupted computation or it is wrong.

use crate::model::{Model, Options, Session, SessionState};
use crate::trace::Trace;
use crate::Result;

/// An engine with resumable sequence state, as the checks drive it.
pub trait StatefulEngine {
    /// Process `tokens` as one chunk at the current position; the last position's logits.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// One decode step; its logits.
    fn decode(&mut self, token: u32) -> Result<Vec<f32>>;
    /// The complete sequence state, in the engine's own snapshot format.
    fn snapshot(&self) -> Result<Vec<u8>>;
    /// Replace the whole sequence state by a snapshot.
    fn restore(&mut self, snapshot: &[u8]) -> Result<()>;
    /// Forget the sequence (back to position 0).
    fn reset(&mut self) -> Result<()>;
}

/// The reference engine as a [`StatefulEngine`]; snapshots use the `engine::state` format.
pub struct Reference<'m> {
    model: &'m Model,
    session: Session<'m>,
}

impl<'m> Reference<'m> {
    pub fn new(model: &'m Model, options: Options) -> Reference<'m> {
        Reference {
            model,
            session: Session::new(model, options),
        }
    }
    pub fn session(&self) -> &Session<'m> {
        &self.session
    }
}

impl StatefulEngine for Reference<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.session.prefill(tokens, &mut Trace::disabled())?;
        Ok(self.session.logits().to_vec())
    }
    fn decode(&mut self, token: u32) -> Result<Vec<f32>> {
        self.session.decode(token, &mut Trace::disabled())?;
        Ok(self.session.logits().to_vec())
    }
    fn snapshot(&self) -> Result<Vec<u8>> {
        super::encode(
            self.session.state(),
            self.model.config(),
            self.session.options(),
        )
    }
    fn restore(&mut self, snapshot: &[u8]) -> Result<()> {
        let state = super::decode(
            snapshot,
            std::path::Path::new("<snapshot>"),
            self.model.config(),
            self.session.options(),
        )?;
        self.session.set_state(state)
    }
    fn reset(&mut self) -> Result<()> {
        self.session
            .set_state(SessionState::new(self.model.config()))
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub check: &'static str,
    pub passed: bool,
    /// Which logits row differed first and by how much, or what was compared.
    pub detail: String,
}

/// Prefill `a` (if non-empty) then decode `b` token by token; the logits of every step.
fn run(engine: &mut dyn StatefulEngine, a: &[u32], b: &[u32]) -> Result<Vec<Vec<f32>>> {
    let mut rows = Vec::new();
    if !a.is_empty() {
        rows.push(engine.prefill(a)?);
    }
    for &t in b {
        rows.push(engine.decode(t)?);
    }
    Ok(rows)
}

/// Compare logits rows bit for bit.
fn verdict(check: &'static str, got: &[Vec<f32>], want: &[Vec<f32>]) -> Verdict {
    if got.len() != want.len() {
        return Verdict {
            check,
            passed: false,
            detail: format!("{} logits rows, expected {}", got.len(), want.len()),
        };
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let diff = g.len() != w.len() || g.iter().zip(w).any(|(x, y)| x.to_bits() != y.to_bits());
        if diff {
            let max = g
                .iter()
                .zip(w)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            return Verdict {
                check,
                passed: false,
                detail: format!("logits row {i} differs (max |Δ| {max:e})"),
            };
        }
    }
    Verdict {
        check,
        passed: true,
        detail: format!("{} logits rows bit-identical", got.len()),
    }
}

/// Snapshot after prefill(a), restore into a fresh engine, decode b == uninterrupted run.
/// `fresh` builds a new engine (a "fresh process"). With `a` empty the snapshot is the
/// empty state and every token of `b` is a decode step in both runs.
pub fn snapshot_restore<E: StatefulEngine>(
    fresh: &mut dyn FnMut() -> Result<E>,
    a: &[u32],
    b: &[u32],
) -> Result<Verdict> {
    let mut whole = fresh()?;
    let want = run(&mut whole, a, b)?;

    let mut first = fresh()?;
    let mut got = run(&mut first, a, &[])?;
    let snap = first.snapshot()?;
    drop(first);
    let mut second = fresh()?;
    second.restore(&snap)?;
    got.extend(run(&mut second, &[], b)?);
    Ok(verdict("snapshot_restore", &got, &want))
}

/// Snapshot after prefill(a), continue with b, restore the snapshot into the same engine,
/// decode c == a fresh prefill(a) + decode(c).
pub fn prefix_reuse<E: StatefulEngine>(
    fresh: &mut dyn FnMut() -> Result<E>,
    a: &[u32],
    b: &[u32],
    c: &[u32],
) -> Result<Verdict> {
    let mut reference = fresh()?;
    let want = run(&mut reference, a, c)?;

    let mut engine = fresh()?;
    let mut got = run(&mut engine, a, &[])?;
    let snap = engine.snapshot()?;
    run(&mut engine, &[], b)?;
    engine.restore(&snap)?;
    got.extend(run(&mut engine, &[], c)?);
    Ok(verdict("prefix_reuse", &got, &want))
}

/// prefill(a), reset, prefill(b) + decode(c) == a fresh prefill(b) + decode(c).
pub fn reset_replay<E: StatefulEngine>(
    fresh: &mut dyn FnMut() -> Result<E>,
    a: &[u32],
    b: &[u32],
    c: &[u32],
) -> Result<Verdict> {
    let mut reference = fresh()?;
    let want = run(&mut reference, b, c)?;

    let mut engine = fresh()?;
    run(&mut engine, a, &[])?;
    engine.reset()?;
    let got = run(&mut engine, b, c)?;
    Ok(verdict("reset_replay", &got, &want))
}
