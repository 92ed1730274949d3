"""The built-in kernel library, on numpy.

Every kernel is ``run(ctx, inputs, outputs, attrs)`` (see :mod:`devices.kernel`): ``inputs`` are read-only
numpy views, ``outputs`` writable views of the checked shape and dtype.  Block ``ctx.block_idx`` of
``ctx.block_dim`` writes only its share (``ctx.split(parallel_dim)``) and the shares of all blocks cover
the outputs exactly once.  ``block_dim == 1`` takes a direct path: one numpy call per step, ``out=``
wherever numpy allows it, no copies beyond the fp32 upcast of float16 data.

What blocks split over (``parallel_dim``):

- elementwise, scalar, unary, ``swiglu``, ``cast``, ``copy``, ``fill``, ``transpose``: the output's
  elements in row-major order (a block's range is cut into at most ``2*ndim`` rectangular boxes, so
  broadcasting inputs stay views);
- ``softmax``: the rows along ``axis`` (all other axes flattened); ``layernorm``/``rmsnorm``: rows of
  ``[..., D]``;
- ``matmul``: the rows M, or the columns N when N > M (decode: M is 1, so N is what can be split);
- ``batch_matmul``: the flattened batch; ``attention``: ``B * Hq`` (GQA groups stay whole per box);
- ``incre_flash_attention``: ``B * num_key_value_heads`` (a block takes whole GQA groups: the query
  heads of its kv-heads);
- ``paged_attention``: the token rows ``N`` (rows sharing a block table stay one gather per block);
- ``rope``: ``B * S`` tokens; ``embedding``: the ids; ``scatter_update``: the K updates (each block
  writes the rows of its own ks); reductions and ``argmax``: the kept output elements;
- the kernels compiled offline models lower to (second part of this file): ``erf``, ``sigmoid``,
  ``clip``, ``pow``, ``equal``, ``where``, ``expand``, ``strided_slice``, ``batch_norm``: the output's
  elements; ``gather``: the (outer, index) pairs; ``concat``: the rows before the axis;
  ``fused_matmul``: as ``matmul``; ``conv2d``: the output rows ``N * Ho``; ``max_pool2d`` /
  ``avg_pool2d``: the ``N * C`` planes.

Float16 is computed in float32 where it matters (matmul accumulation, softmax, norms, gelu/silu/swiglu,
rope, attention, sums) and rounded once into the output.  Floating-point exceptions are silent, as on
the device (``inf``/``nan`` results, no numpy warnings).  Elementwise, softmax, norm and rope kernels are
safe when an output aliases its input (same pointer).

Conventions beyond the obvious: a softmax or attention row whose entries are all ``-inf`` (fully masked)
yields zeros, not NaN, so padding cannot poison later layers; reductions default to all axes
(``axis=None``), ``argmax`` to ``axis=-1``; ``rope`` takes an optional ``rotary_dim`` (default ``Dh``,
the rest of each head is passed through).

KV-cached decode: ``scatter_update`` writes rows of its output *in place* (the output view is the live
memory; rows not indexed keep their contents) at indices read from device memory, and
``incre_flash_attention`` reads a packed cache ``[S, B, W, D]`` in place up to per-sequence lengths (and
from per-sequence left paddings) read from device memory, so a decode step's launches are the same from
step to step and can be captured as a graph.  Indices and lengths are checked when the kernel runs: one
out of range traps (ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW / _READ_OVERFLOW, like a user kernel's
``GmTensor``) before any block writes anything.

Paged KV cache (serving): ``paged_attention`` reads key/value caches of fixed-size blocks ``[NB, BS,
Hkv, D]`` in place through per-row block tables and context lengths held in device memory (CANN/ATB
PagedAttention); rows are flat tokens of any mix of sequences, a prefill chunk being rows whose lengths
grow by one.  New keys and values reach the cache with ``scatter_update`` at slot indices computed on
the host (the serving engine's slot mapping).
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .chip import Work
from .errors import (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW,
                     InvalidParamError, KernelError)
from .registry import builtin

F16, F32, F64 = np.float16, np.float32, np.float64

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "uint8", "int16", "int32", "int64")
SIGNED = FLOATS + ("int8", "int16", "int32", "int64")
NUMERIC = FLOATS + INTS
ID_TYPES = ("int32", "int64")
ANY = NUMERIC + ("bool",)


# ---------------------------------------------------------------------------------------------------
# check helpers: all raise InvalidParamError("<kernel>: <what is wrong>")
# ---------------------------------------------------------------------------------------------------

def _need(cond, name: str, msg: str) -> None:
    if not cond:
        raise InvalidParamError(f"{name}: {msg}")


def _arity(name, inputs, outputs, n_in, n_out=1) -> None:
    lo, hi = (n_in, n_in) if isinstance(n_in, int) else n_in
    want = str(lo) if lo == hi else f"{lo} to {hi}"
    _need(lo <= len(inputs) <= hi, name, f"expects {want} input(s), got {len(inputs)}")
    _need(len(outputs) == n_out, name, f"expects {n_out} output(s), got {len(outputs)}")


def _dtype_in(name, d, allowed, what) -> None:
    _need(d.dtype in allowed, name, f"{what} dtype {d.dtype} not supported (allowed: {', '.join(allowed)})")


def _same_dtype(name, ref, *others) -> None:
    """Every ``(what, desc)`` in ``others`` has the dtype of ``ref`` (also a ``(what, desc)``)."""
    for what, d in others:
        _need(d.dtype == ref[1].dtype, name, f"{what} dtype {d.dtype} differs from {ref[0]} dtype {ref[1].dtype}")


def _shape_is(name, d, shape, what="output") -> None:
    _need(tuple(d.shape) == tuple(shape), name, f"{what} shape {tuple(d.shape)} must be {tuple(shape)}")


def _ndim(name, d, what, lo, hi=None) -> None:
    n = len(d.shape)
    if hi is None:
        _need(n >= lo, name, f"{what} must have at least {lo} dim(s), got shape {tuple(d.shape)}")
    else:
        _need(lo <= n <= hi, name, f"{what} must have {lo if lo == hi else f'{lo} to {hi}'} dim(s), "
                                   f"got shape {tuple(d.shape)}")


def _is_int(v) -> bool:
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_num(v) -> bool:
    return isinstance(v, (numbers.Real, np.number)) and not isinstance(v, (bool, np.bool_))


def _int_attr(name, attrs, key, default):
    v = attrs.get(key, default)
    _need(_is_int(v), name, f"attr {key!r} must be an int, got {v!r}")
    return int(v)


def _bool_attr(name, attrs, key, default=False) -> bool:
    v = attrs.get(key, default)
    _need(isinstance(v, (bool, np.bool_)) or (_is_int(v) and v in (0, 1)), name,
          f"attr {key!r} must be a bool, got {v!r}")
    return bool(v)


def _num_attr(name, attrs, key, default, finite=True) -> float:
    v = attrs.get(key, default)
    _need(_is_num(v), name, f"attr {key!r} must be a number, got {v!r}")
    _need(not finite or math.isfinite(v), name, f"attr {key!r} must be finite, got {v!r}")
    return v


def _choice_attr(name, attrs, key, default, choices) -> str:
    v = attrs.get(key, default)
    _need(v in choices, name, f"attr {key!r} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def _value_for(name, key, v, dtype: str) -> None:
    """A scalar attribute ``v`` that will be stored in / combined with ``dtype``."""
    _need(_is_num(v) or isinstance(v, (bool, np.bool_)), name, f"attr {key!r} must be a number, got {v!r}")
    if dtype in INTS:
        _need(float(v).is_integer(), name, f"attr {key!r}={v!r} is not an integer for a {dtype} tensor")
        info = np.iinfo(dtype)
        _need(info.min <= int(v) <= info.max, name, f"attr {key!r}={v!r} out of range for {dtype}")


def _axis(name, axis, ndim, key="axis") -> int:
    _need(_is_int(axis), name, f"attr {key!r} must be an int, got {axis!r}")
    _need(-ndim <= axis < ndim, name, f"attr {key!r}={axis} out of range for {ndim} dim(s)")
    return int(axis) % ndim


def _axes(name, attrs, ndim, default=None) -> tuple[int, ...]:
    """Normalized, sorted reduction axes from attr ``axis`` (int, tuple/list, or None meaning all)."""
    v = attrs.get("axis", default)
    if v is None:
        return tuple(range(ndim))
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    out = tuple(sorted(_axis(name, a, ndim) for a in vals))
    _need(len(set(out)) == len(out), name, f"attr 'axis'={v!r} repeats an axis")
    return out


def _val_scalar(value, dtype):
    """``value`` as the Python scalar numpy combines with a ``dtype`` array without promotion."""
    return int(value) if np.dtype(dtype).kind in "iu" else float(value)


def _compute_dtype(dt):
    return F64 if dt == F64 else F32


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---------------------------------------------------------------------------------------------------
# work helpers
# ---------------------------------------------------------------------------------------------------

def _io_bytes(inputs, outputs) -> int:
    return sum(d.nbytes for d in inputs) + sum(d.nbytes for d in outputs)


def _vector_work(flops_per_elem: float):
    """``flops_per_elem`` per output element, every tensor read/written once."""
    def work(inputs, outputs, attrs):
        n = outputs[0].numel if outputs else 0
        return Work(flops=flops_per_elem * n, bytes=_io_bytes(inputs, outputs), unit="vector")
    return work


def _input_vector_work(flops_per_elem: float):
    """Like :func:`_vector_work` but counted per element of the first input (reductions, norms)."""
    def work(inputs, outputs, attrs):
        return Work(flops=flops_per_elem * inputs[0].numel, bytes=_io_bytes(inputs, outputs), unit="vector")
    return work


def _out_numel(inputs, outputs, attrs) -> int:
    return outputs[0].numel


# ---------------------------------------------------------------------------------------------------
# block helpers
# ---------------------------------------------------------------------------------------------------

def _boxes(shape, start: int, stop: int) -> list[tuple]:
    """Boxes (tuples of slices over a prefix of ``shape``) covering flat row-major ``[start, stop)`` once.

    At most ``2 * len(shape) - 1`` boxes; slices always keep their axis (length-1 slices, no ints).
    """
    out: list[tuple] = []

    def rec(prefix, dims, lo, hi):
        if lo >= hi:
            return
        if not dims:
            out.append(prefix)
            return
        inner = _numel(dims[1:])
        i0, r0 = divmod(lo, inner)
        i1, r1 = divmod(hi, inner)
        if i0 == i1:
            rec(prefix + (slice(i0, i0 + 1),), dims[1:], r0, r1)
            return
        if r0:
            rec(prefix + (slice(i0, i0 + 1),), dims[1:], r0, inner)
            i0 += 1
        if i1 > i0:
            out.append(prefix + (slice(i0, i1),))
        if r1:
            rec(prefix + (slice(i1, i1 + 1),), dims[1:], 0, r1)

    rec((), tuple(shape), start, stop)
    return out


def _sub(a: np.ndarray, box: tuple, ndim: int) -> np.ndarray:
    """The part of ``a`` (broadcastable, right-aligned, to an ``ndim``-d result) that feeds ``box``."""
    off = ndim - a.ndim
    idx = tuple((slice(None) if a.shape[j - off] == 1 else s) for j, s in enumerate(box) if j >= off)
    return a[idx + (Ellipsis,)]


def _block_boxes(ctx, shape) -> list[tuple]:
    """This block's boxes over ``shape`` (flat row-major split); the whole shape for one block."""
    if ctx.block_dim == 1:
        return [()]
    r = ctx.split(_numel(shape))
    return _boxes(shape, r.start, r.stop) if r else []


def _pad_box(box, n):
    return tuple(box) + (slice(None),) * (n - len(box))


def _pad_box_list(boxes, n):
    return [_pad_box(b, n) for b in boxes]


def _ew_apply(ctx, fn, ins, out) -> None:
    """``fn(*ins, out=...)`` on this block's share of ``out``'s elements (inputs broadcast to ``out``)."""
    if out.ndim == 0:                    # numpy ufuncs return scalars, not arrays, for 0-d temporaries
        out, ins = out.reshape(1), [a.reshape(1) for a in ins]
    if ctx.block_dim == 1:
        fn(*ins, out=out)
        return
    r = ctx.split(out.size)
    if not r:
        return
    if out.flags.c_contiguous and all(a.shape == out.shape and a.flags.c_contiguous for a in ins):
        sl = slice(r.start, r.stop)
        fn(*[a.reshape(-1)[sl] for a in ins], out=out.reshape(-1)[sl])
        return
    for box in _boxes(out.shape, r.start, r.stop):
        fn(*[_sub(a, box, out.ndim) for a in ins], out=out[box + (Ellipsis,)])


def _rows(a: np.ndarray, d: int, writable=False) -> np.ndarray:
    """``a`` as ``[rows, d]`` (a view; outputs must not be copied)."""
    shape = (a.size // d if d else _numel(a.shape[:-1]), d)
    return a.reshape(shape, copy=False) if writable else a.reshape(shape)


def _quiet(fn):
    """Run a kernel with numpy floating-point warnings off (the device just produces inf/nan)."""
    @functools.wraps(fn)
    def run(ctx, inputs, outputs, attrs):
        with np.errstate(all="ignore"):
            fn(ctx, inputs, outputs, attrs)
    return run


def _upcast(fn):
    """Compute ``fn(*ins, out=)`` in float32 when the output is float16 (one rounding at the end)."""
    def g(*ins, out):
        if out.dtype == F16:
            tmp = np.empty(out.shape, F32)
            fn(*[a.astype(F32) if a.dtype == F16 else a for a in ins], out=tmp)
            np.copyto(out, tmp, casting="same_kind")
        else:
            fn(*ins, out=out)
    return g


# ---------------------------------------------------------------------------------------------------
# elementwise binary: add, sub, mul, div
# ---------------------------------------------------------------------------------------------------

def _check_binary(name, kinds, alpha=False, same_shape=False):
    def check(inputs, outputs, attrs):
        _arity(name, inputs, outputs, 2)
        a, b = inputs
        o = outputs[0]
        _dtype_in(name, a, kinds, "input")
        _same_dtype(name, ("input 0", a), ("input 1", b), ("output", o))
        if same_shape:
            _need(tuple(a.shape) == tuple(b.shape), name,
                  f"inputs must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
            want = tuple(a.shape)
        else:
            try:
                want = np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
            except ValueError:
                raise InvalidParamError(f"{name}: input shapes {tuple(a.shape)} and {tuple(b.shape)} "
                                        f"do not broadcast") from None
        _shape_is(name, o, want)
        if alpha:
            _value_for(name, "alpha", attrs.get("alpha", 1), a.dtype)
    return check


def _binary_kernel(name, ufunc, kinds, use_alpha=False, flops=1):
    def run(ctx, inputs, outputs, attrs):
        a, b = inputs
        out = outputs[0]
        alpha = attrs.get("alpha", 1) if use_alpha else 1
        if alpha == 1:
            _ew_apply(ctx, ufunc, (a, b), out)
        else:
            al = _val_scalar(alpha, out.dtype)

            def fn(x, y, out):
                ufunc(x, np.multiply(y, al), out=out)   # temp for alpha*y: alias-safe when out is x
            _ew_apply(ctx, fn, (a, b), out)
    run.__doc__ = f"{name}(a, b) with numpy broadcasting" + (" (out = a op alpha*b)" if use_alpha else "")
    builtin(name, unit="vector", check=_check_binary(name, kinds, alpha=use_alpha), work=_vector_work(flops),
            parallel_dim=_out_numel)(_quiet(run))


_binary_kernel("add", np.add, NUMERIC, use_alpha=True)
_binary_kernel("sub", np.subtract, NUMERIC, use_alpha=True)
_binary_kernel("mul", np.multiply, NUMERIC)
_binary_kernel("div", np.divide, FLOATS)


# ---------------------------------------------------------------------------------------------------
# unary / scalar elementwise
# ---------------------------------------------------------------------------------------------------

def _check_unary(name, kinds, attrs_check=None):
    def check(inputs, outputs, attrs):
        _arity(name, inputs, outputs, 1)
        x, o = inputs[0], outputs[0]
        _dtype_in(name, x, kinds, "input")
        _same_dtype(name, ("input", x), ("output", o))
        _shape_is(name, o, x.shape)
        if attrs_check is not None:
            attrs_check(name, x, attrs)
    return check


def _unary_kernel(name, make_fn, kinds, flops, attrs_check=None, doc=""):
    """Register ``name``; ``make_fn(attrs, dtype)`` returns ``fn(x, out=)`` (alias-safe)."""
    def run(ctx, inputs, outputs, attrs):
        _ew_apply(ctx, make_fn(attrs, outputs[0].dtype), inputs, outputs[0])
    run.__doc__ = doc
    builtin(name, unit="vector", check=_check_unary(name, kinds, attrs_check), work=_vector_work(flops),
            parallel_dim=_out_numel)(_quiet(run))


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


def _gelu_tanh(x, out):
    u = np.multiply(x, x)
    u *= 0.044715
    u += 1.0
    u *= x
    u *= _SQRT_2_OVER_PI
    np.tanh(u, out=u)
    u += 1.0
    u *= 0.5
    np.multiply(x, u, out=out)


def _silu(x, out):
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1.0
    np.divide(x, t, out=out)


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.divide(1, out, out=out)


def _relu(x, out):
    np.maximum(x, 0, out=out)


_GELU = {"none": _upcast(gelu_erf), "tanh": _upcast(_gelu_tanh)}
_SILU = _upcast(_silu)


def _scalar_op(ufunc, value, x, out):
    ufunc(x, value, out=out)


def _gelu_attrs(name, x, attrs):
    _choice_attr(name, attrs, "approximate", "none", ("none", "tanh"))


def _scalar_attrs(name, x, attrs):
    _need("value" in attrs, name, "attr 'value' is required")
    _value_for(name, "value", attrs["value"], x.dtype)


_unary_kernel("gelu", lambda attrs, dt: _GELU[attrs.get("approximate", "none")], FLOATS, 30, _gelu_attrs,
              "GELU; attr approximate: 'none' (erf) or 'tanh'")
_unary_kernel("silu", lambda attrs, dt: _SILU, FLOATS, 5, doc="x * sigmoid(x)")
_unary_kernel("relu", lambda attrs, dt: _relu, SIGNED, 1, doc="max(x, 0)")
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



def _swiglu(g, u, out):
    t = np.negative(g)
    np.exp(t, out=t)
    t += 1.0
    np.divide(g, t, out=t)
    np.multiply(t, u, out=out)


_SWIGLU = _upcast(_swiglu)


@builtin("swiglu", unit="vector", check=_check_binary("swiglu", FLOATS, same_shape=True), work=_vector_work(6),
         parallel_dim=_out_numel)
@_quiet
def _swiglu_run(ctx, inputs, outputs, attrs):
    """silu(gate) * up (inputs gate, up of one shape)"""
    _ew_apply(ctx, _SWIGLU, inputs, outputs[0])


# ---------------------------------------------------------------------------------------------------
# layout: cast, copy, fill, transpose
# ---------------------------------------------------------------------------------------------------

def _copyto(src, out):
    np.copyto(out, src, casting="unsafe")


def _check_cast(inputs, outputs, attrs):
    _arity("cast", inputs, outputs, 1)
    _shape_is("cast", outputs[0], inputs[0].shape)


@builtin("cast", unit="vector", check=_check_cast, work=_vector_work(1), parallel_dim=_out_numel)
@_quiet
def _cast_run(ctx, inputs, outputs, attrs):
    """Convert to the output's dtype (numpy astype semantics: float to int truncates)"""
    _ew_apply(ctx, _copyto, inputs, outputs[0])


@builtin("copy", unit="vector", check=_check_unary("copy", ANY), work=_vector_work(0), parallel_dim=_out_numel)
def _copy_run(ctx, inputs, outputs, attrs):
    """out = x (same shape and dtype)"""
    _ew_apply(ctx, _copyto, inputs, outputs[0])


def _check_fill(inputs, outputs, attrs):
    _arity("fill", inputs, outputs, 0)
    _need("value" in attrs, "fill", "attr 'value' is required")
    _value_for("fill", "value", attrs["value"], outputs[0].dtype)


@builtin("fill", unit="vector", check=_check_fill, work=_vector_work(0), parallel_dim=_out_numel)
@_quiet
def _fill_run(ctx, inputs, outputs, attrs):
    """Every element of the output = attr value"""
    out = outputs[0]
    value = attrs["value"]
    for box in _block_boxes(ctx, out.shape):
        out[box + (Ellipsis,)] = value


def _perm(name, attrs, ndim) -> tuple[int, ...]:
    p = attrs.get("perm")
    _need(isinstance(p, (tuple, list)) and all(_is_int(i) for i in p), name,
          f"attr 'perm' must be a tuple of ints, got {p!r}")
    _need(sorted(int(i) for i in p) == list(range(ndim)), name,
          f"attr 'perm'={tuple(p)!r} is not a permutation of the {ndim} input axes")
    return tuple(int(i) for i in p)


def _check_transpose(inputs, outputs, attrs):
    _arity("transpose", inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    p = _perm("transpose", attrs, len(x.shape))
    _same_dtype("transpose", ("input", x), ("output", o))
    _shape_is("transpose", o, tuple(x.shape[i] for i in p))


@builtin("transpose", unit="vector", check=_check_transpose, work=_vector_work(0), parallel_dim=_out_numel)
def _transpose_run(ctx, inputs, outputs, attrs):
    """out = x.transpose(perm)"""
    xt = inputs[0].transpose(tuple(attrs["perm"]))
    out = outputs[0]
    for box in _block_boxes(ctx, out.shape):
        b = box + (Ellipsis,)
        np.copyto(out[b], xt[b])


# ---------------------------------------------------------------------------------------------------
# softmax and norms (row-wise)
# ---------------------------------------------------------------------------------------------------

def _softmax(x, out, axis) -> None:
    """Softmax of ``x`` along ``axis`` into ``out`` (may be ``x``); all-``-inf`` rows give zeros."""
    if x.size == 0:
        return
    ct = _compute_dtype(out.dtype)
    m = np.max(x, axis=axis, keepdims=True)
    if m.dtype != ct:
        m = m.astype(ct)
    m[m == -np.inf] = 0
    buf = out if out.dtype == ct else np.empty(x.shape, ct)
    np.subtract(x, m, out=buf)
    np.exp(buf, out=buf)
    s = np.sum(buf, axis=axis, keepdims=True)
    s[s == 0] = 1
    np.divide(buf, s, out=out)


def _softmax_layout(shape, axis):
    """(outer, n, inner) of ``shape`` around ``axis``."""
    return _numel(shape[:axis]), shape[axis], _numel(shape[axis + 1:])


def _check_softmax(inputs, outputs, attrs):
    _arity("softmax", inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    _dtype_in("softmax", x, FLOATS, "input")
    _ndim("softmax", x, "input", 1)
    _same_dtype("softmax", ("input", x), ("output", o))
    _shape_is("softmax", o, x.shape)
    _axis("softmax", attrs.get("axis", -1), len(x.shape))


def _softmax_pd(inputs, outputs, attrs):
    shape = tuple(inputs[0].shape)
    outer, _, inner = _softmax_layout(shape, int(attrs.get("axis", -1)) % len(shape))
    return outer * inner


@builtin("softmax", unit="vector", check=_check_softmax, work=_vector_work(5), parallel_dim=_softmax_pd)
@_quiet
def _softmax_run(ctx, inputs, outputs, attrs):
    """softmax along attr axis (default -1), computed in float32 for float16"""
    x, out = inputs[0], outputs[0]
    axis = int(attrs.get("axis", -1)) % x.ndim
    if ctx.block_dim == 1:
        _softmax(x, out, axis)
        return
    outer, n, inner = _softmax_layout(x.shape, axis)
    if inner == 1:
        r = ctx.split(outer)
        if r:
            _softmax(_rows(x, n)[r.start:r.stop], _rows(out, n, True)[r.start:r.stop], 1)
        return
    x3 = x.reshape(outer, n, inner)
    o3 = out.reshape((outer, n, inner), copy=False)
    for ob, ib in _pad_box_list(_block_boxes(ctx, (outer, inner)), 2):
        _softmax(x3[ob, :, ib], o3[ob, :, ib], 1)



def _check_norm(name, n_params):
    def check(inputs, outputs, attrs):
        _arity(name, inputs, outputs, 1 + n_params)
        x, o = inputs[0], outputs[0]
        _dtype_in(name, x, FLOATS, "input")
        _ndim(name, x, "input", 1)
        d = x.shape[-1]
        for i, p in enumerate(inputs[1:]):
            what = ("gamma", "beta")[i]
            _shape_is(name, p, (d,), what)
            _need(p.dtype in (x.dtype, "float32"), name,
                  f"{what} dtype {p.dtype} must be the input's ({x.dtype}) or float32")
        _same_dtype(name, ("input", x), ("output", o))
        _shape_is(name, o, x.shape)
        eps = _num_attr(name, attrs, "eps", 1e-5 if n_params == 2 else 1e-6)
        _need(eps >= 0, name, f"attr 'eps' must be >= 0, got {eps!r}")
    return check


def _rows_pd(inputs, outputs, attrs):
    shape = inputs[0].shape
    return _numel(shape[:-1])


def _row_block(ctx, x, out):
    """This block's rows of ``x``/``out`` as ``[r, D]`` views, or None when it has none."""
    d = x.shape[-1]
    x2, o2 = _rows(x, d), _rows(out, d, True)
    if ctx.block_dim == 1:
        return x2, o2
    r = ctx.split(x2.shape[0])
    return (x2[r.start:r.stop], o2[r.start:r.stop]) if r else None


@builtin("layernorm", unit="vector", check=_check_norm("layernorm", 2), work=_input_vector_work(8),
         parallel_dim=_rows_pd)
@_quiet
def _layernorm_run(ctx, inputs, outputs, attrs):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (float32 math for float16)"""
    x, gamma, beta = inputs
    eps = float(attrs.get("eps", 1e-5))
    rows = _row_block(ctx, x, outputs[0])
    if rows is None or rows[0].size == 0:
        return
    x2, o2 = rows
    xc = x2.astype(_compute_dtype(x2.dtype))          # a fresh buffer: centered in place below
    xc -= xc.mean(axis=1, keepdims=True)
    var = np.einsum("ij,ij->i", xc, xc)[:, None]
    var /= x2.shape[1]
    var += eps
    np.sqrt(var, out=var)
    xc /= var
    xc *= gamma
    np.add(xc, beta, out=o2)


@builtin("rmsnorm", unit="vector", check=_check_norm("rmsnorm", 1), work=_input_vector_work(4),
         parallel_dim=_rows_pd)
@_quiet
def _rmsnorm_run(ctx, inputs, outputs, attrs):
    """x / sqrt(mean(x**2) + eps) * gamma over the last axis (float32 math for float16)"""
    x, gamma = inputs
    eps = float(attrs.get("eps", 1e-6))
    rows = _row_block(ctx, x, outputs[0])
    if rows is None or rows[0].size == 0:
        return
    x2, o2 = rows
    ct = _compute_dtype(x2.dtype)
    xf = x2 if x2.dtype == ct else x2.astype(ct)
    ms = np.einsum("ij,ij->i", xf, xf)[:, None]
    ms /= x2.shape[1]
    ms += eps
    np.sqrt(ms, out=ms)
    if o2.dtype == ct:
        np.divide(xf, ms, out=o2)                      # every row read (for ms) before it is written
        np.multiply(o2, gamma, out=o2)
    else:
        xf /= ms
        np.multiply(xf, gamma, out=o2)


# ---------------------------------------------------------------------------------------------------
# matmul (cube)
# ---------------------------------------------------------------------------------------------------

def _mm(a, b, bias, out) -> None:
    """out = a @ b (+ bias); float16 accumulates in float32 like the Cube."""
    if out.size == 0:
        return
    if out.dtype == F16:
        r = np.matmul(a.astype(F32), b.astype(F32))
        if bias is not None:
            r += bias
        np.copyto(out, r, casting="same_kind")
    else:
        np.matmul(a, b, out=out)
        if bias is not None:
            np.add(out, bias, out=out)


def _cube_work(inputs, outputs, flops) -> Work:
    return Work(flops=flops, bytes=_io_bytes(inputs, outputs), unit="cube", fp16=outputs[0].dtype == "float16")


def _check_matmul(inputs, outputs, attrs, n="matmul"):
    _arity(n, inputs, outputs, (2, 3))
    a, b, o = inputs[0], inputs[1], outputs[0]
    tb = _bool_attr(n, attrs, "transpose_b")
    _dtype_in(n, a, FLOATS, "a")
    _same_dtype(n, ("a", a), ("b", b), ("output", o))
    _ndim(n, a, "a", 2, 2)
    _ndim(n, b, "b", 2, 2)
    m, k = a.shape
    kb, nn = (b.shape[1], b.shape[0]) if tb else b.shape
    _need(k == kb, n, f"inner dims differ: a {tuple(a.shape)}, b {tuple(b.shape)} (transpose_b={tb})")
    if len(inputs) == 3:
        _same_dtype(n, ("a", a), ("bias", inputs[2]))
        _shape_is(n, inputs[2], (nn,), "bias")
    _shape_is(n, o, (m, nn))


def _mm_split_n(m, n) -> bool:
    return n > m


def _matmul_pd(inputs, outputs, attrs):
    m, n = outputs[0].shape
    return n if _mm_split_n(m, n) else m


def _matmul_work(inputs, outputs, attrs):
    m, k = inputs[0].shape
    return _cube_work(inputs, outputs, 2.0 * m * outputs[0].shape[1] * k)


@builtin("matmul", unit="cube", check=_check_matmul, work=_matmul_work, parallel_dim=_matmul_pd)
@_quiet
def _matmul_run(ctx, inputs, outputs, attrs):
    """out[M,N] = a[M,K] @ b[K,N] (b[N,K] with transpose_b) (+ bias[N])"""
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    out = outputs[0]
    bt = b.T if attrs.get("transpose_b", False) else b
    if ctx.block_dim == 1:
        _mm(a, bt, bias, out)
        return
    m, n = out.shape
    if _mm_split_n(m, n):
        r = ctx.split(n)
        if r:
            s = slice(r.start, r.stop)
            _mm(a, bt[:, s], None if bias is None else bias[s], out[:, s])
    else:
        r = ctx.split(m)
        if r:
            s = slice(r.start, r.stop)
            _mm(a[s], bt, bias, out[s])


def _bmm_dims(a_shape, b_shape, ta, tb):
    m, k = (a_shape[-1], a_shape[-2]) if ta else (a_shape[-2], a_shape[-1])
    kb, n = (b_shape[-1], b_shape[-2]) if tb else (b_shape[-2], b_shape[-1])
    return m, k, kb, n


def _check_bmm(inputs, outputs, attrs):
    nm = "batch_matmul"
    _arity(nm, inputs, outputs, 2)
    a, b, o = inputs[0], inputs[1], outputs[0]
    ta = _bool_attr(nm, attrs, "transpose_a")
    tb = _bool_attr(nm, attrs, "transpose_b")
    _dtype_in(nm, a, FLOATS, "a")
    _same_dtype(nm, ("a", a), ("b", b), ("output", o))
    _ndim(nm, a, "a", 2)
    _ndim(nm, b, "b", 2)
    _need(len(b.shape) == 2 or tuple(b.shape[:-2]) == tuple(a.shape[:-2]), nm,
          f"b must be 2-D or have a's batch dims {tuple(a.shape[:-2])}, got shape {tuple(b.shape)}")
    m, k, kb, n = _bmm_dims(a.shape, b.shape, ta, tb)
    _need(k == kb, nm, f"inner dims differ: a {tuple(a.shape)}, b {tuple(b.shape)} "
                       f"(transpose_a={ta}, transpose_b={tb})")
    _shape_is(nm, o, tuple(a.shape[:-2]) + (m, n))


def _bmm_pd(inputs, outputs, attrs):
    return _numel(outputs[0].shape[:-2])


def _bmm_work(inputs, outputs, attrs):
    m, k, _, n = _bmm_dims(inputs[0].shape, inputs[1].shape, attrs.get("transpose_a", False),
                           attrs.get("transpose_b", False))
    return _cube_work(inputs, outputs, 2.0 * _numel(inputs[0].shape[:-2]) * m * n * k)


@builtin("batch_matmul", unit="cube", check=_check_bmm, work=_bmm_work, parallel_dim=_bmm_pd)
@_quiet
def _bmm_run(ctx, inputs, outputs, attrs):
    """out[..., M, N] = a[..., M, K] @ b[..., K, N] (b may be 2-D); attrs transpose_a, transpose_b"""
    a, b = inputs
    out = outputs[0]
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    a3 = a.reshape((-1,) + a.shape[-2:])
    b3 = b if b.ndim == 2 else b.reshape((-1,) + b.shape[-2:])
    o3 = out.reshape((-1,) + out.shape[-2:], copy=False)
    if ta:
        a3 = a3.swapaxes(-1, -2)
    if tb:
        b3 = b3.swapaxes(-1, -2)
    if ctx.block_dim == 1:
        _mm(a3, b3, None, o3)
        return
    r = ctx.split(o3.shape[0])
    if r:
        s = slice(r.start, r.stop)
        _mm(a3[s], b3 if b3.ndim == 2 else b3[s], None, o3[s])


# ---------------------------------------------------------------------------------------------------
# attention (cube): softmax(q k^T * scale + mask) v with GQA and causal masking
# ---------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _causal_bias(sq: int, skv: int, q_offset: int):
    """Additive [Sq, Skv] float32 bias: -inf where key j > q_offset + i; None when nothing is masked."""
    if q_offset >= skv - 1:
        return None
    bias = np.where(np.arange(skv)[None, :] > (q_offset + np.arange(sq))[:, None], -np.inf, 0.0).astype(F32)
    bias.flags.writeable = False
    return bias


def _check_attention(inputs, outputs, attrs):
    nm = "attention"
    _arity(nm, inputs, outputs, (3, 4))
    q, k, v, o = inputs[0], inputs[1], inputs[2], outputs[0]
    for what, d in (("q", q), ("k", k), ("v", v)):
        _ndim(nm, d, what, 4, 4)
    _dtype_in(nm, q, FLOATS, "q")
    _same_dtype(nm, ("q", q), ("k", k), ("v", v), ("output", o))
    b, hq, sq, dq = q.shape
    bk, hkv, skv, dk = k.shape
    _need(bk == b, nm, f"k batch {bk} differs from q batch {b}")
    _need(dk == dq, nm, f"k head dim {dk} differs from q head dim {dq}")
    _need(tuple(v.shape[:3]) == tuple(k.shape[:3]), nm,
          f"v shape {tuple(v.shape)} must match k {tuple(k.shape)} in [B, Hkv, Skv]")
    _need(hkv >= 1 and hq % hkv == 0, nm, f"q heads {hq} must be a multiple of kv heads {hkv}")
    _need(skv >= 1, nm, "attention needs at least one key (Skv >= 1)")
    _shape_is(nm, o, (b, hq, sq, v.shape[3]))
    if len(inputs) == 4:
        m = inputs[3]
        _dtype_in(nm, m, FLOATS, "mask")
        _ndim(nm, m, "mask", 0, 4)
        full = (1,) * (4 - len(m.shape)) + tuple(m.shape)
        _need(all(x in (1, y) for x, y in zip(full, (b, hq, sq, skv))), nm,
              f"mask shape {tuple(m.shape)} does not broadcast to [B, 1|Hq, Sq, Skv] = [{b}, {hq}, {sq}, {skv}]")
    _bool_attr(nm, attrs, "causal")
    _int_attr(nm, attrs, "q_offset", skv - sq)
    if attrs.get("scale") is not None:
        _num_attr(nm, attrs, "scale", None)


def _attention_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * inputs[0].shape[1]


def _attention_work(inputs, outputs, attrs):
    b, hq, sq, d = inputs[0].shape
    skv, dv = inputs[2].shape[2], inputs[2].shape[3]
    return _cube_work(inputs, outputs, 2.0 * b * hq * sq * skv * (d + dv) + 5.0 * b * hq * sq * skv)


@builtin("attention", unit="cube", check=_check_attention, work=_attention_work, parallel_dim=_attention_pd)
@_quiet
def _attention_run(ctx, inputs, outputs, attrs):
    """softmax(q @ k^T * scale + mask [+ causal]) @ v; q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D], GQA by h // (Hq/Hkv)"""
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask = inputs[3] if len(inputs) > 3 else None
    out = outputs[0]
    b, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    g = hq // hkv
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cbias = None
    if attrs.get("causal", False):
        cbias = _causal_bias(sq, skv, int(attrs.get("q_offset", skv - sq)))
    q5 = q.reshape(b, hkv, g, sq, d)
    o5 = out.reshape((b, hkv, g, sq, dv), copy=False)
    m5 = None
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mh = (hkv, g) if m4.shape[1] == hq and hq > 1 else (1, 1)
        m5 = m4.reshape((m4.shape[0],) + mh + m4.shape[2:])
    ct = _compute_dtype(out.dtype)
    for box in _block_boxes(ctx, (b, hkv, g)):
        bs, ks, gs = _pad_box(box, 3)
        qb = q5[bs, ks, gs]
        nb, nk, ng = qb.shape[:3]
        qm = qb.reshape(nb, nk, ng * sq, d)
        kb, vb = k[bs, ks], v[bs, ks]
        if qm.dtype != ct:
            qm, kb, vb = qm.astype(ct), kb.astype(ct), vb.astype(ct)
        s = np.matmul(qm, kb.swapaxes(-1, -2))                       # [nb, nk, ng*Sq, Skv]
        s *= scale
        if m5 is not None or cbias is not None:
            s5 = s.reshape(nb, nk, ng, sq, skv)
            if m5 is not None:
                s5 += _sub(m5, (bs, ks, gs), 5)
            if cbias is not None:
                s5 += cbias
        _softmax(s, s, -1)
        ob = o5[bs, ks, gs]
        if ob.dtype == ct:
            np.matmul(s, vb, out=ob.reshape((nb, nk, ng * sq, dv), copy=False))
        else:
            np.copyto(ob, np.matmul(s, vb).reshape(nb, nk, ng, sq, dv), casting="same_kind")


# ---------------------------------------------------------------------------------------------------
# incre_flash_attention (cube): one decode step's attention over a packed KV cache, read in place
# ---------------------------------------------------------------------------------------------------

_IFA = "incre_flash_attention"


def _head_range_attr(nm, attrs, key, n, w) -> int:
    _need(key in attrs, nm, f"attr {key!r} is required")
    v = _int_attr(nm, attrs, key, None)
    _need(0 <= v and v + n <= w, nm, f"attr {key!r}={v}: heads [{v}, {v + n}) do not fit in the cache's "
                                     f"{w} heads per slot")
    return v


def _check_ifa(inputs, outputs, attrs):
    nm = _IFA
    _arity(nm, inputs, outputs, (3, 4))
    q, cache, lens, o = inputs[0], inputs[1], inputs[2], outputs[0]
    _ndim(nm, q, "query", 3, 3)
    _ndim(nm, cache, "cache", 4, 4)
    _dtype_in(nm, q, FLOATS, "query")
    _same_dtype(nm, ("query", q), ("cache", cache), ("output", o))
    b, wq, d = q.shape
    s, bc, w, dc = cache.shape
    _need(bc == b, nm, f"cache batch {bc} (cache [S, B, W, D] = {tuple(cache.shape)}) differs from query batch {b}")
    _need(dc == d, nm, f"cache head dim {dc} differs from query head dim {d}")
    _need(d >= 1, nm, "head dim D must be >= 1")
    for what, t in (("actual_seq_lengths", lens),) + ((("kv_padding", inputs[3]),) if len(inputs) > 3 else ()):
        _dtype_in(nm, t, ID_TYPES, what)
        _need(tuple(t.shape) == (b,), nm, f"{what} shape {tuple(t.shape)} must be [B] = [{b}]")
    for key in ("num_heads", "num_key_value_heads"):
        _need(key in attrs, nm, f"attr {key!r} is required")
    h = _int_attr(nm, attrs, "num_heads", None)
    _need(1 <= h <= wq, nm, f"attr 'num_heads'={h} must be in [1, {wq}] (query has {wq} heads per row)")
    hkv = _int_attr(nm, attrs, "num_key_value_heads", None)
    _need(hkv >= 1 and h % hkv == 0, nm,
          f"attr 'num_key_value_heads'={hkv} must be >= 1 and divide num_heads={h}")
    _head_range_attr(nm, attrs, "key_head_offset", hkv, w)
    _head_range_attr(nm, attrs, "value_head_offset", hkv, w)
    if attrs.get("scale") is not None:
        _num_attr(nm, attrs, "scale", None)
    _shape_is(nm, o, (b, h, d))


def _ifa_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * int(attrs["num_key_value_heads"])


def _ifa_work(inputs, outputs, attrs):
    q, cache = inputs[0], inputs[1]
    b, _, d = q.shape
    s = cache.shape[0]
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    item = np.dtype(q.dtype).itemsize
    nbytes = item * (b * h * d + 2 * s * b * hkv * d) + outputs[0].nbytes + sum(t.nbytes for t in inputs[2:])
    return Work(flops=4.0 * b * h * s * d, bytes=nbytes, unit="cube", fp16=q.dtype == "float16")


@functools.lru_cache(maxsize=1)
def _f16_table() -> np.ndarray:
    t = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(F16).astype(F32)
    t.flags.writeable = False
    return t


def _f16_to_f32(a: np.ndarray) -> np.ndarray:
    """Exact float16 -> float32 by a 64K-entry table (about twice numpy's astype on strided data)."""
    return np.take(_f16_table(), a.view(np.uint16))


def _ifa_rows(q, cache, out, b, k0, k1, lo, hi, g, ko, vo, scale) -> None:
    """out heads [k0*g, k1*g) of sequence ``b``: kv-heads [k0, k1) over cache slots [lo, hi).

    Masked slots (``j < pad_b``) are skipped rather than scored ``-inf``: the same softmax (they would
    get probability exactly 0) without touching their memory."""
    nk = k1 - k0
    d = q.shape[2]
    ob = out[b, k0 * g:k1 * g].reshape((nk, g, d), copy=False)
    n = hi - lo
    if n <= 0:                                                         # nothing visible: zeros
        ob[...] = 0
        return
    ct = _compute_dtype(out.dtype)
    qs = np.multiply(q[b, k0 * g:k1 * g].reshape(nk, g, d), scale, dtype=ct)    # scale folded into q
    kb = cache[lo:hi, b, ko + k0:ko + k1].transpose(1, 0, 2)         # [nk, n, D] views of the cache
    vb = cache[lo:hi, b, vo + k0:vo + k1].transpose(1, 0, 2)
    if kb.dtype == F16:
        kb, vb = _f16_to_f32(kb), _f16_to_f32(vb)
    elif kb.dtype != ct:
        kb, vb = kb.astype(ct), vb.astype(ct)
    # one gemv per head (matrix @ vector, broadcast over the group): numpy/BLAS run small-M gemms far
    # slower than gemvs, and every head's result is independent of how heads are split into blocks
    s = np.matmul(kb[:, None], qs[..., None]).reshape(nk, g, n)        # [nk, g, n] scores
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    z = s.sum(axis=-1, keepdims=True)
    r = np.matmul(s[:, :, None, :], vb[:, None]).reshape(nk, g, d)     # unnormalized p @ V
    np.divide(r, z, out=ob)                                            # one rounding into float16


@builtin(_IFA, unit="cube", check=_check_ifa, work=_ifa_work, parallel_dim=_ifa_pd, gathers=(1,))
@_quiet
def _ifa_run(ctx, inputs, outputs, attrs):
    """Decode attention over a packed KV cache read in place (CANN IncreFlashAttention with
    actual_seq_lengths).  query [B, Wq, D] (heads [0, num_heads) are the queries), cache [S, B, W, D]
    (keys of kv-head g at head key_head_offset+g, values at value_head_offset+g), actual_seq_lengths [B]
    (sequence b attends over slots [0, len_b)), optional kv_padding [B] (slots j < pad_b masked);
    out [B, num_heads, D].  A length outside [0, S] traps (TRAP_READ_OVERFLOW) with nothing written."""
    q, cache, lens = inputs[0], inputs[1], inputs[2]
    out = outputs[0]
    s_max = cache.shape[0]
    ln = lens.tolist()
    if ln and (min(ln) < 0 or max(ln) > s_max):                      # every block checks all of them
        bad = [i for i, x in enumerate(ln) if not 0 <= x <= s_max]
        raise KernelError(f"{_IFA}: actual_seq_lengths[{bad[0]}]={ln[bad[0]]} is outside the cache's "
                          f"[0, {s_max}] slots ({len(bad)} bad length(s) in block {ctx.block_idx})",
                          code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    pad = inputs[3].tolist() if len(inputs) > 3 else None
    hkv = attrs["num_key_value_heads"]
    g = attrs["num_heads"] // hkv
    ko, vo = attrs["key_head_offset"], attrs["value_head_offset"]
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    if ctx.block_dim == 1:
        for b, hi in enumerate(ln):
            _ifa_rows(q, cache, out, b, 0, hkv, max(pad[b], 0) if pad else 0, hi, g, ko, vo, scale)
        return
    r = ctx.split(len(ln) * hkv)
    if not r:
        return
    for b in range(r.start // hkv, (r.stop + hkv - 1) // hkv):
        k0, k1 = max(r.start - b * hkv, 0), min(r.stop - b * hkv, hkv)
        _ifa_rows(q, cache, out, b, k0, k1, max(pad[b], 0) if pad else 0, ln[b], g, ko, vo, scale)


# ---------------------------------------------------------------------------------------------------
# paged_attention (cube): attention of token rows over a paged KV cache, read in place via block tables
# ---------------------------------------------------------------------------------------------------

_PA = "paged_attention"


def _check_pa(inputs, outputs, attrs):
    nm = _PA
    _arity(nm, inputs, outputs, 5)
    q, kc, vc, bt, lens, o = inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], outputs[0]
    _ndim(nm, q, "query", 3, 3)
    _ndim(nm, kc, "key_cache", 4, 4)
    _dtype_in(nm, q, FLOATS, "query")
    _same_dtype(nm, ("query", q), ("key_cache", kc), ("value_cache", vc), ("output", o))
    n, wq, d = q.shape
    nb, bs, hkv_c, dc = kc.shape
    _need(tuple(vc.shape) == tuple(kc.shape), nm,
          f"value_cache shape {tuple(vc.shape)} differs from key_cache {tuple(kc.shape)}")
    _need(dc == d, nm, f"cache head dim {dc} differs from query head dim {d}")
    _need(d >= 1 and bs >= 1 and nb >= 1, nm, "caches need >= 1 block, block size and head dim")
    _dtype_in(nm, bt, ID_TYPES, "block_tables")
    _ndim(nm, bt, "block_tables", 2, 2)
    _need(bt.shape[0] == n and bt.shape[1] >= 1, nm,
          f"block_tables shape {tuple(bt.shape)} must be [N, max_blocks] = [{n}, >= 1]")
    _dtype_in(nm, lens, ID_TYPES, "context_lens")
    _need(tuple(lens.shape) == (n,), nm, f"context_lens shape {tuple(lens.shape)} must be [N] = [{n}]")
    for key in ("num_heads", "num_key_value_heads"):
        _need(key in attrs, nm, f"attr {key!r} is required")
    h = _int_attr(nm, attrs, "num_heads", None)
    _need(1 <= h <= wq, nm, f"attr 'num_heads'={h} must be in [1, {wq}] (query has {wq} heads per row)")
    hkv = _int_attr(nm, attrs, "num_key_value_heads", None)
    _need(hkv == hkv_c, nm, f"attr 'num_key_value_heads'={hkv} differs from the caches' {hkv_c} heads")
    _need(h % hkv == 0, nm, f"num_heads={h} must be a multiple of num_key_value_heads={hkv}")
    if attrs.get("scale") is not None:
        _num_attr(nm, attrs, "scale", None)
    _shape_is(nm, o, (n, h, d))


def _pa_pd(inputs, outputs, attrs):
    return inputs[0].shape[0]


def _pa_work(inputs, outputs, attrs):
    """Upper bound: every row attends over its whole block table (the lengths are in device memory)."""
    q, kc, bt = inputs[0], inputs[1], inputs[3]
    n, _, d = q.shape
    span = bt.shape[1] * kc.shape[1]
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    item = np.dtype(q.dtype).itemsize
    nbytes = item * (n * h * d + 2 * n * span * hkv * d) + outputs[0].nbytes + bt.nbytes + inputs[4].nbytes
    return Work(flops=4.0 * n * h * span * d, bytes=nbytes, unit="cube", fp16=q.dtype == "float16")


def _pa_softmax_v(s, vb, out_rows, ct) -> None:
    """s [..., L] scores (masked already), vb values; writes softmax(s) @ v into out_rows; a row with
    no visible key (length 0) gets zeros."""
    m = s.max(axis=-1, keepdims=True)
    np.maximum(m, np.finfo(ct).min, out=m)                         # all -inf: exp(-inf - min) = 0
    s -= m
    np.exp(s, out=s)
    z = s.sum(axis=-1, keepdims=True)
    r = np.matmul(s, vb)
    z[z == 0] = 1                                                  # no visible key: zeros, not NaN
    np.copyto(out_rows, r / z, casting="same_kind")


def _pa_gather(cache, blocks, ct):
    """cache [NB, BS, Hkv, D] rows of ``blocks [..., nb]`` -> [..., Hkv, nb*BS, D] in the compute dtype."""
    g = cache[blocks]                                              # [..., nb, BS, Hkv, D] (a copy)
    g = g.reshape(blocks.shape[:-1] + (-1,) + cache.shape[2:])     # [..., L, Hkv, D]
    g = np.moveaxis(g, -2, -3)                                     # [..., Hkv, L, D]
    return g if g.dtype == ct else g.astype(ct)


def _pa_segment(q, kc, vc, bt, ln, out, a, b, h, hkv, scale, ct) -> None:
    """Rows [a, b) sharing one block table (a prefill chunk): one gather of their sequence's keys."""
    g, d, bs = h // hkv, q.shape[2], kc.shape[1]
    L = int(ln[a:b].max())
    nr = b - a
    if L == 0:
        out[a:b] = 0
        return
    blocks = bt[a, :(L + bs - 1) // bs]
    kb, vb = _pa_gather(kc, blocks, ct), _pa_gather(vc, blocks, ct)      # [Hkv, L', D]
    qs = np.multiply(q[a:b, :h], scale, dtype=ct).reshape(nr, hkv, g, d).transpose(1, 0, 2, 3).reshape(hkv, nr * g, d)
    s = np.matmul(qs, kb.swapaxes(-1, -2))                          # [Hkv, nr*g, L']
    vis = np.arange(s.shape[-1])[None, :] < ln[a:b, None]           # [nr, L']: causal via the lengths
    s4 = s.reshape(hkv, nr, g, -1)
    s4[np.broadcast_to(~vis[None, :, None, :], s4.shape)] = -np.inf
    o = np.empty((hkv, nr * g, d), ct)
    _pa_softmax_v(s, vb, o, ct)
    np.copyto(out[a:b], o.reshape(hkv, nr, g, d).transpose(1, 0, 2, 3).reshape(nr, h, d), casting="same_kind")


def _pa_singles(q, kc, vc, bt, ln, out, rows, h, hkv, scale, ct) -> None:
    """Rows each with its own block table (decode): one batched gather, padded to the group's longest."""
    g, d, bs = h // hkv, q.shape[2], kc.shape[1]
    order = rows[np.argsort(ln[rows], kind="stable")]
    i = 0
    while i < order.size:                                          # groups of similar length
        j = i + 1
        while j < order.size and ln[order[j]] <= 2 * ln[order[i]] + bs:
            j += 1
        grp = order[i:j]
        i = j
        L = int(ln[grp].max())
        if L == 0:
            out[grp] = 0
            continue
        blocks = bt[grp, :(L + bs - 1) // bs]                      # [n, nb]
        kb, vb = _pa_gather(kc, blocks, ct), _pa_gather(vc, blocks, ct)  # [n, Hkv, L', D]
        qs = np.multiply(q[grp, :h], scale, dtype=ct).reshape(grp.size, hkv, g, d)
        s = np.matmul(qs, kb.swapaxes(-1, -2))                      # [n, Hkv, g, L']
        vis = np.arange(s.shape[-1])[None, :] < ln[grp, None]
        s[~np.broadcast_to(vis[:, None, None, :], s.shape)] = -np.inf
        o = np.empty((grp.size, hkv, g, d), ct)
        _pa_softmax_v(s, vb, o, ct)
        out[grp] = o.reshape(grp.size, h, d)                       # fancy index: an assignment, not a view


@builtin(_PA, unit="cube", check=_check_pa, work=_pa_work, parallel_dim=_pa_pd, gathers=(1, 2))
@_quiet
def _pa_run(ctx, inputs, outputs, attrs):
    """Attention of token rows over a paged KV cache read in place (CANN/ATB PagedAttention with block
    tables).  query [N, Wq, D] (heads [0, num_heads) are the queries), key_cache / value_cache
    [NB, BS, Hkv, D], block_tables [N, MB], context_lens [N]; row n attends over positions
    [0, context_lens[n]) of its sequence, position j living in block block_tables[n, j // BS] at offset
    j % BS (so a prefill chunk is rows whose lengths grow by one: causal).  out [N, num_heads, D]; a
    row with length 0 gets zeros.  A length outside [0, MB * BS] or a used block id outside [0, NB)
    traps (507042) with nothing written."""
    q, kc, vc, bt, lens = inputs
    out = outputs[0]
    nb, bs = kc.shape[0], kc.shape[1]
    ln = lens.astype(np.int64)
    n, mb = bt.shape
    if n and (ln.min() < 0 or ln.max() > mb * bs):                   # every block checks every row
        bad = np.flatnonzero((ln < 0) | (ln > mb * bs))
        raise KernelError(f"{_PA}: context_lens[{bad[0]}]={ln[bad[0]]} is outside [0, {mb * bs}] "
                          f"(block table of {mb} blocks of {bs}; {bad.size} bad length(s) in block {ctx.block_idx})",
                          code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    used = np.arange(mb)[None, :] < ((ln + bs - 1) // bs)[:, None]
    badb = used & ((bt < 0) | (bt >= nb))
    if badb.any():
        r, c = (int(x[0]) for x in np.nonzero(badb))
        raise KernelError(f"{_PA}: block_tables[{r}, {c}]={int(bt[r, c])} is outside the caches' [0, {nb}) blocks "
                          f"({int(badb.sum())} bad block id(s) in use, block {ctx.block_idx})",
                          code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
    h, hkv = int(attrs["num_heads"]), int(attrs["num_key_value_heads"])
    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    ct = _compute_dtype(out.dtype)
    r = range(n) if ctx.block_dim == 1 else ctx.split(n)
    if not r:
        return
    a0, a1 = r.start, r.stop
    sub = bt[a0:a1]
    starts = np.concatenate([[0], np.flatnonzero(np.any(sub[1:] != sub[:-1], axis=1)) + 1, [a1 - a0]]) + a0
    singles = []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        if b - a == 1:
            singles.append(a)
        else:
            _pa_segment(q, kc, vc, bt, ln, out, a, b, h, hkv, scale, ct)
    if singles:
        _pa_singles(q, kc, vc, bt, ln, out, np.array(singles, np.int64), h, hkv, scale, ct)


# ---------------------------------------------------------------------------------------------------
# rope
# ---------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _inv_freq(rd: int, base: float) -> np.ndarray:
    f = 1.0 / (base ** (np.arange(0, rd, 2, dtype=F64) / rd))
    f.flags.writeable = False
    return f


def _check_rope(inputs, outputs, attrs):
    nm = "rope"
    _arity(nm, inputs, outputs, 2)
    x, pos, o = inputs[0], inputs[1], outputs[0]
    _ndim(nm, x, "x", 4, 4)
    _dtype_in(nm, x, FLOATS, "x")
    _dtype_in(nm, pos, ID_TYPES, "positions")
    _same_dtype(nm, ("x", x), ("output", o))
    _shape_is(nm, o, x.shape)
    b, s, h, dh = x.shape
    _need(tuple(pos.shape) == (s,) or (len(pos.shape) == 2 and pos.shape[0] in (1, b) and pos.shape[1] == s), nm,
          f"positions shape {tuple(pos.shape)} must be [S] = [{s}] or [B, S] = [{b}, {s}]")
    rd = _int_attr(nm, attrs, "rotary_dim", dh)
    _need(0 < rd <= dh and rd % 2 == 0, nm, f"rotary dim {rd} must be even and in (0, {dh}] (head dim {dh})")
    base = _num_attr(nm, attrs, "base", 10000.0)
    _need(base > 0, nm, f"attr 'base' must be > 0, got {base!r}")
    _choice_attr(nm, attrs, "style", "half", ("half", "interleaved"))


def _rope_pd(inputs, outputs, attrs):
    return inputs[0].shape[0] * inputs[0].shape[1]


@builtin("rope", unit="vector", check=_check_rope, work=_vector_work(6), parallel_dim=_rope_pd)
@_quiet
def _rope_run(ctx, inputs, outputs, attrs):
    """Rotary embedding of x [B,S,H,Dh] at positions [S] or [B,S]; style 'half' (rotate_half) or 'interleaved'"""
    x, pos = inputs
    out = outputs[0]
    b, s, h, dh = x.shape
    rd = int(attrs.get("rotary_dim", dh))
    half = rd // 2
    inv = _inv_freq(rd, float(attrs.get("base", 10000.0)))
    interleaved = attrs.get("style", "half") == "interleaved"
    ct = _compute_dtype(out.dtype)
    for box in _block_boxes(ctx, (b, s)):
        bs, ss = _pad_box(box, 2)
        p = pos[ss] if pos.ndim == 1 else (pos[bs, ss] if pos.shape[0] == b else pos[:, ss])
        ang = p.astype(F64)[..., None] * inv
        cos = np.cos(ang).astype(ct)
        sin = np.sin(ang).astype(ct)
        cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if p.ndim == 1 else \
            (cos[:, :, None, :], sin[:, :, None, :])
        xb, ob = x[bs, ss], out[bs, ss]
        if interleaved:
            x1, x2, o1, o2 = xb[..., 0:rd:2], xb[..., 1:rd:2], ob[..., 0:rd:2], ob[..., 1:rd:2]
        else:
            x1, x2, o1, o2 = xb[..., :half], xb[..., half:rd], ob[..., :half], ob[..., half:rd]
        t1 = np.multiply(x1, cos, dtype=ct)
        t1 -= np.multiply(x2, sin, dtype=ct)
        t2 = np.multiply(x2, cos, dtype=ct)
        t2 += np.multiply(x1, sin, dtype=ct)
        np.copyto(o1, t1, casting="same_kind")                       # both halves read before any write
        np.copyto(o2, t2, casting="same_kind")
        if rd < dh:
            np.copyto(ob[..., rd:], xb[..., rd:])


# ---------------------------------------------------------------------------------------------------
# embedding
# ---------------------------------------------------------------------------------------------------

def _check_embedding(inputs, outputs, attrs):
    nm = "embedding"
    _arity(nm, inputs, outputs, 2)
    table, ids, o = inputs[0], inputs[1], outputs[0]
    _ndim(nm, table, "table", 2, 2)
    _dtype_in(nm, ids, ID_TYPES, "ids")
    _same_dtype(nm, ("table", table), ("output", o))
    _shape_is(nm, o, tuple(ids.shape) + (table.shape[1],))


def _embedding_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * outputs[0].nbytes, unit="vector")


def _embedding_pd(inputs, outputs, attrs):
    return inputs[1].numel


@builtin("embedding", unit="vector", check=_check_embedding, work=_embedding_work, parallel_dim=_embedding_pd,
         gathers=(0,))
def _embedding_run(ctx, inputs, outputs, attrs):
    """out[*S, D] = table[ids]; an id outside [0, V) is a KernelError, never wrapped"""
    table, ids = inputs
    v, d = table.shape
    ids1 = ids.reshape(-1)
    o2 = _rows(outputs[0], d, True)
    if ctx.block_dim > 1:
        r = ctx.split(ids1.size)
        if not r:
            return
        ids1, o2 = ids1[r.start:r.stop], o2[r.start:r.stop]
    if ids1.size == 0:
        return
    lo, hi = ids1.min(), ids1.max()
    if lo < 0 or hi >= v:
        bad = np.flatnonzero((ids1 < 0) | (ids1 >= v))
        first = int(bad[0]) + (ctx.split(ids.size).start if ctx.block_dim > 1 else 0)
        raise KernelError(f"embedding: id {int(ids.reshape(-1)[first])} at flat index {first} is outside the "
                          f"table's [0, {v}) rows ({bad.size} bad id(s) in block {ctx.block_idx})")
    np.take(table, ids1, axis=0, out=o2, mode="clip")               # range checked above; clip = no buffering


# ---------------------------------------------------------------------------------------------------
# scatter_update (in place)
# ---------------------------------------------------------------------------------------------------

def _check_scatter_update(inputs, outputs, attrs):
    nm = "scatter_update"
    _arity(nm, inputs, outputs, 2)
    upd, idx, var = inputs[0], inputs[1], outputs[0]
    _ndim(nm, upd, "updates", 1)
    _ndim(nm, var, "var", 1)
    _ndim(nm, idx, "indices", 1, 1)
    _dtype_in(nm, idx, ID_TYPES, "indices")
    _dtype_in(nm, var, ANY, "var")
    _same_dtype(nm, ("var", var), ("updates", upd))
    _need(idx.shape[0] == upd.shape[0], nm,
          f"indices length {idx.shape[0]} differs from the updates' rows {upd.shape[0]} (updates [K, ...])")
    _need(tuple(upd.shape[1:]) == tuple(var.shape[1:]), nm,
          f"updates row shape {tuple(upd.shape[1:])} differs from var row shape {tuple(var.shape[1:])}")


def _scatter_update_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * inputs[0].nbytes, unit="vector")


def _scatter_update_pd(inputs, outputs, attrs):
    return inputs[1].shape[0]


def _last_occurrence(idx: np.ndarray) -> np.ndarray | None:
    """Mask of the positions whose index does not occur again later; None when all are distinct."""
    order = np.argsort(idx, kind="stable")
    srt = idx[order]
    last = np.ones(idx.size, bool)
    np.not_equal(srt[1:], srt[:-1], out=last[:-1])
    if last.all():
        return None
    keep = np.zeros(idx.size, bool)
    keep[order[last]] = True
    return keep


@builtin("scatter_update", unit="vector", check=_check_scatter_update, work=_scatter_update_work,
         parallel_dim=_scatter_update_pd, scatters=(0,))
def _scatter_update_run(ctx, inputs, outputs, attrs):
    """In place: var[indices[k], ...] = updates[k, ...] (inputs updates [K, *R], indices [K]; output var
    [S, *R], its other rows untouched).  Duplicate indices: the last k wins.  An index outside [0, S)
    traps (TRAP_WRITE_OVERFLOW) and nothing is written (every block checks all K indices before writing)."""
    upd, idx = inputs
    var = outputs[0]
    k, s = idx.shape[0], var.shape[0]
    if k == 0:
        return
    if k == 1:                                                         # decode: one slot per step
        i = int(idx[0])
        if not 0 <= i < s:
            raise KernelError(f"scatter_update: index {i} at position 0 is outside var's [0, {s}) rows "
                              f"(1 bad index; nothing written)", code=ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW)
        if ctx.block_idx == 0:
            var[i] = upd[0]
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= s:
        bad = np.flatnonzero((idx < 0) | (idx >= s))
        raise KernelError(f"scatter_update: index {int(idx[bad[0]])} at position {int(bad[0])} is outside var's "
                          f"[0, {s}) rows ({bad.size} bad index(es); nothing written)",
                          code=ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW)
    keep = _last_occurrence(idx)
    if ctx.block_dim == 1:
        if keep is None:
            var[idx] = upd                                             # distinct rows: one fancy assignment
        else:
            var[idx[keep]] = upd[keep]
        return
    r = ctx.split(k)
    if not r:
        return
    ib, ub = idx[r.start:r.stop], upd[r.start:r.stop]
    if keep is not None:
        kb = keep[r.start:r.stop]
        ib, ub = ib[kb], ub[kb]
    var[ib] = ub


# ---------------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------------

def _reduced_shape(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_reduce(name, kinds, nonempty=False):
    def check(inputs, outputs, attrs):
        _arity(name, inputs, outputs, 1)
        x, o = inputs[0], outputs[0]
        _dtype_in(name, x, kinds, "input")
        _same_dtype(name, ("input", x), ("output", o))
        axes = _axes(name, attrs, len(x.shape))
        kd = _bool_attr(name, attrs, "keepdims")
        if nonempty:
            _need(all(x.shape[a] > 0 for a in axes), name,
                  f"cannot reduce over an empty axis (input shape {tuple(x.shape)}, axes {axes})")
        _shape_is(name, o, _reduced_shape(x.shape, axes, kd))
    return check


def _reduce_pd(inputs, outputs, attrs):
    return outputs[0].numel


def _reduce_kernel(name, fn, kinds, nonempty=False):
    """``fn(x, axis, out)`` reduces ``x`` over the tuple ``axis`` into ``out`` (already shaped)."""
    def run(ctx, inputs, outputs, attrs):
        x, out = inputs[0], outputs[0]
        axes = _axes(name, attrs, x.ndim)
        keep = tuple(i for i in range(x.ndim) if i not in axes)
        kept_shape = tuple(x.shape[i] for i in keep)
        xt = x.transpose(keep + axes)
        red = tuple(range(len(keep), x.ndim))
        ok = out.reshape(kept_shape, copy=False)
        for box in _block_boxes(ctx, kept_shape):
            fn(xt[box + (Ellipsis,)], red, ok[box + (Ellipsis,)])
    run.__doc__ = f"{name} over attr axis (int, tuple or None = all; default None), attr keepdims"
    builtin(name, unit="vector", check=_check_reduce(name, kinds, nonempty), work=_input_vector_work(1),
            parallel_dim=_reduce_pd)(_quiet(run))


def _sum(x, axis, out):
    if out.dtype == F16:
        np.copyto(out, np.sum(x, axis=axis, dtype=F32), casting="same_kind")
    else:
        np.sum(x, axis=axis, out=out)


def _mean(x, axis, out):
    if out.dtype == F16:
        np.copyto(out, np.mean(x, axis=axis, dtype=F32), casting="same_kind")
    else:
        np.mean(x, axis=axis, out=out)


def _max(x, axis, out):
    np.max(x, axis=axis, out=out)


def _min(x, axis, out):
    np.min(x, axis=axis, out=out)


_reduce_kernel("reduce_sum", _sum, NUMERIC)
_reduce_kernel("reduce_mean", _mean, FLOATS)
_reduce_kernel("reduce_max", _max, NUMERIC, nonempty=True)
_reduce_kernel("reduce_min", _min, NUMERIC, nonempty=True)


def _check_argmax(inputs, outputs, attrs):
    nm = "argmax"
    _arity(nm, inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    _dtype_in(nm, x, NUMERIC, "input")
    _ndim(nm, x, "input", 1)
    _dtype_in(nm, o, ID_TYPES, "output")
    ax = _axis(nm, attrs.get("axis", -1), len(x.shape))
    _need(x.shape[ax] > 0, nm, f"cannot take argmax over an empty axis (input shape {tuple(x.shape)})")
    _shape_is(nm, o, _reduced_shape(x.shape, (ax,), _bool_attr(nm, attrs, "keepdims")))


@builtin("argmax", unit="vector", check=_check_argmax, work=_input_vector_work(1), parallel_dim=_reduce_pd)
def _argmax_run(ctx, inputs, outputs, attrs):
    """Index of the largest element along attr axis (default -1; first one on ties); out int32 or int64"""
    x, out = inputs[0], outputs[0]
    ax = int(attrs.get("axis", -1)) % x.ndim
    xt = np.moveaxis(x, ax, -1)
    ok = out.reshape(xt.shape[:-1], copy=False)
    for box in _block_boxes(ctx, xt.shape[:-1]):
        bx = box + (Ellipsis,)
        if ok.dtype == np.intp:
            np.argmax(xt[bx], axis=-1, out=ok[bx])
        else:
            np.copyto(ok[bx], np.argmax(xt[bx], axis=-1), casting="unsafe")


# ===================================================================================================
# Kernels that compiled offline models lower to (runtime.atc): math (erf, sigmoid, clip, pow), compare
# and select (equal, where), data movement (gather, strided_slice, concat, expand), fused matmul with
# bias and activation, and the CNN kernels (conv2d, max/avg pool, batch_norm).
# ===================================================================================================

# ---------------------------------------------------------------------------------------------------
# erf, sigmoid, clip, pow
# ---------------------------------------------------------------------------------------------------

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erf(x, out):
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


def _sigmoid(x, out):
    """1 / (1 + e^-x), computed from e^-|x| so neither tail overflows."""
    e = np.negative(np.abs(x))
    np.exp(e, out=e)                             # e^-|x| in (0, 1]
    d = e + 1.0
    pos = np.divide(1.0, d)
    np.divide(e, d, out=d)                       # the x < 0 branch: e^x / (1 + e^x)
    np.copyto(out, np.where(x >= 0, pos, d))


_ERF = _upcast(_erf)
_SIGMOID = _upcast(_sigmoid)


def _clip_attrs(name, x, attrs):
    for key in ("min", "max"):
        if attrs.get(key) is not None:
            _value_for(name, key, attrs[key], x.dtype)
    lo, hi = attrs.get("min"), attrs.get("max")
    _need(lo is None or hi is None or lo <= hi, name, f"attr 'min'={lo!r} is greater than attr 'max'={hi!r}")


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


_unary_kernel("erf", lambda attrs, dt: _ERF, FLOATS, 20, doc="erf(x) (relative error ~1e-7 in float32)")
_unary_kernel("sigmoid", lambda attrs, dt: _SIGMOID, FLOATS, 5, doc="1 / (1 + exp(-x)), overflow-free")
_unary_kernel("clip", _make_clip, NUMERIC, 2, _clip_attrs,
              "min(max(x, attr min), attr max); either bound may be omitted (None)")
_binary_kernel("pow", np.power, FLOATS, flops=8)


# ---------------------------------------------------------------------------------------------------
# equal, where
# ---------------------------------------------------------------------------------------------------

def _check_equal(inputs, outputs, attrs):
    nm = "equal"
    _arity(nm, inputs, outputs, 2)
    a, b, o = inputs[0], inputs[1], outputs[0]
    _dtype_in(nm, a, ANY, "input")
    _same_dtype(nm, ("input 0", a), ("input 1", b))
    _dtype_in(nm, o, ("bool",), "output")
    try:
        want = np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
    except ValueError:
        raise InvalidParamError(f"{nm}: input shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast") from None
    _shape_is(nm, o, want)


@builtin("equal", unit="vector", check=_check_equal, work=_vector_work(1), parallel_dim=_out_numel)
def _equal_run(ctx, inputs, outputs, attrs):
    """a == b elementwise with broadcasting; the output is bool"""
    _ew_apply(ctx, np.equal, inputs, outputs[0])


def _check_where(inputs, outputs, attrs):
    nm = "where"
    _arity(nm, inputs, outputs, 3)
    c, x, y, o = inputs[0], inputs[1], inputs[2], outputs[0]
    _dtype_in(nm, c, ("bool",), "condition")
    _dtype_in(nm, x, ANY, "x")
    _same_dtype(nm, ("x", x), ("y", y), ("output", o))
    try:
        want = np.broadcast_shapes(tuple(c.shape), tuple(x.shape), tuple(y.shape))
    except ValueError:
        raise InvalidParamError(f"{nm}: shapes {tuple(c.shape)}, {tuple(x.shape)} and {tuple(y.shape)} "
                                f"do not broadcast") from None
    _shape_is(nm, o, want)


def _where(c, x, y, out):
    np.copyto(out, np.where(c, x, y))           # a temporary: safe when out aliases x or y


@builtin("where", unit="vector", check=_check_where, work=_vector_work(1), parallel_dim=_out_numel)
def _where_run(ctx, inputs, outputs, attrs):
    """condition ? x : y elementwise with broadcasting (condition bool)"""
    _ew_apply(ctx, _where, inputs, outputs[0])


# ---------------------------------------------------------------------------------------------------
# gather, strided_slice, concat, expand
# ---------------------------------------------------------------------------------------------------

def _check_gather(inputs, outputs, attrs):
    nm = "gather"
    _arity(nm, inputs, outputs, 2)
    x, idx, o = inputs[0], inputs[1], outputs[0]
    _ndim(nm, x, "data", 1)
    _dtype_in(nm, idx, ID_TYPES, "indices")
    _same_dtype(nm, ("data", x), ("output", o))
    ax = _axis(nm, attrs.get("axis", 0), len(x.shape))
    _shape_is(nm, o, tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]))


def _gather_layout(inputs, attrs):
    x, idx = inputs[0], inputs[1]
    ax = int(attrs.get("axis", 0)) % len(x.shape)
    return _numel(x.shape[:ax]), x.shape[ax], _numel(x.shape[ax + 1:]), _numel(idx.shape)


def _gather_pd(inputs, outputs, attrs):
    p, _, _, i = _gather_layout(inputs, attrs)
    return p * i


def _gather_work(inputs, outputs, attrs):
    return Work(flops=0.0, bytes=inputs[1].nbytes + 2 * outputs[0].nbytes, unit="vector")


@builtin("gather", unit="vector", check=_check_gather, work=_gather_work, parallel_dim=_gather_pd, gathers=(0,))
def _gather_run(ctx, inputs, outputs, attrs):
    """ONNX Gather: out = take(data, indices, axis) (attr axis, default 0); indices may be negative
    (counted from the end); one outside [-n, n) traps (507042) before anything is written"""
    x, idx = inputs
    p, n, q, ni = _gather_layout(inputs, attrs)
    flat = idx.reshape(-1)
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -n or hi >= n:
            bad = np.flatnonzero((flat < -n) | (flat >= n))
            raise KernelError(f"gather: index {int(flat[bad[0]])} at flat position {int(bad[0])} is outside "
                              f"[-{n}, {n}) along the gathered axis ({bad.size} bad index(es))",
                              code=ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
        if lo < 0:
            flat = np.where(flat < 0, flat + n, flat)
    x3 = x.reshape(p, n, q)
    o3 = outputs[0].reshape((p, ni, q), copy=False)
    for box in _block_boxes(ctx, (p, ni)):
        ps, is_ = _pad_box(box, 2)
        np.take(x3[ps], flat[is_], axis=1, out=o3[ps, is_], mode="clip")


def _slice_triples(nm, attrs, shape):
    vals = []
    for k in ("begin", "end", "strides"):
        v = attrs.get(k)
        _need(isinstance(v, (tuple, list)) and len(v) == len(shape) and all(_is_int(i) for i in v), nm,
              f"attr {k!r} must be {len(shape)} ints (one per input axis), got {v!r}")
        vals.append(tuple(int(i) for i in v))
    out = []
    for ax, (b, e, s, n) in enumerate(zip(*vals, shape)):
        _need(s != 0, nm, f"stride of axis {ax} is 0")
        lo, hi = (0, n) if s > 0 else (-1, n - 1)
        _need(lo <= b <= hi and lo <= e <= hi, nm, f"axis {ax}: begin {b} / end {e} are not normalized for size "
                                                   f"{n} and stride {s} (as slice.indices gives them)")
        out.append((b, e, s))
    return out


def _slicer(triples):
    """numpy slices for normalized triples (an empty range stays empty; end -1 with a negative stride
    means "through index 0")."""
    out = []
    for b, e, s in triples:
        if not len(range(b, e, s)):
            out.append(slice(0, 0))
        else:
            out.append(slice(b, None if (s < 0 and e < 0) else e, s))
    return tuple(out)


def _check_strided_slice(inputs, outputs, attrs):
    nm = "strided_slice"
    _arity(nm, inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    _same_dtype(nm, ("input", x), ("output", o))
    triples = _slice_triples(nm, attrs, tuple(x.shape))
    _shape_is(nm, o, tuple(len(range(b, e, s)) for b, e, s in triples))


@builtin("strided_slice", unit="vector", check=_check_strided_slice, work=_vector_work(0), parallel_dim=_out_numel)
def _strided_slice_run(ctx, inputs, outputs, attrs):
    """out = x[begin:end:strides] per axis; attrs begin/end/strides have one entry per axis, normalized as
    Python's ``slice.indices`` gives them (end -1 with a negative stride means "through index 0")"""
    xs = inputs[0][_slicer(_slice_triples("strided_slice", attrs, inputs[0].shape))]
    out = outputs[0]
    for box in _block_boxes(ctx, out.shape):
        b = box + (Ellipsis,)
        np.copyto(out[b], xs[b])


def _check_concat(inputs, outputs, attrs):
    nm = "concat"
    _need(len(inputs) >= 1, nm, "expects at least 1 input")
    _need(len(outputs) == 1, nm, f"expects 1 output, got {len(outputs)}")
    first, o = inputs[0], outputs[0]
    _ndim(nm, first, "input 0", 1)
    ax = _axis(nm, attrs.get("axis", 0), len(first.shape))
    total = 0
    for i, d in enumerate(inputs):
        _same_dtype(nm, ("input 0", first), (f"input {i}", d))
        _need(len(d.shape) == len(first.shape) and all(a == b for j, (a, b) in enumerate(zip(d.shape, first.shape))
                                                       if j != ax), nm,
              f"input {i} shape {tuple(d.shape)} differs from input 0 {tuple(first.shape)} off axis {ax}")
        total += d.shape[ax]
    _same_dtype(nm, ("input 0", first), ("output", o))
    _shape_is(nm, o, tuple(first.shape[:ax]) + (total,) + tuple(first.shape[ax + 1:]))


def _concat_pd(inputs, outputs, attrs):
    ax = int(attrs.get("axis", 0)) % len(inputs[0].shape)
    return _numel(inputs[0].shape[:ax])


@builtin("concat", unit="vector", check=_check_concat, work=_vector_work(0), parallel_dim=_concat_pd)
def _concat_run(ctx, inputs, outputs, attrs):
    """Concatenate the inputs along attr axis (default 0)"""
    out = outputs[0]
    ax = int(attrs.get("axis", 0)) % out.ndim
    outer = _numel(out.shape[:ax])
    inner = _numel(out.shape[ax + 1:])
    o2 = out.reshape((outer, out.shape[ax] * inner), copy=False)
    r = range(outer) if ctx.block_dim == 1 else ctx.split(outer)
    if not r:
        return
    rows = slice(r.start, r.stop)
    col = 0
    for x in inputs:
        w = x.shape[ax] * inner
        np.copyto(o2[rows, col:col + w], x.reshape(outer, w)[rows])
        col += w


def _check_expand(inputs, outputs, attrs):
    nm = "expand"
    _arity(nm, inputs, outputs, 1)
    x, o = inputs[0], outputs[0]
    _same_dtype(nm, ("input", x), ("output", o))
    _need(len(x.shape) <= len(o.shape), nm, f"input shape {tuple(x.shape)} has more dims than output {tuple(o.shape)}")
    try:
        ok = np.broadcast_shapes(tuple(x.shape), tuple(o.shape)) == tuple(o.shape)
    except ValueError:
        ok = False
    _need(ok, nm, f"input shape {tuple(x.shape)} does not broadcast to output shape {tuple(o.shape)}")


@builtin("expand", unit="vector", check=_check_expand, work=_vector_work(0), parallel_dim=_out_numel)
def _expand_run(ctx, inputs, outputs, attrs):
    """out = x broadcast to the output's shape (numpy rules)"""
    x, out = inputs[0], outputs[0]
    for box in _block_boxes(ctx, out.shape):
        np.copyto(out[box + (Ellipsis,)], _sub(x, box, out.ndim) if box else x)


# ---------------------------------------------------------------------------------------------------
# fused_matmul: matmul + bias + activation in one kernel (what the compiler's MatMul+Add(+act) fusion emits)
# ---------------------------------------------------------------------------------------------------

def _relu_inplace(o):
    np.maximum(o, 0, out=o)


#: activations a fused kernel applies to its output in place (alias-safe functions)
ACTIVATIONS = {
    "none": None,
    "relu": _relu_inplace,
    "gelu": lambda o: _GELU["none"](o, out=o),
    "gelu_tanh": lambda o: _GELU["tanh"](o, out=o),
    "tanh": lambda o: np.tanh(o, out=o),
    "sigmoid": lambda o: _SIGMOID(o, out=o),
}
_ACT_FLOPS = {"none": 0, "relu": 1, "gelu": 30, "gelu_tanh": 10, "tanh": 6, "sigmoid": 5}


def _act(o, name) -> None:
    fn = ACTIVATIONS[name]
    if fn is not None and o.size:
        fn(o)


def _check_fused_matmul(inputs, outputs, attrs):
    _check_matmul(inputs, outputs, attrs, "fused_matmul")
    _choice_attr("fused_matmul", attrs, "act", "none", tuple(ACTIVATIONS))


def _fused_matmul_work(inputs, outputs, attrs):
    w = _matmul_work(inputs, outputs, attrs)
    return Work(flops=w.flops + _ACT_FLOPS[attrs.get("act", "none")] * outputs[0].numel, bytes=w.bytes,
                unit="cube", fp16=w.fp16)


#: rows of a fused_matmul output computed (GEMM, bias, activation) per chunk: the activation's many
#: elementwise passes then run on data still in cache instead of streaming the whole output each time
_EPILOGUE_BYTES = 256 << 10


def _mm_act(a, bt, bias, out, act) -> None:
    if act == "none":
        _mm(a, bt, bias, out)
        return
    rows = max(1, _EPILOGUE_BYTES // max(1, out.shape[1] * out.itemsize))
    for r in range(0, out.shape[0], rows):
        s = slice(r, r + rows)
        _mm(a[s], bt, bias, out[s])
        _act(out[s], act)


@builtin("fused_matmul", unit="cube", check=_check_fused_matmul, work=_fused_matmul_work, parallel_dim=_matmul_pd)
@_quiet
def _fused_matmul_run(ctx, inputs, outputs, attrs):
    """out[M,N] = act(a[M,K] @ b[K,N] (b[N,K] with transpose_b) (+ bias[N])); attr act: none, relu, gelu
    (erf), gelu_tanh, tanh, sigmoid.  The activation is applied chunk by chunk of output rows, right
    after each chunk's GEMM (a fused epilogue)."""
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    out = outputs[0]
    act = attrs.get("act", "none")
    bt = b.T if attrs.get("transpose_b", False) else b
    if ctx.block_dim == 1:
        _mm_act(a, bt, bias, out, act)
        return
    m, n = out.shape
    if _mm_split_n(m, n):
        r = ctx.split(n)
        if r:
            s = slice(r.start, r.stop)
            _mm_act(a, bt[:, s], None if bias is None else bias[s], out[:, s], act)
    else:
        r = ctx.split(m)
        if r:
            s = slice(r.start, r.stop)
            _mm_act(a[s], bt, bias, out[s], act)


# ---------------------------------------------------------------------------------------------------
# conv2d, pools, batch_norm (NCHW)
# ---------------------------------------------------------------------------------------------------

def _pair_attr(nm, attrs, key, default, lo=1):
    v = attrs.get(key, default)
    _need(isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(i) and i >= lo for i in v), nm,
          f"attr {key!r} must be 2 ints >= {lo}, got {v!r}")
    return int(v[0]), int(v[1])


def _pads_attr(nm, attrs):
    v = attrs.get("pads", (0, 0, 0, 0))
    _need(isinstance(v, (tuple, list)) and len(v) == 4 and all(_is_int(i) and i >= 0 for i in v), nm,
          f"attr 'pads' must be 4 ints >= 0 (top, left, bottom, right), got {v!r}")
    return tuple(int(i) for i in v)


def window_out(n, k, stride, dil, pad_lo, pad_hi, ceil=False) -> int:
    """Output length of a sliding window (ONNX/PyTorch rules; with ceil the last window must start
    inside the input or its leading pad)."""
    span = dil * (k - 1) + 1
    room = n + pad_lo + pad_hi - span
    if room < 0:
        return 0
    out = (-(-room // stride) if ceil else room // stride) + 1
    if ceil and (out - 1) * stride >= n + pad_lo:
        out -= 1
    return out


def _check_conv2d(inputs, outputs, attrs):
    nm = "conv2d"
    _arity(nm, inputs, outputs, (2, 3))
    x, w, o = inputs[0], inputs[1], outputs[0]
    _ndim(nm, x, "x", 4, 4)
    _ndim(nm, w, "weight", 4, 4)
    _dtype_in(nm, x, FLOATS, "x")
    _same_dtype(nm, ("x", x), ("weight", w), ("output", o))
    g = _int_attr(nm, attrs, "groups", 1)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    _need(g >= 1 and c % g == 0 and m % g == 0, nm, f"groups {g} must divide input channels {c} and output "
                                                    f"channels {m}")
    _need(cg == c // g, nm, f"weight shape {tuple(w.shape)} needs C/groups = {c // g} input channels, has {cg}")
    if len(inputs) == 3:
        _same_dtype(nm, ("x", x), ("bias", inputs[2]))
        _shape_is(nm, inputs[2], (m,), "bias")
    sh, sw = _pair_attr(nm, attrs, "strides", (1, 1))
    dh, dw = _pair_attr(nm, attrs, "dilations", (1, 1))
    pt, pl, pb, pr = _pads_attr(nm, attrs)
    _choice_attr(nm, attrs, "act", "none", tuple(ACTIVATIONS))
    ho, wo = window_out(h, kh, sh, dh, pt, pb), window_out(wd, kw, sw, dw, pl, pr)
    _need(ho >= 1 and wo >= 1, nm, f"kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit the padded input "
                                   f"{h + pt + pb}x{wd + pl + pr}")
    _shape_is(nm, o, (n, m, ho, wo))


def _conv_pd(inputs, outputs, attrs):
    return outputs[0].shape[0] * outputs[0].shape[2]


def _conv_work(inputs, outputs, attrs):
    m, cg, kh, kw = inputs[1].shape
    n, _, ho, wo = outputs[0].shape
    return _cube_work(inputs, outputs, 2.0 * n * m * ho * wo * cg * kh * kw)


def _padded_rows(xn, r0, r1, pl, pr, ct):
    """Rows [r0, r1) of the zero-padded image ``xn`` [C, H, W] (r0 may be < 0, r1 > H), padded left/right."""
    c, h, w = xn.shape
    slab = np.zeros((c, r1 - r0, w + pl + pr), ct)
    a, b = max(r0, 0), min(r1, h)
    if b > a:
        slab[:, a - r0:b - r0, pl:pl + w] = xn[:, a:b]
    return slab


def _windows(slab, kh, kw, sh, sw, dh, dw, rows, cols):
    """[C, rows, cols, kh, kw] strided view of the sliding windows of ``slab``."""
    sv = np.lib.stride_tricks.sliding_window_view(slab, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(1, 2))
    return sv[:, ::sh, ::sw, ::dh, ::dw][:, :rows, :cols]


@builtin("conv2d", unit="cube", check=_check_conv2d, work=_conv_work, parallel_dim=_conv_pd)
@_quiet
def _conv2d_run(ctx, inputs, outputs, attrs):
    """2-D convolution, NCHW: x [N,C,H,W], weight [M,C/groups,kh,kw], optional bias [M]; attrs strides,
    pads (top, left, bottom, right), dilations, groups, act (as fused_matmul's).  Float16 accumulates in
    float32.  Blocks split the output rows N*Ho."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    out = outputs[0]
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    g = int(attrs.get("groups", 1))
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    ho, wo = out.shape[2], out.shape[3]
    ct = _compute_dtype(out.dtype)
    wf = w.astype(ct) if w.dtype != ct else w
    bf = None if bias is None else (bias.astype(ct) if bias.dtype != ct else bias)
    act = attrs.get("act", "none")
    rows = range(n * ho) if ctx.block_dim == 1 else ctx.split(n * ho)
    i = rows.start
    while i < rows.stop:
        b, h0 = divmod(i, ho)
        h1 = min(ho, h0 + rows.stop - i)
        i += h1 - h0
        slab = _padded_rows(x[b], h0 * sh - pt, (h1 - 1) * sh - pt + dh * (kh - 1) + 1, pl, pr, ct)
        win = _windows(slab, kh, kw, sh, sw, dh, dw, h1 - h0, wo)           # [C, r, Wo, kh, kw]
        if g == 1:
            res = np.tensordot(wf, win, axes=([1, 2, 3], [0, 3, 4]))       # [M, r, Wo]
        else:
            res = np.einsum("gmckl,gcrwkl->gmrw", wf.reshape(g, m // g, cg, kh, kw),
                            win.reshape((g, cg) + win.shape[1:]), optimize=True).reshape(m, h1 - h0, wo)
        if bf is not None:
            res += bf[:, None, None]
        _act(res, act)
        np.copyto(out[b, :, h0:h1], res, casting="same_kind")


def _check_pool(nm, avg):
    def check(inputs, outputs, attrs):
        _arity(nm, inputs, outputs, 1)
        x, o = inputs[0], outputs[0]
        _ndim(nm, x, "x", 4, 4)
        _dtype_in(nm, x, FLOATS, "x")
        _same_dtype(nm, ("x", x), ("output", o))
        kh, kw = _pair_attr(nm, attrs, "kernel_shape", None)
        sh, sw = _pair_attr(nm, attrs, "strides", (1, 1))
        dh, dw = _pair_attr(nm, attrs, "dilations", (1, 1))
        pt, pl, pb, pr = _pads_attr(nm, attrs)
        _need(pt < dh * (kh - 1) + 1 and pb < dh * (kh - 1) + 1 and pl < dw * (kw - 1) + 1 and
              pr < dw * (kw - 1) + 1, nm, f"pads {(pt, pl, pb, pr)} must be smaller than the window")
        ceil = _bool_attr(nm, attrs, "ceil_mode")
        if avg:
            _bool_attr(nm, attrs, "count_include_pad")
        n, c, h, w = x.shape
        ho, wo = window_out(h, kh, sh, dh, pt, pb, ceil), window_out(w, kw, sw, dw, pl, pr, ceil)
        _need(ho >= 1 and wo >= 1, nm, f"window {kh}x{kw} does not fit the padded input {h + pt + pb}x{w + pl + pr}")
        _shape_is(nm, o, (n, c, ho, wo))
    return check


def _pool_pd(inputs, outputs, attrs):
    return outputs[0].shape[0] * outputs[0].shape[1]


def _pool_work(inputs, outputs, attrs):
    kh, kw = attrs["kernel_shape"]
    return Work(flops=float(outputs[0].numel * kh * kw), bytes=_io_bytes(inputs, outputs), unit="vector")


def _pool_geometry(x, out, attrs):
    kh, kw = attrs["kernel_shape"]
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    h, w = x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    eb = max(pb, (ho - 1) * sh + dh * (kh - 1) + 1 - h - pt)     # bottom/right incl. ceil_mode's extra
    er = max(pr, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pl)
    return (kh, kw, sh, sw, dh, dw), (pt, pl, pb, pr), (eb, er), (ho, wo)


def _pool_run(avg):
    def run(ctx, inputs, outputs, attrs):
        x, out = inputs[0], outputs[0]
        win, (pt, pl, pb, pr), (eb, er), (ho, wo) = _pool_geometry(x, out, attrs)
        kh, kw, sh, sw, dh, dw = win
        n, c, h, w = x.shape
        ct = _compute_dtype(out.dtype)
        planes = x.reshape(n * c, h, w)
        o3 = out.reshape((n * c, ho, wo), copy=False)
        r = range(n * c) if ctx.block_dim == 1 else ctx.split(n * c)
        if not r:
            return
        fill = 0.0 if avg else -np.inf
        slab = np.full((len(r), pt + h + eb, pl + w + er), fill, ct)
        slab[:, pt:pt + h, pl:pl + w] = planes[r.start:r.stop]
        v = _windows(slab, kh, kw, sh, sw, dh, dw, ho, wo)                 # [planes, Ho, Wo, kh, kw]
        if not avg:
            np.copyto(o3[r.start:r.stop], v.max(axis=(3, 4)), casting="same_kind")
            return
        mask = np.zeros((1,) + slab.shape[1:], ct)
        if attrs.get("count_include_pad", False):
            mask[:, :pt + h + pb, :pl + w + pr] = 1          # explicit pads count, ceil_mode's extra does not
        else:
            mask[:, pt:pt + h, pl:pl + w] = 1
        cnt = _windows(mask, kh, kw, sh, sw, dh, dw, ho, wo).sum(axis=(3, 4))
        s = v.sum(axis=(3, 4))
        np.divide(s, cnt, out=s)
        np.copyto(o3[r.start:r.stop], s, casting="same_kind")
    return run


_MAXPOOL = _pool_run(False)
_MAXPOOL.__doc__ = "Max pooling, NCHW; attrs kernel_shape, strides, pads (top, left, bottom, right), dilations, ceil_mode"
_AVGPOOL = _pool_run(True)
_AVGPOOL.__doc__ = ("Average pooling, NCHW; attrs kernel_shape, strides, pads, dilations, ceil_mode, "
                    "count_include_pad (the extra windows of ceil_mode never count padding)")
builtin("max_pool2d", unit="vector", check=_check_pool("max_pool2d", False), work=_pool_work,
        parallel_dim=_pool_pd)(_quiet(_MAXPOOL))
builtin("avg_pool2d", unit="vector", check=_check_pool("avg_pool2d", True), work=_pool_work,
        parallel_dim=_pool_pd)(_quiet(_AVGPOOL))


def _check_batch_norm(inputs, outputs, attrs):
    nm = "batch_norm"
    _arity(nm, inputs, outputs, 5)
    x, o = inputs[0], outputs[0]
    _ndim(nm, x, "x", 2)
    _dtype_in(nm, x, FLOATS, "x")
    _same_dtype(nm, ("x", x), ("output", o))
    c = x.shape[1]
    for what, p in zip(("scale", "bias", "mean", "var"), inputs[1:]):
        _shape_is(nm, p, (c,), what)
        _need(p.dtype in (x.dtype, "float32"), nm, f"{what} dtype {p.dtype} must be the input's ({x.dtype}) or float32")
    _shape_is(nm, o, x.shape)
    eps = _num_attr(nm, attrs, "eps", 1e-5)
    _need(eps >= 0, nm, f"attr 'eps' must be >= 0, got {eps!r}")


@builtin("batch_norm", unit="vector", check=_check_batch_norm, work=_vector_work(2), parallel_dim=_out_numel)
@_quiet
def _batch_norm_run(ctx, inputs, outputs, attrs):
    """Inference batch norm over channel axis 1: (x - mean) / sqrt(var + eps) * scale + bias (inputs x,
    scale, bias, mean, var; attr eps)"""
    x, scale, bias, mean, var = inputs
    out = outputs[0]
    ct = _compute_dtype(out.dtype)
    a = scale.astype(F64) / np.sqrt(var.astype(F64) + float(attrs.get("eps", 1e-5)))
    b = bias.astype(F64) - mean.astype(F64) * a
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    a, b = a.astype(ct).reshape(shape), b.astype(ct).reshape(shape)

    def fn(xv, av, bv, out):
        if out.dtype == ct:
            np.multiply(xv, av, out=out)
            out += bv
        else:
            np.copyto(out, xv.astype(ct) * av + bv, casting="same_kind")
    _ew_apply(ctx, fn, (x, a, b), out)
