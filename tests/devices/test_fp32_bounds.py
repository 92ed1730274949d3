"""The float32 error bounds the kernel tests compare with (tests/fp32.py): they hold for every summation
order a kernel or BLAS may use, and they are tight enough that a wrong result is outside them."""
from __future__ import annotations

import numpy as np
import pytest

from fp32 import U, assert_within, gamma, matmul_bound, softmax_bound, sum_bound


def _orders(x: np.ndarray) -> list[np.float32]:
    """The same float32 sum in several orders: numpy's pairwise, left to right, right to left, in blocks."""
    left = np.float32(0)
    for v in x:
        left = np.float32(left + v)
    right = np.float32(0)
    for v in x[::-1]:
        right = np.float32(right + v)
    blocks = np.float32(sum((np.float32(c.sum(dtype=np.float32)) for c in np.array_split(x, 7)), np.float32(0)))
    return [np.float32(x.sum(dtype=np.float32)), left, right, blocks]


@pytest.mark.parametrize("seed", range(5))
def test_sum_bound_holds_for_every_order_and_catches_a_lost_term(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(2000) * rng.choice([1e-3, 1.0, 1e3], 2000)).astype(np.float32)
    exact = x.astype(np.float64).sum()
    bound = sum_bound(x)
    for s in _orders(x):
        assert_within(s, exact, bound)
    lost = np.float32(np.delete(x, np.argmax(np.abs(x))).sum(dtype=np.float32))   # one term dropped
    with pytest.raises(AssertionError, match="outside the float32 error bound"):
        assert_within(lost, exact, bound)


def test_matmul_bound_holds_for_a_split_inner_dimension_and_catches_a_wrong_element():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 400)).astype(np.float32), rng.standard_normal((400, 50)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = matmul_bound(a, b)
    split = (a[:, :137] @ b[:137] + a[:, 137:] @ b[137:]).astype(np.float32)        # a blocked K
    for got in (a @ b, split):
        assert_within(got, exact, bound)
    assert_within(a @ b, split, 2 * bound)                                          # two orders: twice
    wrong = (a @ b).copy()
    wrong[1, 7] += np.float32(0.01 * abs(exact[1, 7]) + 1e-3)
    with pytest.raises(AssertionError, match=r"worst at \(1, 7\)"):
        assert_within(wrong, exact, bound)


def test_softmax_bound_holds_and_zero_for_masked_terms():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((6, 33)) * 4).astype(np.float32)
    x[0, :5] = -np.inf
    e = np.exp(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True))
    exact = e / e.sum(-1, keepdims=True)
    ex32 = np.exp(x - x.max(-1, keepdims=True))
    got = ex32 / ex32.sum(-1, keepdims=True)
    bound = softmax_bound(x, -1, exact)
    assert_within(got, exact, bound)
    assert (bound[0, :5] == 0).all()


def test_gamma():
    assert gamma(1) == pytest.approx(U, rel=1e-6)
    assert gamma(1000) > 1000 * U
    with pytest.raises(ValueError):
        gamma(1 / U)
