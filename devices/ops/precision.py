"""How kernels compute in floating point: float16 in float32 (one rounding into the output), floating-point
exceptions silent (the device just produces ``inf``/``nan``)."""
from __future__ import annotations

import functools

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64


def compute_dtype(dt):
    return F64 if dt == F64 else F32


def quiet(fn):
    """Run a kernel with numpy floating-point warnings off (the device just produces inf/nan).  The
    undecorated body stays reachable as ``quiet_body``, for a caller that turns the warnings off once around
    many kernels (a graph replay, :class:`devices.kernel.KernelRunner`)."""
    @functools.wraps(fn)
    def run(ctx, inputs, outputs, attrs):
        with np.errstate(all="ignore"):
            fn(ctx, inputs, outputs, attrs)
    run.quiet_body = fn               # type: ignore[attr-defined]
    return run


def upcast(fn):
    """Compute ``fn(*ins, out=)`` in float32 when the output is float16 (one rounding at the end)."""
    def g(*ins, out):
        if out.dtype == F16:
            tmp = np.empty(out.shape, F32)
            fn(*[a.astype(F32) if a.dtype == F16 else a for a in ins], out=tmp)
            np.copyto(out, tmp, casting="same_kind")
        else:
            fn(*ins, out=out)
    return g
