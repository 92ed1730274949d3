"""Rotary position embedding: ``rope`` over x ``[B, S, H, Dh]`` at positions ``[S]`` or ``[B, S]``, style
``half`` (rotate_half) or ``interleaved``, an optional ``rotary_dim`` (default ``Dh``; the rest of each
head is passed through).  Blocks split the ``B * S`` tokens; float16 is computed in float32; the output
may alias x."""
from __future__ import annotations

import functools

import numpy as np

from ..registry import builtin
from .blocks import block_boxes, pad_box
from .checks import (FLOATS, ID_TYPES, arity, choice_attr, dtype_in, int_attr, ndim_in, need, num_attr, same_dtype,
                     shape_is)
from .precision import F64, compute_dtype, quiet
from .work import vector_work


@functools.lru_cache(maxsize=32)
def _inv_freq(rd: int, base: float) -> np.ndarray:
    f = 1.0 / (base ** (np.arange(0, rd, 2, dtype=F64) / rd))
    f.flags.writeable = False
    return f


def _check_rope(inputs, outputs, attrs):
    nm = "rope"
    arity(nm, inputs, outputs, 2)
    x, pos, o = inputs[0], inputs[1], outputs[0]
    ndim_in(nm, x, "x", 4, 4)
    dtype_in(nm, x, FLOATS, "x")
    dtype_in(nm, pos, ID_TYPES, "positions")
    same_dtype(nm, ("x", x), ("output", o))
    shape_is(nm, o, x.shape)
    b, s, h, dh = x.shape
    need(tuple(pos.shape) == (s,) or (len(pos.shape) == 2 and pos.shape[0] in (1, b) and pos.shape[1] == s), nm,
         f"positions shape {tuple(pos.shape)} must be [S] = [{s}] or [B, S] = [{b}, {s}]")
    rd = int_attr(nm, attrs, "rotary_dim", dh)
    need(0 < rd <= dh and rd % 2 == 0, nm, f"rotary dim {rd} must be even and in (0, {dh}] (head dim {dh})")
    base = num_attr(nm, attrs, "base", 10000.0)
    need(base > 0, nm, f"attr 'base' must be > 0, got {base!r}")
    choice_attr(nm, attrs, "style", "half", ("half", "interleaved"))


def _rope_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * inputs[0].shape[1]


@builtin("rope", unit="vector", check=_check_rope, work=vector_work(6), parallel_dim=_rope_pd)
@quiet
def _rope_run(ctx, inputs, outputs, attrs):
    """Rotary embedding of x [B,S,H,Dh] at positions [S] or [B,S]; style 'half' (rotate_half) or 'interleaved'"""
    x, pos = inputs
    out = outputs[0]
    b, s, h, dh = x.shape
    rd = int(attrs.get("rotary_dim", dh))
    half = rd // 2
    inv = _inv_freq(rd, float(attrs.get("base", 10000.0)))
    interleaved = attrs.get("style", "half") == "interleaved"
    ct = compute_dtype(out.dtype)
    for box in block_boxes(ctx, (b, s)):
        bs, ss = pad_box(box, 2)
        p = pos[ss] if pos.ndim == 1 else (pos[bs, ss] if pos.shape[0] == b else pos[:, ss])
        ang = p.astype(F64)[..., None] * inv
        cos = np.cos(ang).astype(ct)
        sin = np.sin(ang).astype(ct)
        cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if p.ndim == 1 else \
            (cos[:, :, None, :], sin[:, :, None, :])
        xb, ob = x[bs, ss], out[bs, ss]
        if interleaved:
            x1, x2, o1, o2 = xb[..., 0:rd:2], xb[..., 1:rd:2], ob[..., 0:rd:2], ob[..., 1:rd:2]
        else:
            x1, x2, o1, o2 = xb[..., :half], xb[..., half:rd], ob[..., :half], ob[..., half:rd]
        t1 = np.multiply(x1, cos, dtype=ct)
        t1 -= np.multiply(x2, sin, dtype=ct)
        t2 = np.multiply(x2, cos, dtype=ct)
        t2 += np.multiply(x1, sin, dtype=ct)
        np.copyto(o1, t1, casting="same_kind")                       # both halves read before any write
        np.copyto(o2, t2, casting="same_kind")
        if rd < dh:
            np.copyto(ob[..., rd:], xb[..., rd:])
