"""The kernel table: every kernel the devices can run, looked up by name.

Built-in kernels register themselves with :func:`builtin` when :mod:`devices.ops` is imported; user
kernels with :func:`register_user_kernel`.  :func:`devices.kernel.lookup` is the reader (it loads the
built-in library on first use); this module depends on neither, so the library can import it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from .chip import Work
from .errors import ACL_ERROR_KERNEL_ALREADY_REGISTERED, AclError, InvalidParamError


@dataclass(frozen=True)
class KernelDef:
    name: str
    unit: str                                   #: "cube", "vector" or a DVPP engine (devices.chip.DVPP_UNITS)
    run: Callable[..., None]
    check: Callable[[tuple, tuple, dict], None] | None = None
    work: Callable[[tuple, tuple, dict], Work] | None = None
    parallel_dim: Callable[[tuple, tuple, dict], int] | None = None   #: units of work blocks may split
    user: bool = False
    doc: str = ""
    #: input positions read at data-dependent places (a gather, a KV cache read up to lengths held in device
    #: memory): only part of the declared range may really be read (devices.access; initcheck skips them)
    gathers: tuple[int, ...] = ()
    #: output positions written at data-dependent places (a scatter): the rest of the range keeps its bytes
    scatters: tuple[int, ...] = ()


_REGISTRY: dict[str, KernelDef] = {}
_LOCK = threading.Lock()


def builtin(name: str, unit: str = "vector", check=None, work=None, parallel_dim=None, gathers=(), scatters=()):
    """Decorator registering a built-in kernel ``run(ctx, inputs, outputs, attrs)``; ``gathers`` /
    ``scatters``: see :class:`KernelDef`."""
    def deco(fn):
        _REGISTRY[name] = KernelDef(name, unit, fn, check, work, parallel_dim, False, fn.__doc__ or "",
                                    tuple(gathers), tuple(scatters))
        return fn
    return deco


#: longest kernel name accepted
MAX_KERNEL_NAME = 256


def check_user_kernel_name(name) -> None:
    """A user kernel's name: a non-empty string of at most :data:`MAX_KERNEL_NAME` characters that no
    built-in kernel has (built-ins are immutable: InvalidParamError, ACL_ERROR_RT_PARAM_INVALID).
    Callers make sure the built-in library is loaded (``devices.kernel`` does)."""
    if not isinstance(name, str) or not name or len(name) > MAX_KERNEL_NAME:
        raise InvalidParamError(f"a kernel name is a string of 1..{MAX_KERNEL_NAME} characters, got {name!r}"[:300])
    old = _REGISTRY.get(name)
    if old is not None and not old.user:
        raise InvalidParamError(f"{name!r} is a built-in kernel: built-ins cannot be replaced")


def user_kernel(name: str, fn: Callable[..., None]) -> KernelDef:
    """The table entry of user kernel ``fn`` (per-block SPMD, vector unit)."""
    return KernelDef(name, "vector", fn, None, None, None, True, getattr(fn, "__doc__", None) or "")


def register_user_kernel(name: str, fn: Callable[..., None], *, replace: bool = False) -> None:
    """Register ``fn(ctx, *tensors, **attrs)`` as kernel ``name`` (per-block SPMD) in this process's
    table.  A built-in's name is refused; another user kernel's name only with ``replace``."""
    if not callable(fn):
        raise InvalidParamError("a user kernel needs a name and a callable")
    with _LOCK:
        check_user_kernel_name(name)
        old = _REGISTRY.get(name)
        if old is not None and not replace and old.run is not fn:
            raise AclError(f"kernel {name!r} is already registered", code=ACL_ERROR_KERNEL_ALREADY_REGISTERED)
        _REGISTRY[name] = user_kernel(name, fn)


def registered(name: str) -> KernelDef | None:
    """The kernel registered as ``name`` so far, or None (does not load the built-in library)."""
    return _REGISTRY.get(name)


def registered_names() -> list[str]:
    return sorted(_REGISTRY)
