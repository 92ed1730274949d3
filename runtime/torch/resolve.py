"""What runs an aten operator that has no npu implementation of its own, in this order:

0. an in-place metadata operator (``squeeze_``, ``unsqueeze_``, ``transpose_``, ``t_``): its out-of-place
   view, whose sizes/strides/offset the tensor then takes (``Tensor.data``);
1. an operator with a CompositeImplicitAutograd kernel (``to.dtype``, ...): that kernel, whose pieces
   dispatch again;
2. a view operator (its schema returns an alias of an input): computed on meta twins, laid over the same
   Storage (:func:`.ops_core.run_view`) -- never a copy;
3. an operator with an aten-to-aten decomposition in torch's table (``torch._decomp.core_aten_decompositions``): the pieces dispatch again, so
   they run as vnpu kernels where vnpu has them;
4. the CPU fallback (:mod:`.fallback`: warned once, counted, an error under ``VNPU_TORCH_STRICT=1``).

The choice is made once per operator and cached.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions

from . import fallback
from .ops_core import run_view

_CHOICE: dict[Any, Callable[..., Any]] = {}
#: torch's aten-to-aten decompositions (not the refs into prims, which have no vnpu kernels)
_DECOMPOSITIONS = core_aten_decompositions()

#: decompositions that would be slower or less exact than the CPU (none yet: listed here when found)
_NO_DECOMPOSE: frozenset[str] = frozenset()


def _is_view(func) -> bool:
    s = func._schema
    return bool(s.returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in s.returns) \
        and not any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)


def _inplace_view(func) -> Any:
    """The out-of-place view operator of an in-place metadata operator (``squeeze_.dim`` -> ``squeeze.dim``),
    or None."""
    s = func._schema
    if not (s.name.endswith("_") and s.arguments and s.arguments[0].alias_info is not None
            and s.arguments[0].alias_info.is_write):
        return None
    full = func.name().split("::")[1]                     # "squeeze_.dim"
    name, _, overload = full.partition(".")
    packet = getattr(torch.ops.aten, name[:-1], None)
    if packet is None:
        return None
    op = getattr(packet, overload or "default", None)
    if op is None:                       # transpose_ <-> transpose.int: the one view overload of that arity
        n = len(s.arguments)
        views = [o for o in (getattr(packet, ov) for ov in packet.overloads())
                 if _is_view(o) and len(o._schema.arguments) == n]
        op = views[0] if len(views) == 1 else None
    return op if op is not None and _is_view(op) else None


def _restride(func, view_op):
    """In-place metadata change (``x.squeeze_(0)``): the view's sizes/strides/offset given to ``x`` itself."""
    def run(args, kwargs):
        x = args[0]
        x.data = view_op(*args, **kwargs)
        return x
    return run


def _choose(func) -> Callable[..., Any]:
    view_op = _inplace_view(func)
    if view_op is not None:
        return _restride(func, view_op)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return lambda args, kwargs: func.decompose(*args, **kwargs)     # (to.dtype "may alias": not a view)
    if _is_view(func):
        return lambda args, kwargs: run_view(func, args, kwargs)
    dec = _DECOMPOSITIONS.get(func)
    if dec is not None and func._schema.name not in _NO_DECOMPOSE:
        return lambda args, kwargs: dec(*args, **kwargs)
    return lambda args, kwargs: fallback.run_on_cpu(func, args, kwargs)


def missing(func, args, kwargs):
    """Run ``func`` (no direct npu implementation) the first way that applies (see the module docstring)."""
    fn = _CHOICE.get(func)
    if fn is None:
        fn = _CHOICE[func] = _choose(func)
    return fn(args, kwargs)
