"""How a launch's blocks share the work: flat row-major splits of an output into boxes, broadcast inputs
cut to a box, elementwise application over a block's share, ``[rows, D]`` views.

Block ``ctx.block_idx`` of ``ctx.block_dim`` takes ``ctx.split(parallel_dim)``; one block
(``block_dim == 1``) takes the whole tensor in one numpy call.
"""
from __future__ import annotations

import numpy as np


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def out_numel(inputs, outputs, attrs) -> int:
    return outputs[0].numel


def flat_boxes(shape, start: int, stop: int) -> list[tuple]:
    """Boxes (tuples of slices over a prefix of ``shape``) covering flat row-major ``[start, stop)`` once.

    At most ``2 * len(shape) - 1`` boxes; slices always keep their axis (length-1 slices, no ints).
    """
    out: list[tuple] = []

    def rec(prefix, dims, lo, hi):
        if lo >= hi:
            return
        if not dims:
            out.append(prefix)
            return
        inner = numel(dims[1:])
        i0, r0 = divmod(lo, inner)
        i1, r1 = divmod(hi, inner)
        if i0 == i1:
            rec(prefix + (slice(i0, i0 + 1),), dims[1:], r0, r1)
            return
        if r0:
            rec(prefix + (slice(i0, i0 + 1),), dims[1:], r0, inner)
            i0 += 1
        if i1 > i0:
            out.append(prefix + (slice(i0, i1),))
        if r1:
            rec(prefix + (slice(i1, i1 + 1),), dims[1:], 0, r1)

    rec((), tuple(shape), start, stop)
    return out


def part_for(a: np.ndarray, box: tuple, ndim: int) -> np.ndarray:
    """The part of ``a`` (broadcastable, right-aligned, to an ``ndim``-d result) that feeds ``box``."""
    off = ndim - a.ndim
    idx = tuple((slice(None) if a.shape[j - off] == 1 else s) for j, s in enumerate(box) if j >= off)
    return a[idx + (Ellipsis,)]


def block_boxes(ctx, shape) -> list[tuple]:
    """This block's boxes over ``shape`` (flat row-major split); the whole shape for one block."""
    if ctx.block_dim == 1:
        return [()]
    r = ctx.split(numel(shape))
    return flat_boxes(shape, r.start, r.stop) if r else []


def pad_box(box, n):
    return tuple(box) + (slice(None),) * (n - len(box))


def pad_boxes(boxes, n):
    return [pad_box(b, n) for b in boxes]


def apply_elementwise(ctx, fn, ins, out) -> None:
    """``fn(*ins, out=...)`` on this block's share of ``out``'s elements (inputs broadcast to ``out``)."""
    if out.ndim == 0:                    # numpy ufuncs return scalars, not arrays, for 0-d temporaries
        out, ins = out.reshape(1), [a.reshape(1) for a in ins]
    if ctx.block_dim == 1:
        fn(*ins, out=out)
        return
    r = ctx.split(out.size)
    if not r:
        return
    if out.flags.c_contiguous and all(a.shape == out.shape and a.flags.c_contiguous for a in ins):
        sl = slice(r.start, r.stop)
        fn(*[a.reshape(-1)[sl] for a in ins], out=out.reshape(-1)[sl])
        return
    for box in flat_boxes(out.shape, r.start, r.stop):
        fn(*[part_for(a, box, out.ndim) for a in ins], out=out[box + (Ellipsis,)])


def as_rows(a: np.ndarray, d: int, writable=False) -> np.ndarray:
    """``a`` as ``[rows, d]`` (a view; outputs must not be copied)."""
    shape = (a.size // d if d else numel(a.shape[:-1]), d)
    return a.reshape(shape, copy=False) if writable else a.reshape(shape)
