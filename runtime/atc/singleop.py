"""Single-operator models: what ``vnpu atc --singleop op_list.json --output DIR`` writes and ``acl.op`` runs.

CANN compiles each entry of an op list (ATC's ``--singleop`` JSON: ``op``, ``input_desc`` / ``output_desc``
with ``format``, ``shape``, ``type`` and, for a constant input, ``is_const`` + ``const_value``, and ``attr``
entries of ``name``, ``type``, ``value``) into one ``.om`` per operator; ``aclopSetModelDir`` loads a
directory of them and ``aclopExecuteV2`` runs the one that matches the call's operator type, tensor
descriptions and attributes.  vnpu does the same with its own compiler: each entry becomes a one-operator
ONNX graph (the CANN operator mapped onto ONNX's: ``MatMulV2`` with ``transpose_x2`` -> Transpose +
MatMul, ``ArgMaxV2`` with its constant ``dimension`` -> ArgMax + Cast ...), compiled by
:func:`~runtime.atc.compile_model` into an ordinary vnpu ``.om`` whose manifest carries the entry itself
(``"singleop"``), so an execution is a model execution: the same launch checks, cost model, profiler
rows and sanitizer as ``acl.mdl``.

:class:`OpSpec` is one entry with its values normalised (numpy dtype names, tuples, attributes sorted,
an attribute at the operator's default dropped), so an ``acl.op`` call and a file compare by equality.
Errors are ATC's: a malformed list or an entry that does not describe the operator is E10001 (with the
entry's index), an operator vnpu does not have E10055.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from devices.errors import ACL_ERROR_GE_PARAM_INVALID, AtcError
from devices.kernel import ACL_DTYPE

from .options import DEFAULT_SOC, CompileOptions

#: the ``type`` names of ATC's op-list JSON -> numpy dtype names
JSON_DTYPES = {"float": "float32", "float32": "float32", "float16": "float16", "double": "float64",
               "float64": "float64", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
               "uint8": "uint8", "bool": "bool"}
#: aclFormat of each format a description may have
ACL_FORMATS = {"NCHW": 0, "NHWC": 1, "ND": 2}
FORMATS = tuple(ACL_FORMATS)
#: aclDataType -> numpy dtype name (the attribute ``dst_type`` of Cast, acl tensor descriptions)
DTYPE_OF_ACL = {v: k for k, v in ACL_DTYPE.items()}
ATTR_TYPES = ("bool", "int", "float", "string", "list_bool", "list_int", "list_float", "list_string",
              "list_list_int", "data_type")
#: the key of a single-operator model's manifest that holds its entry
MANIFEST_KEY = "singleop"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of an operator: numpy dtype name, shape, format and, for a constant input, its
    values (flattened, in the dtype)."""
    dtype: str
    shape: tuple[int, ...]
    format: str = "ND"
    const: tuple | None = None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def const_array(self) -> np.ndarray:
        return np.asarray(self.const, dtype=self.dtype).reshape(self.shape)

    def to_json(self) -> dict:
        d = {"type": self.dtype, "shape": list(self.shape), "format": self.format}
        if self.const is not None:
            d.update(is_const=True, const_value=list(self.const))
        return d


@dataclass(frozen=True)
class OpSpec:
    """An operator type with its tensor descriptions and (normalised) attributes."""
    op_type: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, name: str, default=None):
        return dict(self.attrs).get(name, default)

    def file_name(self, index: int) -> str:
        """``0_Add_3_2_8_16_3_2_8_16_3_2_8_16.om``: index, type, then aclDataType, aclFormat and dims of every
        tensor, as ATC names its single-operator models."""
        parts = [str(index), self.op_type]
        for t in self.inputs + self.outputs:
            parts += [str(ACL_DTYPE[t.dtype]), str(ACL_FORMATS[t.format]), *(str(d) for d in t.shape)]
        return "_".join(parts) + ".om"

    def to_json(self) -> dict:
        return {"op": self.op_type, "input_desc": [t.to_json() for t in self.inputs],
                "output_desc": [t.to_json() for t in self.outputs],
                "attr": [{"name": n, "type": _attr_type(v), "value": _thaw(v)} for n, v in self.attrs]}


def _attr_type(v) -> str:
    """The op-list ``type`` of a (normalised) attribute value."""
    def one(x):
        return "bool" if isinstance(x, bool) else "int" if isinstance(x, int) else \
            "float" if isinstance(x, float) else "string"
    if isinstance(v, tuple):
        if v and isinstance(v[0], tuple):
            return "list_list_int"
        return "list_" + (one(v[0]) if v else "int")
    return one(v)


def _thaw(v):
    return [_thaw(x) for x in v] if isinstance(v, tuple) else v


# ---------------------------------------------------------------------------------------------- the operators
@dataclass(frozen=True)
class OpDef:
    """How one CANN operator becomes ONNX: ``build(spec, names)`` returns (nodes, extra initializers) that
    read the graph inputs ``names.inputs`` and write ``names.outputs``; ``defaults`` are the attributes'
    default values (an attribute given at its default equals one not given)."""
    build: Callable
    defaults: dict
    n_inputs: tuple[int, int]                  #: (least, most)
    const_inputs: tuple[int, ...] = ()         #: inputs that must be constant


@dataclass(frozen=True)
class _Names:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _node(op, ins, outs, **attrs):
    from onnx import helper
    return helper.make_node(op, list(ins), list(outs), **attrs)


def _elementwise(onnx_op: str) -> Callable:
    return lambda spec, n: ([_node(onnx_op, n.inputs, n.outputs)], [])


def _last_two_swapped(rank: int) -> list[int]:
    return list(range(rank - 2)) + [rank - 1, rank - 2]


def _matmul(flags: tuple[str, str]) -> Callable:
    """MatMul/MatMulV2 (``transpose_x1``/``transpose_x2``) and BatchMatMul(V2) (``adj_x1``/``adj_x2``),
    with the optional bias input (the third) added after the product."""
    def build(spec: OpSpec, n: _Names):
        nodes, ins = [], list(n.inputs[:2])
        for k, flag in enumerate(flags):
            if spec.attr(flag, False):
                t = f"{ins[k]}_t"
                nodes.append(_node("Transpose", [ins[k]], [t], perm=_last_two_swapped(len(spec.inputs[k].shape))))
                ins[k] = t
        if len(n.inputs) > 2:
            nodes += [_node("MatMul", ins, ["mm"]), _node("Add", ["mm", n.inputs[2]], n.outputs)]
        else:
            nodes.append(_node("MatMul", ins, n.outputs))
        return nodes, []
    return build


def _cast(spec: OpSpec, n: _Names):
    from .onnx_import import ONNX_DTYPES
    dst = DTYPE_OF_ACL.get(spec.attr("dst_type", -1))
    if dst != spec.outputs[0].dtype:
        raise ValueError(f"attr dst_type {spec.attr('dst_type')} (aclDataType of {dst}) is not the output's "
                         f"type {spec.outputs[0].dtype}")
    to = {v: k for k, v in ONNX_DTYPES.items()}[dst]
    return [_node("Cast", n.inputs, n.outputs, to=to)], []


def _onnx_dtype(dtype: str) -> int:
    from .onnx_import import ONNX_DTYPES
    return {v: k for k, v in ONNX_DTYPES.items()}[dtype]


def _argmax(axis_of: Callable) -> Callable:
    """ArgMaxV2 (constant ``dimension`` input) / ArgMaxD (attr ``dimension``): ONNX ArgMax (int64) then a
    Cast to the output's type."""
    def build(spec: OpSpec, n: _Names):
        axis = axis_of(spec)
        out = spec.outputs[0].dtype
        if out not in ("int32", "int64"):
            raise ValueError(f"the output type must be int32 or int64, got {out}")
        if out == "int64":
            return [_node("ArgMax", n.inputs[:1], n.outputs, axis=axis, keepdims=0)], []
        return [_node("ArgMax", n.inputs[:1], ["am"], axis=axis, keepdims=0),
                _node("Cast", ["am"], n.outputs, to=_onnx_dtype(out))], []
    return build


def _const_ints(spec: OpSpec, i: int) -> list[int]:
    return [int(v) for v in spec.inputs[i].const]


def _softmax(spec: OpSpec, n: _Names):
    axes = list(spec.attr("axes", (-1,)))
    if len(axes) != 1:
        raise ValueError(f"attr axes must name one axis, got {axes}")
    return [_node("Softmax", n.inputs, n.outputs, axis=axes[0])], []


def _reduce(onnx_op: str, axes_of: Callable) -> Callable:
    def build(spec: OpSpec, n: _Names):
        from onnx import numpy_helper
        axes = np.asarray(axes_of(spec), dtype=np.int64)
        init = numpy_helper.from_array(axes, "axes")
        return [_node(onnx_op, [n.inputs[0], "axes"], n.outputs,
                      keepdims=int(bool(spec.attr("keep_dims", False))))], [init]
    return build


def _transpose(perm_of: Callable) -> Callable:
    return lambda spec, n: ([_node("Transpose", n.inputs[:1], n.outputs, perm=list(perm_of(spec)))], [])


def _with_ints(onnx_op: str, name: str, values_of: Callable, **attrs) -> Callable:
    """``onnx_op(x, <int64 constant name>)``: Reshape's shape, from a constant input or an attribute."""
    def build(spec: OpSpec, n: _Names):
        from onnx import numpy_helper
        init = numpy_helper.from_array(np.asarray(values_of(spec), dtype=np.int64), name)
        return [_node(onnx_op, [n.inputs[0], name], n.outputs, **attrs)], [init]
    return build


def _slice(offsets_of: Callable, size_of: Callable) -> Callable:
    """Slice / SliceD: ``offsets`` and ``size`` (-1: to the end) -> ONNX Slice starts / ends."""
    def build(spec: OpSpec, n: _Names):
        from onnx import numpy_helper
        off, size = list(offsets_of(spec)), list(size_of(spec))
        dims = spec.inputs[0].shape
        if len(off) != len(dims) or len(size) != len(dims):
            raise ValueError(f"offsets {off} and size {size} must have one value per input dim {list(dims)}")
        ends = [d if s == -1 else o + s for o, s, d in zip(off, size, dims)]
        inits = [numpy_helper.from_array(np.asarray(v, dtype=np.int64), nm)
                 for v, nm in ((off, "starts"), (ends, "ends"))]
        return [_node("Slice", [n.inputs[0], "starts", "ends"], n.outputs)], inits
    return build


def _concat(spec: OpSpec, n: _Names):
    return [_node("Concat", n.inputs, n.outputs, axis=int(spec.attr("concat_dim", 0)))], []


OPS: dict[str, OpDef] = {
    **{cann: OpDef(_elementwise(onnx_op), {}, (2, 2)) for cann, onnx_op in
       {"Add": "Add", "AddV2": "Add", "Sub": "Sub", "Mul": "Mul", "RealDiv": "Div", "Div": "Div",
        "Pow": "Pow", "Equal": "Equal"}.items()},
    **{cann: OpDef(_elementwise(cann), {}, (1, 1)) for cann in
       ("Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Neg", "Erf", "Gelu")},
    "Cast": OpDef(_cast, {"truncate": False}, (1, 1)),
    "MatMul": OpDef(_matmul(("transpose_x1", "transpose_x2")), {"transpose_x1": False, "transpose_x2": False},
                    (2, 3)),
    "MatMulV2": OpDef(_matmul(("transpose_x1", "transpose_x2")),
                      {"transpose_x1": False, "transpose_x2": False, "offset_x": 0}, (2, 3)),
    "BatchMatMul": OpDef(_matmul(("adj_x1", "adj_x2")), {"adj_x1": False, "adj_x2": False}, (2, 3)),
    "BatchMatMulV2": OpDef(_matmul(("adj_x1", "adj_x2")), {"adj_x1": False, "adj_x2": False, "offset_x": 0},
                           (2, 3)),
    "SoftmaxV2": OpDef(_softmax, {"axes": (-1,)}, (1, 1)),
    "ArgMaxV2": OpDef(_argmax(lambda s: _const_ints(s, 1)[0]), {"dtype": 3}, (2, 2), const_inputs=(1,)),
    "ArgMaxD": OpDef(_argmax(lambda s: int(s.attr("dimension", 0))), {"dtype": 3}, (1, 1)),
    **{cann: OpDef(_reduce(onnx_op, lambda s: _const_ints(s, 1)), {"keep_dims": False}, (2, 2),
                   const_inputs=(1,)) for cann, onnx_op in
       {"ReduceSum": "ReduceSum", "ReduceMean": "ReduceMean", "ReduceMax": "ReduceMax",
        "ReduceMin": "ReduceMin"}.items()},
    **{cann: OpDef(_reduce(onnx_op, lambda s: list(s.attr("axes", ()))), {"keep_dims": False}, (1, 1))
       for cann, onnx_op in {"ReduceSumD": "ReduceSum", "ReduceMeanD": "ReduceMean", "ReduceMaxD": "ReduceMax",
                             "ReduceMinD": "ReduceMin"}.items()},
    "Transpose": OpDef(_transpose(lambda s: _const_ints(s, 1)), {}, (2, 2), const_inputs=(1,)),
    "TransposeD": OpDef(_transpose(lambda s: s.attr("perm", ())), {}, (1, 1)),
    "Reshape": OpDef(_with_ints("Reshape", "shape", lambda s: _const_ints(s, 1)), {"axis": 0, "num_axes": -1},
                     (2, 2), const_inputs=(1,)),
    "Slice": OpDef(_slice(lambda s: _const_ints(s, 1), lambda s: _const_ints(s, 2)), {}, (3, 3),
                   const_inputs=(1, 2)),
    "SliceD": OpDef(_slice(lambda s: s.attr("offsets", ()), lambda s: s.attr("size", ())), {}, (1, 1)),
    "ConcatD": OpDef(_concat, {"concat_dim": 0}, (1, 64)),
    "ConcatV2D": OpDef(_concat, {"concat_dim": 0}, (1, 64)),
}


# ---------------------------------------------------------------------------------------------- normalising
def normalize_attrs(op_type: str, attrs: dict) -> tuple[tuple[str, object], ...]:
    """Attributes as an :class:`OpSpec` holds them: lists as tuples, sorted by name, those at the operator's
    default dropped (so a call that sets ``adj_x1=False`` matches a model compiled without it)."""
    defaults = OPS[op_type].defaults if op_type in OPS else {}
    out = []
    for name, v in attrs.items():
        v = _freeze(v)
        if name in defaults and _freeze(defaults[name]) == v:
            continue
        out.append((name, v))
    return tuple(sorted(out))


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return v


def _bad(index: int, reason: str, value=None) -> AtcError:
    return AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=json.dumps(value)[:120] if value is not None else
                    f"op {index}", parameter="--singleop", reason=f"op {index}: {reason}")


def _tensor(index: int, where: str, d) -> TensorSpec:
    if not isinstance(d, dict):
        raise _bad(index, f"{where} must be an object with format, shape and type", d)
    dtype = JSON_DTYPES.get(d.get("type")) if isinstance(d.get("type"), str) else None
    if dtype is None:
        raise _bad(index, f"{where}: type {d.get('type')!r} is not one of {', '.join(JSON_DTYPES)}", d)
    fmt = d.get("format", "ND")
    if fmt not in FORMATS:
        raise _bad(index, f"{where}: format {fmt!r} is not one of {', '.join(FORMATS)}", d)
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise _bad(index, f"{where}: shape must be a list of non-negative integers, got {shape!r}", d)
    const = None
    if d.get("is_const"):
        vals = d.get("const_value")
        if not isinstance(vals, list) or len(np.ravel(np.asarray(vals, dtype=object))) != max(
                int(np.prod(shape, dtype=np.int64)), 0):
            raise _bad(index, f"{where}: const_value must list {int(np.prod(shape))} values", d)
        const = tuple(_freeze(x) for x in np.asarray(vals, dtype=dtype).ravel().tolist())
    return TensorSpec(dtype, tuple(shape), fmt, const)


def _attr_value(index: int, a) -> tuple[str, object]:
    if not isinstance(a, dict) or not isinstance(a.get("name"), str) or a.get("type") not in ATTR_TYPES \
            or "value" not in a:
        raise _bad(index, f"an attr must have a name, a type ({', '.join(ATTR_TYPES)}) and a value", a)
    return a["name"], a["value"]


def parse_op_list(text: str, origin: str = "--singleop") -> list[OpSpec]:
    """The entries of an op-list JSON document (E10001 for anything malformed, E10055 for an operator vnpu
    does not have)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=origin, parameter="--singleop",
                       reason=f"not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not doc:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=origin, parameter="--singleop",
                       reason="the file must hold a list of operators")
    return [_entry(i, e) for i, e in enumerate(doc)]


def _entry(i: int, e) -> OpSpec:
    if not isinstance(e, dict) or not isinstance(e.get("op"), str):
        raise _bad(i, "an entry must be an object with \"op\"", e)
    op = e["op"]
    if op not in OPS:
        raise AtcError("E10055", ACL_ERROR_GE_PARAM_INVALID,
                       reason=f"op {i}: vnpu has no single-operator {op!r} (it has {', '.join(sorted(OPS))})")
    ins = tuple(_tensor(i, f"input_desc[{k}]", d) for k, d in enumerate(e.get("input_desc") or []))
    outs = tuple(_tensor(i, f"output_desc[{k}]", d) for k, d in enumerate(e.get("output_desc") or []))
    attrs = dict(_attr_value(i, a) for a in (e.get("attr") or []))
    try:
        return make_spec(op, ins, outs, attrs)
    except ValueError as err:
        raise _bad(i, str(err)) from None


def make_spec(op: str, ins, outs, attrs: dict) -> OpSpec:
    """An :class:`OpSpec`, checked against the operator's arity and constant inputs (ValueError)."""
    d = OPS.get(op)
    if d is None:
        raise ValueError(f"vnpu has no single-operator {op!r}")
    lo, hi = d.n_inputs
    if not lo <= len(ins) <= hi:
        raise ValueError(f"{op} takes {lo if lo == hi else f'{lo} to {hi}'} inputs, got {len(ins)}")
    if len(outs) != 1:
        raise ValueError(f"{op} has one output, got {len(outs)} output descriptions")
    for k in d.const_inputs:
        if ins[k].const is None:
            raise ValueError(f"input {k} of {op} must be constant (is_const with const_value, or "
                             "acl.set_tensor_const)")
    return OpSpec(op, tuple(ins), tuple(outs), normalize_attrs(op, attrs))


# ---------------------------------------------------------------------------------------------- compiling
def to_onnx(spec: OpSpec, reshape: bool = False):
    """The one-operator ONNX model of ``spec``: its non-constant inputs are the graph's inputs ``x<k>``, its
    constant inputs initializers ``c<k>``, its output ``y0`` (``reshape``: the operator's result reshaped to
    the output description's dims, for a description that writes the same elements with other dims, as
    CANN's ``[1]`` for the argmax of a vector)."""
    from onnx import helper, numpy_helper
    names, graph_in, inits = [], [], []
    for k, t in enumerate(spec.inputs):
        if t.const is not None:
            names.append(f"c{k}")
            inits.append(numpy_helper.from_array(t.const_array(), f"c{k}"))
        else:
            names.append(f"x{k}")
            graph_in.append(helper.make_tensor_value_info(f"x{k}", _onnx_dtype(t.dtype), list(t.shape)))
    out = spec.outputs[0]
    nodes, extra = OPS[spec.op_type].build(spec, _Names(tuple(names), ("y_op" if reshape else "y0",)))
    if reshape:
        extra = extra + [numpy_helper.from_array(np.asarray(out.shape, dtype=np.int64), "y_dims")]
        nodes = nodes + [_node("Reshape", ["y_op", "y_dims"], ["y0"])]
    graph = helper.make_graph(nodes, spec.op_type, graph_in,
                              [helper.make_tensor_value_info("y0", _onnx_dtype(out.dtype), list(out.shape))],
                              inits + extra)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vnpu-singleop")


def compile_op(spec: OpSpec, soc_version: str = DEFAULT_SOC, where: str = ""):
    """The :class:`~runtime.atc.CompiledModel` of one operator (AtcError E10001 when the entry's output
    description is not what the operator computes)."""
    from .compiler import compile_model
    try:
        proto = to_onnx(spec)
    except ValueError as e:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=spec.op_type, parameter="--singleop",
                       reason=f"{where}: {e}") from None
    cm = compile_model(proto, CompileOptions(soc_version=soc_version))
    got = cm.manifest["outputs"][0]
    want = spec.outputs[0]
    if got["dtype"] == want.dtype and tuple(got["dims"]) != want.shape and \
            int(np.prod(got["dims"], dtype=np.int64)) == want.numel:
        cm = compile_model(to_onnx(spec, reshape=True), CompileOptions(soc_version=soc_version))
        got = cm.manifest["outputs"][0]
    if got["dtype"] != want.dtype or tuple(got["dims"]) != want.shape:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=spec.op_type, parameter="--singleop",
                       reason=f"{where}: output_desc says {want.dtype} {list(want.shape)} but {spec.op_type} of "
                              f"these inputs gives {got['dtype']} {got['dims']}")
    cm.manifest[MANIFEST_KEY] = spec.to_json()
    cm.manifest["name"] = spec.op_type
    return cm


def compile_op_list(path: str | Path, out_dir: str | Path, soc_version: str = DEFAULT_SOC) -> list[Path]:
    """``atc --singleop``: compile every entry of the op list at ``path`` into ``out_dir`` (created)."""
    text = Path(path).read_text()
    specs = parse_op_list(text, str(path))
    built = [compile_op(s, soc_version, where=f"op {i}") for i, s in enumerate(specs)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (s, cm) in enumerate(zip(specs, built)):
        paths.append(cm.save(out / s.file_name(i)))
    return paths


def spec_of_manifest(manifest: dict) -> OpSpec | None:
    """The :class:`OpSpec` a single-operator model was compiled from (None for an ordinary model)."""
    e = manifest.get(MANIFEST_KEY)
    if not isinstance(e, dict):
        return None
    ins = tuple(_tensor(0, "input_desc", d) for d in e.get("input_desc", []))
    outs = tuple(_tensor(0, "output_desc", d) for d in e.get("output_desc", []))
    attrs = {a["name"]: a["value"] for a in e.get("attr", []) if isinstance(a, dict) and "name" in a}
    return make_spec(e["op"], ins, outs, attrs)
