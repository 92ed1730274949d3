"""The implementation of ``acl.op`` (:mod:`runtime.acl.op` lists the API and says what it does)."""
from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.errors import (ACL_ERROR_INVALID_FILE, ACL_ERROR_OP_ATTR_NOT_MATCH, ACL_ERROR_OP_INPUT_NOT_MATCH,
                            ACL_ERROR_OP_NOT_FOUND, ACL_ERROR_OP_OUTPUT_NOT_MATCH, AclError)
from runtime import offline
from runtime.atc import read_om
from runtime.atc import singleop as so

from ._args import as_int, host_view, invalid
from ._calls import acl_call, acl_value
from ._state import STATE, add_object, current_context, object_record, stream_record

ACL_NAMESPACE = "acl.op"            # these are acl.op.* calls (runtime.acl._calls names them so)

log = logging.getLogger("vnpu.acl")

#: levels below the directory given to set_model_dir that are searched (CANN reads dir, dir/a, dir/a/b)
MODEL_DIR_DEPTH = 3
_ids = itertools.count(1)
_load_lock = threading.Lock()       # one upload of an op model per context at a time


@dataclass(frozen=True)
class OpModel:
    """A loaded single-operator model: what it computes and its .om bytes (uploaded to a device the first
    time a context runs it)."""
    id: int
    spec: so.OpSpec
    data: bytes
    origin: str


@dataclass(frozen=True)
class OpHandle:
    """aclopHandle: an operator matched once (create_handle), run many times (execute_with_handle)."""
    handle: int
    model: OpModel


@dataclass(eq=False)
class AttrSet:
    """aclopAttr: attribute name -> value."""
    handle: int
    values: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- attributes
@acl_value(0, init=False)
def create_attr():
    """aclopCreateAttr -> an empty attribute set (pyACL returns the handle alone)."""
    return add_object(STATE.op_attrs, AttrSet)


def destroy_attr(attr) -> None:
    """aclopDestroyAttr: returns None (a C void function); an unknown attribute set is ignored."""
    if isinstance(attr, int) and not isinstance(attr, bool):
        with STATE.lock:
            STATE.op_attrs.pop(attr, None)


def _set(attr, name, value) -> None:
    if not isinstance(name, str) or not name:
        raise invalid(f"attribute name must be a non-empty str, got {name!r}")
    object_record(STATE.op_attrs, attr, "operator attribute set").values[name] = value


def _scalar(v, kind: type, what: str):
    if kind is bool:
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
            return bool(v)
    elif kind is int:
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return int(v)
    elif kind is float:
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            return float(v)
    elif isinstance(v, str):
        return v
    raise invalid(f"{what} must be a {kind.__name__}, got {v!r}")


def _list(values, kind: type, what: str) -> tuple:
    if isinstance(values, np.ndarray):
        values = values.ravel().tolist()
    if not isinstance(values, (list, tuple)):
        raise invalid(f"{what} must be a list, got {values!r}")
    return tuple(_scalar(v, kind, what + " element") for v in values)


@acl_call(init=False)
def set_attr_bool(attr, attr_name, attr_value):
    _set(attr, attr_name, _scalar(attr_value, bool, "bool attribute"))


@acl_call(init=False)
def set_attr_int(attr, attr_name, attr_value):
    _set(attr, attr_name, _scalar(attr_value, int, "int attribute"))


@acl_call(init=False)
def set_attr_float(attr, attr_name, attr_value):
    _set(attr, attr_name, _scalar(attr_value, float, "float attribute"))


@acl_call(init=False)
def set_attr_string(attr, attr_name, attr_value):
    _set(attr, attr_name, _scalar(attr_value, str, "string attribute"))


@acl_call(init=False)
def set_attr_data_type(attr, attr_name, attr_value):
    """An aclDataType attribute (Cast's ``dst_type``)."""
    _set(attr, attr_name, _scalar(attr_value, int, "data type attribute"))


@acl_call(init=False)
def set_attr_list_bool(attr, attr_name, attr_value):
    _set(attr, attr_name, _list(attr_value, bool, "list_bool attribute"))


@acl_call(init=False)
def set_attr_list_int(attr, attr_name, attr_value):
    _set(attr, attr_name, _list(attr_value, int, "list_int attribute"))


@acl_call(init=False)
def set_attr_list_float(attr, attr_name, attr_value):
    _set(attr, attr_name, _list(attr_value, float, "list_float attribute"))


@acl_call(init=False)
def set_attr_list_string(attr, attr_name, attr_value):
    _set(attr, attr_name, _list(attr_value, str, "list_string attribute"))


@acl_call(init=False)
def set_attr_list_data_type(attr, attr_name, attr_value):
    _set(attr, attr_name, _list(attr_value, int, "list_data_type attribute"))


@acl_call(init=False)
def set_attr_list_list_int(attr, attr_name, attr_value):
    if not isinstance(attr_value, (list, tuple)):
        raise invalid(f"list_list_int attribute must be a list of lists, got {attr_value!r}")
    _set(attr, attr_name, tuple(_list(v, int, "list_list_int attribute") for v in attr_value))


# ---------------------------------------------------------------------------------------------- models
@acl_call()
def set_model_dir(model_dir):
    """aclopSetModelDir: load every single-operator .om (``vnpu atc --singleop``) in ``model_dir`` and up to
    two levels below it.  Host-only: nothing is uploaded before a context runs the operator.  A missing
    directory is 100003; a file that is not a vnpu .om, or is corrupt, refuses the whole call with its
    code and loads none of the directory (models loaded before stay)."""
    if not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir):
        raise invalid(f"model dir must be a non-empty path, got {model_dir!r}")
    root = Path(model_dir)
    if not root.is_dir():
        raise AclError(f"{os.fspath(model_dir)!r} is not a directory", code=ACL_ERROR_INVALID_FILE)
    files = sorted(p for depth in range(MODEL_DIR_DEPTH) for p in root.glob("/".join(["*"] * depth + ["*.om"]))
                   if p.is_file())
    models = [_read(p.read_bytes(), str(p)) for p in files]
    found = [m for m in models if m is not None]
    _add(found)
    if not found:
        log.warning("acl.op.set_model_dir(%s): no single-operator model there", model_dir)


@acl_call()
def load(model, model_size):
    """aclopLoad(model, model_size): one single-operator .om from the bytes at host address ``model``."""
    ptr, size = as_int(model, "model address"), as_int(model_size, "model size")
    if size <= 0:
        raise invalid(f"model size must be positive, got {size}")
    m = _read(host_view(ptr, size, "model").tobytes(), f"<host memory 0x{ptr:x}>")
    if m is None:
        raise AclError("the model is not a single-operator model (vnpu atc --singleop makes them)",
                       code=ACL_ERROR_INVALID_FILE)
    _add([m])


def _read(data: bytes, origin: str) -> OpModel | None:
    manifest, _ = read_om(data)                     # ModelError with GE's codes for a bad file
    try:
        spec = so.spec_of_manifest(manifest)
    except (ValueError, KeyError, TypeError) as e:
        raise AclError(f"{origin}: its single-operator entry is malformed ({e})", code=ACL_ERROR_INVALID_FILE) \
            from None
    return None if spec is None else OpModel(next(_ids), spec, data, origin)


def _add(models: list[OpModel]) -> None:
    with STATE.lock:
        have = {m.spec for m in STATE.op_models}
        STATE.op_models.extend(m for m in models if m.spec not in have)


# ---------------------------------------------------------------------------------------------- matching
def _tensor(desc, what: str) -> so.TensorSpec:
    rec = object_record(STATE.tensor_descs, desc, what)
    dtype = so.DTYPE_OF_ACL.get(rec.dtype)
    fmt = {v: k for k, v in offline.ACL_FORMATS.items()}.get(rec.format)
    if dtype is None or fmt is None or rec.dims is None or any(d < 0 for d in rec.dims):
        raise invalid(f"{what}: a single operator needs a known data type, format and static dims")
    const = None
    if rec.const is not None:
        const = tuple(x.item() for x in np.frombuffer(rec.const, dtype=dtype))
    return so.TensorSpec(dtype, tuple(rec.dims), fmt, const)


def _descs(descs, what: str) -> tuple[so.TensorSpec, ...]:
    if not isinstance(descs, (list, tuple)):
        raise invalid(f"{what} descriptions must be a list, got {descs!r}")
    return tuple(_tensor(d, f"{what} description {i}") for i, d in enumerate(descs))


def _attrs(attr) -> dict:
    if attr is None or attr == 0:
        return {}
    return dict(object_record(STATE.op_attrs, attr, "operator attribute set").values)


def _match(op_type, in_descs, out_descs, attr: dict) -> OpModel:
    """The loaded model of this call: same type, inputs, outputs and (non-default) attributes.  None of the
    type 100024; else the first field no model of the type matches: inputs 100021, outputs 100022,
    attributes 100023."""
    if not isinstance(op_type, str) or not op_type:
        raise invalid(f"op type must be a non-empty str, got {op_type!r}")
    ins, outs = _descs(in_descs, "input"), _descs(out_descs, "output")
    attrs = so.normalize_attrs(op_type, attr)
    with STATE.lock:
        cands = [m for m in STATE.op_models if m.spec.op_type == op_type]
    if not cands:
        loaded = sorted({m.spec.op_type for m in STATE.op_models}) or ["none"]
        raise AclError(f"no single-operator model of type {op_type!r} is loaded (acl.op.set_model_dir; loaded: "
                       f"{', '.join(loaded)})", code=ACL_ERROR_OP_NOT_FOUND)
    for field, code, key in (("inputs", ACL_ERROR_OP_INPUT_NOT_MATCH, lambda s: s.inputs),
                             ("outputs", ACL_ERROR_OP_OUTPUT_NOT_MATCH, lambda s: s.outputs),
                             ("attributes", ACL_ERROR_OP_ATTR_NOT_MATCH, lambda s: s.attrs)):
        want = {"inputs": ins, "outputs": outs, "attributes": attrs}[field]
        narrowed = [m for m in cands if key(m.spec) == want]
        if not narrowed:
            have = "; ".join(_show(key(m.spec)) for m in cands[:4])
            raise AclError(f"{op_type}: no loaded model has these {field} ({_show(want)}); loaded: {have}",
                           code=code)
        cands = narrowed
    return cands[0]


def _show(v) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], so.TensorSpec):
        return ", ".join(f"{t.dtype} {list(t.shape)} {t.format}" + (" const" if t.const is not None else "")
                         for t in v)
    return repr(dict(v)) if isinstance(v, tuple) else repr(v)


# ---------------------------------------------------------------------------------------------- execution
def _run(m: OpModel, inputs, outputs, stream) -> None:
    """Queue ``m`` on ``stream`` with the data buffers of its non-constant inputs (a constant input's buffer
    is not read: its data is in the model, as CANN takes it from the tensor description)."""
    srec = stream_record(stream)
    c = current_context()
    if not isinstance(inputs, (list, tuple)) or not isinstance(outputs, (list, tuple)):
        raise invalid("inputs and outputs must be lists of data buffers")
    spec = m.spec
    if len(inputs) != len(spec.inputs) or len(outputs) != len(spec.outputs):
        raise invalid(f"{spec.op_type} takes {len(spec.inputs)} input and {len(spec.outputs)} output buffers, "
                      f"got {len(inputs)} and {len(outputs)}")
    ins = [_buffer(b, t, f"input {i}") for i, (b, t) in enumerate(zip(inputs, spec.inputs)) if t.const is None]
    outs = [_buffer(b, t, f"output {i}") for i, (b, t) in enumerate(zip(outputs, spec.outputs))]
    _instance(m, c).execute_async(ins, outs, srec.stream)


def _buffer(handle, t: so.TensorSpec, what: str) -> offline.DataBuffer:
    rec = object_record(STATE.data_buffers, handle, f"{what} data buffer")
    return offline.DataBuffer(rec.ptr, rec.size, t.dtype)


def _instance(m: OpModel, c):
    """The model uploaded to context ``c``'s device (once; it goes with the context)."""
    inst = c.op_instances.get(m.id)
    if inst is not None:
        return inst
    with _load_lock:
        inst = c.op_instances.get(m.id)
        if inst is None:
            inst = offline.load_from_bytes(m.data, c.dev, origin=m.origin)
            c.op_instances[m.id] = inst
    return inst


@acl_call()
def execute_v2(op_type, input_desc, inputs, output_desc, outputs, attr, stream):
    """aclopExecuteV2: run the loaded single-operator model that matches ``op_type``, the descriptions and
    ``attr`` on ``stream``.  Only orders the device: errors of the kernel surface at the stream's next
    synchronize; a call refused here (no match 100024/100021-100023, a bad buffer) queues nothing."""
    _run(_match(op_type, input_desc, output_desc, _attrs(attr)), inputs, outputs, stream)


@acl_call(outs=(0,))
def create_handle(op_type, input_desc, output_desc, attr):
    """aclopCreateHandle -> (handle, ret): match once; execute_with_handle runs it."""
    m = _match(op_type, input_desc, output_desc, _attrs(attr))
    return add_object(STATE.op_handles, lambda h: OpHandle(h, m))


@acl_call(outs=(0,))
def create_handle_for_cast(src_desc, dst_desc, truncate):
    """aclopCreateHandleForCast -> (handle, ret): the loaded Cast from ``src_desc``'s type to ``dst_desc``'s."""
    m = _match("Cast", [src_desc], [dst_desc], _cast_attr(dst_desc, truncate))
    return add_object(STATE.op_handles, lambda h: OpHandle(h, m))


@acl_call()
def execute_with_handle(handle, inputs, outputs, stream):
    """aclopExecWithHandle: run the operator of ``handle`` (see execute_v2)."""
    _run(object_record(STATE.op_handles, handle, "operator handle").model, inputs, outputs, stream)


def destroy_handle(handle) -> None:
    """aclopDestroyHandle: returns None (a C void function); an unknown handle is ignored."""
    if isinstance(handle, int) and not isinstance(handle, bool):
        with STATE.lock:
            STATE.op_handles.pop(handle, None)


@acl_call()
def cast(input_desc, input, output_desc, output, truncate, stream):  # noqa: A002 - pyACL's parameter names
    """aclopCast: the loaded Cast of ``input_desc``'s type to ``output_desc``'s (``truncate`` is its attr)."""
    m = _match("Cast", [input_desc], [output_desc], _cast_attr(output_desc, truncate))
    _run(m, [input], [output], stream)


def _cast_attr(dst_desc, truncate) -> dict:
    """Cast's attributes for a cast to ``dst_desc``'s type: ``dst_type`` and ``truncate``."""
    rec = object_record(STATE.tensor_descs, dst_desc, "output description")
    return {"dst_type": rec.dtype, "truncate": bool(as_int(truncate, "truncate"))}
