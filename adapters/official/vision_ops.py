"""The official adapter's vision requests (conformance/PROTOCOL.md `vision_preprocess`,
`vision_tower`, `vision_span`) on the release's own `image_processor.py`, `vision.py` and
(for spans) `encoding.py`, imported from the directories the caller names, never copied here.
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from protocol import Refused, Unsupported
from vision_span import Tokenizer as SpanTokenizer  # goldens/regen: what prepare_vl_inputs calls

# The preprocessing fields of a request's `config` / a config.json's `vision_config`, by their
# ModelArgs names.
HF_VISION = {
    "num_hidden_layers": "vision_n_layers", "hidden_size": "vision_dim",
    "num_attention_heads": "vision_n_heads", "intermediate_size": "vision_inter_dim",
    "patch_size": "vision_patch_size", "downsample_ratio": "vision_downsample_ratio",
    "max_image_tokens": "vision_max_n_token", "min_pixels": "vision_min_pixels",
    "max_wh_ratio": "vision_max_wh_ratio", "rope_theta": "vision_rope_theta",
}


def model_args(model_dir: Path):
    """ModelArgs' vision fields, `dim` and `image_token_id` of a checkpoint (its
    inference/config.json) or a weightless model directory (translated from config.json)."""
    inference = model_dir / "inference" / "config.json"
    if inference.is_file():
        cfg = json.loads(inference.read_text())
    else:
        path = model_dir / "config.json"
        if not path.is_file():
            raise Refused(f"{path}: missing")
        hf = json.loads(path.read_text())
        text = hf.get("text_config", hf)
        cfg = {"dim": text.get("hidden_size"), "image_token_id": hf.get("image_token_id", text.get("image_token_id"))}
        cfg.update({HF_VISION[k]: v for k, v in (hf.get("vision_config") or {}).items() if k in HF_VISION})
    cfg.setdefault("vision_n_layers", 0)
    return SimpleNamespace(**cfg, vision_enabled=cfg["vision_n_layers"] > 0)


class Vision:
    def __init__(self, import_official, inference: Path, encoding, bugs):
        self.processor, _ = import_official(inference, "image_processor")
        self.vision, _ = import_official(inference, "vision")
        if "vision-rope-swapped" in bugs:  # the 2-D rope's halves swapped: columns first
            real = self.vision.get_vision_cos_sin

            def swapped(*a):
                half = lambda t: torch.cat([t[..., t.shape[-1] // 2:], t[..., :t.shape[-1] // 2]], -1)  # noqa: E731
                return tuple(half(t) for t in real(*a))
            self.vision.get_vision_cos_sin = swapped
        self.spans = False
        if encoding is not None:
            encoding_module, _ = import_official(Path(encoding), "encoding")
            sys.modules["encoding"] = encoding_module  # prepare_vl_inputs imports it by name
            self.spans = True

    def capabilities(self):
        return ["vision.preprocess", "vision.tower"] + (["vision.span"] if self.spans else [])

    def _load(self, path, args):
        try:
            return self.processor.load_image({"data": Path(path).read_bytes()}, args)
        except Exception as e:  # PIL's decoder errors have no common base class
            raise Refused(f"{path}: {type(e).__name__}: {e}") from None

    def preprocess(self, req):
        c = req["config"]
        args = SimpleNamespace(vision_patch_size=c["patch_size"], vision_downsample_ratio=c["downsample_ratio"],
                               vision_max_n_token=c["max_image_tokens"], vision_min_pixels=c["min_pixels"],
                               vision_max_wh_ratio=c.get("max_wh_ratio"))
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = self._load(req["image"], args)
        p = args.vision_patch_size
        grid = [n_vit_h, n_vit_w, n_llm_h, n_llm_w, n_vit_h * p, n_vit_w * p]
        from safetensors.torch import save_file
        save_file({"patches": patches.contiguous(), "grid": torch.tensor(grid, dtype=torch.int64),
                   "token_types": self.processor.image_token_types(n_llm_h, n_llm_w)}, str(req["out"]))
        return {"patches": req["out"]}

    def span(self, req):
        if not self.spans:
            raise Unsupported("vision.span", "no --encoding directory (prepare_vl_inputs imports encoding.py)")
        model_dir = Path(req["model"])
        args = model_args(model_dir)
        records = [{"data": Path(p).read_bytes()} for p in req["images"]]
        try:
            tokens, types, _ = self.processor.prepare_vl_inputs(
                req["prompt"], records, SpanTokenizer(model_dir / "tokenizer.json"), args)
        except (ValueError, AssertionError) as e:
            raise Refused(f"{type(e).__name__}: {e}") from None
        return {"tokens": [int(t) for t in tokens], "token_types": [int(t) for t in types]}

    def tower(self, req):
        if req.get("numerics") != "upstream":
            raise Unsupported(f"numerics.{req.get('numerics')}", "the official code runs bf16 (upstream) only")
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file
        model_dir = Path(req["model"])
        args = model_args(model_dir)
        if not args.vision_enabled:
            raise Refused(f"{model_dir}: the model has no vision tower")
        vit, aligner = self.vision.ViT(args), self.vision.Aligner(args)
        index_path = model_dir / "model.safetensors.index.json"
        if index_path.is_file():
            index = json.loads(index_path.read_text())["weight_map"]
        else:  # one shard
            with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
                index = {name: "model.safetensors" for name in f.keys()}
        with torch.no_grad():
            for prefix, module in (("vision", vit), ("aligner", aligner)):
                for name, param in module.named_parameters():
                    full = f"{prefix}.{name}"
                    if full not in index:
                        raise Refused(f"{model_dir}: no tensor `{full}`")
                    with safe_open(str(model_dir / index[full]), "pt") as f:
                        param.copy_(f.get_tensor(full))
        patch_file = load_file(str(req["patches"]))
        patches, grid = patch_file["patches"], patch_file["grid"].tolist()
        n_h, n_w = int(grid[0]), int(grid[1])
        forced = load_file(str(req["replay"])) if req.get("replay") else None
        with torch.no_grad():
            embed = vit.patch_embed(patches.to(torch.get_default_dtype()))
            cos, sin = self.vision.get_vision_cos_sin(n_h, n_w, vit.rope_dim, vit.rope_theta)
            blocks, x = [], embed
            for b, block in enumerate(vit.blocks):
                if forced is not None:
                    x = forced["vision.embed"] if b == 0 else forced["vision.blocks"][b - 1]
                    x = x.to(embed.dtype)
                x = block(x, cos, sin)
                blocks.append(x)
            last = forced["vision.blocks"][-1].to(embed.dtype) if forced is not None else x
            norm = vit.norm(last)
            aligned = aligner(forced["vision.norm"].to(embed.dtype) if forced is not None else norm, n_h, n_w)
        out = {"vision.embed": embed, "vision.blocks": torch.stack(blocks), "vision.norm": norm,
               "vision.aligner": aligned}
        save_file({k: v.float().contiguous() for k, v in out.items()}, str(req["out"]))
        return {"trace": req["out"]}
