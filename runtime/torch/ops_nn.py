"""aten operators of neural-network layers and of generation loops, as vnpu kernels: attention
(``scaled_dot_product_attention`` through the PrivateUse1 "overrideable" fused path onto the ``attention``
kernel), conv2d, max/avg pool, log_softmax, cat/stack, comparisons and logic, sin/cos/log/abs,
maximum/minimum, cumsum, argmax/max, any/all, masked_fill, arange, ``.item()``.  All only order the
device except ``.item()`` / ``is_nonzero`` (they wait for the value, host-blocking, as on any device)."""
from __future__ import annotations

import math

import torch

from . import fallback
from . import context
from .ops_core import FACTORIES, impl, scalar_value
from .ops_math import cast_to, operand, reduce, unary
from .tensor import KERNEL_DTYPE, broadcast, result_dtype, NpuTensor, device_of, launch, new_empty, to_cpu, upload

aten = torch.ops.aten


def _cpu(func, *args, **kwargs):
    return fallback.run_on_cpu(func, args, kwargs, why=" for these operands")


# ---------------------------------------------------------------------------------------------- elementwise
for _op, _k in ((aten.sin.default, "sin"), (aten.cos.default, "cos"), (aten.log.default, "log")):
    impl(_op)(lambda x, _op=_op, _k=_k: unary(_op, _k, x))
impl(aten.abs.default)(lambda x: unary(aten.abs.default, "abs", x, floats_only=False))

_COMPARE = {aten.lt.Tensor: "less", aten.lt.Scalar: "less", aten.le.Tensor: "less_equal",
            aten.le.Scalar: "less_equal", aten.gt.Tensor: "greater", aten.gt.Scalar: "greater",
            aten.ge.Tensor: "greater_equal", aten.ge.Scalar: "greater_equal", aten.ne.Tensor: "not_equal",
            aten.ne.Scalar: "not_equal"}


def _compare(func, kernel, a, b, out_dtype=torch.bool):
    dtype = result_dtype(a, b)
    if KERNEL_DTYPE.get(dtype) is None:
        return _cpu(func, a, b)
    idx = device_of(a, b)
    x, y = operand(a, dtype, idx), operand(b, dtype, idx)
    out = new_empty(idx, broadcast(x.shape, y.shape), out_dtype)
    launch(kernel, [x, y], [out])
    return out


for _op, _k in _COMPARE.items():
    impl(_op)(lambda a, b, _op=_op, _k=_k: _compare(_op, _k, a, b))

_LOGIC = {aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
          aten.logical_xor.default: "logical_xor", aten.bitwise_and.Tensor: "logical_and",
          aten.bitwise_or.Tensor: "logical_or", aten.bitwise_xor.Tensor: "logical_xor"}


def _logic(func, kernel, a, b):
    bitwise = func in (aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor)
    if bitwise and not (a.dtype == torch.bool and getattr(b, "dtype", None) == torch.bool):
        return _cpu(func, a, b)               # integer bitwise ops: no vnpu kernel
    idx = device_of(a, b)
    x, y = operand(a, torch.bool, idx), operand(b, torch.bool, idx)
    out = new_empty(idx, broadcast(x.shape, y.shape), torch.bool)
    launch(kernel, [x, y], [out])
    return out


for _op, _k in _LOGIC.items():
    impl(_op)(lambda a, b, _op=_op, _k=_k: _logic(_op, _k, a, b))


@impl(aten.logical_not.default, aten.bitwise_not.default)
def logical_not(x):
    if x.dtype != torch.bool:
        return _cpu(aten.bitwise_not.default, x)
    out = new_empty(x.vstorage.dev.index, x.shape, torch.bool)
    launch("logical_not", [x], [out])
    return out


def _minmax(func, kernel, a, b):
    dtype = result_dtype(a, b)
    if KERNEL_DTYPE.get(dtype) in (None, "bool"):
        return _cpu(func, a, b)
    idx = device_of(a, b)
    x, y = operand(a, dtype, idx), operand(b, dtype, idx)
    out = new_empty(idx, broadcast(x.shape, y.shape), dtype)
    launch(kernel, [x, y], [out])
    return out


impl(aten.maximum.default)(lambda a, b: _minmax(aten.maximum.default, "maximum", a, b))
impl(aten.minimum.default)(lambda a, b: _minmax(aten.minimum.default, "minimum", a, b))


@impl(aten.clamp_min.default)
def clamp_min(x, min):
    if KERNEL_DTYPE.get(x.dtype) in (None, "bool"):
        return _cpu(aten.clamp_min.default, x, min)
    return unary(aten.clamp_min.default, "clip", x, {"min": scalar_value(min, x.dtype), "max": None},
                  floats_only=False)


@impl(aten.masked_fill.Scalar)
def masked_fill(x, mask, value):
    if KERNEL_DTYPE.get(x.dtype) is None:
        return _cpu(aten.masked_fill.Scalar, x, mask, value)
    idx = device_of(x, mask)
    fill = new_empty(idx, (), x.dtype)
    launch("fill", [], [fill], {"value": scalar_value(value, x.dtype)})
    out = new_empty(idx, broadcast(x.shape, mask.shape), x.dtype)
    launch("where", [cast_to(mask, torch.bool), fill, x], [out])
    return out


@impl(aten.rsub.Scalar)
def rsub(x, other, alpha=1):
    if KERNEL_DTYPE.get(x.dtype) in (None, "bool"):
        return _cpu(aten.rsub.Scalar, x, other, alpha)
    out = new_empty(x.vstorage.dev.index, x.shape, x.dtype)
    launch("mul_scalar", [x], [out], {"value": scalar_value(-alpha, x.dtype)})
    launch("add_scalar", [out], [out], {"value": scalar_value(other, x.dtype)})
    return out


# ---------------------------------------------------------------------------------------------- reductions
@impl(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    dt = dtype or (torch.int64 if not x.dtype.is_floating_point else x.dtype)
    if KERNEL_DTYPE.get(dt) in (None, "bool"):
        return _cpu(aten.cumsum.default, x, dim, dtype=dtype)
    src = cast_to(x, dt)
    out = new_empty(x.vstorage.dev.index, x.shape, dt)
    launch("cumsum", [src], [out], {"axis": dim % max(1, x.dim())})
    return out


@impl(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    if KERNEL_DTYPE.get(x.dtype) in (None, "bool") or x.numel() == 0:
        return _cpu(aten.argmax.default, x, dim, keepdim)
    if dim is None:
        x, dim, keepdim = x.reshape(-1), 0, False
    shape = [1 if i == dim % x.dim() else n for i, n in enumerate(x.shape)] if keepdim else \
        [n for i, n in enumerate(x.shape) if i != dim % x.dim()]
    out = new_empty(x.vstorage.dev.index, shape, torch.int64)
    launch("argmax", [x], [out], {"axis": dim % x.dim(), "keepdims": bool(keepdim)})
    return out


@impl(aten.max.default)
def max_all(x):
    if KERNEL_DTYPE.get(x.dtype) in (None, "bool") or x.numel() == 0:
        return _cpu(aten.max.default, x)
    return reduce(aten.max.default, "reduce_max", x, None, False)


@impl(aten.min.default)
def min_all(x):
    if KERNEL_DTYPE.get(x.dtype) in (None, "bool") or x.numel() == 0:
        return _cpu(aten.min.default, x)
    return reduce(aten.min.default, "reduce_min", x, None, False)


def _any_all(func, kernel, x, dim=None, keepdim=False):
    if x.numel() == 0 or KERNEL_DTYPE.get(x.dtype) is None:
        return _cpu(func, x) if dim is None else _cpu(func, x, dim, keepdim)
    b = cast_to(x, torch.bool) if x.dtype != torch.bool else x
    r = reduce(func, kernel, cast_to(b, torch.uint8), dim if dim is None or isinstance(dim, (list, tuple)) else [dim],
                keepdim)
    return cast_to(r, torch.bool)


impl(aten.any.default)(lambda x: _any_all(aten.any.default, "reduce_max", x))
impl(aten.all.default)(lambda x: _any_all(aten.all.default, "reduce_min", x))
impl(aten.any.dim)(lambda x, dim, keepdim=False: _any_all(aten.any.dim, "reduce_max", x, dim, keepdim))
impl(aten.all.dim)(lambda x, dim, keepdim=False: _any_all(aten.all.dim, "reduce_min", x, dim, keepdim))


@impl(aten._local_scalar_dense.default)
def item(x):
    """``.item()``: waits for the value (host-blocking)."""
    return to_cpu(x).item()


@impl(aten.is_nonzero.default)
def is_nonzero(x):
    return bool(to_cpu(x).item())


# ---------------------------------------------------------------------------------------------- factories on the host
def _arange(start, end, step, dtype, device):
    """The values are made on the host and uploaded (as ``torch.tensor(list, device=...)`` is); only orders
    the device."""
    vals = torch.arange(start, end, step, dtype=dtype)
    out = new_empty(torch.device(device).index if device is not None and torch.device(device).index is not None
                    else context.current_index(), vals.shape, vals.dtype)
    upload(out, vals)
    return out


def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange(start, end, step, dtype, device)


def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange(start, end, 1, dtype, device)


def arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange(0, end, 1, dtype, device)


FACTORIES.update({"arange.start_step": arange_start_step, "arange.start": arange_start, "arange": arange_end})


# ---------------------------------------------------------------------------------------------- shape
@impl(aten.cat.default)
def cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]      # torch's legacy empty 1-D
    if not ts:
        return new_empty(device_of(*tensors), (0,), tensors[0].dtype)
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if KERNEL_DTYPE.get(dtype) is None:
        return _cpu(aten.cat.default, list(tensors), dim)
    idx = device_of(*ts)
    d = dim % ts[0].dim()
    shape = list(ts[0].shape)
    shape[d] = sum(t.shape[d] for t in ts)
    out = new_empty(idx, shape, dtype)
    parts = [cast_to(t, dtype) for t in ts if t.shape[d] > 0]
    if out.numel() and parts:
        launch("concat", parts, [out], {"axis": d})
    return out


# ---------------------------------------------------------------------------------------------- softmax family
@impl(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    if half_to_float or x.dim() == 0 or KERNEL_DTYPE.get(x.dtype) not in ("float32", "float16", "float64"):
        return _cpu(aten._log_softmax.default, x, dim, half_to_float)
    out = new_empty(x.vstorage.dev.index, x.shape, x.dtype)
    launch("softmax", [x], [out], {"axis": dim % x.dim()})
    launch("log", [out], [out])
    return out


@impl(aten._safe_softmax.default)
def safe_softmax(x, dim, dtype=None):
    """softmax where a row of only -inf gives zeros (SDPA's math path): the vnpu softmax kernel's own rule."""
    if (dtype is not None and dtype != x.dtype) or x.dim() == 0 or \
            KERNEL_DTYPE.get(x.dtype) not in ("float32", "float16", "float64"):
        return _cpu(aten._safe_softmax.default, x, dim, dtype)
    out = new_empty(x.vstorage.dev.index, x.shape, x.dtype)
    launch("softmax", [x], [out], {"axis": dim % x.dim()})
    return out


@impl(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad, output, dim, input_dtype):
    """grad - exp(output) * sum(grad, dim): the backward of log_softmax from vnpu kernels."""
    if grad.dtype != output.dtype or KERNEL_DTYPE.get(grad.dtype) not in ("float32", "float16", "float64") \
            or input_dtype != grad.dtype:
        return _cpu(aten._log_softmax_backward_data.default, grad, output, dim, input_dtype)
    s = reduce(aten.sum.dim_IntList, "reduce_sum", grad, [dim], True)
    e = unary(aten.exp.default, "exp", output)
    return aten.sub.Tensor(grad, aten.mul.Tensor(e, s))


@impl(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    """grad where x > threshold, else 0 (ReLU's backward)."""
    dtype = grad.dtype
    if KERNEL_DTYPE.get(dtype) in (None, "bool") or x.dtype != dtype:
        return _cpu(aten.threshold_backward.default, grad, x, threshold)
    idx = device_of(grad, x)
    keep = _compare(aten.gt.Scalar, "greater", x, threshold)
    zero = new_empty(idx, (), dtype)
    launch("fill", [], [zero], {"value": scalar_value(0, dtype)})
    out = new_empty(idx, broadcast(grad.shape, x.shape), dtype)
    launch("where", [keep, grad, zero], [out])
    return out


# ---------------------------------------------------------------------------------------------- attention
def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` for npu tensors, registered for the AutogradPrivateUse1 key (torch's
    fused-attention choice is C++-only for PrivateUse1): softmax(q k^T * scale + mask [causal, top-left
    aligned as torch's]) v on the ``attention`` kernel (GQA when ``enable_gqa`` or heads differ).  Dropout,
    autograd recording, or operands the kernel cannot take run torch's math path (its pieces dispatch here
    again, so autograd records them)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)
                                           if isinstance(t, torch.Tensor))
    ok = (not grad and dropout_p == 0.0 and query.dim() == 4 and key.dim() == 4 and key.shape[2] >= 1
          and all(isinstance(t, NpuTensor) for t in (query, key, value))
          and KERNEL_DTYPE.get(query.dtype) in ("float32", "float16", "float64")
          and query.dtype == key.dtype == value.dtype and query.shape[1] % key.shape[1] == 0
          and (enable_gqa or query.shape[1] == key.shape[1]))
    if not ok:
        return torch.ops.aten._scaled_dot_product_attention_math.default(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
    b, h, sq = query.shape[0], query.shape[1], query.shape[2]
    idx = device_of(query, key, value)
    ins = [query, key, value]
    if attn_mask is not None:
        ins.append(_additive_mask(attn_mask, query.dtype, idx))
    out = new_empty(idx, (b, h, sq, value.shape[3]), query.dtype)
    attrs: dict = {"scale": float(scale) if scale is not None else 1.0 / math.sqrt(query.shape[3])}
    if is_causal:
        attrs.update(causal=True, q_offset=0)
    launch("attention", ins, [out], attrs)
    return out


#: the operators registered for the AutogradPrivateUse1 key (above autograd: they choose between a vnpu
#: kernel and a recorded decomposition themselves)
AUTOGRAD_LEVEL: dict = {"scaled_dot_product_attention": sdpa}


def _additive_mask(mask, dtype, idx):
    if mask.dtype != torch.bool:
        return operand(mask, dtype, idx)
    zero, ninf = new_empty(idx, (), dtype), new_empty(idx, (), dtype)
    launch("fill", [], [zero], {"value": 0.0})
    launch("fill", [], [ninf], {"value": float("-inf")})
    m = operand(mask, torch.bool, idx)
    out = new_empty(idx, m.shape, dtype)
    launch("where", [m, zero, ninf], [out])
    return out


# ---------------------------------------------------------------------------------------------- conv / pool
@impl(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if x.dim() == 3 and not transposed:                  # unbatched (C, H, W)
        return convolution(x.unsqueeze(0), w, bias, stride, padding, dilation, transposed, output_padding,
                           groups).squeeze(0)
    if transposed or x.dim() != 4 or KERNEL_DTYPE.get(x.dtype) not in ("float32", "float16", "float64") \
            or (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w, bias))):
        return _cpu(aten.convolution.default, x, w, bias, stride, padding, dilation, transposed, output_padding,
                    groups)
    idx = device_of(x, w, bias)
    n, _c, hh, ww = x.shape
    m, _cg, kh, kw = w.shape
    ho = (hh + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (ww + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = new_empty(idx, (n, m, ho, wo), x.dtype)
    attrs = {"strides": tuple(stride), "dilations": tuple(dilation), "groups": int(groups),
             "pads": (padding[0], padding[1], padding[0], padding[1])}
    launch("conv2d", [x, w] + ([bias] if bias is not None else []), [out], attrs)
    return out


def _pool_attrs(kernel_size, stride, padding, dilation, ceil_mode):
    kh, kw = (kernel_size * 2)[:2] if len(kernel_size) == 1 else kernel_size
    st = stride if stride else (kh, kw)
    sh, sw = (st * 2)[:2] if len(st) == 1 else st
    ph, pw = (padding * 2)[:2] if len(padding) == 1 else padding
    return {"kernel_shape": (kh, kw), "strides": (sh, sw), "pads": (ph, pw, ph, pw),
            "dilations": tuple((dilation * 2)[:2] if len(dilation) == 1 else dilation), "ceil_mode": bool(ceil_mode)}


def max_pool2d(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    """``max_pool2d`` for npu tensors at the AutogradPrivateUse1 key: the ``max_pool2d`` kernel when autograd
    does not record (it has no indices), else ``max_pool2d_with_indices`` (recorded; CPU fallback)."""
    if x.dim() != 4 or KERNEL_DTYPE.get(x.dtype) not in ("float32", "float16", "float64") or not isinstance(
            x, NpuTensor) or (torch.is_grad_enabled() and x.requires_grad):
        return aten.max_pool2d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[0]
    attrs = _pool_attrs(kernel_size, stride, padding, dilation, ceil_mode)
    meta = torch.nn.functional.max_pool2d(torch.empty(x.shape, device="meta"), attrs["kernel_shape"],
                                          attrs["strides"], attrs["pads"][:2], attrs["dilations"], ceil_mode)
    out = new_empty(x.vstorage.dev.index, meta.shape, x.dtype)
    launch("max_pool2d", [x], [out], attrs)
    return out


@impl(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if x.dim() != 4 or divisor_override is not None or KERNEL_DTYPE.get(x.dtype) not in ("float32", "float16",
                                                                                          "float64"):
        return _cpu(aten.avg_pool2d.default, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                    divisor_override)
    attrs = _pool_attrs(kernel_size, stride, padding, (1,), ceil_mode)
    attrs["count_include_pad"] = bool(count_include_pad)
    meta = torch.nn.functional.avg_pool2d(torch.empty(x.shape, device="meta"), attrs["kernel_shape"],
                                          attrs["strides"], attrs["pads"][:2], ceil_mode, count_include_pad)
    out = new_empty(x.vstorage.dev.index, meta.shape, x.dtype)
    launch("avg_pool2d", [x], [out], attrs)
    return out


AUTOGRAD_LEVEL["max_pool2d"] = max_pool2d


@impl(aten.stack.default)
def stack(tensors, dim=0):
    d = dim % (tensors[0].dim() + 1)
    return cat([t.unsqueeze(d) for t in tensors], d)
