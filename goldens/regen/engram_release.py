#!/usr/bin/env python3
"""Full-size Engram hash goldens (MODEL.md §6.6.1) made by the official `engram.py` from the
release's own files: `inference/config.json` (the ModelArgs names) and `tokenizer.json`.

Builds the official `EngramLayout` and `NgramHashState` exactly as `model.py` does (the
tokenizer presented as the release loads it, see engram_token_map.py) and writes, into --out:

* `release_constants.json`: the hashing constants the official module holds (primes per layer,
  n-gram size and head; offsets; multipliers; their bound; prime sums; compressed vocab size;
  pad id) and the sha256 of the compressed token map (raw little-endian int32 payload);
* `release_token_map_int32.npy`: that token map, token id -> compressed id (int32 [vocab]);
* `release_hashes_NAME.json`: for each probe text (BOS + the text's ids, no special tokens added),
  `input_ids` [1, S], the hash ids of a prefill of `prefill` tokens followed by single-token
  decode steps (`hash_prefill_then_decode`, asserted equal to one full prefill), the same with
  the positions `dead_positions` marked DEAD (an image span: `hash_with_dead`), `layout`.

Nothing is vendored: --inference names a directory holding the release `engram.py`.

    python3 goldens/regen/engram_release.py --inference RELEASE/inference --release SNAPSHOT \\
        --out goldens/engram --provenance
"""
import argparse
import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from engram_token_map import ReleaseTokenizer, import_engram  # noqa: E402

SCRIPT = "goldens/regen/engram_release.py"

# The project's own probe texts: case and accent variants that the compressed map folds
# together, whitespace runs, digits, punctuation, CJK and an emoji (byte-fallback tokens).
PROBES = [
    {
        "name": "folding",
        "text": "Été, ÉTÉ and été:  the THE The\tthé — naïve NAÏVE café 2026-12-01; 東京タワー ☕ ok?",
        "prefill": 7,
        "dead_positions": [9, 10, 11],
    },
    {
        "name": "code",
        "text": "def f(x):\n    return x**2  # square\n\nprint(f(12)) ~> 144\r\n",
        "prefill": 1,
        "dead_positions": [0, 1, 17],
    },
]


def release_input(name: str, path: Path, rel: str) -> dict:
    """A release file as a provenance input (location `release`: verified against the snapshot)."""
    return {"name": name, "location": "release", "path": rel, "sha256": provenance.sha256_file(path)}


def model_args(config: dict, max_seq_len: int):
    """The ModelArgs fields NgramHashState reads, from the release inference/config.json."""
    keys = ["engram_layer_ids", "engram_max_ngram_size", "engram_n_heads", "engram_vocab_size",
            "engram_num_embeddings", "engram_head_dim", "engram_compressed_vocab_size", "engram_pad_id"]
    missing = [k for k in keys if k not in config]
    if missing:
        raise SystemExit(f"engram_release: inference/config.json lacks {missing}")
    return types.SimpleNamespace(**{k: config[k] for k in keys}, max_batch_size=1, max_seq_len=max_seq_len)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="directory holding the release engram.py")
    ap.add_argument("--release", type=Path, required=True, help="release snapshot (tokenizer.json, inference/config.json)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--provenance", action="store_true")
    a = ap.parse_args(argv)
    import torch
    from tokenizers import Tokenizer

    engram = import_engram(a.inference)
    config_path = a.release / "inference" / "config.json"
    tokenizer_path = a.release / "tokenizer.json"
    config = json.loads(config_path.read_text())
    args = model_args(config, max_seq_len=256)
    layout = engram.EngramLayout.from_args(args)
    state = engram.NgramHashState(args, layout, ReleaseTokenizer(tokenizer_path))
    token_map = state.token_map.numpy().astype("<i4")
    tok = Tokenizer.from_file(str(tokenizer_path))
    bos = tok.token_to_id("<｜begin▁of▁sentence｜>")
    if bos is None:
        raise SystemExit("engram_release: tokenizer.json has no BOS token")

    primes = [[list(map(int, per_n)) for per_n in layer] for layer in layout.primes]
    constants = {
        "layer_ids": list(layout.layer_ids),
        "max_ngram_size": layout.max_ngram_size,
        "n_heads": layout.n_heads,
        "engram_vocab_size": args.engram_vocab_size,
        "column_order": "col = (n - 2) * n_heads + head",
        "primes": primes,
        "offsets": state.offsets.tolist(),
        "prime_sums": [sum(p for per_n in layer for p in per_n) for layer in primes],
        "multipliers": state.multipliers.tolist(),
        "compressed_vocab_size": int(token_map.max()) + 1,
        "bound": int(max(1, (np.iinfo(np.int64).max // (int(token_map.max()) + 1)) // 2)),
        "pad_token_id": args.engram_pad_id,
        "pad_compressed_id": int(state.pad_id),
        "token_map_len": int(token_map.size),
        "token_map_sha256_int32_le": hashlib.sha256(token_map.tobytes()).hexdigest(),
    }
    assert constants["prime_sums"] == list(args.engram_num_embeddings), "prime sums equal engram_num_embeddings"

    probes = []
    for p in PROBES:
        ids = [bos] + tok.encode(p["text"], add_special_tokens=False).ids
        x = torch.tensor([ids], dtype=torch.int64)
        full = state(x, 0)
        k = p["prefill"]
        steps = [state(x[:, :k], 0)] + [state(x[:, t:t + 1], t) for t in range(k, len(ids))]
        split = torch.cat(steps, dim=1)
        assert torch.equal(full, split), f"{p['name']}: prefill + decode differs from one prefill"
        mask = torch.ones_like(x, dtype=torch.bool)
        mask[0, p["dead_positions"]] = False
        dead = state(x, 0, mask)
        probes.append({"name": p["name"], "text": p["text"], "input_ids": [ids], "prefill": k,
                       "hash_prefill_then_decode": split.tolist(),
                       "dead_positions": p["dead_positions"], "hash_with_dead": dead.tolist()})

    a.out.mkdir(parents=True, exist_ok=True)
    layout_note = "[B, L, engram layer (layer_ids order), col = (n - 2) * n_heads + head]"
    outputs = {"release_constants.json": json.dumps(constants, indent=1) + "\n"}
    for p in probes:
        outputs[f"release_hashes_{p['name']}.json"] = json.dumps({"layout": layout_note, "bos": bos, **p},
                                                                 ensure_ascii=False) + "\n"
    for name, text in outputs.items():
        path = a.out / name
        old = path.read_bytes() if path.exists() else None
        path.write_text(text, encoding="utf-8")
        print(provenance.report_change(path, old, text.encode()))
    np.save(a.out / "release_token_map_int32.npy", token_map)
    if a.provenance:
        engram_py = a.inference / "engram.py"
        provenance.write_sidecar(
            a.out / ("release" + provenance.SUFFIX),
            description="Engram hashing constants, compressed token map and hash ids of the project's probe "
                        "texts (text only, prefill + decode, with a DEAD span) on the release config and "
                        "tokenizer, made by the official engram.py; checked by conformance/cases/engram/release.yaml "
                        "and engine/tests/tokenizer_engram_map.rs.",
            generator={"kind": "official-code", "name": "inference/engram.py",
                       "version": provenance.sha256_file(engram_py)[:8],
                       "environment": provenance.environment(torch=torch.__version__, numpy=np.__version__)},
            command=f"python3 {SCRIPT} --inference <release inference/> --release <release snapshot> --out {{out}}",
            inputs=[
                release_input("inference_config", config_path, "inference/config.json"),
                release_input("tokenizer", tokenizer_path, "tokenizer.json"),
                provenance.describe_input("script", Path(__file__)),
                provenance.describe_input("token_map_script", Path(__file__).resolve().parent / "engram_token_map.py"),
                {"name": "engram.py", "location": "external", "path": "inference/engram.py",
                 "sha256": provenance.sha256_file(engram_py)},
            ],
            outputs=[*outputs, "release_token_map_int32.npy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
