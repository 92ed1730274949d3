"""Operators without a vnpu kernel run on the CPU, never silently (as torch_npu's CPU fallback does).

The npu operands are copied to the host (waiting for their stream), the operator runs on CPU tensors, and
its results are copied back to the device of its first npu operand; operands the operator writes
(in-place and ``out=`` forms) get the new values.  The first fallback of each operator warns once
(:class:`NpuFallbackWarning`) and every one is counted (:func:`counts`).  ``VNPU_TORCH_STRICT=1`` makes a
fallback an error instead (:class:`~.errors.NpuFallbackError`, before anything is copied).  Host-blocking.
"""
from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .errors import NpuFallbackError
from .tensor import NpuTensor, new_empty, to_cpu, upload, device_of

#: the environment variable that turns fallbacks into errors
STRICT_ENV = "VNPU_TORCH_STRICT"


class NpuFallbackWarning(UserWarning):
    """An operator ran on the CPU because vnpu has no kernel for it (once per operator)."""


_COUNTS: Counter = Counter()
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def counts() -> dict[str, int]:
    """Operator name (``aten::topk``) -> how many times it fell back to the CPU in this process."""
    with _LOCK:
        return dict(_COUNTS)


def reset_counts() -> None:
    with _LOCK:
        _COUNTS.clear()
        _WARNED.clear()


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def note(name: str, why: str = "") -> None:
    """Count one fallback of ``name`` (warn the first time; NpuFallbackError under VNPU_TORCH_STRICT=1)."""
    if strict():
        raise NpuFallbackError(f"{name} has no vnpu kernel{why} and {STRICT_ENV}=1 forbids the CPU fallback")
    with _LOCK:
        _COUNTS[name] += 1
        first = name not in _WARNED
        _WARNED.add(name)
    if first:
        warnings.warn(f"{name} has no vnpu kernel{why}: it runs on the CPU (counted in "
                      f"runtime.torch.fallback_counts(); {STRICT_ENV}=1 makes this an error)",
                      NpuFallbackWarning, stacklevel=3)


def run_on_cpu(func, args, kwargs, why: str = ""):
    """Run ``func`` on CPU copies of its npu operands and bring the results back (see the module docstring)."""
    name = func.name().removesuffix(".default")
    note(name, why)
    npu = [a for a in _flat(args, kwargs) if isinstance(a, NpuTensor)]
    index = device_of(*npu) if npu else None
    cpu_of: dict[int, tuple[NpuTensor, torch.Tensor]] = {}

    def down(a):
        if isinstance(a, NpuTensor):
            c = to_cpu(a)
            cpu_of[id(c)] = (a, c)
            return c
        return a

    cargs, ckwargs = tree_map(down, args), tree_map(down, kwargs)
    out = func(*cargs, **ckwargs)
    for i, arg in enumerate(func._schema.arguments):       # operands the operator wrote: copy back
        if arg.alias_info is not None and arg.alias_info.is_write:
            val = cargs[i] if i < len(cargs) else ckwargs.get(arg.name)
            for v in (val if isinstance(val, (list, tuple)) else [val]):
                if isinstance(v, torch.Tensor) and id(v) in cpu_of:
                    upload(cpu_of[id(v)][0], v)

    def up(r):
        if isinstance(r, torch.Tensor) and not isinstance(r, NpuTensor):
            hit = cpu_of.get(id(r))
            if hit is not None:
                return hit[0]                 # an in-place / out= result: the npu operand itself
            if index is None:
                return r
            t = new_empty(index, r.shape, r.dtype)
            upload(t, r)
            return t
        return r

    return tree_map(up, out)


def _flat(args, kwargs) -> list[Any]:
    out: list[Any] = []
    tree_map(out.append, (args, kwargs))
    return out
