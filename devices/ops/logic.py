"""Comparisons and logic with numpy broadcasting: ``less``, ``less_equal``, ``greater``, ``greater_equal``,
``not_equal`` (two inputs of one dtype, a bool output; ``equal`` lives in :mod:`.elementwise`),
``logical_and``, ``logical_or``, ``logical_xor`` (bool inputs) and ``logical_not``.

Blocks split the output's elements in row-major order; every kernel is safe when its output aliases an
input of the same dtype.
"""
from __future__ import annotations

import numpy as np

from ..registry import builtin
from .blocks import apply_elementwise, out_numel
from .checks import ANY, arity, broadcast_shape, dtype_in, same_dtype, shape_is, unary_operands
from .precision import quiet
from .work import vector_work

BOOL = ("bool",)


def _check_compare(name, kinds):
    def check(inputs, outputs, attrs):
        arity(name, inputs, outputs, 2)
        a, b, o = inputs[0], inputs[1], outputs[0]
        dtype_in(name, a, kinds, "input")
        same_dtype(name, ("input 0", a), ("input 1", b))
        dtype_in(name, o, BOOL, "output")
        shape_is(name, o, broadcast_shape(name, a.shape, b.shape))
    return check


def _compare_kernel(name, ufunc, kinds=ANY):
    def run(ctx, inputs, outputs, attrs):
        apply_elementwise(ctx, ufunc, inputs, outputs[0])
    run.__doc__ = f"{ufunc.__name__}(a, b) elementwise with broadcasting; the output is bool"
    builtin(name, unit="vector", check=_check_compare(name, kinds), work=vector_work(1),
            parallel_dim=out_numel)(quiet(run))


_compare_kernel("less", np.less)
_compare_kernel("less_equal", np.less_equal)
_compare_kernel("greater", np.greater)
_compare_kernel("greater_equal", np.greater_equal)
_compare_kernel("not_equal", np.not_equal)
_compare_kernel("logical_and", np.logical_and, BOOL)
_compare_kernel("logical_or", np.logical_or, BOOL)
_compare_kernel("logical_xor", np.logical_xor, BOOL)


def _check_not(inputs, outputs, attrs):
    x, o = unary_operands("logical_not", inputs, outputs, BOOL)
    shape_is("logical_not", o, x.shape)


@builtin("logical_not", unit="vector", check=_check_not, work=vector_work(1), parallel_dim=out_numel)
def _not_run(ctx, inputs, outputs, attrs):
    """not x (bool)"""
    apply_elementwise(ctx, np.logical_not, inputs, outputs[0])
