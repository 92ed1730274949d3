"""Row-wise kernels: softmax (along any axis), layernorm and rmsnorm (over the last axis).

Blocks split the rows (softmax: all axes but ``axis`` flattened; the norms: rows of ``[..., D]``).
Float16 is computed in float32; a softmax row that is all ``-inf`` (fully masked) gives zeros, not NaN.
The output may alias the input.
"""
from __future__ import annotations

import numpy as np

from ..registry import builtin
from .blocks import as_rows, block_boxes, numel, pad_boxes
from .checks import FLOATS, arity, dtype_in, ndim_in, need, norm_axis, num_attr, same_dtype, shape_is
from .precision import compute_dtype, quiet
from .work import input_vector_work, vector_work


def softmax(x, out, axis) -> None:
    """Softmax of ``x`` along ``axis`` into ``out`` (may be ``x``); all-``-inf`` rows give zeros."""
    if x.size == 0:
        return
    ct = compute_dtype(out.dtype)
    m = np.max(x, axis=axis, keepdims=True)
    if m.dtype != ct:
        m = m.astype(ct)
    m[m == -np.inf] = 0
    buf = out if out.dtype == ct else np.empty(x.shape, ct)
    np.subtract(x, m, out=buf)
    np.exp(buf, out=buf)
    s = np.sum(buf, axis=axis, keepdims=True)
    s[s == 0] = 1
    np.divide(buf, s, out=out)


def _softmax_layout(shape, axis):
    """(outer, n, inner) of ``shape`` around ``axis``."""
    return numel(shape[:axis]), shape[axis], numel(shape[axis + 1:])


def _check_softmax(inputs, outputs, attrs):
    arity("softmax", inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    dtype_in("softmax", x, FLOATS, "input")
    ndim_in("softmax", x, "input", 1)
    same_dtype("softmax", ("input", x), ("output", o))
    shape_is("softmax", o, x.shape)
    norm_axis("softmax", attrs.get("axis", -1), len(x.shape))


def _softmax_pd(inputs, outputs, attrs):
    shape = tuple(inputs[0].shape)
    outer, _, inner = _softmax_layout(shape, int(attrs.get("axis", -1)) % len(shape))
    return outer * inner


@builtin("softmax", unit="vector", check=_check_softmax, work=vector_work(5), parallel_dim=_softmax_pd)
@quiet
def _softmax_run(ctx, inputs, outputs, attrs):
    """softmax along attr axis (default -1), computed in float32 for float16"""
    x, out = inputs[0], outputs[0]
    axis = int(attrs.get("axis", -1)) % x.ndim
    if ctx.block_dim == 1:
        softmax(x, out, axis)
        return
    outer, n, inner = _softmax_layout(x.shape, axis)
    if inner == 1:
        r = ctx.split(outer)
        if r:
            softmax(as_rows(x, n)[r.start:r.stop], as_rows(out, n, True)[r.start:r.stop], 1)
        return
    x3 = x.reshape(outer, n, inner)
    o3 = out.reshape((outer, n, inner), copy=False)
    for ob, ib in pad_boxes(block_boxes(ctx, (outer, inner)), 2):
        softmax(x3[ob, :, ib], o3[ob, :, ib], 1)



def _check_norm(name, n_params):
    def check(inputs, outputs, attrs):
        arity(name, inputs, outputs, 1 + n_params)
        x, o = inputs[0], outputs[0]
        dtype_in(name, x, FLOATS, "input")
        ndim_in(name, x, "input", 1)
        d = x.shape[-1]
        for i, p in enumerate(inputs[1:]):
            what = ("gamma", "beta")[i]
            shape_is(name, p, (d,), what)
            need(p.dtype in (x.dtype, "float32"), name,
                 f"{what} dtype {p.dtype} must be the input's ({x.dtype}) or float32")
        same_dtype(name, ("input", x), ("output", o))
        shape_is(name, o, x.shape)
        eps = num_attr(name, attrs, "eps", 1e-5 if n_params == 2 else 1e-6)
        need(eps >= 0, name, f"attr 'eps' must be >= 0, got {eps!r}")
    return check


def _rows_pd(inputs, outputs, attrs):
    shape = inputs[0].shape
    return numel(shape[:-1])


def _row_block(ctx, x, out):
    """This block's rows of ``x``/``out`` as ``[r, D]`` views, or None when it has none."""
    d = x.shape[-1]
    x2, o2 = as_rows(x, d), as_rows(out, d, True)
    if ctx.block_dim == 1:
        return x2, o2
    r = ctx.split(x2.shape[0])
    return (x2[r.start:r.stop], o2[r.start:r.stop]) if r else None


@builtin("layernorm", unit="vector", check=_check_norm("layernorm", 2), work=input_vector_work(8),
         parallel_dim=_rows_pd)
@quiet
def _layernorm_run(ctx, inputs, outputs, attrs):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (float32 math for float16)"""
    x, gamma, beta = inputs
    eps = float(attrs.get("eps", 1e-5))
    rows = _row_block(ctx, x, outputs[0])
    if rows is None or rows[0].size == 0:
        return
    x2, o2 = rows
    xc = x2.astype(compute_dtype(x2.dtype))          # a fresh buffer: centered in place below
    xc -= xc.mean(axis=1, keepdims=True)
    var = np.einsum("ij,ij->i", xc, xc)[:, None]
    var /= x2.shape[1]
    var += eps
    np.sqrt(var, out=var)
    xc /= var
    xc *= gamma
    np.add(xc, beta, out=o2)


@builtin("rmsnorm", unit="vector", check=_check_norm("rmsnorm", 1), work=input_vector_work(4),
         parallel_dim=_rows_pd)
@quiet
def _rmsnorm_run(ctx, inputs, outputs, attrs):
    """x / sqrt(mean(x**2) + eps) * gamma over the last axis (float32 math for float16)"""
    x, gamma = inputs
    eps = float(attrs.get("eps", 1e-6))
    rows = _row_block(ctx, x, outputs[0])
    if rows is None or rows[0].size == 0:
        return
    x2, o2 = rows
    ct = compute_dtype(x2.dtype)
    xf = x2 if x2.dtype == ct else x2.astype(ct)
    ms = np.vecdot(xf, xf)[:, None]
    ms /= x2.shape[1]
    ms += eps
    np.sqrt(ms, out=ms)
    if o2.dtype == ct:
        np.divide(xf, ms, out=o2)                      # every row read (for ms) before it is written
        np.multiply(o2, gamma, out=o2)
    else:
        xf /= ms
        np.multiply(xf, gamma, out=o2)
