"""Kernel lookup (over the table of :mod:`devices.registry`) and what a block sees when it runs.

A kernel runs as ``block_dim`` blocks, SPMD like an Ascend C kernel: every block gets the same arguments
and its own ``ctx.block_idx`` (``GetBlockIdx()``) and ``ctx.block_dim`` and works on its share.

Two kinds:
- built-in kernels (:func:`builtin`): ``run(ctx, inputs, outputs, attrs)`` gets numpy views of the
  checked tensors (inputs read-only) and writes its slice of the outputs; ``check`` validates shapes and
  dtypes at launch (host-synchronous, raises :class:`InvalidParamError`); ``work`` feeds the cost model.
- user kernels (:func:`register_user_kernel`): ``fn(ctx, *tensors, **attrs)`` where each tensor is a
  :class:`GmTensor` whose indexing is bounds-checked: an index outside the tensor raises the AI Core trap
  codes (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW / _WRITE_OVERFLOW) instead of touching a neighbour's memory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chip import Work
from .errors import (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW,
                     ACL_ERROR_RT_KERNEL_LOOKUP, ACL_ERROR_UNSUPPORTED_DATA_TYPE, AclError, InvalidParamError,
                     KernelError)
from .registry import KernelDef, builtin, register_user_kernel, registered, registered_names  # noqa: F401

DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")

_ITEMSIZE = {n: np.dtype(n).itemsize for n in DTYPES}

#: aclDataType numeric values (reference 1.1) for the dtypes numpy can hold
ACL_DTYPE = {"float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "int64": 9,
             "float64": 11, "bool": 12}


@dataclass(frozen=True)
class TensorDesc:
    """A device tensor argument: where it lives, its shape and its dtype name (see :data:`DTYPES`)."""
    ptr: int
    shape: tuple[int, ...]
    dtype: str = "float32"

    @functools.cached_property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @functools.cached_property
    def nbytes(self) -> int:
        return self.numel * _ITEMSIZE.get(self.dtype, 0)


@dataclass(frozen=True)
class BlockCtx:
    """What one block knows about itself."""
    block_idx: int
    block_dim: int
    device_id: int

    def split(self, n: int) -> range:
        """This block's share of ``range(n)`` (contiguous, balanced)."""
        q, r = divmod(n, self.block_dim)
        start = self.block_idx * q + min(self.block_idx, r)
        return range(start, start + q + (1 if self.block_idx < r else 0))


def lookup(name: str) -> KernelDef:
    k = registered(name)
    if k is None:
        _load_builtins()
        k = registered(name)
    if k is None:
        raise KernelError(f"no kernel named {name!r}", code=ACL_ERROR_RT_KERNEL_LOOKUP)
    return k


def kernel_names() -> list[str]:
    _load_builtins()
    return registered_names()


def _load_builtins() -> None:
    from . import ops  # noqa: F401  (registers the built-in library)


def validate_descs(descs: tuple) -> None:
    for d in descs:
        if not isinstance(d, TensorDesc):
            raise InvalidParamError(f"kernel tensor argument must be a TensorDesc, got {type(d).__name__}")
        if d.dtype not in DTYPES:
            raise InvalidParamError(f"unsupported dtype {d.dtype!r}", code=ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        if any((not isinstance(x, (int, np.integer))) or x < 0 for x in d.shape):
            raise InvalidParamError(f"bad shape {d.shape!r}")


def check_launch(k: KernelDef, inputs: tuple, outputs: tuple, attrs: dict, block_dim: int) -> None:
    """Host-side validation at launch time (raises InvalidParamError)."""
    if not isinstance(block_dim, (int, np.integer)) or block_dim < 1 or block_dim > 65535:
        raise InvalidParamError(f"block_dim must be in [1, 65535], got {block_dim!r}")
    validate_descs(inputs)
    validate_descs(outputs)
    if k.check is not None:
        k.check(inputs, outputs, attrs)


def default_block_dim(k: KernelDef, inputs: tuple, outputs: tuple, attrs: dict, cores: int,
                      host_threads: int, min_work_per_block: int = 1 << 18) -> int:
    """Block-dim helper: small ops run as one block; large ones split across cores.

    ``min_work_per_block`` is in elements (vector) or multiply-adds (cube); the result is capped by the
    chip's cores, by the op's splittable extent and by the host threads that can really run blocks at once.
    """
    if k.user:
        return 1
    w = k.work(inputs, outputs, attrs) if k.work else Work(bytes=sum(d.nbytes for d in outputs))
    amount = w.flops if w.flops else w.bytes / 4
    want = int(amount // min_work_per_block)
    if want <= 1:
        return 1
    extent = k.parallel_dim(inputs, outputs, attrs) if k.parallel_dim else 1
    return max(1, min(want, cores, extent, host_threads))


class GmTensor:
    """Bounds-checked global-memory tensor handed to user kernels."""

    __slots__ = ("_a", "shape", "dtype")

    def __init__(self, arr: np.ndarray):
        self._a = arr
        self.shape = arr.shape
        self.dtype = arr.dtype

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def size(self) -> int:
        return self._a.size

    def _check(self, key, code: int) -> None:
        keys = key if isinstance(key, tuple) else (key,)
        if len(keys) > len(self.shape):
            raise KernelError(f"too many indices {key!r} for shape {self.shape}", code=code)
        for k, n in zip(keys, self.shape):
            if isinstance(k, (int, np.integer)):
                if not 0 <= k < n:
                    raise KernelError(f"index {int(k)} outside [0, {n}) of a {self.shape} tensor", code=code)
            elif isinstance(k, slice):
                start, stop, step = k.start or 0, n if k.stop is None else k.stop, k.step or 1
                if step <= 0 or start < 0 or stop > n or start > stop:
                    raise KernelError(f"slice {start}:{stop}:{step} outside [0, {n}) of a {self.shape} tensor",
                                      code=code)
            else:
                raise KernelError(f"unsupported index {k!r} (use ints and slices)", code=code)

    def __getitem__(self, key):
        self._check(key, ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW)
        return self._a[key].copy()

    def __setitem__(self, key, value) -> None:
        self._check(key, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW)
        self._a[key] = value

    def read(self) -> np.ndarray:
        """A copy of the whole tensor."""
        return self._a.copy()


@dataclass
class KernelRunner:
    """Binds a kernel to views; ``run_block(b)`` executes block ``b``."""
    k: KernelDef
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    attrs: dict[str, Any]
    block_dim: int
    device_id: int
    _gm: list[GmTensor] = field(default_factory=list)

    def __post_init__(self):
        if self.k.user:
            self._gm = [GmTensor(a) for a in self.inputs + self.outputs]

    def run_block(self, b: int) -> None:
        ctx = BlockCtx(b, self.block_dim, self.device_id)
        try:
            if self.k.user:
                self.k.run(ctx, *self._gm, **self.attrs)
            else:
                self.k.run(ctx, self.inputs, self.outputs, self.attrs)
        except AclError:
            raise
        except Exception as e:  # a kernel bug is an AI Core exception on that task
            raise KernelError(f"kernel {self.k.name!r} block {b}/{self.block_dim} failed: "
                              f"{type(e).__name__}: {e}") from e
