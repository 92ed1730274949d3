"""Checks of pyACL results shared by the acl tests."""
from __future__ import annotations

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
