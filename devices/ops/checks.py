"""Launch checks: the attribute, dtype and shape validation every kernel's ``check`` is built from.

Each helper raises :class:`~devices.errors.InvalidParamError` (ACL_ERROR_RT_PARAM_INVALID) with the text
``"<kernel>: <what is wrong>"``; nothing here touches device memory.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import InvalidParamError

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "int32", "int64")
SIGNED = FLOATS + ("int8", "int16", "int32", "int64")
NUMERIC = FLOATS + INTS
ID_TYPES = ("int32", "int64")
ANY = NUMERIC + ("bool",)


def need(cond, name: str, msg: str) -> None:
    """InvalidParamError ``"<name>: <msg>"`` unless ``cond``."""
    if not cond:
        raise InvalidParamError(f"{name}: {msg}")


def arity(name, inputs, outputs, n_in, n_out=1) -> None:
    lo, hi = (n_in, n_in) if isinstance(n_in, int) else n_in
    want = str(lo) if lo == hi else f"{lo} to {hi}"
    need(lo <= len(inputs) <= hi, name, f"expects {want} input(s), got {len(inputs)}")
    need(len(outputs) == n_out, name, f"expects {n_out} output(s), got {len(outputs)}")


def unary_operands(name, inputs, outputs, kinds=None) -> tuple:
    """``(x, out)`` of a kernel of one input and one output of the input's dtype (one of ``kinds`` when
    given)."""
    arity(name, inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    if kinds is not None:
        dtype_in(name, x, kinds, "input")
    same_dtype(name, ("input", x), ("output", o))
    return x, o


def dtype_in(name, d, allowed, what) -> None:
    need(d.dtype in allowed, name, f"{what} dtype {d.dtype} not supported (allowed: {', '.join(allowed)})")


def same_dtype(name, ref, *others) -> None:
    """Every ``(what, desc)`` in ``others`` has the dtype of ``ref`` (also a ``(what, desc)``)."""
    for what, d in others:
        need(d.dtype == ref[1].dtype, name, f"{what} dtype {d.dtype} differs from {ref[0]} dtype {ref[1].dtype}")


def broadcast_shape(name, *shapes, what="input shapes") -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``, or InvalidParamError naming them ("... A, B and C do not broadcast")."""
    try:
        return np.broadcast_shapes(*(tuple(s) for s in shapes))
    except ValueError:
        listed = ", ".join(str(tuple(s)) for s in shapes[:-1]) + f" and {tuple(shapes[-1])}"
        raise InvalidParamError(f"{name}: {what} {listed} do not broadcast") from None


def shape_is(name, d, shape, what="output") -> None:
    need(tuple(d.shape) == tuple(shape), name, f"{what} shape {tuple(d.shape)} must be {tuple(shape)}")


def ndim_in(name, d, what, lo, hi=None) -> None:
    n = len(d.shape)
    if hi is None:
        need(n >= lo, name, f"{what} must have at least {lo} dim(s), got shape {tuple(d.shape)}")
    else:
        need(lo <= n <= hi, name, f"{what} must have {lo if lo == hi else f'{lo} to {hi}'} dim(s), "
                                  f"got shape {tuple(d.shape)}")


def is_int(v) -> bool:
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_num(v) -> bool:
    return isinstance(v, (numbers.Real, np.number)) and not isinstance(v, (bool, np.bool_))


def int_attr(name, attrs, key, default):
    v = attrs.get(key, default)
    need(is_int(v), name, f"attr {key!r} must be an int, got {v!r}")
    return int(v)


def bool_attr(name, attrs, key, default=False) -> bool:
    v = attrs.get(key, default)
    need(isinstance(v, (bool, np.bool_)) or (is_int(v) and v in (0, 1)), name,
         f"attr {key!r} must be a bool, got {v!r}")
    return bool(v)


def num_attr(name, attrs, key, default, finite=True) -> float:
    v = attrs.get(key, default)
    need(is_num(v), name, f"attr {key!r} must be a number, got {v!r}")
    need(not finite or math.isfinite(v), name, f"attr {key!r} must be finite, got {v!r}")
    return v


def choice_attr(name, attrs, key, default, choices) -> str:
    v = attrs.get(key, default)
    need(v in choices, name, f"attr {key!r} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def value_for(name, key, v, dtype: str) -> None:
    """A scalar attribute ``v`` that will be stored in / combined with ``dtype``."""
    need(is_num(v) or isinstance(v, (bool, np.bool_)), name, f"attr {key!r} must be a number, got {v!r}")
    if dtype in INTS:
        need(float(v).is_integer(), name, f"attr {key!r}={v!r} is not an integer for a {dtype} tensor")
        info = np.iinfo(dtype)
        need(info.min <= int(v) <= info.max, name, f"attr {key!r}={v!r} out of range for {dtype}")


def norm_axis(name, axis, ndim, key="axis") -> int:
    need(is_int(axis), name, f"attr {key!r} must be an int, got {axis!r}")
    need(-ndim <= axis < ndim, name, f"attr {key!r}={axis} out of range for {ndim} dim(s)")
    return int(axis) % ndim


def axes_attr(name, attrs, ndim, default=None) -> tuple[int, ...]:
    """Normalized, sorted reduction axes from attr ``axis`` (int, tuple/list, or None meaning all)."""
    v = attrs.get("axis", default)
    if v is None:
        return tuple(range(ndim))
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    out = tuple(sorted(norm_axis(name, a, ndim) for a in vals))
    need(len(set(out)) == len(out), name, f"attr 'axis'={v!r} repeats an axis")
    return out
