#!/usr/bin/env python3
"""Exact-regime goldens from the WASTE PyTorch oracle (CONTAINER.md §11): run a WASTE checkout's
`tools/ds41_ref.py` on a WASTE container and convert its outputs to the trace format.

The oracle runs one token at a time from position 0 (errata `waste_schedule`), with the
as-shipped index_k hand-off only (errata `index_k_handoff`), so its trace corresponds to
`ds41 forward --prefill 1 --numerics exact --index-k as-shipped` on the same container:
* `logits` [N, vocab]: row t-1 = the last-token logits after the first t ids (one oracle run
  per prefix: `--dump` writes only the final token's logits);
* `residual` [N, layers, hc_mult, hidden]: the `--hidden` dump of the full run (token-major,
  record t·layers + l = the mHC stream after layer l's FFN expand at token t);
* `input_ids`, `logits_positions`; metadata: engine, numerics exact, index_k as-shipped,
  schedule prefill 1, tie rule of the oracle (torch.topk, unstated).

`--from-oracle-files DIR --variant NAME` converts already-made outputs instead
(`logits_prefix_NAME.f32`, `hidden_NAME.f32`: the oracle's raw little-endian f32 dumps).
Nothing from WASTE is vendored: --waste names a checkout.

Example (goldens/waste_oracle/waste-tiny_s0_n12.safetensors; seed 0 is WASTE's own container):
  ds41 synth --preset waste-tiny --layout container --seed 0 --out /tmp/wc0
  python3 goldens/regen/waste_oracle.py --waste ~/src/warp --container /tmp/wc0 \\
      --ids 3,7,11,5,19,23,2,41,8,64,17,90 --out goldens/waste_oracle/waste-tiny_s0_n12.safetensors \\
      --synth-command "ds41 synth --preset waste-tiny --layout container --seed 0 --out {out}" \\
      --synth-preset waste-tiny --synth-seed 0 --provenance
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

WASTE_REVISION = "8d5405d8b95d5cecdcd49797689deb4fd207045d"  # Penguinjanator/warp, CONTAINER.md §0
SCRIPT = "goldens/regen/waste_oracle.py"


class OracleError(RuntimeError):
    pass


def container_dims(container: Path) -> dict:
    cfg = json.loads((container / "manifest.json").read_text())["config"]
    try:
        return {k: int(cfg[k]) for k in ("vocab_size", "num_hidden_layers", "hc_mult", "hidden_size")}
    except KeyError as e:
        raise OracleError(f"{container / 'manifest.json'}: config lacks {e}")


def read_f32(path: Path, count: int, what: str) -> np.ndarray:
    data = np.fromfile(path, dtype="<f4")
    if data.size != count:
        raise OracleError(f"{path}: {data.size} f32 values, expected {count} ({what})")
    return data


# Runs the oracle unmodified, with torch.topk replaced by the project's tie rule (larger first,
# equal values -> lower index; errata `topk_tie_order`): exact zero index scores (every head's
# ReLU at 0) tie often with WASTE's two index heads, and torch.topk's order among them is not
# reproducible.
LOWER_INDEX_RUNNER = """
import runpy, sys, torch
sys.path.insert(0, {model_dir!r})
import ds41_kernels
torch.topk = ds41_kernels.stable_topk
torch.Tensor.topk = lambda self, *a, **k: ds41_kernels.stable_topk(self, *a, **k)
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path({script!r}, run_name="__main__")
"""


def run_oracle(waste: Path, container: Path, ids, python: str, tmp: Path, dims: dict, tie_rule: str = "lower-index"):
    script = waste / "tools" / "ds41_ref.py"
    if not script.is_file():
        raise OracleError(f"{script}: missing (expected a WASTE checkout at {WASTE_REVISION[:8]})")
    rows, hidden = [], None
    for t in range(1, len(ids) + 1):
        dump = tmp / f"logits_{t}.f32"
        launcher = [str(script)] if tie_rule == "torch-topk" else \
            ["-c", LOWER_INDEX_RUNNER.format(model_dir=str(Path(__file__).resolve().parent / "model"), script=str(script))]
        cmd = [python, *launcher, "--container", str(container), "--ids", ",".join(map(str, ids[:t])),
               "--top", "1", "--dump", str(dump)]
        if t == len(ids):
            cmd += ["--hidden", str(tmp / "hidden.f32")]
        proc = subprocess.run(cmd, cwd=waste, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OracleError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        rows.append(read_f32(dump, dims["vocab_size"], f"logits after {t} tokens"))
    n, l, hc, d = len(ids), dims["num_hidden_layers"], dims["hc_mult"], dims["hidden_size"]
    hidden = read_f32(tmp / "hidden.f32", n * l * hc * d, "hidden streams").reshape(n, l, hc, d)
    return np.stack(rows), hidden


def from_files(directory: Path, variant: str, n: int, dims: dict):
    v, l, hc, d = dims["vocab_size"], dims["num_hidden_layers"], dims["hc_mult"], dims["hidden_size"]
    logits = np.fromfile(directory / f"logits_prefix_{variant}.f32", dtype="<f4")
    if logits.size % v:
        raise OracleError(f"logits_prefix_{variant}.f32: {logits.size} values, not a multiple of vocab {v}")
    logits = logits.reshape(-1, v)[:n]
    hidden = np.fromfile(directory / f"hidden_{variant}.f32", dtype="<f4")
    per_token = l * hc * d
    if hidden.size % per_token:
        raise OracleError(f"hidden_{variant}.f32: {hidden.size} values, not a multiple of {per_token}")
    hidden = hidden.reshape(-1, l, hc, d)[:n]
    if logits.shape[0] != n or hidden.shape[0] != n:
        raise OracleError(f"oracle files hold {logits.shape[0]} / {hidden.shape[0]} tokens, need {n}")
    return logits, hidden


def trace(ids, logits, hidden, index_k: str):
    tensors = {
        "input_ids": np.asarray(ids, dtype=np.int64),
        "logits": np.ascontiguousarray(logits, dtype=np.float32),
        "logits_positions": np.arange(len(ids), dtype=np.int64),
        "residual": np.ascontiguousarray(hidden, dtype=np.float32),
    }
    metadata = {"engine": "WASTE tools/ds41_ref.py (PyTorch oracle)", "version": WASTE_REVISION[:8],
                "layout": "container", "numerics": "exact", "index-k": index_k,
                "tie_rule": "torch.topk (unstated)", "logits_rows": "row t-1 = last position after t tokens",
                "prefill": "1", "decode_steps": str(len(ids) - 1), "mode": "forward", "format": "ds41-trace/1"}
    return tensors, metadata


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--container", type=Path, required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--waste", type=Path, help="WASTE checkout (runs tools/ds41_ref.py)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch for the oracle")
    ap.add_argument("--from-oracle-files", type=Path, help="convert existing oracle outputs instead")
    ap.add_argument("--variant", default="as_shipped", help="with --from-oracle-files: as_shipped or owner")
    ap.add_argument("--provenance", action="store_true")
    ap.add_argument("--tie-rule", choices=["lower-index", "torch-topk"], default="lower-index",
                    help="top-k order among equal values in the oracle run (default: the project's rule)")
    ap.add_argument("--synth-command", help="the `ds41 synth ... --layout container --out {out}` command that "
                    "rebuilds --container byte for byte (recorded: the container is then a generated input)")
    ap.add_argument("--synth-preset"), ap.add_argument("--synth-seed", type=int)
    a = ap.parse_args(argv)
    from safetensors.numpy import load_file, save_file

    ids = [int(t) for t in a.ids.split(",") if t.strip()]
    try:
        dims = container_dims(a.container)
        if a.from_oracle_files:
            logits, hidden = from_files(a.from_oracle_files, a.variant, len(ids), dims)
            index_k = "owner" if a.variant == "owner" else "as-shipped"
        elif a.waste:
            with tempfile.TemporaryDirectory() as tmp:
                logits, hidden = run_oracle(a.waste, a.container, ids, a.python, Path(tmp), dims, a.tie_rule)
            index_k = "as-shipped"
        else:
            ap.error("give --waste CHECKOUT or --from-oracle-files DIR")
    except OracleError as e:
        print(f"waste_oracle: error: {e}", file=sys.stderr)
        return 2
    tensors, metadata = trace(ids, logits, hidden, index_k)
    if a.waste and a.tie_rule == "lower-index":
        metadata["tie_rule"] = "largest first; equal values -> lower index (torch.topk replaced around the oracle)"
    old = load_file(str(a.out)) if a.out.exists() else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(a.out), metadata=metadata)
    import torch
    print(provenance.report_tensor_changes(
        a.out, {k: torch.from_numpy(v) for k, v in old.items()} if old else None,
        {k: torch.from_numpy(v) for k, v in tensors.items()}))
    if a.provenance:
        container = provenance.describe_input("container", a.container)
        if a.synth_command:
            container = {"name": "container", "location": "generated", "path": a.container.name,
                         "sha256": container["sha256"], "command": a.synth_command}
        inputs = [container, provenance.describe_input("script", Path(__file__))]
        if a.waste and a.tie_rule == "lower-index":
            inputs.append(provenance.describe_input("tie_rule", Path(__file__).resolve().parent / "model" / "ds41_kernels.py"))
        if a.waste:
            inputs.append({"name": "ds41_ref.py", "location": "external", "path": "tools/ds41_ref.py",
                           "sha256": provenance.sha256_file(a.waste / "tools" / "ds41_ref.py")})
            command = (f"python3 {SCRIPT} --waste <waste checkout> --container {{input:container}} --ids {a.ids} "
                       f"--tie-rule {a.tie_rule} --out {{out}}/{a.out.name}")
        else:
            inputs.append(provenance.describe_input("oracle_files", a.from_oracle_files))
            command = (f"python3 {SCRIPT} --from-oracle-files {{input:oracle_files}} --variant {a.variant} "
                       f"--container {{input:container}} --ids {a.ids} --out {{out}}/{a.out.name}")
        provenance.write_sidecar(
            a.out.with_name(a.out.name + provenance.SUFFIX),
            description=f"WASTE oracle (exact regime, token at a time) trace for ids {a.ids}, index_k {index_k}.",
            generator={"kind": "oracle-code", "name": "WASTE tools/ds41_ref.py", "version": "8d5405d8",
                       "revision": WASTE_REVISION, "environment": provenance.environment()},
            command=command, inputs=inputs, outputs=[a.out.name],
            synthetic={"preset": a.synth_preset, "seed": a.synth_seed} if a.synth_preset else None,
            errata={"index_k_handoff": index_k, "waste_schedule": "token-at-a-time",
                    **({"topk_tie_order": "lower-index"} if a.waste and a.tie_rule == "lower-index" else {}),
                    "waste_moe_summation": "topk-order-weight-after-down", "waste_rope_tables": "f64-then-f32"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
