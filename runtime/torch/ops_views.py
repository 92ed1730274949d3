"""Fast paths for the view operators real models call most (``view``, ``t``, ``transpose``, ``permute``,
``unsqueeze``, ``select``, ``slice``, ``expand``, ``detach``): the new sizes, strides and offset computed
in Python, no meta tensor.  Anything unusual (a ``view`` of a non-contiguous tensor, ``-1`` sizes that do
not resolve, ...) takes the general path, :func:`.ops_core.run_view`.  No device work."""
from __future__ import annotations

import torch

from .ops_core import impl, run_view
from .tensor import NpuTensor, contiguous_strides, view_of

aten = torch.ops.aten


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d




@impl(aten.view.default, aten._unsafe_view.default)
def view(x: NpuTensor, size):
    size = list(size)
    n = x.numel()
    if -1 in size:
        known = 1
        for s in size:
            if s != -1:
                known *= s
        if known == 0 or size.count(-1) != 1:
            return run_view(aten.view.default, (x, size), {})
        size[size.index(-1)] = n // known
    if not x.is_contiguous():
        return run_view(aten.view.default, (x, size), {})
    return view_of(x, size, contiguous_strides(size), x.storage_offset())


@impl(aten.t.default)
def t(x: NpuTensor):
    if x.dim() < 2:
        return view_of(x, x.shape, x.stride(), x.storage_offset())
    return transpose(x, 0, 1)


@impl(aten.transpose.int)
def transpose(x: NpuTensor, d0: int, d1: int):
    n = x.dim()
    d0, d1 = _dim(d0, n), _dim(d1, n)
    size, stride = list(x.shape), list(x.stride())
    size[d0], size[d1] = size[d1], size[d0]
    stride[d0], stride[d1] = stride[d1], stride[d0]
    return view_of(x, size, stride, x.storage_offset())


@impl(aten.permute.default)
def permute(x: NpuTensor, dims):
    n = x.dim()
    dims = [_dim(d, n) for d in dims]
    size, stride = x.shape, x.stride()
    return view_of(x, [size[d] for d in dims], [stride[d] for d in dims], x.storage_offset())


@impl(aten.unsqueeze.default)
def unsqueeze(x: NpuTensor, dim: int):
    d = _dim(dim, x.dim() + 1)
    size, stride = list(x.shape), list(x.stride())
    st = size[d] * stride[d] if d < len(size) else 1
    size.insert(d, 1)
    stride.insert(d, st)
    return view_of(x, size, stride, x.storage_offset())


@impl(aten.select.int)
def select(x: NpuTensor, dim: int, index: int):
    d = _dim(dim, x.dim())
    n = x.shape[d]
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        return run_view(aten.select.int, (x, dim, index), {})     # torch's own IndexError
    size, stride = list(x.shape), list(x.stride())
    off = x.storage_offset() + i * stride[d]
    del size[d], stride[d]
    return view_of(x, size, stride, off)


@impl(aten.slice.Tensor)
def slice_(x: NpuTensor, dim: int = 0, start=None, end=None, step: int = 1):
    d = _dim(dim, x.dim())
    n = x.shape[d]
    lo, hi, st = slice(start, end, step).indices(n) if step > 0 else (0, 0, 0)
    if st <= 0:
        return run_view(aten.slice.Tensor, (x, dim, start, end, step), {})
    size, stride = list(x.shape), list(x.stride())
    size[d] = max(0, (hi - lo + st - 1) // st)
    off = x.storage_offset() + lo * stride[d]
    stride[d] *= st
    return view_of(x, size, stride, off)


@impl(aten.expand.default)
def expand(x: NpuTensor, size, *, implicit: bool = False):
    n, m = len(size), x.dim()
    if n < m:
        return run_view(aten.expand.default, (x, size), {"implicit": implicit})
    old_size, old_stride = [1] * (n - m) + list(x.shape), [0] * (n - m) + list(x.stride())
    new_size, new_stride = [], []
    for want, have, st in zip(size, old_size, old_stride):
        if want == -1 or want == have:
            new_size.append(have)
            new_stride.append(st)
        elif have == 1:
            new_size.append(want)
            new_stride.append(0)
        else:
            return run_view(aten.expand.default, (x, size), {"implicit": implicit})
    return view_of(x, new_size, new_stride, x.storage_offset())


@impl(aten.detach.default, aten.alias.default)
def detach(x: NpuTensor):
    return view_of(x, x.shape, x.stride(), x.storage_offset())
