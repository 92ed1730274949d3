"""Generate Python code from ``proto/*.proto`` into ``driver/_gen`` (never committed).

Run by ``scripts/setup.sh`` and on first import of :mod:`driver.wire` when the output is missing or older
than the ``.proto`` files.  Only :mod:`driver.wire` imports the generated modules.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "driver" / "_gen"


def stale() -> bool:
    protos = sorted(PROTO_DIR.glob("**/*.proto"))
    outs = list(OUT_DIR.glob("**/*_pb2.py"))
    if not protos:
        return False
    if len(outs) < len(protos):
        return True
    newest_in = max(p.stat().st_mtime for p in protos)
    oldest_out = min(p.stat().st_mtime for p in outs)
    return newest_in > oldest_out


def generate() -> None:
    from grpc_tools import protoc
    import importlib.resources

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("**/*.proto"))
    if not protos:
        return
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={OUT_DIR}",
            f"--grpc_python_out={OUT_DIR}", *protos]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {protos}")
    for d in [OUT_DIR, *[p for p in OUT_DIR.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()


def ensure() -> None:
    if stale():
        generate()


if __name__ == "__main__":
    generate() if "--force" in sys.argv else ensure()
