"""PyTorch's ``npu`` device on vnpu: ``import runtime.torch`` and torch_npu-style code runs unchanged.

Importing this package (once per process, idempotent):

- renames PyTorch's PrivateUse1 backend to ``npu`` and registers its hooks (``torch.device("npu:1")``,
  ``Tensor.npu()``, ``Tensor.is_npu``, ``Module.npu()``), with :mod:`.device` as ``torch.npu``;
- registers the factories that create npu tensors from nothing (``torch.empty(..., device="npu")``,
  ``.to("npu")``) for the PrivateUse1 key; every other operator on an npu tensor reaches
  :class:`~.tensor.NpuTensor`'s ``__torch_dispatch__`` and runs as vnpu kernels (:mod:`.ops_core`,
  :mod:`.ops_math`), as a decomposition into them, or on the CPU with a warning (:mod:`.fallback`).

Which devices: the process's vnpu runtime (:mod:`.context`: ``VNPU_BACKEND`` local or cluster,
``ASCEND_RT_VISIBLE_DEVICES``), as for ``runtime.api`` and ``runtime.acl``.

Public entry points for code that hands npu tensors to other vnpu libraries (HCCL, the profiler):
:func:`vnpu_device`, :func:`device_ptr`, :func:`nbytes`, :func:`from_device_memory`, :func:`fallback_counts`.
"""
from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from runtime import api

from . import device as _device_module
from . import fallback, ops_core, ops_math, ops_nn, ops_views, resolve  # noqa: F401  (the ops modules register operators)
from .errors import NpuDeviceError, NpuDeviceMismatchError, NpuFallbackError, NpuStorageFreedError
from .fallback import NpuFallbackWarning
from .tensor import OPS, NpuTensor, Storage, contiguous, new_empty
from .tensor import device_bytes as _device_bytes

__all__ = ["NpuTensor", "NpuDeviceError", "NpuDeviceMismatchError", "NpuFallbackError", "NpuStorageFreedError",
           "NpuFallbackWarning", "fallback_counts", "reset_fallback_counts", "vnpu_device", "device_ptr",
           "nbytes", "device_bytes", "vnpu_stream", "from_device_memory", "is_npu_tensor"]


def _install() -> None:
    if getattr(torch, "npu", None) is _device_module:
        return
    _setup_privateuseone_for_python_backend("npu", backend_module=_device_module)
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in ops_core.FACTORIES.items():
        lib.impl(name, fn, "PrivateUse1")
    for name, fn in ops_nn.AUTOGRAD_LEVEL.items():
        lib.impl(name, fn, "AutogradPrivateUse1")
    _LIBS.append(lib)                         # the registrations live as long as the library object
    OPS.missing = resolve.missing


_LIBS: list = []
_install()


# ---------------------------------------------------------------------------------------------- public helpers
def fallback_counts() -> dict[str, int]:
    """Operator name (``aten::topk``) -> how many times it ran on the CPU for lack of a vnpu kernel."""
    return fallback.counts()


def reset_fallback_counts() -> None:
    """Forget the counts (and warn again on the next fallback of each operator)."""
    fallback.reset_counts()


def is_npu_tensor(t) -> bool:
    return isinstance(t, NpuTensor)


def _npu(t) -> NpuTensor:
    if not isinstance(t, NpuTensor):
        raise NpuDeviceMismatchError(f"expected an npu tensor, got one on {getattr(t, 'device', type(t).__name__)}")
    return t


def vnpu_device(t) -> api.Device:
    """The :class:`runtime.api.Device` that holds npu tensor ``t`` (its ``handle`` is the backend's
    DeviceHandle, what HCCL communicators are built on)."""
    return _npu(t).vstorage.dev


def vnpu_stream(t) -> api.Stream:
    """The vnpu stream that work on ``t`` is queued on now (the thread's current stream of its device)."""
    from . import context
    return context.current_stream(_npu(t).vstorage.dev)


def device_ptr(t) -> int:
    """The device address of ``t``'s first element (contiguous tensors only: NpuDeviceMismatchError
    otherwise; call ``t.contiguous()`` first).  Read it right before enqueuing work that uses it: a
    defragmentation may move the memory; queue that work on :func:`vnpu_stream` to keep stream order."""
    t = _npu(t)
    if not t.is_contiguous():
        raise NpuDeviceMismatchError("device_ptr needs a contiguous tensor (call .contiguous() first)")
    return t.vstorage.ptr + t.storage_offset() * t.element_size()


def device_bytes(t) -> api.Tensor:
    """Contiguous npu tensor ``t``'s bytes as a relocatable ``runtime.api.Tensor`` (uint8 view of its pool
    block; ``.ptr`` read at enqueue follows defragmentation) -- what HCCL calls take."""
    return _device_bytes(_npu(t))


def nbytes(t) -> int:
    """Bytes of ``t``'s elements (numel * element size)."""
    t = _npu(t)
    return t.numel() * t.element_size()


def from_device_memory(t_like, size=None, dtype=None) -> NpuTensor:
    """A new contiguous npu tensor on ``t_like``'s device (shape ``size``/dtype default to ``t_like``'s):
    receive buffers for collectives."""
    t = _npu(t_like)
    return new_empty(t.vstorage.dev.index, tuple(size if size is not None else t.shape), dtype or t.dtype)


_unused = (Storage, contiguous)
