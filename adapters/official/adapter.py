#!/usr/bin/env python3
"""The official DS41 inference code as a ds41 engine (conformance/PROTOCOL.md, JSON lines on
stdin/stdout), so `ds41 certify` can judge it like any other engine:

    ds41 certify --engine 'python3 adapters/official/adapter.py --inference /path/to/release/inference'

It loads a release-layout checkpoint the way a release user does -- the release `convert.py`
(model parallel 1, FP4 experts), then `model.py` in bf16 on CPU with the six CUDA kernels
replaced by a torch CPU port -- and records the trace with forward hooks: logits, block
outputs, routed experts, indexer selections, Engram hash ids, the sub-op tensors
(`block_input`, `pre_mix`, `attn_out`, `moe_out`) and the selection margin of every top-k
decision. It supports prefill + decode schedules, both index-key hand-offs, teacher-forced
replay from a golden, session state save/restore, Engram hashing without weights, the
DSpark draft head (`dspark`, goldens/regen/model/run_dspark.py's schedule) and the vision
requests (`vision_preprocess`, `vision_tower`; `vision_span` with `--encoding DIR`, the release
`encoding/` directory: vision_ops.py).

The upstream code is never part of this repository: `--inference DIR` (or the environment
variable DS41_OFFICIAL_INFERENCE) names a release `inference/` directory holding `model.py`,
`engram.py`, `convert.py` (sha256-pinned, MODEL.md §0; `--allow-unpinned` to run others).
This driver reuses the project's own goldens/regen/model/run_official.py (conversion, model
import, hooks) and ds41_kernels.py (the kernel port); `--kernels tt-metal` uses the
`kernel_cpu.py` found in DIR instead (the port official_a's goldens were made with).

Ties (`--ties`): `torch` runs top-k as shipped (torch.topk: the order among exactly equal
scores is whatever torch returns); `canonical` uses the goldens' rule (larger first, equal
values -> lower index; MODEL.md §5.10).

`--inject BUG` makes a deliberately broken copy of the engine, by patching at run time (the
upstream files are never edited), to show the harness catches it: `no-sink` (the attention
sink is dropped), `no-yarn` (YaRN off on compressed layers), `owner-in-as-shipped` (the owner
hand-off is used when the as-shipped one is asked for), `gate-ties-reversed` (exact ties in
the MoE router go to the higher expert id), `ties-reversed` (the same for every top-k: router,
indexer, candidate blocks), `draft-causal` (a causal mask inside the DSpark draft block),
`vision-rope-swapped` (the vision tower's 2-D rope rotates by the column first).
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO / "goldens" / "regen" / "model"))
sys.path.insert(0, str(REPO / "goldens" / "regen"))
import protocol  # noqa: E402
from protocol import Refused, Unsupported  # noqa: E402
import ds41_kernels  # noqa: E402
import run_dspark  # noqa: E402
import run_official  # noqa: E402
import vision_ops  # noqa: E402
from vision_preprocess import import_official  # noqa: E402

BUGS = ("no-sink", "no-yarn", "owner-in-as-shipped", "gate-ties-reversed", "ties-reversed", "draft-causal",
        "vision-rope-swapped")
CAPABILITIES = [
    "load", "layout.release", "forward", "trace.logits", "trace.residual", "trace.experts",
    "trace.topk", "trace.engram_hash", "trace.sub_ops", "prefill", "state", "replay",
    "numerics.upstream", "index_k.as_shipped", "index_k.owner", "engram_hash", "dspark",
]
STATE_FORMAT = "ds41-official-adapter-state/1"
# How a release user converts a checkpoint (the release convert.py's own arguments).
# Cache length of every model built (positions a session can reach; a state keeps its own).
MIN_SEQ_LEN = 512
CONVERT_ARGS = "--hf-ckpt-path {ckpt} --save-path {out} --model-parallel 1 --expert-dtype fp4"


def read_token_map(path: Path):
    from safetensors.torch import load_file
    tensors = load_file(str(path))
    if "engram_token_map" not in tensors:
        raise Refused(f"{path}: no `engram_token_map` tensor")
    return [int(x) for x in tensors["engram_token_map"].reshape(-1).tolist()]


@contextlib.contextmanager
def token_map_override(engram_module, token_map):
    """Replace the map engram.py builds from the tokenizer (PROTOCOL.md `engram_token_map`)."""
    if token_map is None:
        yield
        return
    saved = engram_module.build_compressed_token_map
    engram_module.build_compressed_token_map = lambda tokenizer: (list(token_map), max(token_map) + 1)
    try:
        yield
    finally:
        engram_module.build_compressed_token_map = saved


def checkpoint_fingerprint(model_dir: Path) -> str:
    configs = [p for p in (model_dir / "config.json", model_dir / "inference" / "config.json") if p.is_file()]
    return protocol.fingerprint(configs + sorted(model_dir.glob("*.safetensors")))


class Official(protocol.Engine):
    name = "official-inference"

    def __init__(self, a):
        self.inference = a.inference.resolve()
        self.ties = a.ties
        self.bugs = set(a.inject or [])
        self.threads = a.threads
        self.pins = run_official.verify_pins(self.inference, a.allow_unpinned)
        self.version = self.pins["model.py"][:12]
        if self.bugs:
            self.name += " with injected " + ",".join(sorted(self.bugs))
        self.kernels, _ = run_official.kernel_module(self.inference, a.kernels)
        self.module = self._import_model()
        self.engram = sys.modules["engram"]
        self.converted = {}  # checkpoint dir -> (fingerprint, state dict)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(torch.bfloat16)  # as the release's generate.py does, for the whole run
        self.vision = vision_ops.Vision(import_official, self.inference, a.encoding, self.bugs)

    def capabilities(self):
        return CAPABILITIES + self.vision.capabilities()

    def vision_preprocess(self, req):
        return self.vision.preprocess(req)

    def vision_tower(self, req):
        return self.vision.tower(req)

    def vision_span(self, req):
        return self.vision.span(req)

    # -------------------------------------------------------------------------- setup

    def _import_model(self):
        module = run_official.import_model(self.inference, self.kernels)
        if "no-yarn" in self.bugs:
            real = module.precompute_freqs_cis
            module.precompute_freqs_cis = lambda dim, seqlen, original_seq_len, *rest: real(dim, seqlen, 0, *rest)
        if "draft-causal" in self.bugs:
            shared = module.get_dspark_topk_idxs

            def causal(window_size, bsz, block_size, start_pos):
                idxs = shared(window_size, bsz, block_size, start_pos).clone()
                filled = min(window_size, start_pos + 1)
                for i in range(block_size):  # draft row i sees draft keys 0..i only
                    idxs[:, i, filled + i + 1:] = -1
                return idxs
            module.get_dspark_topk_idxs = causal
        return module

    def _convert(self, model_dir: Path):
        """convert.py output for a checkpoint, cached per directory and fingerprint."""
        model_dir = model_dir.resolve()
        fp = checkpoint_fingerprint(model_dir)
        hit = self.converted.get(model_dir)
        if hit and hit[0] == fp:
            return hit[1], fp
        cfg_path = model_dir / "inference" / "config.json"
        if not cfg_path.is_file():
            raise Refused(f"{cfg_path}: missing (the official code reads ModelArgs from inference/config.json)")
        from safetensors.torch import load_file
        with tempfile.TemporaryDirectory() as tmp:
            try:
                converted = run_official.convert_checkpoint(self.inference, model_dir, Path(tmp), CONVERT_ARGS)
            except run_official.DriverError as e:
                raise Refused(str(e)) from None
            state = load_file(str(converted))
        self.converted = {model_dir: (fp, state)}  # one checkpoint at a time: bounded memory
        return state, fp

    def _model(self, model_dir: Path, n_tokens: int, token_map=None):
        """A fresh Transformer with the checkpoint's weights (caches empty)."""
        state, fp = self._convert(model_dir)
        try:
            cfg = json.loads((model_dir / "inference" / "config.json").read_text())
            args, _ = run_official.build_args(self.module, cfg, n_tokens)
        except (ValueError, TypeError) as e:
            raise Refused(f"{model_dir / 'inference' / 'config.json'}: {e}") from None
        tokenizer = run_official.FastTokenizer(model_dir / "tokenizer.json")
        self._reset_shared()
        try:
            with token_map_override(self.engram, token_map):
                model = run_official.load_model(self.module, args, state, tokenizer, self.threads)
        except run_official.DriverError as e:
            raise Refused(f"{model_dir}: {e}") from None
        except (AssertionError, RuntimeError, ValueError, KeyError, IndexError) as e:
            raise Refused(f"{model_dir}: the official model does not accept this checkpoint: "
                          f"{type(e).__name__}: {e}") from None
        return model, args, fp

    def _reset_shared(self):
        _, shared = run_official.find_shared_slot(self.module)
        for slot in ("compress_kv", "index_k", "topk_idxs", "candidates"):
            if hasattr(shared, slot):
                setattr(shared, slot, None)
        return shared

    # -------------------------------------------------------------------------- ops

    def load(self, req):
        model_dir = Path(req["model"])
        if req.get("verify"):
            raise Unsupported("load.verify", "release checkpoints carry no payload checksums to verify")
        if (model_dir / "manifest.json").is_file():
            raise Unsupported("layout.container", "the official code reads release checkpoints only")
        if not (model_dir / "config.json").is_file():
            raise Refused(f"{model_dir}: no config.json (not a release checkpoint)")
        self._model(model_dir, MIN_SEQ_LEN)
        return {}

    def forward(self, req):
        model_dir = Path(req["model"])
        if req.get("numerics") != "upstream":
            raise Unsupported(f"numerics.{req.get('numerics')}", "the official code runs bf16 (upstream) only")
        tokens = [int(t) for t in req["tokens"]]
        index_k = req.get("index_k", "as-shipped")
        token_map = read_token_map(Path(req["engram_token_map"])) if req.get("engram_token_map") else None
        forcing = self._forcing(Path(req["replay"]), tokens) if req.get("replay") else None
        if forcing is not None and req.get("load_state"):
            raise RuntimeError("replay cannot be combined with load_state")
        start, state = 0, None
        seq_len = max(MIN_SEQ_LEN, len(tokens))
        if req.get("load_state"):
            state = protocol.read_state(Path(req["load_state"]), STATE_FORMAT, checkpoint_fingerprint(model_dir))
            seq_len = int(state["max_seq_len"])  # the caches' sizes must match the saved ones
            if int(state["position"]) + len(tokens) > seq_len:
                raise RuntimeError(f"state at position {state['position']} + {len(tokens)} tokens exceeds "
                                   f"the max_seq_len {seq_len} it was saved with")
        model, args, fp = self._model(model_dir, seq_len, token_map)
        if state is not None:
            start = self._restore(model, state, Path(req["load_state"]), index_k)
        prefill = req.get("prefill")
        if prefill is None:
            prefill = 0 if req.get("load_state") else len(tokens)
        if not 0 <= prefill <= len(tokens):
            raise RuntimeError(f"prefill {prefill} outside 0..{len(tokens)}")
        tensors, positions = self._run(model, args, tokens, start, prefill, index_k, forcing)
        meta = self._metadata(model_dir, index_k, prefill, len(tokens), "replay" if forcing else "forward")
        from safetensors.torch import save_file
        out = Path(req["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out), metadata=meta)
        if req.get("save_state"):
            self._save(model, args, Path(req["save_state"]), fp, index_k, start + len(tokens))
        return {"trace": str(out)}

    def engram_hash(self, req):
        model_dir = Path(req["model"])
        tokens = [int(t) for t in req["tokens"]]
        dead = sorted(set(int(d) for d in req.get("dead", [])))
        if any(d < 0 or d >= len(tokens) for d in dead):
            raise Refused(f"dead positions {dead} outside the {len(tokens)} tokens")
        args = self._engram_args(model_dir, len(tokens))
        layout = self.engram.EngramLayout.from_args(args)
        if layout is None:
            raise Refused(f"{model_dir}: the model has no Engram layers")
        token_map = read_token_map(Path(req["engram_token_map"])) if req.get("engram_token_map") else None
        with token_map_override(self.engram, token_map):
            state = self.engram.NgramHashState(args, layout, run_official.FastTokenizer(model_dir / "tokenizer.json"))
        ids = torch.tensor([tokens], dtype=torch.long)
        mask = torch.ones_like(ids, dtype=torch.bool)
        for d in dead:
            mask[0, d] = False
        hashes = state(ids, 0, mask if dead else None)
        return {"ids": hashes[0].tolist()}

    def dspark(self, req):
        """The DSpark draft head (PROTOCOL.md `dspark`): goldens/regen/model/run_dspark.py's
        schedule (forward_spec after every forward, temperature 0), teacher-forced from a
        golden with `replay`. Top-k ties by the canonical rule; of `--inject`, `no-yarn` (no
        effect: the stages are ratio 0) and `draft-causal` act here."""
        model_dir = Path(req["model"])
        if (model_dir / "manifest.json").is_file():
            raise Unsupported("layout.container", "the container drops the MTP stages (CONTAINER.md §8)")
        if req.get("numerics") != "upstream":
            raise Unsupported(f"numerics.{req.get('numerics')}", "the official code runs bf16 (upstream) only")
        tokens = [int(t) for t in req["tokens"]]
        prefill = int(req["prefill"])
        if not 1 <= prefill <= len(tokens):
            raise Refused(f"prefill {prefill} outside 1..{len(tokens)}")
        state, _ = self._convert(model_dir)
        cfg = json.loads((model_dir / "inference" / "config.json").read_text())
        if not cfg.get("dspark_block_size") or not cfg.get("n_mtp_layers"):
            raise Refused(f"{model_dir}: the model has no DSpark stages")
        args, _ = run_official.build_args(self.module, cfg, max(MIN_SEQ_LEN, len(tokens) + cfg["dspark_block_size"]))
        tokenizer = run_official.FastTokenizer(model_dir / "tokenizer.json") if args.engram_layer_ids else None
        forcing = None
        if req.get("replay"):
            from safetensors.torch import load_file
            forcing = load_file(str(req["replay"]))
        self._reset_shared()
        try:
            tensors = run_dspark.run(self.module, args, state, tokens, prefill, self.threads, tokenizer,
                                     forcing=forcing)
        except run_official.DriverError as e:
            raise Refused(f"{model_dir}: {e}") from None
        meta = self._metadata(model_dir, "as-shipped", prefill, len(tokens), "replay" if forcing else "forward")
        meta["format"] = run_dspark.TRACE_FORMAT
        from safetensors.torch import save_file
        out = Path(req["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out), metadata=meta)
        return {"trace": str(out)}

    # -------------------------------------------------------------------------- engram args

    def _engram_args(self, model_dir: Path, n_tokens: int):
        """ModelArgs' Engram fields: from inference/config.json of a checkpoint, or translated
        from the HF config.json of a weightless model directory."""
        inference_cfg = model_dir / "inference" / "config.json"
        if inference_cfg.is_file():
            cfg = json.loads(inference_cfg.read_text())
        else:
            hf = json.loads((model_dir / "config.json").read_text())
            hf = hf.get("text_config", hf)
            cfg = {k: v for k, v in hf.items() if k.startswith("engram_")}
            if "engram_pad_token_id" in cfg:
                cfg["engram_pad_id"] = cfg.pop("engram_pad_token_id")
        cfg.setdefault("engram_layer_ids", [])
        return types.SimpleNamespace(**cfg, max_batch_size=1, max_seq_len=max(n_tokens, 1))

    # -------------------------------------------------------------------------- running

    def _forcing(self, golden: Path, tokens):
        from safetensors.torch import load_file
        g = load_file(str(golden))
        need = ("block_input", "pre_mix", "residual", "final_pre")
        missing = [n for n in need if n not in g]
        if missing:
            raise RuntimeError(f"{golden}: a replay golden needs {list(need)}; missing {missing}")
        if g["residual"].shape[0] < len(tokens):
            raise RuntimeError(f"{golden}: covers {g['residual'].shape[0]} tokens, the request has {len(tokens)}")
        return {n: g[n].to(torch.float32) for n in need}

    @contextlib.contextmanager
    def _patched(self, recorder):
        """Install the top-k (tie rule, margins), candidate-selection and sparse_attn wrappers
        for one run, as run_official.run does, plus the injected bugs."""
        module = self.module
        saved = (torch.topk, torch.Tensor.topk, module.sparse_attn, getattr(module, "select_candidate_blocks", None))
        torch_topk = torch.topk
        reverse_gate_ties = "gate-ties-reversed" in self.bugs
        reverse_all_ties = "ties-reversed" in self.bugs
        no_sink = "no-sink" in self.bugs

        def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
            if largest:
                recorder.on_topk(input, k)
            in_gate = bool(recorder.context) and recorder.context[-1] == "gate"
            if largest and (reverse_all_ties or (reverse_gate_ties and in_gate)):
                n = input.shape[dim]
                values, idx = torch.sort(input.flip(dim), dim=dim, descending=True, stable=True)
                return ds41_kernels._TopK(values.narrow(dim, 0, k), (n - 1 - idx).narrow(dim, 0, k))
            if self.ties == "canonical":
                return ds41_kernels.stable_topk(input, k, dim, largest, sorted)
            return torch_topk(input, k, dim, largest, sorted)

        real_attn, real_select = saved[2], saved[3]

        def traced_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
            recorder.on_sparse_attn(topk_idxs)
            if no_sink:
                attn_sink = torch.full_like(attn_sink, float("-inf"))
            return real_attn(q, kv, attn_sink, topk_idxs, softmax_scale)

        def traced_select(*a, **kw):
            recorder.context.append("candidates")
            try:
                return real_select(*a, **kw)
            finally:
                recorder.context.pop()

        torch.topk = topk
        torch.Tensor.topk = lambda self_, *a, **k: topk(self_, *a, **k)
        module.sparse_attn = traced_attn
        if real_select is not None:
            module.select_candidate_blocks = traced_select
        try:
            yield
        finally:
            torch.topk, torch.Tensor.topk, module.sparse_attn = saved[:3]
            if real_select is not None:
                module.select_candidate_blocks = real_select

    def _run(self, model, args, tokens, start, prefill, index_k, forcing):
        shared = self._reset_shared() if start == 0 else run_official.find_shared_slot(self.module)[1]
        recorder = run_official.Recorder(model, args)
        recorder.forcing = forcing
        if index_k == "owner" or "owner-in-as-shipped" in self.bugs:
            for _, indexer in run_official.owner_indexers(model, args):
                indexer.register_forward_pre_hook(lambda m, a, s=shared: setattr(s, "index_k", m.k_cache))
        schedule = ([(0, prefill)] if prefill else []) + [(p, p + 1) for p in range(prefill, len(tokens))]
        positions = []
        ids = torch.tensor([tokens], dtype=torch.long)
        with self._patched(recorder), torch.inference_mode():
            for lo, hi in schedule:
                if start + lo != 0 and hi - lo != 1:
                    raise RuntimeError("model.py prefills only at position 0")
                recorder.begin_forward("prefill" if start + lo == 0 else "decode", hi - lo, start + lo)
                _, logits, _ = model.forward(ids[:, lo:hi], start + lo)
                recorder.end_forward(logits)
                positions.append(start + hi - 1)
        return recorder.tensors(tokens, positions), positions

    def _metadata(self, model_dir, index_k, prefill, n, mode):
        return {
            "engine": self.name, "version": self.version, "layout": "release", "numerics": "upstream",
            "index-k": index_k,
            "tie_rule": "largest first; equal values -> lower index" if self.ties == "canonical"
            else "torch.topk as shipped",
            "topk_convention": "compressed positions (no window offset), ascending, -1 = none",
            "logits_rows": "row 0 = prefill (last position), row i = decode step i",
            "prefill": str(prefill), "decode_steps": str(n - prefill), "mode": mode,
            "model_py_sha256": self.pins["model.py"], "kernels": getattr(self.kernels, "__name__", "?"),
            "torch": torch.__version__, "threads": str(self.threads),
            **({"defects": ",".join(sorted(self.bugs))} if self.bugs else {}),
        }

    # -------------------------------------------------------------------------- state

    def _buffers(self, model):
        return {n: b for n, b in model.named_buffers() if not n.endswith("freqs_cis")}

    def _save(self, model, args, path: Path, fp, index_k, position):
        buffers = self._buffers(model)
        _, shared = run_official.find_shared_slot(self.module)
        slots = {}
        for slot in ("compress_kv", "index_k", "topk_idxs", "candidates"):
            value = getattr(shared, slot, None)
            if value is None:
                continue
            alias = next((n for n, b in buffers.items() if b is value), None)
            slots[slot] = {"alias": alias} if alias else {"value": value.clone()}
        torch.save({"format": STATE_FORMAT, "fingerprint": fp, "position": position, "index_k": index_k,
                    "max_seq_len": args.max_seq_len,
                    "buffers": {n: b.clone() for n, b in buffers.items()}, "shared": slots}, str(path))

    def _restore(self, model, st, path: Path, index_k):
        if st["index_k"] != index_k:
            raise Refused(f"{path}: saved with index_k {st['index_k']}, continued with {index_k}")
        buffers = self._buffers(model)
        if set(buffers) != set(st["buffers"]) or any(b.shape != st["buffers"][n].shape for n, b in buffers.items()):
            raise Refused(f"{path}: the state's buffers do not match this model")
        for n, b in buffers.items():
            b.copy_(st["buffers"][n])
        shared = self._reset_shared()
        for slot, v in st["shared"].items():
            setattr(shared, slot, buffers[v["alias"]] if "alias" in v else v["value"])
        return int(st["position"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inference", type=Path, default=os.environ.get("DS41_OFFICIAL_INFERENCE"),
                    help="the release inference/ directory (default: $DS41_OFFICIAL_INFERENCE)")
    ap.add_argument("--encoding", type=Path, default=os.environ.get("DS41_OFFICIAL_ENCODING"),
                    help="the release encoding/ directory, for vision_span (default: $DS41_OFFICIAL_ENCODING)")
    ap.add_argument("--ties", choices=["torch", "canonical"], default="torch",
                    help="top-k tie order: torch.topk as shipped (default) or the canonical lower-index rule")
    ap.add_argument("--kernels", choices=["ds41", "tt-metal"], default="ds41",
                    help="kernel port: this project's ds41_kernels.py (default) or DIR/kernel_cpu.py (tt-metal's)")
    ap.add_argument("--inject", action="append", choices=BUGS, help="run a deliberately broken copy (repeatable)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--allow-unpinned", action="store_true", help="run model.py files other than the release pins")
    a = ap.parse_args(argv)
    if a.inference is None:
        ap.error("name the release inference/ directory: --inference DIR or DS41_OFFICIAL_INFERENCE")
    try:
        engine = Official(a)
    except run_official.DriverError as e:
        print(f"official adapter: {e}", file=sys.stderr)
        return 2
    protocol.serve(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
