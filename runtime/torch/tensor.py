"""An ``npu`` tensor: a torch wrapper subclass whose bytes live in vnpu HBM.

:class:`Storage` owns one block of a device's caching pool (``runtime.api``'s pool, so
``torch.npu.memory_allocated`` and ``vnpu smi`` see it); it is given back when the last tensor over it is
garbage collected (as torch frees a storage).  :class:`NpuTensor` holds torch's own metadata (sizes,
strides, storage offset, dtype, device ``npu:N``) plus its Storage; views share the Storage.  The bytes
are dtype-agnostic: any torch dtype can live on the device, the kernels take the dtypes vnpu has.

Every aten call on an NpuTensor arrives at :meth:`NpuTensor.__torch_dispatch__`, which looks the
operator up in :data:`OPS` (filled by :mod:`.ops`) and hands anything missing to ``OPS.missing`` (the
CPU fallback of :mod:`.fallback`).  Helpers here move bytes: :func:`upload` (stream-ordered H2D, returns at
once), :func:`to_cpu` (waits for the current stream, then D2H), :func:`desc` (a contiguous launch
argument, materializing a strided view with the ``strided_gather`` kernel: only orders the device).
"""
from __future__ import annotations

from typing import Any, Callable, cast

import numpy as np
import torch

from devices.kernel import TensorDesc
from runtime import api

from . import context
from .errors import NpuDeviceMismatchError, NpuStorageFreedError

#: torch dtype -> vnpu kernel dtype name (dtypes without one live on the device but fall back to the CPU)
KERNEL_DTYPE: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.float64: "float64", torch.int8: "int8",
    torch.uint8: "uint8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}


class Storage:
    """Device bytes under one or more npu tensors: a block of ``dev``'s caching pool."""

    __slots__ = ("dev", "mem", "nbytes", "torch_device", "stream", "__weakref__")

    def __init__(self, dev: api.Device, nbytes: int, stream: api.Stream):
        self.dev = dev
        self.nbytes = int(nbytes)
        self.stream = stream
        self.mem = dev.empty((max(1, self.nbytes),), "uint8", stream=stream)
        self.torch_device = torch.device("npu", dev.index)

    @property
    def ptr(self) -> int:
        """The device address now (read it when enqueuing: defragmentation may move the block)."""
        h = self.mem.handle
        if (h is not None and h.freed) or self.dev.is_lost or api.current_runtime() is not self.dev.rt:
            raise NpuStorageFreedError(f"the device memory of this npu:{self.dev.index} tensor is gone (its runtime "
                                       "was closed or its device lost/restarted): use after free")
        return self.mem.ptr

    def __del__(self) -> None:
        """Back to the pool, which reuses it in stream order.  A pool that does not cache (under ``vnpu
        sanitize``) would give it to the driver at once, ahead of queued work that still reads it: then the
        free is queued on the allocating stream instead (a host function after that work, as cudaFreeAsync)."""
        try:
            if not self.dev.is_lost and api.current_runtime() is self.dev.rt:
                if self.dev.pool.config.caching:
                    self.mem.free()
                else:
                    self.stream.launch_host_func(self.mem.free, blocking=True)
        except Exception:       # interpreter shutdown, a closed runtime: the memory went with it
            pass


class OpTable:
    """aten operator -> implementation (called with the operator's arguments); ``missing(func, args,
    kwargs)`` runs what has none (set by :mod:`.fallback`)."""

    def __init__(self) -> None:
        self.impls: dict[Any, Callable[..., Any]] = {}
        self.missing: Callable[..., Any] = _no_fallback


def _no_fallback(func, args, kwargs):
    raise NotImplementedError(f"{func} has no npu implementation")


OPS = OpTable()


class NpuTensor(torch.Tensor):
    """A tensor on ``npu:N`` (see the module docstring).  ``vstorage`` is its :class:`Storage`."""

    vstorage: Storage

    @staticmethod
    def __new__(cls, storage: Storage, size, stride, offset: int, dtype: torch.dtype, requires_grad: bool = False):
        t = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride, storage_offset=offset, dtype=dtype,
                                                device=storage.torch_device, requires_grad=requires_grad)
        t.vstorage = storage
        return t

    # torch's stubs declare __torch_dispatch__ as the C function _disabled_torch_dispatch_impl, which mypy
    # binds as an instance method; torch's protocol for a subclass is this classmethod
    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),  # type: ignore[override]
                           kwargs: dict | None = None) -> Any:
        fn = OPS.impls.get(func)
        if fn is None:
            return OPS.missing(func, args, kwargs or {})
        return fn(*args, **(kwargs or {}))

    # torch's documented idiom for a wrapper subclass; its stubs type the base's as a classmethod
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # torch's own signature; mypy drops the name of the base's unannotated keyword-only argument, so no
    # override matches it
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]  # noqa: D105
        body = repr(to_cpu(cast(NpuTensor, self.detach())))     # torch's stubs: Tensor methods return Tensor
        suffix = f", device='{self.device}'"
        return body[:-1] + suffix + ")" if body.endswith(")") else body + suffix


def device_bytes(t: NpuTensor) -> api.Tensor:
    """The bytes of contiguous npu tensor ``t`` as a relocatable :class:`runtime.api.Tensor` (uint8, ``numel *
    element_size`` long, a view of the pool block: its ``ptr`` follows a defragmentation).  For handing ``t``
    to other vnpu libraries (HCCL).  NpuStorageFreedError when the memory is gone, NpuDeviceMismatchError for
    a non-contiguous tensor."""
    if not t.is_contiguous():
        raise NpuDeviceMismatchError("device_bytes needs a contiguous tensor (call .contiguous() first)")
    t.vstorage.ptr                                  # raises NpuStorageFreedError when gone
    return t.vstorage.mem.view((t.numel() * t.element_size(),), "uint8",
                               offset_bytes=int(t.storage_offset()) * t.element_size())


# ---------------------------------------------------------------------------------------------- making
def new_empty(index: int, size, dtype: torch.dtype, stride=None) -> NpuTensor:
    """An uninitialised contiguous (or ``stride``d) tensor on ``npu:index`` from its pool (on the current
    stream; returns at once unless the pool asks the driver for a segment)."""
    dev = context.device(index)
    size = tuple(int(s) for s in size)
    if stride is None:
        stride = contiguous_strides(size)
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    st = Storage(dev, extent * _itemsize(dtype), context.current_stream(dev))
    return NpuTensor(st, size, tuple(stride), 0, dtype)


def contiguous_strides(size) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(size):
        out.append(acc)
        acc *= max(1, n)
    return tuple(reversed(out))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size() if dtype not in _ITEMSIZE else _ITEMSIZE[dtype]


_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in KERNEL_DTYPE} | {torch.bfloat16: 2}


def view_of(t: NpuTensor, size, stride, offset: int | torch.SymInt, dtype: torch.dtype | None = None) -> NpuTensor:
    """Another tensor over ``t``'s storage (no copy).  Under ``torch.inference_mode`` a view of a normal
    tensor is a normal tensor, as torch's rule is (torch then shares ``t``'s version counter with it)."""
    if torch.is_inference_mode_enabled() and not t.is_inference():
        with torch.inference_mode(False):
            return NpuTensor(t.vstorage, tuple(size), tuple(stride), int(offset), dtype or t.dtype)
    return NpuTensor(t.vstorage, tuple(size), tuple(stride), int(offset), dtype or t.dtype)


def device_of(*tensors) -> int:
    """The one npu device index of the npu tensors among ``tensors`` (NpuDeviceMismatchError if they differ)."""
    idx = None
    for t in tensors:
        if isinstance(t, NpuTensor):
            i = t.vstorage.dev.index
            if idx is None:
                idx = i
            elif i != idx:
                raise NpuDeviceMismatchError(f"expected all tensors to be on the same device, but found at least "
                                             f"two devices, npu:{idx} and npu:{i}")
    if idx is None:
        raise NpuDeviceMismatchError("no npu tensor among the operands")
    return idx


# ---------------------------------------------------------------------------------------------- promotion
_RESULT: dict[tuple, torch.dtype] = {}


def _kind(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim() == 0)
    return (type(x),)


def _proto(kind: tuple):
    if len(kind) == 2:
        return torch.empty(() if kind[1] else (1,), dtype=kind[0])
    return kind[0](1)


def result_dtype(a, b) -> torch.dtype:
    """``torch.result_type(a, b)`` (tensors or Python scalars), cached by (dtype, is 0-dim) / scalar type:
    on npu tensors torch's own would dispatch an operator."""
    key = (_kind(a), _kind(b))
    hit = _RESULT.get(key)
    if hit is None:
        hit = _RESULT[key] = torch.result_type(_proto(key[0]), _proto(key[1]))
    return hit


def broadcast(*shapes) -> tuple[int, ...]:
    """numpy/torch broadcasting of shapes (tuples or torch.Size); RuntimeError (torch's type for it) when
    they do not broadcast."""
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        off = n - len(s)
        for i, d in enumerate(s):
            o = out[off + i]
            if d != o:
                if o == 1:
                    out[off + i] = d
                elif d != 1:
                    raise RuntimeError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
    return tuple(out)


# ---------------------------------------------------------------------------------------------- device work
def stream_of(t: NpuTensor) -> api.Stream:
    return context.current_stream(t.vstorage.dev)


def kernel_dtype(t: torch.Tensor) -> str | None:
    return KERNEL_DTYPE.get(t.dtype)


def flat_desc(t: NpuTensor) -> TensorDesc:
    """The whole storage of ``t`` as a 1-D launch argument of ``t``'s dtype."""
    st = t.vstorage
    return TensorDesc(st.ptr, (st.nbytes // t.element_size(),), KERNEL_DTYPE[t.dtype])


def desc(t: NpuTensor) -> TensorDesc:
    """A contiguous ``t`` as a launch argument (its own bytes; see :func:`launch` for strided ones)."""
    return TensorDesc(t.vstorage.ptr + int(t.storage_offset()) * t.element_size(), tuple(t.shape),
                      KERNEL_DTYPE[t.dtype])


def launch(kernel: str, inputs, outputs, attrs: dict | None = None, stream: api.Stream | None = None) -> None:
    """Enqueue ``kernel`` on the current stream of the operands' device (only orders the device).
    Strided inputs are first made contiguous on the device (``strided_gather``, kept alive until the
    launch is queued); a strided output gets a contiguous temporary written back by ``strided_scatter``."""
    s = stream or stream_of(outputs[0] if outputs else inputs[0])
    keep = [contiguous(x) for x in inputs]
    outs = [o if o.is_contiguous() else new_empty(o.vstorage.dev.index, o.shape, o.dtype) for o in outputs]
    s.launch(kernel, [desc(x) for x in keep], [desc(o) for o in outs], attrs)
    for o, tmp in zip(outputs, outs):
        if tmp is not o:
            write_into(o, desc(tmp))


def contiguous(t: NpuTensor) -> NpuTensor:
    """``t`` itself when contiguous, else a contiguous copy made on the device (only orders the device)."""
    if t.is_contiguous():
        return t
    out = new_empty(t.vstorage.dev.index, t.shape, t.dtype)
    if out.numel():
        stream_of(t).launch("strided_gather", [flat_desc(t)], [desc(out)],
                            {"size": tuple(t.shape), "stride": tuple(t.stride()), "offset": t.storage_offset()})
    return out


def write_into(dst: NpuTensor, src_desc: TensorDesc) -> None:
    """dst[...] = the contiguous ``src_desc`` (same shape and dtype), also when ``dst`` is a strided view."""
    s = stream_of(dst)
    if dst.is_contiguous():
        d = desc(dst)
        s.copy(d.ptr, src_desc.ptr, d.nbytes)
    else:
        s.launch("strided_scatter", [src_desc], [flat_desc(dst)],
                 {"size": tuple(dst.shape), "stride": tuple(dst.stride()), "offset": dst.storage_offset()})


# ---------------------------------------------------------------------------------------------- host copies
def to_cpu(t: NpuTensor) -> torch.Tensor:
    """A CPU copy of ``t``: waits for the current stream of its device (host-blocking), then copies."""
    c = contiguous(t)
    s = stream_of(c)
    nbytes = c.numel() * c.element_size()
    ptr = c.vstorage.ptr + c.storage_offset() * c.element_size()
    s.synchronize()
    if nbytes == 0:
        return torch.empty(tuple(t.shape), dtype=t.dtype)
    raw = c.vstorage.dev.memcpy_d2h(ptr, nbytes)
    return torch.from_numpy(raw).view(t.dtype).reshape(tuple(t.shape))


def upload(dst: NpuTensor, src: torch.Tensor) -> None:
    """dst[...] = ``src`` (a CPU tensor broadcastable to ``dst``; converted to ``dst``'s dtype): the bytes are
    taken now, the copy is stream-ordered (returns at once)."""
    src = src.detach().to(dst.dtype).expand(dst.shape).contiguous()
    if src.numel() == 0:
        return
    arr: np.ndarray = src.reshape(-1).view(torch.uint8).numpy()
    s = stream_of(dst)
    if dst.is_contiguous():
        s.write(dst.vstorage.ptr + dst.storage_offset() * dst.element_size(), arr)
    else:
        tmp = new_empty(dst.vstorage.dev.index, dst.shape, dst.dtype)
        s.write(tmp.vstorage.ptr, arr)
        write_into(dst, desc(tmp))
