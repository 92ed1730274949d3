"""pyACL's calling convention, in one place: :func:`acl_call` makes a function an ``acl`` call.

- outputs first and ``ret`` (an int aclError) last: ``ptr, ret = acl.rt.malloc(size, policy)``; a call
  with no outputs returns only ``ret``;
- errors are *returned* as CANN codes, never raised: an :class:`~devices.errors.AclError` gives its
  code, a bad argument value (TypeError/ValueError/OverflowError raised inside the call) 100000, anything
  else 500000; wrong arguments to the call itself (a missing parameter) stay a Python TypeError, as in
  pyACL;
- the text of the calling thread's last error is kept for ``acl.get_recent_err_msg()`` (reading it
  clears it), prefixed with the call's name (``acl.rt.malloc: ...``).

C functions that return a value instead of an aclError (``aclmdlGetNumInputs`` -> size_t,
``aclCreateDataBuffer`` -> pointer, ``aclmdlGetInputDataType`` -> enum) are bare-value calls in pyACL:
:func:`acl_value` makes them return their value, or on failure the C function's failure value (0, -1,
"") with the error text kept the same way.

A call is named after the acl namespace of its module: ``runtime.acl`` -> ``acl``, ``runtime.acl._rt``
(the private module that implements ``acl.rt``) -> ``acl.rt``; a module that implements functions of
another namespace says so with a module-level ``ACL_NAMESPACE = "acl"`` (``runtime.acl._buffers`` holds
``acl.create_data_buffer``).  The call's ``__module__`` is the public module of its namespace
(``acl.rt.malloc.__module__ == "runtime.acl.rt"``), where pyACL programs find it.
"""
from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Callable

from devices.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_PARAM, ACL_ERROR_UNINITIALIZE, ACL_SUCCESS,
                            AclError)

from runtime import sanitize
from runtime.profiler import hooks

from . import _profinfo as profinfo
from ._state import STATE

log = logging.getLogger("vnpu.acl")

_PACKAGE = __name__.rpartition(".")[0]          # "runtime.acl": calls are named "acl[.<module>].<name>"
_tls = threading.local()                        # .err: the calling thread's last error text


def call_name(fn: Callable) -> str:
    """``acl.rt.malloc`` for ``runtime.acl._rt.malloc``, ``acl.init`` for ``runtime.acl.init``,
    ``acl.create_data_buffer`` for ``runtime.acl._buffers.create_data_buffer`` (``ACL_NAMESPACE``)."""
    mod = fn.__module__
    ns = getattr(sys.modules.get(mod), "ACL_NAMESPACE", None)
    if ns:
        return f"{ns}.{fn.__name__}"
    sub = mod[len(_PACKAGE):] if mod.startswith(_PACKAGE) else "." + mod
    return f"acl{sub.replace('._', '.')}.{fn.__name__}"


def _public_module(name: str) -> str:
    """The public module that holds call ``name``: ``runtime.acl.rt`` for ``acl.rt.malloc``."""
    return _PACKAGE + name.rpartition(".")[0][len("acl"):]


def acl_call(outs: tuple = (), init: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` an acl call (see the module docstring).  ``outs`` are the outputs returned
    with a failing ``ret``; ``init`` calls fail with 100001 before ``acl.init()``.  ``fn`` returns
    ``None`` (no outputs), one value (one output) or a tuple (several outputs)."""
    def deco(fn: Callable) -> Callable:
        name = call_name(fn)
        cat = hooks.category_of(name)
        info = profinfo.INFO.get(name)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            prof = hooks.ACTIVE
            if prof is not None:                   # the profiler records the call (AscendCL level)
                return prof.call(name, cat, "AscendCL", run, args, kwargs, info)
            return run(*args, **kwargs)

        def run(*args, **kwargs):
            try:
                if init and not STATE.initialized:
                    raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
                res = fn(*args, **kwargs)
            except AclError as e:
                san = sanitize.current()
                if san is not None:                # memcheck: a refused bad access, from the caller's stack
                    san.api_error(e, api=name)
                return _failed(name, e.code, str(e), outs)
            except (TypeError, ValueError, OverflowError) as e:
                if e.__traceback__ is not None and e.__traceback__.tb_next is None:
                    raise                 # wrong arguments to the call itself: a Python error, as in pyACL
                return _failed(name, ACL_ERROR_INVALID_PARAM, f"{type(e).__name__}: {e}", outs)
            except Exception as e:  # noqa: BLE001 - an API call never raises
                log.debug("%s failed", name, exc_info=True)
                return _failed(name, ACL_ERROR_INTERNAL_ERROR, f"{type(e).__name__}: {e}", outs)
            if not outs:
                return ACL_SUCCESS
            if len(outs) == 1:
                return res, ACL_SUCCESS
            return (*res, ACL_SUCCESS)
        call.__module__ = _public_module(name)
        return call
    return deco


def acl_value(default, init: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` a bare-value acl call (see the module docstring): it returns ``fn``'s
    value, or ``default`` (the C function's failure value) when it fails, keeping the error text for
    ``acl.get_recent_err_msg()``.  ``init`` calls fail before ``acl.init()``."""
    def deco(fn: Callable) -> Callable:
        name = call_name(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                if init and not STATE.initialized:
                    raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
                return fn(*args, **kwargs)
            except AclError as e:
                _failed(name, e.code, str(e), ())
            except (TypeError, ValueError, OverflowError) as e:
                if e.__traceback__ is not None and e.__traceback__.tb_next is None:
                    raise                 # wrong arguments to the call itself: a Python error, as in pyACL
                _failed(name, ACL_ERROR_INVALID_PARAM, f"{type(e).__name__}: {e}", ())
            except Exception as e:  # noqa: BLE001 - an API call never raises
                log.debug("%s failed", name, exc_info=True)
                _failed(name, ACL_ERROR_INTERNAL_ERROR, f"{type(e).__name__}: {e}", ())
            return default
        call.__module__ = _public_module(name)
        return call
    return deco


def record_error(name: str, text: str) -> None:
    """Keep ``text`` as the calling thread's last error (for calls outside the convention)."""
    _tls.err = f"{name}: {text}"


def take_error() -> str:
    """The calling thread's last error text ("" when none); clears it."""
    msg = getattr(_tls, "err", None) or ""
    _tls.err = None
    return msg


def _failed(name: str, code: int, text: str, outs: tuple):
    record_error(name, text)
    log.debug("%s -> %d: %s", name, code, text)
    # a dict output (pyACL's dims / batch dicts) is a fresh one per failure: callers may mutate it
    return (*(dict(o) if isinstance(o, dict) else o for o in outs), code) if outs else code
