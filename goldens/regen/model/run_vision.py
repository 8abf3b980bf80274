#!/usr/bin/env python3
"""Vision-language goldens from the official DS41 code: run the release `inference/model.py`
(with its `vision.py` and `image_processor.py`) on CPU over a release-layout checkpoint with a
vision tower, on a prompt whose image markers are expanded to image spans exactly as
`image_processor.prepare_vl_inputs` does (the official `load_image` makes the patches of own PNG
files, `image_token_types` the spans), prefilled at position 0 with `images` and `token_types`,
then single-token decode steps. Dumps a trace (docs/TRACE.md, "Vision").

Everything around model.py is run_official.py's (pins, convert.py, CPU kernels, deterministic
top-k, the per-layer recorder and teacher-forced replay); in addition hooks record, per image,
the patches (`vision.I{i}.patches`, F32 copies of the bf16 values), the patch embedding, every
ViT block's output, the final norm (`vit`), the aligner's rows and the grid
(`vision.I{i}.grid` = [span start, n_vit_h, n_vit_w, n_llm_h, n_llm_w]), and the sequence's
`token_types` (TEXT -1, IMAGE_START 0, IMAGE 1, IMAGE_NEW_LINE 2, IMAGE_END 3).

  python3 goldens/regen/model/run_vision.py --inference RELEASE/inference \\
      --checkpoint /tmp/vision --tokens 3,7,511,11,5 --image a.png --prefill 4 --out /tmp/v.safetensors

(`--tokens` holds one `image_token_id` marker per `--image`, in order; `--prefill` counts the
given tokens, a marker as one, and must cover every marker.) The committed set (SETS below) is
remade by

  python3 goldens/regen/model/run_vision.py --inference RELEASE/inference --ds41 target/release/ds41 \\
      --sets goldens/official

which writes goldens/official/NAME/SCHEDULE.safetensors with provenance.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import provenance  # noqa: E402
import run_official as ro  # noqa: E402

IMAGES = REPO / "goldens" / "vision" / "preprocess" / "images"
# Calibration only: other valid orders for the ViT's attention (torch's bf16 CPU flash kernel
# sums its exponentials and p @ v in its own blocked order with a fast exp); the language model
# is left alone.
VISION_STANDINS = {
    "vision-sdpa-f64": "the ViT's scaled_dot_product_attention computed in f64 (two-pass softmax), rounded once",
}
# name -> preset, seed, prompt (ids; "IMG" = the image marker), images (under IMAGES), prefill
# (given tokens, a marker as one)
SETS = {
    "vision_s7": {
        "preset": "vision", "seed": 7,
        "prompt": [412, 96, 301, 77, 45, "IMG", 260, 33, 412, 96, "IMG", 301, 77, 18, 205, 9, 140, 333, 61, 260, 33],
        "images": ["rgb8_601x599_odd.png", "rgb8_100x37_upscale.png"],
        "prefills": [15],
        "about": "two images: 601x599 shrunk to an 11x11 ViT grid (aligner pads to 12x12; 4x4 tokens, span 22) and "
                 "100x37 on a 3x8 grid (pads the width to 9; 1x3 tokens, span 6); text before, between and after "
                 "them, the trigram (412, 96, 301) before the first span repeated across the second (Engram "
                 "history stops at each DEAD span); prefill of 41 positions (window 16 wraps inside the first "
                 "span) then 6 decode steps",
    },
}


class VisionRecorder:
    """Per image: patches, patch embedding, block outputs, final norm, aligner rows."""

    def __init__(self, model):
        self.images = []
        self.current = None
        vit = model.vision
        vit.patch_embed.register_forward_hook(lambda m, a, o: self._put("embed", o))
        for block in vit.blocks:
            block.register_forward_hook(lambda m, a, o: self.current.setdefault("blocks", []).append(self._f32(o)))
        vit.norm.register_forward_hook(lambda m, a, o: self._put("vit", o))
        model.aligner.register_forward_hook(lambda m, a, o: self._put("aligner", o))
        real = model.encode_image

        def encode_image(patches, n_vit_h, n_vit_w):
            self.current = {"patches": self._f32(patches.flatten(1)), "vit_grid": (n_vit_h, n_vit_w)}
            out = real(patches, n_vit_h, n_vit_w)
            self.images.append(self.current)
            self.current = None
            return out
        model.encode_image = encode_image

    @staticmethod
    def _f32(t):
        return t.detach().to(torch.float32).clone()

    def _put(self, name, value):
        if self.current is not None:
            self.current[name] = self._f32(value)


def vl_inputs(processor, prompt, image_paths, image_token_id, args):
    """prepare_vl_inputs on token ids: each marker becomes its image's span."""
    tokens, types, inputs = [], [], []
    paths = iter(image_paths)
    for tok in prompt:
        if tok != image_token_id:
            tokens.append(tok)
            types.append(processor.TEXT)
            continue
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = processor.load_image({"data": next(paths).read_bytes()}, args)
        span = processor.image_token_types(n_llm_h, n_llm_w)
        inputs.append(processor.ImageInput(len(tokens), patches, n_vit_h, n_vit_w, span))
        tokens += [image_token_id] * span.numel()
        types += span.tolist()
    return tokens, types, inputs


def run(module, processor, args, state_dict, prompt, image_paths, prefill, threads, tokenizer, forcing=None,
        standin=None):
    """The schedule with images at position 0; returns the trace tensors."""
    image_token_id = args.image_token_id
    if prompt.count(image_token_id) != len(image_paths):
        raise ro.DriverError(f"{prompt.count(image_token_id)} markers for {len(image_paths)} images")
    if image_token_id in prompt[prefill:]:
        raise ro.DriverError("an image marker lies after the prefill: spans must lie in the first chunk")
    tokens, types, inputs = vl_inputs(processor, prompt, image_paths, image_token_id, args)
    expanded_prefill = prefill + sum(int(i.types.numel()) - 1 for i in inputs)
    recorders = []
    real_load = ro.load_model

    def load_model(*a, **k):
        model = real_load(*a, **k)
        recorders.append(VisionRecorder(model))
        return model

    real_forward = module.Transformer.forward

    def forward(self, input_ids, start_pos=0, images=None, token_types=None):
        if start_pos == 0:  # the prefill: the whole chunk, spans in it
            images = [inputs]
            token_types = torch.tensor([types[:input_ids.shape[1]]], dtype=torch.int64)
        return real_forward(self, input_ids, start_pos, images, token_types)

    ro.load_model, module.Transformer.forward = load_model, forward
    vision = sys.modules.get("vision")
    real_sdpa = vision.F.scaled_dot_product_attention if vision is not None else None
    if standin in VISION_STANDINS:
        def sdpa(q, k, v):
            w = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
            return (w.softmax(-1) @ v.double()).to(q.dtype)
        vision.F.scaled_dot_product_attention = sdpa
        standin = None
    try:
        out = ro.run(module, args, state_dict, tokens, expanded_prefill, "as-shipped", threads, tokenizer,
                     forcing=forcing, standin=standin)
    finally:
        ro.load_model, module.Transformer.forward = real_load, real_forward
        if vision is not None:
            vision.F.scaled_dot_product_attention = real_sdpa
    out["token_types"] = torch.tensor(types, dtype=torch.int64)
    for i, (image, rec) in enumerate(zip(inputs, recorders[0].images)):
        n_llm_h = int((image.types == processor.IMAGE_NEW_LINE).sum())  # one NEWLINE per token row
        n_llm_w = int((image.types == processor.IMAGE).sum()) // n_llm_h
        out[f"vision.I{i}.grid"] = torch.tensor([image.start, image.n_vit_h, image.n_vit_w, n_llm_h, n_llm_w])
        for name in ("patches", "embed", "vit", "aligner"):
            out[f"vision.I{i}.{name}"] = rec[name]
        out[f"vision.I{i}.blocks"] = torch.stack(rec["blocks"])
    return out, expanded_prefill


def import_processor(inference: Path):
    sys.path.insert(0, str(inference))
    import image_processor
    return image_processor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="the release inference/ directory")
    ap.add_argument("--checkpoint", type=Path, help="release-layout checkpoint with a vision tower")
    ap.add_argument("--tokens", help="comma-separated token ids, one image_token_id marker per --image")
    ap.add_argument("--image", type=Path, action="append", default=[], help="a PNG, in marker order")
    ap.add_argument("--prefill", type=int, help="given tokens in the first forward (default: all)")
    ap.add_argument("--sets", type=Path, help="remake the committed sets (SETS) under this directory")
    ap.add_argument("--set", action="append", choices=sorted(SETS), help="with --sets: only these (default: all)")
    ap.add_argument("--ds41", default="ds41", help="with --sets: the ds41 binary (for `ds41 synth`)")
    ap.add_argument("--replay", type=Path, help="teacher-forced from this golden's block inputs")
    ap.add_argument("--standin", choices=sorted({**ro.STANDINS, **VISION_STANDINS}),
                    help="calibration only: another valid summation order (run_official.py STANDINS)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", choices=sorted(ro.KERNELS), default="tt-metal")
    ap.add_argument("--allow-unpinned", action="store_true")
    ap.add_argument("--provenance", action="store_true", help="write OUT.provenance.json")
    ap.add_argument("--synth-command", help="the `ds41 synth ...` command that made --checkpoint (recorded)")
    ap.add_argument("--synth-preset"), ap.add_argument("--synth-seed", type=int)
    a = ap.parse_args(argv)
    if a.sets:
        return make_sets(a)
    if not (a.checkpoint and a.tokens and a.out):
        ap.error("--checkpoint, --tokens and --out are required (or --sets)")

    from safetensors.torch import load_file, save_file
    prompt = [int(t) for t in a.tokens.split(",") if t.strip()]
    prefill = a.prefill or len(prompt)
    if not 1 <= prefill <= len(prompt):
        ap.error(f"--prefill {prefill} outside 1..{len(prompt)}")
    inference = a.inference.resolve()
    try:
        pins = ro.verify_pins(inference, a.allow_unpinned)
        cfg = json.loads((a.checkpoint / "inference" / "config.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            converted = ro.convert_checkpoint(inference, a.checkpoint.resolve(), Path(tmp), ro.DEFAULT_CONVERT)
            state = load_file(str(converted))
        kernels, kernels_path = ro.kernel_module(inference, a.kernels)
        module = ro.import_model(inference, kernels)
        processor = import_processor(inference)
        model_args, _ = ro.build_args(module, cfg, len(prompt) + 1024 * len(a.image))
        if not model_args.vision_enabled:
            raise ro.DriverError("the checkpoint's config has no vision tower (vision_n_layers 0)")
        tokenizer = ro.FastTokenizer(a.checkpoint / "tokenizer.json") if model_args.engram_layer_ids else None
        forcing = load_file(str(a.replay)) if a.replay else None
        tensors, expanded_prefill = run(module, processor, model_args, state, prompt, a.image, prefill, a.threads,
                                        tokenizer, forcing, a.standin)
    except ro.DriverError as e:
        print(f"run_vision: error: {e}", file=sys.stderr)
        return 2
    n = len(tensors["input_ids"])
    extra = {name: provenance.sha256_file(inference / name) for name in ("vision.py", "image_processor.py")}
    metadata = {  # docs/TRACE.md keys, then what only this producer knows
        "engine": f"official inference/model.py (CPU, {a.kernels} kernels)", "version": pins["model.py"][:12],
        "layout": "release", "numerics": "upstream", "index-k": "as-shipped",
        "tie_rule": "largest first; equal values -> lower index",
        "topk_convention": "compressed positions (no window offset), ascending, -1 = none",
        "logits_rows": "row 0 = prefill (last position), row i = decode step i",
        "prefill": str(expanded_prefill), "decode_steps": str(n - expanded_prefill),
        "mode": "replay" if a.replay else "forward", "images": str(len(a.image)),
        "format": ro.TRACE_FORMAT, "model_py_sha256": pins["model.py"],
        "vision_py_sha256": extra["vision.py"], "image_processor_py_sha256": extra["image_processor.py"],
        "kernels": a.kernels, "kernels_sha256": provenance.sha256_file(kernels_path),
        "torch": torch.__version__, "threads": str(a.threads),
        **({"standin": a.standin} if a.standin else {}),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    old = load_file(str(a.out)) if a.out.exists() else None
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(a.out), metadata=metadata)
    print(provenance.report_tensor_changes(a.out, old, tensors))
    if a.provenance:
        ckpt_input = provenance.describe_input("checkpoint", a.checkpoint)
        if a.synth_command:
            ckpt_input = {"name": "checkpoint", "location": "generated", "path": a.checkpoint.name,
                          "sha256": ckpt_input["sha256"], "command": a.synth_command}
        inputs = [ckpt_input] + [
            {"name": n, "location": "external", "path": f"inference/{n}", "sha256": h}
            for n, h in {**pins, **extra}.items()
        ] + [{"name": "kernel_cpu.py", "location": "external", "path": "inference/kernel_cpu.py",
              "sha256": provenance.sha256_file(kernels_path)}]
        inputs += [provenance.describe_input(f"image{i}", p) for i, p in enumerate(a.image)]
        inputs += [provenance.describe_input("driver", HERE / "run_vision.py"),
                   provenance.describe_input("driver_base", HERE / "run_official.py"),
                   provenance.describe_input("kernels_ds41", HERE / "ds41_kernels.py")]
        images = " ".join(f"--image {{input:image{i}}}" for i in range(len(a.image)))
        provenance.write_sidecar(
            a.out.with_name(a.out.name + provenance.SUFFIX),
            description=f"Vision-language trace of the official model.py on CPU ({a.kernels} kernels): prompt "
                        f"{a.tokens} with {len(a.image)} image(s) expanded to spans, prefill {expanded_prefill} "
                        f"positions then decode; per-image tower and aligner outputs.",
            generator={"kind": "official-code", "name": "inference/model.py", "version": pins["model.py"][:12],
                       "environment": provenance.environment(torch=torch.__version__, threads=a.threads)},
            command=(f"python3 goldens/regen/model/run_vision.py --inference <release>/inference "
                     f"--checkpoint {{input:checkpoint}} --tokens {a.tokens} {images} --prefill {prefill} "
                     f"--kernels {a.kernels} --out {{out}}/{a.out.name}"),
            inputs=inputs, outputs=[a.out.name],
            synthetic={"preset": a.synth_preset, "seed": a.synth_seed} if a.synth_preset else None,
            errata={"topk_tie_order": "lower-index", "gemm_summation_order": "canonical",
                    "sparse_attn_block_layout": "as-laid-out", "vision_attention_order": "torch-cpu-flash"},
        )
    return 0


def prompt_ids(spec, image_token_id):
    return [image_token_id if t == "IMG" else t for t in spec["prompt"]]


def make_sets(a):
    """Synthesise each set's checkpoint and run this script on it for every schedule."""
    import subprocess
    for name in a.set or sorted(SETS):
        spec = SETS[name]
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp) / f"{spec['preset']}-seed{spec['seed']}"
            subprocess.run([a.ds41, "synth", "--preset", spec["preset"], "--layout", "release", "--seed",
                            str(spec["seed"]), "--out", str(ckpt)], check=True, capture_output=True)
            synth = f"ds41 synth --preset {spec['preset']} --layout release --seed {spec['seed']} --out {{out}}"
            marker = json.loads((ckpt / "inference" / "config.json").read_text())["image_token_id"]
            prompt = prompt_ids(spec, marker)
            for prefill in spec["prefills"]:
                out = a.sets / name / f"p{prefill:02d}_d{len(prompt) - prefill:02d}.safetensors"
                argv = ["--inference", str(a.inference), "--checkpoint", str(ckpt),
                        "--tokens", ",".join(map(str, prompt)), "--prefill", str(prefill), "--kernels", a.kernels,
                        "--out", str(out), "--provenance", "--synth-command", synth,
                        "--synth-preset", spec["preset"], "--synth-seed", str(spec["seed"])]
                for image in spec["images"]:
                    argv += ["--image", str(IMAGES / image)]
                if main(argv) != 0:
                    return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
