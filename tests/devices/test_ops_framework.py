"""Unit tests of the kernels a framework's tensors need (runtime.torch): strided_gather / strided_scatter
(views of a flat buffer), the comparison and logic family, cumsum, sin/cos/log/abs, maximum/minimum.

Same harness as tests/devices/test_ops.py for the kernels that write every output element (every block of
several block_dims; no element written twice or never).  strided_scatter writes in place only the view's
elements, so its test runs the blocks over one buffer and checks the rest kept its bytes.  References are
numpy (as_strided views, ufuncs) in float64 where it matters."""
from __future__ import annotations

import numpy as np
import pytest

from devices.errors import InvalidParamError
from devices.kernel import BlockCtx, lookup
from test_ops import check_fails, randn, run1

BLOCK_DIMS = [1, 3, 7]


def view(buf, size, stride, off):
    return np.lib.stride_tricks.as_strided(buf[off:], shape=size, strides=tuple(s * buf.itemsize for s in stride))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("size,stride,off", [((4, 6), (1, 4), 0), ((3, 2, 2), (8, 1, 4), 3), ((5,), (0,), 7),
                                             ((), (), 11), ((2, 0, 3), (3, 1, 1), 0)])
def test_strided_gather_matches_as_strided(bd, size, stride, off):
    buf = np.arange(40, dtype=np.float32) * 1.5
    got = run1("strided_gather", [buf], size, np.float32, {"size": size, "stride": stride, "offset": off}, bd)
    np.testing.assert_array_equal(got, view(buf, size, stride, off))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_strided_scatter_writes_only_the_view(bd):
    size, stride, off = (3, 4), (1, 5), 2            # a transposed, offset window of a 20-element buffer
    buf = np.full(20, -7, np.int64)
    src = np.arange(12, dtype=np.int64).reshape(size)
    k = lookup("strided_scatter")
    attrs = {"size": size, "stride": stride, "offset": off}
    for b in range(bd):
        k.run(BlockCtx(b, bd, 0), [src], [buf], attrs)
    want = np.full(20, -7, np.int64)
    view(want, size, stride, off)[...] = src
    np.testing.assert_array_equal(buf, want)


def test_strided_view_outside_the_buffer_is_refused():
    check_fails("strided_gather", [((10,), "float32")], [((4, 3), "float32")],
                {"size": (4, 3), "stride": (3, 1), "offset": 0}, match="reaches element 11 of a 10-element")
    check_fails("strided_scatter", [((2,), "float32")], [((4,), "float32")],
                {"size": (2,), "stride": (-1,), "offset": 3}, match="non-negative")
    with pytest.raises(InvalidParamError):
        lookup("strided_gather").check((), (), {})


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("name,ufunc", [("less", np.less), ("less_equal", np.less_equal), ("greater", np.greater),
                                        ("greater_equal", np.greater_equal), ("not_equal", np.not_equal)])
def test_comparisons_broadcast_to_bool(bd, name, ufunc):
    a = np.round(randn((4, 5), seed=1), 1)
    b = np.round(randn((1, 5), seed=2), 1)
    b[0, 0] = a[0, 0]                                       # one tie
    got = run1(name, [a, b], (4, 5), np.bool_, None, bd)
    np.testing.assert_array_equal(got, ufunc(a, b))


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_logic(bd):
    a = randn((3, 7), seed=3) > 0
    b = randn((7,), seed=4) > 0
    for name, fn in (("logical_and", np.logical_and), ("logical_or", np.logical_or), ("logical_xor", np.logical_xor)):
        np.testing.assert_array_equal(run1(name, [a, b], (3, 7), np.bool_, None, bd), fn(a, b))
    np.testing.assert_array_equal(run1("logical_not", [a], (3, 7), np.bool_, None, bd), ~a)
    check_fails("logical_and", [((3,), "float32"), ((3,), "float32")], [((3,), "bool")], match="dtype")


@pytest.mark.parametrize("bd", BLOCK_DIMS)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum(bd, dtype):
    x = (randn((3, 9, 4), seed=5) * 10).astype(dtype)
    for axis in (0, 1, -1):
        want = np.cumsum(x.astype(np.float64), axis=axis)
        got = run1("cumsum", [x], x.shape, dtype, {"axis": axis}, bd)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * 9 * 10)    # 9 float32 additions of O(10)


@pytest.mark.parametrize("bd", BLOCK_DIMS)
def test_unary_math_and_minmax(bd):
    x = randn((6, 5), seed=6, scale=3.0)
    y = randn((5,), seed=7, scale=3.0)
    for name, fn in (("sin", np.sin), ("cos", np.cos), ("abs", np.abs)):
        np.testing.assert_allclose(run1(name, [x], x.shape, np.float32, None, bd), fn(x.astype(np.float64)),
                                   rtol=1e-6, atol=1e-6)
    pos = np.abs(x) + 0.1
    np.testing.assert_allclose(run1("log", [pos], x.shape, np.float32, None, bd), np.log(pos.astype(np.float64)),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(run1("maximum", [x, y], x.shape, np.float32, None, bd), np.maximum(x, y))
    np.testing.assert_array_equal(run1("minimum", [x, y], x.shape, np.float32, None, bd), np.minimum(x, y))
