"""Unit tests of the built-in kernel library (devices/ops/), run directly without a device.

A tiny harness plays the scheduler: it builds TensorDescs (dummy ptr 0) for ``check``/``work``/
``parallel_dim``, makes every input read-only, and runs each block of ``block_dim`` on its own pair of
output buffers pre-filled with two different byte patterns.  Elements equal in both runs are the ones
that block wrote: the harness asserts that no two blocks write the same element and that together they
write every element, then assembles the result.  Every expected value is computed here in float64
numpy, independently of devices/ops.  float32 results of reductions (matmuls, sums, softmax, norms,
attention) are compared within their a-priori rounding bounds (:mod:`fp32`), which hold whatever order
the kernel or BLAS sums in; elementwise results within a few ulp.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from devices.chip import Work
from devices.errors import (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW,
                            InvalidParamError, KernelError)
from devices.kernel import BlockCtx, TensorDesc, kernel_names, lookup
from fp32 import (assert_within, attention_bound, layernorm_bound, matmul_bound, rmsnorm_bound, scores_abs_max,
                  softmax_bound, sum_bound)

BLOCK_DIMS = [1, 3, 7]
F32_TOL = dict(rtol=1e-5, atol=1e-5)
F16_TOL = dict(rtol=1e-2, atol=1e-2)


def tol(dtype):
    return F16_TOL if np.dtype(dtype) == np.float16 else F32_TOL


# ----------------------------------------------------------------------------------------- harness

def descs(arrays):
    return tuple(TensorDesc(0, tuple(a.shape), np.dtype(a.dtype).name) for a in arrays)


def out_descs(specs):
    return tuple(TensorDesc(0, tuple(s), np.dtype(d).name) for s, d in specs)


def frozen(arrays):
    out = []
    for a in arrays:
        a = np.array(a, copy=True)
        a.flags.writeable = False
        out.append(a)
    return out


def filled(shape, dtype, pattern):
    a = np.empty(shape, dtype)
    a.reshape(-1).view(np.uint8)[:] = pattern
    return a


def bytes_equal(a, b):
    n = np.dtype(a.dtype).itemsize
    ua = a.reshape(-1).view(np.uint8).reshape(a.shape + (n,))
    ub = b.reshape(-1).view(np.uint8).reshape(b.shape + (n,))
    return (ua == ub).all(axis=-1)


def launch(name, inputs, out_specs, attrs=None, block_dim=1):
    """Check, cost and run kernel ``name`` block by block; return the assembled outputs."""
    attrs = dict(attrs or {})
    k = lookup(name)
    ins = frozen(inputs)
    in_d, o_d = descs(ins), out_descs(out_specs)
    k.check(in_d, o_d, attrs)
    w = k.work(in_d, o_d, attrs)
    assert isinstance(w, Work) and w.unit == k.unit and w.bytes >= 0 and w.flops >= 0
    pd = k.parallel_dim(in_d, o_d, attrs)
    assert isinstance(pd, int) and pd >= 0
    result = [np.zeros(s, d) for s, d in out_specs]
    covered = [np.zeros(s, bool) for s, _ in out_specs]
    for b in range(block_dim):
        runs = []
        for pattern in (0xA5, 0x5A):
            outs = [filled(s, d, pattern) for s, d in out_specs]
            k.run(BlockCtx(b, block_dim, 0), list(ins), outs, dict(attrs))
            runs.append(outs)
        for i, (o1, o2) in enumerate(zip(*runs)):
            written = bytes_equal(o1, o2)
            assert not (written & covered[i]).any(), f"{name}: block {b}/{block_dim} rewrote elements of another"
            covered[i] |= written
            result[i][written] = o1[written]
    for i, c in enumerate(covered):
        assert c.all(), f"{name}: {int((~c).sum())} element(s) of output {i} never written (block_dim {block_dim})"
    return result


def run1(name, inputs, shape, dtype, attrs=None, block_dim=1):
    return launch(name, inputs, [(shape, dtype)], attrs, block_dim)[0]


def check_fails(name, ins, outs, attrs=None, match=None):
    k = lookup(name)
    with pytest.raises(InvalidParamError, match=match):
        k.check(out_descs(ins), out_descs(outs), dict(attrs or {}))


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, dtype=np.float32, seed=0, scale=1.0):
    return (rng(seed).standard_normal(shape) * scale).astype(dtype)


def close(got, want, dtype=None, bound=None):
    """``got`` matches the float64 ``want``: within ``bound`` (a float32 rounding bound from :mod:`fp32`)
    when given and the result is float32, else within the dtype's elementwise tolerance."""
    dtype = dtype or got.dtype
    if bound is not None and np.dtype(dtype) == np.float32:
        assert_within(got, want, bound)
    else:
        np.testing.assert_allclose(np.asarray(got, np.float64), want, **tol(dtype))


# ----------------------------------------------------------------------------------------- registry

EXPECTED = {"matmul", "batch_matmul", "add", "sub", "mul", "div", "add_scalar", "mul_scalar", "gelu", "silu",
            "relu", "exp", "tanh", "sqrt", "rsqrt", "neg", "swiglu", "softmax", "layernorm", "rmsnorm",
            "embedding", "transpose", "cast", "rope", "attention", "reduce_sum", "reduce_mean", "reduce_max",
            "reduce_min", "argmax", "fill", "copy", "scatter_update", "incre_flash_attention", "paged_attention"}


def test_all_kernels_registered():
    names = set(kernel_names())
    assert EXPECTED <= names
    for n in EXPECTED:
        k = lookup(n)
        assert k.check and k.work and k.parallel_dim and not k.user
        assert k.unit == ("cube" if n in ("matmul", "batch_matmul", "attention", "incre_flash_attention", "paged_attention") else "vector")


# ----------------------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("m,k,n", [(1, 7, 5), (13, 9, 17), (33, 16, 3), (5, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul(bd, m, k, n, dtype):
    a, b = randn((m, k), dtype, 1), randn((k, n), dtype, 2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    close(run1("matmul", [a, b], (m, n), dtype, block_dim=bd), want, dtype, matmul_bound(a, b))
    bias = randn((n,), dtype, 3)
    got = run1("matmul", [a, np.ascontiguousarray(b.T), bias], (m, n), dtype, {"transpose_b": True}, bd)
    close(got, want + bias.astype(np.float64), dtype, matmul_bound(a, b, bias))


def test_matmul_work_and_split_axis():
    k = lookup("matmul")
    ins, outs = out_descs([((4, 8), "float32"), ((8, 16), "float32")]), out_descs([((4, 16), "float32")])
    w = k.work(ins, outs, {})
    assert w.unit == "cube" and w.flops == 2 * 4 * 16 * 8 and w.bytes == 4 * (32 + 128 + 64)
    assert k.parallel_dim(ins, outs, {}) == 16                       # decode-like: N is split
    ins2, outs2 = out_descs([((64, 8), "float16"), ((8, 16), "float16")]), out_descs([((64, 16), "float16")])
    assert k.parallel_dim(ins2, outs2, {}) == 64 and k.work(ins2, outs2, {}).fp16


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_batch_matmul(bd, ta, tb, dtype):
    batch, m, k, n = (2, 3), 5, 7, 4
    a = randn(batch + ((k, m) if ta else (m, k)), dtype, 1)
    b = randn(batch + ((n, k) if tb else (k, n)), dtype, 2)
    a64 = np.swapaxes(a, -1, -2).astype(np.float64) if ta else a.astype(np.float64)
    b64 = np.swapaxes(b, -1, -2).astype(np.float64) if tb else b.astype(np.float64)
    want = np.einsum("xymk,xykn->xymn", a64, b64)
    got = run1("batch_matmul", [a, b], batch + (m, n), dtype, {"transpose_a": ta, "transpose_b": tb}, bd)
    close(got, want, dtype, matmul_bound(a64, b64))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_batch_matmul_2d_b(bd):
    a, b = randn((4, 3, 6)), randn((5, 6), seed=1)                   # b [N, K] with transpose_b
    want = np.einsum("bmk,nk->bmn", a.astype(np.float64), b.astype(np.float64))
    close(run1("batch_matmul", [a, b], (4, 3, 5), np.float32, {"transpose_b": True}, bd), want,
          bound=matmul_bound(a, b.T))


# ----------------------------------------------------------------------------------------- elementwise

BINARY_SHAPES = [((4, 5), (4, 5)), ((3, 1, 5), (4, 5)), ((2, 3, 4), (4,)), ((7,), (1,)), ((), ()),
                 ((1, 6), (5, 1)), ((2, 1, 3, 1), (1, 4, 1, 5))]
BINARY_REF = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("sa,sb", BINARY_SHAPES)
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_broadcast(bd, sa, sb, op):
    a = randn(sa, seed=1)
    b = randn(sb, seed=2) + (3.0 if op == "div" else 0.0)
    want = BINARY_REF[op](a.astype(np.float64), b.astype(np.float64))
    close(run1(op, [a, b], want.shape, np.float32, block_dim=bd), want)


@pytest.mark.parametrize("bd", [1, 7])
@pytest.mark.parametrize("op", sorted(BINARY_REF))
def test_binary_float16(bd, op):
    a = randn((3, 11), np.float16, 1)
    b = (randn((11,), np.float16, 2) + (3 if op == "div" else 0)).astype(np.float16)
    want = BINARY_REF[op](a.astype(np.float64), b.astype(np.float64))
    close(run1(op, [a, b], (3, 11), np.float16, block_dim=bd), want)


@pytest.mark.parametrize("bd", [1, 3])
def test_binary_int(bd):
    a = rng(1).integers(-50, 50, (4, 6)).astype(np.int32)
    b = rng(2).integers(-50, 50, (6,)).astype(np.int32)
    np.testing.assert_array_equal(run1("add", [a, b], (4, 6), np.int32, block_dim=bd), a + b)
    np.testing.assert_array_equal(run1("mul", [a, b], (4, 6), np.int32, block_dim=bd), a * b)
    np.testing.assert_array_equal(run1("sub", [a, b], (4, 6), np.int32, {"alpha": 3}, bd), a - 3 * b)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("op,sign", [("add", 1.0), ("sub", -1.0)])
def test_alpha(bd, op, sign):
    a, b = randn((3, 5), seed=1), randn((5,), seed=2)
    want = a.astype(np.float64) + sign * 0.5 * b.astype(np.float64)
    close(run1(op, [a, b], (3, 5), np.float32, {"alpha": 0.5}, bd), want)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_scalar_ops(bd, dtype):
    x = (randn((5, 7), np.float64, 1) * 10).astype(dtype)
    x64 = x.astype(np.float64)
    v = 3 if np.dtype(dtype).kind == "i" else 1.25
    close(run1("add_scalar", [x], x.shape, dtype, {"value": v}, bd), x64 + v, dtype)
    close(run1("mul_scalar", [x], x.shape, dtype, {"value": v}, bd), x64 * v, dtype)


def _erf(x):
    return np.vectorize(math.erf)(x)


UNARY_REF = {
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "exp": np.exp,
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "neg": lambda x: -x,
}


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), ()])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", sorted(UNARY_REF))
def test_unary(bd, shape, dtype, op):
    x = randn(shape, dtype, 4, scale=2.0)
    if op in ("sqrt", "rsqrt"):
        x = (np.abs(x.astype(np.float64)) + 0.1).astype(dtype)
    want = UNARY_REF[op](x.astype(np.float64))
    close(run1(op, [x], shape, dtype, block_dim=bd), want, dtype)


@pytest.mark.parametrize("bd", [1, 3])
def test_gelu_tanh(bd):
    x = randn((4, 9), seed=5, scale=3.0)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    close(run1("gelu", [x], x.shape, np.float32, {"approximate": "tanh"}, bd), want)


def test_gelu_erf_accuracy():
    """The erf approximation: absolute error below 1e-6 in float32 over [-12, 12]."""
    x = np.linspace(-12, 12, 24001).astype(np.float32)
    x64 = x.astype(np.float64)
    # erfc form for the negative side: 1 + erf(x) cancels in float64 far out
    want = np.where(x64 < 0, x64 * 0.5 * np.vectorize(math.erfc)(-x64 / math.sqrt(2)),
                    0.5 * x64 * (1 + _erf(x64 / math.sqrt(2))))
    got = run1("gelu", [x], x.shape, np.float32)
    assert np.max(np.abs(got - want)) < 1e-6
    tail = x < -1
    assert np.max(np.abs(got[tail] - want[tail]) / np.abs(want[tail])) < 1e-4


def test_silu_extremes_no_nan():
    x = np.array([-1e4, -100, -88.8, 0, 88.8, 1e4], np.float32)
    got = run1("silu", [x], x.shape, np.float32)
    assert np.isfinite(got).all()
    close(got, np.array([0, -100 * math.exp(-100), -88.8 * math.exp(-88.8), 0, 88.8, 1e4]))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_swiglu(bd, dtype):
    g, u = randn((3, 2, 13), dtype, 1, 2.0), randn((3, 2, 13), dtype, 2)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    close(run1("swiglu", [g, u], g.shape, dtype, block_dim=bd), g64 / (1 + np.exp(-g64)) * u64, dtype)


# ----------------------------------------------------------------------------------------- softmax / norms

def ref_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape,axis", [((4, 9), -1), ((3, 5, 7), 1), ((3, 5, 7), 0), ((17,), 0), ((2, 3, 1), -1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_softmax(bd, shape, axis, dtype):
    x = randn(shape, dtype, 6, 3.0)
    want = ref_softmax(x.astype(np.float64), axis)
    got = run1("softmax", [x], shape, dtype, {"axis": axis}, bd)
    close(got, want, dtype, softmax_bound(x, axis, want))


@pytest.mark.parametrize("bd", [1, 3])
def test_softmax_masked_rows(bd):
    x = randn((3, 5), seed=7)
    x[0, 1:3] = -np.inf
    x[1, :] = -np.inf                                                  # fully masked: zeros, not NaN
    got = run1("softmax", [x], x.shape, np.float32, {}, bd)
    want = ref_softmax(x.astype(np.float64)[[0, 2]], -1)
    assert_within(got[[0, 2]], want, softmax_bound(x[[0, 2]], -1, want))
    assert (got[0, 1:3] == 0).all() and (got[1] == 0).all()


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 33), (1, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layernorm(bd, shape, dtype):
    x = (randn(shape, np.float64, 1, 2.0) + 1.5).astype(dtype)
    d = shape[-1]
    gamma, beta = randn((d,), dtype, 2), randn((d,), dtype, 3)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    want = (x64 - mu) / np.sqrt(var + 1e-3) * gamma.astype(np.float64) + beta.astype(np.float64)
    close(run1("layernorm", [x, gamma, beta], shape, dtype, {"eps": 1e-3}, bd), want, dtype,
          layernorm_bound(x, gamma, beta, 1e-3))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 33), (7,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rmsnorm(bd, shape, dtype):
    x = randn(shape, dtype, 1, 2.0)
    gamma = randn((shape[-1],), dtype, 2)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * gamma.astype(np.float64)
    close(run1("rmsnorm", [x, gamma], shape, dtype, {}, bd), want, dtype, rmsnorm_bound(x, want))


def test_norm_float32_weights_with_float16_input():
    x, gamma = randn((3, 8), np.float16, 1), randn((8,), np.float32, 2)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * gamma
    close(run1("rmsnorm", [x, gamma], (3, 8), np.float16, {"eps": 1e-5}), want, np.float16)


# ----------------------------------------------------------------------------------------- embedding

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("ids_shape", [(7,), (2, 3), (1,)])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_embedding(bd, ids_shape, id_dtype):
    table = randn((11, 6), seed=1)
    ids = rng(2).integers(0, 11, ids_shape).astype(id_dtype)
    got = run1("embedding", [table, ids], ids_shape + (6,), np.float32, block_dim=bd)
    np.testing.assert_array_equal(got, table[ids])


@pytest.mark.parametrize("bd", [1, 3])
@pytest.mark.parametrize("bad", [11, -1, 1000])
def test_embedding_out_of_range(bd, bad):
    table = randn((11, 6), seed=1)
    ids = np.array([0, 3, bad, 5], np.int64)
    with pytest.raises(KernelError, match="outside"):
        launch("embedding", [table, ids], [((4, 6), np.float32)], block_dim=bd)


# ----------------------------------------------------------------------------------------- scatter_update

def scatter(updates, indices, var, block_dim=1):
    """Run ``scatter_update`` in place on a copy of ``var``; also return which elements the blocks wrote.

    Each block also runs on two pattern-filled copies: the elements equal in both are the ones it wrote;
    no two blocks may write the same element."""
    k = lookup("scatter_update")
    ins = frozen([updates, indices])
    in_d, o_d = descs(ins), descs([var])
    k.check(in_d, o_d, {})
    w = k.work(in_d, o_d, {})
    assert w.unit == "vector" and w.bytes == indices.nbytes + 2 * updates.nbytes
    assert k.parallel_dim(in_d, o_d, {}) == len(indices)
    out = var.copy()
    written = np.zeros(var.shape, bool)
    for b in range(block_dim):
        runs = []
        for pattern in (0xA5, 0x5A):
            o = filled(var.shape, var.dtype, pattern)
            k.run(BlockCtx(b, block_dim, 0), list(ins), [o], {})
            runs.append(o)
        wb = bytes_equal(*runs)
        assert not (wb & written).any(), f"scatter_update: block {b}/{block_dim} rewrote another block's rows"
        written |= wb
        k.run(BlockCtx(b, block_dim, 0), list(ins), [out], {})
    return out, written


def ref_scatter(updates, indices, var):
    out = var.copy()
    for k, i in enumerate(indices):                                    # in order: the last duplicate wins
        out[int(i)] = updates[k]
    return out


def _values(shape, dtype, seed):
    if np.dtype(dtype) == np.bool_:
        return rng(seed).random(shape) < 0.5
    return (randn(shape, np.float64, seed) * 20).astype(dtype)


@pytest.mark.parametrize("bd", [1, 3])
@pytest.mark.parametrize("s,row,k", [(7, (5,), 1), (7, (5,), 4), (9, (2, 3), 3), (6, (), 5), (4, (8,), 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_scatter_update(bd, s, row, k, dtype, id_dtype):
    var = _values((s,) + row, dtype, 1)
    updates = _values((k,) + row, dtype, 2)
    indices = rng(3).permutation(s)[:k].astype(id_dtype)
    got, written = scatter(updates, indices, var, bd)
    want = ref_scatter(updates, indices, var)
    assert bytes_equal(got, want).all()
    rows = np.isin(np.arange(s), indices)
    assert written[rows].all() and not written[~rows].any()           # only the indexed rows are written
    assert bytes_equal(got[~rows], var[~rows]).all()                   # the others stay bit-identical


@pytest.mark.parametrize("bd", [1, 3])
def test_scatter_update_duplicates_last_wins(bd):
    var, updates = randn((5, 3), seed=1), randn((6, 3), seed=2)
    indices = np.array([4, 1, 4, 0, 1, 4], np.int64)                 # 4 thrice, 1 twice across blocks
    got, written = scatter(updates, indices, var, bd)
    want = var.copy()
    want[[4, 1, 0]] = updates[[5, 4, 3]]
    np.testing.assert_array_equal(got, want)
    assert written[[0, 1, 4]].all() and not written[[2, 3]].any()


@pytest.mark.parametrize("bd", [1, 3])
@pytest.mark.parametrize("bad", [7, -1, 1 << 40])
@pytest.mark.parametrize("k", [1, 4])
def test_scatter_update_out_of_range_writes_nothing(bd, bad, k):
    var, updates = randn((7, 4), seed=1), randn((k, 4), seed=2)
    indices = np.array([bad, 2, 5, 0][:k] if k == 1 else [1, 2, bad, 0], np.int64)
    kern = lookup("scatter_update")
    ins = frozen([updates, indices])
    out = var.copy()
    for b in range(bd):                                               # every block traps, none writes
        with pytest.raises(KernelError, match="outside") as e:
            kern.run(BlockCtx(b, bd, 0), list(ins), [out], {})
        assert e.value.code == ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW == 507043
    assert bytes_equal(out, var).all()


def test_scatter_update_empty():
    var = randn((3, 2), seed=1)
    got, written = scatter(np.zeros((0, 2), np.float32), np.zeros((0,), np.int32), var, 1)
    assert bytes_equal(got, var).all() and not written.any()


# ----------------------------------------------------------------------------------------- layout

@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("shape,perm", [((3, 4), (1, 0)), ((2, 3, 5), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)),
                                        ((6,), (0,))])
def test_transpose(bd, shape, perm):
    x = randn(shape, seed=3)
    want = np.transpose(x, perm)
    np.testing.assert_array_equal(run1("transpose", [x], want.shape, np.float32, {"perm": perm}, bd), want)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.float16, np.float32), (np.float32, np.int32),
                                     (np.int64, np.float32), (np.int32, np.int64)])
def test_cast(bd, src, dst):
    x = (randn((4, 5), np.float64, 1) * 20).astype(src)
    np.testing.assert_array_equal(run1("cast", [x], x.shape, dst, block_dim=bd), x.astype(dst))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype,value", [(np.float32, 1.5), (np.float16, -np.inf), (np.int32, 7), (np.bool_, True)])
def test_fill(bd, dtype, value):
    got = run1("fill", [], (3, 5), dtype, {"value": value}, bd)
    np.testing.assert_array_equal(got, np.full((3, 5), value, dtype))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_copy(bd, dtype):
    x = (randn((5, 3), np.float64, 1) * 10).astype(dtype)
    np.testing.assert_array_equal(run1("copy", [x], x.shape, dtype, block_dim=bd), x)


# ----------------------------------------------------------------------------------------- rope

def ref_rope(x, pos, base, style, rotary_dim=None):
    """Rotary embedding in float64: 'half' via rotate_half, 'interleaved' via complex rotation."""
    x = x.astype(np.float64)
    b, s, h, dh = x.shape
    rd = rotary_dim or dh
    inv = base ** (-np.arange(0, rd, 2) / rd)                          # [rd/2]
    p = np.broadcast_to(pos.reshape(-1, s) if pos.ndim == 2 else pos[None, :], (b, s)).astype(np.float64)
    theta = p[:, :, None, None] * inv[None, None, None, :]             # [B, S, 1, rd/2]
    out = x.copy()
    xr = x[..., :rd]
    if style == "half":
        cos = np.concatenate([np.cos(theta)] * 2, -1)
        sin = np.concatenate([np.sin(theta)] * 2, -1)
        rot = np.concatenate([-xr[..., rd // 2:], xr[..., :rd // 2]], -1)
        out[..., :rd] = xr * cos + rot * sin
    else:
        z = (xr[..., 0::2] + 1j * xr[..., 1::2]) * np.exp(1j * theta)
        out[..., 0:rd:2], out[..., 1:rd:2] = z.real, z.imag
    return out


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("pos_kind", ["S", "BS"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rope(bd, style, pos_kind, dtype):
    b, s, h, dh = 2, 5, 3, 8
    x = randn((b, s, h, dh), dtype, 1)
    pos = (np.arange(s) + 7) if pos_kind == "S" else rng(2).integers(0, 100, (b, s))
    pos = pos.astype(np.int64)
    attrs = {"style": style, "base": 10000.0}
    close(run1("rope", [x, pos], x.shape, dtype, attrs, bd), ref_rope(x, pos, 10000.0, style), dtype)


@pytest.mark.parametrize("bd", [1, 3])
def test_rope_partial_and_base(bd):
    x = randn((1, 3, 2, 10), seed=4)
    pos = np.array([0, 1, 2], np.int32)
    attrs = {"rotary_dim": 4, "base": 500.0}
    close(run1("rope", [x, pos], x.shape, np.float32, attrs, bd), ref_rope(x, pos, 500.0, "half", 4))


# ----------------------------------------------------------------------------------------- attention

def ref_attention(q, k, v, mask=None, causal=False, q_offset=None, scale=None):
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    q_offset = skv - sq if q_offset is None else q_offset
    m4 = None if mask is None else np.broadcast_to(mask.astype(np.float64), (b, hq, sq, skv))
    out = np.zeros((b, hq, sq, v.shape[3]))
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)
            for i in range(sq):
                s = [scale * float(q[bi, h, i] @ k[bi, kv, j]) for j in range(skv)]
                s = np.array(s)
                if m4 is not None:
                    s = s + m4[bi, h, i]
                if causal:
                    s = np.where(np.arange(skv) <= q_offset + i, s, -np.inf)
                if np.isneginf(s).all():
                    continue                                           # fully masked row: zeros
                p = np.exp(s - s.max())
                out[bi, h, i] = (p / p.sum()) @ v[bi, kv]
    return out


ATTN_CASES = [
    # (B, Hq, Hkv, Sq, Skv, D, causal, q_offset, mask_shape)
    (1, 2, 2, 3, 3, 4, False, None, None),
    (2, 4, 2, 5, 5, 8, True, None, None),           # GQA prefill, causal
    (2, 6, 2, 1, 9, 8, True, None, None),           # decode, GQA 3
    (1, 3, 1, 4, 7, 5, True, 1, (1, 1, 4, 7)),      # MQA, explicit offset, padding mask
    (3, 4, 4, 2, 6, 4, False, None, (3, 4, 2, 6)),  # per-head mask
    (2, 2, 1, 3, 3, 4, False, None, (3,)),          # mask broadcast over keys only
]


def _attn_inputs(case, dtype):
    b, hq, hkv, sq, skv, d, causal, q_offset, mshape = case
    q, k, v = randn((b, hq, sq, d), dtype, 1), randn((b, hkv, skv, d), dtype, 2), randn((b, hkv, skv, d), dtype, 3)
    ins = [q, k, v]
    mask = None
    if mshape is not None:
        mask = np.where(rng(4).random(mshape) < 0.25, -np.inf, rng(5).standard_normal(mshape)).astype(dtype)
        mask[..., 0] = 0.0                                             # keep key 0 visible in every row
        ins.append(mask)
    attrs = {"causal": causal}
    if q_offset is not None:
        attrs["q_offset"] = q_offset
    return ins, mask, attrs


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("case", ATTN_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_attention(bd, case, dtype):
    ins, mask, attrs = _attn_inputs(case, dtype)
    q, k, v = ins[:3]
    want = ref_attention(q, k, v, mask, attrs["causal"], attrs.get("q_offset"))
    got = run1("attention", ins, want.shape, dtype, attrs, bd)
    close(got, want, dtype, attention_bound(scores_abs_max(q, k, mask=mask), q.shape[-1], k.shape[2],
                                            ref_attention(q, k, np.abs(v), mask, attrs["causal"],
                                                          attrs.get("q_offset"))))


@pytest.mark.parametrize("bd", [1, 5])
def test_attention_scale_and_fully_masked_rows(bd):
    q, k, v = randn((1, 2, 4, 3), seed=1), randn((1, 2, 5, 3), seed=2), randn((1, 2, 5, 2), seed=3)
    attrs = {"causal": True, "q_offset": -2, "scale": 0.3}            # queries 0, 1 see no key at all
    want = ref_attention(q, k, v, causal=True, q_offset=-2, scale=0.3)
    got = run1("attention", [q, k, v], (1, 2, 4, 2), np.float32, attrs, bd)
    assert_within(got, want, attention_bound(scores_abs_max(q, k, 0.3), 3, 5,
                                             ref_attention(q, k, np.abs(v), causal=True, q_offset=-2, scale=0.3)))
    assert (got[:, :, :2] == 0).all()


# ----------------------------------------------------------------------------------------- incre_flash_attention

def ref_ifa(q, cache, lens, pad, h, hkv, ko, vo, scale=None):
    """Decode attention over the packed cache, in float64, head by head, with -inf masking."""
    q, cache = q.astype(np.float64), cache.astype(np.float64)
    b, _, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b, h, d))
    for bi in range(b):
        n = int(lens[bi])
        for hi in range(h):
            g = hi // (h // hkv)
            kk, vv = cache[:n, bi, ko + g], cache[:n, bi, vo + g]
            s = kk @ q[bi, hi] * scale
            if pad is not None:
                s = np.where(np.arange(n) < int(pad[bi]), -np.inf, s)
            if n == 0 or np.isneginf(s).all():
                continue                                               # nothing visible: zeros
            p = np.exp(s - s.max())
            out[bi, hi] = (p / p.sum()) @ vv
    return out


def _ifa_case(b, h, hkv, s, d, dtype, lens, pads, fused=True):
    """query [B, Wq, D] and cache [S, B, W, D]: fused q|k|v rows (query is the staging row) or a
    separate query with the value heads before the key heads and a spare head in the cache."""
    if fused:
        w, ko, vo = h + 2 * hkv, h, h + hkv
        q = randn((b, w, d), dtype, 1)
    else:
        w, ko, vo = 2 * hkv + 1, hkv + 1, 0
        q = randn((b, h, d), dtype, 1)
    cache = randn((s, b, w, d), dtype, 2)
    ins = [q, cache, np.array(lens, np.int32)] + ([] if pads is None else [np.array(pads, np.int64)])
    attrs = {"num_heads": h, "num_key_value_heads": hkv, "key_head_offset": ko, "value_head_offset": vo}
    return ins, attrs


def ifa_bound(ins, attrs, lens, pads, scale=None):
    """float32 rounding bound of incre_flash_attention (see fp32.attention_bound): the weights of the
    exact attention applied to |v|, and the largest score magnitude over the cache."""
    q, cache = ins[0], ins[1]
    h, hkv = attrs["num_heads"], attrs["num_key_value_heads"]
    ko, vo = attrs["key_head_offset"], attrs["value_head_offset"]
    abs_v = cache.astype(np.float64)
    abs_v[:, :, vo:vo + hkv] = np.abs(abs_v[:, :, vo:vo + hkv])
    top = scores_abs_max(q[:, :h], cache[:, :, ko:ko + hkv], scale)
    return attention_bound(top, q.shape[-1], cache.shape[0], ref_ifa(q, abs_v, lens, pads, h, hkv, ko, vo, scale))


F, H, I32, I64 = "float32", "float16", "int32", "int64"


@pytest.mark.parametrize("b,lens,pads", [(1, [1], None), (1, [4], None), (1, [7], None), (1, [7], [3]),
                                         (1, [5], [1]), (3, [1, 4, 7], None), (3, [1, 4, 7], [0, 2, 3]),
                                         (3, [7, 7, 7], [4, 0, 6])])
@pytest.mark.parametrize("h,hkv", [(3, 3), (6, 2), (3, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_incre_flash_attention(b, lens, pads, h, hkv, dtype):
    s, d = 7, 8
    ins, attrs = _ifa_case(b, h, hkv, s, d, dtype, lens, pads, fused=(h != 3 or hkv != 1))
    want = ref_ifa(ins[0], ins[1], lens, pads, h, hkv, attrs["key_head_offset"], attrs["value_head_offset"])
    got1 = run1("incre_flash_attention", ins, (b, h, d), dtype, attrs, 1)
    close(got1, want, dtype, ifa_bound(ins, attrs, lens, pads))
    got3 = run1("incre_flash_attention", ins, (b, h, d), dtype, attrs, 3)
    np.testing.assert_array_equal(got3, got1)                          # the block split changes nothing


@pytest.mark.parametrize("bd", [1, 2, 5])
def test_incre_flash_attention_fully_masked_rows_and_scale(bd):
    ins, attrs = _ifa_case(3, 4, 2, 6, 5, np.float32, [0, 4, 5], [0, 4, 2])
    attrs["scale"] = 0.7
    want = ref_ifa(ins[0], ins[1], [0, 4, 5], [0, 4, 2], 4, 2, 4, 6, scale=0.7)
    got = run1("incre_flash_attention", ins, (3, 4, 5), np.float32, attrs, bd)
    assert_within(got, want, ifa_bound(ins, attrs, [0, 4, 5], [0, 4, 2], scale=0.7))
    assert (got[:2] == 0).all() and (got[2] != 0).all()               # len 0 and pad == len: zeros


def test_incre_flash_attention_matches_attention_kernel():
    """Same math as ``attention`` on gathered, head-major k/v (decode: one query per sequence)."""
    ins, attrs = _ifa_case(2, 6, 2, 9, 8, np.float32, [9, 9], None)
    q, cache = ins[0], ins[1]
    qa = np.ascontiguousarray(q[:, :6, None, :])
    ka = np.ascontiguousarray(cache[:, :, 6:8].transpose(1, 2, 0, 3))
    va = np.ascontiguousarray(cache[:, :, 8:10].transpose(1, 2, 0, 3))
    want = run1("attention", [qa, ka, va], (2, 6, 1, 8), np.float32)[:, :, 0]
    # two float32 evaluations of the same exact value: each within the bound of it
    assert_within(run1("incre_flash_attention", ins, (2, 6, 8), np.float32, attrs), want,
                  2 * ifa_bound(ins, attrs, [9, 9], None))


@pytest.mark.parametrize("bd", [1, 3])
@pytest.mark.parametrize("lens", [[8], [2, 9], [-1, 3]])
def test_incre_flash_attention_length_out_of_range(bd, lens):
    ins, attrs = _ifa_case(len(lens), 4, 2, 8, 4, np.float32, lens, None)
    k = lookup("incre_flash_attention")
    k.check(descs(ins), out_descs([((len(lens), 4, 4), np.float32)]), attrs)  # values are not checked at launch
    if lens == [8]:
        k.run(BlockCtx(0, 1, 0), frozen(ins), [np.zeros((1, 4, 4), np.float32)], attrs)   # len == S is fine
        ins[2] = np.array([9], np.int32)
    out = filled((len(lens), 4, 4), np.float32, 0xA5)
    for b in range(bd):                                               # every block traps, none writes
        with pytest.raises(KernelError, match="actual_seq_lengths") as e:
            k.run(BlockCtx(b, bd, 0), frozen(ins), [out], attrs)
        assert e.value.code == ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW == 507042
    assert bytes_equal(out, filled(out.shape, np.float32, 0xA5)).all()


def test_incre_flash_attention_work():
    k = lookup("incre_flash_attention")
    ins = out_descs([((2, 15, 64), H), ((100, 2, 15, 64), H), ((2,), I32)])
    outs = out_descs([((2, 9, 64), H)])
    attrs = {"num_heads": 9, "num_key_value_heads": 3, "key_head_offset": 9, "value_head_offset": 12}
    w = k.work(ins, outs, attrs)
    assert w.unit == "cube" and w.fp16 and w.flops == 4 * 2 * 9 * 100 * 64
    assert w.bytes == 2 * (2 * 9 * 64 + 2 * 100 * 2 * 3 * 64) + 2 * 9 * 64 * 2 + 8


# ----------------------------------------------------------------------------------------- paged_attention

def ref_paged(q, kc, vc, bt, lens, h, hkv, scale=None):
    """Row by row in float64: gather the row's sequence position by position through its block table."""
    q, kc, vc = q.astype(np.float64), kc.astype(np.float64), vc.astype(np.float64)
    n, _, d = q.shape
    bs = kc.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((n, h, d))
    for r in range(n):
        L = int(lens[r])
        if L == 0:
            continue
        keys = np.stack([kc[bt[r, j // bs], j % bs] for j in range(L)])      # [L, Hkv, D]
        vals = np.stack([vc[bt[r, j // bs], j % bs] for j in range(L)])
        for hi in range(h):
            g = hi // (h // hkv)
            s = keys[:, g] @ q[r, hi] * scale
            p = np.exp(s - s.max())
            out[r, hi] = (p / p.sum()) @ vals[:, g]
    return out


def _paged_case(rows, h=6, hkv=2, nb=9, bs=4, mb=5, d=8, dtype=np.float32, wq=None, seed=0):
    """``rows``: (sequence, length) per token row; sequences get distinct random blocks (block 0 unused)."""
    r = rng(seed)
    seqs = sorted({s for s, _ in rows})
    perm = r.permutation(np.arange(1, nb))
    tables = {s: np.concatenate([perm[i * 2:i * 2 + 2], r.integers(0, nb, mb - 2)]) for i, s in enumerate(seqs)}
    bt = np.stack([tables[s] for s, _ in rows]).astype(np.int32)
    lens = np.array([n for _, n in rows], np.int32)
    q = randn((len(rows), wq or h, d), dtype, seed + 1)
    kc, vc = randn((nb, bs, hkv, d), dtype, seed + 2), randn((nb, bs, hkv, d), dtype, seed + 3)
    return [q, kc, vc, bt, lens], {"num_heads": h, "num_key_value_heads": hkv}


PAGED_ROWS = [
    [(0, 1)],                                                    # one decode row
    [(0, 5), (1, 8), (2, 0), (3, 3)],                            # decode rows of 4 sequences (one empty)
    [(0, 3), (0, 4), (0, 5), (0, 6)],                            # a prefill chunk: causal by the lengths
    [(1, 7), (0, 2), (0, 3), (0, 4), (2, 1), (3, 6), (3, 7)],    # decodes and two chunks mixed
    [(0, 1), (1, 20), (2, 2), (3, 19)],                          # lengths far apart (several groups)
]


@pytest.mark.parametrize("rows", PAGED_ROWS, ids=range(len(PAGED_ROWS)))
@pytest.mark.parametrize("h,hkv,wq", [(6, 2, None), (3, 3, None), (4, 1, 9)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_paged_attention(rows, h, hkv, wq, dtype):
    ins, attrs = _paged_case(rows, h, hkv, wq=wq, dtype=dtype)
    want = ref_paged(*ins, h, hkv)
    q, kc, vc = ins[0], ins[1], ins[2]
    bound = attention_bound(scores_abs_max(q[:, :h], kc), q.shape[-1], int(max(n for _, n in rows)) or 1,
                            ref_paged(q, kc, np.abs(vc.astype(np.float64)), *ins[3:], h, hkv))
    for bd in (1, 3):
        got = run1("paged_attention", ins, (len(rows), h, 8), dtype, attrs, bd)
        if dtype == np.float32:
            assert_within(got, want, bound, f"paged_attention block_dim {bd}")
        else:
            np.testing.assert_allclose(got.astype(np.float64), want, **F16_TOL)
    assert (got[np.array([n for _, n in rows]) == 0] == 0).all()


def test_paged_attention_matches_contiguous_attention():
    """A sequence spread over scattered blocks gives the attention of its contiguous keys (causal)."""
    ins, attrs = _paged_case([(0, k) for k in range(1, 8)], h=4, hkv=2, bs=2, mb=4)
    q, kc, vc, bt = ins[:4]
    keys = np.stack([kc[bt[0, j // 2], j % 2] for j in range(7)])           # [7, Hkv, D]
    vals = np.stack([vc[bt[0, j // 2], j % 2] for j in range(7)])
    qa = np.ascontiguousarray(q.transpose(1, 0, 2)[None])                  # [1, H, 7, D]
    ka = np.ascontiguousarray(keys.transpose(1, 0, 2)[None])
    va = np.ascontiguousarray(vals.transpose(1, 0, 2)[None])
    want = run1("attention", [qa, ka, va], (1, 4, 7, 8), np.float32, {"causal": True})[0].transpose(1, 0, 2)
    np.testing.assert_allclose(run1("paged_attention", ins, (7, 4, 8), np.float32, attrs), want,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bd", [1, 3])
@pytest.mark.parametrize("bad", ["len", "neg", "block"])
def test_paged_attention_out_of_range_traps(bd, bad):
    ins, attrs = _paged_case([(0, 3), (1, 6), (2, 2)], bs=4, mb=2, nb=7)
    if bad == "len":
        ins[4][1] = 9                                                # > MB * BS = 8
    elif bad == "neg":
        ins[4][2] = -1
    else:
        ins[3][1, 1] = 7                                             # second block of row 1 (len 6) is used
    k = lookup("paged_attention")
    out = filled((3, 6, 8), np.float32, 0xA5)
    for b in range(bd):
        with pytest.raises(KernelError, match="context_lens" if bad != "block" else "block_tables") as e:
            k.run(BlockCtx(b, bd, 0), frozen(ins), [out], attrs)
        assert e.value.code == ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW
    assert bytes_equal(out, filled(out.shape, np.float32, 0xA5)).all()
    if bad == "block":                                               # an unused entry may hold anything
        ins[3][1, 1] = 0
        ins[3][0, 1] = -7                                            # row 0 (len 3) uses one block only
        k.run(BlockCtx(0, 1, 0), frozen(ins), [out], attrs)


def _decode_case(lens, dtype, seed, bs=16, hkv=3, h=9, d=64, mb=24, order="random"):
    """Decode rows of SmolLM2's shape, each its own sequence: blocks drawn at random from the whole cache
    (``order`` "ascending" / "descending": consecutive ids, as a block pool hands them out), no two rows
    sharing one, the unused table entries garbage (negative or past the cache)."""
    r = rng(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 8
    perm = {"random": r.permutation(nb), "ascending": np.arange(3, nb + 3) % nb,
            "descending": np.arange(nb - 1, -1, -1)}[order]
    bt = r.integers(-5 * nb, 5 * nb, (len(lens), mb)).astype(np.int32)
    o = 0
    for i, k in enumerate(need):
        bt[i, :k] = perm[o:o + k]
        o += k
    q = randn((len(lens), h + 2 * hkv, d), dtype, seed + 1)
    kc, vc = randn((nb, bs, hkv, d), dtype, seed + 2), randn((nb, bs, hkv, d), dtype, seed + 3)
    return [q, kc, vc, bt, np.array(lens, np.int32)], {"num_heads": h, "num_key_value_heads": hkv}


DECODE_LENS = [
    [1], [16], [37], [320],                                          # one row: at, inside and past a block
    [192] * 16,                                                      # a full batch of one length (in place)
    [5, 300, 0, 310, 17, 64, 299, 33, 1, 250, 97, 0, 129, 16, 301, 48],   # far apart: groups of rows out of
    [64, 65, 79, 80, 81, 96, 100, 127, 128, 129, 140, 150, 160, 175, 191, 200],  # order; near: fewer groups
]


@pytest.mark.parametrize("lens", DECODE_LENS, ids=range(len(DECODE_LENS)))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_paged_attention_decode_rows_match_dense_attention(lens, dtype):
    """Decode rows over random block tables -- contexts of 1..320 tokens, ending inside a block or at its
    end, rows of length 0, lengths far apart (the kernel groups rows by length: consecutive rows in place,
    others through copies) -- give each row's dense softmax attention over its own keys (float64
    reference, float32 error bound); run twice, so the second run reads the reused scratch buffers."""
    ins, attrs = _decode_case(lens, dtype, seed=len(lens) + sum(lens))
    q, kc, vc = ins[:3]
    want = ref_paged(*ins, 9, 3)
    bound = attention_bound(scores_abs_max(q[:, :9], kc), 64, max(max(lens), 1),
                            ref_paged(q, kc, np.abs(vc.astype(np.float64)), *ins[3:], 9, 3))
    for bd in (1, 1, 3):
        got = run1("paged_attention", ins, (len(lens), 9, 64), dtype, attrs, bd)
        if dtype == np.float32:
            assert_within(got, want, bound, f"paged_attention block_dim {bd}")
        else:
            np.testing.assert_allclose(got.astype(np.float64), want, **F16_TOL)
        assert (got[np.array(lens) == 0] == 0).all()


@pytest.mark.parametrize("order", ["ascending", "descending"])
@pytest.mark.parametrize("n", [1, 16, 17, 37, 320])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_paged_attention_decode_row_over_consecutive_blocks(order, n, dtype):
    """One decode row whose blocks are consecutive ids, ascending or descending (read as one slice of the
    cache, the descending one with its last, partly written block first), ending at or inside a block:
    its dense attention, as over blocks drawn at random."""
    ins, attrs = _decode_case([n], dtype, seed=n, order=order)
    q, kc, vc = ins[:3]
    want = ref_paged(*ins, 9, 3)
    bound = attention_bound(scores_abs_max(q[:, :9], kc), 64, n,
                            ref_paged(q, kc, np.abs(vc.astype(np.float64)), *ins[3:], 9, 3))
    got = run1("paged_attention", ins, (1, 9, 64), dtype, attrs)
    if dtype == np.float32:
        assert_within(got, want, bound, f"paged_attention over {order} blocks")
    else:
        np.testing.assert_allclose(got.astype(np.float64), want, **F16_TOL)


def test_paged_attention_threads_keep_their_own_scratch():
    """Decode launches of different shapes running at once on several threads (the AI Core threads of
    one process's devices) each get their own rows' attention: the reused buffers are per thread."""
    cases = [_decode_case(lens, np.float32, seed=i) for i, lens in enumerate(DECODE_LENS)]
    want = [ref_paged(*ins, 9, 3) for ins, _ in cases]

    def run(i):
        ins, attrs = cases[i]
        k, out = lookup("paged_attention"), np.empty((len(ins[4]), 9, 64), np.float32)
        for _ in range(20):
            k.run(BlockCtx(0, 1, 0), frozen(ins), [out], attrs)
            if not np.allclose(out, want[i], rtol=1e-4, atol=1e-4):
                return False
        return True

    with ThreadPoolExecutor(4) as ex:
        assert all(ex.map(run, [i % len(cases) for i in range(12)]))


def test_paged_attention_work_and_parallel_dim():
    k = lookup("paged_attention")
    ins = out_descs([((5, 15, 64), F), ((10, 16, 3, 64), F), ((10, 16, 3, 64), F), ((5, 8), I32), ((5,), I32)])
    outs = out_descs([((5, 9, 64), F)])
    attrs = {"num_heads": 9, "num_key_value_heads": 3}
    k.check(ins, outs, attrs)
    w = k.work(ins, outs, attrs)
    assert w.unit == "cube" and not w.fp16 and w.flops == 4 * 5 * 9 * 128 * 64
    assert k.parallel_dim(ins, outs, attrs) == 5


PA_OK = [((2, 15, 8), F), ((6, 4, 3, 8), F), ((6, 4, 3, 8), F), ((2, 3), I32), ((2,), I32)]
PA_ATTRS = {"num_heads": 9, "num_key_value_heads": 3}


@pytest.mark.parametrize("i,spec,attrs,match", [
    (None, None, {}, None),
    (0, ((2, 15, 4), F), {}, "head dim"),
    (0, ((2, 1, 15, 8), F), {}, "query must have 3"),
    (2, ((6, 4, 2, 8), F), {}, "value_cache shape"),
    (1, ((6, 4, 3, 8), H), {}, "dtype"),
    (3, ((3, 3), I32), {}, "block_tables shape"),
    (3, ((2, 3), F), {}, "block_tables dtype"),
    (4, ((3,), I32), {}, "context_lens shape"),
    (4, ((2,), F), {}, "context_lens dtype"),
    (None, None, {"num_key_value_heads": 2}, "differs from the caches"),
    (None, None, {"num_heads": 16}, "num_heads"),
    (None, None, {"num_heads": 8}, "multiple"),
    (None, None, {"scale": "x"}, "scale"),
])
def test_paged_attention_check(i, spec, attrs, match):
    ins = list(PA_OK)
    if i is not None:
        ins[i] = spec
    a = dict(PA_ATTRS, **attrs)
    if match is None:
        lookup("paged_attention").check(out_descs(ins), out_descs([((2, 9, 8), F)]), a)
        check_fails("paged_attention", ins, [((2, 9, 8), F)], {"num_heads": 9}, "'num_key_value_heads' is required")
        check_fails("paged_attention", ins[:4], [((2, 9, 8), F)], a, "input")
        return
    check_fails("paged_attention", ins, [((2, 9, 8), F)], a, match)


# ----------------------------------------------------------------------------------------- reductions

REDUCE_REF = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min}


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("axis", [-1, 0, (0, 2), None, (1,)])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("op", sorted(REDUCE_REF))
def test_reductions(bd, axis, keepdims, op):
    x = randn((3, 4, 5), seed=8)
    want = REDUCE_REF[op](x.astype(np.float64), axis=axis, keepdims=keepdims)
    attrs = {"keepdims": keepdims} if axis is None else {"axis": axis, "keepdims": keepdims}
    got = run1(op, [x], np.shape(want), np.float32, attrs, bd)
    if op in ("reduce_max", "reduce_min"):
        np.testing.assert_array_equal(got, want)                         # a selection: exact
    else:
        bound = sum_bound(x, axis if axis is not None else None, keepdims)
        close(got, want, bound=bound / (x.size // max(want.size, 1)) if op == "reduce_mean" else bound)


@pytest.mark.parametrize("bd", [1, 3])
def test_reductions_float16_and_int(bd):
    x = (randn((4, 300), np.float64, 1) + 5).astype(np.float16)      # fp16 sums of ~1500 accumulate in fp32
    close(run1("reduce_sum", [x], (4,), np.float16, {"axis": 1}, bd), x.astype(np.float64).sum(1))
    close(run1("reduce_mean", [x], (4,), np.float16, {"axis": 1}, bd), x.astype(np.float64).mean(1))
    xi = rng(2).integers(-100, 100, (3, 7)).astype(np.int32)
    np.testing.assert_array_equal(run1("reduce_sum", [xi], (7,), np.int32, {"axis": 0}, bd), xi.sum(0))
    np.testing.assert_array_equal(run1("reduce_max", [xi], (3, 1), np.int32, {"axis": 1, "keepdims": True}, bd),
                                  xi.max(1, keepdims=True))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("out_dtype", [np.int32, np.int64])
def test_argmax(bd, axis, out_dtype):
    x = randn((4, 6, 5), seed=9)
    x[1, 2, :] = 0.5                                                  # ties: first index wins
    want = np.argmax(x, axis=axis)
    got = run1("argmax", [x], want.shape, out_dtype, {"axis": axis}, bd)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == out_dtype


def test_argmax_keepdims_and_default_axis():
    x = randn((2, 9), seed=10)
    got = run1("argmax", [x], (2, 1), np.int64, {"keepdims": True})
    np.testing.assert_array_equal(got, np.argmax(x, axis=-1)[:, None])


# ----------------------------------------------------------------------------------------- concurrency, aliasing

def _rms_ref(x, g):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * g.astype(np.float64)


@pytest.mark.parametrize("name,make,bound", [
    ("matmul", lambda: ([randn((3, 40), seed=1), randn((40, 50), seed=2)], (3, 50), {}),
     lambda ins: matmul_bound(ins[0], ins[1])),
    ("rmsnorm", lambda: ([randn((9, 32), seed=1), randn((32,), seed=2)], (9, 32), {}),
     lambda ins: rmsnorm_bound(ins[0], _rms_ref(*ins))),
    ("attention", lambda: ([randn((2, 4, 3, 8), seed=1), randn((2, 2, 6, 8), seed=2), randn((2, 2, 6, 8), seed=3)],
                           (2, 4, 3, 8), {"causal": True}),
     lambda ins: attention_bound(scores_abs_max(ins[0], ins[1]), 8, 6,
                                 ref_attention(ins[0], ins[1], np.abs(ins[2]), causal=True))),
    ("add", lambda: ([randn((5, 1, 7), seed=1), randn((3, 7), seed=2)], (5, 3, 7), {}),
     lambda ins: 0.0),                                                # one rounding per element: exact
])
def test_blocks_run_concurrently(name, make, bound):
    """Any block split computes the serial result, up to the order a float32 reduction sums in: both
    are within the rounding bound of the exact value, so they differ by at most twice it."""
    ins, shape, attrs = make()
    ins = frozen(ins)
    k = lookup(name)
    serial = np.zeros(shape, np.float32)
    k.run(BlockCtx(0, 1, 0), ins, [serial], attrs)
    tol2 = 2 * np.asarray(bound(ins))
    for bd in (4, 7, 64):
        out = np.full(shape, np.nan, np.float32)
        with ThreadPoolExecutor(max_workers=bd) as ex:
            list(ex.map(lambda b: k.run(BlockCtx(b, bd, 0), ins, [out], attrs), range(bd)))
        assert_within(out, serial, tol2, f"{name} in {bd} blocks vs 1")


@pytest.mark.parametrize("bd", [1, 3])
def test_output_may_alias_input(bd):
    """out and x at the same address (in-place) for elementwise, softmax, norms and rope."""
    def inplace(name, x, others, attrs):
        x = x.copy()
        for b in range(bd):
            lookup(name).run(BlockCtx(b, bd, 0), [x] + others, [x], attrs)
        return x

    x, g = randn((4, 8), seed=1), randn((8,), seed=2)
    x64 = x.astype(np.float64)
    close(inplace("add", x, [g], {"alpha": 2.0}), x64 + 2 * g)
    close(inplace("silu", x, [], {}), x64 / (1 + np.exp(-x64)))
    sm = ref_softmax(x64, -1)
    close(inplace("softmax", x, [], {}), sm, bound=softmax_bound(x, -1, sm))
    rms = _rms_ref(x, g)
    close(inplace("rmsnorm", x, [g], {}), rms, bound=rmsnorm_bound(x, rms))
    xr, pos = randn((1, 3, 2, 8), seed=3), np.arange(3)
    close(inplace("rope", xr, [pos], {}), ref_rope(xr, pos, 10000.0, "half"))


# ----------------------------------------------------------------------------------------- check rejects


IFA_ATTRS = {"num_heads": 9, "num_key_value_heads": 3, "key_head_offset": 9, "value_head_offset": 12}

BAD = [
    ("add", [((3, 4), F)], [((3, 4), F)], {}, "input"),                                  # input count
    ("add", [((3, 4), F), ((3, 4), F)], [], {}, "output"),                               # output count
    ("add", [((3, 4), F), ((5, 4), F)], [((3, 4), F)], {}, "broadcast"),
    ("add", [((3, 4), F), ((4,), F)], [((4,), F)], {}, "shape"),                         # wrong out shape
    ("add", [((3, 4), F), ((3, 4), H)], [((3, 4), F)], {}, "dtype"),
    ("add", [((3, 4), I32), ((3, 4), I32)], [((3, 4), I32)], {"alpha": 0.5}, "alpha"),
    ("div", [((3,), I32), ((3,), I32)], [((3,), I32)], {}, "dtype"),
    ("sub", [((3,), F), ((3,), F)], [((3,), H)], {}, "dtype"),
    ("add_scalar", [((3,), F)], [((3,), F)], {}, "value"),
    ("mul_scalar", [((3,), I32)], [((3,), I32)], {"value": 1.5}, "integer"),
    ("gelu", [((3,), F)], [((3,), F)], {"approximate": "fast"}, "approximate"),
    ("exp", [((3,), I32)], [((3,), I32)], {}, "dtype"),
    ("relu", [((3,), F)], [((4,), F)], {}, "shape"),
    ("swiglu", [((3, 4), F), ((1, 4), F)], [((3, 4), F)], {}, "same shape"),
    ("softmax", [((3, 4), F)], [((3, 4), F)], {"axis": 2}, "axis"),
    ("softmax", [((3, 4), F)], [((3, 4), F)], {"axis": "last"}, "axis"),
    ("softmax", [((3, 4), I32)], [((3, 4), I32)], {}, "dtype"),
    ("layernorm", [((3, 4), F), ((4,), F)], [((3, 4), F)], {}, "input"),
    ("layernorm", [((3, 4), F), ((3,), F), ((4,), F)], [((3, 4), F)], {}, "gamma"),
    ("rmsnorm", [((3, 4), F), ((4,), I32)], [((3, 4), F)], {}, "gamma"),
    ("rmsnorm", [((3, 4), F), ((4,), F)], [((3, 4), F)], {"eps": -1.0}, "eps"),
    ("matmul", [((3, 4), F), ((5, 6), F)], [((3, 6), F)], {}, "inner"),
    ("matmul", [((3, 4), F), ((4, 6), F)], [((3, 5), F)], {}, "shape"),
    ("matmul", [((3, 4), F), ((6, 4), F)], [((3, 6), F)], {}, "inner"),                  # needs transpose_b
    ("matmul", [((3, 4), F), ((4, 6), F), ((5,), F)], [((3, 6), F)], {}, "bias"),
    ("matmul", [((3, 4), F), ((4, 6), H)], [((3, 6), F)], {}, "dtype"),
    ("matmul", [((2, 3, 4), F), ((4, 6), F)], [((2, 3, 6), F)], {}, "dim"),
    ("matmul", [((3, 4), I32), ((4, 6), I32)], [((3, 6), I32)], {}, "dtype"),
    ("batch_matmul", [((2, 3, 4), F), ((3, 4, 5), F)], [((2, 3, 5), F)], {}, "batch"),
    ("batch_matmul", [((2, 3, 4), F), ((2, 5, 6), F)], [((2, 3, 6), F)], {}, "inner"),
    ("batch_matmul", [((2, 3, 4), F), ((2, 4, 5), F)], [((2, 3, 5), F)], {"transpose_a": True}, "inner"),
    ("embedding", [((10, 4), F), ((3,), F)], [((3, 4), F)], {}, "ids"),
    ("embedding", [((10, 4), F), ((3,), I32)], [((3, 5), F)], {}, "shape"),
    ("embedding", [((10,), F), ((3,), I32)], [((3,), F)], {}, "table"),
    ("transpose", [((3, 4), F)], [((4, 3), F)], {"perm": (0, 0)}, "perm"),
    ("transpose", [((3, 4), F)], [((3, 4), F)], {"perm": (1, 0)}, "shape"),
    ("transpose", [((3, 4), F)], [((4, 3), F)], {}, "perm"),
    ("cast", [((3, 4), F)], [((4, 3), H)], {}, "shape"),
    ("fill", [((3,), F)], [((3,), F)], {"value": 1.0}, "input"),
    ("fill", [], [((3,), I32)], {"value": 0.5}, "integer"),
    ("fill", [], [((3,), "int8")], {"value": 1000}, "range"),
    ("copy", [((3,), F)], [((3,), H)], {}, "dtype"),
    ("rope", [((1, 2, 3, 4), F), ((2,), F)], [((1, 2, 3, 4), F)], {}, "positions"),
    ("rope", [((1, 2, 3, 4), F), ((3,), I32)], [((1, 2, 3, 4), F)], {}, "positions"),
    ("rope", [((1, 2, 3, 5), F), ((2,), I32)], [((1, 2, 3, 5), F)], {}, "even"),
    ("rope", [((2, 3, 4), F), ((2,), I32)], [((2, 3, 4), F)], {}, "dim"),
    ("rope", [((1, 2, 3, 4), F), ((2,), I32)], [((1, 2, 3, 4), F)], {"style": "neox"}, "style"),
    ("attention", [((1, 3, 2, 4), F), ((1, 2, 5, 4), F), ((1, 2, 5, 4), F)], [((1, 3, 2, 4), F)], {}, "multiple"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 3), F), ((1, 2, 5, 3), F)], [((1, 2, 2, 3), F)], {}, "head dim"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 4), F), ((1, 2, 6, 4), F)], [((1, 2, 2, 4), F)], {}, "v shape"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 4), F), ((1, 2, 5, 4), F)], [((1, 2, 2, 5), F)], {}, "shape"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 4), F), ((1, 2, 5, 4), F), ((1, 3, 2, 5), F)],
     [((1, 2, 2, 4), F)], {}, "mask"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 4), H), ((1, 2, 5, 4), F)], [((1, 2, 2, 4), F)], {}, "dtype"),
    ("attention", [((1, 2, 2, 4), F), ((1, 2, 5, 4), F), ((1, 2, 5, 4), F)], [((1, 2, 2, 4), F)],
     {"causal": "yes"}, "causal"),
    ("scatter_update", [((2, 4), F)], [((5, 4), F)], {}, "input"),
    ("scatter_update", [((2, 4), F), ((2,), F)], [((5, 4), F)], {}, "indices dtype"),
    ("scatter_update", [((2, 4), F), ((2, 1), I32)], [((5, 4), F)], {}, "indices must have 1"),
    ("scatter_update", [((2, 4), F), ((3,), I32)], [((5, 4), F)], {}, "indices length 3"),
    ("scatter_update", [((2, 4), H), ((2,), I32)], [((5, 4), F)], {}, "dtype"),
    ("scatter_update", [((2, 4), F), ((2,), I64)], [((5, 3), F)], {}, "row shape"),
    ("scatter_update", [((2, 4), F), ((2,), I64)], [((5, 2, 2), F)], {}, "row shape"),
    ("scatter_update", [((), F), ((1,), I64)], [((5,), F)], {}, "updates must have at least 1"),
] + [("incre_flash_attention", ins, outs, dict(IFA_ATTRS, **a), m) for ins, outs, a, m in [
    ([((1, 15, 8), F), ((6, 1, 15, 8), F)], [((1, 9, 8), F)], {}, "input"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), F)], [((1, 9, 8), F)], {}, "actual_seq_lengths dtype"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((2,), I32)], [((1, 9, 8), F)], {}, "actual_seq_lengths shape"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32), ((1,), H)], [((1, 9, 8), F)], {}, "kv_padding dtype"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32), ((1, 1), I32)], [((1, 9, 8), F)], {}, "kv_padding shape"),
    ([((1, 1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {}, "query must have 3"),
    ([((1, 15, 8), F), ((6, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {}, "cache must have 4"),
    ([((1, 15, 8), F), ((6, 2, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {}, "batch"),
    ([((1, 15, 8), F), ((6, 1, 15, 4), F), ((1,), I32)], [((1, 9, 8), F)], {}, "head dim"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), H), ((1,), I32)], [((1, 9, 8), F)], {}, "dtype"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), H)], {}, "dtype"),
    ([((1, 15, 8), I32), ((6, 1, 15, 8), I32), ((1,), I32)], [((1, 9, 8), I32)], {}, "query dtype"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 4), F)], {}, "output shape"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"num_heads": None}, "num_heads"),
    ([((1, 8, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {}, "num_heads"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"num_key_value_heads": 2},
     "num_key_value_heads"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"key_head_offset": 13},
     "key_head_offset"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"value_head_offset": -1},
     "value_head_offset"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"value_head_offset": 1.0},
     "value_head_offset"),
    ([((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)], {"scale": "big"}, "scale"),
]] + [
    ("incre_flash_attention", [((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)],
     {k: v for k, v in IFA_ATTRS.items() if k != "num_heads"}, "'num_heads' is required"),
    ("incre_flash_attention", [((1, 15, 8), F), ((6, 1, 15, 8), F), ((1,), I32)], [((1, 9, 8), F)],
     {k: v for k, v in IFA_ATTRS.items() if k != "value_head_offset"}, "'value_head_offset' is required"),
    ("reduce_sum", [((3, 4), F)], [((3,), F)], {"axis": 0}, "shape"),
    ("reduce_sum", [((3, 4), F)], [((4,), F)], {"axis": (0, 0)}, "repeats"),
    ("reduce_max", [((3, 4), F)], [((3,), F)], {"axis": 5}, "axis"),
    ("reduce_mean", [((3, 4), I32)], [((3,), I32)], {"axis": 1}, "dtype"),
    ("reduce_max", [((3, 0), F)], [((3,), F)], {"axis": 1}, "empty"),
    ("argmax", [((3, 4), F)], [((3,), F)], {}, "output dtype"),
    ("argmax", [((3, 4), F)], [((4,), I64)], {}, "shape"),
    ("argmax", [((3, 4), F)], [((3,), I64)], {"axis": 2}, "axis"),
]


@pytest.mark.parametrize("name,ins,outs,attrs,match", BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD)])
def test_check_rejects(name, ins, outs, attrs, match):
    check_fails(name, ins, outs, attrs, match)


def test_parallel_dims():
    """What blocks split over, as the scheduler sees it (default_block_dim caps block_dim by this)."""
    def pd(name, ins, outs, attrs=None):
        return lookup(name).parallel_dim(out_descs(ins), out_descs(outs), attrs or {})

    assert pd("add", [((2, 3, 4), F), ((4,), F)], [((2, 3, 4), F)]) == 24           # output elements
    assert pd("rmsnorm", [((2, 3, 64), F), ((64,), F)], [((2, 3, 64), F)]) == 6      # rows
    assert pd("softmax", [((2, 3, 5), F)], [((2, 3, 5), F)], {"axis": 1}) == 10      # rows along the axis
    assert pd("matmul", [((128, 64), F), ((64, 32), F)], [((128, 32), F)]) == 128    # M
    assert pd("matmul", [((1, 64), F), ((64, 32), F)], [((1, 32), F)]) == 32         # N when N > M
    assert pd("batch_matmul", [((2, 3, 4, 5), F), ((2, 3, 5, 6), F)], [((2, 3, 4, 6), F)]) == 6
    assert pd("attention", [((2, 8, 1, 4), F), ((2, 2, 9, 4), F), ((2, 2, 9, 4), F)], [((2, 8, 1, 4), F)]) == 16
    assert pd("rope", [((2, 5, 3, 8), F), ((5,), I64)], [((2, 5, 3, 8), F)]) == 10
    assert pd("embedding", [((10, 4), F), ((2, 3), I32)], [((2, 3, 4), F)]) == 6
    assert pd("scatter_update", [((3, 8), F), ((3,), I32)], [((50, 8), F)]) == 3              # the updates
    assert pd("incre_flash_attention", [((2, 15, 8), F), ((50, 2, 15, 8), F), ((2,), I32)], [((2, 9, 8), F)],
              IFA_ATTRS) == 6                                                             # B * kv heads
    assert pd("reduce_sum", [((4, 5, 6), F)], [((4, 6), F)], {"axis": 1}) == 24
    assert pd("argmax", [((3, 100), F)], [((3,), I64)]) == 3
