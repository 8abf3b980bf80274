#!/usr/bin/env python3
"""Model goldens from the official DS41 code: run a release `inference/` directory's unmodified
`model.py` on CPU over a release-layout checkpoint and dump a trace (safetensors).

What this driver adds around model.py (and nothing else):
* the six CUDA kernels are replaced by ds41_kernels.py (this directory; MODEL.md §5), installed
  as the module `kernel` before model.py is imported;
* `torch.topk` / `Tensor.topk` are replaced by the deterministic tie rule (larger first, equal
  values -> lower index; MODEL.md §5.10, errata `topk_tie_order`);
* `--index-k owner` adds a forward pre-hook on every index-key owner's indexer that publishes its
  own key cache to the shared `index_k` slot before it runs (MODEL.md §8.3, errata
  `index_k_handoff`); `as-shipped` leaves model.py alone;
* forward hooks record the trace: per token and layer the block input/output streams, the
  incoming `pre` mix, attention and MoE outputs, routed experts and weights (gate order), the
  indexer selections (from the sparse_attn index lists, window entries removed, compressed
  positions ascending, -1 padded), Engram hash ids, logits, and the selection margins of every
  top-k decision.

model.py is not in this sandbox. This driver is written against its documented structure
(MODEL.md §6, upstream/official_a/README.md: `ModelArgs`, `Transformer(args)`,
`forward(input_ids, start_pos)`, `layers[l]` blocks with `attn` / `ffn` / `ffn.gate`, the
shared `index_k` slot, convert.py for loading) and fails with a clear message where that
structure is not found. The sha256 of model.py, engram.py and convert.py are checked against
the release pins (MODEL.md §0) unless --allow-unpinned.

Example (from the repository root; the checkpoint from `ds41 synth`):
  python3 goldens/regen/model/run_official.py --inference RELEASE/inference \\
      --checkpoint /tmp/tiny --tokens 3,7,11,5,19,23,2,41 --prefill 5 --index-k owner \\
      --out goldens/model/tiny_p05_owner.safetensors --provenance
"""
import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import ds41_kernels  # noqa: E402
import provenance  # noqa: E402

PINNED = {  # MODEL.md §0
    "model.py": "4e9ae23620edc8028ccc5d5fef552ab7fdc7dcd6f79608754fe9f67644056f65",
    "engram.py": "11f35ecbead8150c35aa002b3d180ef290b05a25afe883a11884f94d476d3897",
    "convert.py": "035028340479145594a81d6084a8424e57363adf83c0d5983914783d95614d76",
}
TRACE_FORMAT = "ds41-trace/1"
DEFAULT_CONVERT = ("--hf-ckpt-path {ckpt} --save-path {out} --n-experts {n_experts} "
                   "--model-parallel 1 --expert-dtype fp4")
# Token types of image_processor.py (MODEL.md §6.1), for a stub when PIL is unavailable.
TOKEN_TYPES = {"TEXT": -1, "IMAGE_START": 0, "IMAGE": 1, "IMAGE_NEW_LINE": 2, "IMAGE_END": 3}


class DriverError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify_pins(inference: Path, allow_unpinned: bool) -> dict:
    found = {}
    for name, pin in PINNED.items():
        path = inference / name
        if not path.is_file():
            raise DriverError(f"{path}: missing (expected the release inference/ directory)")
        digest = sha256(path)
        found[name] = digest
        if digest != pin and not allow_unpinned:
            raise DriverError(f"{path}: sha256 {digest} is not the release pin {pin} (--allow-unpinned to run anyway)")
    return found


def convert_checkpoint(inference: Path, ckpt: Path, out: Path, template: str) -> Path:
    """Run the release convert.py (mp=1) into `out`; returns the converted safetensors file."""
    cfg = json.loads((ckpt / "inference" / "config.json").read_text())
    args = template.format(ckpt=ckpt, out=out, n_experts=cfg["n_routed_experts"]).split()
    proc = subprocess.run([sys.executable, str(inference / "convert.py"), *args],
                          cwd=inference, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DriverError(f"convert.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    files = sorted(out.glob("*.safetensors"))
    if len(files) != 1:
        raise DriverError(f"convert.py wrote {len(files)} safetensors files into {out}, expected 1 (mp=1)")
    return files[0]


def import_model(inference: Path):
    """Import model.py with our kernels installed as `kernel`."""
    sys.modules["kernel"] = ds41_kernels
    sys.path.insert(0, str(inference))
    try:
        import image_processor  # noqa: F401  (needs PIL; text-only runs only need its constants)
    except ImportError:
        stub = types.ModuleType("image_processor")
        stub.__dict__.update(TOKEN_TYPES)
        sys.modules["image_processor"] = stub
    spec = importlib.util.spec_from_file_location("ds41_official_model", inference / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ds41_official_model"] = module
    spec.loader.exec_module(module)
    for name in ("ModelArgs", "Transformer"):
        if not hasattr(module, name):
            raise DriverError(f"{inference / 'model.py'}: no `{name}`")
    return module


def build_args(module, cfg: dict, max_seq_len: int):
    fields = {f.name for f in dataclasses.fields(module.ModelArgs)} if dataclasses.is_dataclass(module.ModelArgs) \
        else set(inspect.signature(module.ModelArgs).parameters)
    ignored = sorted(set(cfg) - fields)
    kwargs = {k: v for k, v in cfg.items() if k in fields}
    kwargs["max_batch_size"] = 1
    kwargs["max_seq_len"] = max(int(kwargs.get("max_seq_len", 0)), max_seq_len)
    return module.ModelArgs(**kwargs), ignored


@contextlib.contextmanager
def deterministic_topk():
    saved = (torch.topk, torch.Tensor.topk)
    torch.topk = ds41_kernels.stable_topk
    torch.Tensor.topk = lambda self, *a, **k: ds41_kernels.stable_topk(self, *a, **k)
    try:
        yield
    finally:
        torch.topk, torch.Tensor.topk = saved


def find_shared_slot(module):
    """The process-global hand-off record: the module-level object with an `index_k` attribute."""
    hits = [(name, obj) for name, obj in vars(module).items()
            if not isinstance(obj, type) and hasattr(obj, "index_k")]
    if len(hits) != 1:
        raise DriverError(f"model.py: expected one module-level object with `index_k`, found {[n for n, _ in hits]}")
    return hits[0]


def owner_indexers(model, args):
    """(layer, module) of every index-key owner's indexer: the submodule holding `k_cache`."""
    owners = []
    for layer_id in args.kv_source_layers:
        hits = [m for _, m in model.layers[layer_id].named_modules() if isinstance(getattr(m, "k_cache", None), torch.Tensor)]
        if len(hits) != 1:
            raise DriverError(f"layer {layer_id}: expected one submodule with a `k_cache`, found {len(hits)}")
        owners.append((layer_id, hits[0]))
    return owners


class Recorder:
    """Collects the trace over a schedule of forwards (one list entry per forward)."""

    def __init__(self, model, args):
        self.args = args
        self.layer = None
        self.context = []
        self.forward_kind = None   # ("prefill", S) or ("decode", 1)
        self.rows = {}             # name -> list of tensors [S, ...] per forward
        self.current = {}          # name -> tensor for the forward in progress
        self.margins = {}
        self.engram_cols = (args.engram_max_ngram_size - 1) * args.engram_n_heads
        self.engram_layers = list(getattr(args, "engram_layer_ids", []))
        self._hook(model)

    def put(self, name, value):
        self.current[name] = value.detach().to(torch.float32 if value.is_floating_point() else torch.int64).clone()

    def _hook(self, model):
        for l, block in enumerate(model.layers):
            block.register_forward_pre_hook(self._block_pre(l), with_kwargs=True)
            block.register_forward_hook(self._block_post(l))
            for name, key in (("attn", "attn_out"), ("ffn", "moe_out")):
                sub = getattr(block, name, None)
                if sub is not None:
                    sub.register_forward_hook(self._capture(f"{key}.L{l}"))
            gate = getattr(getattr(block, "ffn", None), "gate", None)
            if gate is not None:
                gate.register_forward_pre_hook(lambda m, a: self._enter("gate"))
                gate.register_forward_hook(self._gate_post(l))
            for name, sub in block.named_modules():
                if name.endswith("indexer"):
                    sub.register_forward_pre_hook(lambda m, a: self._enter("indexer"))
                    sub.register_forward_hook(lambda m, a, o: self._leave())
                if "engram" in type(sub).__name__.lower() and l in self.engram_layers:
                    for _, part in sub.named_modules():
                        part.register_forward_pre_hook(self._engram_ids(l), with_kwargs=True)

    # Hooks must return None: a forward hook's return value replaces the module's output.
    def _enter(self, kind):
        self.context.append(kind)

    def _leave(self):
        self.context.pop()

    def _block_pre(self, l):
        def hook(module, args, kwargs):
            self.layer = l
            stream = args[0] if args else next(iter(kwargs.values()))
            self.put(f"block_input.L{l}", stream[0])
            pre = args[1] if len(args) > 1 else None
            if isinstance(pre, torch.Tensor):
                tokens, hc = stream.shape[1], stream.shape[2]
                pre = pre.reshape(-1, hc)
                self.put(f"pre_mix.L{l}", pre.expand(tokens, hc) if pre.shape[0] == 1 else pre)
        return hook

    def _block_post(self, l):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.put(f"residual.L{l}", out[0])
            self.layer = None
        return hook

    def _capture(self, name):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            self.put(name, out[0] if out.dim() == 3 else out.reshape(-1, out.shape[-1]))
        return hook

    def _gate_post(self, l):
        def hook(module, args, output):
            self.context.pop()
            weights, indices = output
            self.put(f"expert_weights.L{l}", weights.reshape(-1, weights.shape[-1]))
            self.put(f"experts.L{l}", indices.reshape(-1, indices.shape[-1]))
        return hook

    def _engram_ids(self, l):
        def hook(module, args, kwargs):
            key = f"engram_hash.L{l}"
            if key in self.current:
                return
            for value in list(args) + list(kwargs.values()):
                if isinstance(value, torch.Tensor) and not value.is_floating_point() \
                        and value.dim() >= 2 and value.shape[-1] == self.engram_cols:
                    self.put(key, value.reshape(-1, self.engram_cols))
                    return
        return hook

    def on_topk(self, values, k):
        if self.layer is None or not self.context:
            return
        margin = ds41_kernels.selection_margin(values.detach(), k).reshape(-1)
        key = ("margin.experts" if self.context[-1] == "gate" else "margin.topk") + f".L{self.layer}"
        prev = self.current.get(key)
        if prev is not None and prev.shape == margin.shape:
            margin = torch.minimum(prev, margin)
        self.current[key] = margin.to(torch.float32)

    def on_sparse_attn(self, topk_idxs):
        l = self.layer
        if l is None or l not in self.args.index_source_layers:
            return
        kind, s = self.forward_kind
        offset = s if kind == "prefill" else self.args.window_size
        width = self.args.index_topk
        rows = []
        for row in topk_idxs[0].tolist():
            comp = sorted(i - offset for i in row if i >= offset)
            if len(comp) > width:
                raise DriverError(f"layer {l}: {len(comp)} compressed entries exceed index_topk {width}")
            rows.append(comp + [-1] * (width - len(comp)))
        self.current[f"topk.L{l}"] = torch.tensor(rows, dtype=torch.int64)

    def end_forward(self, logits):
        self.current["logits"] = logits.detach().to(torch.float32).reshape(1, -1)
        for name, value in self.current.items():
            self.rows.setdefault(name, []).append(value)
        self.current = {}

    def tensors(self, tokens, positions):
        """Assemble [tokens, layers, ...] tensors in the trace layout."""
        n_layers = self.args.n_layers
        out = {"input_ids": torch.tensor(tokens, dtype=torch.int64),
               "logits": torch.cat(self.rows["logits"]),
               "logits_positions": torch.tensor(positions, dtype=torch.int64)}

        def stack(prefix, layers, dtype):
            per_layer = []
            for l in layers:
                chunks = self.rows.get(f"{prefix}.L{l}")
                if chunks is None:
                    return None
                per_layer.append(torch.cat(chunks))
            return torch.stack(per_layer, dim=1).to(dtype)

        layers = range(n_layers)
        for name, dtype in (("residual", torch.float32), ("block_input", torch.float32), ("pre_mix", torch.float32),
                            ("attn_out", torch.float32), ("moe_out", torch.float32),
                            ("experts", torch.int32), ("expert_weights", torch.float32),
                            ("margin.experts", torch.float32)):
            value = stack(name, layers, dtype)
            if value is not None:
                out[name] = value
        if self.engram_layers:
            value = stack("engram_hash", self.engram_layers, torch.int64)
            if value is not None:
                out["engram_hash"] = value
        for l in self.args.index_source_layers:
            for name, dtype in ((f"topk.L{l}", torch.int32), (f"margin.topk.L{l}", torch.float32)):
                if name in self.rows:
                    out[name] = torch.cat(self.rows[name]).to(dtype)
        return out


def run(module, args, state_dict, tokens, prefill, index_k, threads):
    torch.set_num_threads(threads)
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = module.Transformer(args)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    params = {n for n, _ in model.named_parameters()}
    missing = [m for m in missing if m in params]
    if missing:
        raise DriverError(f"converted checkpoint lacks parameters: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    bad = [u for u in unexpected if not u.endswith("bias_vl")]
    if bad:
        raise DriverError(f"converted checkpoint has tensors the model does not: {bad[:8]}")
    model.eval()

    recorder = Recorder(model, args)
    if index_k == "owner":
        _, shared = find_shared_slot(module)
        for _, indexer in owner_indexers(model, args):
            indexer.register_forward_pre_hook(lambda m, a, s=shared: setattr(s, "index_k", m.k_cache) and None)

    real_attn = ds41_kernels.sparse_attn

    def traced_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        recorder.on_sparse_attn(topk_idxs)
        return real_attn(q, kv, attn_sink, topk_idxs, softmax_scale)

    real_topk = ds41_kernels.stable_topk

    def traced_topk(input, k, *a, **kw):
        result = real_topk(input, k, *a, **kw)
        if kw.get("largest", True) and (len(a) < 2 or a[1]):
            recorder.on_topk(input, k)
        return result

    module_had_attn = hasattr(module, "sparse_attn")  # `from kernel import sparse_attn` binds early
    if module_had_attn:
        module.sparse_attn = traced_attn
    ds41_kernels.sparse_attn = traced_attn
    ds41_kernels.stable_topk = traced_topk
    positions = []
    try:
        with deterministic_topk(), torch.inference_mode():
            ids = torch.tensor([tokens], dtype=torch.long)
            recorder.forward_kind = ("prefill", prefill)
            recorder.end_forward(model.forward(ids[:, :prefill], 0))
            positions.append(prefill - 1)
            for p in range(prefill, len(tokens)):
                recorder.forward_kind = ("decode", 1)
                recorder.end_forward(model.forward(ids[:, p:p + 1], p))
                positions.append(p)
    finally:
        if module_had_attn:
            module.sparse_attn = real_attn
        ds41_kernels.sparse_attn = real_attn
        ds41_kernels.stable_topk = real_topk
    return recorder.tensors(tokens, positions)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, required=True, help="the release inference/ directory")
    ap.add_argument("--checkpoint", type=Path, required=True, help="release-layout checkpoint (e.g. from `ds41 synth`)")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--prefill", type=int, help="tokens in the first forward (default: all)")
    ap.add_argument("--index-k", choices=["as-shipped", "owner"], default="as-shipped")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--convert-args", default=DEFAULT_CONVERT, help=f"convert.py arguments (default: {DEFAULT_CONVERT!r})")
    ap.add_argument("--allow-unpinned", action="store_true")
    ap.add_argument("--provenance", action="store_true", help="write OUT.provenance.json")
    ap.add_argument("--synth-command", help="the `ds41 synth ... --out {out}` command that made --checkpoint (recorded)")
    ap.add_argument("--synth-preset"), ap.add_argument("--synth-seed", type=int)
    a = ap.parse_args(argv)

    from safetensors.torch import load_file, save_file
    tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    prefill = a.prefill or len(tokens)
    if not 1 <= prefill <= len(tokens):
        ap.error(f"--prefill {prefill} outside 1..{len(tokens)}")
    try:
        pins = verify_pins(a.inference, a.allow_unpinned)
        cfg = json.loads((a.checkpoint / "inference" / "config.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            converted = convert_checkpoint(a.inference.resolve(), a.checkpoint.resolve(), Path(tmp), a.convert_args)
            state = load_file(str(converted))
        module = import_model(a.inference.resolve())
        model_args, ignored = build_args(module, cfg, len(tokens))
        if ignored:
            print(f"note: config keys not in ModelArgs: {ignored}", file=sys.stderr)
        tensors = run(module, model_args, state, tokens, prefill, a.index_k, a.threads)
    except DriverError as e:
        print(f"run_official: error: {e}", file=sys.stderr)
        return 2
    metadata = {  # docs/TRACE.md keys, then what only this producer knows
        "engine": "official inference/model.py (CPU, ds41 kernels)", "version": pins["model.py"][:12],
        "layout": "release", "numerics": "upstream", "index-k": a.index_k,
        "tie_rule": "largest first; equal values -> lower index",
        "topk_convention": "compressed positions (no window offset), ascending, -1 = none",
        "logits_rows": "row 0 = prefill (last position), row i = decode step i",
        "prefill": str(prefill), "decode_steps": str(len(tokens) - prefill), "mode": "forward",
        "format": TRACE_FORMAT, "model_py_sha256": pins["model.py"],
        "kernels_sha256": provenance.sha256_file(HERE / "ds41_kernels.py"),
        "torch": torch.__version__, "threads": str(a.threads), "kernel_calls": json.dumps(dict(ds41_kernels.CALLS)),
    }
    old = load_file(str(a.out)) if a.out.exists() else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(a.out), metadata=metadata)
    print(provenance.report_tensor_changes(a.out, old, tensors))
    if a.provenance:
        ckpt_input = provenance.describe_input("checkpoint", a.checkpoint)
        if a.synth_command:
            ckpt_input = {"name": "checkpoint", "location": "generated", "path": a.checkpoint.name,
                          "sha256": ckpt_input["sha256"], "command": a.synth_command}
        inputs = [ckpt_input] + [
            {"name": n, "location": "external", "path": f"inference/{n}", "sha256": h} for n, h in pins.items()
        ] + [provenance.describe_input("kernels", HERE / "ds41_kernels.py"),
             provenance.describe_input("driver", HERE / "run_official.py")]
        provenance.write_sidecar(
            a.out.with_name(a.out.name + provenance.SUFFIX),
            description=f"Trace of the official model.py on CPU (ds41 kernels), tokens {a.tokens}, "
                        f"prefill {prefill} then decode, index_k {a.index_k}.",
            generator={"kind": "official-code", "name": "inference/model.py", "version": pins["model.py"][:12],
                       "environment": provenance.environment(torch=torch.__version__, threads=a.threads)},
            command=(f"python3 goldens/regen/model/run_official.py --inference <release>/inference "
                     f"--checkpoint {{input:checkpoint}} --tokens {a.tokens} --prefill {prefill} "
                     f"--index-k {a.index_k} --out {{out}}/{a.out.name}"),
            inputs=inputs, outputs=[a.out.name],
            synthetic={"preset": a.synth_preset, "seed": a.synth_seed} if a.synth_preset else None,
            errata={"index_k_handoff": a.index_k, "topk_tie_order": "lower-index",
                    "gemm_summation_order": "canonical", "sparse_attn_block_layout": "as-laid-out"},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
