#!/usr/bin/env python3
"""WASTE's f32 PyTorch oracle (`tools/ds41_ref.py`) as a ds41 engine (conformance/PROTOCOL.md,
JSON lines on stdin/stdout):

    ds41 certify --engine 'python3 adapters/waste-oracle/adapter.py --waste /path/to/waste'

The oracle runs a WASTE v0 container one token at a time from position 0, in f32 (the
`exact` profile), with the as-shipped index-key hand-off (CONTAINER.md §11). This adapter
imports it from the checkout the user names (`--waste DIR` or DS41_WASTE; `DIR/tools/ds41_ref.py`
and the `kimi_ref.py` it imports) and drives its `DS41Ref.step` token by token. The trace is
recorded by wrapping the oracle object's own methods at run time (never by editing its
files): logits of every step, the stream after every layer, routed experts, indexer
selections, Engram hash ids, and the sub-op tensors `block_input`, `pre_mix`, `mid`,
`attn_out`, `moe_out`. It saves and restores its session state and hashes Engram ids from a
container's own constants.

What the oracle cannot do is declared by the capabilities it leaves out, so those cases are
NotSupported, never failed: it reads containers only (`layout.container`, no `layout.release`);
it validates nothing when it opens a container, so it declares no `load` (a broken container is
not refused, it is read); it never prefills (no `prefill`); f32 only (no `numerics.upstream`);
no owner hand-off (no `index_k.owner`); its step loop cannot be fed forced block inputs (no
`replay`).

`--inject BUG` runs a deliberately broken copy: `no-sink` (the oracle's own `--no-sink`
switch), `no-yarn` (plain RoPE frequencies on compressed layers), `gate-ties-reversed` (exact
ties in the MoE router go to the higher expert id).
"""
import argparse
import contextlib
import hashlib
import importlib
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import protocol  # noqa: E402
from protocol import Refused, Unsupported  # noqa: E402

BUGS = ("no-sink", "no-yarn", "gate-ties-reversed")
CAPABILITIES = [
    "layout.container", "forward", "trace.logits", "trace.residual", "trace.experts", "trace.topk",
    "trace.engram_hash", "trace.sub_ops", "state", "numerics.exact", "index_k.as_shipped", "engram_hash",
]
STATE_FORMAT = "ds41-waste-oracle-adapter-state/1"
STATE_FIELDS = ("winkv", "ckv", "ikey", "cpool", "hist", "shared")


def reversed_ties_topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk with exact ties going to the higher index (the injected router bug)."""
    n = input.shape[dim]
    values, idx = torch.sort(input.flip(dim), dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), (n - 1 - idx).narrow(dim, 0, k)))


class Recording:
    """Per (token, layer) tensors collected while the oracle steps, by wrapping its methods."""

    def __init__(self, ref, cfg):
        self.ref, self.cfg = ref, cfg
        self.pos = None
        self.cells = {}       # (name, pos, layer) -> tensor
        self.last_ffn_pre = None

    def put(self, name, layer, value):
        self.cells[(name, self.pos, layer)] = value.detach().clone()

    def stack(self, name, positions, layers, dtype):
        rows = []
        for p in positions:
            per = [self.cells.get((name, p, l)) for l in layers]
            if any(v is None for v in per):
                return None
            rows.append(torch.stack(per))
        return torch.stack(rows).to(dtype)


class WasteOracle(protocol.Engine):
    name = "waste-oracle"

    def __init__(self, a):
        self.waste = a.waste.resolve()
        tools = self.waste / "tools"
        if not (tools / "ds41_ref.py").is_file():
            raise SystemExit(f"{tools / 'ds41_ref.py'}: missing (name a WASTE checkout with --waste)")
        sys.path.insert(0, str(tools))
        self.oracle = importlib.import_module("ds41_ref")
        self.version = hashlib.sha256((tools / "ds41_ref.py").read_bytes()).hexdigest()[:12]
        self.bugs = set(a.inject or [])
        if self.bugs:
            self.name += " with injected " + ",".join(sorted(self.bugs))
        torch.set_num_threads(a.threads)
        torch.set_grad_enabled(False)
        self.cached = None  # (container dir, fingerprint, DS41Ref)

    def capabilities(self):
        return CAPABILITIES

    def _ref(self, container: Path):
        container = container.resolve()
        if not (container / "manifest.json").is_file():
            raise Unsupported("layout.release", "not a WASTE container (a release or weightless model directory); the oracle reads containers only")
        fp = protocol.fingerprint(sorted(p for p in container.iterdir() if p.is_file()))
        if self.cached and self.cached[0] == container and self.cached[1] == fp:
            ref = self.cached[2]
            ref.reset()
            return ref, fp
        c = self.oracle.Container(str(container))
        ref = self.oracle.DS41Ref(c, engram=True, sink="no-sink" not in self.bugs)
        if "no-yarn" in self.bugs:
            ref.inv_comp = self.oracle.yarn_inv(ref.rd, ref.cfg["compress_rope_theta"], 1.0, 0, 0, 0, False)
        self.cached = (container, fp, ref)
        return ref, fp

    # -------------------------------------------------------------------------- ops

    def forward(self, req):
        if req.get("numerics") != "exact":
            raise Unsupported(f"numerics.{req.get('numerics')}", "the oracle computes in f32 (exact) only")
        if req.get("index_k") != "as-shipped":
            raise Unsupported("index_k.owner", "the oracle has no owner switch (CONTAINER.md §11.2)")
        if req.get("replay"):
            raise Unsupported("replay", "the oracle's step loop cannot be fed forced block inputs")
        tokens = [int(t) for t in req["tokens"]]
        ref, fp = self._ref(Path(req["model"]))
        if req.get("engram_token_map"):
            self._override_map(ref, Path(req["engram_token_map"]))
        start = self._restore(ref, Path(req["load_state"]), fp) if req.get("load_state") else 0
        prefill = req.get("prefill")
        if prefill is None:
            prefill = 0 if req.get("load_state") else len(tokens)
        if prefill > 1:
            raise Unsupported("prefill", "the oracle runs one token at a time, it never prefills")
        rec = Recording(ref, ref.cfg)
        logits_rows = []
        with self._wrapped(ref, rec):
            for i, t in enumerate(tokens):
                rec.pos = start + i
                hidden = []
                logits_rows.append(ref.step(t, start + i, hidden).reshape(-1).clone())
                for l, h in enumerate(hidden):
                    rec.cells[("residual", start + i, l)] = h.view(ref.H, ref.hid).clone()
        positions = list(range(start, start + len(tokens)))
        tensors = self._tensors(ref, rec, tokens, positions, logits_rows)
        from safetensors.torch import save_file
        out = Path(req["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out), metadata=self._metadata(len(tokens)))
        if req.get("save_state"):
            self._save(ref, Path(req["save_state"]), fp, start + len(tokens))
        return {"trace": str(out)}

    def engram_hash(self, req):
        ref, _ = self._ref(Path(req["model"]))
        if ref.eg is None:
            raise Refused(f"{req['model']}: the container has no Engram layers")
        if req.get("engram_token_map"):
            self._override_map(ref, Path(req["engram_token_map"]))
        tokens = [int(t) for t in req["tokens"]]
        dead = set(int(d) for d in req.get("dead", []))
        if any(d < 0 or d >= len(tokens) for d in dead):
            raise Refused(f"dead positions {sorted(dead)} outside the {len(tokens)} tokens")
        # The oracle's history holds compressed ids, -1 for a DEAD slot (an image position).
        hist = [-1 if p in dead else ref.eg.map[t] for p, t in enumerate(tokens)]
        layers = range(len(ref.eg_index))
        return {"ids": [[ref.eg.hashes(i, hist, p) for i in layers] for p in range(len(tokens))]}

    # -------------------------------------------------------------------------- recording

    def _override_map(self, ref, path: Path):
        from safetensors.torch import load_file
        tensors = load_file(str(path))
        if "engram_token_map" not in tensors:
            raise Refused(f"{path}: no `engram_token_map` tensor")
        ref.eg.map = [int(x) for x in tensors["engram_token_map"].reshape(-1).tolist()]

    @contextlib.contextmanager
    def _wrapped(self, ref, rec):
        """Record through the oracle object's own methods (instance attributes shadow them)."""
        cls = type(ref)
        one_hot = torch.zeros(ref.H)
        one_hot[0] = 1.0
        reverse_ties = "gate-ties-reversed" in self.bugs

        def attn(L, x, pos, shared):
            y = cls.attn(ref, L, x, pos, shared)
            rec.put("attn_out", L, y)
            return y

        def mixes(L, site, x):
            pre, post, comb = cls.mixes(ref, L, site, x)
            if site == "attn":
                rec.put("block_input", L, x)
                rec.put("pre_mix", L, one_hot if L == 0 else rec.last_ffn_pre)
            else:
                rec.put("mid", L, x)
                rec.last_ffn_pre = pre
            return pre, post, comb

        def moe(L, x):
            real = torch.topk

            def topk(input, k, *a, **kw):
                r = reversed_ties_topk(input, k, *a, **kw) if reverse_ties else real(input, k, *a, **kw)
                rec.put("experts", L, r.indices.to(torch.int64))
                return r
            torch.topk = topk
            try:
                y = cls.moe(ref, L, x)
            finally:
                torch.topk = real
            rec.put("moe_out", L, y)
            return y

        def index(L, x, qr, lat, pos, nlat, shared):
            sel = cls.index(ref, L, x, qr, lat, pos, nlat, shared)
            width = ref.cfg["index_topk"]
            row = sorted(sel)[:width]
            rec.put("topk", L, torch.tensor(row + [-1] * (width - len(row)), dtype=torch.int64))
            return sel

        eg_cls = type(ref.eg) if ref.eg is not None else None

        def hashes(i, hist, pos):
            ids = eg_cls.hashes(ref.eg, i, hist, pos)
            rec.put("engram_hash", i, torch.tensor(ids, dtype=torch.int64))
            return ids

        ref.attn, ref.mixes, ref.moe, ref.index = attn, mixes, moe, index
        if ref.eg is not None:
            ref.eg.hashes = hashes
        try:
            yield
        finally:
            for name in ("attn", "mixes", "moe", "index"):
                del ref.__dict__[name]
            if ref.eg is not None:
                del ref.eg.__dict__["hashes"]

    def _tensors(self, ref, rec, tokens, positions, logits_rows):
        n_layers = ref.cfg["num_hidden_layers"]
        layers = range(n_layers)
        out = {"input_ids": torch.tensor(tokens, dtype=torch.int64),
               "logits": torch.stack(logits_rows).to(torch.float32),
               "logits_positions": torch.tensor(positions, dtype=torch.int64)}
        for name, dtype in (("residual", torch.float32), ("block_input", torch.float32),
                            ("pre_mix", torch.float32), ("mid", torch.float32), ("attn_out", torch.float32),
                            ("moe_out", torch.float32), ("experts", torch.int32)):
            value = rec.stack(name, positions, layers, dtype)
            if value is not None:
                out[name] = value
        if ref.eg is not None:
            value = rec.stack("engram_hash", positions, range(len(ref.eg_index)), torch.int64)
            if value is not None:
                out["engram_hash"] = value
        for l in sorted(ref.ix_src):
            value = rec.stack("topk", positions, [l], torch.int32)
            if value is not None:
                out[f"topk.L{l}"] = value[:, 0]
        return out

    def _metadata(self, n):
        return {"engine": self.name, "version": self.version, "layout": "container", "numerics": "exact",
                "index-k": "as-shipped", "tie_rule": "torch.topk (unstated)",
                "topk_convention": "compressed positions (no window offset), ascending, -1 = none",
                "logits_rows": "one row per token (token at a time)", "prefill": "1" if n else "0",
                "decode_steps": str(max(n - 1, 0)), "mode": "forward", "torch": torch.__version__,
                **({"defects": ",".join(sorted(self.bugs))} if self.bugs else {})}

    # -------------------------------------------------------------------------- state

    def _save(self, ref, path: Path, fp, position):
        torch.save({"format": STATE_FORMAT, "fingerprint": fp, "position": position,
                    "fields": {f: getattr(ref, f) for f in STATE_FIELDS}}, str(path))

    def _restore(self, ref, path: Path, fp):
        st = protocol.read_state(path, STATE_FORMAT, fp)
        for f in STATE_FIELDS:
            setattr(ref, f, st["fields"][f])
        return int(st["position"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waste", type=Path, default=os.environ.get("DS41_WASTE"),
                    help="a WASTE checkout holding tools/ds41_ref.py (default: $DS41_WASTE)")
    ap.add_argument("--inject", action="append", choices=BUGS, help="run a deliberately broken copy (repeatable)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    if a.waste is None:
        ap.error("name the WASTE checkout: --waste DIR or DS41_WASTE")
    protocol.serve(WasteOracle(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
