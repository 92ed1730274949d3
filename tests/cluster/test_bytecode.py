"""runtime.cluster.bytecode: the bytecode of what device processes import is written once, before they
start, and rewritten when a source changes (so that no device process compiles sources itself)."""
from __future__ import annotations

import importlib.util
import os
import struct
import sys

from runtime.cluster import bytecode


def _pyc_source_mtime(src: str) -> int | None:
    """The source mtime recorded in ``src``'s cached bytecode (None: no bytecode)."""
    try:
        with open(importlib.util.cache_from_source(src), "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return None
    assert head[:4] == importlib.util.MAGIC_NUMBER and head[4:8] == b"\0\0\0\0"      # timestamp-validated
    return struct.unpack("<I", head[8:12])[0]


def test_warm_writes_missing_and_stale_bytecode(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)       # (it would make compileall write hash-based pycs)
    pkg = tmp_path / "vnpu_bc_probe"
    (pkg / "sub").mkdir(parents=True)
    files = [pkg / "__init__.py", pkg / "a.py", pkg / "sub" / "__init__.py", pkg / "sub" / "b.py"]
    for i, f in enumerate(files):
        f.write_text(f"X = {i}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vnpu_bc_probe", raising=False)
    assert all(_pyc_source_mtime(str(f)) is None for f in files)
    assert bytecode.warm(("vnpu_bc_probe",)) is True
    for f in files:                               # every module, subpackages too, with its source's mtime
        assert _pyc_source_mtime(str(f)) == int(f.stat().st_mtime)
    # a source edited later (newer mtime): its bytecode is rewritten, the others are left as they are
    f = files[1]
    f.write_text("X = 'changed'\n")
    t = int(f.stat().st_mtime) + 10
    os.utime(f, (t, t))
    before = os.stat(importlib.util.cache_from_source(str(files[3]))).st_mtime_ns
    assert bytecode.warm(("vnpu_bc_probe",)) is True
    assert _pyc_source_mtime(str(f)) == t
    assert os.stat(importlib.util.cache_from_source(str(files[3]))).st_mtime_ns == before


def test_warm_reports_what_it_cannot_compile(tmp_path, monkeypatch):
    pkg = tmp_path / "vnpu_bc_bad"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert bytecode.warm(("vnpu_bc_bad",)) is False            # a syntax error: not current, no exception
    assert bytecode.warm(("vnpu_no_such_package_xyz",)) is False


def test_device_packages_are_current_after_warm(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    assert bytecode.warm() is True
    import driver.host
    src = driver.host.__file__
    assert _pyc_source_mtime(src) == int(os.stat(src).st_mtime)
