"""The on-disk cache of dequantised GGUF weights: what one process dequantised, the next one maps.

Reading SmolLM2's GGUF costs seconds in every process that serves it -- ``gguf.GGUFReader`` builds a
Python object per tokenizer entry (~100k) and ``gguf.dequantize`` expands Q4_1/Q8_0 to float32 -- and a
``vnpu serve`` process, each Ray Serve replica and each CLI command paid it again.  The first load writes
the float32 tensors (one raw little-endian blob, 64-byte aligned) and the metadata and tensor types (JSON)
to ``<cache>/gguf/<key>/``; later loads map the blob read-only (``mmap``: processes on one machine share
the pages) and read the JSON, bit-identical to a fresh dequantisation.

- Where: ``$VNPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/vnpu``, else ``~/.cache/vnpu`` (directories mode 0700).
  Safe to delete at any time (a running process keeps its mapping); never edit an entry in place (the
  processes mapping it would see the edit).  ~540 MB for SmolLM2.
- Key: the GGUF file's resolved path, size and modification time, the ``gguf`` package's version and this
  module's format version -- a changed file or library is a new entry, never a stale one.
- An entry appears whole or not at all (written to a temporary directory beside it, then renamed); two
  processes writing at once both succeed, one entry stays; a damaged entry is replaced by the next write.
  An unreadable, unwritable or inconsistent cache is no error: the caller dequantises as if there were none.

Nothing here blocks on anything but the file system.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import tempfile
from importlib import metadata as md
from pathlib import Path

import numpy as np

log = logging.getLogger("vnpu.models")

FORMAT = 1                     #: bump when the layout below changes
ALIGN = 64
BLOB, INDEX = "tensors.f32", "index.json"


def cache_root() -> Path:
    """``$VNPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/vnpu``, else ``~/.cache/vnpu``."""
    if os.environ.get("VNPU_CACHE_DIR"):
        return Path(os.environ["VNPU_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path("~/.cache").expanduser()) / "vnpu"


def entry_dir(path: str | Path) -> Path:
    """The cache entry of the GGUF file ``path`` as it is now (see the module doc for the key)."""
    p = Path(path).resolve()
    st = p.stat()
    try:
        lib = md.version("gguf")
    except md.PackageNotFoundError:
        lib = "?"
    key = f"{FORMAT}|{lib}|{p}|{st.st_size}|{st.st_mtime_ns}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:32]


def load(path: str | Path) -> tuple[dict[str, np.ndarray], dict, dict[str, str]] | None:
    """``(tensors, meta, types)`` of ``path`` from the cache -- read-only float32 arrays over one shared
    mapping -- or None when there is no usable entry."""
    try:
        d = entry_dir(path)
        index = json.loads((d / INDEX).read_text())
        with open(d / BLOB, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != index["blob_bytes"]:
                return None
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        tensors = {}
        for name, shape, offset in index["tensors"]:
            n = int(np.prod(shape, dtype=np.int64))
            tensors[name] = np.frombuffer(buf, dtype="<f4", count=n, offset=offset).reshape(shape)
        return tensors, index["meta"], index["types"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(path: str | Path, tensors: dict[str, np.ndarray], meta: dict, types: dict[str, str]) -> bool:
    """Write the entry of ``path`` (whole or not at all); False when it could not be written or the
    metadata does not survive JSON unchanged (then nothing is cached)."""
    index = {"format": FORMAT, "meta": meta, "types": types, "tensors": []}
    try:
        if json.loads(json.dumps(index["meta"])) != meta:
            return False
        final = entry_dir(path)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    except (OSError, TypeError, ValueError):
        return False
    try:
        offset = 0
        with open(tmp / BLOB, "wb") as f:
            for name, a in tensors.items():
                a = np.ascontiguousarray(a, dtype="<f4")
                pad = -offset % ALIGN
                f.write(b"\0" * pad)
                offset += pad
                index["tensors"].append([name, list(a.shape), offset])
                f.write(a.tobytes())
                offset += a.nbytes
        index["blob_bytes"] = offset
        (tmp / INDEX).write_text(json.dumps(index))
        try:
            os.rename(tmp, final)                        # fails when another process's entry is there ...
        except OSError:
            if load(path) is not None:
                return True
            shutil.rmtree(final, ignore_errors=True)     # ... or a damaged one: replaced (a reader keeps its map)
            os.rename(tmp, final)
        return True
    except OSError as e:
        if not final.exists():
            log.debug("weight cache: could not write %s: %s", final, e)
        return final.exists()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
