"""Data movement: transpose, strided_slice, concat, expand (the output's elements are the input's,
rearranged) and gather (ONNX Gather, indices read from device memory).

Blocks split the output's elements, except ``gather`` (the (outer, index) pairs) and ``concat`` (the rows
before the axis).
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..errors import ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, KernelError
from ..registry import builtin
from .blocks import block_boxes, numel, out_numel, pad_box, part_for
from .checks import (ID_TYPES, arity, dtype_in, is_int, ndim_in, need, norm_axis, same_dtype, shape_is,
                     unary_operands)
from .work import vector_work


def _copy_blocks(ctx, view, out) -> None:
    """This block's share of ``out`` = ``view`` (a view of the input with ``out``'s shape)."""
    for box in block_boxes(ctx, out.shape):
        b = box + (Ellipsis,)
        np.copyto(out[b], view[b])


def _perm(name, attrs, ndim) -> tuple[int, ...]:
    p = attrs.get("perm")
    need(isinstance(p, (tuple, list)) and all(is_int(i) for i in p), name,
         f"attr 'perm' must be a tuple of ints, got {p!r}")
    need(sorted(int(i) for i in p) == list(range(ndim)), name,
         f"attr 'perm'={tuple(p)!r} is not a permutation of the {ndim} input axes")
    return tuple(int(i) for i in p)


def _check_transpose(inputs, outputs, attrs):
    arity("transpose", inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    p = _perm("transpose", attrs, len(x.shape))
    same_dtype("transpose", ("input", x), ("output", o))
    shape_is("transpose", o, tuple(x.shape[i] for i in p))


@builtin("transpose", unit="vector", check=_check_transpose, work=vector_work(0), parallel_dim=out_numel)
def _transpose_run(ctx, inputs, outputs, attrs):
    """out = x.transpose(perm)"""
    _copy_blocks(ctx, inputs[0].transpose(tuple(attrs["perm"])), outputs[0])


def _check_gather(inputs, outputs, attrs):
    nm = "gather"
    arity(nm, inputs, outputs, 2)
    x, idx, o = inputs[0], inputs[1], outputs[0]
    ndim_in(nm, x, "data", 1)
    dtype_in(nm, idx, ID_TYPES, "indices")
    same_dtype(nm, ("data", x), ("output", o))
    ax = norm_axis(nm, attrs.get("axis", 0), len(x.shape))
    shape_is(nm, o, tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]))


def _gather_layout(inputs, attrs):
    x, idx = inputs[0], inputs[1]
    ax = int(attrs.get("axis", 0)) % len(x.shape)
    return numel(x.shape[:ax]), x.shape[ax], numel(x.shape[ax + 1:]), numel(idx.shape)


def _gather_pd(inputs, outputs, attrs):
    p, _, _, i = _gather_layout(inputs, attrs)
    return p * i


def _gather_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * outputs[0].nbytes, unit="vector")


@builtin("gather", unit="vector", check=_check_gather, work=_gather_work, parallel_dim=_gather_pd, gathers=(0,))
def _gather_run(ctx, inputs, outputs, attrs):
    """ONNX Gather: out = take(data, indices, axis) (attr axis, default 0); indices may be negative
    (counted from the end); one outside [-n, n) traps (507042) before anything is written"""
    x, idx = inputs
    p, n, q, ni = _gather_layout(inputs, attrs)
    flat = idx.reshape(-1)
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -n or hi >= n:
            bad = np.flatnonzero((flat < -n) | (flat >= n))
            raise KernelError(f"gather: index {int(flat[bad[0]])} at flat position {int(bad[0])} is outside "
                              f"[-{n}, {n}) along the gathered axis ({bad.size} bad index(es))",
                              code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
        if lo < 0:
            flat = np.where(flat < 0, flat + n, flat)
    x3 = x.reshape(p, n, q)
    o3 = outputs[0].reshape((p, ni, q), copy=False)
    for box in block_boxes(ctx, (p, ni)):
        ps, is_ = pad_box(box, 2)
        np.take(x3[ps], flat[is_], axis=1, out=o3[ps, is_], mode="clip")


def _slice_triples(nm, attrs, shape):
    vals = []
    for k in ("begin", "end", "strides"):
        v = attrs.get(k)
        need(isinstance(v, (tuple, list)) and len(v) == len(shape) and all(is_int(i) for i in v), nm,
             f"attr {k!r} must be {len(shape)} ints (one per input axis), got {v!r}")
        vals.append(tuple(int(i) for i in v))
    out = []
    for ax, (b, e, s, n) in enumerate(zip(*vals, shape)):
        need(s != 0, nm, f"stride of axis {ax} is 0")
        lo, hi = (0, n) if s > 0 else (-1, n - 1)
        need(lo <= b <= hi and lo <= e <= hi, nm, f"axis {ax}: begin {b} / end {e} are not normalized for size "
                                                  f"{n} and stride {s} (as slice.indices gives them)")
        out.append((b, e, s))
    return out


def _slicer(triples):
    """numpy slices for normalized triples (an empty range stays empty; end -1 with a negative stride
    means "through index 0")."""
    out = []
    for b, e, s in triples:
        if not len(range(b, e, s)):
            out.append(slice(0, 0))
        else:
            out.append(slice(b, None if (s < 0 and e < 0) else e, s))
    return tuple(out)


def _check_strided_slice(inputs, outputs, attrs):
    nm = "strided_slice"
    x, o = unary_operands(nm, inputs, outputs)
    triples = _slice_triples(nm, attrs, tuple(x.shape))
    shape_is(nm, o, tuple(len(range(b, e, s)) for b, e, s in triples))


@builtin("strided_slice", unit="vector", check=_check_strided_slice, work=vector_work(0), parallel_dim=out_numel)
def _strided_slice_run(ctx, inputs, outputs, attrs):
    """out = x[begin:end:strides] per axis; attrs begin/end/strides have one entry per axis, normalized as
    Python's ``slice.indices`` gives them (end -1 with a negative stride means "through index 0")"""
    _copy_blocks(ctx, inputs[0][_slicer(_slice_triples("strided_slice", attrs, inputs[0].shape))], outputs[0])


def _check_concat(inputs, outputs, attrs):
    nm = "concat"
    need(len(inputs) >= 1, nm, "expects at least 1 input")
    need(len(outputs) == 1, nm, f"expects 1 output, got {len(outputs)}")
    first, o = inputs[0], outputs[0]
    ndim_in(nm, first, "input 0", 1)
    ax = norm_axis(nm, attrs.get("axis", 0), len(first.shape))
    total = 0
    for i, d in enumerate(inputs):
        same_dtype(nm, ("input 0", first), (f"input {i}", d))
        need(len(d.shape) == len(first.shape) and all(a == b for j, (a, b) in enumerate(zip(d.shape, first.shape))
                                                      if j != ax), nm,
             f"input {i} shape {tuple(d.shape)} differs from input 0 {tuple(first.shape)} off axis {ax}")
        total += d.shape[ax]
    same_dtype(nm, ("input 0", first), ("output", o))
    shape_is(nm, o, tuple(first.shape[:ax]) + (total,) + tuple(first.shape[ax + 1:]))


def _concat_pd(inputs, outputs, attrs):
    ax = int(attrs.get("axis", 0)) % len(inputs[0].shape)
    return numel(inputs[0].shape[:ax])


@builtin("concat", unit="vector", check=_check_concat, work=vector_work(0), parallel_dim=_concat_pd)
def _concat_run(ctx, inputs, outputs, attrs):
    """Concatenate the inputs along attr axis (default 0)"""
    out = outputs[0]
    ax = int(attrs.get("axis", 0)) % out.ndim
    outer = numel(out.shape[:ax])
    inner = numel(out.shape[ax + 1:])
    o2 = out.reshape((outer, out.shape[ax] * inner), copy=False)
    r = range(outer) if ctx.block_dim == 1 else ctx.split(outer)
    if not r:
        return
    rows = slice(r.start, r.stop)
    col = 0
    for x in inputs:
        w = x.shape[ax] * inner
        np.copyto(o2[rows, col:col + w], x.reshape(outer, w)[rows])
        col += w


def _check_expand(inputs, outputs, attrs):
    nm = "expand"
    x, o = unary_operands(nm, inputs, outputs)
    need(len(x.shape) <= len(o.shape), nm, f"input shape {tuple(x.shape)} has more dims than output {tuple(o.shape)}")
    try:
        ok = np.broadcast_shapes(tuple(x.shape), tuple(o.shape)) == tuple(o.shape)
    except ValueError:
        ok = False
    need(ok, nm, f"input shape {tuple(x.shape)} does not broadcast to output shape {tuple(o.shape)}")


@builtin("expand", unit="vector", check=_check_expand, work=vector_work(0), parallel_dim=out_numel)
def _expand_run(ctx, inputs, outputs, attrs):
    """out = x broadcast to the output's shape (numpy rules)"""
    x, out = inputs[0], outputs[0]
    for box in block_boxes(ctx, out.shape):
        np.copyto(out[box + (Ellipsis,)], part_for(x, box, out.ndim) if box else x)
