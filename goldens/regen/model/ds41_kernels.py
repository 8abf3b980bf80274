"""CPU torch implementations of the six DS41 CUDA kernels, written from MODEL.md §5.

Installed as the module `kernel` before the official `inference/model.py` is imported
(run_official.py does this), so model.py runs unmodified on CPU:

    act_quant          MODEL.md §5.3  FP8 e4m3, block 32, power-of-two (ue8m0) scale
    fp4_act_quant      MODEL.md §5.3  FP4 e2m1, E8M0 scale / block 32 or E4M3 scale / block 16
    fp8_gemm           MODEL.md §5.4  C1: exact 32-block products, one f32 rounding per block,
    fp4_gemm                          power-of-two scales, f32 accumulation in increasing block
                                      order, bf16 result — independent of the batch size M
    sparse_attn        MODEL.md §5.7  online softmax in list order, 64-entry blocks, running max
                                      from -1e30, bf16 P before P·V, sink in the denominator only
    hc_split_sinkhorn  MODEL.md §5.8  f32; 4-term sums sequential in index order (C3)

plus `stable_topk` (MODEL.md §5.10: larger first, equal values -> lower index), which
run_official.py installs in place of torch.topk.

The call signatures (argument names and defaults) follow the kernel API as used by model.py
according to public CPU ports of kernel.py; the arithmetic is this project's reading of the
spec (no code copied). Every function refuses inputs it does not understand rather than guess.
"""
import collections

import torch

# Counts per kernel and the scale formats requested, written into the trace metadata.
CALLS = collections.Counter()

FP8_MAX = 448.0
FP4_MAX = 6.0
# e2m1 magnitudes by code 0..7; code 8..15 = negative. Code 8 (-0) decodes to +0.0 like
# convert.py (errata `fp4_code8_sign`).
FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)
FP4_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
FP4_VALUES = torch.cat([FP4_GRID, -FP4_GRID])
FP4_VALUES[8] = 0.0


# --- scalar helpers (MODEL.md §5.2) ---------------------------------------------------------

def pow2ceil(t: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 t) for normal f32 t > 0, built from the exponent bits (exact)."""
    t = t.to(torch.float32).contiguous()
    bits = t.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    bump = ((bits & 0x7FFFFF) != 0).to(torch.int32)
    code = exponent + bump
    if bool(((exponent == 0) | (code >= 255)).any()):
        raise ValueError("pow2ceil: input outside the normal f32 range")
    return (code << 23).view(torch.float32)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """RNE onto the e2m1 grid for |v| <= 6; ties go to the even code. Returns codes 0..15."""
    mag = v.abs()
    idx = torch.searchsorted(FP4_MIDPOINTS, mag.contiguous(), right=False)  # mids < mag
    tie = (idx < 7) & (mag == FP4_MIDPOINTS[idx.clamp(max=6)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    sign = torch.signbit(v).to(idx.dtype) << 3
    return (idx | sign).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Weight decode, convert.py's table: code 8 -> +0.0 (errata `fp4_code8_sign`)."""
    return FP4_VALUES[codes.long()]


def e2m1_value(codes: torch.Tensor) -> torch.Tensor:
    """An activation QDQ value: the grid magnitude with the code's sign, so a negative input
    that rounds to zero stays -0.0 as IEEE arithmetic on e2m1(v)·s gives (the engine agrees)."""
    mag = FP4_GRID[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.shape[-1] % block != 0:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of block {block}")
    return x.to(torch.float32).unflatten(-1, (-1, block))


# --- activation quantisation (MODEL.md §5.3) ------------------------------------------------

def act_quant(x, block_size=32, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
    """FP8 block quantisation: a = max(max|x|, 1e-4); s = pow2ceil(a/448); q = e4m3(x/s)."""
    CALLS["act_quant"] += 1
    CALLS[f"act_quant.scale_fmt={scale_fmt}"] += 1
    if scale_fmt not in (None, "ue8m0"):
        raise ValueError(f"act_quant: unsupported scale_fmt {scale_fmt!r}")
    blocks = _blocks(x, block_size)
    amax = blocks.abs().amax(-1).clamp_min(1e-4)
    scale = pow2ceil(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    q = (blocks / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if inplace:
        x.copy_((q.to(torch.float32) * scale.unsqueeze(-1)).flatten(-2).to(x.dtype))
        return x
    return q.flatten(-2).contiguous(), scale.to(scale_dtype).contiguous()


def fp4_act_quant(x, block_size=32, inplace=False, scale_dtype=torch.float8_e8m0fnu):
    """FP4 QDQ. E8M0 variant (block 32): s = pow2ceil(max(a, 6·2^-126)/6). E4M3 variant
    (block 16): s = e4m3(max(a, 6·2^-9)/6) and v = x / s as an f32 division."""
    CALLS["fp4_act_quant"] += 1
    blocks = _blocks(x, block_size)
    amax = blocks.abs().amax(-1)
    if scale_dtype == torch.float8_e4m3fn:
        scale = (amax.clamp_min(6 * 2.0**-9) / FP4_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    elif scale_dtype == torch.float8_e8m0fnu:
        scale = pow2ceil(amax.clamp_min(6 * 2.0**-126) * torch.tensor(1.0 / FP4_MAX, dtype=torch.float32))
    else:
        raise ValueError(f"fp4_act_quant: unsupported scale dtype {scale_dtype}")
    codes = e2m1_codes((blocks / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX))
    if inplace:
        x.copy_((e2m1_value(codes) * scale.unsqueeze(-1)).flatten(-2).to(x.dtype))
        return x
    codes = codes.flatten(-2)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
    return packed.view(torch.float4_e2m1fn_x2), scale.to(scale_dtype).contiguous()


# --- block GEMMs, canonical summation C1 (MODEL.md §5.4) ------------------------------------

def _block_gemm(a_vals, a_scale, w_vals, w_scale_rows, block=32):
    """a_vals [M, K] and w_vals [N, K] exact in f64; a_scale [M, K/32]; w_scale_rows [N, K/32]
    (already expanded per output row). Returns f32 [M, N]."""
    m, k = a_vals.shape
    n = w_vals.shape[0]
    kb = k // block
    # Exact per-block sums: products of e4m3/e2m1 values are multiples of 2^-18 below 2^23,
    # so f64 holds every partial sum exactly whatever order matmul uses.
    partial = torch.einsum("mbk,nbk->mnb", a_vals.view(m, kb, block), w_vals.view(n, kb, block))
    partial = partial.to(torch.float32)
    terms = partial * a_scale[:, None, :] * w_scale_rows[None, :, :]
    acc = torch.zeros(m, n, dtype=torch.float32)
    for b in range(kb):  # increasing block order, f32 adds
        acc = acc + terms[:, :, b]
    return acc


def _as_f32_scales(s):
    return s.to(torch.float32)


def fp8_gemm(a, a_s, b, b_s, scale_dtype=torch.float32, block_size=32):
    """y = (a · s_a) @ (b · s_b)^T with FP8 a [.., K], FP8 weight b [N, K] and 32×32 weight
    scale blocks b_s [ceil(N/32), K/32]; bf16 (default dtype) result."""
    CALLS["fp8_gemm"] += 1
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp8_gemm: expected float8_e4m3fn operands, got {a.dtype}, {b.dtype}")
    k = a.shape[-1]
    n = b.shape[0]
    if b.shape[1] != k or k % 32:
        raise ValueError(f"fp8_gemm: shapes {tuple(a.shape)} x {tuple(b.shape)}")
    a2 = a.reshape(-1, k)
    sa = _as_f32_scales(a_s).reshape(a2.shape[0], -1)
    if sa.shape[1] != k // 32:
        raise ValueError(f"fp8_gemm: activation scales {tuple(a_s.shape)} are not per 32")
    sw = _as_f32_scales(b_s)
    if sw.shape != ((n + 31) // 32, k // 32):
        raise ValueError(f"fp8_gemm: weight scales {tuple(b_s.shape)} are not 32x32 blocks")
    sw_rows = sw.repeat_interleave(32, dim=0)[:n]
    out = _block_gemm(a2.to(torch.float64), sa, b.to(torch.float64), sw_rows)
    return out.reshape(*a.shape[:-1], n).to(torch.get_default_dtype())


def fp4_gemm(a, a_s, b, b_s, scale_dtype=torch.float32, act_block_size=32):
    """FP8 activations times packed FP4 weights b [N, K/2] (low nibble = even element) with
    per-(row, 32-block) scales b_s [N, K/32]; FP4 promotes to FP8 exactly, same C1 sum."""
    CALLS["fp4_gemm"] += 1
    if a.dtype != torch.float8_e4m3fn:
        raise TypeError(f"fp4_gemm: expected float8_e4m3fn activations, got {a.dtype}")
    k = a.shape[-1]
    packed = b.contiguous().view(torch.uint8)
    n = packed.shape[0]
    if packed.shape[1] * 2 != k or k % 32:
        raise ValueError(f"fp4_gemm: shapes {tuple(a.shape)} x packed {tuple(packed.shape)}")
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k)
    w = e2m1_decode(codes).to(torch.float64)
    a2 = a.reshape(-1, k)
    sa = _as_f32_scales(a_s).reshape(a2.shape[0], -1)
    if sa.shape[1] != k // 32:
        raise ValueError(f"fp4_gemm: activation scales {tuple(a_s.shape)} are not per 32")
    sw = _as_f32_scales(b_s)
    if sw.shape != (n, k // 32):
        raise ValueError(f"fp4_gemm: weight scales {tuple(b_s.shape)} are not per (row, 32)")
    out = _block_gemm(a2.to(torch.float64), sa, w, sw)
    return out.reshape(*a.shape[:-1], n).to(torch.get_default_dtype())


# --- sparse attention with sink (MODEL.md §5.7) ---------------------------------------------

ATTN_BLOCK = 64


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """q [B, S, H, D], kv [B, N, D] (key = value), attn_sink [H] f32, topk_idxs [B, S, T]
    (-1 = unused). Returns bf16 [B, S, H, D]."""
    CALLS["sparse_attn"] += 1
    bsz, seq, heads, dim = q.shape
    if kv.shape[0] != bsz or kv.shape[-1] != dim or attn_sink.shape[-1] != heads:
        raise ValueError(f"sparse_attn: q {tuple(q.shape)} kv {tuple(kv.shape)} sink {tuple(attn_sink.shape)}")
    idx_all = topk_idxs.to(torch.int64)
    if bool(((idx_all < -1) | (idx_all >= kv.shape[1])).any()):
        raise ValueError("sparse_attn: index out of range")
    scale = torch.tensor(softmax_scale, dtype=torch.float32)
    sink = attn_sink.to(torch.float32)
    out = torch.empty(bsz, seq, heads, dim, dtype=torch.float32)
    for b in range(bsz):
        kv64 = kv[b].to(torch.float64)
        for s in range(seq):
            q64 = q[b, s].to(torch.float64)                      # [H, D]
            ids = idx_all[b, s]
            running_max = torch.full((heads,), -1e30, dtype=torch.float32)
            denom = torch.zeros(heads, dtype=torch.float32)
            acc = torch.zeros(heads, dim, dtype=torch.float32)
            for start in range(0, ids.numel(), ATTN_BLOCK):
                chunk = ids[start:start + ATTN_BLOCK]
                valid = chunk >= 0
                rows = kv64[chunk.clamp_min(0)]                   # [T, D]
                # C2: each dot in f64, rounded once to f32, then scaled in f32.
                scores = (q64 @ rows.T).to(torch.float32) * scale  # [H, T]
                scores = scores.masked_fill(~valid[None, :], float("-inf"))
                new_max = torch.maximum(running_max, scores.amax(-1))
                correction = torch.exp(running_max - new_max)
                p = torch.exp(scores - new_max[:, None])          # f32, 0 where invalid
                block_sum = p.to(torch.float64).sum(-1).to(torch.float32)
                pv = (p.to(torch.bfloat16).to(torch.float64) @ rows).to(torch.float32)
                denom = denom * correction + block_sum
                acc = acc * correction[:, None] + pv
                running_max = new_max
            denom = denom + torch.exp(sink - running_max)
            out[b, s] = acc / denom[:, None]
    return out.to(torch.bfloat16)


# --- hyper-connection split and Sinkhorn (MODEL.md §5.8) ------------------------------------

def _sum4(x, dim):
    """Sequential f32 sum over a size-4 axis in index order (C3)."""
    parts = x.unbind(dim)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total.unsqueeze(dim)


def _sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """mixes [..., (2+hc)·hc] f32 -> pre [..., hc], post [..., hc], comb [..., hc, hc]
    (comb[j, k]: j = source copy, k = destination copy)."""
    CALLS["hc_split_sinkhorn"] += 1
    hc = hc_mult
    if mixes.dtype != torch.float32 or mixes.shape[-1] != (2 + hc) * hc or sinkhorn_iters < 1:
        raise ValueError(f"hc_split_sinkhorn: mixes {mixes.dtype} {tuple(mixes.shape)}, iters {sinkhorn_iters}")
    scale = hc_scale.to(torch.float32)
    base = hc_base.to(torch.float32)
    eps = torch.tensor(eps, dtype=torch.float32)
    # σ(x) = 1 / (1 + e^-x) as MODEL.md §5.1 writes it (torch.sigmoid's vectorised CPU form
    # differs from it in the last ulp).
    pre = _sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * _sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    sum_rows = _sum4 if hc == 4 else (lambda x, d: x.sum(d, keepdim=True))
    e = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = e / sum_rows(e, -1) + eps
    comb = comb / (sum_rows(comb, -2) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (sum_rows(comb, -1) + eps)
        comb = comb / (sum_rows(comb, -2) + eps)
    return pre, post, comb


# --- the tie rule (MODEL.md §5.10) ----------------------------------------------------------

_TopK = collections.namedtuple("topk", ["values", "indices"])


def stable_topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    """torch.topk with a defined tie order: larger first (smaller first if not largest),
    equal values -> lower index. NaN is an error, not a value."""
    CALLS["stable_topk"] += 1
    if out is not None:
        raise ValueError("stable_topk: `out=` is not supported")
    if input.is_floating_point() and bool(torch.isnan(input).any()):
        raise ValueError("stable_topk: NaN in top-k input")
    values, indices = torch.sort(input, dim=dim, descending=largest, stable=True)
    return _TopK(values.narrow(dim, 0, k), indices.narrow(dim, 0, k))


def selection_margin(input, k, dim=-1):
    """(k-th − (k+1)-th) / max|row| of a top-k decision (0 = exact tie, inf = no competitor)."""
    values, _ = torch.sort(input.to(torch.float32), dim=dim, descending=True, stable=True)
    if values.shape[dim] <= k or k == 0:
        return torch.full(values.select(dim, 0).shape, float("inf"))
    gap = values.select(dim, k - 1) - values.select(dim, k)
    finite = values.masked_fill(~torch.isfinite(values), 0)
    scale = finite.abs().amax(dim).clamp_min(1e-30)
    margin = gap / scale
    return torch.where(torch.isnan(margin), torch.zeros_like(margin), margin)
