"""An inference request as both transports parse it (:class:`WireRequest`: the tensors as declared, their
data not decoded yet), the one place their data is decoded (:func:`decode_inputs`, after
:func:`runtime.serve.v2.checks.check_request`) and the one place an engine's outputs are picked for the
response (:func:`select_outputs`).  Also the request parameters both transports share (``priority``,
``timeout``; ``sequence_id`` and shared memory are refused).  Pure; nothing blocks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..engine.errors import EngineFailure, InvalidRequest
from .checks import TensorHeader
from .datatypes import DATATYPES
from .repository import InferResult, ModelMetadata, TensorSpec
from .tensors import check_output, from_json, from_raw

#: where an input's data comes from: JSON ``data``, raw bytes, or an array already typed (gRPC contents)
SOURCES = ("json", "raw", "array")


@dataclass(frozen=True)
class WireInput:
    header: TensorHeader
    source: str            #: one of :data:`SOURCES`
    data: object           #: JSON list, bytes/memoryview, or np.ndarray


@dataclass(frozen=True)
class OutputAsk:
    """An output asked for; ``binary``: HTTP binary data for it (None: the request's default)."""
    name: str
    binary: bool | None = None


@dataclass(frozen=True)
class WireRequest:
    id: str
    inputs: tuple[WireInput, ...]
    outputs: tuple[OutputAsk, ...]
    priority: int | None = None
    timeout_us: int | None = None
    binary_output: bool = False          #: HTTP: every output as binary data unless it says otherwise

    @property
    def headers(self) -> list[TensorHeader]:
        return [i.header for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]


def _uint(v, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InvalidRequest(f"parameter {name} must be a non-negative integer, got {v!r}", name)
    return int(v)


def shared_parameters(params: Mapping[str, object]) -> tuple[int | None, int | None]:
    """``(priority, timeout_us)`` of a request's parameters; 400 for sequence batching (a nonzero
    ``sequence_id``), which is not served."""
    seq = params.get("sequence_id")
    if seq not in (None, 0, ""):
        raise InvalidRequest("sequence batching (parameter sequence_id) is not supported by this server",
                             "sequence_id")
    prio = params.get("priority")
    timeout = params.get("timeout")
    prio = None if prio is None or prio == 0 else _uint(prio, "priority")
    return prio, None if timeout is None else _uint(timeout, "timeout")


def refuse_shared_memory(params: Mapping[str, object], what: str) -> None:
    if any(k.startswith("shared_memory_") for k in params):
        raise InvalidRequest(f"{what}: shared memory tensors are not supported by this server; send the data",
                             "shared_memory_region")


def refuse_classification(params: Mapping[str, object], what: str) -> None:
    if "classification" in params:
        raise InvalidRequest(f"{what}: the classification extension is not supported by this server; ask for "
                             f"the output tensor itself", "classification")


def decode_inputs(req: WireRequest) -> dict[str, np.ndarray]:
    """Every input's data as an array of its declared datatype and shape (400 for malformed data)."""
    out = {}
    for i in req.inputs:
        h = i.header
        what = f"input {h.name!r}"
        dt = DATATYPES[h.datatype]
        if i.source == "json":
            out[h.name] = from_json(i.data, dt, h.shape, what)
        elif i.source == "raw":
            out[h.name] = from_raw(i.data, dt, h.shape, what)
        else:
            arr = i.data
            if arr.size != int(np.prod(h.shape, dtype=np.int64)):
                raise InvalidRequest(f"{what}: shape {list(h.shape)} holds {int(np.prod(h.shape))} elements, "
                                     f"the contents have {arr.size}", "contents")
            out[h.name] = arr.reshape(h.shape)
    return out


def select_outputs(meta: ModelMetadata, req: WireRequest, result: InferResult) -> list[tuple[TensorSpec, np.ndarray, OutputAsk]]:
    """The outputs the response carries, in the order asked for (every output of the model, in its order,
    when none was named), each checked against the metadata (EngineFailure for an engine that did not
    produce what it declares)."""
    specs = {s.name: s for s in meta.outputs}
    asks = req.outputs or tuple(OutputAsk(s.name) for s in meta.outputs)
    out = []
    for ask in asks:
        if ask.name not in result.outputs:
            raise EngineFailure(f"model {meta.name!r} produced no output {ask.name!r}")
        spec = specs[ask.name]
        out.append((spec, check_output(result.outputs[ask.name], spec.datatype, f"output {ask.name!r}"), ask))
    return out
