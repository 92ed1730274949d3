"""The activation functions kernels share, in numpy: ``fn(x, out=)`` (alias-safe: ``out`` may be ``x``).

The plain forms compute in the input's dtype; the upper-case ones (:data:`GELU`, :data:`SILU`,
:data:`SWIGLU`, :data:`ERF`, :data:`SIGMOID`) compute float16 in float32.  :data:`ACTIVATIONS` are the
epilogues a fused kernel (``fused_matmul``, ``conv2d``) applies to its output in place.
"""
from __future__ import annotations

import math

import numpy as np

from .precision import upcast


# gelu with exact erf: gelu(x) = x * Phi(x) = relu(x) - |x| * Phi(-|x|), Phi(-a) = erfc(a / sqrt 2) / 2.
# erfc by the Chebyshev-fitted form of Numerical Recipes (erfcc, fractional error < 1.2e-7 everywhere),
# so gelu keeps its relative accuracy in the negative tail and the absolute error stays below 1e-6.
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
         1.48851587, -0.82215223, 0.17087277)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def gelu_erf(x, out):
    """out = gelu(x) with erf (Abramowitz-Stegun 7.1.26 erfc, |err| < 1.2e-7), elementwise in numpy."""
    a = np.abs(x)
    t = np.multiply(a, 0.5 * _INV_SQRT2)
    t += 1.0
    np.reciprocal(t, out=t)                      # t = 1 / (1 + z/2), z = |x|/sqrt 2
    p = np.multiply(t, _ERFC[9])
    for c in _ERFC[8:0:-1]:
        p += c
        p *= t
    p += _ERFC[0]
    z2 = np.multiply(a, a)
    z2 *= 0.5
    p -= z2
    np.exp(p, out=p)
    p *= t                                       # erfc(z)
    p *= a
    p *= 0.5                                     # |x| * Phi(-|x|)
    np.maximum(x, 0, out=out)
    np.subtract(out, p, out=out)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x, out):
    """out = gelu(x), tanh approximation."""
    u = np.multiply(x, x)
    u *= 0.044715
    u += 1.0
    u *= x
    u *= _SQRT_2_OVER_PI
    np.tanh(u, out=u)
    u += 1.0
    u *= 0.5
    np.multiply(x, u, out=out)


def silu(x, out):
    """out = x * sigmoid(x)."""
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1.0
    np.divide(x, t, out=out)


def relu(x, out):
    """out = max(x, 0)."""
    np.maximum(x, 0, out=out)


def swiglu(g, u, out):
    """out = silu(g) * u."""
    t = np.negative(g)
    np.exp(t, out=t)
    t += 1.0
    np.divide(g, t, out=t)
    np.multiply(t, u, out=out)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def erf(x, out):
    """erf with relative error ~1e-7: a Maclaurin series below |x| = 0.5 (8 terms, truncation < 1e-11),
    1 - erfc(|x|) with the Chebyshev-fitted erfc above (fractional error < 1.2e-7, i.e. absolute error
    < 6e-8 there)."""
    a = np.abs(x)
    t = np.multiply(a, 0.5)
    t += 1.0
    np.reciprocal(t, out=t)                      # t = 1 / (1 + |x|/2)
    p = np.multiply(t, _ERFC[9])
    for c in _ERFC[8:0:-1]:
        p += c
        p *= t
    p += _ERFC[0]
    p -= np.multiply(a, a)
    np.exp(p, out=p)
    p *= t                                       # erfc(|x|)
    np.subtract(1.0, p, out=p)                   # erf(|x|)
    small = a < 0.5
    if small.any():
        xs = a[small]
        x2 = xs * xs
        term = xs.copy()
        acc = xs.copy()
        for n in range(1, 8):                    # sum (-1)^n x^(2n+1) / (n! (2n+1))
            term *= -x2 / n
            acc += term / (2 * n + 1)
        p[small] = acc * _TWO_OVER_SQRT_PI
    np.copysign(p, x, out=out)


def sigmoid(x, out):
    """1 / (1 + e^-x), computed from e^-|x| so neither tail overflows."""
    e = np.negative(np.abs(x))
    np.exp(e, out=e)                             # e^-|x| in (0, 1]
    d = e + 1.0
    pos = np.divide(1.0, d)
    np.divide(e, d, out=d)                       # the x < 0 branch: e^x / (1 + e^x)
    np.copyto(out, np.where(x >= 0, pos, d))


#: the same functions computing float16 in float32 (one rounding into the output)
GELU = {"none": upcast(gelu_erf), "tanh": upcast(gelu_tanh)}
SILU = upcast(silu)
SWIGLU = upcast(swiglu)
ERF = upcast(erf)
SIGMOID = upcast(sigmoid)


def _relu_inplace(o):
    np.maximum(o, 0, out=o)


#: activations a fused kernel applies to its output in place (alias-safe functions)
ACTIVATIONS = {
    "none": None,
    "relu": _relu_inplace,
    "gelu": lambda o: GELU["none"](o, out=o),
    "gelu_tanh": lambda o: GELU["tanh"](o, out=o),
    "tanh": lambda o: np.tanh(o, out=o),
    "sigmoid": lambda o: SIGMOID(o, out=o),
}
ACT_FLOPS = {"none": 0, "relu": 1, "gelu": 30, "gelu_tanh": 10, "tanh": 6, "sigmoid": 5}


def apply_activation(o, name) -> None:
    """Apply :data:`ACTIVATIONS` ``name`` to ``o`` in place."""
    fn = ACTIVATIONS[name]
    if fn is not None and o.size:
        fn(o)
