#!/usr/bin/env python3
"""Declare the reference-engine trace goldens (goldens/traces/): write one provenance record per
trace with its `ds41 synth` + `ds41 forward` commands and `"sha256": null` outputs. Then
`ds41 goldens bless` runs them, fills the hashes and writes the traces:

    python3 goldens/regen/declare_reference_traces.py && ds41 goldens bless --filter traces/

The set: preset `tiny` (seed 1; window 8, index_topk 8, so the index_k difference is visible
from decode position 18), 24 tokens, three schedules (prefill only; prefill 9 + 15 decode
steps; token at a time), both numerics profiles and both index_k behaviours where they differ.
Existing records are left alone unless --force (their hashes would be lost).
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "goldens" / "traces"
PRESET, SEED = "tiny", 1
# Both layouts are declared (run once per --layout): the release layout is what the official
# checkpoint uses, the container layout is WASTE's. A preset's two layouts hold differently
# quantised weights and their own Engram constants, so each layout's traces are goldens of their own.
LAYOUT = "release"
# 24 ids below the tiny vocabulary (512), ids 0-2 avoided, with a repeated 4-gram so Engram
# n-gram hashes recur (positions 4..7 and 15..18).
TOKENS = [17, 301, 44, 95, 260, 388, 12, 477, 150, 33, 209, 71, 402, 8, 129, 260, 388, 12, 477, 56, 341, 90, 265, 19]
PLAN = [  # (prefill, numerics, index_k)
    (24, "upstream", "as-shipped"),
    (24, "exact", "as-shipped"),
    (9, "upstream", "as-shipped"),
    (9, "upstream", "owner"),
    (9, "exact", "as-shipped"),
    (9, "exact", "owner"),
    (1, "exact", "as-shipped"),
    (1, "upstream", "owner"),
]


def record(prefill, numerics, index_k, layout):
    steps = len(TOKENS) - prefill
    name = f"{PRESET}_{layout}_s{SEED}_p{prefill:02d}_d{steps:02d}_{numerics}_{index_k}.safetensors"
    ids = ",".join(map(str, TOKENS))
    errata = {"index_k_handoff": index_k, "topk_tie_order": "lower-index"}
    if numerics == "upstream":
        errata.update(gemm_summation_order="canonical", sparse_attn_block_layout="as-laid-out",
                      waste_rope_tables="f32-pow")
    else:
        errata.update(sparse_attn_block_layout="layout-independent", waste_rope_tables="f64-then-f32")
    return name, {
        "schema": "ds41-golden-provenance/1",
        "description": f"Reference-engine trace: preset {PRESET} ({layout} layout) seed {SEED}, {len(TOKENS)} tokens, prefill "
                       f"{prefill} then {steps} decode steps, numerics {numerics}, index_k {index_k}.",
        "generator": {"kind": "reference-engine", "name": "ds41-reference", "version": "unblessed"},
        "command": (f"ds41 forward --model {{input:model}} --tokens {ids} --prefill {prefill} "
                    f"--numerics {numerics} --index-k {index_k} --out {{out}}/{name}"),
        "synthetic": {"preset": PRESET, "seed": SEED},
        "inputs": [{"name": "model", "location": "generated", "path": f"{PRESET}-seed{SEED}-{layout}",
                    "sha256": "0" * 64,
                    "command": f"ds41 synth --preset {PRESET} --layout {layout} --seed {SEED} --out {{out}}"}],
        "outputs": [{"path": name, "sha256": None}],
        "errata": dict(sorted(errata.items())),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--layout", choices=["container", "release"], default=LAYOUT)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for prefill, numerics, index_k in PLAN:
        name, rec = record(prefill, numerics, index_k, a.layout)
        side = OUT / (name + ".provenance.json")
        if side.exists() and not a.force:
            print(f"{side.relative_to(ROOT)}: exists, kept")
            continue
        side.write_text(json.dumps(rec, indent=2) + "\n")
        print(f"{side.relative_to(ROOT)}: declared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
