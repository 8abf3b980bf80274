#!/usr/bin/env python3
"""Check (or rewrite) goldens/dsml against the official DeepSeek-V4.1 encoder.

    python3 goldens/regen/dsml_from_encoding.py PATH/TO/encoding/encoding.py [--write]

PATH is a copy of `encoding/encoding.py` from huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash at
revision dba1be0a40aa45a94ad051997016db3960a90277 (sha256 502bdaec…35c1; the script checks the
hash and warns on any other). It is never vendored into this repository.

For every goldens/dsml/NN_name.json the script runs what the official harness runs,
`encode_case(case, thinking_mode="chat")` (the case's own thinking_mode / reasoning_effort
win), plus the project extension key `drop_thinking` (passed to encode_messages), and compares
the result with NN_name.txt, or the raised exception ("Type: message") with NN_name.error.
Exit status 0 when everything agrees. With --write, disagreeing expectations are rewritten
from the official encoder (then review the diff: the hand-derived file was wrong, or the
encoder revision changed).
"""
import hashlib
import importlib.util
import json
import os
import sys

PINNED = "502bdaec8a3fd88ebc24c4721a7038fbe42f2063c664638127056107920035c1"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    encoding_path = sys.argv[1]
    write = "--write" in sys.argv[2:]
    digest = hashlib.sha256(open(encoding_path, "rb").read()).hexdigest()
    if digest != PINNED:
        print(f"warning: {encoding_path} has sha256 {digest}, not the pinned {PINNED}", file=sys.stderr)
    spec = importlib.util.spec_from_file_location("ds41_encoding", encoding_path)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)

    golden_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsml")
    stems = sorted(f[:-5] for f in os.listdir(golden_dir) if f.endswith(".json"))
    disagree = 0
    for stem in stems:
        path = os.path.join(golden_dir, stem + ".json")
        raw = json.load(open(path, encoding="utf-8"))
        drop_thinking = raw.get("drop_thinking", True) if isinstance(raw, dict) else True
        try:
            (case,) = enc.load_cases(path)
            got = enc.encode_messages(
                case["messages"],
                thinking_mode=case.get("thinking_mode") or "chat",
                context=case.get("context"),
                drop_thinking=drop_thinking,
                reasoning_effort=case.get("reasoning_effort"),
            )
            ext, text = ".txt", got
        except Exception as e:  # the reference's rejection is the expectation
            ext, text = ".error", f"{type(e).__name__}: {e}"
        want_path = os.path.join(golden_dir, stem + ext)
        want = open(want_path, encoding="utf-8", newline="").read() if os.path.exists(want_path) else None
        if want == text:
            continue
        disagree += 1
        print(f"DIFFERS {stem}{ext}:\n  encoder: {text!r}\n  golden:  {want!r}")
        if write:
            for old in (".txt", ".error"):
                if os.path.exists(os.path.join(golden_dir, stem + old)):
                    os.remove(os.path.join(golden_dir, stem + old))
            with open(want_path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
    print(f"{len(stems) - disagree}/{len(stems)} goldens agree with {encoding_path}", file=sys.stderr)
    sys.exit(1 if disagree and not write else 0)


if __name__ == "__main__":
    main()
