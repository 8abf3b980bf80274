"""Write and compare provenance sidecars (schema `ds41-golden-provenance/1`, goldens/README.md).

Shared by every script in goldens/regen/. The Rust side (`ds41 goldens check`) reads the same
format; keep the two in step (conformance/src/goldens/provenance.rs).
"""
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

SCHEMA = "ds41-golden-provenance/1"
SUFFIX = ".provenance.json"
UPSTREAM_ENV = "DS41_UPSTREAM"
RELEASE_ENV = "DS41_RELEASE"


def repo_root() -> Path:
    """The checkout these scripts live in (goldens/regen/ -> repository root)."""
    return Path(__file__).resolve().parents[2]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_sha256(root: Path) -> str:
    """sha256 of the sorted `sha256sum`-style listing of every file below root (hashing.rs)."""
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    listing = "".join(f"{sha256_file(root / r)}  {r}\n" for r in rels)
    return hashlib.sha256(listing.encode()).hexdigest()


def sha256_path(path: Path) -> str:
    return tree_sha256(path) if path.is_dir() else sha256_file(path)


def describe_input(name: str, path: Path) -> dict:
    """An input record: location repo / release / upstream / external, decided by where the
    path is (the release snapshot is $DS41_RELEASE)."""
    path = path.resolve()
    digest = sha256_path(path)
    root = repo_root()
    upstream = os.environ.get(UPSTREAM_ENV)
    if path.is_relative_to(root):
        return {"name": name, "location": "repo", "path": path.relative_to(root).as_posix(), "sha256": digest}
    release = os.environ.get(RELEASE_ENV)
    if release and path.is_relative_to(Path(release).resolve()):
        rel = path.relative_to(Path(release).resolve()).as_posix()
        return {"name": name, "location": "release", "path": rel, "sha256": digest}
    if upstream and path.is_relative_to(Path(upstream).resolve()):
        rel = path.relative_to(Path(upstream).resolve()).as_posix()
        return {"name": name, "location": "upstream", "path": rel, "sha256": digest}
    return {"name": name, "location": "external", "path": path.name, "sha256": digest}


def environment(**extra) -> dict:
    env = {"python": platform.python_version(), "platform": f"{sys.platform}-{platform.machine()}"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_sidecar(sidecar: Path, *, description, generator, command, inputs, outputs,
                  synthetic=None, errata=None) -> bool:
    """Write `sidecar` (outputs: paths relative to its directory). Returns True if it changed."""
    base = sidecar.parent
    record = {
        "schema": SCHEMA,
        "description": description,
        "generator": generator,
        "command": command,
    }
    if synthetic:
        record["synthetic"] = synthetic
    record["inputs"] = inputs
    record["outputs"] = [
        {"path": p, "sha256": sha256_file(base / p), "bytes": (base / p).stat().st_size}
        for p in outputs
    ]
    if errata:
        record["errata"] = dict(sorted(errata.items()))
    text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    old = sidecar.read_text(encoding="utf-8") if sidecar.exists() else None
    sidecar.write_text(text, encoding="utf-8")
    return old != text


def report_change(path: Path, old: bytes | None, new: bytes) -> str:
    """One line saying what changed in a text golden (line-based)."""
    if old is None:
        return f"{path}: new ({len(new)} bytes)"
    if old == new:
        return f"{path}: unchanged"
    a, b = old.decode("utf-8", "replace").splitlines(), new.decode("utf-8", "replace").splitlines()
    differing = [i for i in range(max(len(a), len(b))) if (a[i] if i < len(a) else None) != (b[i] if i < len(b) else None)]
    return (f"{path}: {len(differing)} line(s) differ ({len(a)} -> {len(b)} lines), "
            f"first at line {differing[0] + 1}")


def report_tensor_changes(path: Path, old: dict | None, new: dict) -> str:
    """What changed in a safetensors golden, per tensor: max |d| and rel L2 = |new-old| / |old|."""
    if old is None:
        return f"{path}: new ({len(new)} tensors)"
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"  {name}: removed")
        elif name not in old:
            lines.append(f"  {name}: added")
        elif old[name].shape != new[name].shape or old[name].dtype != new[name].dtype:
            lines.append(f"  {name}: {old[name].dtype}{list(old[name].shape)} -> {new[name].dtype}{list(new[name].shape)}")
        else:
            a, b = old[name].double(), new[name].double()
            if not bool((a != b).any()):
                continue
            d = b - a
            den = a.norm().item()
            rel = d.norm().item() / den if den else float("inf")
            lines.append(f"  {name}: {int((a != b).sum())}/{a.numel()} differ, max |d| {d.abs().max().item():.3e}, rel L2 {rel:.3e}")
    return f"{path}: " + (f"{len(lines)} tensor(s) changed\n" + "\n".join(lines) if lines else "unchanged")


def parse_input(spec: str) -> dict:
    name, sep, path = spec.partition("=")
    if not (sep and name and path):
        raise SystemExit(f"--input {spec!r}: expected NAME=PATH")
    return describe_input(name, Path(path))


def main(argv=None):
    """`python3 goldens/regen/provenance.py hand-written FILE... --description D --how H
    [--sidecar S] [--input NAME=PATH]...`: record hand-written goldens (or inputs kept under
    goldens/)."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    sub = ap.add_subparsers(dest="action", required=True)
    hw = sub.add_parser("hand-written", help="record files written by hand")
    hw.add_argument("files", nargs="+", type=Path)
    hw.add_argument("--description", required=True)
    hw.add_argument("--how", required=True, help="how they were written/verified (recorded as the command)")
    hw.add_argument("--sidecar", type=Path, help="default: FILE.provenance.json for a single file")
    hw.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                    help="an input the files were made from (e.g. the script holding them); repeatable")
    args = ap.parse_args(argv)
    files = [f.resolve() for f in args.files]
    sidecar = args.sidecar or files[0].with_name(files[0].name + SUFFIX)
    if len(files) > 1 and not args.sidecar:
        ap.error("several files need --sidecar")
    base = sidecar.resolve().parent
    changed = write_sidecar(
        sidecar,
        description=args.description,
        generator={"kind": "hand-written", "name": "hand-written", "version": "1"},
        command=args.how,
        inputs=[parse_input(spec) for spec in args.input],
        outputs=[f.relative_to(base).as_posix() for f in files],
    )
    print(f"{sidecar}: {'written' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
