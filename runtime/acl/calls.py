"""pyACL's calling convention, in one place: :func:`acl_call` makes a function an ``acl`` call.

- outputs first and ``ret`` (an int aclError) last: ``ptr, ret = acl.rt.malloc(size, policy)``; a call
  with no outputs returns only ``ret``;
- errors are *returned* as CANN codes, never raised: an :class:`~devices.errors.AclError` gives its
  code, a bad argument value (TypeError/ValueError/OverflowError raised inside the call) 100000, anything
  else 500000; wrong arguments to the call itself (a missing parameter) stay a Python TypeError, as in
  pyACL;
- the text of the calling thread's last error is kept for ``acl.get_recent_err_msg()`` (reading it
  clears it), prefixed with the call's name (``acl.rt.malloc: ...``).
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

from devices.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_INVALID_PARAM, ACL_ERROR_UNINITIALIZE, ACL_SUCCESS,
                            AclError)

from .state import STATE

log = logging.getLogger("vnpu.acl")

_PACKAGE = __name__.rpartition(".")[0]          # "runtime.acl": calls are named "acl[.<module>].<name>"
_tls = threading.local()                        # .err: the calling thread's last error text


def call_name(fn: Callable) -> str:
    """``acl.rt.malloc`` for ``runtime.acl.rt.malloc``, ``acl.init`` for ``runtime.acl.init``."""
    mod = fn.__module__
    sub = mod[len(_PACKAGE):] if mod.startswith(_PACKAGE) else "." + mod
    return f"acl{sub}.{fn.__name__}"


def acl_call(outs: tuple = (), init: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn`` an acl call (see the module docstring).  ``outs`` are the outputs returned
    with a failing ``ret``; ``init`` calls fail with 100001 before ``acl.init()``.  ``fn`` returns
    ``None`` (no outputs), one value (one output) or a tuple (several outputs)."""
    def deco(fn: Callable) -> Callable:
        name = call_name(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                if init and not STATE.initialized:
                    raise AclError("acl.init() has not been called", code=ACL_ERROR_UNINITIALIZE)
                res = fn(*args, **kwargs)
            except AclError as e:
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
    return (*outs, code) if outs else code
