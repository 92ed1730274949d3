"""Shape inference and constant folding, in one walk over the nodes in order.

Every node's outputs get static shapes and dtypes from its op's ``infer``.  A node whose inputs are all
constants (or, for Shape/Size, whose input shapes are known -- always, since each batch gear is compiled
at concrete shapes) is evaluated with numpy and disappears; its outputs become constants.  A folded
result may grow beyond the constants it came from only up to ``fold_limit`` bytes (an Expand or a
Gather of a small table into a large activation stays a kernel).  Nodes nothing needs are pruned.
"""
from __future__ import annotations

import numpy as np

from devices.errors import ACL_ERROR_GE_INTERNAL_ERROR, ACL_ERROR_PARSE_MODEL, AclError, AtcError

from .ir import Graph, Value
from .ops import lookup_op, where


def propagate(g: Graph, fold_limit: int = 64 << 10) -> dict:
    """Infer shapes, fold constants, prune; returns counts ``{"folded": n, "pruned": m}``."""
    kept, folded = [], 0
    for node in g.nodes:
        od = lookup_op(node, g.opset)
        ins = []
        for name in node.inputs:
            if not name:
                ins.append(None)
                continue
            v = g.values.get(name)
            if v is None or v.shape is None:
                raise AclError(f"{where(node)}: input {name!r} is not produced by any earlier node (the graph is "
                               "not topologically sorted or an input is missing)", code=ACL_ERROR_GE_INTERNAL_ERROR)
            ins.append(v)
        try:
            outs = od.infer(node, ins)
        except AtcError:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed attribute or input list: name the node
            raise AtcError("EZ0009", ACL_ERROR_PARSE_MODEL, param_name="attributes/inputs", op_name=where(node),
                           incorrect_shape="", reason=f"{type(e).__name__}: {e}") from None
        for name, (shape, dtype) in zip(node.outputs, outs):
            if name:
                g.values[name] = Value(name, tuple(int(d) for d in shape), dtype)
        if od.fold is not None and _foldable(od, ins, outs, fold_limit):
            try:
                with np.errstate(all="ignore"):
                    arrays = od.fold(node, ins)
            except AtcError:
                raise
            except Exception as e:  # noqa: BLE001 - numpy refusing a malformed constant: name the node
                raise AtcError("E19999", ACL_ERROR_GE_INTERNAL_ERROR,
                               reason=f"folding {where(node)} failed: {type(e).__name__}: {e}") from None
            for name, arr, (shape, dtype) in zip(node.outputs, arrays, outs):
                if not name:
                    continue
                arr = np.asarray(arr, order="C")
                if tuple(arr.shape) != tuple(shape):
                    raise AclError(f"{where(node)}: folding gave shape {arr.shape}, inference {shape}",
                                   code=ACL_ERROR_GE_INTERNAL_ERROR)
                arr.flags.writeable = False
                g.values[name].const = arr
            folded += 1
            continue
        kept.append(node)
    g.nodes = kept
    return {"folded": folded, "pruned": g.prune()}


def _foldable(od, ins, outs, limit: int) -> bool:
    if od.shape_only:
        return True
    present = [v for v in ins if v is not None]
    if any(v.const is None for v in present):
        return False
    out_bytes = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in outs)
    return out_bytes <= limit or out_bytes <= sum(v.const.nbytes for v in present)
