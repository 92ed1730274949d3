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
    unit: str                                               #: "cube" or "vector"
    run: Callable[..., None]
    check: Callable[[tuple, tuple, dict], None] | None = None
    work: Callable[[tuple, tuple, dict], Work] | None = None
    parallel_dim: Callable[[tuple, tuple, dict], int] | None = None   #: units of work blocks may split
    user: bool = False
    doc: str = ""


_REGISTRY: dict[str, KernelDef] = {}
_LOCK = threading.Lock()


def builtin(name: str, unit: str = "vector", check=None, work=None, parallel_dim=None):
    """Decorator registering a built-in kernel ``run(ctx, inputs, outputs, attrs)``."""
    def deco(fn):
        _REGISTRY[name] = KernelDef(name, unit, fn, check, work, parallel_dim, False, fn.__doc__ or "")
        return fn
    return deco


def register_user_kernel(name: str, fn: Callable[..., None], *, replace: bool = False) -> None:
    """Register ``fn(ctx, *tensors, **attrs)`` as kernel ``name`` (per-block SPMD)."""
    if not name or not callable(fn):
        raise InvalidParamError("a user kernel needs a name and a callable")
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None and not replace and (not old.user or old.run is not fn):
            raise AclError(f"kernel {name!r} is already registered", code=ACL_ERROR_KERNEL_ALREADY_REGISTERED)
        _REGISTRY[name] = KernelDef(name, "vector", fn, None, None, None, True, fn.__doc__ or "")


def registered(name: str) -> KernelDef | None:
    """The kernel registered as ``name`` so far, or None (does not load the built-in library)."""
    return _REGISTRY.get(name)


def registered_names() -> list[str]:
    return sorted(_REGISTRY)
