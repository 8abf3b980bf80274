#!/usr/bin/env python3
"""The official vision tower and aligner (`inference/vision.py`, imported from a directory the
caller names, never copied here) on small random weights, for a per-block comparison with the
engine.

Builds `ViT` and `Aligner` under torch's bf16 default dtype (as the official model runs; or f32
with --dtype float32, the exact profile's oracle), with seeded random weights rounded to bf16, and runs them on the patches the official
`image_processor.load_image` makes of the given PNGs. Writes to --out:
  weights.safetensors  the tower by its release names (`vision.*`, `aligner.*`), BF16;
  IMAGE.safetensors    per image: `patches`, `embed`, each block's output `block.B`, `vit`, `aligner`
                       (F32 copies of the bf16 tensors) and the grid (metadata).

    python3 goldens/regen/vision_tower.py --inference <release inference/> --out DIR a.png b.png
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

SMALL = dict(vision_n_layers=2, vision_dim=64, vision_n_heads=4, vision_inter_dim=96, vision_patch_size=14,
             vision_downsample_ratio=3, vision_max_n_token=40, vision_min_pixels=0, vision_max_wh_ratio=None,
             vision_rope_theta=10000.0, dim=48)


def load(inference: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"ds41_official_{name}", inference / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="torch default dtype: bfloat16 as the official model runs, float32 for the exact profile")
    ap.add_argument("images", nargs="+", type=Path)
    a = ap.parse_args(argv)
    import torch
    from safetensors.torch import save_file

    vision = load(a.inference, "vision")
    processor = load(a.inference, "image_processor")
    args = SimpleNamespace(**SMALL)
    dtype = getattr(torch, a.dtype)
    torch.set_default_dtype(dtype)
    vit, aligner = vision.ViT(args), vision.Aligner(args)
    torch.manual_seed(a.seed)  # after construction: the same weights whatever the dtype
    weights = {}
    with torch.no_grad():
        for prefix, module in (("vision", vit), ("aligner", aligner)):
            for name, p in module.named_parameters():
                if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                    value = 1.0 + 0.1 * torch.randn(p.shape, dtype=torch.float32)
                else:
                    value = torch.randn(p.shape, dtype=torch.float32) / p.shape[-1] ** 0.5
                value = value.to(torch.bfloat16)
                p.copy_(value)  # norms stay f32 in the module, holding bf16 values
                weights[f"{prefix}.{name}"] = value.contiguous()
    a.out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(a.out / "weights.safetensors"), metadata={"config": json.dumps(SMALL)})
    for image in a.images:
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = processor.load_image({"data": image.read_bytes()}, args)
        blocks, embed = [], []
        hooks = [b.register_forward_hook(lambda m, i, o: blocks.append(o.detach().clone())) for b in vit.blocks]
        hooks.append(vit.patch_embed.register_forward_hook(lambda m, i, o: embed.append(o.detach().clone())))
        with torch.no_grad():
            out = vit(patches.to(dtype), n_vit_h, n_vit_w)
            aligned = aligner(out, n_vit_h, n_vit_w)
        for h in hooks:
            h.remove()
        tensors = {"patches": patches.float().contiguous(), "embed": embed[0].float().contiguous(),
                   "vit": out.float().contiguous(),
                   "aligner": aligned.float().contiguous()}
        tensors.update({f"block.{i}": b.float().contiguous() for i, b in enumerate(blocks)})
        meta = {"n_vit_h": str(n_vit_h), "n_vit_w": str(n_vit_w), "n_llm_h": str(n_llm_h), "n_llm_w": str(n_llm_w)}
        save_file(tensors, str(a.out / f"{image.stem}.safetensors"), metadata=meta)
        print(f"{image.name}: grid {n_vit_h}x{n_vit_w} -> {n_llm_h}x{n_llm_w}, aligner {tuple(aligned.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
