"""aten operators that make, copy and view npu tensors: factories, ``copy_`` / ``_to_copy`` (host and
device copies), every view operator (computed once on torch's meta device, then laid over the same
Storage), ``clone``, ``fill_`` / ``zero_``.  Host copies follow :mod:`.tensor` (uploads only order the
device; downloads wait for the current stream); everything else only orders the device."""
from __future__ import annotations

import torch

from . import context, device
from .tensor import (OPS, KERNEL_DTYPE, NpuTensor, contiguous, desc, device_of, launch, new_empty, to_cpu, upload,
                     view_of, write_into)

aten = torch.ops.aten


def impl(*ops):
    """Register the decorated function for each aten overload in ``ops``."""
    def deco(fn):
        for op in ops:
            OPS.impls[op] = fn
        return fn
    return deco


def _index(device) -> int:
    if device is None:
        return context.current_index()
    d = torch.device(device)
    return context.current_index() if d.index is None else context.check_index(d.index)


# ---------------------------------------------------------------------------------------------- factories
def empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return new_empty(_index(device), size, dtype or torch.get_default_dtype())


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return new_empty(_index(device), size, dtype or torch.get_default_dtype(), stride=tuple(stride))


#: the factories that reach the npu device from no npu tensor (torch.empty(..., device="npu"), .to("npu")):
#: registered for the PrivateUse1 dispatch key by :mod:`runtime.torch`
FACTORIES = {"empty.memory_format": empty_memory_format, "empty_strided": empty_strided}
impl(aten.empty.memory_format)(empty_memory_format)
impl(aten.empty_strided.default)(empty_strided)


@impl(aten.new_empty.default)
def _new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return new_empty(_index(device) if device is not None else self.vstorage.dev.index, size, dtype or self.dtype)


@impl(aten.new_empty_strided.default)
def _new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    idx = _index(device) if device is not None else self.vstorage.dev.index
    return new_empty(idx, size, dtype or self.dtype, stride=tuple(stride))


# ---------------------------------------------------------------------------------------------- copies
def _same_device_copy(dst: NpuTensor, src: NpuTensor) -> None:
    if src.dtype != dst.dtype:
        if KERNEL_DTYPE.get(src.dtype) is None or KERNEL_DTYPE.get(dst.dtype) is None:
            upload(dst, to_cpu(src))          # a dtype without kernels: through the host
            return
        tmp = new_empty(dst.vstorage.dev.index, src.shape, dst.dtype)
        launch("cast", [src], [tmp])
        src = tmp
    if tuple(src.shape) != tuple(dst.shape):
        tmp = new_empty(dst.vstorage.dev.index, dst.shape, dst.dtype)
        if KERNEL_DTYPE.get(dst.dtype) is None:
            upload(dst, to_cpu(src))
            return
        launch("expand", [src], [tmp], {"shape": tuple(dst.shape)})
        src = tmp
    if dst.numel():
        c = contiguous(src)
        write_into(dst, desc(c))


@impl(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    if isinstance(dst, NpuTensor) and isinstance(src, NpuTensor):
        if dst.vstorage.dev.index == src.vstorage.dev.index:
            _same_device_copy(dst, src)
        else:                                  # npu:i -> npu:j goes through the host
            upload(dst, to_cpu(src))
    elif isinstance(dst, NpuTensor):
        upload(dst, src)
    else:
        dst.copy_(to_cpu(src))
    return dst


def copy_from(src, dst, non_blocking=False):
    """``aten::_copy_from`` (registered for the PrivateUse1 key): torch's own constructors
    (``torch.tensor(data, device="npu")``) move their CPU tensor with the Python key excluded, so the copy
    arrives at the backend key, not at ``__torch_dispatch__``."""
    return copy_(dst, src, non_blocking)


def copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        dst.data = new_empty(dst.vstorage.dev.index, src.shape, dst.dtype)
    return copy_(dst, src)


FACTORIES.update({"_copy_from": copy_from, "_copy_from_and_resize": copy_from_and_resize})
impl(aten._copy_from.default)(copy_from)
impl(aten._copy_from_and_resize.default)(copy_from_and_resize)


@impl(aten._to_copy.default)
def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    if target.type != "npu":
        out = to_cpu(self)
        return out.to(dtype=dtype, device=target) if (dtype != out.dtype or target.type != "cpu") else out
    out = new_empty(_index(target), self.shape, dtype)
    return copy_(out, self)


@impl(aten.clone.default)
def clone(self, *, memory_format=None):
    if not self.is_contiguous():
        return contiguous(self)               # already a fresh copy
    out = new_empty(self.vstorage.dev.index, self.shape, self.dtype)
    if self.numel():
        write_into(out, desc(self))
    return out


@impl(aten.fill_.Scalar)
def fill_(self, value):
    if self.numel():
        if KERNEL_DTYPE.get(self.dtype) is None:
            upload(self, torch.full((), value, dtype=self.dtype))
        else:
            launch("fill", [], [self], {"value": scalar_value(value, self.dtype)})
    return self


@impl(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    out = new_empty(_index(device) if device is not None else self.vstorage.dev.index, self.shape,
                    dtype or self.dtype)
    return fill_(out, fill_value)


@impl(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return full_like(self, 1, dtype=dtype, device=device)


@impl(aten.zeros_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return full_like(self, 0, dtype=dtype, device=device)


@impl(aten.zero_.default)
def zero_(self):
    return fill_(self, 0)


def scalar_value(value, dtype):
    if isinstance(value, torch.Tensor):
        value = value.item()
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


# ---------------------------------------------------------------------------------------------- random
def _draw(self, fill, generator):
    """Random numbers drawn on the host from ``generator`` (default: npu:N's, seeded by torch.npu.manual_seed)
    and uploaded (vnpu has no RNG kernel; counted as neither kernel nor fallback: a factory's upload)."""
    g = generator if generator is not None else device.generator(self.vstorage.dev.index)
    host = torch.empty(tuple(self.shape), dtype=self.dtype)
    fill(host, g)
    upload(self, host)
    return self


@impl(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    return _draw(self, lambda h, g: h.normal_(mean, std, generator=g), generator)


@impl(aten.uniform_.default)
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    return _draw(self, lambda h, g: h.uniform_(from_, to, generator=g), generator)


# ---------------------------------------------------------------------------------------------- views
def _meta(t: NpuTensor) -> torch.Tensor:
    n = t.vstorage.nbytes // t.element_size()
    return torch.empty((n,), dtype=t.dtype, device="meta").as_strided(t.shape, t.stride(), t.storage_offset())


def run_view(func, args, kwargs):
    """Any view operator: run on meta twins of the npu operands, lay the results over the same Storage."""
    base = next(a for a in args if isinstance(a, NpuTensor))

    def to_meta(a):
        return _meta(a) if isinstance(a, NpuTensor) else a
    margs = [to_meta(a) for a in args]
    mkw = {k: to_meta(v) for k, v in kwargs.items()}
    r = func(*margs, **mkw)

    def back(m):
        return view_of(base, m.shape, m.stride(), m.storage_offset(), m.dtype)
    if isinstance(r, (list, tuple)):
        return type(r)(back(m) for m in r)
    return back(r)


@impl(aten.lift_fresh.default)
def _lift_fresh(self):
    return self


__all__ = ["impl", "run_view", "copy_", "device_of", "FACTORIES"]
