"""Bytecode for the device processes, compiled once, by the process that starts them.

Every device actor is a fresh Python process that imports :mod:`devices` and :mod:`driver`.  Where their
``__pycache__`` is missing or stale -- a checkout used without ``scripts/setup.sh``, sources edited since,
and always when ``PYTHONDONTWRITEBYTECODE`` is set, so that no process ever writes it -- each device
process compiles those sources again.  Measured on a 2-core machine (load 12-21): a device process used
0.60-0.64 CPU-s until it served without bytecode, 0.51-0.54 with it (an empty Ray actor's worker:
0.40-0.46), and dozens of devices starting at once pay that in full.  :func:`warm` compiles what is missing
or stale once, before the devices start: ~0.3 CPU-s when nothing is compiled, a few ms when all is current.

Host-blocking (file I/O only).  Never fails: where the package's folder cannot be written (a read-only
install) the devices compile in memory as before.
"""
from __future__ import annotations

import compileall
import contextlib
import os

#: the packages a device process imports (tests/driver/test_device_footprint.py: no runtime code in a device)
DEVICE_PACKAGES = ("devices", "driver")


def warm(packages: tuple[str, ...] = DEVICE_PACKAGES) -> bool:
    """Write current bytecode for every module of ``packages`` (only what is missing or stale: a stat and
    a header read per module otherwise).  True when all of it is current afterwards."""
    import importlib
    ok = True
    for name in packages:
        with contextlib.suppress(ImportError, OSError):
            folder = os.path.dirname(importlib.import_module(name).__file__ or "")
            ok = bool(folder) and bool(compileall.compile_dir(folder, quiet=2, workers=1)) and ok
            continue
        ok = False
    return ok


__all__ = ["warm", "DEVICE_PACKAGES"]
