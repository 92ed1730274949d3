"""aten math operators as vnpu kernels (priced by the cost model, seen by ``vnpu prof`` and ``vnpu sanitize``):
matmul family, elementwise arithmetic and activations, softmax, layer norm, embedding, reductions,
cat, where/comparisons.  An operand combination a kernel cannot take (a dtype vnpu has no kernel for,
an unsupported argument) goes to the CPU fallback, counted (:mod:`.fallback`).  All only order the device.
"""
from __future__ import annotations

from typing import cast

import torch

from . import fallback
from .ops_core import impl, scalar_value
from .tensor import KERNEL_DTYPE, broadcast, result_dtype, NpuTensor, device_of, launch, new_empty, upload

aten = torch.ops.aten


def _cpu_fallback(func, *args, **kwargs):
    return fallback.run_on_cpu(func, args, kwargs, why=" for these operands")


def cast_to(t: NpuTensor, dtype: torch.dtype) -> NpuTensor:
    if t.dtype == dtype:
        return t
    out = new_empty(t.vstorage.dev.index, t.shape, dtype)
    launch("cast", [t], [out])
    return out


def operand(x, dtype, index: int) -> NpuTensor:
    """A tensor operand of ``dtype`` on npu:index (a CPU scalar tensor or a number is uploaded)."""
    if isinstance(x, NpuTensor):
        return cast_to(x, dtype)
    t = new_empty(index, getattr(x, "shape", ()), dtype)
    upload(t, torch.as_tensor(x, dtype=dtype))
    return t


def _is_scalar(x) -> bool:
    return not isinstance(x, torch.Tensor) or (not isinstance(x, NpuTensor) and x.dim() == 0)


# ---------------------------------------------------------------------------------------------- elementwise
_SCALAR_KERNEL = {"add": "add_scalar", "mul": "mul_scalar"}


def binary(func, name, a, b, alpha=1, out=None):
    """``name`` (add, sub, mul, div, pow) with torch's type promotion and broadcasting."""
    dtype = result_dtype(a, b) if out is None else out.dtype
    if name == "div" and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if KERNEL_DTYPE.get(dtype) is None or (name in ("div", "pow") and not dtype.is_floating_point):
        return _cpu_fallback(func, a, b, **({"alpha": alpha} if alpha != 1 else {}))
    if not isinstance(a, NpuTensor):
        a, b = (b, a) if name in ("add", "mul") and alpha == 1 else (a, b)
    idx = device_of(a, b)
    a = operand(a, dtype, idx)
    shape = broadcast(a.shape, b.shape if isinstance(b, torch.Tensor) else ())
    if out is None:
        out = new_empty(idx, shape, dtype)
    if _is_scalar(b) and name in ("add", "sub", "mul", "div") and tuple(a.shape) == tuple(shape):
        v = scalar_value(b, dtype)
        if name in ("add", "sub"):
            launch("add_scalar", [a], [out], {"value": v * alpha * (-1 if name == "sub" else 1)})
        else:
            launch("mul_scalar", [a], [out], {"value": v if name == "mul" else 1.0 / v})
        return out
    b = operand(b, dtype, idx)
    launch(name, [a, b], [out], {"alpha": scalar_value(alpha, dtype)} if alpha != 1 else None)
    return out


def _binary_ops(name, *overloads, inplace=()):
    for op in overloads:
        impl(op)(lambda a, b, *, alpha=1, _op=op: binary(_op, name, a, b, alpha))
    for op in inplace:
        impl(op)(lambda a, b, *, alpha=1, _op=op: binary(_op, name, a, b, alpha, out=a))


_binary_ops("add", aten.add.Tensor, aten.add.Scalar, inplace=(aten.add_.Tensor, aten.add_.Scalar))
_binary_ops("sub", aten.sub.Tensor, aten.sub.Scalar, inplace=(aten.sub_.Tensor, aten.sub_.Scalar))
_binary_ops("mul", aten.mul.Tensor, aten.mul.Scalar, inplace=(aten.mul_.Tensor, aten.mul_.Scalar))
_binary_ops("div", aten.div.Tensor, aten.div.Scalar, inplace=(aten.div_.Tensor, aten.div_.Scalar))
_binary_ops("pow", aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar)


def unary(func, kernel, x, attrs=None, floats_only=True, out=None):
    if KERNEL_DTYPE.get(x.dtype) is None or (floats_only and not x.dtype.is_floating_point):
        return _cpu_fallback(func, x, **(attrs or {})) if out is None else _cpu_fallback(func, x)
    out = new_empty(x.vstorage.dev.index, x.shape, x.dtype) if out is None else out
    launch(kernel, [x], [out], attrs)
    return out


for _op, _k, _fl in ((aten.relu.default, "relu", False), (aten.silu.default, "silu", True),
                     (aten.sigmoid.default, "sigmoid", True), (aten.tanh.default, "tanh", True),
                     (aten.exp.default, "exp", True), (aten.sqrt.default, "sqrt", True),
                     (aten.rsqrt.default, "rsqrt", True), (aten.neg.default, "neg", False),
                     (aten.erf.default, "erf", True)):
    impl(_op)(lambda x, _op=_op, _k=_k, _fl=_fl: unary(_op, _k, x, floats_only=_fl))
for _op, _k, _fl in ((aten.relu_.default, "relu", False), (aten.silu_.default, "silu", True),
                     (aten.sigmoid_.default, "sigmoid", True), (aten.tanh_.default, "tanh", True),
                     (aten.exp_.default, "exp", True), (aten.sqrt_.default, "sqrt", True),
                     (aten.rsqrt_.default, "rsqrt", True), (aten.neg_.default, "neg", False)):
    impl(_op)(lambda x, _op=_op, _k=_k, _fl=_fl: unary(_op, _k, x, floats_only=_fl, out=x))


@impl(aten.gelu.default)
def gelu(x, *, approximate="none"):
    return unary(aten.gelu.default, "gelu", x, {"approximate": approximate})


@impl(aten.clamp.default)
def clamp(x, min=None, max=None):
    if KERNEL_DTYPE.get(x.dtype) is None or isinstance(min, torch.Tensor) or isinstance(max, torch.Tensor):
        return _cpu_fallback(aten.clamp.default, x, min, max)
    return unary(aten.clamp.default, "clip", x, {"min": None if min is None else scalar_value(min, x.dtype),
                                                  "max": None if max is None else scalar_value(max, x.dtype)},
                  floats_only=False)


@impl(aten.where.self)
def where(cond, a, b):
    dtype = result_dtype(a, b)
    idx = device_of(*(t for t in (cond, a, b) if isinstance(t, NpuTensor)))
    if KERNEL_DTYPE.get(dtype) is None:
        return _cpu_fallback(aten.where.self, cond, a, b)
    c = operand(cond, torch.bool, idx)
    x, y = operand(a, dtype, idx), operand(b, dtype, idx)
    out = new_empty(idx, broadcast(c.shape, x.shape, y.shape), dtype)
    launch("where", [c, x, y], [out])
    return out


@impl(aten.eq.Tensor, aten.eq.Scalar)
def eq(a, b):
    dtype = result_dtype(a, b)
    if KERNEL_DTYPE.get(dtype) is None:
        return _cpu_fallback(aten.eq.Tensor if isinstance(b, torch.Tensor) else aten.eq.Scalar, a, b)
    idx = device_of(a, b)
    x, y = operand(a, dtype, idx), operand(b, dtype, idx)
    out = new_empty(idx, broadcast(x.shape, y.shape), torch.bool)
    launch("equal", [x, y], [out])
    return out


# ---------------------------------------------------------------------------------------------- matmul
def _mm_operand(b: NpuTensor) -> tuple[NpuTensor, bool]:
    """``b`` as a kernel operand: a transposed contiguous matrix is passed as-is with transpose_b."""
    if not b.is_contiguous() and b.dim() == 2 and b.t().is_contiguous():
        return cast(NpuTensor, b.t()), True      # torch's stubs: Tensor methods return Tensor
    return b, False


def _float_ok(*ts) -> bool:
    return all(KERNEL_DTYPE.get(t.dtype) in ("float32", "float16", "float64") for t in ts) and \
        len({t.dtype for t in ts}) == 1


@impl(aten.mm.default)
def mm(a, b):
    if not _float_ok(a, b):
        return _cpu_fallback(aten.mm.default, a, b)
    idx = device_of(a, b)
    out = new_empty(idx, (a.shape[0], b.shape[1]), a.dtype)
    bb, tb = _mm_operand(b)
    if out.numel():
        launch("matmul", [a, bb], [out], {"transpose_b": tb} if tb else None)
    return out


@impl(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    if not _float_ok(bias, a, b):
        return _cpu_fallback(aten.addmm.default, bias, a, b, beta=beta, alpha=alpha)
    idx = device_of(bias, a, b)
    n = b.shape[1]
    if beta == 1 and alpha == 1 and bias.dim() == 1 and bias.shape[0] == n:
        out = new_empty(idx, (a.shape[0], n), a.dtype)
        bb, tb = _mm_operand(b)
        launch("matmul", [a, bb, bias], [out], {"transpose_b": tb} if tb else None)
        return out
    prod = mm(a, b)
    if alpha != 1:
        prod = binary(aten.mul.Tensor, "mul", prod, alpha)
    return binary(aten.add.Tensor, "add", prod, bias, alpha=1) if beta == 1 else \
        binary(aten.add.Tensor, "add", prod, binary(aten.mul.Tensor, "mul", bias, beta))


@impl(aten.bmm.default)
def bmm(a, b):
    if not _float_ok(a, b):
        return _cpu_fallback(aten.bmm.default, a, b)
    idx = device_of(a, b)
    out = new_empty(idx, (a.shape[0], a.shape[1], b.shape[2]), a.dtype)
    attrs = {}
    if not b.is_contiguous() and b.transpose(-1, -2).is_contiguous():
        b, attrs["transpose_b"] = b.transpose(-1, -2), True
    if not a.is_contiguous() and a.transpose(-1, -2).is_contiguous():
        a, attrs["transpose_a"] = a.transpose(-1, -2), True
    if out.numel():
        launch("batch_matmul", [a, b], [out], attrs or None)
    return out


@impl(aten.baddbmm.default)
def baddbmm(self, a, b, *, beta=1, alpha=1):
    prod = bmm(a, b)
    if alpha != 1:
        prod = binary(aten.mul.Tensor, "mul", prod, alpha)
    if beta == 0:
        return prod
    base = self if beta == 1 else binary(aten.mul.Tensor, "mul", self, beta)
    return binary(aten.add.Tensor, "add", prod, base)


# ---------------------------------------------------------------------------------------------- normalisation
@impl(aten._softmax.default)
def softmax(x, dim, half_to_float):
    if half_to_float or not _float_ok(x):
        return _cpu_fallback(aten._softmax.default, x, dim, half_to_float)
    out = new_empty(x.vstorage.dev.index, x.shape, x.dtype)
    if x.dim() == 0:
        return _cpu_fallback(aten._softmax.default, x, dim, half_to_float)
    launch("softmax", [x], [out], {"axis": dim % x.dim()})
    return out


def _grad_needed(*ts) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def _layer_norm_stats(x, normalized_shape, weight, bias, eps):
    """(out, mean, rstd) from aten pieces (each a vnpu kernel): what autograd's backward needs."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = aten.mean.dim(x, dims, True)
    xc = aten.sub.Tensor(x, mean)
    var = aten.mean.dim(aten.mul.Tensor(xc, xc), dims, True)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    out = aten.mul.Tensor(xc, rstd)
    if weight is not None:
        out = aten.mul.Tensor(out, weight)
    if bias is not None:
        out = aten.add.Tensor(out, bias)
    return out, mean, rstd


@impl(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    """The kernel gives the output only: with autograd recording, aten pieces compute mean and rstd too
    (they feed the backward)."""
    d = x.shape[-1] if len(normalized_shape) == 1 else None
    if _grad_needed(x, weight, bias) or d is None or weight is None or bias is None or not _float_ok(x, weight, bias):
        return _layer_norm_stats(x, normalized_shape, weight, bias, eps)
    idx = device_of(x, weight, bias)
    out = new_empty(idx, x.shape, x.dtype)
    launch("layernorm", [x, weight, bias], [out], {"eps": float(eps)})
    stat_shape = tuple(x.shape[:-1]) + (1,)
    return out, new_empty(idx, stat_shape, x.dtype), new_empty(idx, stat_shape, x.dtype)


# ---------------------------------------------------------------------------------------------- embedding
@impl(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if KERNEL_DTYPE.get(weight.dtype) is None or indices.dtype not in (torch.int32, torch.int64):
        return _cpu_fallback(aten.embedding.default, weight, indices, padding_idx, scale_grad_by_freq, sparse)
    idx = device_of(weight, indices)
    out = new_empty(idx, tuple(indices.shape) + (weight.shape[1],), weight.dtype)
    if out.numel():
        launch("gather", [weight, indices], [out], {"axis": 0})
    return out


# ---------------------------------------------------------------------------------------------- reductions
def reduce(func, kernel, x, dims, keepdim, dtype=None, **kw):
    if dtype is not None and dtype != x.dtype or KERNEL_DTYPE.get(x.dtype) is None or x.dim() == 0:
        return _cpu_fallback(func, x, dims, keepdim, **({"dtype": dtype} if dtype is not None else {}), **kw)
    if kernel == "reduce_mean" and not x.dtype.is_floating_point:
        return _cpu_fallback(func, x, dims, keepdim, **kw)
    dims = tuple(range(x.dim())) if not dims else tuple(sorted({d % x.dim() for d in dims}))
    shape = [1 if i in dims else n for i, n in enumerate(x.shape)]
    if not keepdim:
        shape = [n for i, n in enumerate(x.shape) if i not in dims]
    out = new_empty(x.vstorage.dev.index, shape, x.dtype)
    launch(kernel, [x], [out], {"axis": dims, "keepdims": bool(keepdim)})
    return out


@impl(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, *, dtype=None):
    if x.dtype == torch.bool or (dtype is None and not x.dtype.is_floating_point and x.dtype != torch.int64):
        return _cpu_fallback(aten.sum.dim_IntList, x, dim, keepdim, dtype=dtype)
    return reduce(aten.sum.dim_IntList, "reduce_sum", x, dim, keepdim, dtype)


@impl(aten.sum.default)
def sum_all(x, *, dtype=None):
    return sum_dim(x, None, False, dtype=dtype)


@impl(aten.mean.dim)
def mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    return reduce(aten.mean.dim, "reduce_mean", x, dim, keepdim, dtype)


@impl(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return reduce(aten.amax.default, "reduce_max", x, dim, keepdim)


@impl(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return reduce(aten.amin.default, "reduce_min", x, dim, keepdim)
