#!/usr/bin/env python3
"""Time the reference engine against the official inference code and WASTE's f32 oracle on the
same checkpoints, through the same protocol (conformance/PROTOCOL.md), and print the ratios.

Every engine runs as a protocol process (`ds41 serve-adapter`, adapters/official/adapter.py,
adapters/waste-oracle/adapter.py). Each forward is timed twice: wall clock, and the CPU time
the engine process spent on it (utime + stime from /proc/PID/stat, all its threads), which is
what to compare on a shared machine. The first forward of each engine is a warm-up (imports,
kernel set-up) and is not counted; the best of `--reps` is reported.

  python3 bench/side_by_side.py --inference DIR --waste DIR            # both comparisons
  python3 bench/side_by_side.py --inference DIR --tokens 32 --prefill 32 --json

Checkpoints: the synthetic `tiny` release (official code vs reference) and the `waste-tiny`
container (WASTE oracle vs reference), generated with `ds41 synth` into --work; or any
checkpoint with --release-model / --container-model. Nothing here is a pass/fail check.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of process `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class ProtocolEngine:
    """One engine process spoken to over the JSON-lines protocol."""

    def __init__(self, label, command):
        self.label = label
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.next_id = 1
        hello = self.call({"op": "hello", "protocol": "ds41-engine/1"})
        self.name = hello["engine"]["name"]
        self.capabilities = set(hello.get("capabilities", []))

    def call(self, request):
        request = dict(request, id=self.next_id)
        self.next_id += 1
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.label}: the engine ended (exit {self.proc.wait()})")
            if line.strip():
                break
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"{self.label}: {reply.get('error')}")
        return reply.get("result") or {}

    def timed_forward(self, request):
        before_cpu, before = cpu_seconds(self.proc.pid), time.perf_counter()
        self.call(request)
        return time.perf_counter() - before, cpu_seconds(self.proc.pid) - before_cpu

    def close(self):
        try:
            self.call({"op": "shutdown"})
        except (RuntimeError, BrokenPipeError):
            pass
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def measure(engine, model, tokens, prefill, numerics, index_k, reps, work):
    request = {
        "op": "forward", "model": str(model), "tokens": tokens, "prefill": prefill,
        "numerics": numerics, "index_k": index_k, "out": str(work / f"{engine.label}.safetensors"),
        "save_state": None, "load_state": None, "replay": None, "engram_token_map": None,
    }
    if "load" in engine.capabilities:
        engine.call({"op": "load", "model": str(model), "verify": False})
    engine.timed_forward(request)  # warm-up
    runs = [engine.timed_forward(request) for _ in range(reps)]
    wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    return {"engine": engine.label, "name": engine.name, "model": str(model), "tokens": len(tokens),
            "prefill": prefill, "numerics": numerics, "wall_s": wall, "cpu_s": cpu,
            "cpu_ms_per_token": cpu * 1e3 / len(tokens)}


def vocab_size(model):
    """The vocabulary of a checkpoint (release config.json, or a container manifest's config)."""
    model = Path(model)
    if (model / "manifest.json").exists():
        cfg = json.loads((model / "manifest.json").read_text())["config"]
    else:
        cfg = json.loads((model / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return int(cfg["vocab_size"])


def compare(pairs, args, work):
    rows = []
    for label, command, model, numerics in pairs:
        vocab = vocab_size(model)
        tokens = [(i * 2654435761 + 17) % vocab for i in range(args.tokens)]
        ref = ProtocolEngine("reference", [str(args.ds41), "serve-adapter"])
        other = ProtocolEngine(label, command)
        try:
            r = measure(ref, model, tokens, args.prefill, numerics, "as-shipped", args.reps, work)
            o = measure(other, model, tokens, args.prefill, numerics, "as-shipped", args.reps, work)
        finally:
            ref.close()
            other.close()
        o["cpu_ratio_to_reference"] = o["cpu_s"] / r["cpu_s"] if r["cpu_s"] > 0 else None
        o["wall_ratio_to_reference"] = o["wall_s"] / r["wall_s"]
        rows += [r, o]
    return rows


def synth(ds41, preset, layout, out):
    if not out.exists():
        subprocess.run([str(ds41), "synth", "--preset", preset, "--layout", layout, "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ds41", type=Path, default=ROOT / "target" / "release" / "ds41")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the adapters (torch installed)")
    ap.add_argument("--inference", type=Path, default=os.environ.get("DS41_OFFICIAL_INFERENCE"),
                    help="the release inference/ directory (official code vs reference)")
    ap.add_argument("--waste", type=Path, default=os.environ.get("DS41_WASTE"),
                    help="WASTE's tools/ parent directory (oracle vs reference)")
    ap.add_argument("--release-model", type=Path, help="release checkpoint (default: synthetic tiny)")
    ap.add_argument("--container-model", type=Path, help="container (default: synthetic waste-tiny)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=1, help="first chunk size (1: token at a time)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads of every engine")
    ap.add_argument("--work", type=Path, help="directory for checkpoints and traces (default: temporary)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.ds41.exists():
        ap.error(f"no ds41 binary at {args.ds41} (cargo build --release, or --ds41)")
    if args.inference is None and args.waste is None:
        ap.error("name at least one engine to compare: --inference DIR and/or --waste DIR")
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        pairs = []
        if args.inference is not None:
            model = args.release_model or synth(args.ds41, "tiny", "release", work / "tiny")
            pairs.append(("official", [args.python, str(ROOT / "adapters/official/adapter.py"), "--inference",
                                       str(args.inference), "--threads", str(args.threads)], model, "upstream"))
        if args.waste is not None:
            model = args.container_model or synth(args.ds41, "waste-tiny", "container", work / "waste-tiny")
            pairs.append(("waste-oracle", [args.python, str(ROOT / "adapters/waste-oracle/adapter.py"), "--waste",
                                           str(args.waste), "--threads", str(args.threads)], model, "exact"))
        rows = compare(pairs, args, work)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'engine':<14} {'model':<28} {'tokens':>6} {'prefill':>7} {'wall s':>8} {'cpu s':>8} "
          f"{'cpu ms/tok':>10} {'cpu ratio':>9}")
    for r in rows:
        ratio = r.get("cpu_ratio_to_reference")
        print(f"{r['engine']:<14} {Path(r['model']).name:<28} {r['tokens']:>6} {r['prefill']:>7} "
              f"{r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['cpu_ms_per_token']:>10.2f} "
              f"{'' if ratio is None else f'{ratio:.1f}x':>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
