"""Elementwise kernels: binary (add, sub, mul, div, pow, with numpy broadcasting), unary and scalar
(gelu, silu, relu, exp, tanh, sqrt, rsqrt, neg, erf, sigmoid, clip, add_scalar, mul_scalar, sin, cos, log,
abs), maximum, minimum, swiglu,
equal, where, and the per-element conversions cast, copy, fill.

Blocks split the output's elements in row-major order (:func:`~devices.ops.blocks.apply_elementwise`);
every kernel here is safe when its output aliases an input.
"""
from __future__ import annotations

import functools

import numpy as np

from ..registry import builtin
from .activations import ERF, GELU, SIGMOID, SILU, SWIGLU, relu
from .blocks import apply_elementwise, block_boxes, out_numel
from .checks import (ANY, FLOATS, NUMERIC, SIGNED, arity, broadcast_shape, choice_attr, dtype_in, need, same_dtype,
                     shape_is, unary_operands, value_for)
from .precision import quiet
from .work import vector_work


def _val_scalar(value, dtype):
    """``value`` as the Python scalar numpy combines with a ``dtype`` array without promotion."""
    return int(value) if np.dtype(dtype).kind in "iu" else float(value)


def _check_binary(name, kinds, alpha=False, same_shape=False):
    def check(inputs, outputs, attrs):
        arity(name, inputs, outputs, 2)
        a, b = inputs
        o = outputs[0]
        dtype_in(name, a, kinds, "input")
        same_dtype(name, ("input 0", a), ("input 1", b), ("output", o))
        if same_shape:
            need(tuple(a.shape) == tuple(b.shape), name,
                 f"inputs must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
            want = tuple(a.shape)
        else:
            want = broadcast_shape(name, a.shape, b.shape)
        shape_is(name, o, want)
        if alpha:
            value_for(name, "alpha", attrs.get("alpha", 1), a.dtype)
    return check


def _binary_kernel(name, ufunc, kinds, use_alpha=False, flops=1):
    def run(ctx, inputs, outputs, attrs):
        a, b = inputs
        out = outputs[0]
        alpha = attrs.get("alpha", 1) if use_alpha else 1
        if alpha == 1:
            apply_elementwise(ctx, ufunc, (a, b), out)
        else:
            al = _val_scalar(alpha, out.dtype)

            def fn(x, y, out):
                ufunc(x, np.multiply(y, al), out=out)   # temp for alpha*y: alias-safe when out is x
            apply_elementwise(ctx, fn, (a, b), out)
    run.__doc__ = f"{name}(a, b) with numpy broadcasting" + (" (out = a op alpha*b)" if use_alpha else "")
    builtin(name, unit="vector", check=_check_binary(name, kinds, alpha=use_alpha), work=vector_work(flops),
            parallel_dim=out_numel)(quiet(run))


_binary_kernel("add", np.add, NUMERIC, use_alpha=True)
_binary_kernel("sub", np.subtract, NUMERIC, use_alpha=True)
_binary_kernel("mul", np.multiply, NUMERIC)
_binary_kernel("div", np.divide, FLOATS)


def _check_unary(name, kinds, attrs_check=None):
    def check(inputs, outputs, attrs):
        x, o = unary_operands(name, inputs, outputs, kinds)
        shape_is(name, o, x.shape)
        if attrs_check is not None:
            attrs_check(name, x, attrs)
    return check


def _unary_kernel(name, make_fn, kinds, flops, attrs_check=None, doc=""):
    """Register ``name``; ``make_fn(attrs, dtype)`` returns ``fn(x, out=)`` (alias-safe)."""
    def run(ctx, inputs, outputs, attrs):
        apply_elementwise(ctx, make_fn(attrs, outputs[0].dtype), inputs, outputs[0])
    run.__doc__ = doc
    builtin(name, unit="vector", check=_check_unary(name, kinds, attrs_check), work=vector_work(flops),
            parallel_dim=out_numel)(quiet(run))


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.divide(1, out, out=out)


def _scalar_op(ufunc, value, x, out):
    ufunc(x, value, out=out)


def _gelu_attrs(name, x, attrs):
    choice_attr(name, attrs, "approximate", "none", ("none", "tanh"))


def _scalar_attrs(name, x, attrs):
    need("value" in attrs, name, "attr 'value' is required")
    value_for(name, "value", attrs["value"], x.dtype)


_unary_kernel("gelu", lambda attrs, dt: GELU[attrs.get("approximate", "none")], FLOATS, 30, _gelu_attrs,
              "GELU; attr approximate: 'none' (erf) or 'tanh'")
_unary_kernel("silu", lambda attrs, dt: SILU, FLOATS, 5, doc="x * sigmoid(x)")
_unary_kernel("relu", lambda attrs, dt: relu, SIGNED, 1, doc="max(x, 0)")
_unary_kernel("exp", lambda attrs, dt: np.exp, FLOATS, 4, doc="e**x")
_unary_kernel("tanh", lambda attrs, dt: np.tanh, FLOATS, 6, doc="tanh(x)")
_unary_kernel("sqrt", lambda attrs, dt: np.sqrt, FLOATS, 2, doc="sqrt(x)")
_unary_kernel("rsqrt", lambda attrs, dt: _rsqrt, FLOATS, 3, doc="1 / sqrt(x)")
_unary_kernel("neg", lambda attrs, dt: np.negative, SIGNED, 1, doc="-x")
_unary_kernel("add_scalar",
              lambda attrs, dt: functools.partial(_scalar_op, np.add, _val_scalar(attrs["value"], dt)),
              NUMERIC, 1, _scalar_attrs, "x + value")
_unary_kernel("mul_scalar",
              lambda attrs, dt: functools.partial(_scalar_op, np.multiply, _val_scalar(attrs["value"], dt)),
              NUMERIC, 1, _scalar_attrs, "x * value")


@builtin("swiglu", unit="vector", check=_check_binary("swiglu", FLOATS, same_shape=True), work=vector_work(6),
         parallel_dim=out_numel)
@quiet
def _swiglu_run(ctx, inputs, outputs, attrs):
    """silu(gate) * up (inputs gate, up of one shape)"""
    apply_elementwise(ctx, SWIGLU, inputs, outputs[0])


def _clip_attrs(name, x, attrs):
    for key in ("min", "max"):
        if attrs.get(key) is not None:
            value_for(name, key, attrs[key], x.dtype)
    lo, hi = attrs.get("min"), attrs.get("max")
    need(lo is None or hi is None or lo <= hi, name, f"attr 'min'={lo!r} is greater than attr 'max'={hi!r}")


def _make_clip(attrs, dt):
    lo, hi = attrs.get("min"), attrs.get("max")
    lo = None if lo is None else _val_scalar(lo, dt)
    hi = None if hi is None else _val_scalar(hi, dt)

    def clip(x, out):
        if lo is None and hi is None:
            np.copyto(out, x)
        elif hi is None:
            np.maximum(x, lo, out=out)
        elif lo is None:
            np.minimum(x, hi, out=out)
        else:
            np.clip(x, lo, hi, out=out)
    return clip


_unary_kernel("erf", lambda attrs, dt: ERF, FLOATS, 20, doc="erf(x) (relative error ~1e-7 in float32)")
_unary_kernel("sigmoid", lambda attrs, dt: SIGMOID, FLOATS, 5, doc="1 / (1 + exp(-x)), overflow-free")
_unary_kernel("clip", _make_clip, NUMERIC, 2, _clip_attrs,
              "min(max(x, attr min), attr max); either bound may be omitted (None)")
_binary_kernel("pow", np.power, FLOATS, flops=8)
_binary_kernel("maximum", np.maximum, NUMERIC)
_binary_kernel("minimum", np.minimum, NUMERIC)
_unary_kernel("sin", lambda attrs, dt: np.sin, FLOATS, 8, doc="sin(x)")
_unary_kernel("cos", lambda attrs, dt: np.cos, FLOATS, 8, doc="cos(x)")
_unary_kernel("log", lambda attrs, dt: np.log, FLOATS, 8, doc="natural log (log 0 = -inf, log of a negative = nan)")
_unary_kernel("abs", lambda attrs, dt: np.abs, NUMERIC, 1, doc="|x|")


def _copyto(src, out):
    np.copyto(out, src, casting="unsafe")


def _check_cast(inputs, outputs, attrs):
    arity("cast", inputs, outputs, 1)
    shape_is("cast", outputs[0], inputs[0].shape)


@builtin("cast", unit="vector", check=_check_cast, work=vector_work(1), parallel_dim=out_numel)
@quiet
def _cast_run(ctx, inputs, outputs, attrs):
    """Convert to the output's dtype (numpy astype semantics: float to int truncates)"""
    apply_elementwise(ctx, _copyto, inputs, outputs[0])


@builtin("copy", unit="vector", check=_check_unary("copy", ANY), work=vector_work(0), parallel_dim=out_numel)
def _copy_run(ctx, inputs, outputs, attrs):
    """out = x (same shape and dtype)"""
    apply_elementwise(ctx, _copyto, inputs, outputs[0])


def _check_fill(inputs, outputs, attrs):
    arity("fill", inputs, outputs, 0)
    need("value" in attrs, "fill", "attr 'value' is required")
    value_for("fill", "value", attrs["value"], outputs[0].dtype)


@builtin("fill", unit="vector", check=_check_fill, work=vector_work(0), parallel_dim=out_numel)
@quiet
def _fill_run(ctx, inputs, outputs, attrs):
    """Every element of the output = attr value"""
    out = outputs[0]
    value = attrs["value"]
    for box in block_boxes(ctx, out.shape):
        out[box + (Ellipsis,)] = value


def _check_equal(inputs, outputs, attrs):
    nm = "equal"
    arity(nm, inputs, outputs, 2)
    a, b, o = inputs[0], inputs[1], outputs[0]
    dtype_in(nm, a, ANY, "input")
    same_dtype(nm, ("input 0", a), ("input 1", b))
    dtype_in(nm, o, ("bool",), "output")
    shape_is(nm, o, broadcast_shape(nm, a.shape, b.shape))


@builtin("equal", unit="vector", check=_check_equal, work=vector_work(1), parallel_dim=out_numel)
def _equal_run(ctx, inputs, outputs, attrs):
    """a == b elementwise with broadcasting; the output is bool"""
    apply_elementwise(ctx, np.equal, inputs, outputs[0])


def _check_where(inputs, outputs, attrs):
    nm = "where"
    arity(nm, inputs, outputs, 3)
    c, x, y, o = inputs[0], inputs[1], inputs[2], outputs[0]
    dtype_in(nm, c, ("bool",), "condition")
    dtype_in(nm, x, ANY, "x")
    same_dtype(nm, ("x", x), ("y", y), ("output", o))
    shape_is(nm, o, broadcast_shape(nm, c.shape, x.shape, y.shape, what="shapes"))


def _where(c, x, y, out):
    np.copyto(out, np.where(c, x, y))           # a temporary: safe when out aliases x or y


@builtin("where", unit="vector", check=_check_where, work=vector_work(1), parallel_dim=out_numel)
def _where_run(ctx, inputs, outputs, attrs):
    """condition ? x : y elementwise with broadcasting (condition bool)"""
    apply_elementwise(ctx, _where, inputs, outputs[0])
