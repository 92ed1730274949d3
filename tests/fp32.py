"""Error bounds for float32 results, so that a test's tolerance follows the computation it checks.

A float32 reduction's rounding depends on its order: a kernel split into blocks, a BLAS call on a
different shape, a collective over a different ring or a tensor-parallel split all sum the same terms in
another order.  A fixed ``atol=1e-6`` is then either too tight (flaky) or, for large results, too loose.
These helpers give the classic a-priori bounds instead (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., sec. 3.1):

    |fl(sum x_i) - sum x_i|    <= gamma(n) * sum |x_i|
    |fl(a @ b) - a @ b|         <= gamma(k) * (|a| @ |b|)          (elementwise, k = inner dimension)
    gamma(n) = n u / (1 - n u),   u = eps / 2 = 2**-24

plus a few roundings (``extra``) for the elementwise steps around a reduction (a bias add, a scale, a
division, exp with its few-ulp error).  The bounds hold whatever the summation order, so they never
flake, and they stay small relative to the terms, so a wrong result (a missed block, a wrong index) is
still far outside them.  Comparisons against a float64 reference use one bound; two float32 results of
the same computation in different orders differ by at most twice it.
"""
from __future__ import annotations

import math

import numpy as np

EPS = float(np.finfo(np.float32).eps)       #: 2**-23
U = EPS / 2                                 #: unit roundoff of float32 (round to nearest)
EXP_ULPS = 4                                #: numpy's float32 exp is within 4 ulp (its SIMD loops' bound)


def gamma(n: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of n successive float32 roundings."""
    nu = float(n) * U
    if nu >= 1:
        raise ValueError(f"gamma({n}) is unbounded in float32")
    return nu / (1 - nu)


def _abs64(x) -> np.ndarray:
    return np.abs(np.asarray(x, dtype=np.float64))


def assert_within(got, want, bound, what: str = "") -> None:
    """``|got - want| <= bound`` elementwise (NaN never passes); the report names the worst element."""
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), np.broadcast_shapes(got64.shape, want64.shape))
    err = np.abs(got64 - want64)
    ok = err <= bound
    if not ok.all():
        excess = np.where(ok, -np.inf, np.nan_to_num(err - bound, nan=np.inf))
        i = np.unravel_index(int(np.argmax(excess)), excess.shape)
        raise AssertionError(f"{what + ': ' if what else ''}{int((~ok).sum())} of {ok.size} element(s) outside "
                             f"the float32 error bound; worst at {tuple(int(j) for j in i)}: got "
                             f"{np.broadcast_to(got64, ok.shape)[i]!r}, want {np.broadcast_to(want64, ok.shape)[i]!r}, "
                             f"|err| {err[i]:.3g} > bound {bound[i]:.3g}")


# ---------------------------------------------------------------------------------------------- bounds
def matmul_bound(a, b, bias=None, extra: int = 2) -> np.ndarray:
    """Bound on ``|fl32(a @ b [+ bias]) - (a @ b [+ bias])|`` (``np.matmul`` broadcasting): gamma(k +
    extra) * (|a| @ |b| + |bias|)."""
    a, b = _abs64(a), _abs64(b)
    k = a.shape[-1]
    mag = np.matmul(a, b)
    if bias is not None:
        mag = mag + _abs64(bias)
    return gamma(k + extra) * mag


def sum_bound(x, axis=None, keepdims: bool = False, extra: int = 2) -> np.ndarray:
    """Bound on a float32 sum (or mean: the division is one of the ``extra`` roundings) of ``x`` over
    ``axis``: gamma(n + extra) * sum |x| (scaled like the result: mean -> divide by n yourself)."""
    a = _abs64(x)
    n = a.size if axis is None else int(np.prod([a.shape[i] for i in np.atleast_1d(axis)]))
    return gamma(n + extra) * a.sum(axis=axis, keepdims=keepdims)


def softmax_bound(x, axis: int, want) -> np.ndarray:
    """Bound on float32 softmax over ``axis`` (``want`` the exact result): each term's relative error
    is at most (|x_i - max| + 1) u from the subtraction (exp turns the argument's absolute error into
    a relative one), EXP_ULPS ulp from exp, gamma(n) from the sum and one rounding from the division.
    Masked (-inf) entries are exact zeros."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    m = np.max(np.where(finite, x, -np.inf), axis=axis, keepdims=True)
    spread = np.where(finite, np.abs(x - np.where(np.isfinite(m), m, 0.0)), 0.0)
    n = x.shape[axis]
    rel = (spread.max(axis=axis, keepdims=True) + 1) * U + 2 * EXP_ULPS * U + gamma(n + 2)
    return rel * _abs64(want)


def rmsnorm_bound(x, want, extra: int = 6) -> np.ndarray:
    """Bound on float32 ``x / sqrt(mean(x**2) + eps) * g`` over the last axis: the mean of squares
    (positive terms) is within gamma(n + 2) relatively, the square root halves that, and the division
    and the scaling add a few roundings: gamma(n + extra) * |result|."""
    n = np.asarray(x).shape[-1]
    return gamma(n + extra) * _abs64(want)


def layernorm_bound(x, g, b, eps: float, extra: int = 4) -> np.ndarray:
    """Bound on float32 ``(x - mean) / sqrt(var + eps) * g + b`` over the last axis.  Centring cancels,
    so the mean's error (gamma(n + 2) * mean|x|) is an absolute error of every centred value; it and the
    variance's own rounding (gamma(n + 3), a sum of squares) reach sigma; everything is scaled by
    |g| / sigma, and the last multiply and add round once more each."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    c = x - x.mean(-1, keepdims=True)
    ac = np.abs(c)
    sigma = np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    mean_err = gamma(n + 2) * np.abs(x).mean(-1, keepdims=True)
    var_err = gamma(n + 3) * (c * c).mean(-1, keepdims=True) + 2 * mean_err * ac.mean(-1, keepdims=True) \
        + mean_err ** 2
    sigma_rel = var_err / (2 * sigma ** 2) + gamma(2)
    normed_err = (mean_err + gamma(2) * ac) / sigma + ac / sigma * sigma_rel
    ag = _abs64(g)
    return ag * normed_err * (1 + gamma(extra)) + gamma(extra) * (ac / sigma * ag + _abs64(b))


def attention_bound(scores_abs_max: float, d: int, skv: int, want_abs_v) -> np.ndarray:
    """Bound on float32 attention ``softmax(q k^T * scale + mask) @ v``.

    ``scores_abs_max`` bounds ``scale * |q| @ |k|^T`` (so every score's rounding is within gamma(d + 2)
    of it, and the softmax's spread within twice it); ``want_abs_v`` is the exact attention of the same
    q, k over ``|v|`` (the weights' magnitude times |v|).  Errors: the scores' absolute error becomes a
    relative error of the weights (twice: the term and the normaliser), the softmax itself (see
    :func:`softmax_bound`), and the weighted sum over ``skv`` values."""
    score_err = gamma(d + 2) * scores_abs_max
    rel = 2 * score_err + (2 * scores_abs_max + 1) * U + 2 * EXP_ULPS * U + gamma(skv + 2) + gamma(skv + 1)
    return rel * _abs64(want_abs_v)


def scores_abs_max(q, k, scale: float | None = None, mask=None) -> float:
    """max over every (query row, key row) pair of ``scale * |q_i| . |k_j|`` (+ max |mask|): a bound of
    every attention score's magnitude (GQA head grouping ignored: all pairs are included)."""
    q, k = _abs64(q), _abs64(k)
    d = q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else abs(scale)
    top = float((q.reshape(-1, d) @ k.reshape(-1, d).T).max()) * scale
    if mask is not None:
        m = np.asarray(mask, dtype=np.float64)
        top += float(np.abs(m[np.isfinite(m)]).max(initial=0.0))
    return top
