"""The HTTP/REST body of an inference request and of its response, with Triton's binary tensor data
extension.

Request: a JSON object (``id``, ``parameters``, ``inputs`` with ``name``/``datatype``/``shape`` and
either ``data`` -- flat or nested -- or ``parameters.binary_data_size``, ``outputs`` with ``name`` and
``parameters.binary_data``).  With the header ``Inference-Header-Content-Length: L`` the first L bytes of
the body are that JSON and the rest is the inputs' binary data, one after another in the order of the
inputs that declare a ``binary_data_size``; the sizes must add up to exactly the rest.  Request parameters:
``binary_data_output`` (every output as binary data), ``priority``, ``timeout`` (microseconds).

Response: JSON (``model_name``, ``model_version``, ``id`` when the request had one, ``outputs``); outputs
asked for as binary data carry ``parameters.binary_data_size`` and follow the JSON in order, and the
response has ``Inference-Header-Content-Length`` (``application/octet-stream``).

Every malformed body is an :class:`InvalidRequest` (400).  Pure; nothing blocks (the route parses a large
body off the event loop)."""
from __future__ import annotations

import json

from ..engine.errors import InvalidRequest
from .checks import TensorHeader
from .datatypes import datatype
from .repository import InferResult, ModelMetadata
from .request import (OutputAsk, WireInput, WireRequest, refuse_classification, refuse_shared_memory,
                      select_outputs, shared_parameters)
from .tensors import parse_shape, to_json, to_raw

HEADER_LENGTH = "inference-header-content-length"     #: Triton's binary extension header (lower case)


def _object(v, what: str) -> dict:
    if not isinstance(v, dict):
        raise InvalidRequest(f"{what} must be a JSON object, got {type(v).__name__}", what.rsplit(".", 1)[-1])
    return v


def _split(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """The JSON part (parsed) and the binary part of a request body."""
    if header_length is None:
        head, rest = body, memoryview(b"")
    else:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 < n <= len(body):
            raise InvalidRequest(f"Inference-Header-Content-Length must be an integer from 1 to the body's "
                                 f"{len(body)} bytes, got {header_length!r}", "Inference-Header-Content-Length")
        head, rest = body[:n], memoryview(body)[n:]
    try:
        doc = json.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the request is not valid JSON: {e}", None, "invalid_json") from None
    return _object(doc, "the request"), rest


def _input(i: int, raw, binary: memoryview, offset: int) -> tuple[WireInput, int]:
    t = _object(raw, f"inputs[{i}]")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"inputs[{i}].name must be a non-empty string", "name")
    what = f"input {name!r}"
    dt = datatype(t.get("datatype"), "datatype")
    header = TensorHeader(name, dt.name, parse_shape(t.get("shape"), what))
    params = _object(t.get("parameters", {}), f"{what}.parameters")
    refuse_shared_memory(params, what)
    size = params.get("binary_data_size")
    if size is None:
        if "data" not in t:
            raise InvalidRequest(f"{what} has neither data nor parameters.binary_data_size", "data")
        return WireInput(header, "json", t["data"]), offset
    if "data" in t:
        raise InvalidRequest(f"{what} has both data and parameters.binary_data_size", "data")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
        raise InvalidRequest(f"{what}: binary_data_size {size!r} does not fit the {len(binary) - offset} bytes "
                             f"of binary data left (Inference-Header-Content-Length splits the body)",
                             "binary_data_size")
    return WireInput(header, "raw", binary[offset:offset + size]), offset + size


def _outputs(raw) -> tuple[OutputAsk, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("outputs must be a list", "outputs")
    asks = []
    for i, o in enumerate(raw):
        o = _object(o, f"outputs[{i}]")
        name = o.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"outputs[{i}].name must be a non-empty string", "outputs")
        params = _object(o.get("parameters", {}), f"output {name!r}.parameters")
        refuse_classification(params, f"output {name!r}")
        refuse_shared_memory(params, f"output {name!r}")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidRequest(f"output {name!r}: binary_data must be true or false", "binary_data")
        asks.append(OutputAsk(name, binary))
    return tuple(asks)


def parse_request(body: bytes, header_length: str | None) -> WireRequest:
    """An inference request's body (``header_length``: its ``Inference-Header-Content-Length`` or None)."""
    doc, binary = _split(body, header_length)
    rid = doc.get("id", "")
    if not isinstance(rid, str):
        raise InvalidRequest(f"id must be a string, got {type(rid).__name__}", "id")
    params = _object(doc.get("parameters", {}), "parameters")
    priority, timeout = shared_parameters(params)
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidRequest("parameters.binary_data_output must be true or false", "binary_data_output")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidRequest("inputs must be a non-empty list", "inputs")
    inputs, offset = [], 0
    for i, t in enumerate(raw_inputs):
        wi, offset = _input(i, t, binary, offset)
        inputs.append(wi)
    if offset != len(binary):
        raise InvalidRequest(f"the inputs' binary_data_size add up to {offset} bytes, the body has {len(binary)} "
                             f"bytes of binary data", "binary_data_size")
    return WireRequest(rid, tuple(inputs), _outputs(doc.get("outputs")), priority, timeout, binary_output)


def encode_response(meta: ModelMetadata, req: WireRequest, result: InferResult) -> tuple[bytes, int | None]:
    """The response body, and the length of its JSON part when binary data follows it (else None)."""
    outs, blobs = [], []
    for spec, arr, ask in select_outputs(meta, req, result):
        dt = datatype(spec.datatype)
        t = {"name": spec.name, "datatype": spec.datatype, "shape": list(arr.shape)}
        if ask.binary if ask.binary is not None else req.binary_output:
            blob = to_raw(arr, dt)
            blobs.append(blob)
            t["parameters"] = {"binary_data_size": len(blob)}
        else:
            t["data"] = to_json(arr, dt, f"output {spec.name!r}")
        outs.append(t)
    doc = {"model_name": meta.name, "model_version": result.model_version}
    if req.id:
        doc["id"] = req.id
    if result.parameters:
        doc["parameters"] = dict(result.parameters)
    doc["outputs"] = outs
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)
