#!/usr/bin/env python3
"""DSML goldens from the release's `encoding/encoding.py` (DSML.md §0–§3): the official cases
and the edge-case probes. (The project's own cases in goldens/dsml/ are checked against the
encoder by goldens/regen/dsml_from_encoding.py, which knows their `.error` expectations and the
`drop_thinking` extension.)

The encoder is not in this sandbox and is never vendored: pass its path. Two jobs, either or
both:

* `--official-cases DIR`: the official fixtures `test_input_N.json` (release `encoding/tests/`
  or `$DS41_UPSTREAM/dsml/`) rendered to `test_output_N.txt` in `--out`;
* `--probes FILE`: edge-case probes `{name: {call, ...arguments}}` run through the named entry
  point (`encode_messages`, `render_message`, `parse_message_from_completion_text`), results
  written as `{name: {ok, value} | {ok: false, error: "Type: message"}}` to `--out`, and
  compared with `--expected-probes FILE` if given.

A case is rendered the way the official golden harness does (DSML.md §1): a case file is a list
of messages or an object with `messages` and optional `tools` (attached to messages[0]),
`thinking_mode` (default `chat`), `reasoning_effort` and `context`; if `--tests DIR` holds the
release's test_encoding.py with `encode_case`, that function is used instead.

Every run prints what changed; written goldens get provenance sidecars. Not runnable in the
sandbox this was written in (no encoding.py there); the pinned revision is dba1be0a, sha256
502bdaec8a3fd88ebc24c4721a7038fbe42f2063c664638127056107920035c1 (DSML.md §0).

Example:
  python3 goldens/regen/dsml_official.py --encoding RELEASE/encoding/encoding.py \\
      --official-cases "$DS41_UPSTREAM/dsml" --out /tmp/dsml_official \\
      --probes "$DS41_UPSTREAM/dsml/reference_probe_inputs.json" \\
      --expected-probes "$DS41_UPSTREAM/dsml/reference_probe_results.json"
"""
import argparse
import copy
import importlib.util
import inspect
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

PINNED_ENCODING = "502bdaec8a3fd88ebc24c4721a7038fbe42f2063c664638127056107920035c1"
RELEASE_REVISION = "dba1be0a40aa45a94ad051997016db3960a90277"
SCRIPT = "goldens/regen/dsml_official.py"


def import_path(name: str, path: Path):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def call(fn, **kwargs):
    """Call an entry point by argument name; fail listing its signature if a name is unknown."""
    sig = inspect.signature(fn)
    unknown = [k for k in kwargs if k not in sig.parameters]
    if unknown:
        raise TypeError(f"{fn.__name__}{sig} has no parameter(s) {unknown}")
    return fn(**kwargs)


def render_case(encoding, harness, case, **extra):
    """Render one case file's content (DSML.md §1); `extra` keyword arguments (the project's
    `drop_thinking` extension) go to encode_messages and rule out the release harness."""
    if harness is not None and hasattr(harness, "encode_case") and not extra:
        return harness.encode_case(copy.deepcopy(case), thinking_mode="chat")
    if isinstance(case, list):
        case = {"messages": case}
    messages = copy.deepcopy(case["messages"])
    if "tools" in case:
        if not messages:
            raise ValueError("case has tools but no messages")
        messages[0] = {**messages[0], "tools": case["tools"]}
    kwargs = {"thinking_mode": case.get("thinking_mode", "chat")}
    for key in ("reasoning_effort", "context"):
        if key in case:
            kwargs[key] = case[key]
    return call(encoding.encode_messages, messages=messages, **kwargs, **extra)


def run_probe(encoding, probe):
    kind = probe["call"]
    args = {k: v for k, v in probe.items() if k not in ("call", "completion")}
    if kind.startswith("encode_messages"):
        value = call(encoding.encode_messages, **args)
        if "truncated" in kind:
            value = value[:80]
    elif kind == "render_message":
        value = call(encoding.render_message, **args)
    elif kind == "render_message == completion":
        value = call(encoding.render_message, **args) == probe["completion"]
    elif kind == "parse_message_from_completion_text":
        value = call(encoding.parse_message_from_completion_text, **args)
    else:
        raise ValueError(f"unknown probe call {kind!r}")
    return value


def probe_results(encoding, probes: dict) -> dict:
    results = {}
    for name, probe in probes.items():
        try:
            results[name] = {"ok": True, "value": run_probe(encoding, probe)}
        except Exception as e:  # the probe's expected outcome may be an error
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return results


def write_text(path: Path, text: str) -> str:
    old = path.read_bytes() if path.exists() else None
    new = text.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(new)
    return provenance.report_change(path, old, new)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoding", type=Path, required=True, help="the release encoding/encoding.py")
    ap.add_argument("--tests", type=Path, help="the release encoding/tests/ (for encode_case), optional")
    ap.add_argument("--official-cases", type=Path, help="directory with test_input_N.json")
    ap.add_argument("--probes", type=Path)
    ap.add_argument("--expected-probes", type=Path)
    ap.add_argument("--out", type=Path, help="output directory for official-case outputs and probe results")
    ap.add_argument("--allow-unpinned", action="store_true")
    a = ap.parse_args(argv)

    digest = provenance.sha256_file(a.encoding)
    if digest != PINNED_ENCODING and not a.allow_unpinned:
        print(f"dsml_official: {a.encoding}: sha256 {digest} is not the pinned {PINNED_ENCODING} "
              f"(release {RELEASE_REVISION[:8]}); --allow-unpinned to run anyway", file=sys.stderr)
        return 2
    encoding = import_path("encoding", a.encoding)
    harness = None
    if a.tests and (a.tests / "test_encoding.py").exists():
        harness = import_path("test_encoding", a.tests / "test_encoding.py")
    generator = {"kind": "official-code", "name": "encoding/encoding.py", "version": digest[:12],
                 "revision": RELEASE_REVISION if digest == PINNED_ENCODING else None,
                 "environment": provenance.environment()}
    if generator["revision"] is None:
        del generator["revision"]
    enc_input = {"name": "encoding.py", "location": "external", "path": "encoding/encoding.py", "sha256": digest}
    failures = 0

    if a.official_cases:
        if not a.out:
            ap.error("--official-cases needs --out")
        written = []
        for case_path in sorted(a.official_cases.glob("test_input_*.json")):
            n = case_path.stem.removeprefix("test_input_")
            text = render_case(encoding, harness, json.loads(case_path.read_text(encoding="utf-8")))
            print(write_text(a.out / f"test_output_{n}.txt", text))
            written.append(f"test_output_{n}.txt")
        provenance.write_sidecar(
            a.out / ("official_cases" + provenance.SUFFIX),
            description="Prompts of the official DSML cases rendered by the release encoder.",
            generator=generator,
            command=f"python3 {SCRIPT} --encoding <release>/encoding/encoding.py --official-cases {{input:cases}} --out {{out}}",
            inputs=[enc_input, provenance.describe_input("cases", a.official_cases),
                    provenance.describe_input("script", Path(__file__))],
            outputs=written)

    if a.probes:
        if not a.out:
            ap.error("--probes needs --out")
        probes = json.loads(a.probes.read_text(encoding="utf-8"))["probes"]
        results = probe_results(encoding, probes)
        print(write_text(a.out / "probe_results.json", json.dumps(results, indent=1, ensure_ascii=False) + "\n"))
        if a.expected_probes:
            want = json.loads(a.expected_probes.read_text(encoding="utf-8"))
            differing = [n for n in probes if results.get(n) != want.get(n)]
            print(f"probes: {len(probes) - len(differing)}/{len(probes)} identical to {a.expected_probes}")
            for n in differing[:10]:
                print(f"  {n}: got {json.dumps(results.get(n), ensure_ascii=False)[:200]}")
            failures += len(differing)
        provenance.write_sidecar(
            a.out / ("probe_results.json" + provenance.SUFFIX),
            description="Results of the DSML edge-case probes under the release encoder/parser.",
            generator=generator,
            command=f"python3 {SCRIPT} --encoding <release>/encoding/encoding.py --probes {{input:probes}} --out {{out}}",
            inputs=[enc_input, provenance.describe_input("probes", a.probes),
                    provenance.describe_input("script", Path(__file__))],
            outputs=["probe_results.json"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
