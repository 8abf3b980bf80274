#!/usr/bin/env python3
"""Tokenizer goldens from HF `tokenizers` (PyPI) on a given tokenizer.json.

Two goldens, both read by the engine's tokenizer tests:

* curated: for each line `{"text": ...}` of a corpus file, the expected ids on the two entry
  points of TOKENIZER.md / issue 5, written as JSON lines `{"i", "markup", "text"}`:
    - `markup`: `Tokenizer.encode(s, add_special_tokens=False)` — added tokens recognised
      (how upstream's id files were made);
    - `text`: the same tokenizer with added-token matching switched off (its `added_tokens`
      list emptied before loading), i.e. plain byte-level BPE: a user typing `<｜User｜>`
      gets ordinary BPE ids. This is this project's definition of `encode_text`'s oracle.
* wide (optional, `--wide-seed S --wide-n N`): the random and whitespace strings of the wide
  corpus recipe (TOKENIZER.md §9) rebuilt from the seed, tokenized on the markup path and
  stored as a digest — counts, sha256 of the canonical text and id streams, and per-1000-string
  chunk hashes so a mismatch is localised — instead of the 6.5 MB corpus.
  `--wide-compare FILE` checks the rebuilt texts and ids against the upstream JSON-lines file.

Canonical streams (for the digest): per string, texts as `u32le(len(utf8)) ++ utf8`, ids as
`u32le(count) ++ u32le(id)...`.

Usage (from the repository root; prints what changed and rewrites the provenance sidecars):
  DS41_RELEASE=SNAPSHOT python3 goldens/regen/tokenizer_ids.py --tokenizer "$DS41_RELEASE/tokenizer.json" \
      --corpus goldens/tokenizer/curated_corpus.jsonl --out goldens/tokenizer \
      --wide-seed 11 --wide-n 20000
"""
import argparse
import hashlib
import json
import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

SCRIPT = "goldens/regen/tokenizer_ids.py"


def load_tokenizers(path: Path):
    text = path.read_text(encoding="utf-8")
    markup = Tokenizer.from_str(text)
    spec = json.loads(text)
    spec["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    return markup, plain


def encode(tok, s):
    return tok.encode(s, add_special_tokens=False).ids


# --- the wide corpus recipe, TOKENIZER.md §9 (random + whitespace parts, seeded) ----------
WS_CHARS = [" ", "\t", "\u00a0", "\u3000", "\u2009", "\u2002"]
WS_PREFIX = ["", "a", "1", "中"]
WS_SUFFIX = ["", "b", "2", "。", "\n"]


def wide_strings(seed: int, n: int):
    """Yields (kind, text) in corpus order, after the curated strings (which use no RNG)."""
    pool = [chr(c) for c in range(0x20, 0x2FFFF, 7) if not 0xD800 <= c <= 0xDFFF]
    assert len(pool) == 27790, len(pool)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(1, 24)
        out.append(("random", "".join(rng.choice(pool) for _ in range(length))))
    for _ in range(max(200, n // 5)):
        prefix = rng.choice(WS_PREFIX)
        k = rng.randint(1, 4)
        run = "".join(rng.choice(WS_CHARS) for _ in range(k))
        out.append(("whitespace", prefix + run + rng.choice(WS_SUFFIX)))
    return [(kind, s) for kind, s in out if "\0" not in s]


def text_record(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def ids_record(ids) -> bytes:
    return struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}I", *ids)


def wide_digest(strings, tok, seed, n, chunk=1000):
    text_all, ids_all = hashlib.sha256(), hashlib.sha256()
    chunks, kinds, total_ids = [], {}, 0
    all_ids = []
    for start in range(0, len(strings), chunk):
        th, ih = hashlib.sha256(), hashlib.sha256()
        for kind, s in strings[start:start + chunk]:
            ids = encode(tok, s)
            all_ids.append(ids)
            kinds[kind] = kinds.get(kind, 0) + 1
            total_ids += len(ids)
            t, i = text_record(s), ids_record(ids)
            th.update(t); ih.update(i); text_all.update(t); ids_all.update(i)
        chunks.append({"first": start, "texts_sha256": th.hexdigest(), "ids_sha256": ih.hexdigest()})
    digest = {
        "recipe": "TOKENIZER.md §9 random + whitespace strings (curated strings excluded), "
                  "Python random.Random(seed); markup entry point",
        "seed": seed, "n": n, "strings": len(strings), "kinds": kinds, "total_ids": total_ids,
        "stream_format": "texts: u32le(len utf8) ++ utf8; ids: u32le(count) ++ u32le ids",
        "texts_sha256": text_all.hexdigest(), "ids_sha256": ids_all.hexdigest(),
        "chunk_size": chunk, "chunks": chunks,
    }
    return digest, all_ids


def compare_with_upstream(strings, all_ids, path: Path):
    rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    rows = [r for r in rows if r["kind"] != "curated"]
    if len(rows) != len(strings):
        print(f"wide-compare: upstream has {len(rows)} random+whitespace strings, rebuilt {len(strings)}")
        return False
    text_bad = [i for i, (r, (k, s)) in enumerate(zip(rows, strings)) if r["text"] != s or r["kind"] != k]
    ids_bad = [i for i, (r, ids) in enumerate(zip(rows, all_ids)) if r["ids"] != ids]
    print(f"wide-compare: texts {len(rows) - len(text_bad)}/{len(rows)} identical, "
          f"ids {len(rows) - len(ids_bad)}/{len(rows)} identical")
    for i in (text_bad + ids_bad)[:5]:
        print(f"  first difference at upstream record {rows[i]['i']}: {rows[i]['text']!r}")
    return not text_bad and not ids_bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json (e.g. $DS41_RELEASE/tokenizer.json)")
    ap.add_argument("--corpus", type=Path, required=True, help="curated corpus, JSON lines with `text`")
    ap.add_argument("--out", type=Path, required=True, help="output directory (goldens/tokenizer)")
    ap.add_argument("--wide-seed", type=int)
    ap.add_argument("--wide-n", type=int)
    ap.add_argument("--wide-compare", type=Path, help="upstream wide corpus JSON lines to compare with")
    args = ap.parse_args()
    if tokenizers.__version__ != "0.23.3":
        print(f"warning: tokenizers {tokenizers.__version__}, goldens are pinned to 0.23.3", file=sys.stderr)

    markup, plain = load_tokenizers(args.tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    generator = {"kind": "upstream-tool", "name": "tokenizers (PyPI)", "version": tokenizers.__version__,
                 "environment": provenance.environment()}
    tok_input = provenance.describe_input("tokenizer", args.tokenizer)
    script_input = provenance.describe_input("script", Path(__file__))

    # curated
    texts = [json.loads(l)["text"] for l in args.corpus.read_text(encoding="utf-8").splitlines() if l.strip()]
    lines = [json.dumps({"i": i, "markup": encode(markup, s), "text": encode(plain, s)}) for i, s in enumerate(texts)]
    target = args.out / "curated_ids.jsonl"
    old = target.read_bytes() if target.exists() else None
    new = ("\n".join(lines) + "\n").encode()
    target.write_bytes(new)
    print(provenance.report_change(target, old, new))
    provenance.write_sidecar(
        args.out / ("curated_ids.jsonl" + provenance.SUFFIX),
        description="Expected ids of the curated tokenizer corpus on the markup path (added tokens "
                    "recognised) and the text path (added-token matching off), line i = corpus line i.",
        generator=generator,
        command=f"python3 {SCRIPT} --tokenizer {{input:tokenizer}} --corpus {{input:corpus}} --out {{out}}",
        inputs=[tok_input, provenance.describe_input("corpus", args.corpus), script_input],
        outputs=["curated_ids.jsonl"],
    )

    ok = True
    if args.wide_seed is not None:
        if args.wide_n is None:
            ap.error("--wide-seed needs --wide-n")
        strings = wide_strings(args.wide_seed, args.wide_n)
        digest, all_ids = wide_digest(strings, markup, args.wide_seed, args.wide_n)
        name = f"wide_seed{args.wide_seed}_n{args.wide_n}.digest.json"
        target = args.out / name
        old = target.read_bytes() if target.exists() else None
        new = (json.dumps(digest, indent=1) + "\n").encode()
        target.write_bytes(new)
        print(provenance.report_change(target, old, new))
        inputs = [tok_input, script_input]
        if args.wide_compare:
            ok = compare_with_upstream(strings, all_ids, args.wide_compare)
            inputs.append(provenance.describe_input("upstream_corpus", args.wide_compare))
        provenance.write_sidecar(
            args.out / (name + provenance.SUFFIX),
            description=f"Digest of the wide tokenizer corpus (seed {args.wide_seed}, N {args.wide_n}; "
                        "random + whitespace strings) and its markup-path ids: stream and per-chunk sha256.",
            generator=generator,
            command=(f"python3 {SCRIPT} --tokenizer {{input:tokenizer}} --corpus goldens/tokenizer/curated_corpus.jsonl "
                     f"--out {{out}} --wide-seed {args.wide_seed} --wide-n {args.wide_n}"
                     + (" --wide-compare {input:upstream_corpus}" if args.wide_compare else "")),
            inputs=inputs,
            outputs=[name],
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
