"""Which vnpu runtime and device the torch ``npu`` device talks to, and each thread's current device and
stream (``torch.npu.set_device`` / ``torch.npu.stream``).

The runtime is the process's (:func:`runtime.api.get_runtime`): in-process devices by default,
``VNPU_BACKEND=cluster`` for the devices of the running vnpu cluster, ``ASCEND_RT_VISIBLE_DEVICES``
honoured -- exactly as for ``runtime.api`` and ``runtime.acl``.  ``npu:N`` is the runtime's visible
device N.  Nothing here blocks the host (a first call creates the runtime, which starts its devices).
"""
from __future__ import annotations

import threading

from runtime import api

from .errors import NpuDeviceError


class _Local(threading.local):
    def __init__(self) -> None:
        self.index = 0
        self.streams: dict[int, api.Stream] = {}      #: device index -> the thread's current stream


_LOCAL = _Local()


def runtime() -> api.Runtime:
    """The process's vnpu runtime (created on first use, see the module docstring)."""
    return api.get_runtime()


def device_count() -> int:
    return runtime().device_count()


def check_index(index: int) -> int:
    """``index`` if it names a visible device, else NpuDeviceError (one line, the valid range)."""
    n = device_count()
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
        raise NpuDeviceError(f"npu:{index} does not exist: this process sees {n} npu device(s) "
                             f"(npu:0..npu:{n - 1}; VNPU_BACKEND / ASCEND_RT_VISIBLE_DEVICES choose them)")
    return index


def device(index: int | None = None) -> api.Device:
    """The vnpu Device behind ``npu:index`` (default: the thread's current device)."""
    i = _LOCAL.index if index is None else index
    return runtime().device(check_index(i))


def current_index() -> int:
    return _LOCAL.index


def set_index(index: int) -> None:
    _LOCAL.index = check_index(index)


def current_stream(dev: api.Device) -> api.Stream:
    """The thread's current stream on ``dev`` (its default stream unless ``torch.npu.stream`` set one)."""
    s = _LOCAL.streams.get(dev.index)
    if s is None or s.device is not dev:
        return dev.default_stream
    return s


def set_stream(stream: api.Stream | None, index: int) -> api.Stream | None:
    """Make ``stream`` the thread's current stream of device ``index`` (None: its default); returns the
    one it replaces (None for the default)."""
    old = _LOCAL.streams.pop(index, None)
    if stream is not None and not stream.is_default:
        _LOCAL.streams[index] = stream
    return old
