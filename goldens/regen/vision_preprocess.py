#!/usr/bin/env python3
"""The official image preprocessing on the project's own PNG corpus.

Writes a deterministic corpus of PNG files (our own encoder below: every colour type and bit
depth, interlaced or not, sizes from 1x1 to 100000x1, images that the official pipeline
upscales, shrinks, pads or leaves alone) and runs the release `inference/image_processor.py`'s
`load_image` (imported from a directory the caller names, never copied here) on each, under
several vision configs: the release `inference/config.json`, and variants that reach the
branches the release values do not (`max_wh_ratio` set; no upscale and a small token budget).

`expected.json` records, per (image, config): Pillow's mode of the opened file, the source size,
the grid (n_vit, n_llm, pixel size) and the sha256 of the patch tensor (bf16, little-endian
bytes, [n, 3, 14, 14] row-major), whole and per row of patches. engine/tests/vision_preprocess.rs
checks the engine against it, bit for bit.

    python3 goldens/regen/vision_preprocess.py --inference <release inference/> --out goldens/vision/preprocess
    python3 goldens/regen/vision_preprocess.py --inference <...> --out DIR --random 40 --seed 7
        (a random corpus instead, for a wider trial; nothing to commit)
"""
import argparse
import hashlib
import importlib.util
import json
import random
import struct
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

SCRIPT = "goldens/regen/vision_preprocess.py"
SCHEMA = "ds41-vision-preprocess/1"


# ---------------------------------------------------------------------------------------------
# A small PNG encoder (PNG spec, ISO/IEC 15948): per scanline the filter type (None, Sub, Up,
# Average, Paeth) with the least sum of absolute differences, one IDAT, zlib level 9. Adam7
# when asked.

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel

ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def _pack_row(samples, depth):
    """One scanline of samples (ints) at this bit depth, big-endian, MSB first."""
    if depth == 8:
        return bytes(samples)
    if depth == 16:
        return b"".join(struct.pack(">H", s) for s in samples)
    out, acc, n = bytearray(), 0, 0
    for s in samples:
        acc = (acc << depth) | s
        n += depth
        if n == 8:
            out.append(acc)
            acc, n = 0, 0
    if n:
        out.append(acc << (8 - n))
    return bytes(out)


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _filtered(line: bytes, prior: bytes, bpp: int, fast: bool) -> bytes:
    """The scanline under the filter type that minimises the sum of |signed bytes| (`fast`:
    Up, always; for the random corpus, whose files are not kept)."""
    n = len(line)
    if fast:
        return b"\2" + bytes((line[i] - prior[i]) & 0xFF for i in range(n))
    left = lambda i: line[i - bpp] if i >= bpp else 0  # noqa: E731
    upleft = lambda i: prior[i - bpp] if i >= bpp else 0  # noqa: E731
    candidates = [
        bytes(line),
        bytes((line[i] - left(i)) & 0xFF for i in range(n)),
        bytes((line[i] - prior[i]) & 0xFF for i in range(n)),
        bytes((line[i] - (left(i) + prior[i]) // 2) & 0xFF for i in range(n)),
        bytes((line[i] - _paeth(left(i), prior[i], upleft(i))) & 0xFF for i in range(n)),
    ]
    cost = [sum(v if v < 128 else 256 - v for v in c) for c in candidates]
    kind = cost.index(min(cost))
    return bytes([kind]) + candidates[kind]


def encode_png(width, height, depth, colour_type, pixels, *, palette=None, trns=None, interlace=False, fast=False):
    """pixels: rows of pixels, each a tuple of `CHANNELS[colour_type]` samples."""
    bpp = max(1, CHANNELS[colour_type] * depth // 8)

    def scanlines(xs, ys):
        raw = bytearray()
        prior = None
        for y in ys:
            line = _pack_row([s for x in xs for s in pixels[y][x]], depth)
            raw += _filtered(line, prior or bytes(len(line)), bpp, fast)
            prior = line
        return bytes(raw)

    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            xs, ys = range(x0, width, dx), range(y0, height, dy)
            if len(xs) and len(ys):
                raw += scanlines(xs, ys)
    else:
        raw = scanlines(range(width), range(height))
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, int(interlace)))
    if palette is not None:
        out += _chunk(b"PLTE", bytes(palette))
    if trns is not None:
        out += _chunk(b"tRNS", bytes(trns))
    return out + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


# ---------------------------------------------------------------------------------------------
# The corpus: integer-only pixel formulas (no libm), so the bytes are the same everywhere.

def lcg(seed):
    state = seed & 0xFFFFFFFF
    while True:
        state = (state * 1664525 + 1013904223) & 0xFFFFFFFF
        yield state >> 24


def rgb_scene(w, h, seed=0):
    """Gradients, a hard-edged checkerboard (overshoot and clipping), a noisy block."""
    noise = lcg(seed)
    nx0, ny0 = w // 4, h // 4  # a noise block of at most 48x48 pixels: high frequencies, small files
    rows = []
    for y in range(h):
        row = []
        for x in range(w):
            if nx0 <= x < nx0 + min(48, w // 4 + 1) and ny0 <= y < ny0 + min(48, h // 4 + 1):
                px = (next(noise), next(noise), next(noise))
            elif ((x // 3) + (y // 3)) % 2 == 0 and x * 2 > w:
                px = (255, 0, 255) if (x + y) % 5 else (0, 255, 0)
            else:
                px = ((x * 255) // max(w - 1, 1), (y * 255) // max(h - 1, 1), ((x + y + seed) * 7) % 256)
            row.append(px)
        rows.append(row)
    return rows


def grey_scene(w, h, maxval, seed=0):
    noise = lcg(seed)
    rows = []
    for y in range(h):
        row = []
        for x in range(w):
            if (x + y) % 7 == 0:
                v = next(noise) * maxval // 255
            else:
                v = ((x * 3 + y * 5) * maxval) // max(3 * w + 5 * h, 1)
            row.append((min(v, maxval),))
        rows.append(row)
    return rows


def with_alpha(rows, maxval=255):
    return [[px + (((x * 37 + y * 11) % (maxval + 1)),) for x, px in enumerate(row)] for y, row in enumerate(rows)]


def widen16(rows, seed=0):
    """8-bit samples -> 16 bits with varying low bytes (the low byte must not matter... or must)."""
    noise = lcg(seed)
    return [[tuple(s * 256 + next(noise) for s in px) for px in row] for row in rows]


def palette_scene(w, h, depth, n_entries, seed=0):
    noise = lcg(seed)
    top = (1 << depth) - 1
    return [[(((x + 2 * y) % (top + 1)) if (x * y) % 5 else next(noise) % (top + 1),) for x in range(w)] for y in range(h)]


def palette_bytes(n, seed=0):
    noise = lcg(seed)
    return [next(noise) for _ in range(3 * n)]


def all_levels(w, h):
    """Every 8-bit level, in blocks, so each normalised value is checked without a resize."""
    return [[(((y // 34) * 16 + (x // 34)) % 256,) for x in range(w)] for y in range(h)]


def corpus():
    """(name, png bytes, configs) for every committed test image."""
    R, W, S = "release", "wh_ratio_2", "small_budget"
    items = []

    def add(name, configs, *a, **k):
        items.append((name, encode_png(*a, **k), configs))

    add("grey8_1x1", [R, W, S], 1, 1, 8, 0, [[(200,)]])
    add("rgb8_2x3", [R, W, S], 2, 3, 8, 2, rgb_scene(2, 3, 1))
    add("rgb8_13x7", [R, W, S], 13, 7, 8, 2, rgb_scene(13, 7, 2))
    add("grey8_546x546_all_levels", [R], 546, 546, 8, 0, all_levels(546, 546))
    add("rgb8_700x560_exact_grid", [R], 700, 560, 8, 2, rgb_scene(700, 560, 3))
    add("rgb8_700x555_pad_only", [R], 700, 555, 8, 2, rgb_scene(700, 555, 4))
    add("rgb8_640x480", [R, W], 640, 480, 8, 2, rgb_scene(640, 480, 5))
    add("rgb8_100x37_upscale", [R, W, S], 100, 37, 8, 2, rgb_scene(100, 37, 6))
    add("rgb8_37x100_upscale", [R, W, S], 37, 100, 8, 2, rgb_scene(37, 100, 7))
    add("rgb8_1000x10_wide", [R, W, S], 1000, 10, 8, 2, rgb_scene(1000, 10, 8))
    add("rgb8_10x1000_tall", [R, W, S], 10, 1000, 8, 2, rgb_scene(10, 1000, 9))
    add("rgb8_4096x64_shrink_wide", [R, W], 4096, 64, 8, 2, rgb_scene(4096, 64, 10))
    add("grey8_1x3000_single_column", [R, S], 1, 3000, 8, 0, grey_scene(1, 3000, 255, 11))
    add("grey8_20000x1_single_row", [R, W, S], 20000, 1, 8, 0, grey_scene(20000, 1, 255, 12))
    add("grey8_100000x1_all_pad", [R], 100000, 1, 8, 0, grey_scene(100000, 1, 255, 13))
    add("rgb8_2048x2048_shrink", [R], 2048, 2048, 8, 2, rgb_scene(2048, 2048, 14))
    add("rgb8_3000x1999_shrink", [R, W], 3000, 1999, 8, 2, rgb_scene(3000, 1999, 15))
    add("rgb8_1333x2999_shrink", [R], 1333, 2999, 8, 2, rgb_scene(1333, 2999, 16))
    add("rgb8_601x599_odd", [R, S], 601, 599, 8, 2, rgb_scene(601, 599, 17))
    # tall and shrunk: Pillow 13 resizes these vertically first
    add("rgb8_900x2500_tall_shrink", [R, W], 900, 2500, 8, 2, rgb_scene(900, 2500, 18))
    add("rgb8_60x900_tall_shrink", [S], 60, 900, 8, 2, rgb_scene(60, 900, 19))
    # every colour type and bit depth
    add("grey1_97x61", [R, S], 97, 61, 1, 0, grey_scene(97, 61, 1, 20))
    add("grey2_97x61", [R], 97, 61, 2, 0, grey_scene(97, 61, 3, 21))
    add("grey4_97x61", [R], 97, 61, 4, 0, grey_scene(97, 61, 15, 22))
    add("grey16_97x61_clamped", [R, S], 97, 61, 16, 0, grey_scene(97, 61, 65535, 23))
    add("grey16_80x50_low_values", [R], 80, 50, 16, 0, grey_scene(80, 50, 400, 24))
    add("grey8_trns_60x40", [R], 60, 40, 8, 0, grey_scene(60, 40, 255, 25), trns=[0, 77])
    add("greyalpha8_90x70", [R, S], 90, 70, 8, 4, with_alpha(grey_scene(90, 70, 255, 26)))
    add("greyalpha16_90x70", [R], 90, 70, 16, 4, widen16(with_alpha(grey_scene(90, 70, 255, 27)), 27))
    add("rgb16_90x70", [R, S], 90, 70, 16, 2, widen16(rgb_scene(90, 70, 28), 28))
    add("rgb8_trns_60x40", [R], 60, 40, 8, 2, rgb_scene(60, 40, 29), trns=[0, 0, 0, 255, 0, 255])
    add("rgba8_90x70", [R, S], 90, 70, 8, 6, with_alpha(rgb_scene(90, 70, 30)))
    add("rgba16_90x70", [R], 90, 70, 16, 6, widen16(with_alpha(rgb_scene(90, 70, 31)), 31))
    for depth in (1, 2, 4, 8):
        n = {1: 2, 2: 3, 4: 11, 8: 200}[depth]  # fewer entries than indices: the rest are black
        add(f"palette{depth}_83x59_short_plte", [R, S], 83, 59, depth, 3, palette_scene(83, 59, depth, n, 40 + depth),
            palette=palette_bytes(n, 50 + depth))
    add("palette8_trns_64x48", [R], 64, 48, 8, 3, palette_scene(64, 48, 8, 256, 60),
        palette=palette_bytes(256, 61), trns=[(i * 13) % 256 for i in range(100)])
    add("palette4_single_trns_64x48", [R], 64, 48, 4, 3, palette_scene(64, 48, 4, 16, 62),
        palette=palette_bytes(16, 63), trns=[255, 255, 0])
    # Adam7
    add("rgb8_interlaced_7x5", [R, S], 7, 5, 8, 2, rgb_scene(7, 5, 70), interlace=True)
    add("rgb8_interlaced_301x203", [R], 301, 203, 8, 2, rgb_scene(301, 203, 71), interlace=True)
    add("palette2_interlaced_33x17", [R], 33, 17, 2, 3, palette_scene(33, 17, 2, 4, 72), palette=palette_bytes(4, 73),
        interlace=True)
    add("greyalpha16_interlaced_21x23", [R], 21, 23, 16, 4, widen16(with_alpha(grey_scene(21, 23, 255, 74)), 74),
        interlace=True)
    return items


def random_corpus(n, seed):
    """A random corpus for a wider, uncommitted trial: random sizes, colour types and depths."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        w = rng.choice([rng.randint(1, 40), rng.randint(40, 900), rng.randint(1, 2000)])
        h = rng.choice([rng.randint(1, 40), rng.randint(40, 900), max(1, 400_000 // max(w, 1) + rng.randint(-50, 50))])
        h = max(1, min(h, 2000))
        kind = rng.choice(["rgb8", "grey8", "rgba8", "palette4", "grey16", "rgb16"])
        s = rng.randrange(1 << 30)
        if kind == "rgb8":
            png = encode_png(w, h, 8, 2, rgb_scene(w, h, s), interlace=rng.random() < 0.2, fast=True)
        elif kind == "grey8":
            png = encode_png(w, h, 8, 0, grey_scene(w, h, 255, s), fast=True)
        elif kind == "rgba8":
            png = encode_png(w, h, 8, 6, with_alpha(rgb_scene(w, h, s)), fast=True)
        elif kind == "palette4":
            png = encode_png(w, h, 4, 3, palette_scene(w, h, 4, 16, s), palette=palette_bytes(12, s), fast=True)
        elif kind == "grey16":
            png = encode_png(w, h, 16, 0, grey_scene(w, h, 1023, s), fast=True)
        else:
            png = encode_png(w, h, 16, 2, widen16(rgb_scene(w, h, s), s), fast=True)
        items.append((f"random{i:03d}_{kind}_{w}x{h}", png, [rng.choice(["release", "release", "wh_ratio_2", "small_budget"])]))
    return items


# ---------------------------------------------------------------------------------------------

VISION_KEYS = ["vision_patch_size", "vision_downsample_ratio", "vision_max_n_token", "vision_min_pixels",
               "vision_max_wh_ratio"]


def configs(inference: Path):
    release = json.loads((inference / "config.json").read_text())
    base = {k: release[k] for k in VISION_KEYS}
    return {
        "release": base,
        "wh_ratio_2": {**base, "vision_max_wh_ratio": 2},
        "small_budget": {**base, "vision_min_pixels": 0, "vision_max_n_token": 40},
    }


def import_official(inference: Path, name: str):
    """The release's `inference/NAME.py` as a module, and its path."""
    path = inference / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"no {name}.py in {inference}")
    spec = importlib.util.spec_from_file_location(f"ds41_official_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def run_official(processor, png: bytes, config: dict):
    import io

    import torch
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        mode, size = im.mode, im.size
    patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = processor.load_image({"data": png}, SimpleNamespace(**config))
    assert patches.dtype == torch.bfloat16
    flat = patches.contiguous().view(torch.int16).numpy().astype("<i2")
    per_row = flat.reshape(n_vit_h, -1) if n_vit_h else flat.reshape(0, 0)
    p = config["vision_patch_size"]
    return {
        "pillow_mode": mode,
        "source_size": list(size),
        "n_vit": [n_vit_h, n_vit_w],
        "n_llm": [n_llm_h, n_llm_w],
        "pixel_size": [n_vit_h * p, n_vit_w * p],
        "patches_shape": list(patches.shape),
        "patches_sha256": hashlib.sha256(flat.tobytes()).hexdigest(),
        # one short digest per row of patches, to name where a mismatch starts
        "row_sha256_16": [hashlib.sha256(r.tobytes()).hexdigest()[:16] for r in per_row],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="the release inference/ directory")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--random", type=int, help="write a random corpus of this many images instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of --random")
    a = ap.parse_args(argv)
    import numpy as np
    import PIL
    import torch

    processor, processor_path = import_official(a.inference, "image_processor")
    cfgs = configs(a.inference)
    items = random_corpus(a.random, a.seed) if a.random else corpus()
    (a.out / "images").mkdir(parents=True, exist_ok=True)
    cases = []
    for name, png, used in items:
        rel = f"images/{name}.png"
        (a.out / rel).write_bytes(png)
        for cfg in used:
            case = {"image": rel, "config": cfg, "png_sha256": hashlib.sha256(png).hexdigest()}
            case.update(run_official(processor, png, cfgs[cfg]))
            cases.append(case)
    record = {
        "schema": SCHEMA,
        "pillow": PIL.__version__,
        "configs": cfgs,
        "cases": cases,
    }
    (a.out / "expected.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{len(items)} images, {len(cases)} cases -> {a.out}")
    if a.random:
        return 0
    outputs = sorted(p.relative_to(a.out).as_posix() for p in a.out.rglob("*")
                     if p.is_file() and not p.name.endswith(provenance.SUFFIX))
    provenance.write_sidecar(
        a.out / ("preprocess" + provenance.SUFFIX),
        description="The project's PNG corpus (written by the script) and the official image_processor.load_image's "
                    "patch tensors on it (sha256, whole and per patch row) under the release vision config and two "
                    "variants; checked by engine/tests/vision_preprocess.rs.",
        generator={"kind": "official-code", "name": "inference/image_processor.py",
                   "version": provenance.sha256_file(processor_path)[:8],
                   "environment": provenance.environment(pillow=PIL.__version__, torch=torch.__version__,
                                                         numpy=np.__version__)},
        command=f"python3 {SCRIPT} --inference <release inference/> --out {{out}}",
        inputs=[
            {"name": "inference_config", "location": "release", "path": "inference/config.json",
             "sha256": provenance.sha256_file(a.inference / "config.json")},
            provenance.describe_input("script", Path(__file__)),
            {"name": "image_processor.py", "location": "external", "path": "inference/image_processor.py",
             "sha256": provenance.sha256_file(processor_path)},
        ],
        outputs=outputs,
        errata={"vision_resampling": "pil", "vision_image_decoding": "png-only", "vision_grey16_clamp": "clamp"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
