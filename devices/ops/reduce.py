"""Reductions (reduce_sum, reduce_mean, reduce_max, reduce_min over any axes, default all), argmax and cumsum
(default ``axis=-1``).  Blocks split the kept output elements; float16 sums and means accumulate in
float32."""
from __future__ import annotations

import numpy as np

from ..registry import builtin
from .blocks import block_boxes
from .checks import (FLOATS, ID_TYPES, NUMERIC, arity, axes_attr, bool_attr, dtype_in, ndim_in, need, norm_axis,
                     shape_is, unary_operands)
from .precision import F16, F32, quiet
from .work import input_vector_work


def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_reduce(name, kinds, nonempty=False):
    def check(inputs, outputs, attrs):
        x, o = unary_operands(name, inputs, outputs, kinds)
        axes = axes_attr(name, attrs, len(x.shape))
        kd = bool_attr(name, attrs, "keepdims")
        if nonempty:
            need(all(x.shape[a] > 0 for a in axes), name,
                 f"cannot reduce over an empty axis (input shape {tuple(x.shape)}, axes {axes})")
        shape_is(name, o, _reduced_shape(x.shape, axes, kd))
    return check


def _reduce_pd(inputs, outputs, attrs):
    return outputs[0].numel


def _reduce_kernel(name, fn, kinds, nonempty=False):
    """``fn(x, axis, out)`` reduces ``x`` over the tuple ``axis`` into ``out`` (already shaped)."""
    def run(ctx, inputs, outputs, attrs):
        x, out = inputs[0], outputs[0]
        axes = axes_attr(name, attrs, x.ndim)
        keep = tuple(i for i in range(x.ndim) if i not in axes)
        kept_shape = tuple(x.shape[i] for i in keep)
        xt = x.transpose(keep + axes)
        red = tuple(range(len(keep), x.ndim))
        ok = out.reshape(kept_shape, copy=False)
        for box in block_boxes(ctx, kept_shape):
            fn(xt[box + (Ellipsis,)], red, ok[box + (Ellipsis,)])
    run.__doc__ = f"{name} over attr axis (int, tuple or None = all; default None), attr keepdims"
    builtin(name, unit="vector", check=_check_reduce(name, kinds, nonempty), work=input_vector_work(1),
            parallel_dim=_reduce_pd)(quiet(run))


def _sum(x, axis, out):
    if out.dtype == F16:
        np.copyto(out, np.sum(x, axis=axis, dtype=F32), casting="same_kind")
    else:
        np.sum(x, axis=axis, out=out)


def _mean(x, axis, out):
    if out.dtype == F16:
        np.copyto(out, np.mean(x, axis=axis, dtype=F32), casting="same_kind")
    else:
        np.mean(x, axis=axis, out=out)


def _max(x, axis, out):
    np.max(x, axis=axis, out=out)


def _min(x, axis, out):
    np.min(x, axis=axis, out=out)


_reduce_kernel("reduce_sum", _sum, NUMERIC)
_reduce_kernel("reduce_mean", _mean, FLOATS)
_reduce_kernel("reduce_max", _max, NUMERIC, nonempty=True)
_reduce_kernel("reduce_min", _min, NUMERIC, nonempty=True)


def _check_argmax(inputs, outputs, attrs):
    nm = "argmax"
    arity(nm, inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    dtype_in(nm, x, NUMERIC, "input")
    ndim_in(nm, x, "input", 1)
    dtype_in(nm, o, ID_TYPES, "output")
    ax = norm_axis(nm, attrs.get("axis", -1), len(x.shape))
    need(x.shape[ax] > 0, nm, f"cannot take argmax over an empty axis (input shape {tuple(x.shape)})")
    shape_is(nm, o, _reduced_shape(x.shape, (ax,), bool_attr(nm, attrs, "keepdims")))


@builtin("argmax", unit="vector", check=_check_argmax, work=input_vector_work(1), parallel_dim=_reduce_pd)
def _argmax_run(ctx, inputs, outputs, attrs):
    """Index of the largest element along attr axis (default -1; first one on ties); out int32 or int64"""
    x, out = inputs[0], outputs[0]
    ax = int(attrs.get("axis", -1)) % x.ndim
    xt = np.moveaxis(x, ax, -1)
    ok = out.reshape(xt.shape[:-1], copy=False)
    for box in block_boxes(ctx, xt.shape[:-1]):
        bx = box + (Ellipsis,)
        if ok.dtype == np.intp:
            np.argmax(xt[bx], axis=-1, out=ok[bx])
        else:
            np.copyto(ok[bx], np.argmax(xt[bx], axis=-1), casting="unsafe")


def _check_cumsum(inputs, outputs, attrs):
    nm = "cumsum"
    x, o = unary_operands(nm, inputs, outputs, NUMERIC)
    norm_axis(nm, attrs.get("axis", -1), max(1, len(x.shape)))
    shape_is(nm, o, x.shape)


def _cumsum_pd(inputs, outputs, attrs):
    x = inputs[0]
    return max(1, x.numel // max(1, x.shape[int(attrs.get("axis", -1)) % max(1, len(x.shape))] if x.shape else 1))


@builtin("cumsum", unit="vector", check=_check_cumsum, work=input_vector_work(1), parallel_dim=_cumsum_pd)
@quiet
def _cumsum_run(ctx, inputs, outputs, attrs):
    """Running sum along attr axis (default -1); float16 accumulates in float32"""
    x, out = inputs[0], outputs[0]
    if x.ndim == 0:
        if ctx.block_idx == 0:
            out[...] = x
        return
    ax = int(attrs.get("axis", -1)) % x.ndim
    xt, ot = np.moveaxis(x, ax, -1), np.moveaxis(out, ax, -1)
    for box in block_boxes(ctx, xt.shape[:-1]):
        bx = box + (Ellipsis,)
        if out.dtype == F16:
            np.copyto(ot[bx], np.cumsum(xt[bx], axis=-1, dtype=F32), casting="same_kind")
        else:
            np.cumsum(xt[bx], axis=-1, out=ot[bx])
