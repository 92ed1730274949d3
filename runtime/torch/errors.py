"""The typed errors of the torch ``npu`` device.  Each is a CANN error (``e.code``, from
:mod:`devices.errors`' one table) and a ``RuntimeError``, the type torch code catches for device trouble."""
from __future__ import annotations

from devices.errors import InvalidDeviceError, InvalidParamError, MemoryAccessError, UnsupportedError


class NpuDeviceError(InvalidDeviceError, RuntimeError):
    """An ``npu`` device index that does not exist (ACL_ERROR_RT_INVALID_DEVICEID)."""


class NpuDeviceMismatchError(InvalidParamError, RuntimeError):
    """One operation's tensors live on different devices (ACL_ERROR_RT_PARAM_INVALID), as torch refuses
    ``cuda:0`` + ``cuda:1``."""


class NpuStorageFreedError(MemoryAccessError, RuntimeError):
    """A tensor whose device memory is gone (its runtime closed, its device restarted): use after free."""


class NpuFallbackError(UnsupportedError, RuntimeError):
    """``VNPU_TORCH_STRICT=1`` and an operator has no vnpu kernel (it would have run on the CPU)."""
