"""Shape and layout ops: Shape, Size, Constant, ConstantOfShape, Range, Reshape, Flatten, Squeeze,
Unsqueeze, Transpose, Gather, Slice, Concat, Expand.

Reshape-like ops are views (no kernel).  A Slice that keeps a contiguous block (every axis before the
sliced one has size 1, unit step) is a view at an offset; other slices are ``strided_slice`` launches.
Shape/Size/Constant/Range exist only at compile time: a graph whose shape arithmetic depends on run-time
data is refused (every input shape is static per batch gear, so exporters' Shape -> Gather -> Concat ->
Reshape chains fold away).
"""
from __future__ import annotations

import numpy as np

from .base import broadcast, const, dtype_error, ints, norm_axis, numel, register, shape_error, unsupported
from ..program import View

INT64_MAX = (1 << 63) - 1


# ---------------------------------------------------------------------------------------------- compile-time only
def _shape_range(node, rank):
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    start = max(0, start + rank if start < 0 else start)
    end = rank if end is None else max(0, int(end) + rank if int(end) < 0 else int(end))
    return min(start, rank), min(end, rank)


def _shape_infer(node, ins):
    s, e = _shape_range(node, len(ins[0].shape))
    return [((max(0, e - s),), "int64")]


def _shape_fold(node, ins):
    s, e = _shape_range(node, len(ins[0].shape))
    return [np.array(ins[0].shape[s:e], np.int64)]


register("Shape", _shape_infer, _shape_fold, None, shape_only=True)
register("Size", lambda node, ins: [((), "int64")], lambda node, ins: [np.array(numel(ins[0].shape), np.int64)],
         None, shape_only=True)


def _constant_value(node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return np.asarray(a["value"])
    for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                    ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dt)
    raise unsupported(node, f"only value/value_float(s)/value_int(s) constants are supported, got {sorted(a)}")


def _constant_infer(node, ins):
    v = _constant_value(node)
    return [(tuple(v.shape), v.dtype.name)]


register("Constant", _constant_infer, lambda node, ins: [_constant_value(node)], None, shape_only=True)


def _cos_value(node) -> np.ndarray:
    v = node.attrs.get("value")
    return np.zeros((1,), np.float32) if v is None else np.asarray(v).reshape(-1)[:1]


def _cos_shape(node, ins):
    dims = [int(d) for d in const(node, ins[0], "input").reshape(-1)]
    if any(d < 0 for d in dims):
        raise shape_error(node, "input", dims, "dims must be >= 0")
    return tuple(dims)


def _cos_lower(ctx, node):
    ctx.emit("fill", [], [ctx.out(node)], {"value": _cos_value(node)[0].item()})


register("ConstantOfShape", lambda node, ins: [(_cos_shape(node, ins), _cos_value(node).dtype.name)],
         lambda node, ins: [np.full(_cos_shape(node, ins), _cos_value(node)[0], _cos_value(node).dtype)],
         _cos_lower)


def _range_fold(node, ins):
    s, l_, d = (const(node, v, w).reshape(-1)[0] for v, w in zip(ins, ("start", "limit", "delta")))
    return [np.arange(s, l_, d).astype(ins[0].dtype)]


register("Range", lambda node, ins: [(tuple(_range_fold(node, ins)[0].shape), ins[0].dtype)], _range_fold, None)


# ---------------------------------------------------------------------------------------------- views
def _reshape_target(node, ins):
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        dims = [int(d) for d in const(node, ins[1], "shape").reshape(-1)]
    else:
        dims = [int(d) for d in node.attrs.get("shape", [])]                  # opset 1-4
    allowzero = int(node.attrs.get("allowzero", 0))
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(x.shape):
                raise shape_error(node, "shape", dims, f"dim {i} copies an input dim that does not exist")
            d = x.shape[i]
        out.append(d)
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise shape_error(node, "shape", dims, "at most one -1 and no other negative dims")
    n = numel(x.shape)
    if -1 in out:
        rest = numel([d for d in out if d != -1])
        if rest == 0 or n % rest:
            raise shape_error(node, "shape", dims, f"cannot infer -1 for {n} elements")
        out[out.index(-1)] = n // rest
    if numel(out) != n:
        raise shape_error(node, "shape", dims, f"{tuple(x.shape)} has {n} elements, not {numel(out)}")
    return tuple(out)


def _view_lower(ctx, node):
    ctx.alias(node.outputs[0], ctx.ref(node.inputs[0]))


def _view_fold(node, ins, infer):
    return [ins[0].const.reshape(infer(node, ins)[0][0])]


def _reshape_infer(node, ins):
    return [(_reshape_target(node, ins), ins[0].dtype)]


register("Reshape", _reshape_infer, lambda node, ins: _view_fold(node, ins, _reshape_infer), _view_lower)


def _flatten_infer(node, ins):
    shape = ins[0].shape
    ax = int(node.attrs.get("axis", 1))
    ax = ax + len(shape) if ax < 0 else ax
    if not 0 <= ax <= len(shape):
        raise shape_error(node, "axis", (ax,), f"out of range for rank {len(shape)}")
    return [((numel(shape[:ax]), numel(shape[ax:])), ins[0].dtype)]


register("Flatten", _flatten_infer, lambda node, ins: _view_fold(node, ins, _flatten_infer), _view_lower)


def _unsqueeze_infer(node, ins):
    shape = list(ins[0].shape)
    axes = ints(node, ins, 1, "axes")
    if not axes:
        raise shape_error(node, "axes", (), "Unsqueeze needs axes")
    r = len(shape) + len(axes)
    norm = sorted(norm_axis(node, a, r, "axes") for a in axes)
    if len(set(norm)) != len(norm):
        raise shape_error(node, "axes", axes, "repeated axis")
    for a in norm:
        shape.insert(a, 1)
    return [(tuple(shape), ins[0].dtype)]


register("Unsqueeze", _unsqueeze_infer, lambda node, ins: _view_fold(node, ins, _unsqueeze_infer), _view_lower)


def _squeeze_infer(node, ins):
    shape = ins[0].shape
    axes = ints(node, ins, 1, "axes")
    if axes is None:
        keep = [d for d in shape if d != 1]
    else:
        norm = {norm_axis(node, a, len(shape), "axes") for a in axes}
        for a in norm:
            if shape[a] != 1:
                raise shape_error(node, "axes", shape, f"axis {a} has size {shape[a]}, not 1")
        keep = [d for i, d in enumerate(shape) if i not in norm]
    return [(tuple(keep), ins[0].dtype)]


register("Squeeze", _squeeze_infer, lambda node, ins: _view_fold(node, ins, _squeeze_infer), _view_lower)


# ---------------------------------------------------------------------------------------------- transpose
def _perm(node, rank):
    p = node.attrs.get("perm")
    p = list(range(rank))[::-1] if p is None else [int(i) for i in p]
    if sorted(p) != list(range(rank)):
        raise shape_error(node, "perm", p, f"not a permutation of {rank} axes")
    return p


def _transpose_infer(node, ins):
    p = _perm(node, len(ins[0].shape))
    return [(tuple(ins[0].shape[i] for i in p), ins[0].dtype)]


def _transpose_lower(ctx, node):
    x = ctx.val(node.inputs[0])
    p = _perm(node, len(x.shape))
    kept = [i for i in p if x.shape[i] != 1]
    if kept == sorted(kept):                                                  # only size-1 axes move: a view
        return ctx.alias(node.outputs[0], ctx.ref(x.name))
    ctx.emit("transpose", [ctx.ref(x.name)], [ctx.out(node)], {"perm": tuple(p)})


register("Transpose", _transpose_infer,
         lambda node, ins: [np.asarray(np.transpose(ins[0].const, _perm(node, ins[0].const.ndim)), order="C")],
         _transpose_lower)


# ---------------------------------------------------------------------------------------------- gather
def _gather_infer(node, ins):
    x, idx = ins[0], ins[1]
    if idx.dtype not in ("int32", "int64"):
        raise dtype_error(node, "indices", idx.dtype, ["int32", "int64"])
    ax = norm_axis(node, int(node.attrs.get("axis", 0)), len(x.shape))
    return [(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]), x.dtype)]


def _gather_fold(node, ins):
    x, idx = ins[0].const, ins[1].const
    ax = norm_axis(node, int(node.attrs.get("axis", 0)), x.ndim)
    n = x.shape[ax]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise shape_error(node, "indices", idx.shape, f"an index is outside [-{n}, {n})")
    return [np.take(x, idx, axis=ax)]


def _gather_lower(ctx, node):
    ctx.emit("gather", [ctx.ref(node.inputs[0]), ctx.ref(node.inputs[1])], [ctx.out(node)],
             {"axis": norm_axis(node, int(node.attrs.get("axis", 0)), len(ctx.val(node.inputs[0]).shape))})


register("Gather", _gather_infer, _gather_fold, _gather_lower)


# ---------------------------------------------------------------------------------------------- slice
def _slice_triples(node, ins):
    x = ins[0]
    rank = len(x.shape)
    if len(ins) > 1:
        starts = ints(node, ins, 1, "starts")
        ends = ints(node, ins, 2, "ends")
        axes = ints(node, ins, 3, "axes")
        steps = ints(node, ins, 4, "steps")
    else:                                                                     # opset < 10
        starts, ends = [int(v) for v in node.attrs["starts"]], [int(v) for v in node.attrs["ends"]]
        axes, steps = node.attrs.get("axes"), None
    axes = list(range(len(starts))) if axes is None else [norm_axis(node, int(a), rank, "axes") for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes):
        raise shape_error(node, "starts", starts, "starts/ends/axes/steps lengths differ or an axis repeats")
    triples = [(0, d, 1) for d in x.shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise shape_error(node, "steps", steps, "a step is 0")
        triples[a] = slice(max(min(s, INT64_MAX), -INT64_MAX), max(min(e, INT64_MAX), -INT64_MAX - 1),
                           st).indices(x.shape[a])
    return triples


def _np_slices(triples):
    out = []
    for b, e, s in triples:
        out.append(slice(0, 0) if not len(range(b, e, s)) else slice(b, None if (s < 0 and e < 0) else e, s))
    return tuple(out)


def _slice_infer(node, ins):
    return [(tuple(len(range(*t)) for t in _slice_triples(node, ins)), ins[0].dtype)]


def _slice_lower(ctx, node):
    ins = [ctx.val(n) if n else None for n in node.inputs]
    x = ins[0]
    t = _slice_triples(node, ins)
    src = ctx.ref(x.name)
    changed = [i for i, (tr, d) in enumerate(zip(t, x.shape)) if tr != (0, d, 1)]
    if not changed:
        return ctx.alias(node.outputs[0], src)
    k = changed[0]
    if len(changed) == 1 and t[k][2] == 1 and numel(x.shape[:k]) == 1:     # a contiguous block: a view
        inner = numel(x.shape[k + 1:]) * np.dtype(x.dtype).itemsize
        out_shape = ctx.val(node.outputs[0]).shape
        ctx.refs[node.outputs[0]] = View(src.buf, src.offset + t[k][0] * inner, tuple(out_shape), x.dtype)
        return None
    ctx.emit("strided_slice", [src], [ctx.out(node)],
             {"begin": tuple(b for b, _, _ in t), "end": tuple(e for _, e, _ in t), "strides": tuple(s for _, _, s in t)})


register("Slice", _slice_infer, lambda node, ins: [np.asarray(ins[0].const[_np_slices(_slice_triples(node, ins))], order="C")],
         _slice_lower)


# ---------------------------------------------------------------------------------------------- concat, expand
def _concat_infer(node, ins):
    parts = [v for v in ins if v is not None]
    rank = len(parts[0].shape)
    ax = norm_axis(node, int(node.attrs.get("axis", 0)), rank)
    total = 0
    for v in parts:
        if v.dtype != parts[0].dtype:
            raise dtype_error(node, v.name, v.dtype, [parts[0].dtype])
        if len(v.shape) != rank or any(a != b for i, (a, b) in enumerate(zip(v.shape, parts[0].shape)) if i != ax):
            raise shape_error(node, v.name, v.shape, f"differs from {tuple(parts[0].shape)} off axis {ax}")
        total += v.shape[ax]
    shape = list(parts[0].shape)
    shape[ax] = total
    return [(tuple(shape), parts[0].dtype)]


def _concat_lower(ctx, node):
    parts = [n for n in node.inputs if n and numel(ctx.val(n).shape) > 0]
    out = ctx.val(node.outputs[0])
    if len(parts) == 1:
        return ctx.alias(node.outputs[0], ctx.ref(parts[0]))
    ctx.emit("concat", [ctx.ref(n) for n in parts], [ctx.out(node)],
             {"axis": norm_axis(node, int(node.attrs.get("axis", 0)), len(out.shape))})


register("Concat", _concat_infer,
         lambda node, ins: [np.concatenate([v.const for v in ins if v is not None],
                                           axis=int(node.attrs.get("axis", 0)))],
         _concat_lower)


def _expand_infer(node, ins):
    dims = [int(d) for d in const(node, ins[1], "shape").reshape(-1)]
    return [(broadcast(node, ins[0].shape, dims), ins[0].dtype)]


def _expand_lower(ctx, node):
    x = ctx.val(node.inputs[0])
    out = ctx.val(node.outputs[0])
    if tuple(out.shape) == tuple(x.shape):
        return ctx.alias(out.name, ctx.ref(x.name))
    ctx.emit("expand", [ctx.ref(x.name)], [ctx.out(node)])


register("Expand", _expand_infer,
         lambda node, ins: [np.asarray(np.broadcast_to(ins[0].const, _expand_infer(node, ins)[0][0]), order="C")],
         _expand_lower)
