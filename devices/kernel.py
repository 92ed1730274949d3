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
  Built-in names are immutable.

Who sees which kernel: this process's table (built-ins, and user kernels registered in this process) is
seen by every caller; a device also keeps (:class:`KernelTable`) the kernels of the packages installed on
its node (:mod:`devices.kernel_packages`), seen by every caller too, and the kernels registered for one
tenant (the admin's pickled uploads, when the cluster allows them; in-process owners), each visible to its
tenant only and released with the client that registered it.  A user kernel is Python code that runs in
the device's process with that process's rights: the bounds checks keep a correct kernel inside its
tensors, they are no sandbox -- which is why only the node's operator installs packages.

Launch limits (:func:`check_launch`, and the driver's decoder before it builds anything): at most
:data:`MAX_LAUNCH_TENSORS` tensor arguments, :data:`MAX_LAUNCH_ATTRS` attributes, :data:`MAX_TENSOR_DIMS`
dimensions per tensor (``ACL_MAX_DIM_CNT``) and :data:`MAX_ATTR_ELEMENTS` elements per list attribute; more
is ACL_ERROR_RT_PARAM_INVALID.  CANN bounds a launch by the size of its argument block rather than by
counts; these counts are the emulator's own, far above what any kernel of the library or of a model takes.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chip import Work
from .errors import (ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW,
                     ACL_ERROR_RT_KERNEL_LOOKUP, ACL_ERROR_UNSUPPORTED_DATA_TYPE, AclError, InvalidParamError,
                     KernelError)
from . import registry as _registry
from .registry import KernelDef, builtin, registered, registered_names  # noqa: F401
from .tenancy import tenant_of

#: launch limits (see the module doc)
MAX_LAUNCH_TENSORS = 1024
MAX_LAUNCH_ATTRS = 1024
MAX_TENSOR_DIMS = 128
MAX_ATTR_ELEMENTS = 1 << 16

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


def register_user_kernel(name: str, fn, *, replace: bool = False) -> None:
    """Register ``fn(ctx, *tensors, **attrs)`` as kernel ``name`` in this process's table (seen by every
    caller of this process's devices).  A built-in's name: InvalidParamError (built-ins are immutable);
    another user kernel's name: ACL_ERROR_KERNEL_ALREADY_REGISTERED unless ``replace``."""
    _load_builtins()
    _registry.register_user_kernel(name, fn, replace=replace)


def check_kernel_name(name) -> None:
    """InvalidParamError unless ``name`` may name a user kernel (not a built-in's, 1..256 characters)."""
    _load_builtins()
    _registry.check_user_kernel_name(name)


class KernelTable:
    """The kernels one device runs, looked up in this order: the user kernels registered for the caller's
    tenant (visible to that tenant only, living while a client that registered them does:
    :meth:`drop_owner`), the kernels of the packages installed on the node (:meth:`install`, every caller),
    this process's table (built-ins).  Thread-safe; nothing blocks."""

    def __init__(self):
        self._by_tenant: dict[str, dict[str, tuple[KernelDef, set]]] = {}
        self._installed: dict[str, tuple[KernelDef, str]] = {}     #: name -> (kernel, package name)
        self._lock = threading.Lock()

    def install(self, packages) -> None:
        """Make the kernels of ``packages`` (:class:`devices.kernel_packages.Package`) the installed ones,
        replacing those installed before (at once: a launch sees the old set or the new one)."""
        table = {k: (_registry.user_kernel(k, fn), p.name) for p in packages for k, fn in p.kernels.items()}
        self._installed = table

    def installed(self) -> dict[str, str]:
        """Installed kernel name -> its package's name."""
        return {k: v[1] for k, v in self._installed.items()}

    def node_kernels(self) -> list[str]:
        """Names of the user kernels every caller of this device can launch: the installed ones and those
        registered in this process's table (built-ins are not listed)."""
        own = [n for n in registered_names() if registered(n).user]
        return sorted(set(self._installed) | set(own))

    def register(self, name: str, fn, owner) -> None:
        """Register ``fn`` as ``name`` for the tenant of ``owner`` (a built-in's name: InvalidParamError)."""
        if not callable(fn):
            raise InvalidParamError(f"kernel {name!r}: the payload is not a function")
        _load_builtins()
        _registry.check_user_kernel_name(name)
        with self._lock:
            table = self._by_tenant.setdefault(tenant_of(owner) or "", {})
            old = table.get(name)
            holders = old[1] if old is not None else set()
            k = old[0] if old is not None and old[0].run is fn else _registry.user_kernel(name, fn)
            holders.add(owner)
            table[name] = (k, holders)

    def lookup(self, name: str, owner=None) -> KernelDef:
        """The kernel ``name`` as ``owner`` sees it (its tenant's first, then this process's table)."""
        if owner is not None:
            table = self._by_tenant.get(tenant_of(owner) or "")
            if table:
                hit = table.get(name)
                if hit is not None:
                    return hit[0]
        hit = self._installed.get(name)
        return hit[0] if hit is not None else lookup(name)

    def registered_by(self, name: str, owner) -> KernelDef | None:
        """The kernel the tenant of ``owner`` registered as ``name``, or None."""
        hit = self._by_tenant.get(tenant_of(owner) or "", {}).get(name)
        return hit[0] if hit is not None else None

    def names(self, owner) -> list[str]:
        """Names of the kernels the tenant of ``owner`` registered."""
        with self._lock:
            return sorted(self._by_tenant.get(tenant_of(owner) or "", {}))

    def drop_owner(self, owner) -> int:
        """A client left: forget the kernels only it held; returns how many went."""
        gone = 0
        with self._lock:
            t = tenant_of(owner) or ""
            table = self._by_tenant.get(t, {})
            for name in list(table):
                holders = table[name][1]
                holders.discard(owner)
                if not holders:
                    del table[name]
                    gone += 1
            if not table:
                self._by_tenant.pop(t, None)
        return gone

    def clear(self) -> None:
        """Forget every tenant's kernels (a device reset); the installed ones stay: they are the node's."""
        with self._lock:
            self._by_tenant.clear()


def validate_descs(descs: tuple) -> None:
    for d in descs:
        if not isinstance(d, TensorDesc):
            raise InvalidParamError(f"kernel tensor argument must be a TensorDesc, got {type(d).__name__}")
        if d.dtype not in DTYPES:
            raise InvalidParamError(f"unsupported dtype {d.dtype!r}"[:200], code=ACL_ERROR_UNSUPPORTED_DATA_TYPE)
        if len(d.shape) > MAX_TENSOR_DIMS:
            raise InvalidParamError(f"a tensor has at most {MAX_TENSOR_DIMS} dimensions, not {len(d.shape)}")
        if any((not isinstance(x, (int, np.integer))) or x < 0 for x in d.shape):
            raise InvalidParamError(f"bad shape {d.shape!r}")


def check_launch_counts(n_tensors: int, n_attrs: int) -> None:
    """The launch limits on counts (InvalidParamError beyond them)."""
    if n_tensors > MAX_LAUNCH_TENSORS:
        raise InvalidParamError(f"a launch takes at most {MAX_LAUNCH_TENSORS} tensor arguments, not {n_tensors}")
    if n_attrs > MAX_LAUNCH_ATTRS:
        raise InvalidParamError(f"a launch takes at most {MAX_LAUNCH_ATTRS} attributes, not {n_attrs}")


def check_launch(k: KernelDef, inputs: tuple, outputs: tuple, attrs: dict, block_dim: int) -> None:
    """Host-side validation at launch time (raises InvalidParamError)."""
    if not isinstance(block_dim, (int, np.integer)) or block_dim < 1 or block_dim > 65535:
        raise InvalidParamError(f"block_dim must be in [1, 65535], got {block_dim!r}")
    check_launch_counts(len(inputs) + len(outputs), len(attrs))
    for key, v in attrs.items():
        if isinstance(v, (list, tuple, np.ndarray)) and len(v) > MAX_ATTR_ELEMENTS:
            raise InvalidParamError(f"attribute {key!r} holds {len(v)} elements; at most {MAX_ATTR_ELEMENTS}")
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
            raise self.fault(b, e) from e

    def fault(self, b: int, e: Exception) -> KernelError:
        """What block ``b`` raising ``e`` (not an AclError) is: an AI Core exception on its task."""
        return KernelError(f"kernel {self.k.name!r} block {b}/{self.block_dim} failed: {type(e).__name__}: {e}")

    def bare(self) -> "functools.partial[None]":
        """Block 0 of a built-in kernel as a call without the per-call layers of :meth:`run_block`: no
        context object made, no floating-point state switched (the kernel's ``quiet_body``), no exception
        translated.  The caller runs it with numpy's floating-point warnings off and turns an exception
        other than an AclError into :meth:`fault` (a graph replay, :class:`devices.graph.TaskGraph`)."""
        if self.k.user:
            raise InvalidParamError(f"kernel {self.k.name!r} is a user kernel: its blocks run through GmTensors")
        body = getattr(self.k.run, "quiet_body", self.k.run)
        return functools.partial(body, BlockCtx(0, self.block_dim, self.device_id), self.inputs, self.outputs,
                                 self.attrs)
