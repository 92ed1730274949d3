"""Generate Python code from ``proto/*.proto`` into ``driver/_gen`` (never committed).

Run at set-up only: ``scripts/setup.sh`` runs ``python -m driver.protogen`` (``--force`` regenerates even
when the output looks current).  Nothing generates code at import time: :mod:`driver.wire`, the only
importer of the generated modules, calls :func:`check` and refuses to load -- with an error that says to
run ``scripts/setup.sh`` -- when the output is missing or older than the ``.proto`` files.

protoc writes imports relative to the proto root (``from vnpu.v1 import dms_pb2``); they are rewritten to
``from driver._gen.vnpu.v1 import dms_pb2`` so the generated package needs no ``sys.path`` entry.
The public protocols vnpu serves (``proto/inference``: KServe's ``inference`` package) are built into a
descriptor pool of their own, not protobuf's default one: their official clients (``tritonclient.grpc``)
register the same message names in the default pool, and a process that imports both -- a test, a
benchmark driving ``vnpu serve`` -- must not fail with "duplicate symbol".
Generation runs under a file lock into a scratch folder and swaps each file in atomically, so processes
that import the driver at the same moment (Ray workers, test runners) never see half-written code.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import re
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "driver" / "_gen"
GEN_PACKAGE = "driver._gen"
#: proto packages vnpu owns (their messages go to protobuf's default pool); any other top-level folder
#: under proto/ holds a public protocol whose messages go to a pool of their own (:func:`_own_pool`)
OWN_PACKAGES = frozenset({"vnpu"})


def stale() -> bool:
    protos = sorted(PROTO_DIR.glob("**/*.proto"))
    outs = [p for p in OUT_DIR.glob("**/*_pb2.py") if not any(x.startswith(".") for x in p.parts[-4:])]
    if not protos:
        return False
    if len(outs) < len(protos):
        return True
    newest_in = max(p.stat().st_mtime for p in protos)
    oldest_out = min(p.stat().st_mtime for p in outs)
    return newest_in > oldest_out


def _rewrite_imports(text: str, top_packages: set[str]) -> str:
    """``from vnpu.v1 import x_pb2`` -> ``from driver._gen.vnpu.v1 import x_pb2`` (and ``import x_pb2``
    of protos at the root)."""
    if top_packages:
        alt = "|".join(sorted(map(re.escape, top_packages)))
        text = re.sub(rf"^from ((?:{alt})(?:\.\w+)*) import ", rf"from {GEN_PACKAGE}.\1 import ", text,
                      flags=re.M)
    return re.sub(r"^import (\w+_pb2)( as \w+)?$", rf"from {GEN_PACKAGE} import \1\2", text, flags=re.M)


def _own_pool(text: str) -> str:
    """A generated ``*_pb2.py`` that builds its file into a private descriptor pool instead of the default
    one (messages, serialization and the gRPC stubs work the same)."""
    new, n = re.subn(r"^DESCRIPTOR = _descriptor_pool\.Default\(\)\.AddSerializedFile\(",
                     "_POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = _POOL.AddSerializedFile(", text, flags=re.M)
    if n != 1:
        raise RuntimeError("generated code does not build its descriptor as expected (protoc changed?)")
    return new


def generate() -> None:
    from grpc_tools import protoc
    import importlib.resources

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("**/*.proto"))
    if not protos:
        return
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with open(OUT_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-", dir=OUT_DIR))
        try:
            include = str(importlib.resources.files("grpc_tools") / "_proto")
            args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}",
                    f"--grpc_python_out={tmp}", *protos]
            rc = protoc.main(args)
            if rc != 0:
                raise RuntimeError(f"protoc failed ({rc}) on {protos}")
            tops = {pathlib.PurePath(p).parts[0] for p in protos if len(pathlib.PurePath(p).parts) > 1}
            for d in [tmp, *[p for p in tmp.rglob("*") if p.is_dir()]]:
                (d / "__init__.py").touch()
            for f in sorted(tmp.rglob("*.py")):
                rel = f.relative_to(tmp)
                if f.name != "__init__.py":
                    text = _rewrite_imports(f.read_text(), tops)
                    if f.name.endswith("_pb2.py") and rel.parts[0] not in OWN_PACKAGES:
                        text = _own_pool(text)
                    f.write_text(text)
                dest = OUT_DIR / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                if f.name == "__init__.py" and dest.exists():
                    continue
                os.replace(f, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def ensure() -> None:
    if stale():
        generate()


class GeneratedCodeError(ImportError):
    """The generated protobuf code is missing or older than ``proto/``: run ``scripts/setup.sh``."""


def check() -> None:
    """Raise :class:`GeneratedCodeError` unless the generated code is present and current."""
    if not (OUT_DIR / "vnpu" / "v1").is_dir():
        raise GeneratedCodeError(f"the generated protobuf code ({OUT_DIR}) is missing: run scripts/setup.sh "
                                 f"(or `python -m driver.protogen`)")
    if stale():
        raise GeneratedCodeError(f"the generated protobuf code ({OUT_DIR}) is older than {PROTO_DIR}: run "
                                 f"scripts/setup.sh (or `python -m driver.protogen`)")


if __name__ == "__main__":
    generate() if "--force" in sys.argv else ensure()
