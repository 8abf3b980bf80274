#!/usr/bin/env python3
"""DSpark (MTP) goldens from the official DS41 code: run the release `inference/model.py` on CPU
over a release-layout checkpoint with `mtp.*` stages, a prefill then single-token decode steps of
the main model, and after every forward `Transformer.forward_spec` on the main model's
`main_hidden` and sampled id, as model.py's own `__main__` does. Dumps a trace (safetensors,
docs/TRACE.md "DSpark").

Everything around model.py is run_official.py's (pins, convert.py, CPU kernels, deterministic
top-k); in addition the sampling temperature is 0 (`sample` is argmax; model.py's default 1
draws Gumbel noise), and hooks record, per decode step:

* `dspark.main_hidden` / `dspark.main_x` for every token (the prefill's rows seed the stages'
  window rings);
* per stage: the block input stream and incoming `pre`, `mid`, attention and MoE outputs,
  routed experts and weights, the block output stream and outgoing `pre`;
* the last stage's collapse (`dspark.final_pre`, `dspark.hidden`), the head's logits before
  and after the Markov bias, the bias of every step, the Markov embedding, the sampled ids
  (`dspark.output_ids`, [last id, draft 1..block]) and the confidence.

  python3 goldens/regen/model/run_dspark.py --inference RELEASE/inference \\
      --checkpoint /tmp/window-mtp --tokens 3,7,11,5,19 --prefill 3 --out /tmp/d.safetensors

The committed sets (SETS below: preset, seed, tokens, schedules) are remade by

  python3 goldens/regen/model/run_dspark.py --inference RELEASE/inference --ds41 target/release/ds41 \\
      --sets goldens/official [--set NAME]...

which writes goldens/official/NAME/dspark_pPP_dDD.safetensors with provenance.
"""
import argparse
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import provenance  # noqa: E402
import run_official as ro  # noqa: E402

TRACE_FORMAT = "ds41-dspark-trace/1"
# name -> preset, seed, tokens (official_sets.ids), prefill lengths (then single-token decode)
SETS = {
    "window_mtp_s4": {"preset": "window-mtp", "seed": 4, "tokens": (404, 48), "prefills": [37, 5],
                      "about": "one stage, block 2, noise 3, targets [2, 3], window 32 (ring wraps from p >= 32)"},
    "dspark_s6": {"preset": "dspark", "seed": 6, "tokens": (606, 24), "prefills": [18, 9],
                  "about": "three stages, block 5, noise 300, targets [2, 3, 4] (Engram on 2), stages top-2 of 4 "
                           "experts, window 16 (a prefill of 18 seeds wrapped rings)"},
}
PER_STAGE = ("block_input", "pre_mix", "mid", "attn_out", "moe_out", "residual", "out_pre",
             "experts", "expert_weights")


class SpecRecorder:
    """Collects the DSpark trace: `rows` holds, per name, one tensor per decode step."""

    def __init__(self, model, forcing=None):
        self.model = model
        self.drafting = False    # inside a forward_spec at start_pos > 0
        self.step = {}
        self.steps = []
        self.main = {"main_hidden": [], "main_x": []}
        self.forcing = forcing   # replay: the golden's tensors (docs/TRACE.md "DSpark")
        self._hook()

    def put(self, name, value):
        v = value.detach()
        self.step[name] = v.to(torch.float32 if v.is_floating_point() else torch.int64).clone()

    def _hook(self):
        mtp = self.model.mtp
        for s, block in enumerate(mtp):
            block.register_forward_pre_hook(self._block_pre(s))
            block.register_forward_hook(self._block_post(s))
            block.hc_post = self._hc_post(s, block.hc_post)
            block.attn.register_forward_hook(self._capture(f"attn_out.S{s}"))
            block.ffn.register_forward_hook(self._capture(f"moe_out.S{s}"))
            block.ffn.gate.register_forward_hook(self._gate_post(s))
        last = mtp[-1]
        last.norm.register_forward_pre_hook(self._capture_input("hidden"))
        last.markov_head.register_forward_hook(self._markov)
        # the tied head is the main model's: record it only while drafting, before the Markov
        # bias is added in place
        self.model.head.register_forward_hook(self._head)
        real_embed = mtp[0].forward_embed

        def forward_embed(main_hidden, input_ids):
            x, main_x = real_embed(main_hidden, input_ids)
            self.main["main_hidden"].append(main_hidden[0].detach().float().clone())
            self.main["main_x"].append(main_x[0].detach().float().clone())
            return x, main_x
        mtp[0].forward_embed = forward_embed
        real_head = last.forward_head

        def forward_head(x, pre_mix, input_ids):
            self.put("final_pre", pre_mix[0])
            output_ids, logits, confidence = real_head(x, pre_mix, input_ids)
            self.put("logits", logits[0])
            own = self.step.pop("own_ids", None)  # replay: what this run sampled, not the forced ids
            self.put("output_ids", output_ids[0] if own is None else torch.stack([output_ids[0, 0], *own]))
            self.put("confidence", confidence[0])
            return output_ids, logits, confidence
        last.forward_head = forward_head

    def _block_pre(self, s):
        def hook(module, args):
            if not self.drafting:
                return None
            if self.forcing is not None:  # replay: the stage starts from the golden's stream and pre
                n = len(self.steps)
                x = self.forcing["dspark.block_input"][n, s].to(args[0].dtype)[None].contiguous()
                pre = self.forcing["dspark.pre_mix"][n, s].to(args[2].dtype)[None].contiguous()
                args = (x, args[1], pre, *args[3:])
            self.put(f"block_input.S{s}", args[0][0])
            self.put(f"pre_mix.S{s}", args[2][0])
            return args
        return hook

    def forced_sample(self, real):
        """model.py's `sample`, recording this run's id and, in replay, handing the golden's on."""
        def sample(logits, temperature=1.0):
            own = real(logits, temperature)
            if not self.drafting or self.forcing is None:
                return own
            ids = self.step.setdefault("own_ids", [])
            ids.append(own[0])
            golden = self.forcing["dspark.output_ids"][len(self.steps), len(ids)]
            return torch.full_like(own, int(golden))
        return sample

    def _block_post(self, s):
        def hook(module, args, output):
            if self.drafting:
                stream, pre = output
                self.put(f"residual.S{s}", stream[0])
                self.put(f"out_pre.S{s}", pre[0])
        return hook

    def _hc_post(self, s, real):
        def hc_post(x, residual, post, comb):
            out = real(x, residual, post, comb)
            if self.drafting and f"mid.S{s}" not in self.step:
                self.put(f"mid.S{s}", out[0])
            return out
        return hc_post

    def _capture(self, name):
        def hook(module, args, output):
            if self.drafting:
                self.put(name, output[0])
        return hook

    def _capture_input(self, name):
        def hook(module, args):
            if self.drafting:
                self.put(name, args[0][0])
        return hook

    def _gate_post(self, s):
        def hook(module, args, output):
            if self.drafting:
                weights, indices = output
                self.put(f"expert_weights.S{s}", weights)
                self.put(f"experts.S{s}", indices)
        return hook

    def _head(self, module, args, output):
        if self.drafting and "head_logits" not in self.step:
            self.put("head_logits", output[0])

    def _markov(self, module, args, output):
        bias, embed = output
        self.step.setdefault("markov_bias", []).append(bias[0].detach().float().clone())
        self.step.setdefault("markov_embed", []).append(embed[0].detach().float().clone())

    def begin_draft(self, position):
        self.drafting = True
        self.step = {"position": torch.tensor(position)}

    def end_draft(self):
        self.drafting = False
        for name in ("markov_bias", "markov_embed"):
            self.step[name] = torch.stack(self.step[name])
        self.steps.append(self.step)
        self.step = {}

    def tensors(self, tokens, n_stages):
        out = {"input_ids": torch.tensor(tokens, dtype=torch.int64)}
        for name, rows in self.main.items():
            out[f"dspark.{name}"] = torch.cat(rows)
        if not self.steps:
            return out

        def steps(name):
            return torch.stack([st[name] for st in self.steps])
        out["dspark.positions"] = steps("position").to(torch.int64)
        for name in PER_STAGE:
            value = torch.stack([steps(f"{name}.S{s}") for s in range(n_stages)], dim=1)
            out[f"dspark.{name}"] = value.to(torch.int32 if name == "experts" else torch.float32)
        for name in ("final_pre", "hidden", "head_logits", "markov_bias", "markov_embed", "logits", "confidence"):
            out[f"dspark.{name}"] = steps(name).to(torch.float32)
        out["dspark.output_ids"] = steps("output_ids").to(torch.int64)
        out["dspark.input_ids"] = torch.cat(
            [out["dspark.output_ids"][:, :1],
             torch.full((len(self.steps), self.steps[0]["logits"].shape[0] - 1), -1, dtype=torch.int64)], dim=1)
        return out


def run(module, args, state_dict, tokens, prefill, threads, tokenizer=None, standin=None, forcing=None):
    """The schedule with forward_spec after every forward; `forcing` (replay): a DSpark golden
    whose main_hidden, draft ids, stage inputs and sampled ids are forced in (docs/TRACE.md)."""
    args.temperature = 0.0  # model.py's `sample` is argmax at temperature 0
    model = ro.load_model(module, args, state_dict, tokenizer, threads)
    if len(model.mtp) == 0:
        raise ro.DriverError("the config has no DSpark stages (dspark_block_size 0 or n_mtp_layers 0)")
    _, shared = ro.find_shared_slot(module)
    for field in ("compress_kv", "index_k", "topk_idxs", "candidates"):
        if hasattr(shared, field):
            setattr(shared, field, None)
    rec = SpecRecorder(model, forcing)

    def forced(main_hidden, output_ids, start, rows, step):
        """forward_spec's (input_ids, main_hidden), the golden's in replay."""
        if forcing is None:
            return output_ids, main_hidden
        hidden = forcing["dspark.main_hidden"][start:start + rows].to(main_hidden.dtype)[None].contiguous()
        first = output_ids if step is None else torch.full_like(output_ids, int(forcing["dspark.input_ids"][step, 0]))
        return first, hidden

    real_sample = module.sample
    module.sample = rec.forced_sample(real_sample)
    try:
        with ro.deterministic_topk(), ro.standin_numerics(module, standin), torch.inference_mode():
            ids = torch.tensor([tokens], dtype=torch.long)
            output_ids, _, main_hidden = model.forward(ids[:, :prefill], 0)
            model.forward_spec(*forced(main_hidden, output_ids, 0, prefill, None), 0)
            for p in range(prefill, len(tokens)):
                output_ids, _, main_hidden = model.forward(ids[:, p:p + 1], p)
                rec.begin_draft(p)
                model.forward_spec(*forced(main_hidden, output_ids, p, 1, p - prefill), p)
                rec.end_draft()
    finally:
        module.sample = real_sample
    out = rec.tensors(tokens, len(model.mtp))
    noise = args.dspark_noise_token_id
    if "dspark.input_ids" in out:
        out["dspark.input_ids"][:, 1:] = noise
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="the release inference/ directory")
    ap.add_argument("--checkpoint", type=Path, help="release-layout checkpoint with mtp.* stages")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--sets", type=Path, help="remake the committed sets (SETS) under this directory")
    ap.add_argument("--set", action="append", choices=sorted(SETS), help="with --sets: only these (default: all)")
    ap.add_argument("--ds41", default="ds41", help="with --sets: the ds41 binary (for `ds41 synth`)")
    ap.add_argument("--replay", type=Path, help="teacher-forced from this DSpark golden")
    ap.add_argument("--standin", choices=sorted(ro.STANDINS),
                    help="calibration only: another valid summation order (run_official.py STANDINS)")
    ap.add_argument("--calibrate", action="store_true",
                    help="with --sets: run every stand-in on every schedule and write NAME/dspark_calibration.json "
                         "(worst deviation per tensor from the golden)")
    ap.add_argument("--prefill", type=int, help="tokens in the first forward (default: all but one)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", choices=sorted(ro.KERNELS), default="tt-metal")
    ap.add_argument("--allow-unpinned", action="store_true")
    ap.add_argument("--provenance", action="store_true", help="write OUT.provenance.json")
    ap.add_argument("--synth-command", help="the `ds41 synth ...` command that made --checkpoint (recorded)")
    ap.add_argument("--synth-preset"), ap.add_argument("--synth-seed", type=int)
    a = ap.parse_args(argv)
    if a.sets:
        return make_sets(a)
    if not (a.checkpoint and a.tokens and a.out):
        ap.error("--checkpoint, --tokens and --out are required (or --sets)")

    from safetensors.torch import load_file, save_file
    tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    prefill = a.prefill or len(tokens) - 1
    if not 1 <= prefill <= len(tokens):
        ap.error(f"--prefill {prefill} outside 1..{len(tokens)}")
    try:
        pins = ro.verify_pins(a.inference, a.allow_unpinned)
        import json
        cfg = json.loads((a.checkpoint / "inference" / "config.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            converted = ro.convert_checkpoint(a.inference.resolve(), a.checkpoint.resolve(), Path(tmp),
                                              ro.DEFAULT_CONVERT)
            state = load_file(str(converted))
        kernels, kernels_path = ro.kernel_module(a.inference.resolve(), a.kernels)
        module = ro.import_model(a.inference.resolve(), kernels)
        model_args, _ = ro.build_args(module, cfg, len(tokens) + int(cfg.get("dspark_block_size", 0)))
        tokenizer = ro.FastTokenizer(a.checkpoint / "tokenizer.json") if model_args.engram_layer_ids else None
        forcing = load_file(str(a.replay)) if a.replay else None
        tensors = run(module, model_args, state, tokens, prefill, a.threads, tokenizer, a.standin, forcing)
    except ro.DriverError as e:
        print(f"run_dspark: error: {e}", file=sys.stderr)
        return 2
    metadata = {
        "engine": f"official inference/model.py (CPU, {a.kernels} kernels)", "version": pins["model.py"][:12],
        "layout": "release", "numerics": "upstream", "index-k": "as-shipped",
        "tie_rule": "largest first; equal values -> lower index; argmax: first maximum",
        "temperature": "0", "prefill": str(prefill), "decode_steps": str(len(tokens) - prefill),
        "format": TRACE_FORMAT, "model_py_sha256": pins["model.py"],
        "kernels": a.kernels, "kernels_sha256": provenance.sha256_file(kernels_path),
        "torch": torch.__version__, "threads": str(a.threads), "mode": "replay" if a.replay else "forward",
        **({"standin": a.standin} if a.standin else {}),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    old = load_file(str(a.out)) if a.out.exists() else None
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(a.out), metadata=metadata)
    print(provenance.report_tensor_changes(a.out, old, tensors))
    if a.provenance:
        ckpt_input = provenance.describe_input("checkpoint", a.checkpoint)
        if a.synth_command:
            ckpt_input = {"name": "checkpoint", "location": "generated", "path": a.checkpoint.name,
                          "sha256": ckpt_input["sha256"], "command": a.synth_command}
        inputs = [ckpt_input] + [
            {"name": n, "location": "external", "path": f"inference/{n}", "sha256": h} for n, h in pins.items()
        ] + [{"name": "kernel_cpu.py", "location": "external", "path": "inference/kernel_cpu.py",
              "sha256": provenance.sha256_file(kernels_path)},
             provenance.describe_input("driver", HERE / "run_dspark.py"),
             provenance.describe_input("driver_base", HERE / "run_official.py"),
             provenance.describe_input("kernels_ds41", HERE / "ds41_kernels.py")]
        provenance.write_sidecar(
            a.out.with_name(a.out.name + provenance.SUFFIX),
            description=f"DSpark trace of the official model.py on CPU ({a.kernels} kernels), tokens {a.tokens}, "
                        f"prefill {prefill} then decode, forward_spec after every forward, temperature 0.",
            generator={"kind": "official-code", "name": "inference/model.py", "version": pins["model.py"][:12],
                       "environment": provenance.environment(torch=torch.__version__, threads=a.threads)},
            command=(f"python3 goldens/regen/model/run_dspark.py --inference <release>/inference "
                     f"--checkpoint {{input:checkpoint}} --tokens {a.tokens} --prefill {prefill} "
                     f"--kernels {a.kernels} --out {{out}}/{a.out.name}"),
            inputs=inputs, outputs=[a.out.name],
            synthetic={"preset": a.synth_preset, "seed": a.synth_seed} if a.synth_preset else None,
            errata={"topk_tie_order": "lower-index", "dspark_sampling": "argmax", "dspark_outline": "model-py"},
        )
    return 0


# Cells of the calibration: per token (main_hidden, main_x), per draft step and stage, per step.
PER_TOKEN = ("dspark.main_hidden", "dspark.main_x")


def deviations(golden: dict, got: dict) -> dict:
    """Per float tensor, the worst cell's max |d| and relative L2 distance, and for the ids the
    number of steps whose sampled ids differ."""
    out = {}
    for name, g in golden.items():
        if not name.startswith("dspark.") or name not in got:
            continue
        o = got[name]
        if not g.is_floating_point():
            out[name] = {"cells_differ": int((g != o).flatten(1).any(dim=1).sum()) if g.dim() > 1 else int((g != o).sum())}
            continue
        cells = 2 if g.dim() > 2 and name.split(".")[1] in PER_STAGE else 1
        gd, od = g.double().flatten(cells), o.double().flatten(cells)
        d = (gd - od).abs()
        rel = (d.square().sum(-1) / gd.square().sum(-1).clamp_min(1e-300)).sqrt()
        out[name] = {"max_abs": float(d.max()), "rel_l2": float(rel.max())}
    return out


def calibrate(a, name, spec, ckpt, tokens, synth):
    """Every stand-in of run_official.py on every schedule, against the committed golden."""
    import json
    from safetensors.torch import load_file
    n = spec["tokens"][1]
    results, worst = {}, {}
    for prefill in spec["prefills"]:
        sched = f"dspark_p{prefill:02d}_d{n - prefill:02d}"
        golden = load_file(str(a.sets / name / f"{sched}.safetensors"))
        for standin in sorted(ro.STANDINS):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "standin.safetensors"
                if main(["--inference", str(a.inference), "--checkpoint", str(ckpt), "--tokens", tokens,
                         "--prefill", str(prefill), "--kernels", a.kernels, "--out", str(out),
                         "--standin", standin]) != 0:
                    raise SystemExit(f"stand-in {standin} on {sched} failed")
                dev = deviations(golden, load_file(str(out)))
            results[f"{standin}/{sched}"] = dev
            for tensor, v in dev.items():
                w = worst.setdefault(tensor, {})
                for k, x in v.items():
                    w[k] = max(w.get(k, 0), x)
    target = a.sets / name / "dspark_calibration.json"
    target.write_text(json.dumps({"set": name, "worst": worst, "results": results}, indent=1, sort_keys=True) + "\n")
    inputs = [{"name": "checkpoint", "location": "generated", "path": ckpt.name,
               "sha256": provenance.tree_sha256(ckpt), "command": synth},
              provenance.describe_input("driver", HERE / "run_dspark.py"),
              provenance.describe_input("driver_base", HERE / "run_official.py")]
    inputs += [provenance.describe_input(f"dspark_p{p:02d}_d{n - p:02d}.safetensors",
                                         a.sets / name / f"dspark_p{p:02d}_d{n - p:02d}.safetensors")
               for p in spec["prefills"]]
    provenance.write_sidecar(
        target.with_name(target.name + provenance.SUFFIX),
        description=f"DSpark gate calibration of set {name}: worst deviation from the committed DSpark goldens of "
                    f"the official model.py under other valid summation orders (stand-ins "
                    f"{', '.join(sorted(ro.STANDINS))}), per tensor; an end-to-end threshold is twice the worst.",
        generator={"kind": "official-code", "name": "inference/model.py", "version": ro.PINNED["model.py"][:12],
                   "environment": provenance.environment(torch=torch.__version__, threads=1)},
        command=(f"python3 goldens/regen/model/run_dspark.py --inference <release>/inference --ds41 ds41 "
                 f"--sets {{out}}/.. --set {name} --calibrate"),
        inputs=inputs, outputs=[target.name],
        synthetic={"preset": spec["preset"], "seed": spec["seed"]},
    )
    print(f"{target}: {json.dumps(worst)}")


def make_sets(a):
    """Synthesise each set's checkpoint and run this script on it for every schedule."""
    import subprocess
    from official_sets import ids
    for name in a.set or sorted(SETS):
        spec = SETS[name]
        tokens = ",".join(map(str, ids(*spec["tokens"])))
        n = spec["tokens"][1]
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp) / f"{spec['preset']}-seed{spec['seed']}"
            subprocess.run([a.ds41, "synth", "--preset", spec["preset"], "--layout", "release", "--seed",
                            str(spec["seed"]), "--out", str(ckpt)], check=True, capture_output=True)
            synth = f"ds41 synth --preset {spec['preset']} --layout release --seed {spec['seed']} --out {{out}}"
            if a.calibrate:
                calibrate(a, name, spec, ckpt, tokens, synth)
                continue
            for prefill in spec["prefills"]:
                out = a.sets / name / f"dspark_p{prefill:02d}_d{n - prefill:02d}.safetensors"
                argv = ["--inference", str(a.inference), "--checkpoint", str(ckpt), "--tokens", tokens,
                        "--prefill", str(prefill), "--kernels", a.kernels, "--out", str(out), "--provenance",
                        "--synth-command", synth, "--synth-preset", spec["preset"], "--synth-seed", str(spec["seed"])]
                if main(argv) != 0:
                    return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
