#!/usr/bin/env python3
"""Gate calibration of an official golden set (as upstream/official_a's meta.json was made):
noise stand-ins — the official model.py itself under other valid summation orders — are run on
every golden of the set, end to end and teacher-forced (replay), and scored against the golden
with compare.py (the project's definition of the metrics, shared/tools/README.md). Their worst
deviations, and the attn_out cells any stand-in moves in replay, go to
goldens/official/SET/calibration.json.

Stand-ins (each a correct engine by construction):
  threads2        the tt-metal kernels with 2 torch threads (intra-op f32 reduction order)
  ds41-f64        this project's kernels (exact block GEMMs, f64-once sparse_attn dots) plus f64
                  linears, einsums and RMSNorm, each rounded once (run_official.py --standin)

  python3 goldens/regen/model/calibrate.py --inference RELEASE/inference --ds41 target/release/ds41 \\
      --compare shared/tools/compare.py --set tiny_s1 [--set ...]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402
from official_sets import SETS, synth, run_driver  # noqa: E402

STANDINS = {"threads2": ["--threads", "2"],
            "ds41-f64": ["--kernels", "ds41", "--standin", "f64-einsum-norm"]}
E2E_FACTOR, REPLAY_FACTOR = 2.0, 2.5


def schedule_of(path: Path):
    """(prefill, hand-off) from `pPP_dDD[_HANDOFF].safetensors`."""
    parts = path.name.removesuffix(".safetensors").split("_")
    return int(parts[0][1:]), (parts[2] if len(parts) > 2 else "as-shipped")


def compare(tool: Path, golden: Path, dump: Path, replay: bool) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(tool), str(golden), str(dump), "--quiet", "--json", out.name]
        if replay:
            cmd.append("--replay")
        subprocess.run(cmd, capture_output=True, text=True)
        report = json.loads(Path(out.name).read_text())
    m = report["metrics"]
    steps = [s for s in m.get("logits", {}).get("steps", []) if s.get("compared")]
    fig = {"logits_max_abs": max((s["max_abs"] for s in steps), default=0.0),
           "logits_rel_l2": max((s["rel_l2"] for s in steps), default=0.0),
           "argmax_differs": sum(1 for s in m.get("logits", {}).get("steps", []) if s["argmax_golden"] != s["argmax_engine"]),
           "flips": len(m.get("fragile_flips", {}).get("events", [])),
           "robust_mismatches": sum(v.get("robust_mismatches", 0) for v in m.values() if isinstance(v, dict))}
    for name in ("residual", "attn_out", "moe_out", "block_input"):
        if "worst" in m.get(name, {}):
            fig[name] = m[name]["worst"]
    return fig


def moved_cells(golden: dict, dump: dict, name: str):
    a, b = golden[name].double(), dump[name].double()
    rel = (a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)
    return [{"token": t, "layer": l, "rel_l2": rel[t, l].item(), "elements": int((a[t, l] != b[t, l]).sum())}
            for t, l in (rel > 0).nonzero().tolist()]


def calibrate(name, spec, inference, ds41, tool, golden_dir, only=None, modes=("e2e", "replay"),
              standins=tuple(STANDINS), results=None):
    """Run the stand-ins and add their figures to `results` (keyed STANDIN/GOLDEN/MODE)."""
    results = dict(results or {})
    tokens = ",".join(map(str, spec["tokens"]))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        synth(ds41, spec["preset"], spec["seed"], ckpt)
        for golden in sorted(golden_dir.glob("p*.safetensors")):
            if only and not any(golden.name.startswith(o) for o in only):
                continue
            prefill, hand_off = schedule_of(golden)
            g = load_file(str(golden))
            for standin in standins:
                extra = STANDINS[standin]
                for replay in [m == "replay" for m in modes]:
                    dump = Path(tmp) / "dump.safetensors"
                    run_driver(inference, ckpt, tokens, prefill, hand_off, dump,
                               [*extra, *(["--replay", str(golden)] if replay else [])])
                    fig = compare(tool, golden, dump, replay)
                    if replay:
                        fig["attn_out_cells_moved"] = moved_cells(g, load_file(str(dump)), "attn_out")
                    mode = "replay" if replay else "e2e"
                    results[f"{standin}/{golden.name}/{mode}"] = fig
                    print(name, standin, golden.name, mode, {k: v for k, v in fig.items() if k != "attn_out_cells_moved"},
                          flush=True)
    return summarize(name, results)


def summarize(name, results):
    worst = {"e2e": {}, "replay": {}}
    for key, fig in results.items():
        bucket = worst[key.rsplit("/", 1)[1]]
        for k, v in fig.items():
            if isinstance(v, (int, float)):
                bucket[k] = max(bucket.get(k, 0), v)
    recommended = {
        "e2e": {"residual_rel_l2": E2E_FACTOR * worst["e2e"].get("residual", 0),
                "logits_max_abs": E2E_FACTOR * worst["e2e"].get("logits_max_abs", 0),
                "logits_rel_l2": E2E_FACTOR * worst["e2e"].get("logits_rel_l2", 0)},
        "replay": {k: REPLAY_FACTOR * worst["replay"].get(src, 0) for k, src in
                   (("attn_rel_l2", "attn_out"), ("moe_rel_l2", "moe_out"), ("residual_rel_l2", "residual"),
                    ("engram_rel_l2", "block_input"), ("logits_max_abs", "logits_max_abs"),
                    ("logits_rel_l2", "logits_rel_l2"))},
    }
    return {"set": name, "standins": {k: " ".join(v) for k, v in STANDINS.items()},
            "factors": {"e2e": E2E_FACTOR, "replay": REPLAY_FACTOR}, "worst": worst,
            "recommended_before_floors": recommended, "results": results}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True)
    ap.add_argument("--ds41", default="ds41")
    ap.add_argument("--compare", type=Path, required=True, help="shared/tools/compare.py")
    ap.add_argument("--goldens", type=Path, default=Path("goldens/official"))
    ap.add_argument("--set", action="append", choices=sorted(SETS))
    ap.add_argument("--schedule", action="append", help="only goldens whose name starts with this (repeatable)")
    ap.add_argument("--mode", action="append", choices=["e2e", "replay"], help="default: both")
    ap.add_argument("--standin", action="append", choices=sorted(STANDINS), help="default: every stand-in")
    a = ap.parse_args(argv)
    for name in a.set or sorted(SETS):
        out = a.goldens / name / "calibration.json"
        old = json.loads(out.read_text())["results"] if out.exists() else {}
        report = calibrate(name, SETS[name], a.inference.resolve(), a.ds41, a.compare.resolve(), a.goldens / name,
                           a.schedule, a.mode or ("e2e", "replay"), a.standin or tuple(STANDINS), old)
        out.write_text(json.dumps(report, indent=1) + "\n")
        provenance.write_sidecar(
            out.with_name("calibration.json" + provenance.SUFFIX),
            description=f"Gate calibration of official set {name}: worst deviations of noise stand-ins (the "
                        "official model.py under other valid summation orders) end to end and in replay, scored "
                        "with compare.py, and the attn_out cells they move.",
            generator={"kind": "official-code", "name": "inference/model.py",
                       "version": provenance.sha256_file(a.inference / "model.py")[:12],
                       "environment": provenance.environment(torch=torch.__version__)},
            command=(f"python3 goldens/regen/model/calibrate.py --inference <release>/inference --ds41 ds41 "
                     f"--compare <shared>/tools/compare.py --set {name} (runs merge into calibration.json; "
                     f"the runs made are its `results` keys: STANDIN/GOLDEN/MODE)"),
            inputs=[{"name": n, "location": "external", "path": f"inference/{n}",
                     "sha256": provenance.sha256_file(a.inference / n)} for n in ("model.py", "kernel_cpu.py")]
            + [{"name": "compare.py", "location": "external", "path": "tools/compare.py",
                "sha256": provenance.sha256_file(a.compare)},
               provenance.describe_input("calibrate", HERE / "calibrate.py"),
               provenance.describe_input("driver", HERE / "run_official.py")]
            + [provenance.describe_input(p.name, p) for p in sorted((a.goldens / name).glob("p*.safetensors"))],
            outputs=["calibration.json"])
        print(f"{out}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
