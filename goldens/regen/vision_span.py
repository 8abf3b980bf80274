#!/usr/bin/env python3
"""Image spans in a prompt, from the official `image_processor.prepare_vl_inputs` (imported from a
directory the caller names, never copied here): each prompt is tokenized with the release
tokenizer and every `<｜deepseek_image｜>` marker is expanded into its image's span
`[START] ([IMAGE]*n_llm_w [NEWLINE])*n_llm_h [END]` (the image's grid from the official
preprocessing under the release `inference/config.json`). One prompt is a conversation with two
images rendered by the official `encoding.py`, so the DSML placeholder spelling is the one the
renderer writes.

`prepare_vl_inputs` takes a transformers tokenizer; the release `tokenizer_config.json` adds no
BOS and the post-processor adds nothing, so `tokenizers.Tokenizer.encode(prompt).ids` is what it
returns (the small adapter below gives it the three methods the official code calls).

With `--model DIR` (a checkpoint with its own `inference/config.json` and `tokenizer.json`, e.g.
`ds41 synth --preset vision --seed 7`) the prompts of SYNTHETIC run on that model instead: its
marker is whatever `image_token_id` names (511, the piece `vo`, in the synthetic `vision`
preset), so the span check needs no release files.

Writes --out/expected.json (schema ds41-vision-span/1): per case the prompt, its images (repo
paths), and either the expanded `tokens` and `token_types` (TEXT -1, START 0, IMAGE 1,
NEW_LINE 2, END 3) with each image's start, or the official code's `error`.

    python3 goldens/regen/vision_span.py --inference <release inference/> \
        --encoding <release encoding/> --tokenizer <release tokenizer.json> --out goldens/vision/span
"""
import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from vision_preprocess import import_official  # noqa: E402

SCRIPT = "goldens/regen/vision_span.py"
SCHEMA = "ds41-vision-span/1"
IMAGES = "goldens/vision/preprocess/images"
MARKER = "<｜deepseek_image｜>"

TWO_IMAGES = {
    "thinking_mode": "thinking",
    "reasoning_effort": 40,
    "messages": [
        {"role": "system", "content": "You describe pictures."},
        {"role": "user", "content": [
            {"type": "text", "text": "First this one:"},
            {"type": "image_url", "image_url": {"url": "a.png"}},
            {"type": "text", "text": "then this one:"},
            {"type": "image_url", "image_url": {"url": "b.png"}},
            {"type": "text", "text": "Which is wider?"},
        ]},
    ],
}


# Prompts for the synthetic `vision` preset, whose marker is the BPE piece `vo` (id 511).
SYNTHETIC = [
    ("two-images", "pa vo ta kavo", ["rgb8_601x599_odd.png", "rgb8_100x37_upscale.png"]),
    ("one-image-shrunk", "vo", ["rgb8_3000x1999_shrink.png"]),
    ("more-markers-than-images", "vo vo", ["rgb8_2x3.png"]),
]


def cases(encoding):
    """(name, prompt, images): prompts around markers, the images by corpus name."""
    rendered = encoding.encode_messages(TWO_IMAGES["messages"], thinking_mode=TWO_IMAGES["thinking_mode"],
                                        reasoning_effort=TWO_IMAGES["reasoning_effort"])
    assert rendered.count(MARKER) == 2, rendered
    return [
        ("dsml-two-images", rendered, ["rgb8_601x599_odd.png", "rgb8_37x100_upscale.png"]),
        ("marker-inside-words", f"Describe{MARKER}briefly, in one line.", ["rgb8_1333x2999_shrink.png"]),
        ("adjacent-markers", f"{MARKER}{MARKER}", ["rgb8_4096x64_shrink_wide.png", "grey8_1x1.png"]),
        ("text-only", "No picture here, just <image> and ｜deepseek_image｜ as text.", []),
        ("more-markers-than-images", f"{MARKER} and {MARKER}", ["rgb8_640x480.png"]),
        ("more-images-than-markers", f"Only {MARKER} once.", ["rgb8_640x480.png", "rgb8_2x3.png"]),
    ]


class Tokenizer:
    """What prepare_vl_inputs calls on a transformers tokenizer, over `tokenizers`."""

    unk_token_id = None

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as Hf
        self.hf = Hf.from_file(str(path))

    def convert_tokens_to_ids(self, token):
        return self.hf.token_to_id(token)

    def encode(self, text):
        return self.hf.encode(text).ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True)
    ap.add_argument("--encoding", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--model", type=Path, help="run SYNTHETIC on this checkpoint (its config and tokenizer)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    import PIL
    import tokenizers
    import torch

    processor, processor_path = import_official(a.inference, "image_processor")
    # image_processor imports IMAGE_PLACEHOLDER from `encoding` at call time.
    sys.path.insert(0, str(a.encoding))
    encoding, encoding_path = import_official(a.encoding, "encoding")
    sys.modules["encoding"] = encoding
    config_path = (a.model / "inference" if a.model else a.inference) / "config.json"
    config = json.loads(config_path.read_text())
    args = SimpleNamespace(**config, vision_enabled=config["vision_n_layers"] > 0)
    tokenizer_path = a.model / "tokenizer.json" if a.model else a.tokenizer
    if tokenizer_path is None:
        ap.error("give --tokenizer (the release tokenizer.json) or --model")
    tokenizer = Tokenizer(tokenizer_path)
    root = provenance.repo_root()
    out_cases = []
    for name, prompt, images in SYNTHETIC if a.model else cases(encoding):
        paths = [f"{IMAGES}/{i}" for i in images]
        records = [{"data": (root / p).read_bytes()} for p in paths]
        case = {"name": name, "prompt": prompt, "images": paths}
        try:
            tokens, types, inputs = processor.prepare_vl_inputs(prompt, records, tokenizer, args)
        except ValueError as e:
            case["error"] = str(e)
        else:
            case["tokens"] = [int(t) for t in tokens]
            case["token_types"] = [int(t) for t in types]
            case["image_starts"] = [int(i.start) for i in inputs or []]
        out_cases.append(case)
        print(f"{name}: {len(case.get('tokens', []))} tokens" + (f", error {case['error']!r}" if "error" in case else ""))
    a.out.mkdir(parents=True, exist_ok=True)
    expected = {"schema": SCHEMA, "image_token_id": args.image_token_id, "cases": out_cases}
    (a.out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False) + "\n", encoding="utf-8")
    provenance.write_sidecar(
        a.out / ("span" + provenance.SUFFIX),
        description="The official image_processor.prepare_vl_inputs on prompts with image markers (one rendered "
                    "by the official encoding.py with two images) and corpus PNGs, release tokenizer and "
                    "inference/config.json: expanded token ids and token types, or the official error; checked "
                    "by the vision family's span cases.",
        generator={"kind": "official-code", "name": "inference/image_processor.py",
                   "version": provenance.sha256_file(processor_path)[:8],
                   "environment": provenance.environment(pillow=PIL.__version__, torch=torch.__version__,
                                                         tokenizers=tokenizers.__version__)},
        command=f"python3 {SCRIPT} --inference <release inference/> --encoding <release encoding/> "
                + ("--model <ds41 synth --preset vision --seed 7> " if a.model else "--tokenizer <release tokenizer.json> ")
                + "--out {out}",
        inputs=[
            provenance.describe_input("script", Path(__file__)),
            {"name": "image_processor.py", "location": "external", "path": "inference/image_processor.py",
             "sha256": provenance.sha256_file(processor_path)},
            {"name": "encoding.py", "location": "external", "path": "encoding/encoding.py",
             "sha256": provenance.sha256_file(encoding_path)},
            {"name": "config.json", "location": "external", "path": "inference/config.json",
             "sha256": provenance.sha256_file(config_path)},
            {"name": "tokenizer.json", "location": "external", "path": "tokenizer.json",
             "sha256": provenance.sha256_file(tokenizer_path)},
        ],
        outputs=["expected.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
