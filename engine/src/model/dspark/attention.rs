//! A DSpark stage's attention (`DSparkAttention` of model.py): the main model's positions
//! enter a window ring as keys of `main_x`; the draft block attends the ring and its own
//! keys without a causal mask.

use super::super::attention::Attention;
use super::super::defects::Defect;
use super::super::pool::PoolVec;
use super::super::sparse_attention::sparse_attention;
use super::super::{Chunk, LayerCtx};
use crate::Result;

/// Write the keys of the chunk's rows [rows, head_dim] into the ring (slot p mod window; of a
/// long prefill only the newest window rows survive).
pub(super) fn write_ring(ring: &mut [f32], keys: &[f32], chunk: Chunk, dh: usize) {
    let w = ring.len() / dh;
    for t in chunk.rows.saturating_sub(w)..chunk.rows {
        let slot = (chunk.start + t) % w;
        ring[slot * dh..(slot + 1) * dh].copy_from_slice(&keys[t * dh..(t + 1) * dh]);
    }
}

/// The draft block's attention after main position `p`: the key of `main_x` (position p)
/// goes into the ring first; queries and draft keys are roped at p + 1 + i; every draft row
/// attends the filled ring slots `0 .. min(window, p + 1)` in slot order, then the draft keys
/// `0 .. block` (one index list for the whole block); inverse rope and the grouped output.
pub(super) fn draft_attention(
    attn: &Attention,
    ctx: &LayerCtx,
    p: usize,
    main_x: &[f32],
    u: &[f32],
    ring: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let (nh, dh) = attn.heads();
    let block = u.len() / ctx.cfg.dim;
    let main_key = attn.window_keys(ctx, main_x, 1, p)?;
    write_ring(ring, &main_key, Chunk { start: p, rows: 1 }, dh);

    let (_, q) = attn.queries(ctx, u, block, p + 1)?;
    let keys = attn.window_keys(ctx, u, block, p + 1)?;
    let filled = attn.window().min(p + 1);
    let mut kv = PoolVec::filled((filled + block) * dh, 0.0f32);
    kv[..filled * dh].copy_from_slice(&ring[..filled * dh]);
    kv[filled * dh..].copy_from_slice(&keys);
    let sink = attn.sink(ctx);
    let scale = (dh as f64).powf(-0.5) as f32;
    let causal = ctx.defects.has(Defect::DraftCausalMask);
    let mut o = PoolVec::filled(block * nh * dh, 0.0f32);
    for (i, o_row) in o.chunks_exact_mut(nh * dh).enumerate() {
        let idx: PoolVec<i64> = (0..filled + block)
            .map(|j| {
                if causal && j > filled + i {
                    -1
                } else {
                    j as i64
                }
            })
            .collect();
        sparse_attention(
            &q[i * nh * dh..(i + 1) * nh * dh],
            &kv,
            &sink,
            &idx,
            scale,
            ctx.numerics,
            o_row,
        )?;
    }
    attn.project_output(ctx, &mut o, block, p + 1, out)
}
