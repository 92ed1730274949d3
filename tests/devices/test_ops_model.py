"""Unit tests of the kernels that compiled offline models lower to (devices/ops/: elementwise, layout,
matmul, cnn): erf, sigmoid, clip, pow, equal, where, gather, strided_slice, concat, expand, fused_matmul,
conv2d, max/avg pool, batch_norm.

Same harness as tests/devices/test_ops.py (every block of several block_dims runs on pattern-filled outputs; no
element is written twice or never).  References are float64 numpy written independently of devices/ops: the
convolution and the pools walk every output position with explicit window bounds.  Tolerances follow
the computation: a reduction of length K in float32 drifts by about K * eps32 of its magnitude; float16
results are rounded once from float32.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from devices.errors import ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_PARAM_INVALID, AclError, KernelError
from devices.kernel import lookup
from test_ops import check_fails, close, launch, randn, rng, run1

BLOCK_DIMS = [1, 3, 7]
EPS32 = float(np.finfo(np.float32).eps)


def acc_tol(dtype, k: int, scale: float = 1.0) -> dict:
    """Tolerance of a K-long float32 accumulation of O(scale) products (float16: one final rounding)."""
    if np.dtype(dtype) == np.float16:
        return dict(rtol=2e-3, atol=2e-3 * math.sqrt(k) * scale)
    return dict(rtol=1e-5, atol=4 * EPS32 * k * scale)


def erf64(x):
    return np.vectorize(math.erf)(np.asarray(x, np.float64))


# ----------------------------------------------------------------------------------------- registry

NEW = {"erf": "vector", "sigmoid": "vector", "clip": "vector", "pow": "vector", "equal": "vector",
       "where": "vector", "gather": "vector", "strided_slice": "vector", "concat": "vector", "expand": "vector",
       "fused_matmul": "cube", "conv2d": "cube", "max_pool2d": "vector", "avg_pool2d": "vector",
       "batch_norm": "vector"}


def test_new_kernels_registered():
    for name, unit in NEW.items():
        k = lookup(name)
        assert k.check and k.work and k.parallel_dim and not k.user and k.unit == unit, name
        assert k.doc, f"{name} has no docstring"


# ----------------------------------------------------------------------------------------- unary

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_erf(bd, dtype):
    x = np.concatenate([np.linspace(-6, 6, 301), [0.0, 1e-6, -1e-6, 0.4999, 0.5, -0.5, 1e-30, 40, -40]])
    x = x.astype(dtype)
    want = erf64(x.astype(np.float64))
    got = run1("erf", [x], x.shape, dtype, block_dim=bd).astype(np.float64)
    if dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=4e-7, atol=2e-8)    # relative accuracy near 0, too
    else:
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_sigmoid_values_and_tails(bd):
    x = np.concatenate([randn((50,), seed=3, scale=4.0), np.array([-1e4, -100, -88.7, 0, 88.7, 1e4], np.float32)])
    got = run1("sigmoid", [x], x.shape, np.float32, block_dim=bd)
    assert np.isfinite(got).all()
    x64 = x.astype(np.float64)
    want = np.where(x64 >= 0, 1 / (1 + np.exp(-np.abs(x64))), np.exp(-np.abs(x64)) / (1 + np.exp(-np.abs(x64))))
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-45)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("lo,hi", [(-0.5, 0.75), (None, 0.2), (-0.1, None), (None, None)])
def test_clip(bd, lo, hi):
    x = randn((4, 9), seed=2)
    want = x.astype(np.float64)
    if lo is not None:
        want = np.maximum(want, lo)
    if hi is not None:
        want = np.minimum(want, hi)
    close(run1("clip", [x], x.shape, np.float32, {"min": lo, "max": hi}, bd), want)


def test_clip_int_and_bad_bounds():
    x = rng(1).integers(-20, 20, (3, 5)).astype(np.int32)
    np.testing.assert_array_equal(run1("clip", [x], x.shape, np.int32, {"min": -3, "max": 4}), np.clip(x, -3, 4))
    check_fails("clip", [((3,), "float32")], [((3,), "float32")], {"min": 1.0, "max": 0.0}, match="greater")
    check_fails("clip", [((3,), "int32")], [((3,), "int32")], {"min": 0.5}, match="not an integer")


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pow_broadcast(bd, dtype):
    a = (np.abs(randn((3, 1, 5), np.float64, 1)) + 0.5).astype(dtype)
    b = randn((4, 5), dtype, 2, 1.5)
    want = np.power(a.astype(np.float64), b.astype(np.float64))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose(run1("pow", [a, b], want.shape, dtype, block_dim=bd).astype(np.float64), want, **tol)


# ----------------------------------------------------------------------------------------- equal / where

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.bool_])
def test_equal(bd, dtype):
    a = rng(1).integers(0, 3, (4, 1, 6)).astype(dtype)
    b = rng(2).integers(0, 3, (5, 6)).astype(dtype)
    got = run1("equal", [a, b], (4, 5, 6), np.bool_, block_dim=bd)
    np.testing.assert_array_equal(got, a == b)


def test_equal_refuses_non_bool_output_and_mixed_dtypes():
    check_fails("equal", [((3,), "int64"), ((3,), "int64")], [((3,), "int64")], match="output dtype")
    check_fails("equal", [((3,), "int64"), ((3,), "int32")], [((3,), "bool")], match="differs")
    check_fails("equal", [((3,), "int64"), ((4,), "int64")], [((3,), "bool")], match="broadcast")


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_where(bd):
    c = rng(3).integers(0, 2, (2, 1, 5)).astype(bool)
    x, y = randn((3, 5), seed=1), randn((2, 3, 1), seed=2)
    got = run1("where", [c, x, y], (2, 3, 5), np.float32, block_dim=bd)
    np.testing.assert_array_equal(got, np.where(c, x, y))
    check_fails("where", [((5,), "float32"), ((5,), "float32"), ((5,), "float32")], [((5,), "float32")],
                match="condition dtype")


# ----------------------------------------------------------------------------------------- gather / slice / concat / expand

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_shape", [(4,), (2, 3), ()])
def test_gather(bd, axis, idx_shape):
    x = randn((5, 6, 7), seed=1)
    n = x.shape[axis]
    idx = rng(4).integers(-n, n, idx_shape).astype(np.int64)
    want = np.take(x, idx, axis=axis)
    np.testing.assert_array_equal(run1("gather", [x, idx], want.shape, np.float32, {"axis": axis}, bd), want)


@pytest.mark.parametrize("bd", [1, 3])
def test_gather_out_of_range_traps(bd):
    x = randn((5, 4), seed=1)
    for bad in (5, -6):
        idx = np.array([0, bad, 1], np.int32)
        with pytest.raises(KernelError, match="outside") as ei:
            launch("gather", [x, idx], [((3, 4), np.float32)], {"axis": 0}, bd)
        assert ei.value.code == ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW


SLICES = [
    ((6, 7), [(1, 5, 1), (0, 7, 2)]),
    ((6, 7), [(5, -1, -1), (6, 0, -2)]),          # reversed, through index 0 / down to index 1
    ((6, 7), [(3, 3, 1), (0, 7, 1)]),             # empty
    ((4, 5, 3), [(0, 4, 3), (4, 1, -1), (2, 3, 1)]),
]


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape,triples", SLICES)
def test_strided_slice(bd, shape, triples):
    x = randn(shape, seed=5)
    ref_slices = tuple(slice(b, None if (s < 0 and e < 0) else e, s) for b, e, s in triples)
    want = x[ref_slices]
    assert want.shape == tuple(len(range(b, e, s)) for b, e, s in triples)
    attrs = {"begin": [t[0] for t in triples], "end": [t[1] for t in triples], "strides": [t[2] for t in triples]}
    np.testing.assert_array_equal(run1("strided_slice", [x], want.shape, np.float32, attrs, bd), want)


def test_strided_slice_refuses_bad_attrs():
    ins, outs = [((6,), "float32")], [((2,), "float32")]
    check_fails("strided_slice", ins, outs, {"begin": [0], "end": [2], "strides": [0]}, match="stride")
    check_fails("strided_slice", ins, outs, {"begin": [0], "end": [9], "strides": [1]}, match="normalized")
    check_fails("strided_slice", ins, outs, {"begin": [0, 0], "end": [2, 2], "strides": [1, 1]}, match="one per")
    check_fails("strided_slice", ins, outs, {"begin": [0], "end": [4], "strides": [1]}, match="must be")


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat(bd, axis):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    parts = []
    for i, s in enumerate(shapes):
        s = list(s)
        s[axis] = i + 1
        parts.append(randn(tuple(s), seed=i))
    want = np.concatenate(parts, axis=axis)
    np.testing.assert_array_equal(run1("concat", parts, want.shape, np.float32, {"axis": axis}, bd), want)


def test_concat_refuses_mismatch():
    check_fails("concat", [((2, 3), "float32"), ((3, 3), "float32")], [((5, 3), "float32")], {"axis": 1},
                match="off axis")
    check_fails("concat", [((2, 3), "float32"), ((2, 3), "int32")], [((4, 3), "float32")], {"axis": 0},
                match="differs")


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("src,dst", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 2)), ((2, 1, 3), (2, 4, 3))])
def test_expand(bd, src, dst):
    x = randn(src, seed=7)
    np.testing.assert_array_equal(run1("expand", [x], dst, np.float32, block_dim=bd), np.broadcast_to(x, dst))


def test_expand_refuses_non_broadcast():
    check_fails("expand", [((3,), "float32")], [((4,), "float32")], match="does not broadcast")
    check_fails("expand", [((2, 3), "float32")], [((3,), "float32")], match="more dims")


# ----------------------------------------------------------------------------------------- fused_matmul

def act64(name, y):
    return {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0),
            "gelu": lambda v: 0.5 * v * (1 + erf64(v / math.sqrt(2))),
            "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
            "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v))}[name](y)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"])
@pytest.mark.parametrize("m,k,n", [(9, 16, 5), (2, 7, 13)])
def test_fused_matmul(bd, act, m, k, n):
    a, b, bias = randn((m, k), seed=1), randn((n, k), seed=2), randn((n,), seed=3)
    want = act64(act, a.astype(np.float64) @ b.astype(np.float64).T + bias)
    got = run1("fused_matmul", [a, b, bias], (m, n), np.float32, {"transpose_b": True, "act": act}, bd)
    np.testing.assert_allclose(got, want, **acc_tol(np.float32, k, 3.0))


@pytest.mark.parametrize("bd", [1, 2])
def test_fused_matmul_epilogue_in_row_chunks(bd):
    """An output wide enough that the activation runs chunk by chunk of rows (256 KiB of output each)."""
    a, b, bias = randn((150, 8), seed=4), randn((8, 1024), seed=5), randn((1024,), seed=6)
    want = act64("gelu", a.astype(np.float64) @ b.astype(np.float64) + bias)
    got = run1("fused_matmul", [a, b, bias], (150, 1024), np.float32, {"act": "gelu"}, bd)
    np.testing.assert_allclose(got, want, **acc_tol(np.float32, 8, 3.0))


def test_fused_matmul_float16_and_bad_act():
    a, b = randn((6, 8), np.float16, 1), randn((8, 4), np.float16, 2)
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    got = run1("fused_matmul", [a, b], (6, 4), np.float16, {"act": "relu"}, 3)
    np.testing.assert_allclose(got.astype(np.float64), want, **acc_tol(np.float16, 8, 3.0))
    check_fails("fused_matmul", [((2, 3), "float32"), ((3, 4), "float32")], [((2, 4), "float32")],
                {"act": "swish"}, match="act")
    check_fails("fused_matmul", [((2, 3), "float32"), ((5, 4), "float32")], [((2, 4), "float32")], match="inner")


# ----------------------------------------------------------------------------------------- conv2d

def conv_ref(x, w, bias, strides, pads, dil, groups):
    """Direct float64 convolution: every output position sums its window explicitly."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    sh, sw = strides
    pt, pl, pb, pr = pads
    dh, dw = dil
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    out = np.zeros((n, m, ho, wo))
    mg = m // groups
    for oc in range(m):
        g = oc // mg
        xs = xp[:, g * cg:(g + 1) * cg]
        for i, j in itertools.product(range(ho), range(wo)):
            win = xs[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh, j * sw:j * sw + dw * (kw - 1) + 1:dw]
            out[:, oc, i, j] = (win * w[oc]).sum(axis=(1, 2, 3))
    if bias is not None:
        out += bias.astype(np.float64)[None, :, None, None]
    return out


CONVS = [  # (x shape, weight shape, strides, pads, dilations, groups)
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), (2, 1), (0, 1, 2, 0), (1, 2), 2),
    ((2, 4, 6, 6), (4, 1, 3, 3), (1, 2), (1, 1, 1, 1), (2, 1), 4),      # depthwise
    ((1, 2, 5, 5), (3, 2, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),      # 1x1
]


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("xs,ws,strides,pads,dil,groups", CONVS)
def test_conv2d(bd, xs, ws, strides, pads, dil, groups):
    x, w, bias = randn(xs, seed=1), randn(ws, seed=2), randn((ws[0],), seed=3)
    want = conv_ref(x, w, bias, strides, pads, dil, groups)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "groups": groups}
    k = ws[1] * ws[2] * ws[3]
    got = run1("conv2d", [x, w, bias], want.shape, np.float32, attrs, bd)
    np.testing.assert_allclose(got, want, **acc_tol(np.float32, k, 3.0))
    got = run1("conv2d", [x, w], want.shape, np.float32, dict(attrs, act="relu"), bd)
    np.testing.assert_allclose(got, np.maximum(want - bias[None, :, None, None], 0), **acc_tol(np.float32, k, 3.0))


def test_conv2d_float16():
    x, w = randn((1, 4, 6, 5), np.float16, 1), randn((2, 4, 3, 3), np.float16, 2)
    want = conv_ref(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    got = run1("conv2d", [x, w], want.shape, np.float16, {"pads": (1, 1, 1, 1)}, 3)
    np.testing.assert_allclose(got.astype(np.float64), want, **acc_tol(np.float16, 36, 3.0))


def test_conv2d_refuses_bad_shapes():
    f = "float32"
    check_fails("conv2d", [((1, 4, 5, 5), f), ((2, 3, 3, 3), f)], [((1, 2, 3, 3), f)], match="input channels")
    check_fails("conv2d", [((1, 4, 5, 5), f), ((3, 2, 3, 3), f)], [((1, 3, 3, 3), f)], {"groups": 2},
                match="groups 2 must divide")
    check_fails("conv2d", [((1, 1, 2, 2), f), ((1, 1, 3, 3), f)], [((1, 1, 1, 1), f)], match="does not fit")
    check_fails("conv2d", [((1, 1, 4, 4), f), ((1, 1, 3, 3), f)], [((1, 1, 4, 4), f)], match="output shape")
    check_fails("conv2d", [((1, 1, 4, 4), f), ((1, 1, 3, 3), f)], [((1, 1, 2, 2), f)], {"strides": (0, 1)},
                match="strides")
    check_fails("conv2d", [((1, 1, 4, 4), "int32"), ((1, 1, 3, 3), "int32")], [((1, 1, 2, 2), "int32")],
                match="dtype")


# ----------------------------------------------------------------------------------------- pools

def pool_ref(x, kind, k, strides, pads, dil, ceil, include_pad):
    """ONNX pooling by its definition: window starts at o*s - pad; a position counts for the average
    when it lies in the input (or, with count_include_pad, in the explicitly padded input)."""
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = k, strides, pads, dil

    def osize(size, kk, s, lo, hi, d):
        span = d * (kk - 1) + 1
        room = size + lo + hi - span
        o = (math.ceil(room / s) if ceil else room // s) + 1
        if ceil and (o - 1) * s >= size + lo:
            o -= 1
        return o
    ho, wo = osize(h, kh, sh, pt, pb, dh), osize(w, kw, sw, pl, pr, dw)
    out = np.zeros((n, c, ho, wo))
    for i, j in itertools.product(range(ho), range(wo)):
        vals, cnt = [], 0
        for a, b in itertools.product(range(kh), range(kw)):
            r, q = i * sh - pt + a * dh, j * sw - pl + b * dw
            inside = 0 <= r < h and 0 <= q < w
            if inside:
                vals.append(x[:, :, r, q])
            if inside or (include_pad and -pt <= r < h + pb and -pl <= q < w + pr):
                cnt += 1
        if kind == "max":
            out[:, :, i, j] = np.max(vals, axis=0)
        else:
            out[:, :, i, j] = np.sum(vals, axis=0) / cnt
    return out


POOLS = [  # kernel, strides, pads, dilations, ceil_mode, count_include_pad
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False, False),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, True),
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, False),
    ((3, 2), (2, 3), (1, 0, 0, 1), (1, 1), True, True),
    ((2, 3), (3, 2), (0, 1, 1, 0), (1, 1), True, False),
    ((2, 2), (1, 1), (1, 1, 0, 0), (2, 2), False, False),
]


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k,strides,pads,dil,ceil,incl", POOLS)
def test_pools(bd, kind, k, strides, pads, dil, ceil, incl):
    if kind == "avg" and dil != (1, 1):
        dil = (1, 1)
    x = randn((2, 3, 7, 8), seed=11)
    want = pool_ref(x, kind, k, strides, pads, dil, ceil, incl)
    attrs = {"kernel_shape": k, "strides": strides, "pads": pads, "dilations": dil, "ceil_mode": ceil}
    if kind == "avg":
        attrs["count_include_pad"] = incl
    got = run1(f"{kind}_pool2d", [x], want.shape, np.float32, attrs, bd)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_pool_refuses_bad_attrs():
    f = "float32"
    check_fails("max_pool2d", [((1, 1, 4, 4), f)], [((1, 1, 2, 2), f)], {}, match="kernel_shape")
    check_fails("max_pool2d", [((1, 1, 4, 4), f)], [((1, 1, 3, 3), f)], {"kernel_shape": (2, 2), "strides": (2, 2)},
                match="output shape")
    check_fails("avg_pool2d", [((1, 1, 4, 4), f)], [((1, 1, 2, 2), f)],
                {"kernel_shape": (2, 2), "strides": (2, 2), "pads": (2, 0, 0, 0)}, match="smaller than the window")
    check_fails("avg_pool2d", [((1, 4, 4), f)], [((1, 2, 2), f)], {"kernel_shape": (2, 2)}, match="4 dim")


# ----------------------------------------------------------------------------------------- batch_norm

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_batch_norm(bd, shape, dtype):
    c = shape[1]
    x = randn(shape, dtype, 1, 2.0)
    scale, bias, mean = randn((c,), np.float32, 2), randn((c,), np.float32, 3), randn((c,), np.float32, 4)
    var = (np.abs(randn((c,), np.float64, 5)) + 0.2).astype(np.float32)
    bshape = (c,) + (1,) * (len(shape) - 2)
    want = ((x.astype(np.float64) - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape).astype(np.float64) + 1e-3)
            * scale.reshape(bshape) + bias.reshape(bshape))
    got = run1("batch_norm", [x, scale, bias, mean, var], shape, dtype, {"eps": 1e-3}, bd)
    close(got, want, dtype)


def test_batch_norm_refuses_bad_params():
    f = "float32"
    check_fails("batch_norm", [((2, 3, 4), f)] + [((4,), f)] * 4, [((2, 3, 4), f)], match="scale shape")
    check_fails("batch_norm", [((2, 3, 4), f)] + [((3,), f)] * 4, [((2, 3, 4), f)], {"eps": -1.0}, match="eps")


def test_checks_raise_the_runtime_param_code():
    with pytest.raises(AclError) as ei:
        lookup("conv2d").check((), (), {})
    assert getattr(ei.value, "code", None) == ACL_ERROR_RT_PARAM_INVALID
