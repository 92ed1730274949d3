"""Checks of pyACL results shared by the acl tests."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from runtime import acl


def ok(res):
    """Unpack a pyACL result (``ret`` or ``(*outs, ret)``), asserting ret == 0 (with the error text on
    failure): None, the one output, or the outputs as a tuple."""
    if isinstance(res, tuple):
        *outs, ret = res
    else:
        outs, ret = [], res
    assert ret == 0, f"ret {ret}: {acl.get_recent_err_msg()}"
    return outs[0] if len(outs) == 1 else (tuple(outs) if outs else None)


@contextlib.contextmanager
def acl_session() -> Iterator[None]:
    """acl initialized on the process runtime with device 0 set for the block, finalized after it whatever
    the block did (a test's left-over state, and its last error message, do not reach the next)."""
    acl.finalize()
    acl.get_recent_err_msg()
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    try:
        yield
    finally:
        acl.finalize()
        acl.get_recent_err_msg()
