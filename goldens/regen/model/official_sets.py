#!/usr/bin/env python3
"""The official-model golden sets of goldens/official/: for each set, build its synthetic
checkpoint with `ds41 synth`, run the official model.py on it (run_official.py) for every
schedule and both index-k hand-offs, and write the traces with their provenance records.

A schedule whose two hand-offs give identical tensors (no ratio-2 owner's stale keys ever
reach a selection in that many tokens) is stored once, as `SCHEDULE.safetensors`, and used by
the cases of both hand-offs; otherwise as `SCHEDULE_as-shipped.safetensors` and
`SCHEDULE_owner.safetensors`. The sets and their tokens are defined here (SETS), so a set is
remade by one command:

  python3 goldens/regen/model/official_sets.py --inference RELEASE/inference --ds41 target/release/ds41 \\
      --out goldens/official [--set NAME]...

Nothing upstream is vendored: --inference is the release `inference/` directory (model.py,
engram.py, convert.py pinned by sha256; kernel_cpu.py beside it, see run_official.py).
"""
import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import provenance  # noqa: E402

DRIVER = "goldens/regen/model/run_official.py"
SCRIPT = "goldens/regen/model/official_sets.py"


def ids(seed: int, n: int, vocab: int = 512) -> list:
    """n token ids drawn with Python's `random` from `seed`, with one repeated trigram so
    Engram sees an n-gram twice."""
    rng = random.Random(seed)
    out = [rng.randrange(3, vocab) for _ in range(n)]
    out[n // 2:n // 2 + 3] = out[1:4]
    return out


# name -> preset, seed, tokens, schedules (prefill lengths; the rest are single-token decode steps)
SETS = {
    "tiny_s1": {"preset": "tiny", "seed": 1, "tokens": ids(101, 20), "prefills": [20, 1, 5, 13],
                "about": "tiny (MODEL.md §11): 6 layers, window 8, ratio-2 and ratio-1 sources, candidate consumer, "
                         "Engram on layers 0/1, 16 index heads; 20 tokens reach the ratio-2 selection (p >= 17), "
                         "where the two index-k hand-offs differ"},
    "sharded_s2": {"preset": "tiny-sharded", "seed": 2, "tokens": ids(202, 18), "prefills": [18, 1, 2, 9],
                   "about": "tiny-sharded: the tiny geometry as model.safetensors.index.json + release-like shards "
                            "(another seed)"},
    "grouped_s3": {"preset": "grouped", "seed": 3, "tokens": ids(303, 18), "prefills": [18, 1, 2, 9],
                   "about": "grouped: dim 256, 8 heads in 4 output groups, rope 32 of 64, window 16, index top-16 "
                            "of 8 heads x 64, 8 experts top-3, ratios 0,2,2,2,2,1,1,1, 4 shards; 18 tokens reach "
                            "the ratio-1 selection (p >= 16)"},
    "window_mtp_s4": {"preset": "window-mtp", "seed": 4, "tokens": ids(404, 48), "prefills": [48, 1, 5, 37],
                      "about": "window-mtp: window 32 + index top-40 (attention rows of up to 72 entries, two "
                               "64-blocks), ratio-1 selection from p >= 40, candidate filter from p >= 48, "
                               "one DSpark stage stored as mtp.0.*"},
    "tied_router_s5": {"preset": "tied-router", "seed": 5, "tokens": ids(505, 20), "prefills": [20, 5],
                       "about": "tied-router: tiny with one pair of experts per layer sharing gate row and biases "
                                "(the six pairs of its 4 experts on the six layers), so router selection keys tie "
                                "exactly; 30 (p05 schedule) or 32 (p20) of the 120 (token, layer) routings have the tied pair "
                                "across the top-2 boundary (margin.experts 0, first at token 0 layer 4), decided by "
                                "the lower-index rule alone",
                       # End to end, the first exact tie (token 0 layer 4) feeds every logits row and
                       # layer-5 selection, so an engine with another tie order has nothing left to be
                       # judged on: the end-to-end cases hold the canonical tie rule (canonical_ties.yaml).
                       "end_to_end": "residual/canonical_ties.yaml"},
    "off_release_s8": {"preset": "off-release", "seed": 8, "tokens": ids(808, 20), "prefills": [20, 1, 5, 13],
                       "about": "off-release: tiny with settings the release does not use (hc 2, swiglu_limit 0 = no "
                                "clamp, top-1 routing without renormalisation, no Engram, ratios 0,2,0,2,1,1: a "
                                "window-only layer between the ratio-2 source 1 and its consumer 3); 20 tokens wrap "
                                "the window and reach the candidate filter (p >= 12)"},
}


def synth(ds41: str, preset: str, seed: int, out: Path):
    cmd = [ds41, "synth", "--preset", preset, "--layout", "release", "--seed", str(seed), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return f"ds41 synth --preset {preset} --layout release --seed {seed} --out {{out}}"


def run_driver(inference: Path, ckpt: Path, tokens: str, prefill: int, index_k: str, out: Path, extra=()):
    cmd = [sys.executable, str(HERE / "run_official.py"), "--inference", str(inference), "--checkpoint", str(ckpt),
           "--tokens", tokens, "--prefill", str(prefill), "--index-k", index_k, "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def same_tensors(a: Path, b: Path) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def make_set(name: str, spec: dict, inference: Path, ds41: str, out_root: Path):
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    tokens = ",".join(map(str, spec["tokens"]))
    pins = {n: provenance.sha256_file(inference / n) for n in ("model.py", "engram.py", "convert.py", "kernel_cpu.py")}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / f"{spec['preset']}-seed{spec['seed']}"
        synth_cmd = synth(ds41, spec["preset"], spec["seed"], ckpt)
        ckpt_input = {"name": "checkpoint", "location": "generated", "path": ckpt.name,
                      "sha256": provenance.tree_sha256(ckpt), "command": synth_cmd}
        written = []
        for prefill in spec["prefills"]:
            sched = f"p{prefill:02d}_d{len(spec['tokens']) - prefill:02d}"
            runs = {h: Path(tmp) / f"{sched}_{h}.safetensors" for h in ("as-shipped", "owner")}
            for h, path in runs.items():
                run_driver(inference, ckpt, tokens, prefill, h, path)
            if same_tensors(runs["as-shipped"], runs["owner"]):
                files = {"as-shipped": f"{sched}.safetensors"}
                note = " The --index-k owner run gives identical tensors, so this file serves both hand-offs."
            else:
                files = {h: f"{sched}_{h}.safetensors" for h in runs}
                note = ""
            for h, fname in files.items():
                target = out / fname
                old = load_file(str(target)) if target.exists() else None
                target.write_bytes(runs[h].read_bytes())
                print(provenance.report_tensor_changes(target, old, load_file(str(target))))
                inputs = [ckpt_input] + [
                    {"name": n, "location": "external", "path": f"inference/{n}", "sha256": d} for n, d in pins.items()
                ] + [provenance.describe_input("driver", HERE / "run_official.py"),
                     provenance.describe_input("sets", HERE / "official_sets.py")]
                provenance.write_sidecar(
                    target.with_name(fname + provenance.SUFFIX),
                    description=f"Official model.py (tt-metal CPU kernels) on `{spec['preset']}` seed {spec['seed']}, "
                                f"{len(spec['tokens'])} tokens, prefill {prefill} then single-token decode, "
                                f"index_k {h}.{note}",
                    generator={"kind": "official-code", "name": "inference/model.py", "version": pins["model.py"][:12],
                               "environment": provenance.environment(torch=torch.__version__, threads=1)},
                    command=(f"python3 {DRIVER} --inference <release>/inference --checkpoint {{input:checkpoint}} "
                             f"--tokens {tokens} --prefill {prefill} --index-k {h} --kernels tt-metal "
                             f"--out {{out}}/{fname}"),
                    inputs=inputs, outputs=[fname],
                    synthetic={"preset": spec["preset"], "seed": spec["seed"]},
                    errata={"index_k_handoff": h, "topk_tie_order": "lower-index"},
                )
                written.append(fname)
    return written


def write_cases(name: str, spec: dict, golden_dir: Path, cases_dir: Path, tolerance=None):
    """conformance/cases/residual/official_NAME.yaml: for every golden of the set, an end-to-end
    case and a teacher-forced (`replay: true`) case per hand-off, reading only the repository. A
    set whose spec names another file under `end_to_end` gets only its replay cases here."""
    layout_model = f"synthetic:{spec['preset']}/release@{spec['seed']}"
    n = len(spec["tokens"])
    elsewhere = spec.get("end_to_end")
    modes = (True,) if elsewhere else (False, True)
    how = ([". Teacher-forced replay per cell (its `replay` thresholds; exact ties excused unless the engine",
            f"  claims the canonical rule); both index-k hand-offs. The end-to-end cases are in {elsewhere}."]
           if elsewhere else
           [". End to end (gates/upstream.yaml)",
            "  and teacher-forced replay per cell (its `replay` thresholds); both index-k hand-offs."])
    lines = ["family: residual", "description: >-",
             f"  Official model.py goldens of set {name} (goldens/official/{name}/, made by",
             "  goldens/regen/model/official_sets.py): " + spec["about"] + how[0], how[1],
             "cases:"]
    for prefill in spec["prefills"]:
        sched = f"p{prefill:02d}_d{n - prefill:02d}"
        for h in ("as-shipped", "owner"):
            fname = f"{sched}_{h}.safetensors"
            if not (golden_dir / fname).exists():
                fname = f"{sched}.safetensors"
            if not (golden_dir / fname).exists():
                raise SystemExit(f"{golden_dir}: no golden for {sched} {h}")
            for replay in modes:
                case = f"{name.replace('_', '-')}-{sched.replace('_', '-')}-{h}" + ("-replay" if replay else "")
                # A model without Engram layers has no hash ids to require (its goldens carry none).
                hashes = load_file(str(golden_dir / fname)).get("engram_hash")
                engram = ", engram_hash" if hashes is not None and hashes.numel() > 0 else ""
                require = f"[logits, residual, experts, topk{engram}" + (", attn_out, moe_out]" if replay else "]")
                lines += [f"  - name: {case}", f"    model: {layout_model}",
                          f"    golden: {{file: repo:goldens/official/{name}/{fname}}}",
                          f"    prefill: {prefill}", "    numerics: upstream", f"    index_k: {h}"]
                if replay:
                    lines.append("    replay: true")
                lines.append(f"    require: {require}")
                if tolerance and not replay:
                    lines.append("    tolerance: {" + ", ".join(f"{k}: {v}" for k, v in tolerance.items()) + "}")
    (cases_dir / f"official_{name}.yaml").write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True)
    ap.add_argument("--ds41", default="ds41", help="the ds41 binary (for `ds41 synth`)")
    ap.add_argument("--out", type=Path, default=Path("goldens/official"))
    ap.add_argument("--set", action="append", choices=sorted(SETS), help="default: every set")
    ap.add_argument("--list", action="store_true", help="print the sets as JSON and exit")
    ap.add_argument("--cases", type=Path, help="also (re)write the residual case files into this directory")
    ap.add_argument("--no-run", action="store_true", help="only write the case files (with --cases)")
    a = ap.parse_args(argv)
    if a.list:
        print(json.dumps(SETS, indent=1))
        return 0
    for name in a.set or sorted(SETS):
        if not a.no_run:
            print(name, make_set(name, SETS[name], a.inference.resolve(), a.ds41, a.out))
        if a.cases:
            write_cases(name, SETS[name], a.out / name, a.cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
