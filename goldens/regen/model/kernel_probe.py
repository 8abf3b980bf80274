#!/usr/bin/env python3
"""Run this project's torch kernels (ds41_kernels.py) on given inputs, for a bit-for-bit
cross-check against the Rust reference engine (conformance/tests/regen_python/torch_kernels.rs
drives it, as the trial `regen_python::torch-kernels-vs-engine`).

    python3 goldens/regen/model/kernel_probe.py --inputs IN.safetensors --out OUT.safetensors \\
        [--checkpoint DIR --weights NAME,NAME,...]

IN holds F32 tensors (values the caller made bf16-exact where the kernel's caller in model.py
passes bf16); every tensor present selects one probe:

    x [R, C]                     act_quant -> act_quant.codes (U8 e4m3 bytes), act_quant.scales;
                                 fp4_act_quant E8M0/32 and E4M3/16 in place -> fp4_e8m0, fp4_e4m3
    attn.q [S, H, D], attn.kv [N, D], attn.sink [H], attn.idx [S, T] (I64), attn.scale [1]
                                 sparse_attn -> attn.out [S, H, D] (bf16 values)
    hc.mixes [R, (2+hc)·hc], hc.scale [3], hc.base [(2+hc)·hc], hc.hc, hc.eps, hc.iters [1]
                                 hc_split_sinkhorn -> hc.pre, hc.post, hc.comb
    topk.values [R, N], topk.k [1]
                                 stable_topk (the tie rule run_official.py installs for torch.topk)
                                 -> topk.indices [R, k] (I64)
    gemm.x [R, K]                with --checkpoint: for each weight NAME (an F8_E4M3 or packed-FP4
                                 I8 tensor with NAME's `.scale` beside it) act_quant then fp8_gemm /
                                 fp4_gemm, bf16 result -> `gemm.NAME` [R, N]

Outputs are F32 (codes U8) so the caller compares exact bits. Nothing here knows the Rust side.
"""
import argparse
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds41_kernels as k  # noqa: E402


def probe_quant(x, out):
    codes, scales = k.act_quant(x.clone())
    out["act_quant.codes"] = codes.view(torch.uint8)
    out["act_quant.scales"] = scales.to(torch.float32)
    out["fp4_e8m0"] = k.fp4_act_quant(x.clone(), 32, inplace=True, scale_dtype=torch.float8_e8m0fnu)
    out["fp4_e4m3"] = k.fp4_act_quant(x.clone(), 16, inplace=True, scale_dtype=torch.float8_e4m3fn)


def probe_attention(t, out):
    q, kv, sink, idx = t["attn.q"], t["attn.kv"], t["attn.sink"], t["attn.idx"]
    scale = float(t["attn.scale"][0])
    o = k.sparse_attn(q[None].to(torch.bfloat16), kv[None].to(torch.bfloat16), sink, idx[None].to(torch.int32), scale)
    out["attn.out"] = o[0].to(torch.float32)


def probe_hc(t, out):
    pre, post, comb = k.hc_split_sinkhorn(t["hc.mixes"], t["hc.scale"], t["hc.base"],
                                          hc_mult=int(t["hc.hc"][0]),
                                          sinkhorn_iters=int(t["hc.iters"][0]), eps=float(t["hc.eps"][0]))
    out["hc.pre"], out["hc.post"], out["hc.comb"] = pre, post, comb.flatten(-2)


def probe_topk(t, out):
    out["topk.indices"] = k.stable_topk(t["topk.values"], int(t["topk.k"][0]), dim=-1).indices.to(torch.int64)


def probe_gemms(x, checkpoint: Path, names, out):
    torch.set_default_dtype(torch.bfloat16)   # model.py's default dtype: the GEMMs return bf16
    try:
        with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
            for name in names:
                w = f.get_tensor(name)
                s = f.get_tensor(name.removesuffix(".weight") + ".scale")
                width = w.shape[1] * (2 if w.dtype == torch.int8 else 1)   # FP4 packs two per byte
                qa, sa = k.act_quant(x[:, :width].to(torch.bfloat16))
                if w.dtype == torch.float8_e4m3fn:
                    y = k.fp8_gemm(qa, sa, w, s)
                elif w.dtype == torch.int8:
                    y = k.fp4_gemm(qa, sa, w, s)
                else:
                    raise ValueError(f"{name}: {w.dtype} is not an FP8 or packed-FP4 weight")
                out[f"gemm.{name}"] = y.to(torch.float32)
    finally:
        torch.set_default_dtype(torch.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, help="release-layout checkpoint directory (for gemm.x)")
    ap.add_argument("--weights", default="", help="comma-separated weight names (for gemm.x)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t = load_file(str(a.inputs))
    out = {}
    if "x" in t:
        probe_quant(t["x"], out)
    if "attn.q" in t:
        probe_attention(t, out)
    if "hc.mixes" in t:
        probe_hc(t, out)
    if "topk.values" in t:
        probe_topk(t, out)
    if "gemm.x" in t:
        if not a.checkpoint or not a.weights:
            ap.error("gemm.x needs --checkpoint and --weights")
        probe_gemms(t["gemm.x"], a.checkpoint, a.weights.split(","), out)
    save_file({n: v.contiguous() for n, v in out.items()}, str(a.out))
    print(f"kernel_probe: {len(out)} outputs, kernel calls {dict(k.CALLS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
