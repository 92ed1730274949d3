"""Cube kernels on matrices: matmul (optional bias), batch_matmul, and fused_matmul (matmul + bias +
activation in one kernel, what the compiler's MatMul+Add(+act) fusion emits).

Blocks split the rows M, or the columns N when N > M (decode: M is 1); batch_matmul splits the flattened
batch.  Float16 accumulates in float32 like the Cube.
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..registry import builtin
from .activations import ACT_FLOPS, ACTIVATIONS, apply_activation
from .blocks import numel
from .checks import FLOATS, arity, bool_attr, choice_attr, dtype_in, ndim_in, need, same_dtype, shape_is
from .precision import F16, F32, quiet
from .work import cube_work


def _mm(a, b, bias, out) -> None:
    """out = a @ b (+ bias); float16 accumulates in float32 like the Cube."""
    if out.size == 0:
        return
    if out.dtype == F16:
        r = np.matmul(a.astype(F32), b.astype(F32))
        if bias is not None:
            r += bias
        np.copyto(out, r, casting="same_kind")
    else:
        np.matmul(a, b, out=out)
        if bias is not None:
            np.add(out, bias, out=out)


#: rows of a fused_matmul output computed (GEMM, bias, activation) per chunk: the activation's many
#: elementwise passes then run on data still in cache instead of streaming the whole output each time
_EPILOGUE_BYTES = 256 << 10


def _mm_act(a, bt, bias, out, act) -> None:
    """out = act(a @ bt (+ bias)), the activation applied chunk by chunk of rows right after each GEMM."""
    if act == "none":
        _mm(a, bt, bias, out)
        return
    rows = max(1, _EPILOGUE_BYTES // max(1, out.shape[1] * out.itemsize))
    for r in range(0, out.shape[0], rows):
        s = slice(r, r + rows)
        _mm(a[s], bt, bias, out[s])
        apply_activation(out[s], act)


def _check_matmul(inputs, outputs, attrs, n="matmul"):
    arity(n, inputs, outputs, (2, 3))
    a, b, o = inputs[0], inputs[1], outputs[0]
    tb = bool_attr(n, attrs, "transpose_b")
    dtype_in(n, a, FLOATS, "a")
    same_dtype(n, ("a", a), ("b", b), ("output", o))
    ndim_in(n, a, "a", 2, 2)
    ndim_in(n, b, "b", 2, 2)
    m, k = a.shape
    kb, nn = (b.shape[1], b.shape[0]) if tb else b.shape
    need(k == kb, n, f"inner dims differ: a {tuple(a.shape)}, b {tuple(b.shape)} (transpose_b={tb})")
    if len(inputs) == 3:
        same_dtype(n, ("a", a), ("bias", inputs[2]))
        shape_is(n, inputs[2], (nn,), "bias")
    shape_is(n, o, (m, nn))


def _mm_split_n(m, n) -> bool:
    return n > m


def _matmul_pd(inputs, outputs, attrs):
    m, n = outputs[0].shape
    return n if _mm_split_n(m, n) else m


def _matmul_work(inputs, outputs, attrs):
    m, k = inputs[0].shape
    return cube_work(inputs, outputs, 2.0 * m * outputs[0].shape[1] * k)


@builtin("matmul", unit="cube", check=_check_matmul, work=_matmul_work, parallel_dim=_matmul_pd)
@quiet
def _matmul_run(ctx, inputs, outputs, attrs):
    """out[M,N] = a[M,K] @ b[K,N] (b[N,K] with transpose_b) (+ bias[N])"""
    _matmul_block(ctx, inputs, outputs[0], attrs, "none")


def _matmul_block(ctx, inputs, out, attrs, act) -> None:
    """This block's rows (or columns, when N > M) of ``out`` = act(a @ b (+ bias))."""
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    bt = b.T if attrs.get("transpose_b", False) else b
    if ctx.block_dim == 1:
        _mm_act(a, bt, bias, out, act)
        return
    m, n = out.shape
    if _mm_split_n(m, n):
        r = ctx.split(n)
        if r:
            s = slice(r.start, r.stop)
            _mm_act(a, bt[:, s], None if bias is None else bias[s], out[:, s], act)
    else:
        r = ctx.split(m)
        if r:
            s = slice(r.start, r.stop)
            _mm_act(a[s], bt, bias, out[s], act)


def _bmm_dims(a_shape, b_shape, ta, tb):
    m, k = (a_shape[-1], a_shape[-2]) if ta else (a_shape[-2], a_shape[-1])
    kb, n = (b_shape[-1], b_shape[-2]) if tb else (b_shape[-2], b_shape[-1])
    return m, k, kb, n


def _check_bmm(inputs, outputs, attrs):
    nm = "batch_matmul"
    arity(nm, inputs, outputs, 2)
    a, b, o = inputs[0], inputs[1], outputs[0]
    ta = bool_attr(nm, attrs, "transpose_a")
    tb = bool_attr(nm, attrs, "transpose_b")
    dtype_in(nm, a, FLOATS, "a")
    same_dtype(nm, ("a", a), ("b", b), ("output", o))
    ndim_in(nm, a, "a", 2)
    ndim_in(nm, b, "b", 2)
    need(len(b.shape) == 2 or tuple(b.shape[:-2]) == tuple(a.shape[:-2]), nm,
         f"b must be 2-D or have a's batch dims {tuple(a.shape[:-2])}, got shape {tuple(b.shape)}")
    m, k, kb, n = _bmm_dims(a.shape, b.shape, ta, tb)
    need(k == kb, nm, f"inner dims differ: a {tuple(a.shape)}, b {tuple(b.shape)} "
                      f"(transpose_a={ta}, transpose_b={tb})")
    shape_is(nm, o, tuple(a.shape[:-2]) + (m, n))


def _bmm_pd(inputs, outputs, attrs):
    return numel(outputs[0].shape[:-2])


def _bmm_work(inputs, outputs, attrs):
    m, k, _, n = _bmm_dims(inputs[0].shape, inputs[1].shape, attrs.get("transpose_a", False),
                           attrs.get("transpose_b", False))
    return cube_work(inputs, outputs, 2.0 * numel(inputs[0].shape[:-2]) * m * n * k)


@builtin("batch_matmul", unit="cube", check=_check_bmm, work=_bmm_work, parallel_dim=_bmm_pd)
@quiet
def _bmm_run(ctx, inputs, outputs, attrs):
    """out[..., M, N] = a[..., M, K] @ b[..., K, N] (b may be 2-D); attrs transpose_a, transpose_b"""
    a, b = inputs
    out = outputs[0]
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    a3 = a.reshape((-1,) + a.shape[-2:])
    b3 = b if b.ndim == 2 else b.reshape((-1,) + b.shape[-2:])
    o3 = out.reshape((-1,) + out.shape[-2:], copy=False)
    if ta:
        a3 = a3.swapaxes(-1, -2)
    if tb:
        b3 = b3.swapaxes(-1, -2)
    if ctx.block_dim == 1:
        _mm(a3, b3, None, o3)
        return
    r = ctx.split(o3.shape[0])
    if r:
        s = slice(r.start, r.stop)
        _mm(a3[s], b3 if b3.ndim == 2 else b3[s], None, o3[s])


def _check_fused_matmul(inputs, outputs, attrs):
    _check_matmul(inputs, outputs, attrs, "fused_matmul")
    choice_attr("fused_matmul", attrs, "act", "none", tuple(ACTIVATIONS))


def _fused_matmul_work(inputs, outputs, attrs):
    w = _matmul_work(inputs, outputs, attrs)
    return Work(flops=w.flops + ACT_FLOPS[attrs.get("act", "none")] * outputs[0].numel, bytes=w.bytes,
                unit="cube", fp16=w.fp16)


@builtin("fused_matmul", unit="cube", check=_check_fused_matmul, work=_fused_matmul_work, parallel_dim=_matmul_pd)
@quiet
def _fused_matmul_run(ctx, inputs, outputs, attrs):
    """out[M,N] = act(a[M,K] @ b[K,N] (b[N,K] with transpose_b) (+ bias[N])); attr act: none, relu, gelu
    (erf), gelu_tanh, tanh, sigmoid.  The activation is applied chunk by chunk of output rows, right
    after each chunk's GEMM (a fused epilogue)."""
    _matmul_block(ctx, inputs, outputs[0], attrs, attrs.get("act", "none"))
