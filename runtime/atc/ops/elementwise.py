"""Elementwise ops: Add, Sub, Mul, Div, Pow, Equal, Where, the unary math ops, Cast, Clip, Identity.

Lowering picks the cheapest kernel that computes the same thing: a tensor op with a scalar constant
becomes ``add_scalar`` / ``mul_scalar`` (Sub by a constant adds its negative, Div by a float constant
multiplies by its reciprocal, i.e. within one rounding of a true division), ``Pow(x, 2)`` is
``mul(x, x)`` and ``Pow(x, 0.5)`` is ``sqrt``.
"""
from __future__ import annotations

import math

import numpy as np

from .base import broadcast, const, dtype_error, onnx_dtype, register, same, unsupported

FLOATS = ("float16", "float32", "float64")


def _int_div(a, b):
    """ONNX integer Div truncates toward zero (numpy's // floors)."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)


_BINARY = {  # op -> (kernel, numpy fold)
    "Add": ("add", np.add), "Sub": ("sub", np.subtract), "Mul": ("mul", np.multiply),
    "Div": ("div", lambda a, b: _int_div(a, b) if a.dtype.kind in "iu" else np.divide(a, b)),
    "Pow": ("pow", np.power), "Equal": ("equal", np.equal),
}


def _binary_infer(node, ins):
    a, b = ins[0], ins[1]
    if node.op != "Pow" and a.dtype != b.dtype:
        raise dtype_error(node, "B", b.dtype, [a.dtype])
    shape = broadcast(node, a.shape, b.shape)
    return [(shape, "bool" if node.op == "Equal" else a.dtype)]


def _binary_fold(node, ins):
    a, b = ins[0].const, ins[1].const
    with np.errstate(all="ignore"):
        r = _BINARY[node.op][1](a, b)
    return [np.asarray(r, dtype="bool" if node.op == "Equal" else a.dtype)]


def _scalar(v):
    """The Python value of a one-element constant (else None)."""
    if v is None or v.const is None or v.const.size != 1:
        return None
    return v.const.reshape(-1)[0].item()


def _binary_lower(ctx, node):
    a, b = ctx.val(node.inputs[0]), ctx.val(node.inputs[1])
    out_val = ctx.val(node.outputs[0])
    op = node.op
    sa, sb = _scalar(a), _scalar(b)
    x = None
    if sb is not None and a.const is None and tuple(a.shape) == tuple(out_val.shape):
        x, c = a, sb
    elif sa is not None and b.const is None and op in ("Add", "Mul") and tuple(b.shape) == tuple(out_val.shape):
        x, c = b, sa
    if x is not None and op != "Equal":
        floaty = x.dtype in FLOATS
        if op == "Add":
            return ctx.emit("add_scalar", [ctx.ref(x.name)], [ctx.out(node)], {"value": c})
        if op == "Sub":
            return ctx.emit("add_scalar", [ctx.ref(x.name)], [ctx.out(node)], {"value": -c})
        if op == "Mul":
            return ctx.emit("mul_scalar", [ctx.ref(x.name)], [ctx.out(node)], {"value": c})
        if op == "Div" and floaty and c != 0:
            return ctx.emit("mul_scalar", [ctx.ref(x.name)], [ctx.out(node)], {"value": 1.0 / c})
        if op == "Pow" and floaty and c == 2:
            xv = ctx.ref(x.name)
            return ctx.emit("mul", [xv, xv], [ctx.out(node)])
        if op == "Pow" and floaty and c == 0.5:
            return ctx.emit("sqrt", [ctx.ref(x.name)], [ctx.out(node)])
    if op == "Pow" and b.dtype != a.dtype:
        if b.const is None:
            raise dtype_error(node, "Y", b.dtype, [a.dtype])
        bv = ctx.weight(b.const.astype(a.dtype), node.inputs[1])
        return ctx.emit("pow", [ctx.ref(a.name), bv], [ctx.out(node)])
    if op == "Div" and a.dtype not in FLOATS:
        raise dtype_error(node, "A", a.dtype, FLOATS)
    return ctx.emit(_BINARY[op][0], [ctx.ref(a.name), ctx.ref(b.name)], [ctx.out(node)])


register(list(_BINARY), _binary_infer, _binary_fold, _binary_lower)


# ---------------------------------------------------------------------------------------------- unary
_erf_vec = np.vectorize(math.erf, otypes=[np.float64])

_UNARY = {  # op -> (kernel, numpy fold, allowed dtypes or None for any signed numeric)
    "Sqrt": ("sqrt", np.sqrt, FLOATS), "Erf": ("erf", _erf_vec, FLOATS), "Tanh": ("tanh", np.tanh, FLOATS),
    "Sigmoid": ("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), FLOATS), "Exp": ("exp", np.exp, FLOATS),
    "Relu": ("relu", lambda x: np.maximum(x, 0), None), "Neg": ("neg", np.negative, None),
}


def _unary_infer(node, ins):
    x = ins[0]
    allowed = _UNARY[node.op][2]
    if allowed is not None and x.dtype not in allowed:
        raise dtype_error(node, "X", x.dtype, allowed)
    return same(x)


def _unary_fold(node, ins):
    with np.errstate(all="ignore"):
        return [np.asarray(_UNARY[node.op][1](ins[0].const), dtype=ins[0].dtype)]


def _unary_lower(ctx, node):
    ctx.emit(_UNARY[node.op][0], [ctx.ref(node.inputs[0])], [ctx.out(node)])


register(list(_UNARY), _unary_infer, _unary_fold, _unary_lower)


def _gelu_infer(node, ins):
    if ins[0].dtype not in FLOATS:
        raise dtype_error(node, "X", ins[0].dtype, FLOATS)
    approx = node.attrs.get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise unsupported(node, f"approximate={approx!r}")
    return same(ins[0])


def _gelu_lower(ctx, node):
    ctx.emit("gelu", [ctx.ref(node.inputs[0])], [ctx.out(node)],
             {"approximate": node.attrs.get("approximate", "none")})


register("Gelu", _gelu_infer, None, _gelu_lower)          # ONNX 20 Gelu, and the fused GELU pattern


# ---------------------------------------------------------------------------------------------- identity, cast
register("Identity", lambda node, ins: same(ins[0]), lambda node, ins: [ins[0].const],
         lambda ctx, node: ctx.alias(node.outputs[0], ctx.ref(node.inputs[0])))


def _cast_infer(node, ins):
    return [(tuple(ins[0].shape), onnx_dtype(node, node.attrs.get("to", 1)))]


def _cast_lower(ctx, node):
    src = ctx.val(node.inputs[0])
    if src.dtype == ctx.val(node.outputs[0]).dtype:
        return ctx.alias(node.outputs[0], ctx.ref(src.name))
    return ctx.emit("cast", [ctx.ref(src.name)], [ctx.out(node)])


register("Cast", _cast_infer, lambda node, ins: [ins[0].const.astype(onnx_dtype(node, node.attrs.get("to", 1)))],
         _cast_lower)


# ---------------------------------------------------------------------------------------------- clip
def _clip_bounds(node, ins):
    if len(ins) > 1 or "min" not in node.attrs and "max" not in node.attrs:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
        lo = None if lo is None else const(node, lo, "min").reshape(-1)[0].item()
        hi = None if hi is None else const(node, hi, "max").reshape(-1)[0].item()
        return lo, hi
    return node.attrs.get("min"), node.attrs.get("max")           # opset < 11


def _clip_fold(node, ins):
    lo, hi = _clip_bounds(node, ins)
    x = ins[0].const
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return [np.asarray(x, dtype=ins[0].dtype)]


def _clip_lower(ctx, node):
    lo, hi = _clip_bounds(node, [ctx.val(n) for n in node.inputs])
    ctx.emit("clip", [ctx.ref(node.inputs[0])], [ctx.out(node)], {"min": lo, "max": hi})


register("Clip", lambda node, ins: same(ins[0]), _clip_fold, _clip_lower)


# ---------------------------------------------------------------------------------------------- where
def _where_infer(node, ins):
    c, x, y = ins[0], ins[1], ins[2]
    if c.dtype != "bool":
        raise dtype_error(node, "condition", c.dtype, ["bool"])
    if x.dtype != y.dtype:
        raise dtype_error(node, "Y", y.dtype, [x.dtype])
    return [(broadcast(node, c.shape, x.shape, y.shape), x.dtype)]


register("Where", _where_infer,
         lambda node, ins: [np.where(ins[0].const, ins[1].const, ins[2].const).astype(ins[1].dtype)],
         lambda ctx, node: ctx.emit("where", [ctx.ref(n) for n in node.inputs[:3]], [ctx.out(node)]))
