"""ONNX -> the compiler's IR.

:func:`load_onnx` reads a model (path, bytes or ``ModelProto``) once into an :class:`OnnxSource`: the
nodes with plain-Python attributes, the initializers as numpy arrays, the declared inputs and outputs,
and the default-domain opset.  :func:`instantiate` makes a fresh :class:`~runtime.atc.ir.Graph` of it
at concrete input shapes (one per batch gear); the initializer arrays are shared, never copied.

Errors: a missing file is E10001 / 145002 (ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID), a file that is not a
valid ONNX model E10041 / 100013 (ACL_ERROR_PARSE_MODEL), an input whose dims are symbolic and not given
in ``--input_shape`` E10001, an ``--input_shape`` name that is not a graph input E10016.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import (ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID,
                            ACL_ERROR_GE_PARAM_INVALID, ACL_ERROR_PARSE_MODEL, AtcError)
from devices.kernel import DTYPES

from .ir import Graph, Node, Value

#: ONNX TensorProto.DataType -> numpy dtype name (only those numpy holds)
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
ONNX_DTYPE_NAMES = {0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16"}
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class InputSpec:
    name: str
    dtype: str
    dims: tuple                       #: ints, or str/None for symbolic dims


@dataclass
class OnnxSource:
    name: str
    nodes: list[Node]
    consts: dict[str, np.ndarray]
    inputs: list[InputSpec]
    outputs: list[str]
    opset: int
    origin: str                       #: file name or "<memory>"
    nbytes: int = 0                   #: size of the serialized model


def _attr(a):
    from onnx import helper, numpy_helper
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if hasattr(v, "data_type") and hasattr(v, "dims"):                 # TensorProto
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else
                (numpy_helper.to_array(x) if hasattr(x, "data_type") and hasattr(x, "dims") else x) for x in v]
    return v


def load_onnx(source) -> OnnxSource:
    """Read an ONNX model from a path, raw bytes or an ``onnx.ModelProto``."""
    import onnx
    from onnx import numpy_helper
    origin = "<memory>"
    if isinstance(source, onnx.ModelProto):
        model, nbytes = source, source.ByteSize()
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            raw = bytes(source)
        else:
            origin = str(source)
            p = Path(source)
            if not p.is_file():
                raise AtcError("E10001", ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, value=origin, parameter="--model",
                               reason="the file does not exist or is not a regular file")
            try:
                raw = p.read_bytes()
            except OSError as e:
                raise AtcError("E10001", ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, value=origin, parameter="--model",
                               reason=f"cannot read it ({e.strerror})") from None
        nbytes = len(raw)
        try:
            model = onnx.load_from_string(raw)
            if not model.graph.node and not model.graph.output:
                raise ValueError("no graph")
        except Exception:  # noqa: BLE001 - protobuf raises several types for garbage
            raise AtcError("E10041", ACL_ERROR_PARSE_MODEL, parameter=origin) from None
        if origin != "<memory>" and any(t.data_location == 1 for t in model.graph.initializer):
            from onnx.external_data_helper import load_external_data_for_model
            load_external_data_for_model(model, str(Path(origin).parent))
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), 0) or 13
    try:
        consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    except Exception:  # noqa: BLE001
        raise AtcError("E10041", ACL_ERROR_PARSE_MODEL, parameter=origin) from None
    inputs = []
    for vi in g.input:
        if vi.name in consts:
            continue                                   # old exporters list initializers as inputs
        tt = vi.type.tensor_type
        dt = ONNX_DTYPES.get(tt.elem_type)
        if dt is None or dt not in DTYPES:
            raise AtcError("E10001", ACL_ERROR_GE_DATATYPE_INVALID, value=vi.name, parameter="input",
                           reason=f"data type {ONNX_DTYPE_NAMES.get(tt.elem_type, dt or tt.elem_type)} is not "
                                  f"supported by the device (supported: {', '.join(DTYPES)})")
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        inputs.append(InputSpec(vi.name, dt, dims))
    nodes = []
    for i, n in enumerate(g.node):
        nodes.append(Node(n.op_type, n.name or f"{n.op_type}_{i}", list(n.input), list(n.output),
                          {a.name: _attr(a) for a in n.attribute}, n.domain, int(opset)))
    return OnnxSource(g.name or "model", nodes, consts, inputs, [o.name for o in g.output], int(opset), origin, nbytes)


def resolve_shapes(src: OnnxSource, given: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each input's dims: those of ``--input_shape`` (-1 kept for the batch axis), else the declared ones,
    which must then be static."""
    names = {i.name for i in src.inputs}
    for n in given:
        if n not in names:
            raise AtcError("E10016", ACL_ERROR_GE_PARAM_INVALID, opname=n, parameter="input_shape")
    out = {}
    for spec in src.inputs:
        if spec.name in given:
            dims = given[spec.name]
            if len(spec.dims) and len(dims) != len(spec.dims):
                raise AtcError("E10002", ACL_ERROR_GE_PARAM_INVALID, shape=f"{spec.name}:{','.join(map(str, dims))}",
                               reason=f"the model's input {spec.name} has {len(spec.dims)} dims",
                               sample='"input_name1:n1,c1,h1,w1;input_name2:n2,c2,h2,w2"')
            out[spec.name] = tuple(dims)
            continue
        sym = [d for d in spec.dims if not isinstance(d, int) or d <= 0]
        if sym:
            shown = ",".join(str(d) if isinstance(d, int) else str(d or "?") for d in spec.dims)
            raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=f"{spec.name}[{shown}]",
                           parameter="--input_shape",
                           reason=f"input {spec.name} has symbolic dims; give them, e.g. --input_shape "
                                  f"\"{spec.name}:{','.join('1' if not isinstance(d, int) or d <= 0 else str(d) for d in spec.dims)}\"")
        out[spec.name] = tuple(int(d) for d in spec.dims)
    return out


def instantiate(src: OnnxSource, shapes: dict[str, tuple[int, ...]]) -> Graph:
    """A fresh graph of ``src`` with the inputs at ``shapes`` (all dims concrete)."""
    values = {name: Value(name, tuple(a.shape), a.dtype.name, a) for name, a in src.consts.items()}
    for spec in src.inputs:
        values[spec.name] = Value(spec.name, tuple(shapes[spec.name]), spec.dtype)
    return Graph(values, [n.copy() for n in src.nodes], [i.name for i in src.inputs], list(src.outputs),
                 src.opset, src.name)
