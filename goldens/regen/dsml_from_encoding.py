#!/usr/bin/env python3
"""Check (or rewrite) goldens/dsml against the official DeepSeek-V4.1 encoder.

    python3 goldens/regen/dsml_from_encoding.py PATH/TO/encoding/encoding.py [--write]
        [--goldens DIR] [--allow-unpinned]

PATH is a copy of `encoding/encoding.py` from huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash at
revision dba1be0a40aa45a94ad051997016db3960a90277 (sha256 502bdaec…35c1); another file is
refused unless --allow-unpinned. It is never vendored into this repository.

For every DIR/NN_name.json (default goldens/dsml) the script renders the case the way the
official golden harness does (DSML.md §1; the same code as dsml_official.py: `tools` attached to
message 0, the case's thinking_mode / reasoning_effort / context win over chat) plus the project
extension key `drop_thinking` (passed to encode_messages), and compares the result with
NN_name.txt, or the exception the encoder raised ("Type: message") with NN_name.error. A case
file this script cannot read is an error of the script (exit 2), never an expectation.
Exit status 0 when everything agrees, 1 when something differs. With --write, disagreeing
expectations are rewritten from the official encoder (then review the diff: the hand-derived
file was wrong, or the encoder revision changed).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dsml_official  # noqa: E402
import provenance  # noqa: E402

GOLDENS = Path(__file__).resolve().parent.parent / "dsml"


def expectation(encoding, case) -> tuple:
    """(".txt", prompt) or (".error", "Type: message") for one case."""
    extra = {}
    if isinstance(case, dict) and "drop_thinking" in case:
        extra["drop_thinking"] = case["drop_thinking"]
    try:
        return ".txt", dsml_official.render_case(encoding, None, case, **extra)
    except Exception as e:  # the reference's rejection is the expectation
        return ".error", f"{type(e).__name__}: {e}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("encoding", type=Path, help="the release encoding/encoding.py")
    ap.add_argument("--goldens", type=Path, default=GOLDENS, help="case directory (default goldens/dsml)")
    ap.add_argument("--write", action="store_true", help="rewrite disagreeing expectations")
    ap.add_argument("--allow-unpinned", action="store_true")
    a = ap.parse_args(argv)

    digest = provenance.sha256_file(a.encoding)
    if digest != dsml_official.PINNED_ENCODING and not a.allow_unpinned:
        print(f"dsml_from_encoding: {a.encoding}: sha256 {digest} is not the pinned "
              f"{dsml_official.PINNED_ENCODING}; --allow-unpinned to run anyway", file=sys.stderr)
        return 2
    encoding = dsml_official.import_path("encoding", a.encoding)

    stems = sorted(p.stem for p in a.goldens.glob("*.json") if not p.name.endswith(provenance.SUFFIX))
    if not stems:
        print(f"dsml_from_encoding: no case files in {a.goldens}", file=sys.stderr)
        return 2
    disagree = 0
    for stem in stems:
        path = a.goldens / f"{stem}.json"
        try:
            case = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            print(f"dsml_from_encoding: {path}: {e}", file=sys.stderr)
            return 2
        ext, text = expectation(encoding, case)
        want_path = a.goldens / f"{stem}{ext}"
        want = want_path.read_bytes().decode("utf-8") if want_path.exists() else None
        if want == text:
            continue
        disagree += 1
        print(f"DIFFERS {stem}{ext}:\n  encoder: {text!r}\n  golden:  {want!r}")
        if a.write:
            for old in (".txt", ".error"):
                (a.goldens / f"{stem}{old}").unlink(missing_ok=True)
            want_path.write_bytes(text.encode("utf-8"))
    print(f"{len(stems) - disagree}/{len(stems)} goldens agree with {a.encoding}"
          + (f"; rewrote {disagree}" if a.write and disagree else ""), file=sys.stderr)
    return 1 if disagree and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
