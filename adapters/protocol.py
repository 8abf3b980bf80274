"""The engine side of the ds41 JSON-lines protocol (conformance/PROTOCOL.md), shared by the
adapters in this directory: read one request per line on stdin, answer one reply per line on
stdout, diagnostics on stderr.

An adapter subclasses `Engine`, declares its identity and capabilities, and implements the
ops it supports as methods named after them (`load`, `forward`, `engram_hash`, ...). A method
raises `Refused` (the input is rejected: a broken checkpoint, a foreign state), `Unsupported`
(a capability is missing, with a reason) or any other exception (a failure: the reply carries
the exception and the traceback goes to stderr).
"""
import hashlib
import json
import os
import sys
import traceback

PROTOCOL = "ds41-engine/1"


class Refused(Exception):
    """The engine rejects the input (PROTOCOL.md error kind `refused`)."""


class Unsupported(Exception):
    """The engine lacks `capability` (PROTOCOL.md error kind `unsupported`, structured form)."""

    def __init__(self, capability: str, reason: str):
        super().__init__(f"{capability}: {reason}")
        self.capability = capability
        self.reason = reason


class Engine:
    name = "unnamed"
    version = "0"
    commit = None

    def capabilities(self) -> list:
        raise NotImplementedError

    def hello(self, req):
        if req.get("protocol") != PROTOCOL:
            raise RuntimeError(f"this adapter speaks {PROTOCOL}, not {req.get('protocol')!r}")
        return {"protocol": PROTOCOL,
                "engine": {"name": self.name, "version": self.version, "commit": self.commit},
                "capabilities": self.capabilities()}


def fingerprint(files) -> str:
    """Identifies a checkpoint for state files without reading all of it: per file its name,
    size, first and last MiB (different weights differ there)."""
    h = hashlib.sha256()
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}:{size}".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()


def read_state(path, fmt: str, fp: str) -> dict:
    """A state file an adapter wrote with `torch.save({"format": fmt, "fingerprint": ...})`;
    anything else, or a state of another checkpoint, is refused (PROTOCOL.md `load_state`)."""
    import torch
    try:
        st = torch.load(str(path), weights_only=True)
    except Exception as e:  # noqa: BLE001 -- an unreadable state is refused with its reason
        raise Refused(f"{path}: not a state this adapter wrote: {e}") from None
    if not isinstance(st, dict) or st.get("format") != fmt:
        raise Refused(f"{path}: not a {fmt} file")
    if st.get("fingerprint") != fp:
        raise Refused(f"{path}: the state belongs to another checkpoint (fingerprint "
                      f"{str(st.get('fingerprint'))[:12]}, this one {fp[:12]})")
    return st


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def reply(out, rid, result=None, error=None):
    msg = {"id": rid, "ok": error is None}
    if error is None:
        msg["result"] = result if result is not None else {}
    else:
        msg["error"] = error
    out.write(json.dumps(msg) + "\n")
    out.flush()


def serve(engine: Engine, inp=None, out=None):
    """Answer requests until `shutdown` or end of input."""
    inp = inp or sys.stdin
    if out is None:
        # stdout carries protocol lines only: whatever the engine's own code prints goes to stderr
        out, sys.stdout = sys.stdout, sys.stderr
    for line in inp:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            reply(out, 0, error={"kind": "failed", "message": f"malformed request: {e}"})
            continue
        rid, op = req.get("id", 0), req.get("op")
        if op == "shutdown":
            reply(out, rid, {})
            return
        handler = getattr(engine, op, None) if isinstance(op, str) and not op.startswith("_") else None
        if handler is None or op in ("capabilities",):
            reply(out, rid, error={"kind": "failed", "message": f"unknown op {op!r}"})
            continue
        try:
            result = handler(req)
        except Refused as e:
            log(f"refused {op}: {e}")
            reply(out, rid, error={"kind": "refused", "message": str(e)})
        except Unsupported as e:
            log(f"unsupported {op}: {e}")
            reply(out, rid, error={"kind": "unsupported", "capability": e.capability, "message": e.reason})
        except Exception as e:  # noqa: BLE001 -- every failure is answered, with its traceback on stderr
            traceback.print_exc(file=sys.stderr)
            reply(out, rid, error={"kind": "failed", "message": f"{type(e).__name__}: {e}"})
        else:
            reply(out, rid, result)
