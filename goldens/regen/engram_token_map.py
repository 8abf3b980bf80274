#!/usr/bin/env python3
"""The Engram compressed token map of tokenizer.json files, built by the official code.

Imports `build_compressed_token_map` from the release `inference/engram.py` (a directory the
caller names; never copied here) and runs it on each tokenizer.json, loaded with HF
`tokenizers` and presented the way the release loads it: `tokenizer.backend_tokenizer` is the
Rust tokenizer, and `len(tokenizer)` is `get_vocab_size(with_added_tokens=True)`, which is
what `transformers`' fast tokenizer returns for `len()`.

Prints one JSON object per line: {"tokenizer": path, "sha256": of the file's bytes,
"map": [...], "compressed_vocab_size": n}, or with --out-dir writes NAME.map.json next to
the name of each tokenizer file (goldens/engram_maps/ holds such goldens).

    python3 goldens/regen/engram_token_map.py --inference RELEASE/inference a.json b.json
"""
import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path


class ReleaseTokenizer:
    """What engram.py reads of a transformers fast tokenizer."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.backend_tokenizer = Tokenizer.from_file(str(path))

    def __len__(self):
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def import_engram(inference: Path):
    path = inference / "engram.py"
    if not path.is_file():
        raise SystemExit(f"engram_token_map: no engram.py in {inference}")
    spec = importlib.util.spec_from_file_location("ds41_official_engram", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "build_compressed_token_map"):
        raise SystemExit(f"engram_token_map: {path} has no build_compressed_token_map")
    return module


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="the release inference/ directory")
    ap.add_argument("--out-dir", type=Path, help="write NAME.map.json files here instead of printing")
    ap.add_argument("tokenizers", nargs="+", type=Path)
    a = ap.parse_args(argv)
    engram = import_engram(a.inference)
    for path in a.tokenizers:
        lookup, size = engram.build_compressed_token_map(ReleaseTokenizer(path))
        record = {
            "tokenizer": path.name,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "compressed_vocab_size": size,
            "map": list(lookup),
        }
        if a.out_dir:
            name = path.name.removesuffix(".json").removesuffix(".tokenizer")
            (a.out_dir / f"{name}.map.json").write_text(json.dumps(record) + "\n")
        else:
            print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
