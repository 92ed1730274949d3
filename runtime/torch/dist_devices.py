"""What the ``hccl`` process group needs of the ``npu`` device: the runtime its tensors live on, a device by
index, a device's current stream, and the device bytes of an npu tensor.  The one place where
:mod:`runtime.torch.distributed` meets the device's modules (their public entry points only)."""
from __future__ import annotations

import torch

from runtime.api import Device, Runtime, Stream, Tensor

from . import context, tensor

DEVICE_TYPE = "npu"


def runtime() -> Runtime:
    """The runtime whose devices back ``npu`` tensors in this process (``VNPU_BACKEND`` chooses it)."""
    return context.runtime()


def device(index: int | None) -> Device:
    """The vnpu device behind ``npu:index``; None: the thread's current npu device (``torch.npu.set_device``)."""
    return context.device(index)


def current_stream(dev: Device) -> Stream:
    """The stream npu work of ``dev`` is enqueued on now (``torch.npu.current_stream``)."""
    return context.current_stream(dev)


def device_bytes(t: torch.Tensor) -> Tensor:
    """The bytes of contiguous npu tensor ``t`` as a uint8 vnpu tensor (a view of its pool block: no copy;
    its ``ptr``, read at enqueue, follows a defragmentation)."""
    if not isinstance(t, tensor.NpuTensor):
        raise ValueError(f"hccl: a {t.device.type} tensor where an npu tensor was expected")
    return tensor.device_bytes(t)
