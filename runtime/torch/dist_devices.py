"""What the ``hccl`` process group needs of the ``npu`` device: the runtime its tensors live on, a device by
index, a device's current stream, and an npu tensor's vnpu view.  Only public entry points of
:mod:`runtime.torch` are used here, so that the device's internals can change under the process group."""
from __future__ import annotations

import os

import torch

from runtime.api import Device, Runtime, Stream, Tensor, get_runtime

DEVICE_TYPE = "npu"


def runtime() -> Runtime:
    """The runtime whose devices back ``npu`` tensors in this process."""
    return get_runtime()


def device(rt: Runtime, index: int | None) -> Device:
    """Device ``index`` of ``rt``; None: the current npu device."""
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    return rt.device(index)


def current_stream(dev: Device) -> Stream:
    """The stream npu work of ``dev`` is enqueued on now."""
    return dev.default_stream


def vnpu_tensor(t: torch.Tensor) -> Tensor:
    """The vnpu tensor over the bytes of npu tensor ``t`` (contiguous)."""
    raise NotImplementedError("npu tensors arrive with runtime.torch")
