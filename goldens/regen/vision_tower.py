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
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from vision_preprocess import import_official  # noqa: E402

SCRIPT = "goldens/regen/vision_tower.py"

SMALL = dict(vision_n_layers=2, vision_dim=64, vision_n_heads=4, vision_inter_dim=96, vision_patch_size=14,
             vision_downsample_ratio=3, vision_max_n_token=40, vision_min_pixels=0, vision_max_wh_ratio=None,
             vision_rope_theta=10000.0, dim=128)
# `dim` is the language model's width (the aligner's output): that of the synthetic `tiny`
# presets, so the vision family can graft this tower onto a tiny checkpoint.


def run(vision, processor, dtype, seed, images, out: Path):
    """Build the tower under `dtype`, seed its weights, run it on each image; returns the
    weights (bf16) and writes IMAGE.DTYPE.safetensors."""
    import torch
    from safetensors.torch import save_file

    args = SimpleNamespace(**SMALL)
    torch.set_default_dtype(dtype)
    vit, aligner = vision.ViT(args), vision.Aligner(args)
    torch.manual_seed(seed)  # after construction: the same weights whatever the dtype
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
    outputs = []
    for image in images:
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = processor.load_image({"data": image.read_bytes()}, args)
        blocks, embed = [], []
        hooks = [b.register_forward_hook(lambda m, i, o: blocks.append(o.detach().clone())) for b in vit.blocks]
        hooks.append(vit.patch_embed.register_forward_hook(lambda m, i, o: embed.append(o.detach().clone())))
        with torch.no_grad():
            vit_out = vit(patches.to(dtype), n_vit_h, n_vit_w)
            aligned = aligner(vit_out, n_vit_h, n_vit_w)
        for h in hooks:
            h.remove()
        tensors = {"embed": embed[0], "vit": vit_out, "aligner": aligned}
        tensors.update({f"block.{i}": b for i, b in enumerate(blocks)})
        tensors = {k: v.contiguous() for k, v in tensors.items()}  # bf16 or f32, as computed
        flat = patches.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
        meta = {"image": image.name, "n_vit_h": str(n_vit_h), "n_vit_w": str(n_vit_w),
                "n_llm_h": str(n_llm_h), "n_llm_w": str(n_llm_w),
                "patches_sha256": hashlib.sha256(flat).hexdigest()}
        name = f"{image.stem}.{str(dtype).removeprefix('torch.')}.safetensors"
        save_file(tensors, str(out / name), metadata=meta)
        outputs.append(name)
        print(f"{name}: grid {n_vit_h}x{n_vit_w} -> {n_llm_h}x{n_llm_w}, aligner {tuple(aligned.shape)}")
    return weights, outputs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("images", nargs="+", type=Path)
    a = ap.parse_args(argv)
    import numpy as np
    import PIL
    import torch
    from safetensors.torch import save_file

    vision, vision_path = import_official(a.inference, "vision")
    processor, processor_path = import_official(a.inference, "image_processor")
    a.out.mkdir(parents=True, exist_ok=True)
    weights, outputs = run(vision, processor, torch.bfloat16, a.seed, a.images, a.out)
    weights_f32, more = run(vision, processor, torch.float32, a.seed, a.images, a.out)
    assert all(torch.equal(weights[k], weights_f32[k]) for k in weights), "weights depend on the dtype"
    save_file(weights, str(a.out / "weights.safetensors"), metadata={"config": json.dumps(SMALL)})
    provenance.write_sidecar(
        a.out / ("tower" + provenance.SUFFIX),
        description="The official vision.py (ViT + Aligner) on small seeded random weights (weights.safetensors, "
                    "release names) and the patches image_processor.load_image makes of corpus PNGs: patch embed, "
                    "every block, final norm and aligner outputs under torch's bf16 (upstream) and f32 (exact) "
                    "default dtypes; checked by conformance/tests/vision_preprocess.rs.",
        generator={"kind": "official-code", "name": "inference/vision.py",
                   "version": provenance.sha256_file(vision_path)[:8],
                   "environment": provenance.environment(pillow=PIL.__version__, torch=torch.__version__,
                                                         numpy=np.__version__)},
        command=f"python3 {SCRIPT} --inference <release inference/> --out {{out}} --seed {a.seed} "
                + " ".join(p.relative_to(provenance.repo_root()).as_posix() if p.resolve().is_relative_to(
                    provenance.repo_root()) else p.name for p in (x.resolve() for x in a.images)),
        inputs=[
            provenance.describe_input("script", Path(__file__)),
            provenance.describe_input("preprocess_script", Path(__file__).resolve().parent / "vision_preprocess.py"),
            *[provenance.describe_input(f"image_{i}", p) for i, p in enumerate(a.images)],
            {"name": "vision.py", "location": "external", "path": "inference/vision.py",
             "sha256": provenance.sha256_file(vision_path)},
            {"name": "image_processor.py", "location": "external", "path": "inference/image_processor.py",
             "sha256": provenance.sha256_file(processor_path)},
        ],
        outputs=["weights.safetensors", *outputs, *more])
    return 0


if __name__ == "__main__":
    sys.exit(main())
