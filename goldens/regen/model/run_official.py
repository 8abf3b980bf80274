#!/usr/bin/env python3
"""Model goldens from the official DS41 code: run a release `inference/` directory's unmodified
`model.py` on CPU over a release-layout checkpoint and dump a trace (safetensors).

What this driver adds around model.py (and nothing else):
* the six CUDA kernels come from a CPU port installed as the module `kernel` before model.py is
  imported: `--kernels tt-metal` (default) = the `kernel_cpu.py` beside model.py (Tenstorrent's
  public port, the one `upstream/official_a` was made with; bit for bit reproduced), or
  `--kernels ds41` = this directory's ds41_kernels.py (MODEL.md §5);
* `torch.topk` / `Tensor.topk` are replaced by the deterministic tie rule (larger first, equal
  values -> lower index; MODEL.md §5.10, errata `topk_tie_order`);
* `--index-k owner` adds a forward pre-hook on every index-key owner's indexer that publishes its
  own key cache to `shared_attn.index_k` before it scores (MODEL.md §8.3, errata
  `index_k_handoff`); `as-shipped` leaves model.py alone;
* the tokenizer model.py's Engram builds its token map from is the checkpoint's tokenizer.json
  through HF `tokenizers` (`len()` = vocabulary with added tokens, as `transformers`' fast
  tokenizer reports it);
* hooks record the trace: per token and layer the block input stream (after Engram), the
  incoming `pre` mix, the stream after the attention expand (`mid`), attention and MoE outputs,
  the block output, routed experts and weights (gate order), the indexer selections (from the
  sparse_attn index lists, window entries removed, compressed positions ascending, -1 padded),
  Engram hash ids, logits, the final collapse's `pre` (`final_pre`), and the selection margins
  of every top-k decision (experts, index top-k, candidate blocks).

The sha256 of model.py, engram.py and convert.py are checked against the release pins
(MODEL.md §0) unless --allow-unpinned.

Example (from the repository root; the checkpoint from `ds41 synth`):
  python3 goldens/regen/model/run_official.py --inference RELEASE/inference \\
      --checkpoint /tmp/tiny --tokens 3,7,11,5,19,23,2,41 --prefill 5 --index-k owner \\
      --out goldens/official/tiny_p05_owner.safetensors --provenance
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
DEFAULT_CONVERT = "--hf-ckpt-path {ckpt} --save-path {out} --model-parallel 1 --expert-dtype fp4"
KERNELS = {"tt-metal": "kernel_cpu.py beside model.py (tenstorrent/tt-metal CPU port)",
           "ds41": "goldens/regen/model/ds41_kernels.py"}
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
    args = template.format(ckpt=ckpt, out=out).split()
    proc = subprocess.run([sys.executable, str(inference / "convert.py"), *args],
                          cwd=inference, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DriverError(f"convert.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    files = sorted(out.glob("*.safetensors"))
    if len(files) != 1:
        raise DriverError(f"convert.py wrote {len(files)} safetensors files into {out}, expected 1 (mp=1)")
    return files[0]


def kernel_module(inference: Path, which: str):
    """The CPU kernel port to install as `kernel`, and the file it came from."""
    if which == "ds41":
        return ds41_kernels, HERE / "ds41_kernels.py"
    path = inference / "kernel_cpu.py"
    if not path.is_file():
        raise DriverError(f"{path}: missing (--kernels tt-metal needs the CPU port beside model.py; or --kernels ds41)")
    spec = importlib.util.spec_from_file_location("ds41_kernel_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def import_model(inference: Path, kernels=ds41_kernels):
    """Import model.py with `kernels` installed as `kernel`."""
    sys.modules["kernel"] = kernels
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
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cfg.items() if k in fields}
    kwargs["max_batch_size"] = 1
    kwargs["max_seq_len"] = max(int(kwargs.get("max_seq_len", 0)), max_seq_len)
    return module.ModelArgs(**kwargs), ignored


class FastTokenizer:
    """What model.py's Engram reads of a `transformers` fast tokenizer: `backend_tokenizer`
    and `len()` (the vocabulary including added tokens)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer
        self.backend_tokenizer = Tokenizer.from_file(str(path))

    def __len__(self):
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


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


def candidate_consumers(args):
    c = getattr(args, "candidate_source_layer", -1)
    return [l for l in args.index_source_layers if 0 <= c < l] if c is not None and c >= 0 else []


class Recorder:
    """Collects the trace over a schedule of forwards (one list entry per forward)."""

    def __init__(self, model, args):
        self.args = args
        self.layer = None
        self.context = []          # "gate" / "indexer" / "candidates" while inside one
        self.forward_kind = None   # ("prefill", S) or ("decode", 1)
        self.rows = {}             # name -> list of tensors [S, ...] per forward
        self.current = {}          # name -> tensor for the forward in progress
        self.tokens = 0            # tokens of the forward in progress
        self.engram_layers = list(getattr(args, "engram_layer_ids", ()))
        c = getattr(args, "candidate_source_layer", -1)
        self.candidate_source = c if c is not None and c >= 0 else None
        self.consumers = candidate_consumers(args)
        self.forcing = None        # replay: golden tensors forced into every block
        self.start = 0             # position of the forward in progress
        self._hook(model)

    def put(self, name, value):
        self.current[name] = value.detach().to(torch.float32 if value.is_floating_point() else torch.int64).clone()

    def _hook(self, model):
        last = len(model.layers) - 1
        for l, block in enumerate(model.layers):
            block.register_forward_pre_hook(self._block_pre(l))
            block.register_forward_hook(self._block_post(l, l == last))
            block.hc_post = self._hc_post(l, block.hc_post)
            block.attn.register_forward_hook(self._capture(f"attn_out.L{l}"))
            block.ffn.register_forward_hook(self._capture(f"moe_out.L{l}"))
            block.ffn.gate.register_forward_pre_hook(lambda m, a: self._enter("gate"))
            block.ffn.gate.register_forward_hook(self._gate_post(l))
            indexer = getattr(block.attn, "indexer", None)
            if indexer is not None:
                indexer.register_forward_pre_hook(lambda m, a: self._enter("indexer"))
                indexer.register_forward_hook(lambda m, a, o: self._leave())
        if getattr(model, "engram_hash", None) is not None:
            model.engram_hash.register_forward_hook(self._engram_hash)

    # Hooks must return None: a forward hook's return value replaces the module's output.
    def _enter(self, kind):
        self.context.append(kind)

    def _leave(self):
        self.context.pop()

    def _block_pre(self, l):
        def hook(module, args):
            # Block.forward(x, start_pos, pre_mix, image_mask): x is the stream after Engram.
            self.layer = l
            self.put(f"block_input.L{l}", args[0][0])
            self.put(f"pre_mix.L{l}", args[2][0])
            if self.forcing is not None:  # replay: the block starts from the golden's inputs
                x = self.forcing["block_input"][self.start:self.start + self.tokens, l].to(args[0].dtype)[None]
                pre = self.forcing["pre_mix"][self.start:self.start + self.tokens, l].to(args[2].dtype)[None]
                return (x.contiguous(), args[1], pre.contiguous(), *args[3:])
        return hook

    def _hc_post(self, l, real):
        # Block.forward expands twice: after attention (the FFN's input stream, `mid`), then after the FFN.
        def hc_post(x, residual, post, comb):
            out = real(x, residual, post, comb)
            if f"mid.L{l}" not in self.current:
                self.put(f"mid.L{l}", out[0])
            return out
        return hc_post

    def _block_post(self, l, is_last):
        def hook(module, args, output):
            stream, ffn_pre = output
            self.put(f"residual.L{l}", stream[0])
            if is_last:  # Transformer.forward collapses the last block's output with its FFN pre
                self.put("final_pre", ffn_pre[0])
            self.layer = None
            if self.forcing is not None:
                # replay: the next Engram (and the head, after the last block) reads the golden stream
                rows = slice(self.start, self.start + self.tokens)
                golden = self.forcing["residual"][rows, l].to(stream.dtype)[None].contiguous()
                pre = (self.forcing["final_pre"][rows] if is_last else ffn_pre[0]).to(ffn_pre.dtype)[None]
                return golden, pre.contiguous()
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

    def _engram_hash(self, module, args, output):
        self.put("engram_hash", output[0])

    def on_topk(self, values, k):
        if self.layer is None or not self.context:
            return
        margin = ds41_kernels.selection_margin(values.detach(), k).reshape(-1).to(torch.float32)
        kind = self.context[-1]
        key = {"gate": "margin.experts", "indexer": "margin.topk", "candidates": "margin.candidates"}[kind]
        key += f".L{self.layer}"
        prev = self.current.get(key)
        if prev is not None and prev.shape == margin.shape:
            margin = torch.minimum(prev, margin)
        if kind == "indexer" and self.layer in self.consumers:
            # a consumer's selection also rests on the writer's block choice (official_a/README.md)
            writer = self.current.get(f"margin.candidates.L{self.candidate_source}")
            if writer is not None and writer.shape == margin.shape:
                margin = torch.minimum(margin, writer)
        self.current[key] = margin

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

    def begin_forward(self, kind, tokens, start=0):
        self.forward_kind = (kind, tokens)
        self.tokens = tokens
        self.start = start
        # A selection that never ran (nothing to choose from yet) has no competitor.
        inf = torch.full((tokens,), float("inf"))
        for l in self.args.index_source_layers:
            self.current[f"margin.topk.L{l}"] = inf.clone()
        if self.candidate_source is not None:
            self.current[f"margin.candidates.L{self.candidate_source}"] = inf.clone()

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

        def stack(prefix, dtype):
            per_layer = []
            for l in range(n_layers):
                chunks = self.rows.get(f"{prefix}.L{l}")
                if chunks is None:
                    raise DriverError(f"no `{prefix}` recorded for layer {l}")
                per_layer.append(torch.cat(chunks))
            return torch.stack(per_layer, dim=1).to(dtype)

        for name, dtype in (("residual", torch.float32), ("block_input", torch.float32), ("pre_mix", torch.float32),
                            ("mid", torch.float32), ("attn_out", torch.float32), ("moe_out", torch.float32),
                            ("experts", torch.int32), ("expert_weights", torch.float32),
                            ("margin.experts", torch.float32)):
            out[name] = stack(name, dtype)
        out["final_pre"] = torch.cat(self.rows["final_pre"]).to(torch.float32)
        if self.engram_layers:
            out["engram_hash"] = torch.cat(self.rows["engram_hash"]).to(torch.int64)
        names = [f"topk.L{l}" for l in self.args.index_source_layers] + \
                [f"margin.topk.L{l}" for l in self.args.index_source_layers]
        if self.candidate_source is not None:
            names.append(f"margin.candidates.L{self.candidate_source}")
        for name in names:
            dtype = torch.int32 if name.startswith("topk.") else torch.float32
            out[name] = torch.cat(self.rows[name]).to(dtype)
        for name, value in out.items():
            if value.shape[0] != (len(positions) if name.startswith("logits") else len(tokens)):
                raise DriverError(f"`{name}` has {value.shape[0]} rows for {len(tokens)} tokens")
        return out


def load_model(module, args, state_dict, tokenizer, threads):
    torch.set_num_threads(threads)
    torch.set_default_dtype(torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = module.Transformer(args, tokenizer)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    params = {n for n, _ in model.named_parameters()}
    missing = [m for m in missing if m in params]
    if missing:
        raise DriverError(f"converted checkpoint lacks parameters: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    # bias_vl is only built with vision; mtp.* only with dspark_block_size > 0. Neither reaches
    # a text forward of the main model.
    bad = [u for u in unexpected if not (u.endswith("bias_vl") or u.startswith("mtp."))]
    if bad:
        raise DriverError(f"converted checkpoint has tensors the model does not: {bad[:8]}")
    model.eval()
    return model


STANDINS = {
    "f64-linear": "every torch.nn.functional.linear (bf16 linears, hc mixes, gate) computed in f64, rounded once",
    "f64-einsum-norm": "f64-linear plus every einsum (wo_a, index scores) and RMSNorm in f64, rounded once",
}


@contextlib.contextmanager
def standin_numerics(module, name):
    """Another valid summation order for the official code (noise stand-ins for gate calibration):
    the same operations computed wider and rounded once at the end."""
    if name is None:
        yield
        return
    import torch.nn.functional as F
    saved_linear, saved_einsum, saved_norm = F.linear, torch.einsum, module.RMSNorm.forward

    def linear(x, w, b=None):
        y = saved_linear(x.double(), w.double(), None if b is None else b.double())
        return y.to(torch.promote_types(x.dtype, w.dtype))

    def einsum(eq, *ops):
        return saved_einsum(eq, *[o.double() for o in ops]).to(torch.promote_types(ops[0].dtype, ops[1].dtype))

    def norm(self, x):
        y = x.double()
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight.double() * y).to(x.dtype)

    F.linear = linear
    if name == "f64-einsum-norm":
        torch.einsum = einsum
        module.RMSNorm.forward = norm
    try:
        yield
    finally:
        F.linear, torch.einsum, module.RMSNorm.forward = saved_linear, saved_einsum, saved_norm


def run(module, args, state_dict, tokens, prefill, index_k, threads, tokenizer=None, kernels=ds41_kernels,
        forcing=None, standin=None):
    """One schedule: a prefill of `prefill` tokens, then single-token decode steps. `forcing`
    (replay): the golden's `block_input`, `pre_mix`, `residual`, `final_pre` forced into every
    block (docs/TRACE.md, teacher-forced replay)."""
    model = load_model(module, args, state_dict, tokenizer, threads)
    _, shared = find_shared_slot(module)
    for field in ("compress_kv", "index_k", "topk_idxs", "candidates"):  # as in a fresh process
        if hasattr(shared, field):
            setattr(shared, field, None)
    recorder = Recorder(model, args)
    recorder.forcing = forcing
    if index_k == "owner":
        _, shared = find_shared_slot(module)
        for _, indexer in owner_indexers(model, args):
            indexer.register_forward_pre_hook(lambda m, a, s=shared: setattr(s, "index_k", m.k_cache))

    real_attn = module.sparse_attn  # `from kernel import sparse_attn` binds it in model.py

    def traced_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
        recorder.on_sparse_attn(topk_idxs)
        return real_attn(q, kv, attn_sink, topk_idxs, softmax_scale)

    real_topk = ds41_kernels.stable_topk

    def traced_topk(input, k, *a, **kw):
        result = real_topk(input, k, *a, **kw)
        if kw.get("largest", True) and (len(a) < 2 or a[1]):
            recorder.on_topk(input, k)
        return result

    real_select = getattr(module, "select_candidate_blocks", None)

    def traced_select(*a, **kw):
        recorder.context.append("candidates")
        try:
            return real_select(*a, **kw)
        finally:
            recorder.context.pop()

    module.sparse_attn = traced_attn
    if real_select is not None:
        module.select_candidate_blocks = traced_select
    ds41_kernels.stable_topk = traced_topk
    positions = []

    def logits_of(result):
        # Transformer.forward returns (sampled ids, logits of the last position, DSpark hidden)
        return result[1] if isinstance(result, tuple) else result

    try:
        with deterministic_topk(), standin_numerics(module, standin), torch.inference_mode():
            ids = torch.tensor([tokens], dtype=torch.long)
            recorder.begin_forward("prefill", prefill)
            recorder.end_forward(logits_of(model.forward(ids[:, :prefill], 0)))
            positions.append(prefill - 1)
            for p in range(prefill, len(tokens)):
                recorder.begin_forward("decode", 1, p)
                recorder.end_forward(logits_of(model.forward(ids[:, p:p + 1], p)))
                positions.append(p)
    finally:
        module.sparse_attn = real_attn
        if real_select is not None:
            module.select_candidate_blocks = real_select
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
    ap.add_argument("--kernels", choices=sorted(KERNELS), default="tt-metal",
                    help="CPU kernel port installed as `kernel`: " + "; ".join(f"{k} = {v}" for k, v in KERNELS.items()))
    ap.add_argument("--convert-args", default=DEFAULT_CONVERT, help=f"convert.py arguments (default: {DEFAULT_CONVERT!r})")
    ap.add_argument("--allow-unpinned", action="store_true")
    ap.add_argument("--replay", type=Path, help="teacher-forced: force this golden's block inputs into every block")
    ap.add_argument("--standin", choices=sorted(STANDINS),
                    help="calibration only: run with another valid summation order: " +
                         "; ".join(f"{k} = {v}" for k, v in STANDINS.items()))
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
        kernels, kernels_path = kernel_module(a.inference.resolve(), a.kernels)
        module = import_model(a.inference.resolve(), kernels)
        model_args, ignored = build_args(module, cfg, len(tokens))
        if ignored:
            print(f"note: config keys not in ModelArgs: {ignored}", file=sys.stderr)
        tokenizer = FastTokenizer(a.checkpoint / "tokenizer.json") if model_args.engram_layer_ids else None
        forcing = load_file(str(a.replay)) if a.replay else None
        tensors = run(module, model_args, state, tokens, prefill, a.index_k, a.threads, tokenizer,
                      forcing=forcing, standin=a.standin)
    except DriverError as e:
        print(f"run_official: error: {e}", file=sys.stderr)
        return 2
    metadata = {  # docs/TRACE.md keys, then what only this producer knows
        "engine": f"official inference/model.py (CPU, {a.kernels} kernels)", "version": pins["model.py"][:12],
        "layout": "release", "numerics": "upstream", "index-k": a.index_k,
        "tie_rule": "largest first; equal values -> lower index",
        "topk_convention": "compressed positions (no window offset), ascending, -1 = none",
        "logits_rows": "row 0 = prefill (last position), row i = decode step i",
        "prefill": str(prefill), "decode_steps": str(len(tokens) - prefill),
        "mode": "replay" if a.replay else "forward",
        "format": TRACE_FORMAT, "model_py_sha256": pins["model.py"],
        "kernels": a.kernels, "kernels_sha256": provenance.sha256_file(kernels_path),
        "torch": torch.__version__, "threads": str(a.threads),
        **({"standin": a.standin} if a.standin else {}),
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
        ]
        if a.kernels == "ds41":
            inputs.append(provenance.describe_input("kernels", kernels_path))
        else:
            inputs.append({"name": "kernel_cpu.py", "location": "external", "path": "inference/kernel_cpu.py",
                           "sha256": provenance.sha256_file(kernels_path)})
        inputs += [provenance.describe_input("driver", HERE / "run_official.py"),
                   provenance.describe_input("kernels_ds41", HERE / "ds41_kernels.py")]
        provenance.write_sidecar(
            a.out.with_name(a.out.name + provenance.SUFFIX),
            description=f"Trace of the official model.py on CPU ({a.kernels} kernels), tokens {a.tokens}, "
                        f"prefill {prefill} then decode, index_k {a.index_k}.",
            generator={"kind": "official-code", "name": "inference/model.py", "version": pins["model.py"][:12],
                       "environment": provenance.environment(torch=torch.__version__, threads=a.threads)},
            command=(f"python3 goldens/regen/model/run_official.py --inference <release>/inference "
                     f"--checkpoint {{input:checkpoint}} --tokens {a.tokens} --prefill {prefill} "
                     f"--index-k {a.index_k} --kernels {a.kernels} --out {{out}}/{a.out.name}"),
            inputs=inputs, outputs=[a.out.name],
            synthetic={"preset": a.synth_preset, "seed": a.synth_seed} if a.synth_preset else None,
            errata={"index_k_handoff": a.index_k, "topk_tie_order": "lower-index",
                    "gemm_summation_order": "canonical", "sparse_attn_block_layout": "as-laid-out"},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
