"""The gRPC messages of ``inference.GRPCInferenceService`` (:data:`driver.wire.inference`) to and from the
protocol layer: a ``ModelInferRequest`` to a :class:`~.request.WireRequest` -- each input's data either in
``raw_input_contents`` (one entry per input, in order, as tritonclient sends it; then no input may carry
``contents``) or in the ``contents`` field of its datatype, never both -- and a result to a
``ModelInferResponse`` with ``raw_output_contents`` (what Triton answers).  The other documents are the
REST ones (:mod:`.documents`) parsed into their messages.  Malformed requests are
:class:`InvalidRequest` (400, gRPC ``INVALID_ARGUMENT``).  Pure; nothing blocks."""
from __future__ import annotations

import numpy as np
from google.protobuf import json_format

from driver import wire

from ..engine.errors import InvalidRequest
from .checks import TensorHeader
from .datatypes import Datatype, datatype
from .repository import InferResult, ModelMetadata
from .request import (OutputAsk, WireInput, WireRequest, refuse_classification, refuse_shared_memory,
                      select_outputs, shared_parameters)
from .tensors import parse_shape, to_raw

M = wire.inference

#: contents field -> the numpy type its values are read as before the range check
_FIELD_DTYPE = {"bool_contents": np.bool_, "int_contents": np.int64, "int64_contents": np.int64,
                "uint_contents": np.uint64, "uint64_contents": np.uint64, "fp32_contents": np.float32,
                "fp64_contents": np.float64}


def parameters(m) -> dict:
    """A protobuf ``map<string, InferParameter>`` as a dict of Python values."""
    out = {}
    for k, v in m.items():
        which = v.WhichOneof("parameter_choice")
        out[k] = getattr(v, which) if which is not None else None
    return out


def _from_contents(t, dt: Datatype, what: str) -> np.ndarray:
    if not dt.contents:
        raise InvalidRequest(f"{what}: {dt.name} travels as raw_input_contents only", "contents")
    present = [f.name for f, _ in t.contents.ListFields()]
    if any(f != dt.contents for f in present):
        raise InvalidRequest(f"{what}: {dt.name} data goes in contents.{dt.contents}, got {', '.join(present)}",
                             "contents")
    values = getattr(t.contents, dt.contents)
    if dt.name == "BYTES":
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        return arr
    arr = np.asarray(values, dtype=_FIELD_DTYPE[dt.contents])
    if dt.dtype.kind in "iu" and arr.size:
        info = np.iinfo(dt.dtype)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise InvalidRequest(f"{what}: a value is out of the range of {dt.name} [{info.min}, {info.max}]",
                                 "contents")
    return arr.astype(dt.dtype)


def _input(t, raw: bytes | None) -> WireInput:
    if not t.name:
        raise InvalidRequest("an input has no name", "inputs")
    what = f"input {t.name!r}"
    dt = datatype(t.datatype)
    refuse_shared_memory(parameters(t.parameters), what)
    header = TensorHeader(t.name, dt.name, parse_shape(list(t.shape), what))
    if raw is not None:
        if t.HasField("contents"):
            raise InvalidRequest(f"{what} has contents, and the request has raw_input_contents", "contents")
        return WireInput(header, "raw", raw)
    if not t.HasField("contents"):
        raise InvalidRequest(f"{what} has no contents (and the request no raw_input_contents)", "contents")
    return WireInput(header, "array", _from_contents(t, dt, what))


def _outputs(msg) -> tuple[OutputAsk, ...]:
    asks = []
    for o in msg.outputs:
        if not o.name:
            raise InvalidRequest("a requested output has no name", "outputs")
        params = parameters(o.parameters)
        refuse_classification(params, f"output {o.name!r}")
        refuse_shared_memory(params, f"output {o.name!r}")
        asks.append(OutputAsk(o.name))
    return tuple(asks)


def parse_request(msg) -> WireRequest:
    """A ``ModelInferRequest`` as a wire request (400 for malformed tensors or parameters)."""
    if not msg.inputs:
        raise InvalidRequest("the request has no inputs", "inputs")
    raws = list(msg.raw_input_contents)
    if raws and len(raws) != len(msg.inputs):
        raise InvalidRequest(f"raw_input_contents has {len(raws)} entries for {len(msg.inputs)} inputs: one per "
                             f"input, in order", "raw_input_contents")
    inputs = tuple(_input(t, raws[i] if raws else None) for i, t in enumerate(msg.inputs))
    priority, timeout = shared_parameters(parameters(msg.parameters))
    return WireRequest(msg.id, inputs, _outputs(msg), priority, timeout)


def _parameter(v) -> "M.InferParameter":
    if isinstance(v, bool):
        return M.InferParameter(bool_param=v)
    if isinstance(v, int):
        return M.InferParameter(int64_param=v)
    if isinstance(v, float):
        return M.InferParameter(double_param=v)
    return M.InferParameter(string_param=str(v))


def encode_response(meta: ModelMetadata, req: WireRequest, result: InferResult) -> "M.ModelInferResponse":
    """The response: every output asked for in ``raw_output_contents``."""
    resp = M.ModelInferResponse(model_name=meta.name, model_version=result.model_version, id=req.id)
    for k, v in result.parameters.items():
        resp.parameters[k].CopyFrom(_parameter(v))
    for spec, arr, _ask in select_outputs(meta, req, result):
        resp.outputs.add(name=spec.name, datatype=spec.datatype, shape=list(arr.shape))
        resp.raw_output_contents.append(to_raw(arr, datatype(spec.datatype)))
    return resp


def message(doc, cls):
    """A REST document (:mod:`.documents`) as the gRPC message ``cls`` (same field names)."""
    return json_format.ParseDict(doc, cls(), ignore_unknown_fields=True)
