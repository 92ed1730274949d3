"""The op registry and the helpers every op family uses (see :mod:`runtime.atc.ops`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from devices.errors import (ACL_ERROR_FEATURE_UNSUPPORTED, ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_SHAPE_INVALID,
                            ACL_ERROR_OP_NOT_FOUND, AtcError)

from ..onnx_import import ONNX_DTYPE_NAMES, ONNX_DTYPES


@dataclass(frozen=True)
class OpDef:
    op: str
    infer: Callable
    fold: Callable | None = None
    lower: Callable | None = None
    shape_only: bool = False


OPS: dict[str, OpDef] = {}
#: ops only the compiler's own passes create (domain "vnpu"); an ONNX node of that name is not one of them
INTERNAL = ("FusedMatMul", "FusedConv", "Attention", "Aipp")
DEFAULT_DOMAINS = ("", "ai.onnx")


def lookup_op(node, opset: int) -> OpDef:
    """The definition of ``node``'s op, or ATC's EZ9010 naming the node and its op type."""
    od = None
    if node.domain == "vnpu" or (node.domain in DEFAULT_DOMAINS and node.op not in INTERNAL):
        od = OPS.get(node.op)
    if od is None:
        raise unsupported_op(node, opset)
    return od


def register(names, infer, fold=None, lower=None, shape_only: bool = False) -> None:
    for n in ([names] if isinstance(names, str) else names):
        OPS[n] = OpDef(n, infer, fold, lower, shape_only)


# ---------------------------------------------------------------------------------------------- errors
def where(node) -> str:
    return f"{node.name}({node.op})"


def shape_error(node, param: str, shape, reason: str) -> AtcError:
    return AtcError("EZ0009", ACL_ERROR_GE_SHAPE_INVALID, param_name=param, op_name=where(node),
                    incorrect_shape=",".join(map(str, shape)) if shape is not None else "", reason=reason)


def dtype_error(node, param: str, dtype, allowed) -> AtcError:
    return AtcError("EZ0007", ACL_ERROR_GE_DATATYPE_INVALID, param_name=param, op_name=where(node),
                    data_dtype=dtype, expected_dtype_list=", ".join(allowed))


def unsupported(node, reason: str) -> AtcError:
    return AtcError("E10055", ACL_ERROR_FEATURE_UNSUPPORTED, reason=f"{node.op} node {node.name}: {reason}")


def unsupported_op(node, opset: int) -> AtcError:
    """EZ9010, as ATC's ONNX parser reports an op type it has no parser for (ai.onnx::<opset>::<type>)."""
    dom = node.domain if node.domain not in ("", "ai.onnx") else "ai.onnx"
    optype = f"{dom}::{opset}::{node.op}" if dom == "ai.onnx" else f"{dom}::{node.op}"
    return AtcError("EZ9010", ACL_ERROR_OP_NOT_FOUND, opname=node.name, optype=optype)


# ---------------------------------------------------------------------------------------------- helpers
def broadcast(node, *shapes) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise shape_error(node, "inputs", shapes[0], f"shapes {' and '.join(str(tuple(s)) for s in shapes)} "
                                                     "do not broadcast") from None


def norm_axis(node, axis: int, rank: int, param: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise shape_error(node, param, (axis,), f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def onnx_dtype(node, code: int) -> str:
    dt = ONNX_DTYPES.get(int(code))
    if dt is None:
        raise dtype_error(node, "to", ONNX_DTYPE_NAMES.get(int(code), str(code)), sorted(set(ONNX_DTYPES.values())))
    return dt


def const(node, v, what: str) -> np.ndarray:
    """The constant value of input ``v`` (an error naming the node when it is computed at run time)."""
    if v is None or v.const is None:
        raise unsupported(node, f"input '{what}' must be a constant (it is computed at run time)")
    return v.const


def ints(node, ins, index: int, attr: str, default=None):
    """An int list given as input ``index`` (newer opsets) or as attribute ``attr`` (older ones)."""
    v = ins[index] if index < len(ins) else None
    if v is not None:
        return [int(x) for x in np.asarray(const(node, v, attr)).reshape(-1)]
    a = node.attrs.get(attr, default)
    return None if a is None else [int(x) for x in (a if isinstance(a, (list, tuple)) else [a])]


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def same(shape_dtype):
    """infer: one output like the first input."""
    return [(tuple(shape_dtype.shape), shape_dtype.dtype)]

